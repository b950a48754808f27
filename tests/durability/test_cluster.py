"""keyedstate on a real multi-JVM cluster (support/cluster.py: ``local-cluster[2,1,1024]``, two
executor JVMs started by a standalone Worker, checkpoint on ``objtest://`` with object-store
semantics): a streaming aggregation, a stream-stream join and a dropDuplicates run across both
executors; one executor JVM is SIGKILLed while an aggregation batch runs; Spark relaunches it,
state is reloaded from the checkpoint in another JVM, and the output is exactly what Spark's
HDFS-backed provider gives (each batch of ``rate-micro-batch`` adds the same rows to every key,
so that output is known in closed form: the count of key k after batch b is
ROWS_PER_BATCH // KEYS * (b + 1), whatever the provider; the join matches each value once).
The killed JVM's state servers exit on their own, and none outlives the cluster. In both
checkpoint format versions, one after the other in the same cluster (Spark reads the version per
query; one cluster start instead of two): under version 2 the reloading JVM finds each version by
the unique id Spark's commit log recorded (on 932aed2 that run cannot start: version 2 was refused).
"""
from __future__ import annotations

import time

import pytest

from support import cluster, jvmsession, processes
from support.constants import STATE_PREFIX

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROWS_PER_BATCH, KEYS = cluster.ROWS_PER_BATCH, cluster.KEYS
BATCHES = 6


def _batches_done(query) -> int:
    progress = query.lastProgress
    return 0 if progress is None else progress["batchId"] + 1


def _servers_of(pid: int) -> list[int]:
    """State servers started by the JVM ``pid`` (other sessions' servers may run beside)."""
    return [p for p in processes.state_server_pids() if p in processes.descendants(pid)]


def _cluster_servers(cl) -> set[int]:
    return {s for pid in cl.executor_pids().values() for s in _servers_of(pid)}


def _survives_a_killed_executor(cl, tmp_path, format_version: str) -> set[int]:
    """One format version's three queries; returns the state servers seen while they ran."""
    from pyspark.sql import functions as F

    spark = cl.spark
    spark.conf.set(STATE_PREFIX + "checkpointFormatVersion", format_version)
    bucket = f"objtest://bucket/v{format_version}"
    first_pids = cl.wait_for_executors(2)
    assert len(first_pids) == 2 and cl.driver_pid not in first_pids.values()
    # An executor's log spans the whole application: only what this version's queries add counts.
    log_start = {e: len(cl.executor_log(e)) for e in first_pids}

    # dropDuplicates across both executors: every value once, whichever JVM holds its key.
    dedup = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", ROWS_PER_BATCH).load()
             .select((F.col("value") % 37).alias("v")).dropDuplicates(["v"])
             .writeStream.outputMode("append").format("memory").queryName(f"seen{format_version}")
             .option("checkpointLocation", f"{bucket}/dedup").trigger(availableNow=True).start())
    dedup.awaitTermination(600)
    assert dedup.exception() is None, (format_version, dedup.exception())
    assert sorted(r.v for r in spark.table(f"seen{format_version}").collect()) == list(range(min(37, ROWS_PER_BATCH)))

    # A stream-stream join across both executors: the right side's value v arrives one batch
    # after the left side's, so every match is made from the join's state. Each v matches once.
    def rate(shift: int):
        return (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", ROWS_PER_BATCH).load()
                .select((F.col("value") - shift).alias("v")))

    join = (rate(0).withColumnRenamed("v", "lv").join(rate(ROWS_PER_BATCH), F.expr("lv = v"))
            .writeStream.outputMode("append").format("memory").queryName(f"joined{format_version}")
            .option("checkpointLocation", f"{bucket}/join").trigger(processingTime="0 seconds").start())
    try:
        deadline = time.monotonic() + 300
        while _batches_done(join) < 4:
            assert join.exception() is None, (format_version, join.exception())
            assert time.monotonic() < deadline, f"format {format_version}: only {_batches_done(join)} join batches"
            time.sleep(0.1)
    finally:
        join.stop()
    matched = sorted(r.v for r in spark.table(f"joined{format_version}").collect())
    # Contiguous from 0, no value twice: nothing lost or duplicated (a batch stopped after
    # its sink but before its commit may add one more batch's worth).
    assert len(matched) >= 3 * ROWS_PER_BATCH and matched == list(range(len(matched))), matched

    query = cluster.slow_counts(spark, f"{bucket}/agg", f"counts{format_version}")
    tracker = spark.sparkContext.statusTracker()
    killed, orphans, ours = None, [], set()
    try:
        deadline = time.monotonic() + 600
        while (done := _batches_done(query)) < BATCHES:
            assert query.exception() is None, (format_version, query.exception())
            assert time.monotonic() < deadline, f"format {format_version}: only {done} batches"
            if killed is None and done >= 2 and tracker.getActiveStageIds():
                victim = max(first_pids, key=lambda e: len(_servers_of(first_pids[e])))
                orphans = _servers_of(first_pids[victim])
                killed = cl.kill_executor(victim)  # SIGKILL while a batch runs
            ours.update(_cluster_servers(cl))
            time.sleep(0.05)
        cl.wait_for_executors(2, exclude={killed[0]})
    finally:
        query.stop()
    rows = sorted(map(tuple, spark.table(f"counts{format_version}").collect()))
    executors_ran_tasks = {e: "Running task" in cl.executor_log(e)[log_start[e]:] for e in first_pids}
    # The killed JVM's state servers notice and exit by themselves.
    processes.wait_until(lambda: not [p for p in orphans if processes.alive(p)], 60,
                         "the killed executor's state servers to exit")
    servers_while_up = _cluster_servers(cl)
    ours.update(servers_while_up)
    print(f"format {format_version}: killed {killed} with state servers {orphans}; {len(rows)} rows; "
          f"servers {sorted(ours)}")
    assert killed is not None and orphans, f"format {format_version}: no executor with state servers was killed mid-batch"
    batches = len(rows) // KEYS
    assert batches >= BATCHES  # every batch updates every key with its running count:
    assert rows == cluster.closed_form(batches)
    # the format version reached the stores: under 2 every changelog is named <v>_<unique id>
    changelogs = [p.name for p in (tmp_path / "objtest" / "bucket" / f"v{format_version}" / "agg" / "state")
                  .rglob("*.ks-changelog")]
    assert changelogs and all(("_" in name) == (format_version == "2") for name in changelogs), changelogs
    assert all(executors_ran_tasks.values()), (format_version, executors_ran_tasks)
    assert servers_while_up  # the live executors still had theirs...
    return ours


def test_keyedstate_on_two_executors_survives_a_killed_executor_exactly(request, tmp_path):
    if not jvmsession.run_here_or_delegate(request, tmp_path):
        return
    ours: set[int] = set()
    with cluster.local_cluster_session(executors=2, conf=cluster.keyedstate_conf(tmp_path / "objtest")) as cl:
        cl.spark.sparkContext.setLogLevel("ERROR")
        for format_version in ("1", "2"):
            ours |= _survives_a_killed_executor(cl, tmp_path, format_version)
    processes.wait_until(lambda: not [p for p in ours if processes.alive(p)], 60,
                         "every state server of the cluster to exit once it stopped")
