"""Rescale a stopped query's state, and resume it: ``keyedstate.rescale`` vs Spark's repartition.

    python3 -m benchmarks.rescale                       # 10M keys, 22 batches, 4 -> 8 partitions
    python3 -m benchmarks.rescale --keys 200000         # quick check
    python3 -m benchmarks.rescale --keys 1000000 --batches 0 --json /tmp/rescale.json   # seed only
    python3 -m benchmarks.rescale --keys 1000000 --merge   # keep the file's runs at other keys/counts
    python3 -m benchmarks.rescale --report-only /tmp/rescale-1m.json --json /tmp/rescale-10m.json \\
        --plots /tmp/plots                                  # section + plot of rescale s against keys

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
   recorded. ``--batches 0`` is the old seed-only benchmark. Before the rescale the batch times of
   the run's last 10 batches (their median: *median before*), the files below ``state/`` (size,
   mtime, inode) and the state's snapshot bytes (keyedstate's ``ks-files/``, Spark RocksDB's
   ``SSTs/`` and ``*.zip``) are recorded, and the stopped checkpoint is copied aside for step 4.
2. **rescale** (timed; first, up to 90 s, until a CPU probe runs within 1.3x of the fastest one
   of the invocation, since this machine kind's host slows it now and then with no steal time
   shown): wall clock around ``keyedstate.rescale(checkpoint, to, spark=spark)`` or
   ``spark._streamingCheckpointManager.repartition(checkpoint, to)`` alone. The session (JVM,
   executors) is already up, so JVM start is excluded for both; PySpark worker start-up (which
   keyedstate's Spark tasks need and Spark's do not) is included unless ``--warm-workers``, as is
   the start of the worker processes a split by files runs in (keyedstate starts them in the
   driver, no Spark job). Spark jobs
   and stages submitted during the call are read back from the driver's status store. *Bytes
   written*: sizes of the files below ``state/`` that are new or changed (size or mtime) after
   the call, each inode once (a new hard link to an old file writes nothing). A call that raises
   (a count the provider does not support) is recorded as status ``refused`` with its message.
3. **resume** (timed): one more input file of ``--batch-rows`` rows is added and the same query
   is started again on the rescaled checkpoint, in the same session; *start() -> first batch
   done* runs from ``start()`` to the end of that batch (its ``triggerExecution`` includes
   loading the new partitions' state). *resume* = rescale + start() -> first batch done: what
   a user waits between the stopped query and its first batch at the new partition count.
   The batch verifies itself (``foreachBatch``, which the run phase's batches run too, so that
   the batch times before the stop and after the resume include the same check): it must run
   with ``--to`` shuffle partitions and state store instances, keep ``numRowsTotal == keys``, and
   every output count must equal the number of input values of that key over all batches (no
   key's state lost or duplicated); failing that, status ``verify_failed``. ``--after`` (10)
   more files were written before the start, so the query goes on with that many batches at the
   new count, each verified likewise; their
   ``triggerExecution`` times and median (*median of the next*, held against *median before*);
   both sets of batches are also kept whole (durations, state operators' custom metrics) in
   ``resume.next_batches`` and ``before_batches``, to say where a slower batch's time went.
4. **plain restart** (timed like the resume, unless ``--no-plain-restart``): the copy made before
   the rescale, restarted at the old partition count on the same input files, in the same
   session: its first batch and the ``--after`` batches after it, each verified like the
   resume's (their median, *the plain restart's next*, shows what any restart costs the batches
   after it: a cold near cache, the restored files' first compaction). It runs
   last, after the resume and its batches, and both starts wait 3 s for the maintenance thread
   to unload the previous query's stores: whatever a warmer session gives (JIT, page cache,
   started workers) favours the plain restart, so *first batch after the rescale / first batch
   after a plain restart* is not flattered. The copy has another path, so Spark loads its
   stores afresh rather than reusing the original's.

Results: ``benchmarks/.work/rescale.json`` and ``benchmarks/.work/logs/rescale__<provider>.log``.
``python3 -m benchmarks --report-only`` (and every normal run) adds a "Rescale and resume" section
and scorecard rows from that file (``--rescale A.json B.json`` reads others instead). With
``--merge`` the file keeps its earlier runs at other (keys, from, to) under ``other_runs``; when
it holds two or more key counts, the report lists every run and plots rescale seconds against
keys, one line per provider and partition change (``plots/rescale_vs_keys.png``).
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
                        cpu_probe_s,
                        base_provider, build_session, checkpoint_versions, child_env, environment, file_inodes,
                        is_keyedstate, keyedstate_build, register_provider_python, run_subprocess,
                        wait_until_idle)

RESCALE_JSON = WORK_DIR / "rescale.json"
RESCALE_PROVIDERS = ("keyedstate", "rocksdb_changelog", "rocksdb")
DEFAULT_PROVIDERS = ("keyedstate", "rocksdb_changelog")
TARGET_SPEEDUP_BY_FILES = 10.0
"""Issue 49: resume after a 4 -> 8 rescale (rescale + first batch) of 10M keys >= 10x faster than Spark's."""
TARGET_SPEEDUP = 5.0
"""Issue 49: resume after 8 -> 4 or 4 -> 6 of 10M keys >= 5x faster than Spark's (issue 14's bound)."""
TARGET_KEYS = 10_000_000
"""The state size issue 49's resume targets are set at."""
DEFAULT_BATCHES = 22
DEFAULT_AFTER = 10
"""Batches after the first one at the new partition count (issue 49: the next 10)."""
BEFORE_BATCHES = 10
"""The run phase's last batches, whose median the batches after the rescale are held against."""
TARGET_FIRST_BATCH = 1.25
"""Issue 49: first batch after a rescale <= 1.25x the first batch after a plain restart."""
TARGET_NEXT_MEDIAN = 1.1
"""Issue 49: median of the next batches <= 1.1x the median before the rescale."""
TARGET_WRITTEN = 0.10
"""Issue 49: bytes a 4 -> 8 rescale writes <= 10 % of the state's snapshot bytes."""


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


