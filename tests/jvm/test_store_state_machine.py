"""The store handed to a task has Spark's state machine: UPDATING, then COMMITTED or ABORTED,
every call checked (Spark's RocksDBStateStore is the model). Driven through the provider
contract from pytest, without a streaming query."""
from __future__ import annotations

import time
import uuid

import pytest

from support import testjar
from support.constants import PFX
from support.durability import RUN_ID_KEY, arm, deactivate, disarm, objtest_location, objtest_root, report_active
from support.jvm import LayerStore, custom_metric
from support.processes import wait_until


@pytest.fixture
def layer(spark, tmp_path):
    store = LayerStore(spark, tmp_path / "state" / "0")
    yield store
    store.close()


def test_committed_writes_are_the_next_version(layer):
    v0 = layer.store(0)
    layer.put(v0, (1,), (10,))
    layer.put(v0, (2,), (20,))
    assert layer.get(v0, 1) == 10  # a version sees its own writes
    assert v0.commit() == 1 and v0.hasCommitted()
    v1 = layer.store(1)
    assert (layer.get(v1, 1), layer.get(v1, 2), layer.get(v1, 3)) == (10, 20, None)
    assert v1.metrics().numKeys() == 2


def test_no_write_after_commit_and_no_abort_after_commit(layer):
    v0 = layer.store(0)
    layer.put(v0, (1,), (10,))
    v0.commit()
    with pytest.raises(Exception, match="Cannot put after already committed or aborted"):
        layer.put(v0, (2,), (20,))
    with pytest.raises(Exception, match="Cannot remove after already committed or aborted"):
        v0.remove(layer.key(1), "default")
    with pytest.raises(Exception, match="Cannot commit after already committed or aborted"):
        v0.commit()
    with pytest.raises(Exception, match="Cannot abort after already committed"):
        v0.abort()


def test_abort_drops_the_writes_and_may_repeat(layer):
    v0 = layer.store(0)
    layer.put(v0, (1,), (10,))
    v0.commit()
    v1 = layer.store(1)
    layer.put(v1, (1,), (99,))
    v1.abort()
    v1.abort()  # idempotent, as Spark expects
    with pytest.raises(Exception, match="Cannot commit after already committed or aborted"):
        v1.commit()
    assert layer.get(layer.store(1), 1) == 10


def test_a_second_store_of_the_same_version_cannot_commit_over_the_first(layer):
    _second_store_cannot_commit_over_the_first(layer)


def test_a_second_store_opening_its_changelog_ahead_leaves_the_first_ones_commit_whole(spark):
    """Off a local disk each write store opens its changelog when handed out; the second one's
    hand-out drops the first's open file, whose commit then opens its own."""
    location, _ = objtest_location(spark, "second-store")
    layer = LayerStore(spark, location)
    try:
        _second_store_cannot_commit_over_the_first(layer)
    finally:
        layer.close()


def _second_store_cannot_commit_over_the_first(layer: LayerStore) -> None:
    v0 = layer.store(0)
    layer.put(v0, (1,), (10,))
    v0.commit()
    first, second = layer.store(1), layer.store(1)
    layer.put(first, (2,), (20,))
    with pytest.raises(Exception, match="two stores of .* write at once"):
        layer.put(second, (3,), (30,))  # while the first is open: refused, nothing mixed in
    first.commit()
    with pytest.raises(Exception, match="two stores of one partition were open at once"):
        layer.put(second, (3,), (31,))
    with pytest.raises(Exception, match="two stores of one partition were open at once"):
        second.commit()
    v2 = layer.store(2)
    assert (layer.get(v2, 2), layer.get(v2, 3)) == (20, None)


