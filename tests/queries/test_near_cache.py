"""The JVM near cache stays consistent with the committed versions and within its budget:
across aborted attempts, re-executed batches (an older version loaded again by the same
provider), and state that outgrows the budget."""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

import keyedstate

from support.constants import HDFS_PROVIDER, KS, PFX, PROVIDER_CONF
from support.driver import FileStream, collect_into, count_by_key, run_query, session_confs


@pytest.mark.parametrize("native_reads,overlay", [(True, "16m"), (True, "0"), (False, "16m")],
                         ids=["native-reads", "native-reads-sync-per-version", "round-trips"])
def test_state_larger_than_the_cache_budget_stays_exact_and_within_budget(spark, tmp_path, native_reads, overlay):
    """Misses are read from RocksDB's files in the JVM (default), or by round trips to Python.
    A key evicted from the cache after a write is read natively in a later version: from the
    writes kept since the reader last caught up (nativeOverlayBytes), or after a catch-up."""
    budget = 256 * 1024
    confs = {PROVIDER_CONF: KS, PFX + "nearCacheBytes": str(budget), PFX + "nativeReads": str(native_reads).lower(),
             PFX + "nativeOverlayBytes": overlay}
    # ~2000 distinct keys of ~60 bytes: far more than the budget holds.
    batches = [[f"{'x' * 40}-{(batch * 700 + i) % 2500:05d}" for i in range(1500)] for batch in range(6)]
    progress, _ = _count_keys(spark, tmp_path, confs, batches)
    metrics = [op["customMetrics"] for p in progress for op in p["stateOperators"]]
    assert all(m["keyedstateCacheBytes"] <= budget for m in metrics)
    assert sum(m["keyedstateCacheEvictions"] for m in metrics) > 0
    native, bridged = (sum(m[name] for m in metrics) for name in ("keyedstateNativeGets", "keyedstateBridgeGets"))
    if native_reads:
        assert native > 0 and bridged == 0, (native, bridged)
    else:
        assert bridged > 0 and native == 0, (native, bridged)
    if native_reads and overlay == "0":  # a catch-up in each version read natively
        per_batch = [[op["customMetrics"] for op in p["stateOperators"]] for p in progress]
        read = [(sum(m["keyedstateNativeGets"] for m in b), sum(m["keyedstateNativeSyncs"] for m in b)) for b in per_batch]
        assert all(syncs >= 1 for gets, syncs in read if gets), read
    assert sum(m["keyedstateCacheAbsent"] for m in metrics) > 0     # new keys answered by the Bloom filter
    assert max(m["keyedstateBloomBytes"] for m in metrics) > 0


def test_native_reads_see_the_writes_of_versions_since_their_reader_caught_up(spark, tmp_path):
    """The native reader catches up (and the server flushes) only when the writes committed
    since, kept in the JVM, outgrow their budget: keys evicted from the near cache after a write
    are read back exact in later versions with no catch-up, instead of one per version."""
    confs = {PROVIDER_CONF: KS, PFX + "nearCacheBytes": str(4 << 20), "spark.sql.shuffle.partitions": "2"}
    keys = [f"{'k' * 40}-{i:06d}" for i in range(40_000)]  # ~6 MB in the near cache: it evicts
    batches = [keys] + [keys[(b * 5_000) % 40_000:][:5_000] + keys[(b * 5_000 - 15_000) % 40_000:][:1_500]
                        for b in range(1, 7)]
    progress, _ = _count_keys(spark, tmp_path, confs, batches)
    metrics = [[op["customMetrics"] for op in p["stateOperators"]] for p in progress]
    syncs, native = ([sum(m[name] for m in batch) for batch in metrics]
                     for name in ("keyedstateNativeSyncs", "keyedstateNativeGets"))
    later = range(3, len(progress))  # once the seed's writes are flushed
    assert all(native[b] > 0 for b in later), native
    assert sum(syncs[b] for b in later) < len(later), syncs  # without the overlay: 2 a version


