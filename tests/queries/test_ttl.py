"""TTL-aware state: every operator a provider serves, with a scripted input and a test clock.

Each test drives a query one micro-batch at a time, setting keyedstate's clock (``ttl_clock``,
see conftest.py) before each batch, and compares what the query emits with results worked out
by hand from the TTL rules (Flink's StateTtlConfig semantics, documented in the README).
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Callable

import pytest
from pyspark.sql import functions as F

import keyedstate

from support.constants import KS, PFX, PROVIDER_CONF
from support.driver import FileStream, session_confs, wait_for
# Cleanup scans every version (default: every 10), so each test sees it within a batch or two.
EVERY_VERSION = {PFX + "ttl.cleanupInterval": "1"}


class Steps:
    """Runs a query step by step: set the clock, add one input file, process it."""

    def __init__(self, spark, root: Path, schema: str, build: Callable, mode: str, confs: dict,
                 clock, readers: int = 1) -> None:
        self.spark, self.build, self.mode, self.confs, self.clock = spark, build, mode, confs, clock
        self.stream = FileStream(spark, root, schema, readers=readers)
        self.start_ms = clock.now_ms
        self.emitted: list = []
        self.query = None
        self.last_batch = -1

    def _sink(self, batch, batch_id):
        self.emitted.extend(tuple(r) for r in batch.collect())

    def start(self) -> None:
        with session_confs(self.spark, {PROVIDER_CONF: KS, **self.confs}):
            self.query = self.stream.start(self.build, self._sink, self.mode)

    def stop(self) -> None:
        self.query.stop()

    def step(self, at_seconds: float, rows: list[dict]) -> tuple[list, list[dict]]:
        """The rows emitted and the progress reports of the batches that processed ``rows``."""
        self.clock.set(self.start_ms + int(at_seconds * 1000))
        self.emitted = []
        self.stream.step(self.query, rows)
        progress = [p for p in self.query.recentProgress if p["batchId"] > self.last_batch]
        self.last_batch = max([self.last_batch] + [p["batchId"] for p in progress])
        return sorted(self.emitted), progress


def state_rows(progress: list[dict]) -> int:
    return progress[-1]["stateOperators"][0]["numRowsTotal"]


def metric(progress: list[dict], name: str) -> int:
    return sum(p["stateOperators"][0]["customMetrics"].get(name, 0) for p in progress)


@pytest.mark.parametrize("settings,third_batch,rows_after", [
    # a and b were written at t=0, c at t=5; at t=12 a and b are expired: a passes again (and
    # is rewritten); b is found by the cleanup scan after that commit and deleted by the next
    # one: a and c remain (plus d, which arrives then).
    ({}, [("a",)], 2),
    # Reads refresh: a and b were read at t=9, so at t=12 nothing has expired.
    ({"ttl.updateType": "OnReadAndWrite"}, [], 3),
    # Without cleanup, expired entries stay visible until removed.
    ({"ttl.visibility": "ReturnExpiredIfNotCleanedUp", "ttl.cleanupInterval": "0"}, [], 3),
], ids=["default", "OnReadAndWrite", "ReturnExpiredIfNotCleanedUp"])
def test_dropDuplicates_passes_a_key_again_after_its_ttl_across_a_restart(
        spark, tmp_path, ttl_clock, settings, third_batch, rows_after):
    confs = {**EVERY_VERSION, PFX + "ttl": "10s", **{PFX + k: v for k, v in settings.items()}}
    run = Steps(spark, tmp_path, "id STRING", lambda df: df.dropDuplicates(["id"]), "append",
                confs, ttl_clock)
    run.start()
    try:
        assert run.step(0, [{"id": "a"}, {"id": "b"}])[0] == [("a",), ("b",)]
        assert run.step(5, [{"id": "a"}, {"id": "c"}])[0] == [("c",)]
    finally:
        run.stop()
    # The restart must keep each entry's write time: a and b do not get a fresh TTL here.
    run.start()
    try:
        out, progress = run.step(9, [{"id": "a"}, {"id": "b"}])
        assert out == [] and state_rows(progress) == 3
        out, progress = run.step(12, [{"id": "a"}, {"id": "c"}])
        assert out == third_batch
        if not settings:
            assert metric(progress, "keyedstateTtlExpired") >= 1  # a's read found it expired
        out, progress = run.step(13, [{"id": "d"}])
        assert out == [("d",)]
        assert state_rows(progress) == rows_after + 1  # d
        if not settings:
            assert metric(progress, "keyedstateTtlCleanedUp") == 1  # b
    finally:
        run.stop()


def test_a_batch_whose_only_writes_are_ttl_deletes_leaves_the_next_batch_free_to_write(spark, tmp_path, ttl_clock):
    """At t=13 the batch's one row is a duplicate, so the only writes of its version are the
    cleanup's deletes of a and b, made while it commits. The next batch writes a new key: it
    failed with "two stores ... write at once" when those deletes kept the committed version
    registered as the near cache's writer."""
    confs = {**EVERY_VERSION, PFX + "ttl": "10s", "spark.sql.shuffle.partitions": "1"}
    run = Steps(spark, tmp_path, "id STRING", lambda df: df.dropDuplicates(["id"]), "append", confs, ttl_clock)
    run.start()
    try:
        run.step(0, [{"id": "a"}, {"id": "b"}])
        run.step(5, [{"id": "c"}])
        run.step(12, [{"id": "c"}])  # the cleanup scan after this commit finds a and b expired
        out, progress = run.step(13, [{"id": "c"}])
        assert out == [] and metric(progress, "keyedstateTtlCleanedUp") == 2
        out, progress = run.step(14, [{"id": "d"}])
        assert out == [("d",)] and state_rows(progress) == 2  # c and d
    finally:
        run.stop()