def _verify_sink(keys: int, batch_rows: int, seen: dict):
    """A foreachBatch sink that checks each batch's output and records it in ``seen``: batch b
    has seen values 0..keys + b * batch_rows - 1, each once. Every phase runs it, so that the
    batches before the stop and after the resume pay the same check."""
    def sink(df, batch_id):
        from pyspark.sql import functions as F
        total = keys + batch_id * batch_rows
        expected = F.floor((F.lit(total - 1) - F.col("key")) / keys) + 1
        row = df.agg(F.count("*").alias("rows"), F.countDistinct("key").alias("keys"),
                     F.sum(F.when(F.col("count") != expected, 1).otherwise(0)).alias("wrong")).first()
        seen[batch_id] = dict(batch_id=batch_id, **row.asDict())
    return sink


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


def _inodes(state_dir: Path) -> dict[tuple[int, int], tuple[int, int, str]]:
    """(dev, inode) -> (size, mtime_ns, relative path) of every file below ``state_dir``."""
    return {ino: (st.st_size, st.st_mtime_ns, rel) for ino, (st, rel) in file_inodes(state_dir).items()}


def _snapshot_bytes(files: dict) -> int:
    """Bytes of the state's snapshot files: keyedstate's ``ks-files/``, Spark RocksDB's ``SSTs/``
    and ``*.zip`` (each inode once)."""
    return sum(size for size, _, rel in files.values()
               if "ks-files" in Path(rel).parts or "SSTs" in Path(rel).parts or rel.endswith(".zip"))


def _written(before: dict, after: dict) -> dict:
    """What a call wrote below ``state/``: files whose inode is new or whose size or mtime changed.
    A new hard link to a file that was there before wrote no bytes and is not counted."""
    new = [(k, v) for k, v in after.items() if k not in before]
    changed = [(k, v) for k, v in after.items() if k in before and before[k][:2] != v[:2]]
    return {"bytes": sum(v[0] for _, v in new + changed), "new_files": len(new), "changed_files": len(changed),
            "largest": sorted(((v[0], v[2]) for _, v in new + changed), reverse=True)[:5]}