def test_batch_executed_twice_reloads_the_older_version(spark, tmp_path):
    """foreachBatch that runs the batch's plan twice makes the same provider serve version v
    again after it committed v+1: the second run must see v, not its own v+1."""
    stream = FileStream(spark, tmp_path, "k STRING")
    runs: list = []

    def sink(batch, batch_id):
        first = sorted(map(tuple, batch.collect()))
        second = sorted(map(tuple, batch.collect()))
        runs.append((batch_id, first, second))

    expected = Counter()
    with session_confs(spark, {PROVIDER_CONF: KS}):
        query = stream.start(count_by_key, sink)
        try:
            for batch in range(4):
                rows = [{"k": f"k{(batch + i) % 6}"} for i in range(9)]
                stream.step(query, rows)
                expected.update(r["k"] for r in rows)
                batch_id, first, second = runs[-1]
                assert first == second, f"batch {batch_id} changed when re-executed"
                assert first == sorted((k, expected[k]) for k in {r["k"] for r in rows})
        finally:
            query.stop()


def _totals_failing_once(marker: str | None):
    def update(key, frames, state):
        count = state.get[0] if state.exists else 0
        for frame in frames:
            count += len(frame)
        state.update((count,))
        if marker and key[0] == "k3" and count > 4 and not os.path.exists(marker):
            Path(marker).touch()
            raise RuntimeError("injected task failure after a state update")
        yield pd.DataFrame({"k": [key[0]], "count": [count]})

    return lambda df: df.groupBy("k").applyInPandasWithState(
        update, "k string, count long", "count long", "update", GroupStateTimeout.NoTimeout)


def _run_totals(spark, root, provider, marker):
    steps = [[{"k": f"k{(batch * 2 + i) % 5}"} for i in range(7)] for batch in range(4)]
    return run_query(spark, provider, _totals_failing_once(marker), "k STRING", steps,
                     root / "checkpoint", root / "input", "update")


def test_aborted_attempt_leaves_no_trace_in_the_cache(spark, tmp_path):
    reference = _run_totals(spark, tmp_path / "ref", HDFS_PROVIDER, None)
    marker = tmp_path / "failed-once"
    ours = _run_totals(spark, tmp_path / "ours", KS, str(marker))
    assert marker.exists(), "the injected failure never happened"
    assert ours == reference


def test_first_batch_larger_than_the_cache_logs_every_write_as_new(spark, tmp_path):
    """A new query's first batch writes more keys than the near cache holds. The committed
    version is empty, so every first write of a key is new: none may be logged of unknown
    existence (which makes the commit wait for the state server to read each one), and the
    counts stay exact in the batches after it, on a store that is no longer empty. Four
    partitions on two cores: the last two start with the shared budget already full."""
    budget = 256 * 1024
    confs = {PROVIDER_CONF: KS, PFX + "nearCacheBytes": str(budget), "spark.sql.shuffle.partitions": "4"}
    # 12,000 distinct keys of ~60 bytes (4x the budget), then some new, some seen.
    batches = [[f"{'x' * 40}-{(batch * 10_000 + i) % 15_000:05d}" for i in range(12_000 if batch == 0 else 3_000)]
               for batch in range(3)]
    progress, expected = _count_keys(spark, tmp_path, confs, batches)
    first = [op for p in progress if p["batchId"] == 0 for op in p["stateOperators"]]
    assert sum(op["customMetrics"]["keyedstateCacheEvictions"] for op in first) > 0  # the cache overflowed
    assert sum(op["customMetrics"]["keyedstateWritesShipped"] for op in first) == 12_000
    assert sum(op["customMetrics"]["keyedstateWritesUnknown"] for op in first) == 0
    assert sum(op["numRowsTotal"] for op in first) == 12_000
    last = [op for op in progress[-1]["stateOperators"]]
    assert sum(op["numRowsTotal"] for op in last) == len(expected)


def _count_keys(spark, tmp_path, confs: dict, batches: list[list[str]]) -> tuple[list, Counter]:
    """Counts keys over one batch of rows per list under ``confs``; asserts the output exact and
    returns the query's progress and the expected counts."""
    stream = FileStream(spark, tmp_path, "k STRING")
    out: dict = {}
    expected = Counter()
    with session_confs(spark, confs):
        query = stream.start(count_by_key, collect_into(out))
        try:
            for keys in batches:
                expected.update(keys)
                stream.step(query, [{"k": k} for k in keys])
            progress = query.recentProgress
        finally:
            query.stop()
    assert {k: v[1] for k, v in out.items()} == dict(expected)
    return progress, expected