def test_aggregation_restarts_an_idle_group_and_state_shrinks_on_disk(spark, tmp_path, ttl_clock):
    confs = {**EVERY_VERSION, PFX + "ttl": "10s", PFX + "snapshotInterval": "1"}
    run = Steps(spark, tmp_path, "k STRING",
                lambda df: df.groupBy("k").agg(F.count("*").alias("n")), "update", confs, ttl_clock)
    many = [{"k": f"bulk-{i}"} for i in range(3000)]
    run.start()
    try:
        out, progress = run.step(0, [{"k": "k1"}, {"k": "k1"}, {"k": "k2"}] + many)
        assert ("k1", 2) in out and ("k2", 1) in out and state_rows(progress) == 3002
        assert run.step(5, [{"k": "k1"}])[0] == [("k1", 3)]
        # k1 was last written at t=5, k2 and the bulk keys at t=0: all idle for >= 10 s.
        out, progress = run.step(16, [{"k": "k1"}, {"k": "k2"}])
        assert out == [("k1", 1), ("k2", 1)]
        # The scan after that commit found the 3000 idle bulk keys; this commit deletes them.
        out, progress = run.step(17, [{"k": "k1"}])
        assert out == [("k1", 2)]
        assert state_rows(progress) == 2
        assert metric(progress, "keyedstateTtlCleanedUp") == 3000
        # Version 1 held 3002 entries, version 4 two: its snapshot must be far smaller.
        for partition in (0, 1):
            wait_for(lambda: _sst_bytes(run, partition, 1) is not None and
                     _sst_bytes(run, partition, 4) is not None, what="snapshots of versions 1 and 4")
            assert _sst_bytes(run, partition, 4) < _sst_bytes(run, partition, 1) / 3
    finally:
        run.stop()


def _sst_bytes(run: Steps, partition: int, version: int) -> int | None:
    """Bytes of RocksDB table files in the snapshot of ``version`` (None: not uploaded yet)."""
    path = run.stream.partition_dir(partition=partition) / f"{version}.ks-snapshot"
    if not path.exists():
        return None
    manifest = json.loads(path.read_text())
    assert manifest["ttl"]["ttlMs"] == 10000
    return sum(f["size"] for f in manifest["files"] if f["name"].endswith(".sst"))


def _join(df):
    left = df.filter("side = 'L'").select("k", F.col("v").alias("lv"))
    right = df.filter("side = 'R'").select("k", F.col("v").alias("rv"))
    return left.join(right, "k")