def _median(values: list) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


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
              run_dir: Path, timeout: float, warm_workers: bool = False, after: int = DEFAULT_AFTER,
              plain_restart: bool = True, cpu_reference: float | None = None) -> dict:
    """One provider's run (in its own process); ``cpu_reference``: the invocation's fastest CPU
    probe so far, which the timed rescale waits for the machine to come back near."""
    started = time.monotonic()
    deadline = started + timeout
    checkpoint, input_dir = run_dir / "checkpoint", run_dir / "input"
    result: dict[str, Any] = {
        "provider": provider, "status": "running", "keys": keys, "from_partitions": from_n,
        "to_partitions": to_n, "batches": batches, "batch_rows": batch_rows, "warm_workers": warm_workers,
        "after_batches": after, "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
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
        seen_run: dict[int, Any] = {}
        ran = _run_to_end(_query(spark, keys, input_dir, checkpoint, f"rescale_{provider}_run",
                                 _verify_sink(keys, batch_rows, seen_run)), deadline - time.monotonic())
        # The run's own output checked as the resumed query's is: a wrong count before the stop
        # is a defect of the run, not of the rescale.
        result["run_wrong_counts"] = sum(v.get("wrong") or 0 for v in seen_run.values())
        if result["run_wrong_counts"]:
            result["notes"].append(f"{result['run_wrong_counts']} wrong counts in the run's own batches")
        result["run_wall_s"] = round(time.monotonic() - t, 3)
        result["other_cpu_share"]["run"] = round(cpu.other_cpu_share(), 3)
        result["seed_batch"] = _brief(ran[0])
        result["run_batch_ms"] = [b["batch_ms"] for b in ran[1:]]
        # the steady state the batches after the rescale are held against (the seed batch excluded)
        result["before_batch_ms"] = result["run_batch_ms"][-BEFORE_BATCHES:]
        result["before_median_batch_ms"] = _median(result["before_batch_ms"])
        result["before_batches"] = [_brief(b) for b in ran[-BEFORE_BATCHES:]]  # where each one's time went
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
        files_before = _inodes(checkpoint / "state")
        result["snapshot_bytes_before"] = _snapshot_bytes(files_before)
        _write_input(input_dir, batches + 1, keys + batches * batch_rows, keys + (batches + 1) * batch_rows)
        plain = run_dir / "checkpoint-plain"
        if plain_restart:
            # the stopped checkpoint as it is, restarted later at the old partition count (another
            # path: Spark keys loaded stores by path, so nothing of the original is reused)
            shutil.copytree(checkpoint, plain)
        _write_json(out, result)

        # Before the timed rescale (and the warm-up, whose workers Spark stops after a minute idle):
        # wait until the machine runs near the invocation's fastest CPU probe.
        reference = min(filter(None, (cpu_reference, result["env"]["cpu_probe_s"])))
        result["cpu_probe_reference_s"] = reference
        result["cpu_probe_before_rescale_s"], result["waited_for_cpu_s"] = _await_speed(
            reference, min(90.0, max(0.0, deadline - time.monotonic() - 600)))
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
        rescaled = refused = None
        try:
            if is_keyedstate(provider):
                import keyedstate
                rescaled = keyedstate.rescale(str(checkpoint), to_n, spark=spark)
            else:
                spark._streamingCheckpointManager.repartition(str(checkpoint), to_n)
        except Exception as exc:  # noqa: BLE001 - a count the provider does not support is a result
            refused = exc
        seconds = time.perf_counter() - t0
        until_ms = time.time() * 1000
        if refused is not None:
            sampler.finish()
            ks_log.removeHandler(capture)
            result["refused_after_s"] = round(seconds, 3)
            result["status"] = "refused"
            result["error"] = f"{type(refused).__name__}: {refused}"[:4000]
            result["traceback"] = "".join(traceback.format_exception(refused))[-8000:]
            return result
        result["other_cpu_share"]["rescale"] = round(cpu.other_cpu_share(), 3)
        result["rescale_s"] = round(seconds, 3)
        result.update(sampler.finish())
        ks_log.removeHandler(capture)
        if rescaled is not None:
            result["keyedstate_result"] = rescaled.to_dict()
            result["keyedstate_log"] = capture.lines
        result["checkpoint_bytes_after"] = _dir_bytes(checkpoint)
        result["state_bytes_after"] = _dir_bytes(checkpoint / "state")
        result["rescale_written"] = _written(files_before, _inodes(checkpoint / "state"))
        result["rescale_written_bytes"] = result["rescale_written"]["bytes"]
        _record_jobs(spark, since_ms, until_ms, result)
        # the files of the batches after the first (untimed; the resume's query lists them all)
        for j in range(batches + 2, batches + 2 + after):
            _write_input(input_dir, j, keys + (j - 1) * batch_rows, keys + j * batch_rows)
        _write_json(out, result)

        # 3. resume (timed): the first batch at the new partition count, then --after more,
        # each verifying itself. Batch b has seen values 0..keys + b * batch_rows - 1, each once.
        seen: dict[int, Any] = {}
        _settle()
        sampler = _PeakSampler()
        sampler.start()
        cpu = CpuMonitor()
        start_wall = time.time()
        resumed = _run_to_end(_query(spark, keys, input_dir, checkpoint, f"rescale_{provider}_resume",
                                     _verify_sink(keys, batch_rows, seen)), deadline - time.monotonic())
        result["other_cpu_share"]["resume"] = round(cpu.other_cpu_share(), 3)
        first = resumed[0]
        resume = {"start_to_first_batch_s": round(first["start_epoch"] + first["batch_ms"] / 1000 - start_wall, 3),
                  "first_batch_ms": first["batch_ms"], "batch": _brief(first),
                  **{k: v for k, v in sampler.finish().items() if k != "rss_jvm_peak_reset"}}
        resume["total_s"] = round(result["rescale_s"] + resume["start_to_first_batch_s"], 3)
        resume["next_batch_ms"] = [b["batch_ms"] for b in resumed[1:]]
        resume["next_median_batch_ms"] = _median(resume["next_batch_ms"])
        resume["next_batches"] = [_brief(b) for b in resumed[1:]]
        result["resume"] = resume
        result["verify"] = check = _verify_run(resumed, seen, keys, to_n, min(batch_rows, keys), after)
        result["status"] = "ok" if check["ok"] else "verify_failed"
        _write_json(out, result)

        # 4. plain restart (timed like the resume): the copy of the stopped checkpoint at the old
        # partition count. It runs last, after the resume and its batches: whatever a warmer
        # session gives (JIT, page cache, started workers) favours it, not the rescale.
        if plain_restart:
            seen_plain: dict[int, Any] = {}
            _settle()
            cpu = CpuMonitor()
            start_wall = time.time()
            try:
                # The same input files as the resume: its first batch, then --after more, so that
                # the batches after a restart that keeps the count are measured beside the rescale's.
                restarted = _run_to_end(
                    _query(spark, keys, input_dir, plain, f"rescale_{provider}_plain",
                           _verify_sink(keys, batch_rows, seen_plain)),
                    deadline - time.monotonic())
                first_plain = restarted[0]
                pcheck = _verify_run(restarted, seen_plain, keys, from_n, min(batch_rows, keys), after)
                next_ms = [b["batch_ms"] for b in restarted[1:]]
                result["plain_restart"] = {
                    "start_to_first_batch_s": round(first_plain["start_epoch"] + first_plain["batch_ms"] / 1000
                                                    - start_wall, 3),
                    "first_batch_ms": first_plain["batch_ms"], "batch": _brief(first_plain),
                    "next_batch_ms": next_ms, "next_median_batch_ms": _median(next_ms),
                    "next_batches": [_brief(b) for b in restarted[1:]],
                    "verify": pcheck, "status": "ok" if pcheck["ok"] else "verify_failed"}
            except Exception as exc:  # noqa: BLE001 - the rescale's figures stand without it
                result["plain_restart"] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:2000]}
                result["notes"].append(f"plain restart failed: {type(exc).__name__}: {exc}"[:300])
            result["other_cpu_share"]["plain_restart"] = round(cpu.other_cpu_share(), 3)
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