@pytest.mark.parametrize("run", [None, "same"])
def test_a_second_attempt_of_a_version_keeps_the_first_ones_commit(spark, tmp_path, run):
    """Two providers (two executors, a retried or speculative task) commit the same version: the
    first changelog stays, never replaced or deleted; the second attempt takes it as committed.
    So it does when both belong to the same query run, the second one its active instance (only
    an earlier run's attempt is replaced: test_provider_lifetime.py)."""
    hadoop_conf = {RUN_ID_KEY: str(uuid.uuid4())} if run else None
    first = LayerStore(spark, tmp_path / "state", hadoop_conf=hadoop_conf)
    second = LayerStore(spark, tmp_path / "state", hadoop_conf=hadoop_conf)
    if run:
        report_active(spark, second, hadoop_conf[RUN_ID_KEY])
    try:
        a, b = first.store(0), second.store(0)
        first.put(a, (1,), (10,))
        second.put(b, (1,), (99,))
        assert a.commit() == 1 and b.commit() == 1
        assert second.get(second.store(1), 1) == 10  # reloaded from the checkpoint: the first attempt's
    finally:
        first.close()
        second.close()
        if run:
            deactivate(spark, hadoop_conf[RUN_ID_KEY])


def _commit_one_write(layer: LayerStore, version: int) -> None:
    """Load ``version``, write one key, commit ``version + 1``."""
    s = layer.store(version)
    layer.put(s, (version,), (version,))
    s.commit()


def _loaded_elsewhere(spark, location: str, version: int, key: int):
    """The value of ``key`` in ``version`` as another executor (a fresh provider) loads it."""
    fresh = LayerStore(spark, location)
    try:
        return fresh.get(fresh.store(version), key)
    finally:
        fresh.close()


def _snapshot_versions(directory) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in directory.rglob("*.ks-snapshot"))


def test_without_maintenance_a_commit_snapshots_once_the_changelog_tail_is_long(spark, tmp_path):
    """Short runs (availableNow) may never see Spark's maintenance: a commit that stages a
    snapshot starts its upload, and a commit two snapshot intervals after the newest uploaded
    snapshot uploads one itself before it returns, so loads stay bounded whichever wins."""
    interval = 2
    layer = LayerStore(spark, tmp_path / "state", confs={PFX + "snapshotInterval": str(interval)})
    try:
        for version in range(8):
            _commit_one_write(layer, version)
            newest = max(_snapshot_versions(tmp_path), default=0)
            assert version + 1 - newest < 2 * interval, (f"after committing version {version + 1} the newest "
                                                         f"snapshot in the checkpoint is {newest}: "
                                                         f"{_snapshot_versions(tmp_path)}")
        wait_until(lambda: 8 in _snapshot_versions(tmp_path), 30, "the last staged snapshot's upload")
    finally:
        layer.close()


def test_a_commit_two_intervals_past_the_last_uploaded_snapshot_uploads_before_it_returns(spark):
    """The fallback alone: the background upload of version 2's snapshot fails (objtest:// fails
    its first snapshot-manifest write), so version 4 is two intervals past any uploaded snapshot
    and its commit uploads its own snapshot before returning (no background upload of version 4
    is started: it is this commit's)."""
    location, directory = objtest_location(spark, "overdue")
    root = arm(spark, create={"nth": 1, "path": ".ks-snapshot"})
    layer = LayerStore(spark, location, confs={PFX + "snapshotInterval": "2"})
    try:
        _commit_one_write(layer, 0)
        _commit_one_write(layer, 1)
        wait_until(lambda: testjar.injected_faults(root), 30, "the failed upload of version 2's snapshot")
        assert _snapshot_versions(directory) == []
        _commit_one_write(layer, 2)
        _commit_one_write(layer, 3)
        assert 4 in _snapshot_versions(directory)
    finally:
        layer.close()
        disarm(spark)


