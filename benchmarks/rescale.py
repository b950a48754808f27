"""Rescale a stopped query's state, and resume it: ``keyedstate.rescale`` vs Spark's repartition.

    python3 -m benchmarks.rescale                       # 10M keys, 22 batches, 4 -> 8 partitions
    python3 -m benchmarks.rescale --keys 200000         # quick check
    python3 -m benchmarks.rescale --keys 1000000 --batches 0 --json /tmp/rescale.json   # seed only

For each provider (keyedstate, and Spark's RocksDB provider with changelog checkpointing =
``rocksdb_changelog``; ``rocksdb`` without it on request), in its own
``python -m benchmarks.rescale --child ...`` subprocess (own process group, SparkSession, JVM):

1. **run**: W5's state shape, ``groupBy(value % keys).count()`` in update mode with
   ``spark.sql.shuffle.partitions=--from``, over a parquet file source read one file per batch
   (``maxFilesPerTrigger=1``) with ``trigger(availableNow=True)``: a seed file of ``--keys`` rows
   (values ``0..keys-1``: every key once), then ``--batches`` files of ``--batch-rows`` rows
   (the values continue, so each batch updates ``batch-rows`` consecutive keys). The query ends
   by itself after the last file, with every batch committed (Spark's repartition and keyedstate's
   rescale both refuse an uncommitted last batch, which stopping a running query leaves). With
   the default 22 batches (versions 1-23) every provider has written snapshots (keyedstate's
   ``snapshotInterval`` and Spark's ``minDeltasForSnapshot`` are both 10; the session's 1 s
   ``maintenanceInterval`` uploads them while the query runs); the load plan at the stop is
   recorded. ``--batches 0`` is the old seed-only benchmark.
2. **rescale** (timed): wall clock around ``keyedstate.rescale(checkpoint, to, spark=spark)`` or
   ``spark._streamingCheckpointManager.repartition(checkpoint, to)`` alone. The session (JVM,
   executors) is already up, so JVM start is excluded for both; PySpark worker start-up (which
   keyedstate's tasks need and Spark's do not) is included unless ``--warm-workers``. Spark jobs
   and stages submitted during the call are read back from the driver's status store.
3. **resume** (timed): one more input file of ``--batch-rows`` rows is added and the same query
   is started again on the rescaled checkpoint, in the same session; *start() -> first batch
   done* runs from ``start()`` to the end of that batch (its ``triggerExecution`` includes
   loading the new partitions' state). *resume* = rescale + start() -> first batch done: what
   a user waits between the stopped query and its first batch at the new partition count.
   The batch verifies itself (``foreachBatch``, also used, as a no-op write, by the run phase so
   that the callback server is already up): it must run with ``--to`` shuffle partitions and state
   store instances, keep ``numRowsTotal == keys``, and every output count must equal the number
   of input values of that key over all batches (no key's state lost or duplicated); failing that,
   status ``verify_failed``.

Results: ``benchmarks/.work/rescale.json`` and ``benchmarks/.work/logs/rescale__<provider>.log``.
``python3 -m benchmarks --report-only`` (and every normal run) adds a "Rescale and resume" section
and scorecard rows from that file.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .fmt import (CONTENDED_SHARE, contended, fmt_bytes, fmt_load_plan, fmt_ms, fmt_rows, fmt_s, ratio_value,
                  table, target_text, verdict)
from .workloads import (BASE_CONFS, PROVIDER_PYTHON, PROVIDERS, REPO_DIR, WORK_DIR, CpuMonitor, RssSampler,
                        RunSpec, _batch_record, _descendants, _dir_bytes, _git, _proc_table, _write_json,
                        base_provider, build_session, checkpoint_versions, child_env, environment,
                        is_keyedstate, keyedstate_build, register_provider_python, run_subprocess,
                        wait_until_idle)

RESCALE_JSON = WORK_DIR / "rescale.json"
RESCALE_PROVIDERS = ("keyedstate", "rocksdb_changelog", "rocksdb")
DEFAULT_PROVIDERS = ("keyedstate", "rocksdb_changelog")
TARGET_SPEEDUP = 5.0
"""Issue 14: resume after rescale (rescale + first batch) >= 5x faster than Spark's."""
DEFAULT_BATCHES = 22