SLOW_PROBE = 1.3
"""A CPU probe this much slower than the invocation's fastest: the machine is slowed (on this
machine kind, by its host: no steal time shows), so the timed rescale waits (:func:`_await_speed`)."""


def _await_speed(reference: float, limit_s: float = 90.0) -> tuple[float, float]:
    """Probe the CPU (``workloads.cpu_probe_s``) until it is within :data:`SLOW_PROBE` of
    ``reference`` (the fastest probe of the invocation so far) or ``limit_s`` passed: every
    provider's rescale is then timed at the machine's usual speed. Returns (the last probe,
    seconds waited)."""
    started = time.monotonic()
    probe = cpu_probe_s()
    while probe > SLOW_PROBE * reference and time.monotonic() - started < limit_s:
        time.sleep(5)
        probe = cpu_probe_s()
    return probe, round(time.monotonic() - started, 1)


def _settle(seconds: float = 3.0) -> None:
    """Let the session's state-store maintenance (every 1 s) unload the stores of the query that
    just stopped, so that their unloading does not run inside the next timed start."""
    time.sleep(seconds)


def _verify_run(batches: list[dict], seen: dict, keys: int, n: int, expected_rows: int, after: int) -> dict:
    """:func:`_verify` of a restarted query's first batch and its count (1 + ``after``), and
    each later batch's output (``expected_rows`` rows, every count right) and numRowsTotal."""
    first = batches[0]
    check = _verify(first, seen.get(first["batchId"], {}), keys, n, expected_rows, len(batches), 1 + after)
    for b in batches[1:]:
        got = seen.get(b["batchId"], {})
        if got.get("rows") != expected_rows or got.get("wrong") or b["numRowsTotal"] != keys:
            check["problems"].append(f"batch {b['batchId']}: {got.get('rows')} output rows, "
                                     f"{got.get('wrong')} wrong counts, numRowsTotal {b['numRowsTotal']}")
    check["ok"] = not check["problems"]
    return check


