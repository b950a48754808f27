"""The fault campaign: many real faults injected into keyedstate's queries, every run's output
judged against an uninterrupted run of Spark's HDFS-backed provider (issue 12, point 6).

    python3 -m benchmarks.faults                       # the whole campaign, ~5-10 min on 2 cores
    python3 -m benchmarks.faults --runs agg-io-v1,agg-kill --out /tmp/faults.md

Each *run* is one deterministic query (tests/support/scenarios.py) driven step by step; after
every committed step it re-arms one kind of fault for the next one:

- ``io``: IOExceptions from the object-store test FileSystem (``objtest://``, tests/jvm/src) on
  the first create of a changelog, a rename of a snapshot file after its copy, the first open,
  the third listing and the first delete of every step, plus short reads on every stream;
- ``diskfull``: the checkpoint's store says "No space left on device" after a few KiB of
  keyedstate's writes, until the query fails; then space is back;
- ``kill``: SIGKILL of every state server of the JVM while the next batch runs (write-behind
  apply, commit);
- ``cleanup``: a longer query whose every step waits for maintenance to clean up old versions,
  with the first delete of keyedstate's files failing after every step;
- ``rescale``: after three steps the query stops, ``keyedstate rescale`` (2 -> 4 partitions) is
  SIGKILLed after a step it logs or after a delay, or its driver process alone while a split runs
  (in the driver's worker processes, which must die with it), then finished by a rerun or rolled
  back and done again, and the query continues on 4 partitions;
- ``executor kill`` (run first, in a cluster of its own): an aggregation on
  ``local-cluster[2,1,1024]`` whose executor JVMs are SIGKILLed one at a time while batches run;
  its output is known in closed form.
- ``aimed kill`` (``agg-aimed-kills-v1/v2``, a local-cluster of their own): after every committed
  step, windows of the commit (changelog written, not published; published, task not returned),
  the snapshot upload (files partly uploaded; files uploaded, no manifest; manifest written) and
  cleanup (part of the deletions done) are armed, a group in turn (support/campaign.py WINDOWS,
  WINDOW_GROUPS): the first executor JVM to make the matching FileSystem call SIGKILLs itself
  there (objtest://'s ``action=kill``, test code only);
- ``driver kill`` (``driver-kills``): a child Python driver and its JVM, killed as Spark creates
  ``commits/<N>`` (state committed, batch not done), five times per run, restarted each time with
  a changed filter or the killed batch's input rewritten (alternately), in checkpoint formats 1
  and 2; compared with Spark's default provider under the same kills and changes;
- ``two applications`` (``two-apps``): two child drivers started at once on one checkpoint, then
  ``keyedstate verify`` and a restart whose output must equal the reference;
- ``speculation``: slow first attempts on a standalone cluster with two hosts, speculative
  attempts counted from the event log.

A query that fails is restarted on its checkpoint (as a supervisor would) until every step is
committed (tests/support/faults.py). Faults are counted where they happened (the FileSystem's
fault log; the kills this module made) and classified by phase: load (open, short read),
listing, commit (a changelog's create), snapshot upload (snapshot files and manifests),
cleanup (delete), write-behind apply (a killed server), rescale, executor JVM. The verdict per
run: rows lost and rows duplicated against the reference (a replayed batch must be identical).
"""
from __future__ import annotations

import argparse
import collections
import datetime as dt
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test support: drivers, scenarios, objtest://

from support import scenarios as sc, testjar  # noqa: E402
from support.campaign import (COMMIT_LOG, PLANS, WINDOWS, run_campaign, run_driver_kills, run_executor_kills,  # noqa: E402
                              run_speculation, run_two_apps, run_window_kills)

EXECUTOR_KILLS = "agg-executor-kills"
AIMED = "agg-aimed-kills"
DRIVER_KILLS = "driver-kills"
TWO_APPS = "two-apps"
SPECULATION = "speculation"
SPECIAL = [EXECUTOR_KILLS, AIMED, SPECULATION, DRIVER_KILLS, TWO_APPS]

