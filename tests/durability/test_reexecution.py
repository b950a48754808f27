"""A batch Spark runs again: the state of the re-execution is the version, as with Spark's own
providers (they overwrite ``<v>.delta`` / ``<v>.changelog`` / ``<v>.zip``).

A run stopped (or killed) between its tasks' state commits and Spark's commit log leaves version
``v`` of every store partition in the checkpoint for a batch Spark does not count as done: the
restarted run executes that batch again, maybe over another query (Spark allows changing a
filter across restarts) or other input (a source that does not replay the same rows), and its
commit of ``v`` is the one that counts. Here ``commits/2`` is deleted after a clean stop (the
checkpoint a driver killed at that moment leaves), the query restarts changed, runs on, and
restarts once more so that the re-executed versions are loaded from the checkpoint alone
(through version 3's snapshot where one is taken). Output and final state must equal those of
Spark's default provider on the same sequence, in both checkpoint formats, also when the first
attempt's snapshot of version 3 was already uploaded, and on an object store.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from support.constants import KS, PFX, PROVIDER_CONF, REFERENCE_PROVIDER, STATE_PREFIX
from support.driver import _Inputs, assert_same_output, drain, normalise, session_confs, wait_for
from support.durability import arm, objtest_location

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SCHEMA = "k STRING, v LONG"
STEPS = [[{"k": f"k{i % 4}", "v": b * 100 + i} for i in range(12)] for b in range(7)]
RERUN = 2  # the batch executed twice: it makes version 3
FIRST_FILTER, SECOND_FILTER = "v % 3 != 0", "v % 2 = 0"
# Version 3 is a snapshot version: its first attempt's snapshot is staged and uploaded at commit.
CONFS = {PFX + "snapshotInterval": "3"}


def _run(spark, provider: str, root: Path, variant: str, format_version: str = "1",
         location: str | None = None, checkpoint: Path | None = None):
    """Batches 0..2, a stop, ``commits/2`` deleted, a restart over a changed filter (or changed
    input of batch 2), batches 3..4, a second restart, batches 5..6; returns every sink call
    and the final state rows."""
    inputs = _Inputs(spark, [SCHEMA], [root / "input"])
    checkpoint = checkpoint or root / "checkpoint"
    where = {"filter": FIRST_FILTER}
    outputs: list = []

    def sink(df, batch_id):
        outputs.append((int(batch_id), normalise(df.collect())))

    def start():
        df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(inputs.dirs[0]))
        counts = df.where(where["filter"]).groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        return (counts.writeStream.outputMode("update").foreachBatch(sink)
                .option("checkpointLocation", location or str(checkpoint)).start())

    def steps(query, rows_list):
        for rows in rows_list:
            inputs.publish(0, rows)
            drain(query, checkpoint, inputs.total)

    confs = {**CONFS, PROVIDER_CONF: provider, STATE_PREFIX + "checkpointFormatVersion": format_version}
    with session_confs(spark, confs):
        query = start()
        try:
            steps(query, STEPS[:RERUN + 1])
            if variant == "snapshot" and provider == KS:  # the first attempt's snapshot is in the checkpoint
                wait_for(lambda: all(_snapshots(checkpoint / "state" / "0" / str(p), RERUN + 1) for p in (0, 1)),
                         what="the snapshots of version 3")
        finally:
            query.stop()
        for name in (str(RERUN), f".{RERUN}.crc"):
            (checkpoint / "commits" / name).unlink(missing_ok=True)
        if variant == "input":  # the source gives other rows for the same offsets
            (inputs.dirs[0] / f"{RERUN:05d}.json").write_text(
                "".join(f'{{"k":"k{i % 3}","v":{i * 7}}}\n' for i in range(20)))
        else:
            where["filter"] = SECOND_FILTER
        for rest in (STEPS[RERUN + 1:RERUN + 3], STEPS[RERUN + 3:]):
            query = start()
            try:
                drain(query, checkpoint, inputs.total)  # batch 2 again (first restart)
                steps(query, rest)
            finally:
                query.stop()
        state = spark.read.format("statestore").load(location or str(checkpoint))
        return outputs, normalise(state.select("key.k", "value.*").collect())


def _snapshots(directory: Path, version: int) -> list[str]:
    try:
        return [n for n in (p.name for p in directory.iterdir()) if re.fullmatch(rf"{version}(_[0-9a-f-]+)?\.ks-snapshot", n)]
    except FileNotFoundError:
        return []


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory):
    """Each variant on Spark's default provider (checkpoint format 1: the result does not depend on it)."""
    results: dict = {}

    def get(variant: str):
        if variant not in results:
            results[variant] = _run(spark, REFERENCE_PROVIDER, tmp_path_factory.mktemp(f"reference-{variant}"), variant)
        return results[variant]

    return get


def _check(reference, candidate) -> None:
    (ref_out, ref_state), (out, state) = reference, candidate
    assert [b for b, _ in out].count(RERUN) == 2, out  # the batch ran twice
    assert_same_output(ref_out, out, labels=("Spark's default provider", "keyedstate"))
    assert state == ref_state


@pytest.mark.parametrize("format_version", ["1", "2"])
@pytest.mark.parametrize("variant", ["filter", "input", "snapshot"])
def test_a_reexecuted_batch_commits_the_reexecution(spark, tmp_path, reference, variant, format_version):
    candidate = _run(spark, KS, tmp_path, variant, format_version)
    _check(reference(variant), candidate)
    if variant == "snapshot":  # the first attempt's snapshot of version 3 is not the version any more
        for p in (0, 1):
            assert len(_snapshots(tmp_path / "checkpoint" / "state" / "0" / str(p), RERUN + 1)) <= (
                1 if format_version == "1" else 2)


def test_a_reexecuted_batch_commits_the_reexecution_on_an_object_store(spark, tmp_path, reference, fault_root):
    arm(spark)  # object-store semantics, no fault
    location, checkpoint = objtest_location(spark, "reexecution")
    candidate = _run(spark, KS, tmp_path, "snapshot", "1", location=location, checkpoint=checkpoint)
    _check(reference("snapshot"), candidate)