# ---------------------------------------------------------------------------------------------
# Child: one provider, in this process
# ---------------------------------------------------------------------------------------------
def _write_input(directory: Path, index: int, start: int, end: int) -> None:
    """Input file ``index`` (values ``start..end-1``); mtimes increase with the index, which is
    the order the file source reads them in."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{index:05d}.parquet"
    tmp = directory.parent / f".{path.name}.tmp"
    pq.write_table(pa.table({"value": np.arange(start, end, dtype=np.int64)}), tmp)
    os.replace(tmp, path)
    os.utime(path, (1_000_000 + index, 1_000_000 + index))


def _query(spark, keys: int, input_dir: Path, checkpoint: Path, name: str, sink):
    from pyspark.sql import functions as F
    df = (spark.readStream.schema("value long").option("maxFilesPerTrigger", 1).parquet(str(input_dir))
          .groupBy((F.col("value") % keys).alias("key")).count())
    return (df.writeStream.outputMode("update").option("checkpointLocation", str(checkpoint))
            .queryName(name).trigger(availableNow=True).foreachBatch(sink).start())


def _noop_sink(df, batch_id) -> None:
    df.write.format("noop").mode("overwrite").save()


def _run_to_end(query, timeout: float) -> list[dict]:
    """Wait until an availableNow query has processed everything; its batches' records."""
    if not query.awaitTermination(timeout):
        query.stop()
        raise TimeoutError(f"query {query.name} did not finish in {timeout:.0f} s")
    if query.exception() is not None:
        raise RuntimeError(f"query {query.name} failed: {query.exception()}")
    batches = [_batch_record(json.loads(p.json)) for p in query.recentProgress
               if (p.durationMs or {}).get("triggerExecution")]
    if not batches:
        raise RuntimeError(f"query {query.name} reported no batch")
    return batches