def test_a_version_written_from_empty_loads_as_written_without_its_snapshot(spark):
    """A version written from empty (loadEmpty: migrate, the state processor, Spark's offline
    repartition) is no delta on the version before it, and its changelog says so: a load that
    replays it (its snapshot's upload failed here) starts over from empty there, so the keys it
    dropped do not come back; and with nothing older in the checkpoint (a migration from another
    provider), it loads from that changelog alone."""
    location, directory = objtest_location(spark, "from-empty")
    confs = {PFX + "snapshotInterval": "100"}
    old = LayerStore(spark, location, confs=confs)
    try:
        s = old.store(0)
        for k in (1, 2, 3):
            old.put(s, (k,), (k * 10,))
        assert s.commit() == 1
    finally:
        old.close()
    root = arm(spark, create={"nth": 1, "path": "ks-files", "times": 1000})  # every snapshot file's upload fails
    writer = LayerStore(spark, location, confs=confs)
    try:
        s = writer.store_from_empty(1)
        writer.put(s, (1,), (100,))
        assert s.commit() == 2
    finally:
        writer.close()
        disarm(spark)
    assert testjar.injected_faults(root) and _snapshot_versions(directory) == []

    def version_2() -> tuple:
        reader = LayerStore(spark, location, confs=confs)
        try:
            s = reader.store(2)
            return reader.get(s, 1), reader.get(s, 2), reader.get(s, 3), s.metrics().numKeys()
        finally:
            reader.close()

    assert version_2() == (100, None, None, 1)
    next(directory.rglob("1.ks-changelog")).unlink()
    assert version_2() == (100, None, None, 1)


def test_a_query_never_takes_a_version_an_offline_writer_left_uncommitted(spark, tmp_path):
    """A retried batch keeps a changelog another attempt of it published first. An offline
    writer's version (migrate or the state processor, whose batch never committed: killed, or
    undone by deleting its offsets entry) is no attempt of the query's batch: the query's commit
    fails, naming the file, instead of taking its rows for the batch's; once it is deleted, the
    batch commits its own."""
    directory = tmp_path / "state"
    query = LayerStore(spark, directory)
    try:
        s = query.store(0)
        for k in (1, 2, 3):
            query.put(s, (k,), (k * 10,))
        assert s.commit() == 1
        offline = LayerStore(spark, directory)
        try:
            s = offline.store_from_empty(1)
            offline.put(s, (1,), (100,))
            assert s.commit() == 2
        finally:
            offline.close()
        s = query.store(1)
        query.put(s, (4,), (40,))
        with pytest.raises(Exception, match=r"version 2 .* is already in the checkpoint .*2.ks-changelog.*, written "
                                            r"from empty by an offline writer .* never committed"):
            s.commit()
        for p in directory.rglob("*2.ks-*"):
            p.unlink()
        s = query.store(1)
        query.put(s, (4,), (40,))
        assert s.commit() == 2
        s = query.store(2)
        assert [query.get(s, k) for k in (1, 2, 3, 4)] == [10, 20, 30, 40]
    finally:
        query.close()


def test_a_bulk_version_is_snapshotted_and_uploaded_at_once(spark, tmp_path):
    """A first batch over a backlog (at least snapshotBulkKeys new keys, at least as many as
    the state held) gets its snapshot in the checkpoint right after its commit, without
    maintenance and long before the next snapshotInterval, so a stop then a restart loads it
    instead of replaying it; later versions that rewrite every key or add fewer do not."""
    layer = LayerStore(spark, tmp_path / "state", confs={PFX + "snapshotInterval": "100",
                                                         PFX + "snapshotBulkKeys": "50"})
    try:
        s = layer.store(0)
        for k in range(60):
            layer.put(s, (k,), (k,))
        assert s.commit() == 1
        wait_until(lambda: 1 in _snapshot_versions(tmp_path), 30, "the upload of the bulk version's snapshot")
        s = layer.store(1)
        for k in range(60):  # 60 records, no new key
            layer.put(s, (k,), (k + 1,))
        assert s.commit() == 2
        s = layer.store(2)
        for k in range(100, 155):  # 55 new keys over 60
            layer.put(s, (k,), (k,))
        assert s.commit() == 3
        time.sleep(2)
        assert _snapshot_versions(tmp_path) == [1]
    finally:
        layer.close()


