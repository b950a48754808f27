"""Offline rescale of a stopped query's state: ``keyedstate.rescale`` vs Spark's own repartition.

    python3 -m benchmarks.rescale                       # 10M keys, 4 -> 8 partitions
    python3 -m benchmarks.rescale --keys 200000 --from 4 --to 8 --json /tmp/rescale.json

For each provider (keyedstate, and Spark's RocksDBStateStoreProvider = ``rocksdb``), in its own
``python -m benchmarks.rescale --child ...`` subprocess (own process group, SparkSession, JVM):

1. **seed**: W5's seed batch with ``--keys`` rows and keys -- ``groupBy(value % keys).count()``,
   update mode, ``rate-micro-batch`` (2 partitions), ``trigger(availableNow=True)`` so exactly one
   batch is logged, ``spark.sql.shuffle.partitions=--from``, sink ``noop``. Then the query stops.
   Session as in every benchmark run (``local[2]``, 6g driver, UI off); keyedstate with its
   default confs (no near cache: no batch runs after the seed).
2. **rescale** (timed): wall clock around ``keyedstate.rescale(checkpoint, to, spark=spark)``
   or ``spark._streamingCheckpointManager.repartition(checkpoint, to)`` alone. The session (JVM,
   executors) is already up, so JVM start is excluded for both; PySpark worker start-up (which
   keyedstate's tasks need and Spark's do not) is included. Spark jobs/stages submitted during the
   call are read back from the driver's status store for a breakdown.
3. **verify** (not timed): restart the same query on the rescaled checkpoint for one batch of
   ``--verify-rows`` rows (values ``keys..keys+k-1``, i.e. keys ``0..k-1``, all already in state)
   into ``foreachBatch``; it must run with ``--to`` shuffle partitions / state store instances,
   keep ``numRowsTotal == keys``, and every output count must be 2 (1 from the seed + 1 now), so
   no key's state was lost or duplicated.

Results: ``benchmarks/.work/rescale.json`` (per provider: seconds, keys, checkpoint bytes before
and after, peak RSS during the call, job breakdown, verification) and
``benchmarks/.work/logs/rescale__<provider>.log``. ``python3 -m benchmarks --report-only`` adds
a "Rescale" section from that file.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .fmt import contended, fmt_bytes, fmt_rows
from .workloads import (BASE_CONFS, PROVIDERS, REPO_DIR, WORK_DIR, CpuMonitor, RunSpec, _batch_record,
                        _descendants, _dir_bytes, _proc_table, RssSampler, _write_json, build_session,
                        environment, idle_check, is_keyedstate, rate)

RESCALE_JSON = WORK_DIR / "rescale.json"
RESCALE_PROVIDERS = ("keyedstate", "rocksdb")
TARGET_SPEEDUP = 5.0


# ---------------------------------------------------------------------------------------------
# Child: one provider, in this process
# ---------------------------------------------------------------------------------------------
def _query(spark, keys: int, rows: int, checkpoint: Path, name: str, sink=None):
    from pyspark.sql import functions as F
    df = rate(spark, rows).groupBy((F.col("value") % keys).alias("key")).count()
    writer = (df.writeStream.outputMode("update").option("checkpointLocation", str(checkpoint))
              .queryName(name).trigger(availableNow=True))
    writer = writer.foreachBatch(sink) if sink is not None else writer.format("noop")
    return writer.start()


def _run_one_batch(query, timeout: float) -> dict:
    if not query.awaitTermination(timeout):
        query.stop()
        raise TimeoutError(f"query {query.name} did not finish its batch in {timeout:.0f} s")
    if query.exception() is not None:
        raise RuntimeError(f"query {query.name} failed: {query.exception()}")
    progress = [json.loads(p.json) for p in query.recentProgress
                if (p.durationMs or {}).get("triggerExecution")]
    if not progress:
        raise RuntimeError(f"query {query.name} reported no batch")
    return _batch_record(progress[-1])


class _PeakSampler(threading.Thread):
    """Peak RSS during the timed call: VmHWM of the JVM, of each PySpark worker and state server
    (each reset first through clear_refs, so the seed batch's peak does not count; processes that
    start during the call begin fresh)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop_event = threading.Event()
        self.rss = RssSampler()
        self.peaks = self.rss.peaks
        self.sample = self.rss.sample
        self.reset_ok = False
        table = _proc_table()
        for pid in _descendants(table, os.getpid()):
            _, comm, cmdline = table[pid]
            if comm == "java" or b"keyedstate.server" in cmdline or b"pyspark.daemon" in cmdline \
                    or b"pyspark.worker" in cmdline:
                try:
                    Path("/proc", str(pid), "clear_refs").write_text("5")  # resets VmHWM to VmRSS
                    self.reset_ok = self.reset_ok or comm == "java"
                except OSError:
                    pass

    def run(self) -> None:
        while not self.stop_event.wait(0.25):
            self.sample()

    def finish(self) -> dict[str, Any]:
        self.stop_event.set()
        self.join()
        self.sample()
        return {
            "rss_jvm_peak_bytes": max(self.peaks["jvm"].values(), default=None),
            "rss_jvm_peak_reset": self.reset_ok,
            # forked workers share pages with the daemon: the sum over-counts
            "rss_python_workers_peak_bytes_sum": sum(self.peaks["python_workers"].values()) or None,
            "python_worker_processes": len(self.peaks["python_workers"]),
            "rss_state_servers_peak_bytes": sum(self.peaks["state_servers"].values()) or None,
        }


