"""The ``keyedstate`` command: ``jar``, ``demo``, ``conf-reference``, ``inspect``, ``rescale``."""
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
    resc = sub.add_parser("rescale", help="redistribute a stopped query's state over a new number of partitions")
    resc.add_argument("--checkpoint", required=True, help="the query's checkpointLocation (local path)")
    resc.add_argument("--partitions", type=int, help="the new partition count (required unless --rollback)")
    resc.add_argument("--skip-failed-batch", action="store_true",
                      help="drop an uncommitted (failed) last batch: its input does not reach the state")
    resc.add_argument("--rollback", action="store_true",
                      help="remove an unfinished repartition batch (an interrupted rescale, or the orphan "
                           "offset entry Spark's own repartition leaves on a keyedstate checkpoint)")
    resc.add_argument("--idle-seconds", type=float, default=30.0,
                      help="an uncommitted batch younger than this means the query may be running (default 30)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.command == "rescale" else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)

    if args.command == "jar":
        from .shim.jar import JarBuildError, jar_path

        try:
            print(jar_path())
        except JarBuildError as exc:
            print(f"keyedstate jar: {exc}", file=sys.stderr)
            return 1
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
        from .offline.inspection import InspectError, inspect, render

        try:
            report = inspect(args.checkpoint)
        except InspectError as exc:
            print(f"keyedstate inspect: {exc}", file=sys.stderr)
            return 1
        sys.stdout.write(json.dumps(report) + "\n" if args.json else render(report))
    elif args.command == "rescale":
        from .offline.checkpoint import CheckpointError
        from .offline.rescaling import RescaleError, rescale

        if args.partitions is None and not args.rollback:
            parser.error("rescale needs --partitions (or --rollback)")
        try:
            result = rescale(args.checkpoint, args.partitions if args.partitions is not None else 1,
                             skip_failed_batch=args.skip_failed_batch, rollback=args.rollback,
                             idle_seconds=args.idle_seconds)
        except (RescaleError, CheckpointError) as exc:
            print(f"keyedstate rescale: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(result.to_dict()) if result else json.dumps({"rolledBack": True}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