def _dedup_restarted_after_first(spark, tmp_path, confs: dict, batches: list) -> tuple[dict, list]:
    """dropDuplicates over ``batches`` of keys, stopped after the first and restarted (the
    restart loads version 1 as a fresh provider would): each batch's emitted keys, sorted, and
    the restarted query's progress."""
    stream = FileStream(spark, tmp_path, "k STRING")
    seen: dict[int, list] = {}

    def sink(batch, batch_id):
        seen[int(batch_id)] = sorted(row.k for row in batch.collect())

    with session_confs(spark, confs):
        first = stream.start(lambda df: df.dropDuplicates(["k"]), sink, "append")
        try:
            stream.step(first, [{"k": k} for k in batches[0]])
        finally:
            first.stop()
        second = stream.start(lambda df: df.dropDuplicates(["k"]), sink, "append")  # loads version 1
        try:
            for rows in batches[1:]:
                stream.step(second, [{"k": k} for k in rows])
            return seen, second.recentProgress
        finally:
            second.stop()


def test_large_version_loads_cold_and_is_scanned_in_once_its_misses_cost_as_much(spark, tmp_path):
    """After a restart, a version with more keys than nearCacheWarmKeys is not scanned into the
    near cache: a batch that touches a few keys reads just those. A batch that touches most
    keys scans the version in once its misses cost what the scan would, in the middle of the batch:
    the keys it wrote before the scan must stay known, or the next batch would emit them again
    as new (dropDuplicates reads each key, then writes it if new, row by row). The sparse batch
    reads two keys: too few for their cost to make the scan due at its commit (nearly always:
    they would need ~40 us each), and never in the partition that reads none of them."""
    confs = {PROVIDER_CONF: KS, PFX + "nearCacheWarmKeys": "100", "spark.sql.shuffle.partitions": "2"}
    old, new, newer = ([f"{p}{i:04d}" for i in range(n)] for p, n in (("k", 1200), ("n", 1200), ("m", 100)))
    batches = [old, old[:2], [k for pair in zip(old, new) for k in pair], new + newer]
    seen, progress = _dedup_restarted_after_first(spark, tmp_path, confs, batches)
    assert [seen.get(b, []) for b in range(4)] == [old, [], new, newer]
    metrics = {p["batchId"]: [op["customMetrics"] for op in p["stateOperators"]] for p in progress}
    assert sum(m["keyedstateNativeGets"] for m in metrics[1]) == 2  # just its keys (a warm cache: 0)
    # Scanned in once the misses since the load (the sparse batch's too) took what a scan of
    # ~600 keys a partition takes, i.e. a small share of the batch's 2,390 misses.
    assert 2 < sum(m["keyedstateNativeGets"] for m in metrics[2]) <= 1200
    # The cache, complete since the scan, answers for the new keys without a read.
    assert sum(m["keyedstateCacheAbsent"] for m in metrics[3]) == 100
    assert sum(m["keyedstateNativeGets"] for m in metrics[3]) == 0


def test_a_version_whose_cold_reads_say_the_next_ones_would_cost_the_scan_is_scanned_in_at_the_next(
        spark, tmp_path):
    """After a restart, a batch that reads a fifteenth of a cold version's keys costs a third of
    a scan: too little to scan the version in during it, but ten such batches would cost more
    than the scan. So the scan comes at the next batch's first miss, not two batches of cold
    reads later (CacheWarmer.scanDueAfter). Reads go through the state server, each charged as
    5 scanned keys (untimed, CacheWarmer.ScanKeysPerRead), so the outcome is not the machine's."""
    confs = {PROVIDER_CONF: KS, PFX + "nearCacheWarmKeys": "100", PFX + "nativeReads": "false",
             "spark.sql.shuffle.partitions": "2"}
    old = [f"k{i:05d}" for i in range(6000)]
    batches = [old, old[0::15], old[1::15] + ["n1", "n2"], old[2::15] + ["n3"]]
    seen, progress = _dedup_restarted_after_first(spark, tmp_path, confs, batches)
    assert [seen.get(b, []) for b in range(4)] == [old, [], ["n1", "n2"], ["n3"]]
    metrics = {p["batchId"]: [op["customMetrics"] for op in p["stateOperators"]] for p in progress}
    gets = [sum(m["keyedstateBridgeGets"] for m in metrics[b]) for b in (1, 2, 3)]
    assert gets[0] == 400, gets  # read cold, one by one
    # Each partition's first miss, then its scan.
    assert gets[1] == 2 and gets[2] == 0, gets
    assert sum(m["keyedstateCacheHits"] for m in metrics[3]) == 400, metrics[3]


