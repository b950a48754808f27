"""The ``keyedstate`` command: ``jar``, ``demo``, ``conf-reference``, ``inspect``."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="keyedstate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("jar", help="print the path of the JVM shim jar (building it if needed)")
    demo = sub.add_parser("demo", help="run a streaming aggregation on keyedstate and print it")
    demo.add_argument("--batches", type=int, default=3)
    ref = sub.add_parser("conf-reference", help="print (or --write) the conf reference markdown")
    ref.add_argument("--write", type=Path, help="write to this file instead of stdout")
    insp = sub.add_parser("inspect", help="report the state a query's checkpoint holds, per operator and store")
    insp.add_argument("--checkpoint", required=True, help="the query's checkpointLocation (local path)")
    insp.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    if args.command == "jar":
        from . import jar_path

        print(jar_path())
    elif args.command == "demo":
        from .demo import run

        run(args.batches)
    elif args.command == "conf-reference":
        from .conf import reference_markdown

        text = reference_markdown()
        if args.write:
            args.write.write_text(text)
        else:
            sys.stdout.write(text)
    elif args.command == "inspect":
        from .inspect import InspectError, inspect, render

        try:
            report = inspect(args.checkpoint)
        except InspectError as exc:
            print(f"keyedstate inspect: {exc}", file=sys.stderr)
            return 1
        sys.stdout.write(json.dumps(report) + "\n" if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