@pytest.mark.parametrize("prefix_columns", [0, 1], ids=["plain", "prefix-scan"])
def test_a_row_reused_with_new_bytes_is_a_new_key(spark, tmp_path, prefix_columns):
    """A store encodes the key it read last only once: an operator's reused row, rewritten
    between a get and a put (same object, same size, other bytes), must still be another key."""
    layer = LayerStore(spark, tmp_path / "state", key_ddl="k INT, s STRING", prefix_columns=prefix_columns)
    try:
        store = layer.store(0)
        row = layer.key(1, "ab")
        assert store.get(row, "default") is None
        store.put(row, layer.value(10), "default")  # the same row: the key just read
        row.setInt(0, 2)  # rewritten in place: key (2, "ab")
        assert store.get(row, "default") is None
        store.put(row, layer.value(20), "default")
        store.put(layer.key(2, "ac"), layer.value(21), "default")  # same size, last byte differs
        assert [layer.get(store, 1, "ab"), layer.get(store, 2, "ab"), layer.get(store, 2, "ac")] == [10, 20, 21]
        store.remove(layer.key(1, "ab"), "default")
        store.put(layer.key(1, "abc"), layer.value(13), "default")
        store.commit()
        reread = layer.store(1)
        assert [layer.get(reread, 1, "ab"), layer.get(reread, 2, "ab"), layer.get(reread, 2, "ac"),
                layer.get(reread, 1, "abc")] == [None, 20, 21, 13]
        reread.abort()
    finally:
        layer.close()


def test_a_version_whose_changelog_was_not_written_is_never_applied_or_snapshotted(spark):
    """A write-behind commit ships its changelog while the file is written. When the write fails,
    the state server must not apply that version: under checkpoint format 1 a snapshot staged
    from it would be uploaded as a snapshot of a version the checkpoint lacks, and a later load
    would take it over the changelog the retry writes."""
    location, directory = objtest_location(spark, "held")
    layer = LayerStore(spark, location, confs={PFX + "snapshotInterval": "2"})
    try:
        _commit_one_write(layer, 0)
        root = arm(spark, create={"nth": 1, "path": "/.2.ks-changelog"})
        s = layer.store(1)
        layer.put(s, (1,), (1,))  # version 2 would be a snapshot version
        with pytest.raises(Exception, match="injected create fault") as failed:
            s.commit()
        disarm(spark)
        assert "CommitWrites" in str(failed.value)  # a write-behind commit: written beside the held ship
        ours = [f["op"] for f in testjar.injected_faults(root) if any(location.split("//")[1] in p for p in f["paths"])]
        assert ours == ["create"]
        layer.provider.doMaintenance()  # uploads whatever the server staged
        assert _snapshot_versions(directory) == []
        s = layer.store(1)  # the task's retry, a commit of the same shape
        layer.put(s, (1,), (99,))
        assert s.commit() == 2
        assert _loaded_elsewhere(spark, location, 2, 1) == 99  # another executor loads version 2
    finally:
        layer.close()
        disarm(spark)


def test_a_write_store_opens_its_changelog_when_handed_out_and_a_failed_open_fails_its_commit(spark):
    """Off a local disk, the changelog a write store's commit will write is opened when Spark
    hands the store out, while the task computes: the create's failure is seen then, and the
    commit fails with it, naming the file (a retry commits). A read store opens nothing."""
    location, _ = objtest_location(spark, "ahead")
    layer = LayerStore(spark, location)
    try:
        _commit_one_write(layer, 0)
        root = arm(spark, create={"nth": 1, "path": "/.2.ks-changelog"})

        def ours():
            return [f for f in testjar.injected_faults(root) if any(location.split("//")[1] in p for p in f["paths"])]

        reader = layer.provider.getReadStore(1, spark._jvm.scala.Option.empty())
        reader.abort()
        time.sleep(1)
        assert ours() == []  # no create by the read store
        s = layer.store(1)
        wait_until(ours, 30, "the open of version 2's changelog")
        layer.put(s, (1,), (5,))  # the task's writes, after the open
        with pytest.raises(Exception, match="injected create fault") as failed:
            s.commit()
        assert ".2.ks-changelog" in str(failed.value)
        disarm(spark)
        s = layer.store(1)
        layer.put(s, (1,), (6,))
        assert s.commit() == 2
        assert _loaded_elsewhere(spark, location, 2, 1) == 6
    finally:
        disarm(spark)
        layer.close()