def _verify(batch: dict, seen: dict, keys: int, to_n: int, expected_rows: int, n_batches: int,
            expected_batches: int = 1) -> dict:
    ops = batch["stateOperators"]
    check = {
        "batchId": batch["batchId"],
        "numShufflePartitions": [op.get("numShufflePartitions") for op in ops],
        "numStateStoreInstances": [op.get("numStateStoreInstances") for op in ops],
        "numRowsTotal": batch["numRowsTotal"], "numRowsUpdated": batch["numRowsUpdated"], "output": seen,
    }
    problems = []
    if n_batches != expected_batches:
        problems.append(f"the restarted query ran {n_batches} batches, expected {expected_batches}")
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
    cmd += ["--after", str(args.after)] + ([] if args.plain_restart else ["--no-plain-restart"])
    busy_before = wait_until_idle(args.wait_idle)
    # The fastest probe of the invocation so far (the first provider takes five, a second apart):
    # each provider's rescale is timed near it. A pure-Python loop's speed depends on the
    # interpreter, so a child of another Python takes its own probe as the reference.
    for _ in range(1 if args.cpu_reference else 5):
        args.cpu_reference = min(filter(None, (args.cpu_reference, cpu_probe_s())))
        time.sleep(1)
    if python == sys.executable:
        cmd += ["--cpu-reference", str(args.cpu_reference)]
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


def target_speedup(keys: int | None, from_n: int | None, to_n: int | None) -> float | None:
    """Issue 49's resume target at its state size: 10x for a scale-up by a multiple (a split by
    files), 5x for other counts; None at other sizes (no target)."""
    if keys != TARGET_KEYS or not from_n or not to_n:
        return None
    return TARGET_SPEEDUP_BY_FILES if to_n > from_n and to_n % from_n == 0 else TARGET_SPEEDUP


def summarize(runs: dict[str, dict]) -> dict[str, Any]:
    """Every keyedstate run against every Spark run: rescale-only and resume speedups."""
    comparisons = []
    for ks in (p for p in runs if is_keyedstate(p)):
        for sp in (p for p in runs if not is_keyedstate(p)):
            a, b = runs[ks], runs[sp]
            both_ok = a.get("status") == "ok" and b.get("status") == "ok"
            bound = target_speedup(a.get("keys"), a.get("from_partitions"), a.get("to_partitions"))
            c: dict[str, Any] = {"keyedstate": ks, "spark": sp, "both_ok": both_ok, "target_speedup": bound}
            for what, get in (("rescale", lambda r: r.get("rescale_s")), ("resume", _resume_s)):
                x, y = get(a), get(b)
                c[f"{what}_keyedstate_s"], c[f"{what}_spark_s"] = x, y
                if x and y:
                    c[f"{what}_speedup"] = round(y / x, 3)
            if c.get("resume_speedup") is not None and bound is not None:
                c["meets_target"] = both_ok and c["resume_speedup"] >= bound
            comparisons.append(c)
    return {"comparisons": comparisons}


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
        verified = "yes" if v.get("ok") else "– (refused)" if r.get("status") == "refused" else (
            "**no**: " + "; ".join(v.get("problems") or [r.get("error") or "?"]))[:200]
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


def _target(c: dict, runs: dict) -> float | None:
    """The comparison's resume target, from its keyedstate run (a file written before the
    target was per count recomputes it)."""
    a = runs.get(c["keyedstate"]) or {}
    return target_speedup(a.get("keys"), a.get("from_partitions"), a.get("to_partitions"))


def _comparison_rows(data: dict) -> list[list[str]]:
    runs = data.get("runs") or {}
    rows = []
    for c in (data.get("summary") or {}).get("comparisons") or []:
        flag = " ⚠" if any(contended(runs.get(p) or {}) or (runs.get(p) or {}).get("status") != "ok"
                          for p in (c["keyedstate"], c["spark"])) else ""
        for what, label, bound in (("resume", "resume after rescale: rescale + first batch (s)", _target(c, runs)),
                                   ("rescale", "rescale call alone (s)", None)):
            a, b = c.get(f"{what}_keyedstate_s"), c.get(f"{what}_spark_s")
            speed = c.get(f"{what}_speedup")
            r = ratio_value(a, b)
            rows.append([label, f"{c['keyedstate']} vs {c['spark']}", fmt_s(a, 2), fmt_s(b, 2),
                         "–" if r is None else f"{r:.2f}× ({'–' if speed is None else f'{speed:.2f}'}× faster)",
                         target_text(bound, higher_is_better=True).replace("×", "× faster"),
                         (verdict(speed, bound, higher_is_better=True) or "–") + flag])
    return rows