def _jobs_since(spark, since_ms: float, until_ms: float, wait_s: float = 10.0) -> list[dict]:
    """Spark jobs (with their stages) submitted in [since_ms, until_ms], from the status store.
    The listener bus is asynchronous: wait until every such job has completed there."""
    jvm = spark._jvm
    store = spark.sparkContext._jsc.sc().statusStore()
    conv = jvm.scala.jdk.javaapi.CollectionConverters

    def opt_ms(o):
        return o.get().getTime() if o.isDefined() else None

    deadline = time.monotonic() + wait_s
    while True:
        jobs = []
        for j in conv.asJava(store.jobsList(None)):
            sub = opt_ms(j.submissionTime())
            if sub is None or not (since_ms - 5 <= sub <= until_ms + 5):
                continue
            jobs.append({"jobId": j.jobId(), "name": j.name(),
                         "description": j.description().get() if j.description().isDefined() else None,
                         "group": j.jobGroup().get() if j.jobGroup().isDefined() else None,
                         "status": str(j.status()), "submitted_ms": sub,
                         "completed_ms": opt_ms(j.completionTime()), "numTasks": j.numTasks(),
                         "stageIds": [int(s) for s in conv.asJava(j.stageIds())]})
        if all(j["completed_ms"] for j in jobs) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for job in jobs:
        stages = []
        for sid in job["stageIds"]:
            try:
                for s in conv.asJava(store.stageData(sid, False, None, False, None)):
                    stages.append({"stageId": sid, "name": s.name(), "status": str(s.status()),
                                   "numTasks": s.numTasks(),
                                   "submitted_ms": opt_ms(s.submissionTime()),
                                   "completed_ms": opt_ms(s.completionTime()),
                                   "executorRunTime_ms": s.executorRunTime(),
                                   "executorCpuTime_ms": round(s.executorCpuTime() / 1e6),
                                   "inputBytes": s.inputBytes(), "outputBytes": s.outputBytes(),
                                   "shuffleWriteBytes": s.shuffleWriteBytes(),
                                   "shuffleReadBytes": s.shuffleRemoteBytesRead() + s.shuffleLocalBytesRead(),
                                   "memoryBytesSpilled": s.memoryBytesSpilled(),
                                   "diskBytesSpilled": s.diskBytesSpilled()})
            except Exception as exc:  # noqa: BLE001 - breakdown is best effort
                stages.append({"stageId": sid, "error": str(exc)[:300]})
        job["stages"] = stages
    return sorted(jobs, key=lambda j: j["submitted_ms"])