def test_join_rows_expire_with_their_key_and_stores_stay_consistent(spark, tmp_path, ttl_clock):
    run = Steps(spark, tmp_path, "side STRING, k STRING, v STRING", _join, "append",
                {**EVERY_VERSION, PFX + "ttl": "10s"}, ttl_clock, readers=2)
    run.start()
    try:
        assert run.step(0, [{"side": "L", "k": "k1", "v": "L1"}, {"side": "L", "k": "k1", "v": "L1b"},
                            {"side": "L", "k": "k2", "v": "L9"}])[0] == []
        assert run.step(5, [{"side": "R", "k": "k1", "v": "R1"}])[0] == [("k1", "L1", "R1"), ("k1", "L1b", "R1")]
    finally:
        run.stop()
    run.start()
    try:
        # At t=20 every buffered row is older than 10 s: only the two new rows meet.
        out, progress = run.step(20, [{"side": "L", "k": "k1", "v": "L2"}, {"side": "R", "k": "k1", "v": "R2"}])
        assert out == [("k1", "L2", "R2")]
        # Without TTL the same batch would also join L1, L1b with R2 and L2 with R1.
        out, progress = run.step(21, [{"side": "L", "k": "k3", "v": "L3"}])
        assert out == []
        # Cleanup: k2's count and row, and k1's index 1 (L1b), which k1's new count (1) no longer
        # covers. Spark reports a join's custom metrics from its keyWithIndexToValue stores only.
        assert metric(progress, "keyedstateTtlCleanedUp") == 2
    finally:
        run.stop()

    def store(name: str) -> list:
        return spark.read.format("statestore").option("storeName", name).load(run.stream.checkpoint).collect()
    # Left: k1 (reset to 1 row, L2) and k3; right: k1 (R2). No count points at a missing row.
    assert len(store("left-keyToNumValues")) == 2
    assert sorted((r.key["index"], r.value["lv"]) for r in store("left-keyWithIndexToValue")) == [(0, "L2"), (0, "L3")]
    assert len(store("right-keyToNumValues")) == 1
    assert len(store("right-keyWithIndexToValue")) == 1


def test_a_state_reader_of_a_running_join_leaves_its_ttl_cleanup_working(spark, tmp_path, ttl_clock):
    """A join's TTL cleanup of keyWithIndexToValue consults the open keyToNumValues store of the
    same run in the executor (OpenStores). A batch read of that store (the state data source)
    opens and closes providers of the same store ids in the same executor while the query runs;
    keyed by store id alone, its close removed the running query's entry and the join's cleanup
    stopped, silently (issue 12's finding). Keyed by run, the reader cannot touch it."""
    run = Steps(spark, tmp_path, "side STRING, k STRING, v STRING", _join, "append",
                {**EVERY_VERSION, PFX + "ttl": "10s"}, ttl_clock, readers=2)
    run.start()
    try:
        run.step(0, [{"side": "L", "k": "k1", "v": "L1"}, {"side": "L", "k": "k1", "v": "L1b"},
                     {"side": "L", "k": "k2", "v": "L9"}])
        assert run.step(5, [{"side": "R", "k": "k1", "v": "R1"}])[0] == [("k1", "L1", "R1"), ("k1", "L1b", "R1")]
        for side in ("left", "right"):  # the running query's stores, read in the same executor
            rows = (spark.read.format("statestore").option("storeName", f"{side}-keyToNumValues")
                    .load(run.stream.checkpoint).collect())
            assert len(rows) == (2 if side == "left" else 1)
        out, progress = run.step(20, [{"side": "L", "k": "k1", "v": "L2"}, {"side": "R", "k": "k1", "v": "R2"}])
        assert out == [("k1", "L2", "R2")]
        cleaned = metric(progress, "keyedstateTtlCleanedUp")
        out, progress = run.step(21, [{"side": "L", "k": "k3", "v": "L3"}])
        # k2's count and row, and k1's index 1 (L1b), which k1's new count (1) no longer covers
        assert cleaned + metric(progress, "keyedstateTtlCleanedUp") == 2
    finally:
        run.stop()


def test_applyInPandasWithState_group_restarts_after_ttl(spark, tmp_path, ttl_clock):
    import pandas as pd
    from pyspark.sql.streaming.state import GroupStateTimeout

    def count_rows(key, frames, state):
        total = state.get[0] if state.exists else 0
        for frame in frames:
            total += len(frame)
        state.update((total,))
        yield pd.DataFrame({"k": [key[0]], "n": [total]})

    def build(df):
        return df.groupBy("k").applyInPandasWithState(
            count_rows, "k string, n long", "n long", "Update", GroupStateTimeout.NoTimeout)

    run = Steps(spark, tmp_path, "k STRING", build, "update", {**EVERY_VERSION, PFX + "ttl": "10s"}, ttl_clock)
    run.start()
    try:
        assert run.step(0, [{"k": "g1"}, {"k": "g2"}])[0] == [("g1", 1), ("g2", 1)]
        assert run.step(5, [{"k": "g1"}])[0] == [("g1", 2)]
        out, progress = run.step(20, [{"k": "g1"}])
        assert out == [("g1", 1)]  # idle since t=5: a fresh group
        out, progress = run.step(21, [{"k": "g1"}])
        assert out == [("g1", 2)]
        assert state_rows(progress) == 1  # g2 cleaned up
    finally:
        run.stop()