def test_with_changelog_sync_a_failed_write_ahead_or_write_after_it_still_commits(spark):
    """changelogSync=true writes and hsyncs the changelog's first bytes when the store is handed
    out; that is an optimisation only. If that hsync fails, the file is opened again with nothing
    written ahead; if the commit's write through the stream opened ahead fails (HDFS: its idle
    pipeline lost a DataNode), the commit writes the file once more through a new stream. Both
    commits load exactly; before, both failed."""
    location, local = objtest_location(spark, "sync-ahead")
    arm(spark, {"hsync": "true"})  # objtest's streams offer hsync, as HDFS's do
    layer = LayerStore(spark, location, confs={PFX + "changelogSync": "true"})
    try:
        _commit_one_write(layer, 0)
        for version, nth in ((2, 1), (3, 2)):  # the open's hsync fails; the commit's fails
            root = arm(spark, {"hsync": "true"}, hsync={"nth": nth, "path": f"/.{version}.ks-changelog"})
            s = layer.store(version - 1)
            layer.put(s, (version,), (version * 10,))
            assert s.commit() == version
            faults = [f for f in testjar.injected_faults(root)
                      if f["op"] == "hsync" and f".{version}.ks-changelog" in f["paths"][0]]
            assert len(faults) == 1, faults
            assert _loaded_elsewhere(spark, location, version, version) == version * 10
        assert not [p.name for p in local.rglob("*.tmp")]  # every stream given up was dropped
    finally:
        disarm(spark)
        layer.close()


def test_a_task_killed_while_its_changelog_is_written_ends_the_write_and_keeps_the_interrupt(spark):
    """Spark kills a task by interrupting its thread. A write-behind commit waits for its
    changelog's file on another thread: the kill must reach that write (the commit then ends
    without waiting it out), the task thread must keep its interrupt for Spark, and what the
    commit answers must be what the checkpoint holds, for this store and for a fresh load. The
    object store's rename (copy, delay, delete) is held open so that the kill lands in it."""
    location, _ = objtest_location(spark, "killed")
    delay_ms = 20_000
    layer = LayerStore(spark, location)
    try:
        s = layer.store(0)
        layer.put(s, (1,), (10,))
        assert s.commit() == 1
        arm(spark, {"rename.delayMs": delay_ms})  # every rename waits between its copy and delete
        s = layer.store(1)
        layer.put(s, (1,), (20,))
        version, error, kept_interrupt, ms_after_kill = spark._jvm.io.keyedstate.testing.StateStores \
            .commitKilledWhileIn(s, "CommitWrites", 60_000)
        disarm(spark)
        assert kept_interrupt, "the task thread lost Spark's interrupt"
        assert ms_after_kill < delay_ms / 2, f"the commit waited out the write ({ms_after_kill} ms after the kill)"
        # The rename had published the file before the kill: the version is durable, whichever
        # way the commit answered, and every load must read it.
        expected = 20
        if error is not None:
            assert version is None and "interrupt" in error.lower(), error
        else:
            assert version == 2
        assert layer.get(layer.store(2), 1) == expected
        assert _loaded_elsewhere(spark, location, 2, 1) == expected  # another executor
    finally:
        disarm(spark)
        layer.close()