class _LogCapture(logging.Handler):
    """keyedstate.rescale's own INFO lines (phase timings), kept for the result."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.created:.3f} {record.getMessage()}")


def run_child(provider: str, keys: int, from_n: int, to_n: int, verify_rows: int, out: Path,
              run_dir: Path, timeout: float, warm_workers: bool = False) -> dict:
    started = time.monotonic()
    deadline = started + timeout
    checkpoint = run_dir / "checkpoint"
    result: dict[str, Any] = {
        "provider": provider, "status": "running", "keys": keys, "from_partitions": from_n,
        "to_partitions": to_n, "verify_rows": verify_rows, "warm_workers": warm_workers,
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "env": environment(), "notes": [], "other_cpu_share": {},
    }
    spark = None
    try:
        confs = dict(BASE_CONFS)
        confs["spark.sql.shuffle.partitions"] = str(from_n)
        confs["spark.sql.streaming.noDataMicroBatches.enabled"] = "false"
        confs.update(PROVIDERS[provider])
        result["confs"] = confs
        spark = build_session(RunSpec(workload="W5", provider=provider), confs, run_dir)
        result["env"]["java"] = spark.sparkContext._jvm.System.getProperty("java.version")
        result["session_start_s"] = round(time.monotonic() - started, 2)
        _write_json(out, result)

        # 1. seed
        cpu = CpuMonitor()
        t = time.monotonic()
        seed = _run_one_batch(_query(spark, keys, keys, checkpoint, f"rescale_{provider}_seed"),
                              deadline - time.monotonic())
        result["seed_wall_s"] = round(time.monotonic() - t, 3)
        result["seed_batch"] = {k: v for k, v in seed.items() if k != "stateOperators"}
        result["seed_batch"]["numShufflePartitions"] = [op.get("numShufflePartitions") for op in seed["stateOperators"]]
        result["other_cpu_share"]["seed"] = round(cpu.other_cpu_share(), 3)
        if seed["numRowsTotal"] != keys:
            raise RuntimeError(f"seed batch left {seed['numRowsTotal']} state rows, expected {keys}")
        result["checkpoint_bytes_before"] = _dir_bytes(checkpoint)
        result["state_bytes_before"] = _dir_bytes(checkpoint / "state")
        _write_json(out, result)

        if warm_workers:
            # Start the PySpark workers keyedstate's tasks run in (Spark's repartition needs none),
            # so that the timed call excludes their start like it excludes the JVM's.
            t = time.monotonic()
            n = spark.sparkContext.defaultParallelism
            spark.sparkContext.parallelize(range(n), n).map(lambda x: x).collect()
            result["python_workers_warmup_s"] = round(time.monotonic() - t, 3)

        # 2. rescale (timed)
        capture = _LogCapture()
        ks_log = logging.getLogger("keyedstate.rescale")
        ks_log.addHandler(capture)
        ks_log.setLevel(logging.INFO)
        sampler = _PeakSampler()
        sampler.start()
        cpu = CpuMonitor()
        since_ms = time.time() * 1000
        t0 = time.perf_counter()
        if is_keyedstate(provider):
            import keyedstate
            rescaled = keyedstate.rescale(str(checkpoint), to_n, spark=spark)
        else:
            spark._streamingCheckpointManager.repartition(str(checkpoint), to_n)
            rescaled = None
        seconds = time.perf_counter() - t0
        until_ms = time.time() * 1000
        result["other_cpu_share"]["rescale"] = round(cpu.other_cpu_share(), 3)
        result["rescale_s"] = round(seconds, 3)
        result.update(sampler.finish())
        ks_log.removeHandler(capture)
        if rescaled is not None:
            result["keyedstate_result"] = rescaled.to_dict()
            result["keyedstate_log"] = capture.lines
        result["checkpoint_bytes_after"] = _dir_bytes(checkpoint)
        result["state_bytes_after"] = _dir_bytes(checkpoint / "state")
        try:
            jobs = _jobs_since(spark, since_ms, until_ms)
            result["jobs"] = jobs
            if jobs:
                first = min(j["submitted_ms"] for j in jobs)
                last = max(j["completed_ms"] or until_ms for j in jobs)
                result["breakdown_s"] = {
                    "before_first_job": round((first - since_ms) / 1000, 3),
                    "jobs": [{"name": j["description"] or j["name"], "seconds":
                              round(((j["completed_ms"] or until_ms) - j["submitted_ms"]) / 1000, 3),
                              "tasks": j["numTasks"],
                              "shuffle_write_bytes": sum(st.get("shuffleWriteBytes") or 0 for st in j["stages"]),
                              "shuffle_read_bytes": sum(st.get("shuffleReadBytes") or 0 for st in j["stages"])}
                             for j in jobs],
                    "after_last_job": round((until_ms - last) / 1000, 3),
                }
        except Exception as exc:  # noqa: BLE001 - best effort
            result["notes"].append(f"no job breakdown: {type(exc).__name__}: {exc}"[:500])
        _write_json(out, result)

        # 3. verify (not timed)
        seen: dict[str, Any] = {}

        def sink(df, batch_id):
            from pyspark.sql import functions as F
            row = df.agg(F.count("*").alias("rows"), F.min("count").alias("min"),
                         F.max("count").alias("max"), F.countDistinct("key").alias("keys")).first()
            seen.update(batch_id=batch_id, **row.asDict())

        t = time.monotonic()
        verify = _run_one_batch(
            _query(spark, keys, verify_rows, checkpoint, f"rescale_{provider}_verify", sink),
            deadline - time.monotonic())
        ops = verify["stateOperators"]
        check = {
            "batchId": verify["batchId"], "wall_s": round(time.monotonic() - t, 3),
            "batch_ms": verify["batch_ms"],
            "numShufflePartitions": [op.get("numShufflePartitions") for op in ops],
            "numStateStoreInstances": [op.get("numStateStoreInstances") for op in ops],
            "numRowsTotal": verify["numRowsTotal"], "numRowsUpdated": verify["numRowsUpdated"],
            "output": seen,
        }
        expected_rows = min(verify_rows, keys)
        problems = []
        if any(n != to_n for n in check["numShufflePartitions"]):
            problems.append(f"numShufflePartitions {check['numShufflePartitions']}, expected {to_n}")
        if any(n != to_n for n in check["numStateStoreInstances"]):
            problems.append(f"numStateStoreInstances {check['numStateStoreInstances']}, expected {to_n}")
        if check["numRowsTotal"] != keys:
            problems.append(f"numRowsTotal {check['numRowsTotal']}, expected {keys}")
        if seen.get("rows") != expected_rows or seen.get("keys") != expected_rows:
            problems.append(f"{seen.get('rows')} output rows / {seen.get('keys')} keys, expected {expected_rows}")
        want = 2 if verify_rows <= keys else None
        if want is not None and (seen.get("min"), seen.get("max")) != (want, want):
            problems.append(f"output counts in [{seen.get('min')}, {seen.get('max')}], expected all {want} "
                            "(1 from the seed + 1 now): state lost or duplicated")
        check["ok"] = not problems
        check["problems"] = problems
        result["verify"] = check
        result["status"] = "ok" if not problems else "verify_failed"
    except BaseException as exc:  # noqa: BLE001 - everything goes into the result
        result["status"] = "failed"
        result["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        result["traceback"] = traceback.format_exc()[-8000:]
    finally:
        busy = max(result["other_cpu_share"].values(), default=0)
        if busy > 0.10:
            result["notes"].append(f"other processes used up to {busy:.0%} of the CPUs during a phase: "
                                   "timings are contended")
        result["wall_s"] = round(time.monotonic() - started, 2)
        _write_json(out, result)
        if spark is not None:
            try:
                spark.stop()
            except Exception:  # noqa: BLE001
                pass
    return result


# ---------------------------------------------------------------------------------------------
# Parent: one subprocess per provider
# ---------------------------------------------------------------------------------------------
def run_provider(provider: str, args, work_dir: Path = WORK_DIR) -> dict:
    logs, runs = work_dir / "logs", work_dir / "runs-rescale"
    logs.mkdir(parents=True, exist_ok=True)
    runs.mkdir(parents=True, exist_ok=True)
    # short, under $TMPDIR: keyedstate binds a Unix socket below java.io.tmpdir (108-byte limit)
    run_dir = Path(tempfile.mkdtemp(prefix=f"ksr-{provider}-"))
    (run_dir / "tmp").mkdir()
    out = runs / f"{provider}.json"
    out.unlink(missing_ok=True)
    log_path = logs / f"rescale__{provider}.log"
    cmd = [sys.executable, "-m", "benchmarks.rescale", "--child", provider, "--keys", str(args.keys),
           "--from", str(args.from_n), "--to", str(args.to_n), "--verify-rows", str(args.verify_rows),
           "--timeout", str(args.timeout), "--out", str(out), "--run-dir", str(run_dir)]
    if args.warm_workers:
        cmd.append("--warm-workers")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               TMPDIR=str(run_dir / "tmp"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_DIR), env.get("PYTHONPATH")]))
    busy_before = idle_check()
    waited_until = time.monotonic() + args.wait_idle
    while busy_before > 0.10 and time.monotonic() < waited_until:
        time.sleep(4)
        busy_before = idle_check(2.0)
    print(f"rescale {provider}: {args.keys:,} keys, {args.from_n} -> {args.to_n} partitions "
          f"(log {log_path})", flush=True)
    killed = False
    with open(log_path, "w") as log:
        log.write(shlex.join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=REPO_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=args.timeout + 60)
        except subprocess.TimeoutExpired:
            killed = True
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # JVM, state servers, Python workers
            except ProcessLookupError:
                pass
            proc.wait()
    try:
        result = json.loads(out.read_text())
    except (OSError, ValueError):
        result = {"provider": provider, "status": "failed", "keys": args.keys, "notes": [],
                  "error": f"no result written (exit code {proc.returncode})"}
    if killed or result.get("status") == "running":
        result["status"] = "timeout" if killed else "failed"
        result.setdefault("error", f"child exited with {proc.returncode} before finishing; see {log_path}")
    result["exit_code"] = proc.returncode
    result["busy_cpu_share_before"] = round(busy_before, 3)
    if busy_before > 0.10:
        result.setdefault("notes", []).append(f"machine was {busy_before:.0%} busy just before the run started")
    result["log"] = str(log_path.relative_to(REPO_DIR)) if log_path.is_relative_to(REPO_DIR) else str(log_path)
    if args.keep_checkpoints:
        result["run_dir"] = str(run_dir)
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def summarize(runs: dict[str, dict]) -> dict[str, Any]:
    ks, sp = (runs.get("keyedstate") or {}), (runs.get("rocksdb") or {})
    a, b = ks.get("rescale_s"), sp.get("rescale_s")
    ok = ks.get("status") == "ok" and sp.get("status") == "ok"
    out: dict[str, Any] = {"both_ok": ok, "keyedstate_s": a, "spark_rocksdb_s": b,
                           "target_speedup": TARGET_SPEEDUP}
    if a and b:
        out["ratio_keyedstate_over_spark"] = round(a / b, 3)
        out["speedup_spark_over_keyedstate"] = round(b / a, 3)
        out["meets_target"] = ok and b / a >= TARGET_SPEEDUP
    return out


def table(data: dict) -> list[str]:
    """Markdown table of a rescale.json (shared with the report)."""
    runs = data.get("runs") or {}
    s = data.get("summary") or {}
    lines = ["| provider | status | keys | partitions | rescale s | keyedstate ÷ Spark | Spark ÷ keyedstate "
             "| ckpt before → after | peak RSS during rescale (JVM / Python workers) | verified |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for provider in RESCALE_PROVIDERS:
        r = runs.get(provider)
        if r is None:
            continue
        busy = contended(r)
        v = r.get("verify") or {}
        name = "**keyedstate** `keyedstate.rescale`" if provider == "keyedstate" else \
            "Spark RocksDB `_streamingCheckpointManager.repartition`"
        ratio = s.get("ratio_keyedstate_over_spark") if provider == "keyedstate" else None
        speed = s.get("speedup_spark_over_keyedstate") if provider == "keyedstate" else None
        lines.append(
            f"| {name} | {r.get('status', '?')}{' ⚠' if busy else ''} | {fmt_rows(r.get('keys'))} "
            f"| {r.get('from_partitions', '?')} → {r.get('to_partitions', '?')} "
            f"| {'–' if r.get('rescale_s') is None else format(r['rescale_s'], '.2f')} "
            f"| {'–' if ratio is None else format(ratio, '.2f') + '×'} "
            f"| {'–' if speed is None else format(speed, '.2f') + '×'} "
            f"| {fmt_bytes(r.get('checkpoint_bytes_before'))} → {fmt_bytes(r.get('checkpoint_bytes_after'))} "
            f"| {fmt_bytes(r.get('rss_jvm_peak_bytes'))} / {fmt_bytes(r.get('rss_python_workers_peak_bytes_sum'))} "
            f"| {'yes' if v.get('ok') else ('**no**: ' + '; '.join(v.get('problems') or [r.get('error') or '?']))[:200]} |")
    return lines


def breakdown(data: dict) -> list[str]:
    """One line per provider: where the rescale time went (Spark jobs of the call)."""
    out = []
    for provider in RESCALE_PROVIDERS:
        r = (data.get("runs") or {}).get(provider) or {}
        b = r.get("breakdown_s")
        if not b:
            continue
        def shuffle(j):
            w, r_ = j.get("shuffle_write_bytes"), j.get("shuffle_read_bytes")
            return ((f", shuffle write {fmt_bytes(w)}" if w else "") + (f", shuffle read {fmt_bytes(r_)}" if r_ else ""))
        jobs = ", ".join(f"{(j['name'] or '?').splitlines()[0][:60]} {j['seconds']:.2f} s ({j['tasks']} tasks{shuffle(j)})"
                         for j in b["jobs"])
        warm = (f" (PySpark workers started beforehand, untimed: {r['python_workers_warmup_s']:.2f} s)"
                if r.get("python_workers_warmup_s") is not None else "")
        out.append(f"- {provider}: {b['before_first_job']:.2f} s before the first Spark job; jobs: {jobs}; "
                   f"{b['after_last_job']:.2f} s after the last job{warm}")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.rescale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=10_000_000, help="keys (= seed rows); default 10M")
    ap.add_argument("--from", dest="from_n", type=int, default=4, help="partitions of the seed batch (default 4)")
    ap.add_argument("--to", dest="to_n", type=int, default=8, help="partitions to rescale to (default 8)")
    ap.add_argument("--providers", default=",".join(RESCALE_PROVIDERS),
                    help=f"comma-separated, of {','.join(RESCALE_PROVIDERS)} (default both)")
    ap.add_argument("--verify-rows", type=int, default=10_000,
                    help="rows of the (untimed) verification batch after the rescale (default 10k)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per provider run (default 1800)")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="S",
                    help="before each run, wait up to S s until other processes use <10%% of the CPUs")
    ap.add_argument("--keep-checkpoints", action="store_true", help="keep each run's scratch dir")
    ap.add_argument("--warm-workers", action="store_true",
                    help="start the PySpark workers (a trivial Python job) before the timed call, so "
                         "that it excludes their start too (keyedstate's tasks run in them; by default "
                         "their cold start, ~3 s on the 2-CPU VM, is part of keyedstate's time)")
    ap.add_argument("--json", type=Path, default=RESCALE_JSON, help=f"result file (default {RESCALE_JSON})")
    ap.add_argument("--child", choices=list(RESCALE_PROVIDERS), help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.keys < 1 or args.from_n < 1 or args.to_n < 1 or args.from_n == args.to_n:
        ap.error("--keys, --from, --to must be >= 1 and --from != --to")

    if args.child:
        args.run_dir.mkdir(parents=True, exist_ok=True)
        r = run_child(args.child, args.keys, args.from_n, args.to_n, args.verify_rows, args.out,
                      args.run_dir, args.timeout, args.warm_workers)
        print(json.dumps({k: r.get(k) for k in ("status", "rescale_s", "error")}), flush=True)
        return 0 if r["status"] == "ok" else 1

    providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    unknown = set(providers) - set(RESCALE_PROVIDERS)
    if unknown:
        ap.error(f"unknown providers {sorted(unknown)}")
    command = shlex.join(["python3", "-m", "benchmarks.rescale", *argv])
    started = time.time()
    data: dict[str, Any] = {
        "benchmark": "rescale", "command": command,
        "started_at": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
        "keys": args.keys, "from_partitions": args.from_n, "to_partitions": args.to_n,
        "warm_workers": args.warm_workers,
        "env": environment(), "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "runs": {},
    }
    for provider in providers:
        data["runs"][provider] = run_provider(provider, args)
        r = data["runs"][provider]
        print(f"  {provider}: {r.get('status')}, rescale {r.get('rescale_s')} s"
              + (f", error: {r.get('error', '').splitlines()[0][:300]}" if r.get("error") else ""), flush=True)
    data["duration_s"] = round(time.time() - started, 1)
    java = next((r.get("env", {}).get("java") for r in data["runs"].values() if r.get("env", {}).get("java")), None)
    data["env"]["java"] = java
    data["summary"] = summarize(data["runs"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    _write_json(args.json, data)
    print("\n".join(["", *table(data), "", *breakdown(data), ""]))
    s = data["summary"]
    if s.get("speedup_spark_over_keyedstate"):
        print(f"keyedstate is {s['speedup_spark_over_keyedstate']:.2f}x as fast as Spark's repartition "
              f"(target >= {TARGET_SPEEDUP:g}x: {'met' if s.get('meets_target') else 'NOT met'})")
    print(f"wrote {args.json}")
    return 0 if all(r.get("status") == "ok" for r in data["runs"].values()) else 1


def _git(*cmd: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(REPO_DIR), *cmd], capture_output=True, text=True,
                              timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


if __name__ == "__main__":
    sys.exit(main())