def _after_figures(r: dict) -> dict[str, Any]:
    """Issue 49's figures of one provider run: first batch after the rescale against a plain
    restart, batches after against before, bytes the rescale wrote against the snapshots."""
    res, plain = r.get("resume") or {}, r.get("plain_restart") or {}
    if plain.get("status") != "ok":
        plain = {}  # a failed or unverified plain restart gives no figure to hold the rescale against
    written, snap = r.get("rescale_written_bytes"), r.get("snapshot_bytes_before")
    return {
        "first_s": res.get("start_to_first_batch_s"), "plain_s": plain.get("start_to_first_batch_s"),
        "first_vs_plain": ratio_value(res.get("start_to_first_batch_s"), plain.get("start_to_first_batch_s")),
        "before_ms": r.get("before_median_batch_ms"), "next_ms": res.get("next_median_batch_ms"),
        "next_vs_before": ratio_value(res.get("next_median_batch_ms"), r.get("before_median_batch_ms")),
        "plain_next_ms": plain.get("next_median_batch_ms"),
        "next_vs_plain_next": ratio_value(res.get("next_median_batch_ms"), plain.get("next_median_batch_ms")),
        "written": written, "snapshot": snap,
        "written_share": None if written is None or not snap else written / snap,
    }


def _targets_apply(r: dict) -> bool:
    """Issue 49 sets these targets for keyedstate's 4 -> 8 rescale."""
    return is_keyedstate(r.get("provider", "")) and (r.get("from_partitions"), r.get("to_partitions")) == (4, 8)


def after_lines(data: dict) -> list[str]:
    """Table of issue 49's figures per provider: the first batch after the rescale against a plain
    restart, the next batches against the run's last, bytes written against snapshot bytes."""
    runs = data.get("runs") or {}
    rows = []
    for provider in _ordered(runs):
        r = runs[provider]
        if r.get("status") == "refused" or not (r.get("resume") or r.get("rescale_written_bytes") is not None):
            continue
        f = _after_figures(r)
        aim = _targets_apply(r)
        plain = r.get("plain_restart") or {}
        plain_txt = fmt_s(f["plain_s"], 2) if f["plain_s"] is not None else (
            "–" if not plain else f"{plain.get('status')}")
        share = f["written_share"]
        nxt = (r.get("resume") or {}).get("next_batch_ms") or []
        rows.append([
            provider, fmt_s(f["first_s"], 2), plain_txt,
            "–" if f["first_vs_plain"] is None else f"{f['first_vs_plain']:.2f}×"
            + (f" ({verdict(f['first_vs_plain'], TARGET_FIRST_BATCH)})" if aim else ""),
            fmt_ms(f["before_ms"]), f"{fmt_ms(f['next_ms'])} ({len(nxt)})",
            "–" if f["next_vs_before"] is None else f"{f['next_vs_before']:.2f}×"
            + (f" ({verdict(f['next_vs_before'], TARGET_NEXT_MEDIAN)})" if aim else ""),
            fmt_ms(f["plain_next_ms"]),
            "–" if f["next_vs_plain_next"] is None else f"{f['next_vs_plain_next']:.2f}×",
            fmt_bytes(f["written"]), fmt_bytes(f["snapshot"]),
            "–" if share is None else f"{share:.1%}"
            + (f" ({'met' if share <= TARGET_WRITTEN else f'**missed** by {(share / TARGET_WRITTEN - 1) * 100:,.0f}%'})"
               if aim else ""),
            ", ".join(fmt_ms(v) for v in nxt) or "–"])
    if not rows:
        return []
    return table(["provider", "start() → first batch done after the rescale s", "… after a plain restart s",
                  f"rescale ÷ plain (≤ {TARGET_FIRST_BATCH:g}×)", "median batch before ms",
                  "median of the next batches ms (n)", f"next ÷ before (≤ {TARGET_NEXT_MEDIAN:g}×)",
                  "… of the next after a plain restart ms", "next ÷ plain restart's next",
                  "bytes written by the rescale", "snapshot bytes before",
                  f"written ÷ snapshot (≤ {TARGET_WRITTEN:.0%})", "next batches ms"],
                 rows, ["l", "r", "r", "r", "r", "r", "r", "r", "r", "r", "r", "r", "l"])


def scaling_points(data: dict) -> list[dict]:
    """One point per (run JSON, provider) of this file and its other_runs: keys, counts, rescale s."""
    points = []
    for d in [data, *(data.get("other_runs") or [])]:
        for provider, r in (d.get("runs") or {}).items():
            points.append({"provider": provider, "keys": r.get("keys", d.get("keys")),
                           "from": r.get("from_partitions", d.get("from_partitions")),
                           "to": r.get("to_partitions", d.get("to_partitions")), "status": r.get("status"),
                           "rescale_s": r.get("rescale_s") if r.get("status") == "ok" else None,
                           "resume_s": _resume_s(r) if r.get("status") == "ok" else None,
                           "written": r.get("rescale_written_bytes"),
                           "started_at": d.get("started_at"), "error": r.get("error")})
    return sorted(points, key=lambda q: (q["from"] or 0, q["to"] or 0, q["keys"] or 0,
                                         not is_keyedstate(q["provider"]), q["provider"]))


