"""The keyedstate command: the provider's tools, on the command line.

Commands (DESCRIPTION below is the top-level help, which lists them too):
  jar             print the path of the JVM shim jar, building it on first use
  demo            run a streaming word count on keyedstate
  conf-reference  print (or --write) the conf reference markdown
  inspect         report the state a checkpoint holds, per operator and store
  rescale         redistribute a stopped query's state over a new partition count
  verify          check every retained version of a checkpoint
  get             one key's value at a retained batch
  migrate         convert a stopped query's state to another state store provider
  undo            take back the state processor's last change (transform, bootstrap)

The state processor's reads and changes (transform, bootstrap) are Python only:
keyedstate.state(spark, checkpoint). Errors the user can act on (a missing or foreign
checkpoint, a corrupt file, a bad argument) print one line, "keyedstate: error: ...", and exit
non-zero; a traceback means a bug."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import NoReturn

DESCRIPTION = (
    "keyedstate: the state store provider's tools. Commands: jar, demo, conf-reference, inspect, rescale, "
    "verify, get, migrate, undo ('keyedstate COMMAND --help' for each). The state processor's transform and "
    "bootstrap, which undo takes back, are Python: keyedstate.state(spark, checkpoint). "
    "A checkpoint on a local path or file: URI needs no Spark; any other scheme (s3a, "
    "abfss, gs, hdfs, ...) is reached through a local SparkSession's JVM, configured like the query's: "
    "spark-defaults.conf and --conf key=value (e.g. --conf spark.hadoop.fs.s3a.endpoint=...).")


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as the one line every other user error is."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.partition(" ")[2]
        self.exit(2, f"keyedstate: error: {command + ': ' if command else ''}{message} (see {self.prog} --help)\n")


def _user_errors() -> tuple[type[BaseException], ...]:
    """What the offline tools raise for a checkpoint or an argument they refuse (each names what
    and where); anything else is a bug and keeps its traceback."""
    from .checkpoint import CheckpointError
    from .offline.migration import MigrateError
    from .offline.rescale import RescaleError
    from .offline.storage import StorageError
    from .checkpoint import CheckpointProblem

    return CheckpointError, CheckpointProblem, MigrateError, RescaleError, StorageError, FileNotFoundError


def _error(message: object) -> int:
    print("keyedstate: error: " + " ".join(str(message).split()), file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except _user_errors() as exc:
        return _error(exc)


def _main(argv: list[str] | None) -> int:
    from .version import __version__

    parser = _Parser(prog="keyedstate", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"keyedstate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("jar", help="print the path of the JVM shim jar (building it if needed)")
    demo = sub.add_parser("demo", help="run a streaming aggregation on keyedstate and print it")
    demo.add_argument("--batches", type=int, default=3)
    ref = sub.add_parser("conf-reference", help="print (or --write) the conf reference markdown")
    ref.add_argument("--write", type=Path, help="write to this file instead of stdout")
    insp = sub.add_parser("inspect", help="report the state a query's checkpoint holds, per operator and store")
    insp.add_argument("--checkpoint", required=True, help="the query's checkpointLocation (any scheme)")
    insp.add_argument("--json", action="store_true", help="print the report as JSON")
    resc = sub.add_parser("rescale", help="redistribute a stopped query's state over a new number of partitions")
    resc.add_argument("--checkpoint", required=True, help="the query's checkpointLocation (any scheme)")
    resc.add_argument("--partitions", type=int, help="the new partition count (required unless --rollback)")
    resc.add_argument("--skip-failed-batch", action="store_true",
                      help="drop an uncommitted (failed) last batch: its input does not reach the state")
    resc.add_argument("--rollback", action="store_true",
                      help="remove an unfinished repartition batch (an interrupted rescale, or the orphan "
                           "offset entry Spark's own repartition leaves on a keyedstate checkpoint)")
    resc.add_argument("--idle-seconds", type=float, default=30.0,
                      help="an uncommitted batch younger than this means the query may be running (default 30)")
    ver = sub.add_parser("verify", help="check every retained version of a checkpoint (CRCs, files and sizes, "
                         "key counts, key groups, TTL metadata)")
    ver.add_argument("--checkpoint", required=True, help="the query's checkpointLocation (any scheme)")
    ver.add_argument("--json", action="store_true", help="print the report as JSON")
    getp = sub.add_parser("get", help="one key's value at a retained batch, decoded with the state schema")
    getp.add_argument("--checkpoint", required=True, help="the query's checkpointLocation (any scheme)")
    getp.add_argument("--operator", type=int, required=True, help="the operator id (see keyedstate inspect)")
    getp.add_argument("--store", help="the store name (needed for joins: left-keyToNumValues, ...)")
    getp.add_argument("--key", required=True,
                      help="the key as JSON: an object by key field name or a list in field order")
    getp.add_argument("--batch", type=int, help="a committed batch id (default: the last committed)")
    mig = sub.add_parser("migrate", help="convert a stopped query's state to another state store provider")
    mig.add_argument("--checkpoint", required=True, help="the query's checkpointLocation (any scheme)")
    mig.add_argument("--to", required=True, choices=["keyedstate", "rocksdb", "hdfs"], help="the new provider")
    mig.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    mig.add_argument("--keep-old", action="store_true",
                     help="keep the old provider's files after the switch (rescale and verify then refuse them)")
    mig.add_argument("--json", action="store_true", help="print the result as JSON")
    und = sub.add_parser("undo", help="take back the state processor's last change (transform, bootstrap) to a "
                         "stopped query's checkpoint, exactly")
    und.add_argument("--checkpoint", required=True, help="the query's checkpointLocation (any scheme)")
    und.add_argument("--json", action="store_true", help="print the result as JSON")
    for p in (ver, getp, mig, insp, resc, und):
        p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                       help="a Spark conf for the session that reaches a non-local checkpoint (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.command in ("rescale", "migrate", "undo", "verify") else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)

    if args.command == "jar":
        from .shim.jar import JarBuildError, jar_path

        try:
            print(jar_path())
        except JarBuildError as exc:
            print(f"keyedstate: error: jar: {exc}", file=sys.stderr)  # the compiler's output follows
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
            report = _anywhere(args, "inspect")
        except InspectError as exc:
            return _error(exc)
        sys.stdout.write(json.dumps(report) + "\n" if args.json else render(report))
    elif args.command == "rescale":
        from .checkpoint import CheckpointError
        from .offline.rescale import RescaleError, rescale

        if args.partitions is None and not args.rollback:
            parser.error("rescale needs --partitions (or --rollback)")
        try:
            result = _anywhere(args, "rescale", args.partitions if args.partitions is not None else 1,
                               skip_failed_batch=args.skip_failed_batch, rollback=args.rollback,
                               idle_seconds=args.idle_seconds)
        except (RescaleError, CheckpointError) as exc:
            return _error(exc)
        print(json.dumps(result.to_dict()) if result else json.dumps({"rolledBack": True}))
    elif args.command in ("verify", "get", "migrate", "undo"):
        return _offline(args)
    return 0


def _anywhere(args, tool: str, *rest, **options):
    """inspect/rescale: local checkpoints directly, other schemes through offline/remote.py."""
    from .offline.storage import is_local, set_session_confs

    if is_local(args.checkpoint):
        if tool == "inspect":
            from .offline.inspection import inspect

            return inspect(args.checkpoint)
        from .offline.rescale import rescale

        return rescale(args.checkpoint, *rest, **options)
    set_session_confs(dict(item.partition("=")[::2] for item in args.conf))
    from .offline import remote

    if tool == "inspect":
        return remote.inspect_anywhere(args.checkpoint)
    return remote.rescale_anywhere(args.checkpoint, *rest, **options)


def _offline(args) -> int:
    from .offline.storage import StorageError, set_session_confs
    from .checkpoint import CheckpointProblem

    confs = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"keyedstate: error: {args.command}: --conf {item!r} is not KEY=VALUE", file=sys.stderr)
            return 2
        confs[key] = value
    set_session_confs(confs)
    try:
        if args.command == "migrate":
            from .offline.migration import MigrateError, migrate, render as render_migration

            try:
                result = migrate(args.checkpoint, args.to, dry_run=args.dry_run, keep_old=args.keep_old)
            except MigrateError as exc:
                return _error(exc)
            sys.stdout.write(json.dumps(result) + "\n" if args.json else render_migration(result))
            return 0
        if args.command == "undo":
            from .offline.processor import StateProcessorError, render_undo, undo

            try:
                result = undo(args.checkpoint)
            except StateProcessorError as exc:
                print(f"keyedstate undo: {exc}", file=sys.stderr)
                return 1
            sys.stdout.write(json.dumps(result) + "\n" if args.json else render_undo(result))
            return 0
        if args.command == "verify":
            from .offline.verify import render, verify

            report = verify(args.checkpoint)
            sys.stdout.write(json.dumps(report) + "\n" if args.json else render(report))
            return 0 if report["ok"] else 1
        from .offline.lookup import get

        result = get(args.checkpoint, args.operator, args.key, store=args.store, batch=args.batch)
        print(json.dumps(result))
        return 0 if result["found"] else 3
    except (CheckpointProblem, StorageError, FileNotFoundError) as exc:
        return _error(exc)


if __name__ == "__main__":
    sys.exit(main())