@pytest.mark.parametrize("write_behind", ["true", "false"])
def test_a_task_killed_while_its_commit_waits_for_the_changelog_opened_ahead(spark, write_behind):
    """The changelog a write store opened ahead may still be opening when the commit needs it (a
    slow create), on the task's thread or the write's (write-behind). A kill then ends the commit
    without waiting the open out, and the task thread keeps its interrupt for Spark; the open,
    once done, is dropped (no temporary object, nothing published), and a retry commits."""
    location, local = objtest_location(spark, "killed-open")
    delay_ms = 9_000  # a kill is handled in milliseconds: half of it is a wide bound
    layer = LayerStore(spark, location, confs={PFX + "writeBehind": write_behind})
    parts = objtest_root(spark) / ".objtest" / "tmp"
    try:
        _commit_one_write(layer, 0)
        pending_before = set(parts.iterdir())
        arm(spark, {"create.delayMs": delay_ms, "create.delayPath": ".2.ks-changelog"})
        opened_at = time.monotonic()
        s = layer.store(1)
        layer.put(s, (1,), (20,))
        version, error, kept_interrupt, ms_after_kill = spark._jvm.io.keyedstate.testing.StateStores \
            .commitKilledWhileIn(s, "CommitWrites", 60_000)
        assert version is None and error is not None and "interrupt" in error.lower(), (version, error)
        assert ms_after_kill < delay_ms / 2, f"the commit waited out the open ({ms_after_kill} ms after the kill)"
        assert kept_interrupt, "the task thread lost Spark's interrupt"
        time.sleep(max(0.0, opened_at + delay_ms / 1000 + 3 - time.monotonic()))  # the open ends, is dropped
        assert sorted(p.name for p in local.rglob("*ks-changelog*")) == ["1.ks-changelog"]
        assert set(parts.iterdir()) <= pending_before, "the open's stream was never dropped"
        disarm(spark)
        s.abort()  # Spark's task completion
        s = layer.store(1)
        layer.put(s, (1,), (21,))
        assert s.commit() == 2
        assert _loaded_elsewhere(spark, location, 2, 1) == 21
    finally:
        disarm(spark)
        layer.close()


def test_a_provider_closed_while_a_changelog_opens_ahead_leaves_no_file(spark):
    """A provider closed (Spark's maintenance unloading it, the executor stopping) while the
    changelog of a store it handed out still opens: the close does not wait for the open, and
    the open, once done, is dropped: no temporary object stays, no upload is left pending (the
    object store's part file), nothing is published."""
    location, local = objtest_location(spark, "closed-open")
    delay_ms = 8_000
    layer = LayerStore(spark, location)
    parts = objtest_root(spark) / ".objtest" / "tmp"
    try:
        _commit_one_write(layer, 0)
        pending_before = set(parts.iterdir())
        arm(spark, {"create.delayMs": delay_ms, "create.delayPath": ".2.ks-changelog"})
        opened_at = time.monotonic()
        s = layer.store(1)
        layer.put(s, (1,), (20,))
    finally:
        layer.close()
    assert time.monotonic() - opened_at < delay_ms / 2000, "the close waited for the open"
    time.sleep(max(0.0, opened_at + delay_ms / 1000 + 3 - time.monotonic()))
    disarm(spark)
    assert sorted(p.name for p in local.rglob("*ks-changelog*")) == ["1.ks-changelog"]
    assert set(parts.iterdir()) <= pending_before, "the open's stream was never dropped"
    fresh = LayerStore(spark, location)
    try:
        assert fresh.get(fresh.store(1), 0) == 0 and fresh.get(fresh.store(1), 1) is None
    finally:
        fresh.close()


def test_a_second_store_of_the_same_version_does_not_read_the_first_ones_writes(layer):
    """Two attempts of one partition in one JVM (a zombie beside its retry): the first one's
    writes reach the near cache before they commit, so the second would read them as the
    committed version (a dedup would drop rows that no committed state holds). It gives way at
    its first read instead, as at its first write; reads before the first write are clean."""
    v0 = layer.store(0)
    layer.put(v0, (1,), (10,))
    v0.commit()
    first, second = layer.store(1), layer.store(1)
    assert layer.get(second, 1) == 10 and layer.get(second, 2) is None  # nothing written yet
    layer.put(first, (2,), (20,))
    layer.put(first, (1,), (11,))
    with pytest.raises(Exception, match="two stores of .* open at once: .*gives way"):
        layer.get(second, 2)
    with pytest.raises(Exception, match="two stores of .* open at once: .*gives way"):
        layer.get(second, 1)
    assert layer.get(first, 2) == 20  # the writer reads its own writes
    # Nor does it commit (it wrote nothing): the version it would publish is the committed one,
    # while the cache holds the first one's writes, which the next batch would then read.
    with pytest.raises(Exception, match="two stores of one partition were open at once"):
        second.commit()
    first.commit()
    v2 = layer.store(2)
    assert (layer.get(v2, 1), layer.get(v2, 2)) == (11, 20)