def merged_runs(data: dict, earlier: list[dict]) -> list[dict]:
    """Earlier rescale JSONs (and their other_runs) whose (keys, from, to) differ from ``data``'s
    and from each other's, the first given winning: the runs a plot against state size spans."""
    seen = {(data.get("keys"), data.get("from_partitions"), data.get("to_partitions"))}
    out = []
    for d in earlier:
        for one in [d, *(d.get("other_runs") or [])]:
            key = (one.get("keys"), one.get("from_partitions"), one.get("to_partitions"))
            if key in seen:
                continue
            seen.add(key)
            out.append({k: v for k, v in one.items() if k != "other_runs"})
    return out


def load_json(path: Path, others: list[Path] | None = None) -> dict:
    """A rescale JSON, with further ones (``others``) merged in as its other_runs."""
    data = json.loads(Path(path).read_text())
    if others:
        data["other_runs"] = merged_runs(data, [json.loads(Path(o).read_text()) for o in others]
                                         + list(data.get("other_runs") or []))
    return data


PLOT_NAME = "rescale_vs_keys.png"


def plot_scaling(data: dict, plots_dir: Path) -> str | None:
    """``plots_dir/rescale_vs_keys.png``: rescale seconds against keys, one line per provider and
    partition change, when the data holds runs at two or more key counts; its name, or None."""
    points = [q for q in scaling_points(data) if q["rescale_s"] is not None and q["keys"]]
    if len({q["keys"] for q in points}) < 2:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from .report import color
    fig, ax = plt.subplots(figsize=(7.2, 4.0))
    styles = ["-", "--", ":", "-."]
    changes = sorted({(q["from"], q["to"]) for q in points})
    for provider in _ordered({q["provider"] for q in points}):
        for i, change in enumerate(changes):
            line = sorted((q["keys"], q["rescale_s"]) for q in points
                          if q["provider"] == provider and (q["from"], q["to"]) == change)
            if not line:
                continue
            ax.plot([k for k, _ in line], [v for _, v in line], styles[i % len(styles)], marker="o",
                    color=color(provider), label=f"{provider} {change[0]}→{change[1]}")
    ax.set_xscale("log")
    ax.set_xlabel("keys (state rows)")
    ax.set_ylabel("rescale call (s)")
    ax.set_title("Rescale time against state size")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    plots_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(plots_dir / PLOT_NAME, dpi=110)
    plt.close(fig)
    return PLOT_NAME


def scaling_lines(data: dict, made: str | None) -> list[str]:
    """Rescale and resume seconds of every run in the file (this one and other_runs), and the plot."""
    points = scaling_points(data)
    if not data.get("other_runs"):
        return []
    rows = [[q["provider"], fmt_rows(q["keys"]), f"{q['from']} → {q['to']}", q["status"] or "?",
             fmt_s(q["rescale_s"], 2), fmt_s(q["resume_s"], 2), fmt_bytes(q["written"]),
             str(q["started_at"] or "?")[:16]] for q in points]
    out = ["Every rescale run this file holds (`--merge`, or JSON files given to `--report-only`):", ""]
    out += table(["provider", "keys", "partitions", "status", "rescale s", "resume s", "bytes written", "run"],
                 rows, ["l", "r", "l", "l", "r", "r", "r", "l"]) + [""]
    if made:
        out += [f"![rescale time against state size](plots/{made})", ""]
    return out


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
        result = r.get("keyedstate_result") or {}
        if not b and result.get("splits_in_driver"):
            logged = [line.split(" ", 1)[1] for line in r.get("keyedstate_log") or [] if " split: " in f" {line}"]
            phases = ", ".join(f"{k} {v:.2f}" for k, v in (result.get("task_seconds") or {}).items())
            out.append(f"- {provider}: no Spark job: the splits ran in worker processes of the driver "
                       f"({'; '.join(logged) or 'no split logged'}; split phases summed over the splits, s: {phases})")
            continue
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


def _probe_text(runs: dict) -> str:
    """The CPU probe (``workloads.cpu_probe_s``) each provider's run took just before its
    rescale, where recorded: the machine's speed then, which varies on this machine kind."""
    probes = [f"{p} {r['cpu_probe_before_rescale_s']:.3f} s (reference {r.get('cpu_probe_reference_s') or 0:.3f} s"
              + (f", waited {r['waited_for_cpu_s']:g} s for it" if r.get("waited_for_cpu_s") else "") + ")"
              for p, r in runs.items() if r.get("cpu_probe_before_rescale_s") and (r.get("env") or {}).get("cpu_probe_s")]
    return f"; CPU probe before the rescale (lower is faster): {', '.join(probes)}" if probes else ""