def session(objtest_root: Path):
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    import keyedstate
    import support.driver

    for module in (support.driver, sc):  # Python workers cannot import the tests' support package
        cloudpickle.register_pickle_by_value(module)

    builder = (SparkSession.builder.master("local[2,4]").appName("keyedstate-fault-campaign")
               .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.streaming.stateStore.maintenanceInterval", "1s"))
    for key, value in testjar.objtest_conf(objtest_root).items():
        builder = builder.config(key, value)
    spark = keyedstate.configure(builder).getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    return spark


def report(results: list[dict], seconds: float, processes: int = 1) -> str:
    for r in results:  # speculative attempts are provoked, not injected faults: reported apart
        if r["plan"].kind == "speculation":
            r["faults"] = collections.Counter()
    by_phase: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    for r in results:
        for phase, n in r["faults"].items():
            c = by_phase[(phase, r["plan"].kind)]
            c["injected"] += n
            c["runs"] += 1
    total = sum(sum(r["faults"].values()) for r in results)
    lost = sum(r["lost"] for r in results)
    dup = sum(r["duplicated"] for r in results)
    lines = ["# keyedstate fault campaign", "",
             f"- Generated {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC by `python3 -m benchmarks.faults` "
             f"({seconds / 60:.1f} min, {os.cpu_count()} CPUs"
             + (f", in {processes} processes at once, merged with `--merge`" if processes > 1 else "") + ")",
             f"- **{total} faults injected in {len(results)} runs: {lost} rows lost, {dup} rows duplicated.**",
             "- Reference: the same steps on Spark's HDFS-backed provider, uninterrupted (for driver kills: "
             "under the same kills and query changes, on a store whose rename overwrites, as a file system's "
             "does: on an object store's rename that provider keeps a re-executed version's first delta "
             "file). Checkpoints on `objtest://` (object-store semantics: rename = copy + delete, directory "
             "markers, no overwrite on rename). How faults are made and classified: `benchmarks/faults.py`.",
             f"- Without short reads (legal for a Hadoop stream, a mild fault): "
             f"{total - sum(r['faults'].get('load (short read)', 0) for r in results)} faults.",
             "- Executor-JVM kills run on `local-cluster[2,1,1024]` (two executor JVMs, closed-form "
             "reference); rescales on a local checkpoint (keyedstate rescale writes checkpoint format 1), "
             "their output compared with the reference batch for batch after the repartition batch.", "",
             "## Faults by phase and kind", "", "| phase | kind | injected | runs |", "|---|---|---:|---:|"]
    for (phase, kind), c in sorted(by_phase.items()):
        lines.append(f"| {phase} | {kind} | {c['injected']} | {c['runs']} |")
    aimed = [r for r in results if r["plan"].kind in ("aimed kill", "driver kill")]
    if aimed:
        per_window: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for r in aimed:
            for window, n in r["faults"].items():
                per_window[window]["kills"] += n
                per_window[window]["runs"] += 1
                per_window[window]["lost"] += r["lost"]
                per_window[window]["duplicated"] += r["duplicated"]
        lines += ["", "## Aimed kills by window", "",
                  "The process in the window SIGKILLs itself there: the objtest:// FileSystem (test code, "
                  "`action=kill`) kills its JVM at the first call matching the window's rule after each "
                  "arming (an executor JVM on `local-cluster[2,1,1024]`, re-armed after every committed step; "
                  "for the commit log, the driver JVM of a child Python driver, restarted with a changed filter "
                  "or changed input of the killed batch and compared with Spark's default provider under the "
                  "same kills and changes). Lost and duplicated rows are those of the runs the window's kills "
                  "happened in.", "",
                  "| window | kills | runs | lost | duplicated |", "|---|---:|---:|---:|---:|"]
        for window in [*WINDOWS, *sorted(set(per_window) - set(WINDOWS))]:
            c = per_window.get(window, collections.Counter())
            lines.append(f"| {window} | {c['kills']} | {c['runs']} | {c['lost']} | {c['duplicated']} |")
        short = [w for w in [*WINDOWS, COMMIT_LOG] if per_window[w]["kills"] < (10 if w == COMMIT_LOG else 20)]
        formats = {r["plan"].format_version for r in aimed if r["faults"].get(COMMIT_LOG)}
        lines += ["", f"Targets (issue 46: >= 200 faults, >= 20 kills per window, >= 10 driver kills before the "
                  f"commit log in formats 1 and 2): {total} faults; driver kills in formats {sorted(formats)}; "
                  + (f"**not reached in: {', '.join(short)}**." if short else "every window reached.")]
    for r in results:
        if r["plan"].kind == "two applications":
            lines += ["", f"Two applications on one checkpoint ({r['plan'].name}): exit codes {r['exit_codes']} "
                      f"(0 = ran all its batches), `keyedstate verify` exit {r['verify']}, then a restart ran "
                      f"every step: {r['lost']} rows lost, {r['duplicated']} duplicated."]
    spec = [r for r in results if r["plan"].kind == "speculation"]
    if spec:
        started, succeeded = spec[0]["speculative"]
        lines += ["", f"Speculation ({', '.join(r['plan'].name for r in spec)}; standalone cluster, two Workers on "
                  "distinct loopback hosts: Spark never runs a copy on the host of a running attempt, so "
                  f"local-cluster never speculates): **{started} speculative task attempts started, {succeeded} "
                  "finished successfully** (event log); output exact in closed form after a restart from the "
                  "checkpoint."]
    lines += ["", "## Runs", "",
              "| run | operator | fault kind | checkpoint format | faults | query failures (restarts) | "
              "replayed batches | lost | duplicated | s |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        p = r["plan"]
        lines.append(f"| {p.name} | {p.scenario} | {p.kind} | {p.format_version} | {sum(r['faults'].values())} | "
                     f"{len(r['failures'])} | {r['replays']} | {r['lost']} | {r['duplicated']} | {r['seconds']:.0f} |")
    first = {}
    for r in results:
        for f in r["failures"]:
            said = [line.strip() for line in f.splitlines() if "keyedstate" in line or "objtest" in line]
            head = (said or f.strip().splitlines())[0][:300]
            first.setdefault(r["plan"].kind, head)
    if first:
        lines += ["", "## What a failed query said (first per kind)", ""]
        lines += [f"- {kind}: `{msg}`" for kind, msg in sorted(first.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.faults", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", help="comma-separated run names (default all: " +
                        ",".join(SPECIAL + [p.name for p in PLANS]) + ")")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS-faults.md"))
    parser.add_argument("--aimed-rounds", type=int, default=8, help="runs of aimed kills (formats in turn)")
    parser.add_argument("--aimed-minutes", type=float, default=60, help="no new aimed-kill run after this")
    parser.add_argument("--save", help="also pickle the results to this file (for --merge)")
    parser.add_argument("--merge", help="comma-separated --save files: write their report, run nothing")
    args = parser.parse_args(argv)
    if args.merge:  # parts run as separate processes at the same time: the longest is the duration
        parts = [pickle.loads(Path(p).read_bytes()) for p in args.merge.split(",")]
        results = [r for part in parts for r in part["results"]]
        Path(args.out).write_text(report(results, max(part["seconds"] for part in parts), len(parts)))
        print("wrote", args.out)
        return 0 if all(r["lost"] == 0 and r["duplicated"] == 0 for r in results) else 1
    chosen = set(args.runs.split(",")) if args.runs else None
    plans = [p for p in PLANS if not chosen or p.name in chosen]
    work = Path(tempfile.mkdtemp(prefix="keyedstate-faults-"))
    root = work / "objtest"
    started = time.monotonic()

    results: list[dict] = []

    def progress(r):
        results.append(r)
        if args.save:  # after every run: a campaign stopped early keeps what it did
            Path(args.save).write_bytes(pickle.dumps({"results": results, "seconds": time.monotonic() - started}))
        print(f"{r['plan'].name}: {sum(r['faults'].values())} faults, {len(r['failures'])} failures, "
              f"lost {r['lost']}, duplicated {r['duplicated']} ({r['seconds']:.0f} s)", flush=True)
    if not chosen or EXECUTOR_KILLS in chosen:
        progress(run_executor_kills(work))  # first: its cluster needs a process without a JVM
    if not chosen or AIMED in chosen:  # a cluster of its own too, before this process has a JVM
        run_window_kills(work, rounds=args.aimed_rounds, deadline=started + args.aimed_minutes * 60,
                         progress=progress)
    if not chosen or SPECULATION in chosen:  # a standalone cluster: no JVM in this process yet either
        for r in run_speculation(work):
            progress(r)
    if not chosen or DRIVER_KILLS in chosen:  # child drivers: no JVM in this process
        run_driver_kills(root, work, progress=progress)
    if not chosen or TWO_APPS in chosen:
        for version in ("1", "2"):
            progress(run_two_apps(root, work, version))
    if plans:
        spark = session(root)
        try:
            run_campaign(spark, plans, root, work, progress)
        finally:
            spark.stop()
    Path(args.out).write_text(report(results, time.monotonic() - started))
    print("wrote", args.out)
    return 0 if all(r["lost"] == 0 and r["duplicated"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
