"""Speculation (issue 12.2): two attempts of the same partition and state version run at once,
on two executors of a standalone cluster whose Workers sit on distinct loopback hosts
(support/cluster.py: Spark never puts a speculative copy on the host of a running attempt).

An applyInPandasWithState query counts rows per key; in one batch the first attempt of the task
that holds key 0 sleeps inside the stateful operator, with its store open for writing, until a
speculative attempt on the other executor has loaded the same version, written it and
committed. The output, and the output after a restart from the checkpoint (objtest://, object-
store semantics), are exact in both checkpoint format versions: one committed state, nothing
lost or counted twice. Each batch of ``rate-micro-batch`` adds ROWS_PER_BATCH // KEYS rows to
every key, so the count of key k after batch b is known in closed form.
"""
from __future__ import annotations

import json
import time

import pytest

from support import cluster, jvmsession

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROWS_PER_BATCH, KEYS = cluster.ROWS_PER_BATCH, cluster.KEYS
SLOW_BATCH = 2
WAIT_S = 120.0  # the most an attempt waits at key 0 for the other one
HOLD_S = 10.0  # how long the first attempt holds its store after the copy is past key 0


def _speculating_counts(spark, checkpoint: str, marks: str, out: list):
    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    lo, hi = SLOW_BATCH * ROWS_PER_BATCH, (SLOW_BATCH + 1) * ROWS_PER_BATCH
    wait_s, hold_s = WAIT_S, HOLD_S

    def count(key, frames, state):
        import os
        import time as _time

        from pyspark import TaskContext

        n = state.get[0] if state.exists else 0
        values = []
        for frame in frames:
            n += len(frame)
            values.extend(int(v) for v in frame["v"])
        if key[0] == 0 and values and all(lo <= v < hi for v in values):
            ctx = TaskContext.get()
            attempt = ctx.attemptNumber()

            def wait_for(name: str) -> bool:
                path, since = os.path.join(marks, name), _time.monotonic()
                while not os.path.exists(path) and _time.monotonic() - since < wait_s:
                    _time.sleep(0.05)
                return os.path.exists(path)

            def write(name: str, value) -> None:
                path = os.path.join(marks, name)
                with open(path + ".tmp", "w") as f:
                    f.write(json.dumps(value))
                os.replace(path + ".tmp", path)

            # Whichever attempt reaches key 0 first, the copy goes on only once the first attempt
            # is here, and the first attempt holds its store (loaded, uncommitted) until the copy
            # is past key 0 and for a while after: the two overlap and the copy commits first.
            saw_first = attempt == 0 or wait_for("attempt-0")
            write(f"attempt-{attempt}", {"start": _time.time(), "partition": ctx.partitionId(),
                                         "sawFirst": saw_first})
            if attempt == 0:
                wait_for("attempt-1.done")
                _time.sleep(hold_s)  # Spark kills this attempt once the copy's task has succeeded
            write(f"attempt-{attempt}.done", _time.time())
        state.update((n,))
        yield pd.DataFrame({"k": [key[0]], "n": [n]})

    return (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", ROWS_PER_BATCH).load()
            .select((F.col("value") % KEYS).alias("k"), F.col("value").alias("v"))
            .groupBy("k").applyInPandasWithState(count, "k long, n long", "n long", "update",
                                                 GroupStateTimeout.NoTimeout)
            .writeStream.outputMode("update").foreachBatch(lambda df, _: out.extend(map(tuple, df.collect())))
            .option("checkpointLocation", checkpoint).trigger(processingTime="0 seconds").start())


def _run_batches(query, until: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    try:
        while (query.lastProgress or {}).get("batchId", -1) + 1 < until:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, f"only {query.lastProgress} after {timeout}s"
            time.sleep(0.1)
    finally:
        query.stop()


def _exact(rows) -> None:
    """Every batch b emitted (k, ROWS_PER_BATCH // KEYS * (b + 1)) for every key k: a count
    lost or added anywhere breaks the closed form. (A batch that reached the sink but
    not the commit log before a stop is delivered again by the next run, with the same rows.)"""
    rows = set(rows)
    batches = max(n for _, n in rows) // (ROWS_PER_BATCH // KEYS)
    assert rows == {(k, ROWS_PER_BATCH // KEYS * (b + 1)) for k in range(KEYS) for b in range(batches)}, sorted(rows)


def test_two_attempts_of_one_state_version_leave_exactly_one_committed_state(request, tmp_path):
    if not jvmsession.run_here_or_delegate(request, tmp_path):
        return
    conf = cluster.keyedstate_conf(tmp_path / "objtest", **{
        "spark.speculation": "true", "spark.speculation.interval": "100ms", "spark.speculation.quantile": "0.5",
        "spark.speculation.multiplier": "1.5", "spark.speculation.minTaskRuntime": "500ms",
        "spark.speculation.efficiency.enabled": "false", "spark.locality.wait": "0s"})
    with cluster.standalone_cluster_session(conf=conf) as cl:
        spark = cl.spark
        spark.sparkContext.setLogLevel("ERROR")
        hosts = {info.host() for info in spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()}
        assert {"127.0.0.2", "127.0.0.3"} <= hosts, hosts  # (and the driver's)
        for version in (1, 2):
            spark.conf.set("spark.sql.streaming.stateStore.checkpointFormatVersion", str(version))
            marks = tmp_path / f"marks-{version}"
            marks.mkdir()
            checkpoint = f"objtest://bucket/speculation-v{version}"
            out: list = []
            _run_batches(_speculating_counts(spark, checkpoint, str(marks), out), SLOW_BATCH + 3)
            _exact(out)

            # The speculative attempt ran to its end while the first one was still running with its
            # store loaded and uncommitted: Spark launches a copy only of a running task, whose store
            # is loaded before the operator runs, and the two wait for each other at key 0 (a slow
            # start of the first attempt's Python worker once let the copy finish first, and Spark
            # then killed the first attempt before it reached key 0).
            present = sorted(p.name for p in marks.iterdir())
            assert {"attempt-0", "attempt-1", "attempt-1.done"} <= set(present), present
            first = json.loads((marks / "attempt-0").read_text())
            copy = json.loads((marks / "attempt-1").read_text())
            copy_done = float((marks / "attempt-1.done").read_text())
            first_done_mark = marks / "attempt-0.done"  # absent if Spark killed it while it held
            first_done = float(first_done_mark.read_text()) if first_done_mark.exists() else float("inf")
            assert copy["sawFirst"] and first["start"] <= copy["start"], (first, copy)
            assert copy_done < first_done and copy_done < first["start"] + WAIT_S, (first, copy, copy_done)
            assert copy["partition"] == first["partition"]

            # The checkpoint holds exactly one committed state: a new run continues exactly.
            _run_batches(_speculating_counts(spark, checkpoint, str(tmp_path / "unused"), out), SLOW_BATCH + 6)
            _exact(out)