def section(data: dict, made: str | None = None) -> list[str]:
    """The report's section for a rescale.json."""
    runs = data.get("runs") or {}
    env = data.get("env") or {}
    verdicts = []
    for c in (data.get("summary") or {}).get("comparisons") or []:
        if c.get("resume_speedup"):
            bound = _target(c, runs)
            verdicts.append(f"{c['keyedstate']} resumes **{c['resume_speedup']:.2f}× as fast** as Spark {c['spark']} "
                            + (f"(target ≥ {bound:g}×: {'met' if c['resume_speedup'] >= bound else '**not met**'})"
                               if bound else "(no target at this size)"))
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
           "session (JVM start excluded for both; the start of keyedstate's workers, PySpark's for its "
           "Spark tasks or its own processes for a split by files, "
           + ("excluded too where PySpark's: `--warm-workers`" if data.get("warm_workers") else "included")
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
           + f"; {env.get('nproc', '?')} CPUs, pyspark {env.get('pyspark', '?')}, Java {env.get('java', '?')}"
           + _probe_text(runs), ""]
    busy = [p for p, r in runs.items() if contended(r)]
    if busy:
        out += [f"- ⚠ **Contended** ({', '.join(busy)}): other processes used >10% of the CPUs during or just "
                "before the run; timings are not trustworthy.", ""]
    out += table_lines(data) + [""]
    after = after_lines(data)
    if after:
        n = data.get("after_batches", DEFAULT_AFTER)
        out += [f"After the rescale (issue 49): **start() → first batch done** as above against a **plain "
                "restart** (the stopped checkpoint copied aside before the rescale, restarted at the old "
                "partition count with the same input files, in the same session after the resume and its "
                "batches, so any warmth of the session favours the plain restart); the **median** batch time "
                f"(`triggerExecution`) of the {n} batches after the first at the new count against the median "
                f"of the run's last {BEFORE_BATCHES} and against the median of the {n} after a plain restart's "
                "first; **bytes written** below `state/` by the rescale call "
                "(files new or changed in size or mtime, each inode once: a hard link writes nothing) against "
                "the **snapshot bytes** before it (keyedstate's `ks-files/`, Spark RocksDB's `SSTs/` and "
                "`*.zip`). Targets are issue 49's, for keyedstate 4 → 8.", ""]
        out += after + [""]
    out += scaling_lines(data, made)
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
    ap.add_argument("--after", type=int, default=DEFAULT_AFTER,
                    help=f"batches after the first one at the new partition count, timed each (default "
                         f"{DEFAULT_AFTER}); their median is held against the run's last {BEFORE_BATCHES}")
    ap.add_argument("--no-plain-restart", dest="plain_restart", action="store_false",
                    help="skip the plain restart of a copy of the stopped checkpoint at the old count")
    ap.add_argument("--json", type=Path, default=RESCALE_JSON, help=f"result file (default {RESCALE_JSON})")
    ap.add_argument("--merge", action="store_true",
                    help="keep the runs of other (keys, from, to) already in --json (under other_runs), "
                         "for the plot of rescale time against state size")
    ap.add_argument("--report-only", nargs="*", type=Path, metavar="JSON",
                    help="do not run: print the section of --json (and of these JSON files, as other "
                         "runs) and write the plot of rescale time against keys to --plots")
    ap.add_argument("--plots", type=Path, default=None,
                    help="with --report-only: directory of the plot (default: none written)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--cpu-reference", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.report_only is not None:
        data = load_json(args.json, args.report_only)
        made = plot_scaling(data, args.plots) if args.plots else None
        print("\n".join(section(data, made)))
        return 0
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
                      args.run_dir, args.timeout, args.warm_workers, args.after, args.plain_restart,
                      args.cpu_reference)
        print(json.dumps({k: r.get(k) for k in ("status", "rescale_s", "error")}
                         | {"resume_s": (r.get("resume") or {}).get("total_s")}), flush=True)
        return 0 if r["status"] in ("ok", "refused") else 1

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
        "after_batches": args.after, "plain_restart": args.plain_restart, "env": environment(), "commit": _git(REPO_DIR, "rev-parse", "--short", "HEAD"),
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
    if args.merge and args.json.exists():
        data["other_runs"] = merged_runs(data, [json.loads(args.json.read_text())])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    _write_json(args.json, data)
    print("\n".join(["", *section(data)]))
    print(f"wrote {args.json}")
    # a count a provider refuses is recorded, not a failure of the benchmark
    return 0 if all(r.get("status") in ("ok", "refused") for r in data["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