@pytest.mark.parametrize("ttl,expected", [("0", [("a", 1), ("b", 1)]), ("10s", [("b", 1)])])
def test_session_window_state_that_expires_closes_without_output(spark, tmp_path, ttl_clock, ttl, expected):
    def build(df):
        return (df.withWatermark("ts", "0 seconds")
                .groupBy(F.session_window("ts", "60 seconds"), "u").agg(F.count("*").alias("n"))
                .select("u", "n"))

    run = Steps(spark, tmp_path, "u STRING, ts TIMESTAMP", build, "append", {PFX + "ttl": ttl}, ttl_clock)
    run.start()
    emitted = []
    try:
        emitted += run.step(0, [{"u": "a", "ts": "2024-01-01T00:00:00"}])[0]
        # The watermark passes a's session (00:00-00:01) with this batch; at t=20 it is expired.
        emitted += run.step(20, [{"u": "b", "ts": "2024-01-01T01:00:00"}])[0]
        # b (written at t=20) is still alive when the watermark passes it, at t=21 or t=22.
        emitted += run.step(21, [{"u": "c", "ts": "2024-01-01T02:00:00"}])[0]
        emitted += run.step(22, [{"u": "d", "ts": "2024-01-01T03:00:00"}])[0]
    finally:
        run.stop()
    assert sorted(e for e in emitted if e[0] in ("a", "b")) == expected


@pytest.mark.parametrize("key,value,expect", [
    ("ttl", "-5s", "0 (off) or a positive duration"),
    ("ttl", "forever", "0 (off) or a positive duration"),
    ("ttl.updateType", "OnRead", "OnCreateAndWrite or OnReadAndWrite"),
    ("ttl.visibility", "Sometimes", "NeverReturnExpired or ReturnExpiredIfNotCleanedUp"),
    ("ttl.7", "1h", "this query has no stateful operator 7"),
    ("ttl.0.nosuchstore", "1h", "operator 0 has no store 'nosuchstore'"),
])
def test_invalid_ttl_conf_fails_at_query_start_naming_key_and_allowed_values(spark, tmp_path, key, value, expect):
    stream = FileStream(spark, tmp_path, "k STRING")
    stream.add([{"k": "a"}])
    with session_confs(spark, {PROVIDER_CONF: KS, PFX + key: value}):
        query = stream.start(lambda df: df.groupBy("k").count(), lambda batch, batch_id: batch.collect())
        try:
            with pytest.raises(Exception) as err:
                query.processAllAvailable()
        finally:
            query.stop()
    message = str(err.value)
    assert PFX + key in message and expect in message
    if key.startswith("ttl.7") or key.startswith("ttl.0."):
        assert "0 (stateStoreSave: default)" in message  # the operators it could have named
    # Nothing was committed: the query failed before its first batch.
    assert not (Path(stream.checkpoint) / "commits" / "0").exists()


def test_a_checkpoint_created_again_at_the_same_path_gets_its_own_batch_times(spark, tmp_path):
    """TTL's "now" is the batch timestamp in offsets/<batch>, read once per JVM. A query whose
    checkpoint was deleted and created again under the same path is another query (another id):
    its batch 0 must not get the old query's time. Here the old batch 0 is 8 s older than the
    new one; taken for the new write's time, that write would have expired (TTL 6 s) by the
    new batch 1, a second or two later, and the key would pass the dedup again."""
    checkpoint = tmp_path / "checkpoint"
    confs = {PROVIDER_CONF: KS, **EVERY_VERSION, PFX + "ttl": "6s"}
    emitted: list = []

    def run(root: Path, batches: list[list[dict]]) -> list[list]:
        stream = FileStream(spark, root, "id STRING", checkpoint=checkpoint)
        out = []
        with session_confs(spark, confs):
            query = stream.start(lambda df: df.dropDuplicates(["id"]),
                                 lambda batch, _: emitted.extend(tuple(r) for r in batch.collect()), "append")
        try:
            for rows in batches:
                emitted.clear()
                stream.step(query, rows)
                out.append(sorted(emitted))
        finally:
            query.stop()
        return out

    assert run(tmp_path / "old", [[{"id": "a"}]]) == [[("a",)]]
    shutil.rmtree(checkpoint)
    time.sleep(8)
    # The new query's batch 1 follows its batch 0 within the TTL: "a" is still a duplicate.
    assert run(tmp_path / "new", [[{"id": "a"}], [{"id": "a"}]]) == [[("a",)], []]