def test_a_late_attempts_reads_neither_scan_nor_keep_the_held_version_cold(spark, tmp_path):
    """A large version loads with a cold near cache, scanned in once its misses cost the scan.
    Reads of a late attempt of that version, after another attempt committed the next one, say
    nothing of the held version's reads: they must not count, nor scan the wrong version, nor
    use the scan's price up so that the held version never scans. Reads go through the state
    server, each charged as 5 scanned keys: the price of 400 keys is 80 of them."""
    confs = {PFX + "nearCacheWarmKeys": "10", PFX + "nativeReads": "false"}
    first = LayerStore(spark, tmp_path / "state", confs=confs)
    try:
        v0 = first.store(0)
        for k in range(400):
            first.put(v0, (k,), (k,))
        assert v0.commit() == 1
    finally:
        first.close()
    layer = LayerStore(spark, tmp_path / "state", confs=confs)  # loads version 1 cold
    try:
        late, winner = layer.store(1), layer.store(1)
        assert layer.get(winner, 0) == 0
        layer.put(winner, (0,), (1000,))
        assert winner.commit() == 2
        assert [layer.get(late, k) for k in range(1, 200)] == list(range(1, 200))  # 995 keys' price
        v2 = layer.store(2)
        custom_metric(v2, "keyedstateBridgeGets")  # what the reads before this version counted
        assert [layer.get(v2, k) for k in range(200, 400)] == list(range(200, 400))  # none read before
        # 79 reads use up the price left after the winner's one read; the 80th scans the version in.
        assert custom_metric(v2, "keyedstateBridgeGets") == 80
    finally:
        layer.close()


def test_a_version_that_wrote_before_the_cache_was_reloaded_writes_no_more(layer):
    """A load of another version reloads the near cache (here a store of an older version, as a
    retry of an older batch opens): a version that was writing must not go on writing into the
    reloaded cache, where the other version would read its writes."""
    v0 = layer.store(0)
    layer.put(v0, (1,), (10,))
    v0.commit()
    first = layer.store(1)
    layer.put(first, (2,), (20,))
    older = layer.store(0)  # loads version 0: the cache now holds it
    with pytest.raises(Exception, match="lost the near cache it wrote into"):
        layer.put(first, (3,), (30,))
    assert (layer.get(older, 1), layer.get(older, 2), layer.get(older, 3)) == (None, None, None)
    # Nor once the cache holds its version again (a duplicate attempt reloaded it): the writes it
    # made before are gone from there, and a commit would leave the cache behind the checkpoint.
    again = layer.store(1)
    with pytest.raises(Exception, match="lost the near cache it wrote into"):
        layer.put(first, (3,), (30,))
    with pytest.raises(Exception, match="two stores of one partition were open at once"):
        first.commit()
    assert (layer.get(again, 1), layer.get(again, 2), layer.get(again, 3)) == (10, None, None)


def test_a_read_store_of_another_operator_is_not_upgraded_into_this_ones_write_store(spark, tmp_path):
    """Spark hands the write store of an operator the read store its task thread opened last,
    whichever operator's: the upgrade takes only its own provider's, or one operator would write
    into the other's state."""
    one, other = LayerStore(spark, tmp_path / "one"), LayerStore(spark, tmp_path / "other")
    try:
        read = one.provider.getReadStore(0, one.jvm.scala.Option.empty())
        write = other.provider.upgradeReadStoreToWriteStore(read, 0, other.jvm.scala.Option.empty(), False)
        assert write.id().equals(other.provider.stateStoreId()) and not write.id().equals(read.id())
        other.put(write, (1,), (10,))
        assert write.commit() == 1
        assert one.get(read, 1) is None and read.hasCommitted() is False
        read.abort()
        assert other.get(other.store(1), 1) == 10 and one.get(one.store(0), 1) is None
    finally:
        one.close()
        other.close()