def _brief(batch: dict) -> dict:
    out = {k: v for k, v in batch.items() if k != "stateOperators"}
    ops = batch.get("stateOperators") or []
    out["numShufflePartitions"] = [op.get("numShufflePartitions") for op in ops]
    out["numStateStoreInstances"] = [op.get("numStateStoreInstances") for op in ops]
    out["customMetrics"] = [op.get("customMetrics") for op in ops]
    return out


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
    """keyedstate's own INFO lines during the rescale (phase timings), kept for the result."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.created:.3f} {record.getMessage()}")


def run_child(provider: str, keys: int, from_n: int, to_n: int, batches: int, batch_rows: int, out: Path,
              run_dir: Path, timeout: float, warm_workers: bool = False) -> dict:
    started = time.monotonic()
    deadline = started + timeout
    checkpoint, input_dir = run_dir / "checkpoint", run_dir / "input"
    result: dict[str, Any] = {
        "provider": provider, "status": "running", "keys": keys, "from_partitions": from_n,
        "to_partitions": to_n, "batches": batches, "batch_rows": batch_rows, "warm_workers": warm_workers,
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "env": environment(), "notes": [], "other_cpu_share": {},
    }
    if provider in PROVIDER_PYTHON:
        result["python"] = sys.executable
    spark = None
    try:
        confs = dict(BASE_CONFS)
        confs["spark.sql.shuffle.partitions"] = str(from_n)
        confs["spark.sql.streaming.noDataMicroBatches.enabled"] = "false"
        confs.update(PROVIDERS[provider])
        result["confs"] = confs
        t = time.monotonic()
        _write_input(input_dir, 0, 0, keys)
        for j in range(1, batches + 1):
            _write_input(input_dir, j, keys + (j - 1) * batch_rows, keys + j * batch_rows)
        result["input_write_s"] = round(time.monotonic() - t, 2)
        spark = build_session(RunSpec(workload="W5", provider=provider), confs, run_dir)
        result["env"]["java"] = spark.sparkContext._jvm.System.getProperty("java.version")
        result["session_start_s"] = round(time.monotonic() - started, 2)
        if is_keyedstate(provider):
            result["keyedstate_build"] = keyedstate_build()
        _write_json(out, result)

        # 1. seed + run, until the query ends by itself
        cpu = CpuMonitor()
        t = time.monotonic()
        ran = _run_to_end(_query(spark, keys, input_dir, checkpoint, f"rescale_{provider}_run", _noop_sink),
                          deadline - time.monotonic())
        result["run_wall_s"] = round(time.monotonic() - t, 3)
        result["other_cpu_share"]["run"] = round(cpu.other_cpu_share(), 3)
        result["seed_batch"] = _brief(ran[0])
        result["run_batch_ms"] = [b["batch_ms"] for b in ran[1:]]
        if len(ran) != batches + 1:
            raise RuntimeError(f"the run phase processed {len(ran)} batches, expected {batches + 1}")
        if ran[-1]["numRowsTotal"] != keys:
            raise RuntimeError(f"the run left {ran[-1]['numRowsTotal']} state rows, expected {keys}")
        result["load_plan_at_stop"] = plan = checkpoint_versions(checkpoint / "state")
        if batches >= 20 and (plan.get("stores_without_snapshot") or not plan.get("newest_snapshot_max")):
            result["notes"].append(f"{plan.get('stores_without_snapshot')} of {plan.get('stores')} store "
                                   "partitions had no snapshot when the query stopped")
        result["checkpoint_bytes_before"] = _dir_bytes(checkpoint)
        result["state_bytes_before"] = _dir_bytes(checkpoint / "state")
        _write_input(input_dir, batches + 1, keys + batches * batch_rows, keys + (batches + 1) * batch_rows)
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
        ks_log = logging.getLogger("keyedstate")  # keyedstate.offline.rescaling (keyedstate.rescale before 932aed2)
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
        _record_jobs(spark, since_ms, until_ms, result)
        _write_json(out, result)

        # 3. resume (timed): the first batch at the new partition count, verifying itself
        total = keys + (batches + 1) * batch_rows  # values 0..total-1 went in, each once
        seen: dict[str, Any] = {}

        def verify_sink(df, batch_id):
            from pyspark.sql import functions as F
            expected = F.floor((F.lit(total - 1) - F.col("key")) / keys) + 1
            row = df.agg(F.count("*").alias("rows"), F.countDistinct("key").alias("keys"),
                         F.sum(F.when(F.col("count") != expected, 1).otherwise(0)).alias("wrong")).first()
            seen.update(batch_id=batch_id, **row.asDict())

        sampler = _PeakSampler()
        sampler.start()
        cpu = CpuMonitor()
        start_wall = time.time()
        resumed = _run_to_end(_query(spark, keys, input_dir, checkpoint, f"rescale_{provider}_resume", verify_sink),
                              deadline - time.monotonic())
        result["other_cpu_share"]["resume"] = round(cpu.other_cpu_share(), 3)
        first = resumed[0]
        resume = {"start_to_first_batch_s": round(first["start_epoch"] + first["batch_ms"] / 1000 - start_wall, 3),
                  "first_batch_ms": first["batch_ms"], "batch": _brief(first),
                  **{k: v for k, v in sampler.finish().items() if k != "rss_jvm_peak_reset"}}
        resume["total_s"] = round(result["rescale_s"] + resume["start_to_first_batch_s"], 3)
        result["resume"] = resume
        result["verify"] = check = _verify(first, seen, keys, to_n, min(batch_rows, keys), len(resumed))
        result["status"] = "ok" if check["ok"] else "verify_failed"
    except BaseException as exc:  # noqa: BLE001 - everything goes into the result
        result["status"] = "failed"
        result["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        result["traceback"] = traceback.format_exc()[-8000:]
    finally:
        busy = max(result["other_cpu_share"].values(), default=0)
        if busy > CONTENDED_SHARE:
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


def _verify(batch: dict, seen: dict, keys: int, to_n: int, expected_rows: int, n_batches: int) -> dict:
    ops = batch["stateOperators"]
    check = {
        "batchId": batch["batchId"],
        "numShufflePartitions": [op.get("numShufflePartitions") for op in ops],
        "numStateStoreInstances": [op.get("numStateStoreInstances") for op in ops],
        "numRowsTotal": batch["numRowsTotal"], "numRowsUpdated": batch["numRowsUpdated"], "output": seen,
    }
    problems = []
    if n_batches != 1:
        problems.append(f"the resumed query ran {n_batches} batches, expected 1")
    if any(n != to_n for n in check["numShufflePartitions"]):
        problems.append(f"numShufflePartitions {check['numShufflePartitions']}, expected {to_n}")
    if any(n != to_n for n in check["numStateStoreInstances"]):
        problems.append(f"numStateStoreInstances {check['numStateStoreInstances']}, expected {to_n}")
    if check["numRowsTotal"] != keys:
        problems.append(f"numRowsTotal {check['numRowsTotal']}, expected {keys}")
    if seen.get("rows") != expected_rows or seen.get("keys") != expected_rows:
        problems.append(f"{seen.get('rows')} output rows / {seen.get('keys')} keys, expected {expected_rows}")
    if seen.get("wrong"):
        problems.append(f"{seen['wrong']} keys with a wrong count: state lost or duplicated")
    check["ok"] = not problems
    check["problems"] = problems
    return check


def _record_jobs(spark, since_ms: float, until_ms: float, result: dict) -> None:
    """The Spark jobs the timed call submitted, and where its time went."""
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


# ---------------------------------------------------------------------------------------------
# Parent: one subprocess per provider
# ---------------------------------------------------------------------------------------------
def run_provider(provider: str, args, work_dir: Path = WORK_DIR) -> dict:
    logs, runs = work_dir / "logs", work_dir / "runs-rescale"
    logs.mkdir(parents=True, exist_ok=True)
    runs.mkdir(parents=True, exist_ok=True)
    # short, under $TMPDIR: keyedstate binds a Unix socket below java.io.tmpdir (108-byte limit)
    run_dir = Path(tempfile.mkdtemp(prefix=f"ksr-{provider}-"))
    out = runs / f"{provider}.json"
    out.unlink(missing_ok=True)
    log_path = logs / f"rescale__{provider}.log"
    python = PROVIDER_PYTHON.get(provider, sys.executable)
    cmd = [python, "-m", "benchmarks.rescale", "--child", provider, "--keys", str(args.keys),
           "--from", str(args.from_n), "--to", str(args.to_n), "--batches", str(args.batches),
           "--batch-rows", str(args.batch_rows), "--timeout", str(args.timeout), "--out", str(out),
           "--run-dir", str(run_dir)]
    cmd += [a for item in args.provider_python for a in ("--provider-python", item)]
    if args.warm_workers:
        cmd.append("--warm-workers")
    busy_before = wait_until_idle(args.wait_idle)
    print(f"rescale {provider}: {args.keys:,} keys, {args.batches} batches of {args.batch_rows:,} rows, "
          f"{args.from_n} -> {args.to_n} partitions (log {log_path})", flush=True)
    code, killed = run_subprocess(cmd, child_env(python, run_dir), log_path, args.timeout + 60)
    try:
        result = json.loads(out.read_text())
    except (OSError, ValueError):
        result = {"provider": provider, "status": "failed", "keys": args.keys, "notes": [],
                  "error": f"no result written (exit code {code})"}
    if killed or result.get("status") == "running":
        result["status"] = "timeout" if killed else "failed"
        result.setdefault("error", f"child exited with {code} before finishing; see {log_path}")
    result["exit_code"] = code
    result["busy_cpu_share_before"] = round(busy_before, 3)
    if busy_before > CONTENDED_SHARE:
        result.setdefault("notes", []).append(f"machine was {busy_before:.0%} busy just before the run started")
    result["log"] = str(log_path.relative_to(REPO_DIR)) if log_path.is_relative_to(REPO_DIR) else str(log_path)
    if args.keep_checkpoints:
        result["run_dir"] = str(run_dir)
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def _resume_s(r: dict) -> float | None:
    return (r.get("resume") or {}).get("total_s")


def summarize(runs: dict[str, dict]) -> dict[str, Any]:
    """Every keyedstate run against every Spark run: rescale-only and resume speedups."""
    comparisons = []
    for ks in (p for p in runs if is_keyedstate(p)):
        for sp in (p for p in runs if not is_keyedstate(p)):
            a, b = runs[ks], runs[sp]
            both_ok = a.get("status") == "ok" and b.get("status") == "ok"
            c: dict[str, Any] = {"keyedstate": ks, "spark": sp, "both_ok": both_ok}
            for what, get in (("rescale", lambda r: r.get("rescale_s")), ("resume", _resume_s)):
                x, y = get(a), get(b)
                c[f"{what}_keyedstate_s"], c[f"{what}_spark_s"] = x, y
                if x and y:
                    c[f"{what}_speedup"] = round(y / x, 3)
            if c.get("resume_speedup") is not None:
                c["meets_target"] = both_ok and c["resume_speedup"] >= TARGET_SPEEDUP
            comparisons.append(c)
    return {"target_speedup": TARGET_SPEEDUP, "comparisons": comparisons}


# ---------------------------------------------------------------------------------------------
# Rendering (the report's "Rescale and resume" section and scorecard rows)
# ---------------------------------------------------------------------------------------------
def _provider_label(provider: str, result: dict) -> str:
    if not is_keyedstate(provider):
        return f"Spark {provider} `repartition`"
    build = (result.get("keyedstate_build") or {}).get("commit")
    name = f"**{provider}**" if provider == "keyedstate" else provider
    return f"{name} `keyedstate.rescale`" + (f" (`{build}`)" if build else "")


def table_lines(data: dict) -> list[str]:
    """Markdown table of a rescale.json, one row per provider run."""
    runs = data.get("runs") or {}
    rows = []
    for provider in _ordered(runs):
        r = runs[provider]
        v = r.get("verify") or {}
        res = r.get("resume") or {}
        verified = "yes" if v.get("ok") else ("**no**: " + "; ".join(v.get("problems") or [r.get("error") or "?"]))[:200]
        rows.append([
            _provider_label(provider, r), f"{r.get('status', '?')}{' ⚠' if contended(r) else ''}",
            fmt_rows(r.get("keys")), f"{r.get('from_partitions', '?')} → {r.get('to_partitions', '?')}",
            "–" if r.get("batches") is None else f"1 + {r['batches']} × {fmt_rows(r.get('batch_rows'))}",
            fmt_load_plan(r.get("load_plan_at_stop")), fmt_s(r.get("rescale_s"), 2),
            fmt_s(res.get("start_to_first_batch_s"), 2), fmt_ms(res.get("first_batch_ms")),
            fmt_s(res.get("total_s"), 2),
            f"{fmt_bytes(r.get('checkpoint_bytes_before'))} → {fmt_bytes(r.get('checkpoint_bytes_after'))}",
            f"{fmt_bytes(r.get('rss_jvm_peak_bytes'))} / {fmt_bytes(res.get('rss_jvm_peak_bytes'))}",
            verified])
    return table(["provider", "status", "keys", "partitions", "batches before stop", "load plan at stop",
                  "rescale s", "start() → first batch done s", "first batch ms", "resume s (rescale + first batch)",
                  "ckpt before → after", "peak RSS JVM: rescale / first batch", "verified"],
                 rows, ["l", "l", "r", "l", "r", "l", "r", "r", "r", "r", "r", "r", "l"])


def _ordered(runs) -> list[str]:
    return sorted(runs, key=lambda p: (not is_keyedstate(p), p != "keyedstate", p))


def _comparison_rows(data: dict) -> list[list[str]]:
    runs = data.get("runs") or {}
    rows = []
    for c in (data.get("summary") or {}).get("comparisons") or []:
        flag = " ⚠" if any(contended(runs.get(p) or {}) or (runs.get(p) or {}).get("status") != "ok"
                          for p in (c["keyedstate"], c["spark"])) else ""
        for what, label, bound in (("resume", "resume after rescale: rescale + first batch (s)", TARGET_SPEEDUP),
                                   ("rescale", "rescale call alone (s)", None)):
            a, b = c.get(f"{what}_keyedstate_s"), c.get(f"{what}_spark_s")
            speed = c.get(f"{what}_speedup")
            r = ratio_value(a, b)
            rows.append([label, f"{c['keyedstate']} vs {c['spark']}", fmt_s(a, 2), fmt_s(b, 2),
                         "–" if r is None else f"{r:.2f}× ({'–' if speed is None else f'{speed:.2f}'}× faster)",
                         target_text(bound, higher_is_better=True).replace("×", "× faster"),
                         (verdict(speed, bound, higher_is_better=True) or "–") + flag])
    return rows


def scorecard_rows(data: dict) -> list[list[str]]:
    """Rows for the report's scorecard: metric, case, keyedstate, Spark, ratio, target, result."""
    rows = []
    for row in _comparison_rows(data):
        label, case, *rest = row
        rows.append([label, f"{fmt_rows(data.get('keys'))} keys {data.get('from_partitions')}→"
                     f"{data.get('to_partitions')}, {case} (rescale run {str(data.get('started_at', '?'))[:16]})", *rest])
    return rows