def test_keys_never_read_again_are_not_kept_and_reads_bring_admission_back(spark, tmp_path):
    """dropDuplicates reads each key once, before writing it: a near cache that admitted every
    written key would fill its budget with keys nobody reads again. Once a version's reads find
    (almost) nothing, written keys are no longer cached; a Bloom filter keeps the dedup exact
    without a read per row. When reads find keys again, written keys are cached again."""
    confs = {PROVIDER_CONF: KS, "spark.sql.shuffle.partitions": "2"}
    a, b, c, d, e = ([f"{p}{i:05d}" for i in range(3000)] for p in "abcde")
    batches = [a, b, c + a[:10], a + d[:100], e + a, e + b + c]
    stream = FileStream(spark, tmp_path, "k STRING")
    seen: dict[int, list] = {}

    def sink(batch, batch_id):
        seen[int(batch_id)] = sorted(row.k for row in batch.collect())

    with session_confs(spark, confs):
        query = stream.start(lambda df: df.dropDuplicates(["k"]), sink, "append")
        try:
            for rows in batches:
                stream.step(query, [{"k": k} for k in rows])
            progress = query.recentProgress
        finally:
            query.stop()

    assert [seen.get(n, []) for n in range(6)] == [a, b, c, d[:100], e, []]
    metrics = {p["batchId"]: [op["customMetrics"] for op in p["stateOperators"]] for p in progress}

    def total(batch: int, name: str) -> int:
        return sum(m[name] for m in metrics[batch])

    assert total(0, "keyedstateCacheBytes") > 0    # the first batch's keys, cached as written
    assert total(1, "keyedstateCacheAbsent") == 3000  # every read of batch 1 found nothing,
    assert total(1, "keyedstateCacheBytes") == 0   # so the cached keys go,
    assert total(2, "keyedstateCacheAbsent") >= 2900  # a Bloom filter answers for new keys,
    assert total(3, "keyedstateNativeGets") >= 2900   # and batch 0's keys are read from RocksDB.
    # Batch 3's reads found keys: batch 4's new keys are cached as written again, and batch 5
    # finds them there, while batch 1's and 2's keys (never cached) are read from RocksDB.
    assert total(5, "keyedstateCacheHits") == 3000
    assert total(5, "keyedstateNativeGets") >= 5900


def test_watermark_eviction_in_a_store_that_stopped_caching_logs_its_deletes_as_existing(spark, tmp_path):
    """dropDuplicatesWithinWatermark: once the store caches no written key, the keys its
    watermark evicts are not in the near cache, yet the scan that found them says they exist:
    every delete is logged as existing, so no commit waits for the state server to read."""
    confs = {PROVIDER_CONF: KS, "spark.sql.shuffle.partitions": "2"}
    stream = FileStream(spark, tmp_path, "k STRING, t TIMESTAMP")
    batches = [[{"k": f"{p}{i:05d}", "t": f"2026-01-01T00:{n:02d}:00"} for i in range(2000)]
               for n, p in enumerate("abcd")]
    out: list[str] = []

    def sink(batch, batch_id):
        out.extend(row.k for row in batch.collect())

    with session_confs(spark, confs):
        query = stream.start(lambda df: df.withWatermark("t", "30 seconds").dropDuplicatesWithinWatermark(["k"]),
                             sink, "append")
        try:
            for rows in batches:
                stream.step(query, rows)
            progress = query.recentProgress
        finally:
            query.stop()

    assert sorted(out) == sorted(r["k"] for rows in batches for r in rows)
    ops = [op for p in progress for op in p["stateOperators"]]
    assert sum(op["numRowsRemoved"] for op in ops) >= 4000  # the watermark evicted a and b (at least)
    assert sum(op["customMetrics"]["keyedstateCacheBytes"] for op in progress[-1]["stateOperators"]) == 0
    assert sum(op["customMetrics"]["keyedstateWritesUnknown"] for op in ops) == 0