def breakdown(data: dict) -> list[str]:
    """One line per provider: where the rescale time went (Spark jobs of the call)."""
    out = []
    for provider in _ordered(data.get("runs") or {}):
        r = data["runs"][provider]
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


def section(data: dict) -> list[str]:
    """The report's section for a rescale.json."""
    runs = data.get("runs") or {}
    env = data.get("env") or {}
    verdicts = []
    for c in (data.get("summary") or {}).get("comparisons") or []:
        if c.get("resume_speedup"):
            verdicts.append(f"{c['keyedstate']} resumes **{c['resume_speedup']:.2f}× as fast** as Spark {c['spark']} "
                            f"(target ≥ {TARGET_SPEEDUP:g}×: {'met' if c.get('meets_target') else '**not met**'})")
    batches = data.get("batches")
    shape = (f"a seed batch of {fmt_rows(data.get('keys'))} rows (= keys), then {batches} batches of "
             f"{fmt_rows(data.get('batch_rows'))} rows" if batches
             else f"one seed batch of {fmt_rows(data.get('keys'))} rows (= keys)")
    out = ["## Rescale and resume: keyedstate.rescale vs Spark's repartition", "",
           f"A stopped query's state redistributed from {data.get('from_partitions', '?')} to "
           f"{data.get('to_partitions', '?')} partitions, then the query resumed. W5's state shape "
           f"(`groupBy(value % keys).count()`): {shape}, read from parquet one file per batch with "
           "`trigger(availableNow=True)`, so the query ends by itself with every batch committed "
           "(*load plan at stop*: the snapshot and changelogs a load would use). Then, in the same "
           "session (JVM start excluded for both; keyedstate's PySpark worker start "
           + ("excluded too: `--warm-workers`" if data.get("warm_workers") else "included")
           + "): **rescale s** = `keyedstate.rescale(checkpoint, n)` or "
           "`spark._streamingCheckpointManager.repartition(checkpoint, n)`; **start() → first batch "
           "done** = the same query restarted on the rescaled checkpoint with one more file, until its "
           "first batch ended (it loads the new partitions' state); **resume s** = the sum, what a user "
           "waits. That batch checks itself (**verified**: new partition count, every key kept, every "
           "count right). Peak RSS: JVM `VmHWM`, reset before each phase. "
           + (" ".join(v + "." for v in verdicts)), "",
           f"- Command: `{data.get('command', '?')}`; started {data.get('started_at', '?')}, took "
           f"{(data.get('duration_s') or 0) / 60:.1f} min; commit `{data.get('commit') or '?'}`"
           + (" (uncommitted changes)" if data.get("dirty") else "")
           + f"; {env.get('nproc', '?')} CPUs, pyspark {env.get('pyspark', '?')}, Java {env.get('java', '?')}", ""]
    busy = [p for p, r in runs.items() if contended(r)]
    if busy:
        out += [f"- ⚠ **Contended** ({', '.join(busy)}): other processes used >10% of the CPUs during or just "
                "before the run; timings are not trustworthy.", ""]
    out += table_lines(data) + [""]
    comparisons = _comparison_rows(data)
    if comparisons:
        out += table(["figure", "keyedstate vs Spark", "keyedstate s", "Spark s", "keyedstate ÷ Spark", "target", "result"],
                     comparisons, ["l", "l", "r", "r", "r", "r", "l"]) + [""]
    notes = [f"- {p}: " + "; ".join(r["notes"]) for p, r in runs.items() if r.get("notes")]
    notes += [f"- {p}: error `{r['error'].splitlines()[0][:300]}`" for p, r in runs.items() if r.get("error")]
    if notes:
        out += ["Notes:", ""] + notes + [""]
    where = breakdown(data)
    if where:
        out += ["Where the rescale time went (Spark jobs submitted during the call, from the driver's status store):", ""]
        out += where + [""]
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.rescale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=10_000_000, help="keys (= seed rows); default 10M")
    ap.add_argument("--from", dest="from_n", type=int, default=4, help="partitions before (default 4)")
    ap.add_argument("--to", dest="to_n", type=int, default=8, help="partitions to rescale to (default 8)")
    ap.add_argument("--batches", type=int, default=DEFAULT_BATCHES,
                    help=f"batches after the seed before the stop (default {DEFAULT_BATCHES}: >= 2 x the "
                         "snapshot interval of both providers, so both have snapshots); 0 = seed only")
    ap.add_argument("--batch-rows", type=int,
                    help="rows of each batch after the seed, and of the first batch after the rescale "
                         "(default keys/100)")
    ap.add_argument("--providers", default=",".join(DEFAULT_PROVIDERS),
                    help=f"comma-separated, of {','.join(RESCALE_PROVIDERS)} and --provider-python names "
                         f"(default {','.join(DEFAULT_PROVIDERS)})")
    ap.add_argument("--provider-python", action="append", default=[], metavar="NAME=PYTHON",
                    help="also run NAME (e.g. keyedstate_before) with another interpreter, as in "
                         "python3 -m benchmarks; repeatable")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per provider run (default 1800)")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="S",
                    help="before each run, wait up to S s until other processes use <10%% of the CPUs")
    ap.add_argument("--keep-checkpoints", action="store_true", help="keep each run's scratch dir")
    ap.add_argument("--warm-workers", action="store_true",
                    help="start the PySpark workers (a trivial Python job) before the timed call, so "
                         "that it excludes their start too (keyedstate's tasks run in them; by default "
                         "their cold start, ~3 s on the 2-CPU VM, is part of keyedstate's time)")
    ap.add_argument("--json", type=Path, default=RESCALE_JSON, help=f"result file (default {RESCALE_JSON})")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.keys < 1 or args.from_n < 1 or args.to_n < 1 or args.from_n == args.to_n or args.batches < 0:
        ap.error("--keys, --from, --to must be >= 1, --from != --to, --batches >= 0")
    args.batch_rows = args.batch_rows or max(1, args.keys // 100)
    try:
        aliases = [register_provider_python(item) for item in args.provider_python]
    except ValueError as exc:
        ap.error(str(exc))

    if args.child:
        args.run_dir.mkdir(parents=True, exist_ok=True)
        r = run_child(args.child, args.keys, args.from_n, args.to_n, args.batches, args.batch_rows, args.out,
                      args.run_dir, args.timeout, args.warm_workers)
        print(json.dumps({k: r.get(k) for k in ("status", "rescale_s", "error")}
                         | {"resume_s": (r.get("resume") or {}).get("total_s")}), flush=True)
        return 0 if r["status"] == "ok" else 1

    providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    providers += [a for a in aliases if a not in providers]
    unknown = [p for p in providers if p not in RESCALE_PROVIDERS and p not in PROVIDER_PYTHON]
    unknown += [p for p in providers if base_provider(p) == "hdfs"]
    if unknown:
        ap.error(f"unknown providers {sorted(set(unknown))} (rescale: {', '.join(RESCALE_PROVIDERS)})")
    command = shlex.join(["python3", "-m", "benchmarks.rescale", *argv])
    started = time.time()
    data: dict[str, Any] = {
        "benchmark": "rescale", "command": command,
        "started_at": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
        "keys": args.keys, "from_partitions": args.from_n, "to_partitions": args.to_n,
        "batches": args.batches, "batch_rows": args.batch_rows, "warm_workers": args.warm_workers,
        "env": environment(), "commit": _git(REPO_DIR, "rev-parse", "--short", "HEAD"),
        "dirty": bool(_git(REPO_DIR, "status", "--porcelain", "--untracked-files=no")),
        "runs": {},
    }
    for provider in providers:
        data["runs"][provider] = run_provider(provider, args)
        r = data["runs"][provider]
        print(f"  {provider}: {r.get('status')}, rescale {r.get('rescale_s')} s, resume {_resume_s(r)} s"
              + (f", error: {r.get('error', '').splitlines()[0][:300]}" if r.get("error") else ""), flush=True)
    data["duration_s"] = round(time.time() - started, 1)
    java = next((r.get("env", {}).get("java") for r in data["runs"].values() if r.get("env", {}).get("java")), None)
    data["env"]["java"] = java
    data["summary"] = summarize(data["runs"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    _write_json(args.json, data)
    print("\n".join(["", *section(data)]))
    print(f"wrote {args.json}")
    return 0 if all(r.get("status") == "ok" for r in data["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
