"""VersionedStore on real RocksDB: versions, exact key counts, scans, snapshots, restore."""
import gc
import shutil
import zlib
from pathlib import Path

import pytest

from keyedstate.formats import changelog as cl
from keyedstate.formats.frames import TtlScan
from keyedstate.server.store import StoreStateError, VersionedStore

from support.processes import wait_until


def key(group: int, name: bytes) -> bytes:
    return group.to_bytes(4, "big") + name


def counted(store: VersionedStore) -> dict[int, int]:
    """The store's keys by key group, read from its RocksDB."""
    out: dict[int, int] = {}
    for k in store._require_db(wait=True).keys():
        out[int.from_bytes(k[:4], "big")] = out.get(int.from_bytes(k[:4], "big"), 0) + 1
    return out


@pytest.fixture
def store(tmp_path):
    s = VersionedStore("test", tmp_path / "store", key_groups=16, snapshot_interval=2)
    s.restore(0, None, "lineage-1", 0)
    yield s
    s.close()


def test_apply_counts_keys_exactly(store):
    assert store.apply(cl.encode(1, 16, [(cl.OP_PUT, key(1, b"a"), b"1"), (cl.OP_PUT, key(2, b"b"), b"2")]), "v1") == 2
    # overwrite, delete existing, delete missing
    n = store.apply(cl.encode(2, 16, [(cl.OP_PUT, key(1, b"a"), b"3"), (cl.OP_DELETE, key(2, b"b"), None),
                                      (cl.OP_DELETE, key(3, b"zz"), None)]), "v2")
    assert n == 1
    assert store.get(key(1, b"a")) == b"3" and store.get(key(2, b"b")) is None
    assert store.version == 2


def test_unknown_puts_and_deletes_are_counted_exactly_across_multi_get_slices(store, monkeypatch):
    """Keys whose existence the writer did not know are asked of RocksDB a slice at a time (a
    multi-get of millions held GiBs); the count stays exact across slices and a missing key in
    any of them."""
    from keyedstate.formats import rocksdb

    monkeypatch.setattr(rocksdb, "MULTI_GET_KEYS", 7)
    present = [key(g % 16, b"p%03d" % g) for g in range(40)]
    assert store.apply(cl.encode(1, 16, [(cl.OP_PUT_NEW, k, b"1") for k in present]), "v1") == 40
    absent = [key(g % 16, b"a%03d" % g) for g in range(30)]
    puts = [(cl.OP_PUT, k, b"2") for k in present[:25] + absent]  # 25 overwrites, 30 new
    deletes = [(cl.OP_DELETE, k, None) for k in present[25:38] + [key(1, b"gone%d" % i) for i in range(9)]]
    assert store.apply(cl.encode(2, 16, puts + deletes), "v2") == 40 + 30 - 13
    asked = present + absent + [key(1, b"gone0")]  # reads from the JVM go through the same slices
    assert store.get_many(asked) == [b"2"] * 25 + [None] * 13 + [b"1"] * 2 + [b"2"] * 30 + [None]


def test_a_memtable_of_mostly_superseded_records_is_flushed(tmp_path, monkeypatch):
    """A store whose keys are rewritten every batch flushes once its memtable holds twice its
    keys in puts and SUPERSEDED_FLUSH_BYTES of changelog (a flush keeps one record a key); a read
    flushes too and starts the count again; a store that grows keeps writing into its memtable.
    The values read back are the newest, while and after RocksDB flushes in the background."""
    from keyedstate.server import store as store_module

    monkeypatch.setattr(store_module, "SUPERSEDED_FLUSH_BYTES", 50_000)  # 2.5 versions of 20,000
    rewritten = VersionedStore("rewritten", tmp_path / "r", key_groups=16, snapshot_interval=100)
    growing = VersionedStore("growing", tmp_path / "g", key_groups=16, snapshot_interval=100)
    entries = []
    try:
        for s in (rewritten, growing):
            s.restore(0, None, "lineage", 0)
        for version in range(1, 8):
            op = cl.OP_PUT_NEW if version == 1 else cl.OP_PUT_EXISTING
            rewritten.apply(cl.encode(version, 16, [(op, key(g % 16, b"k%04d" % g), b"v%d" % version)
                                                    for g in range(1_000)]), f"v{version}")
            growing.apply(cl.encode(version, 16, [(cl.OP_PUT_NEW, key(g % 16, b"k%d-%04d" % (version, g)), b"v")
                                                  for g in range(1_000)]), f"v{version}")
            entries.append(rewritten._require_db().property_int_value("rocksdb.num-entries-active-mem-table"))
            if version == 4:
                assert rewritten.get_many([key(3, b"k0003")]) == [b"v4"]  # a read flushes first
        assert entries == [1_000, 2_000, 0, 1_000, 1_000, 2_000, 0]
        assert growing._require_db().property_int_value("rocksdb.num-entries-active-mem-table") == 7_000
        assert rewritten.num_keys == 1_000 and growing.num_keys == 7_000
        assert rewritten.get_many([key(5, b"k0005"), key(999 % 16, b"k0999")]) == [b"v7", b"v7"]
    finally:
        rewritten.close()
        growing.close()


def test_a_large_changelog_is_written_in_chunks_with_exact_counts(store, monkeypatch):
    """A changelog larger than APPLY_CHUNK_BYTES goes to RocksDB in several write batches (one
    batch of a seed held a copy of all of it); every record lands once, the count stays exact
    with known and unknown ops in every chunk, and a trailer that disagrees still fails."""
    from keyedstate.server import store as store_module

    writes = []
    real = cl.Changelog.feed
    monkeypatch.setattr(cl.Changelog, "feed", lambda *args, **kw: writes.append(1) or real(*args, **kw))
    monkeypatch.setattr(store_module, "APPLY_CHUNK_BYTES", 1)  # chunks of the floor, 10,000 records
    first = [key(g % 16, b"k%05d" % g) for g in range(20_000)]
    assert store.apply(cl.encode(1, 16, [(cl.OP_PUT_NEW, k, b"1") for k in first]), "v1") == 20_000
    assert len(writes) == 2
    assert store.key_group_counts == counted(store) == {g: 1_250 for g in range(16)}
    writes.clear()
    records = [(cl.OP_PUT, k, b"2") for k in first[:6_000]]  # existing, of unknown existence
    records += [(cl.OP_PUT, key(3, b"n%05d" % i), b"2") for i in range(6_000)]  # new, unknown
    records += [(cl.OP_PUT_NEW, key(4, b"m%05d" % i), b"2") for i in range(6_000)]
    records += [(cl.OP_DELETE, k, None) for k in first[6_000:9_000]]  # existing, unknown
    records += [(cl.OP_DELETE_EXISTING, k, None) for k in first[9_000:12_000]]
    records += [(cl.OP_DELETE, key(5, b"gone%05d" % i), None) for i in range(3_000)]  # absent
    assert store.apply(cl.encode(2, 16, records), "v2") == 20_000 + 6_000 + 6_000 - 3_000 - 3_000
    assert len(writes) == 3
    assert store.get_many([first[0], first[7_000], first[15_000], key(3, b"n00001"), key(4, b"m05999")]) == \
        [b"2", None, b"1", b"2", b"2"]
    assert store.key_group_counts == counted(store)  # known and unknown ops, by key group
    body = cl.encode(3, 16, [(cl.OP_PUT_NEW, key(6, b"x%05d" % i), b"3") for i in range(25_000)])
    lying = body[:-cl.TRAILER.size] + cl.TRAILER.pack(cl.END, 24_999, zlib.crc32(body[:-cl.TRAILER.size]))
    with pytest.raises(cl.CorruptChangelogError, match="trailer says 24999"):
        store.apply(lying, "v3")
    # Its first chunks are in RocksDB: nothing is served or applied on top until a restore.
    with pytest.raises(StoreStateError, match="failed after part of it was written"):
        store.get(first[0])
    with pytest.raises(StoreStateError, match="failed after part of it was written"):
        store.apply(cl.encode(3, 16, []), "v3 again")
    store.restore(0, None, "lineage-2", 0)
    assert store.get(first[0]) is None and store.apply(cl.encode(1, 16, []), "v1") == 0


def test_versions_must_be_consecutive(store):
    with pytest.raises(StoreStateError, match="consecutive"):
        store.apply(cl.encode(3, 16, []), "v3")


def test_key_group_count_is_fixed(store):
    with pytest.raises(StoreStateError, match="key groups"):
        store.apply(cl.encode(1, 32, []), "v1")


def test_chunked_prefix_scan(store):
    records = [(cl.OP_PUT, key(g, b"k%03d" % i), b"x" * 10) for g in (1, 2) for i in range(50)]
    store.apply(cl.encode(1, 16, records), "v1")
    seen, after = [], None
    while True:
        entries, more = store.scan(key(2, b""), after, max_bytes=100)
        seen += [k for k, _ in entries]
        if not more:
            break
        after = entries[-1][0]
    assert seen == sorted(k for _, k, _ in records if k.startswith(key(2, b"")))


def test_snapshot_is_staged_every_interval_and_restores(store, tmp_path):
    store.apply(cl.encode(1, 16, [(cl.OP_PUT, key(1, b"a"), b"1")]), "v1")
    assert store.staged_snapshots() == []
    store.apply(cl.encode(2, 16, [(cl.OP_PUT, key(1, b"b"), b"2")]), "v2")
    [staged] = store.staged_snapshots()
    assert staged["version"] == 2 and staged["numKeys"] == 2
    assert any(f["name"].endswith(".sst") for f in staged["files"])
    # later versions do not change the staged copy
    store.apply(cl.encode(3, 16, [(cl.OP_PUT, key(1, b"c"), b"3")]), "v3")
    import shutil
    copy = tmp_path / "download"
    shutil.copytree(staged["dir"], copy)
    other = VersionedStore("other", tmp_path / "other", key_groups=16, snapshot_interval=2)
    other.restore(2, str(copy), "lineage-2", staged["numKeys"])
    assert other.get(key(1, b"a")) == b"1" and other.get(key(1, b"b")) == b"2"
    assert other.get(key(1, b"c")) is None and other.num_keys == 2
    other.close()
    store.drop_staged(2)
    assert store.staged_snapshots() == []


def test_a_snapshot_carries_the_key_group_counts_and_a_restore_keeps_them_exact(store, tmp_path):
    """FORMATS.md, "Key-group counts": a staged snapshot holds its version's keys by key group
    (what a split by files takes its heirs' counts from); a restore reads them back and keeps
    them through later applies, replays included; the file does not stay in RocksDB's directory."""
    import shutil

    from keyedstate.formats import key_group_counts as kgc

    store.apply(cl.encode(1, 16, [(cl.OP_PUT_NEW, key(g, b"k%d" % i), b"1") for g in (1, 5, 9) for i in range(g)]), "v1")
    store.apply(cl.encode(2, 16, [(cl.OP_DELETE_EXISTING, key(5, b"k0"), None), (cl.OP_PUT, key(7, b"x"), b"2"),
                                  (cl.OP_DELETE, key(9, b"k1"), None), (cl.OP_DELETE, key(9, b"absent"), None)]), "v2")
    [staged] = store.staged_snapshots()
    assert kgc.NAME in [f["name"] for f in staged["files"]]
    assert kgc.decode((Path(staged["dir"]) / kgc.NAME).read_bytes(), "staged") == (16, {1: 1, 5: 4, 7: 1, 9: 8})
    copy = tmp_path / "download"
    shutil.copytree(staged["dir"], copy)
    other = VersionedStore("other", tmp_path / "other", key_groups=16, snapshot_interval=2)
    other.restore(2, str(copy), "lineage-2", staged["numKeys"])
    assert other.key_group_counts == {1: 1, 5: 4, 7: 1, 9: 8} and other.num_keys == 14
    assert not (other._db_dir / kgc.NAME).exists()
    other.apply(cl.encode(3, 16, [(cl.OP_PUT, key(7, b"y"), b"3"), (cl.OP_PUT, key(1, b"k0"), b"3")]), "v3")
    assert other.key_group_counts == counted(other) == {1: 1, 5: 4, 7: 2, 9: 8}
    other.close()


@pytest.mark.parametrize("damage", ["without", "garbled", "disagreeing"])
def test_a_snapshot_without_usable_key_group_counts_restores_with_them_unknown(store, tmp_path, damage, caplog):
    """An older snapshot (no counts), or one whose counts are damaged or disagree with the
    version's key count, restores whole; its counts are unknown (a rescale then counts keys), and
    its next snapshot carries none rather than wrong ones."""
    import shutil

    from keyedstate.formats import key_group_counts as kgc

    store.apply(cl.encode(1, 16, [(cl.OP_PUT_NEW, key(g, b"a"), b"1") for g in range(4)]), "v1")
    store.apply(cl.encode(2, 16, [(cl.OP_PUT_NEW, key(g, b"b"), b"1") for g in range(4)]), "v2")
    [staged] = store.staged_snapshots()
    copy = tmp_path / "download"
    shutil.copytree(staged["dir"], copy)
    if damage == "without":
        (copy / kgc.NAME).unlink()
    elif damage == "garbled":
        (copy / kgc.NAME).write_bytes(b"KSGC" + bytes(30))
    else:
        (copy / kgc.NAME).write_bytes(kgc.encode({0: 2, 1: 2, 2: 2, 3: 3}, 16))
    other = VersionedStore("other", tmp_path / "other", key_groups=16, snapshot_interval=1)
    other.restore(2, str(copy), "lineage-2", 8)
    assert other.key_group_counts is None and other.num_keys == 8
    assert other.get(key(3, b"b")) == b"1"
    assert ("ignoring its key-group counts" in caplog.text) == (damage != "without")
    other.apply(cl.encode(3, 16, [(cl.OP_PUT_NEW, key(5, b"c"), b"1")]), "v3")
    [next_snapshot] = other.staged_snapshots()
    assert kgc.NAME not in [f["name"] for f in next_snapshot["files"]] and next_snapshot["numKeys"] == 9
    other.close()


def test_a_bulk_load_is_snapshotted_at_once_so_no_load_replays_it(tmp_path):
    """A version that adds at least snapshotBulkKeys keys, at least as many as the store held
    before it, is staged right after its apply, not at the next interval; a rewrite of every
    key (many records, no new keys) or a smaller growth is not."""
    s = VersionedStore("test", tmp_path / "store", key_groups=16, snapshot_interval=10, bulk_keys=40)
    s.restore(0, None, "lineage-1", 0)
    try:
        bulk = [(cl.OP_PUT_NEW, key(i % 16, b"k%03d" % i), b"v") for i in range(100)]
        s.apply(cl.encode(1, 16, bulk), "v1")
        assert [snap["version"] for snap in s.staged_snapshots()] == [1]
        s.drop_staged(1)
        # 100 records, no new key: a steady query's batch, not a bulk load
        s.apply(cl.encode(2, 16, [(cl.OP_PUT_EXISTING, key(i % 16, b"k%03d" % i), b"w") for i in range(100)]), "v2")
        # 99 new keys over 100: less than the store held
        s.apply(cl.encode(3, 16, [(cl.OP_PUT_NEW, key(i % 16, b"m%03d" % i), b"x") for i in range(99)]), "v3")
        assert s.staged_snapshots() == [] and s.num_keys == 199
        # 200 new keys (unknown to the writer, counted here) over 199: at least as many
        s.apply(cl.encode(4, 16, [(cl.OP_PUT, key(i % 16, b"n%03d" % i), b"y") for i in range(200)]), "v4")
        assert [snap["version"] for snap in s.staged_snapshots()] == [4] and s.num_keys == 399
    finally:
        s.close()


def test_a_staged_snapshot_is_listed_without_waiting_for_the_applies_queued_after_it(tmp_path):
    """The commit of a snapshot version asks for its upload; in a running query the next
    version's apply is already queued. Neither that upload's listing nor maintenance's may wait
    for it (before: both waited until no apply was pending, and maintenance held the store's
    uploads meanwhile: W1 restarted with 2 of 4 partitions lacking their last snapshot)."""
    import threading

    from keyedstate.server.store import Applier

    s = VersionedStore("test", tmp_path / "store", key_groups=16, snapshot_interval=2, applier=Applier())
    s.restore(0, None, "lineage-1", 0)
    try:
        s.submit(cl.encode(1, 16, [(cl.OP_PUT, key(1, b"a"), b"1")]), "v1")
        s.submit(cl.encode(2, 16, [(cl.OP_PUT, key(1, b"b"), b"2")]), "v2")  # staged in its apply
        assert [x["version"] for x in s.staged_snapshots(2)] == [2]
        with s._lock:  # a long apply of v3 runs (the applier waits for this lock)
            s.submit(cl.encode(3, 16, [(cl.OP_PUT, key(1, b"c"), b"3")]), "v3")
            listed: list = []
            lister = threading.Thread(target=lambda: listed.append(s.staged_snapshots(2)))
            lister.start()
            lister.join(timeout=10)
            assert not lister.is_alive(), "listing waited for the apply queued after the snapshot"
            assert [x["version"] for x in listed[0]] == [2]
            everything: list = []  # maintenance's listing (no version): what is staged now
            waiting = threading.Thread(target=lambda: everything.append(s.staged_snapshots()))
            waiting.start()
            waiting.join(timeout=10)
            assert not waiting.is_alive(), "maintenance's listing waited for a pending apply"
            assert [x["version"] for x in everything[0]] == [2]
        s.drop_staged(2)
        assert s.staged_snapshots(2) == []
        # An upload asked for version 3, which staged nothing (or whose snapshot went already),
        # while version 4's apply is held: the listing must not wait for 4.
        s._wait_applied()
        with s._lock:
            s.submit(cl.encode(4, 16, [(cl.OP_PUT, key(1, b"d"), b"4")]), "v4")
            listed = []
            lister = threading.Thread(target=lambda: listed.append(s.staged_snapshots(3)))
            lister.start()
            lister.join(timeout=10)
            assert not lister.is_alive(), "listing for an applied version waited for the next apply"
            assert listed == [[]]
    finally:
        s.close()


def test_listing_staged_snapshots_while_they_are_dropped_or_restaged_sees_whole_ones(tmp_path):
    """The uploader lists staged snapshots while the server drops uploaded ones and stages new
    ones (a reload or close drops them all). A listing must describe each snapshot whole or not
    at all: before, a directory removed between its listing and a file's stat failed the listing
    with FileNotFoundError (about one listing in five in this loop)."""
    import threading

    s = VersionedStore("test", tmp_path / "store", key_groups=16, snapshot_interval=1)
    s.restore(0, None, "lineage-1", 0)
    errors: list = []
    stop = threading.Event()

    def list_forever():
        while not stop.is_set():
            try:
                for snapshot in s.staged_snapshots():
                    assert snapshot["files"] and any(f["name"] == "CURRENT" for f in snapshot["files"]), snapshot
            except Exception as exc:  # noqa: BLE001 - any failure of a listing is the finding
                errors.append(exc)

    listers = [threading.Thread(target=list_forever) for _ in range(2)]
    for t in listers:
        t.start()
    try:
        for v in range(1, 151):
            s.apply(cl.encode(v, 16, [(cl.OP_PUT, key(v % 16, b"k%d" % v), b"x" * 100)]), f"v{v}")  # stages v
            if v % 3 == 0:
                s.restore(v, None, "lineage-1", 0)  # drops everything staged, like a reload
            else:
                s.drop_staged(v - 1)
    finally:
        stop.set()
        for t in listers:
            t.join()
        s.close()
    assert not errors, errors[:3]


def test_a_scan_that_meets_a_corrupt_block_fails_instead_of_ending(tmp_path):
    """RocksDB's iterator stops on a block whose checksum does not match; read as the end, the
    JVM's iterator (a watermark eviction, a timeout scan) and the TTL cleanup would silently
    miss the rest."""
    s = VersionedStore("test", tmp_path / "store", key_groups=16, snapshot_interval=100)
    s.restore(0, None, "lineage-1", 0)
    try:
        s.apply(cl.encode(1, 16, [(cl.OP_PUT_NEW, key(i % 16, b"k%06d" % i), b"v" * 20) for i in range(50_000)]), "v1")
        s.sync()  # flushed: the rows are in an SST file
        sst = max(s._db_dir.glob("*.sst"), key=lambda f: f.stat().st_size)
        data = bytearray(sst.read_bytes())
        for offset in range(len(data) // 4, len(data) // 2, 4096):
            data[offset] ^= 0xFF
        sst.write_bytes(bytes(data))
        with pytest.raises(Exception, match="Corruption"):
            s.scan(b"", None, 1 << 30)
        # The TTL cleanup's scan too: read as the end, it would wrap around and never see the rest.
        with pytest.raises(Exception, match="Corruption"):
            s._scan_expired(TtlScan(expire_before=0, interval=1, budget=1_000_000))
    finally:
        s.close()


def test_a_held_changelog_is_applied_only_when_released_and_dropped_otherwise(tmp_path):
    """A write-behind commit ships its changelog while the JVM writes the file: the server holds
    it unapplied, so a version the checkpoint may lack is never read, staged or uploaded, until
    the JVM releases it (the file is durable) or drops it (it is not). A restore drops it too."""
    from keyedstate.server.store import Applier

    s = VersionedStore("test", tmp_path / "store", key_groups=16, snapshot_interval=2, applier=Applier())
    s.restore(0, None, "lineage-1", 0)
    try:
        s.submit(cl.encode(1, 16, [(cl.OP_PUT, key(1, b"a"), b"1")]), "v1")
        s.hold(cl.encode(2, 16, [(cl.OP_PUT, key(1, b"a"), b"2"), (cl.OP_PUT_NEW, key(2, b"b"), b"2")]), "v2")
        # Held: reads, the version held and the staged snapshots are version 1's (2 would stage).
        assert (s.get(key(1, b"a")), s.get(key(2, b"b")), s.sync()[0]) == (b"1", None, 1)
        assert s.staged_snapshots(2) == []
        with pytest.raises(StoreStateError, match="while another is still held"):
            s.hold(cl.encode(3, 16, []), "v3")
        s.release(apply=False)  # the file was not written: version 1 stays
        assert (s.get(key(1, b"a")), s.sync()[0], s.info()["numKeys"]) == (b"1", 1, 1)
        with pytest.raises(StoreStateError, match="no changelog is held to apply"):
            s.release(apply=True)
        s.hold(cl.encode(2, 16, [(cl.OP_PUT, key(1, b"a"), b"2"), (cl.OP_PUT_NEW, key(2, b"b"), b"2")]), "v2")
        s.release(apply=True)  # durable: applied behind, and staged as a snapshot version
        assert (s.get(key(1, b"a")), s.get(key(2, b"b")), s.sync()[0]) == (b"2", b"2", 2)
        assert [x["version"] for x in s.staged_snapshots(2)] == [2]
        s.hold(cl.encode(3, 16, [(cl.OP_PUT, key(3, b"c"), b"3")]), "v3")
        s.restore(0, None, "lineage-2", 0)  # a reload after a commit that never released
        with pytest.raises(StoreStateError, match="no changelog is held to apply"):
            s.release(apply=True)
        assert (s.version, s.get(key(3, b"c"))) == (0, None)
        s.hold(cl.encode(1, 16, [(cl.OP_PUT, key(3, b"c"), b"3")]), "v1")
        s._failure = "an earlier background apply failed"  # as _apply_submitted records one
        with pytest.raises(StoreStateError, match="an earlier background apply failed"):
            s.release(apply=True)  # nothing is applied on top of a failed apply
        assert (s._held, s.version) == (None, 0)
        with pytest.raises(StoreStateError, match="an earlier background apply failed"):
            s.hold(cl.encode(1, 16, []), "v1")
        s.restore(0, None, "lineage-3", 0)
        s.hold(cl.encode(1, 16, [(cl.OP_PUT, key(3, b"c"), b"3")]), "v1")
    finally:
        s.close()  # drops what is held
    assert s._held is None


def test_under_a_memory_budget_every_apply_leaves_its_memtable_flushed(tmp_path):
    """Under a memoryBudget a version's writes are flushed once written, the last chunk's too:
    a memtable left behind would grow across versions, put the next apply's first chunk on top
    of it (the bound the chunks exist for) and move the flush onto the JVM's next read."""
    from keyedstate.formats.rocksdb import MemoryPool

    s = VersionedStore("pooled", tmp_path / "store", key_groups=16, snapshot_interval=100, pool=MemoryPool(64 << 20))
    s.restore(0, None, "lineage-1", 0)
    try:
        for version in (1, 2, 3):
            records = [(cl.OP_PUT_NEW, key(g % 16, b"v%d-%05d" % (version, g)), b"x" * 20) for g in range(20_000)]
            assert s.apply(cl.encode(version, 16, records), f"v{version}") == 20_000 * version
            assert s._db.property_int_value("rocksdb.num-entries-active-mem-table") == 0
            assert s._db.property_int_value("rocksdb.num-entries-imm-mem-tables") == 0
    finally:
        s.close()


def test_a_shipped_changelog_lets_go_of_its_frame_once_decoded(tmp_path):
    """Bytes given to the store as a memoryview (an in-process caller's) are decoded by copying
    the records out, so the buffer they came in must not stay viewed through the apply, now or
    behind, held or not: a buffer still viewed cannot be freed (bytearray.clear raises
    BufferError)."""
    from keyedstate.server.store import Applier

    s = VersionedStore("test", tmp_path / "store", key_groups=16, snapshot_interval=100, applier=Applier())
    s.restore(0, None, "lineage-1", 0)
    try:
        frames = [bytearray(cl.encode(v, 16, [(cl.OP_PUT_NEW, key(v, b"k%d" % v), b"%d" % v)])) for v in (1, 2, 3)]
        views = [memoryview(frame)[0:] for frame in frames]  # kept here, as a caller's would be
        assert s.apply(views[0], "v1") == 1  # now
        s.submit(views[1], "v2")  # behind
        s.hold(views[2], "v3")  # held while its file is written, then behind
        s.release(apply=True)
        assert s.get(key(3, b"k3")) == b"3"  # waits for the applies
        for frame in frames:
            frame.clear()
    finally:
        s.close()


@pytest.fixture
def channel(tmp_path):
    """A state server's data channel, driven frame by frame, and one open store at version 0."""
    from keyedstate.server.data import DataServer
    from keyedstate.server.registry import StoreRegistry

    registry = StoreRegistry(tmp_path / "work")
    handle, store = registry.open("s", {"keyGroups": 16, "snapshotInterval": 1000, "snapshotBulkKeys": 0})
    store.restore(0, None, "lineage-1", 0)
    server = DataServer(registry, tmp_path / "data.sock", b"secret")
    try:
        yield server, handle, store
    finally:
        registry.close(handle)
        server._sock.close()


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(field))


@pytest.mark.parametrize("op", [cl.OP_PUT, cl.OP_PUT_NEW], ids=["unknown-keys", "new-keys"])
def test_the_data_channel_applies_a_large_frame_in_place_holding_it_once(channel, op):
    """A large APPLY (a seed's: 114 MiB a partition on W5) is received into a mapping whose
    records the apply reads in place, and whose pages go back to the system as they are
    written: the server never holds the frame beside a copy, nor the applied part of it beside
    the memtables it went to. Measured: +17-18 MiB at the peak for this 51 MiB frame; a copy
    made at decode, as before, took +76-101 MiB."""
    from keyedstate.formats import frames
    from keyedstate.server.data import _frame_body

    server, handle, store = channel
    count = 1_000_000
    data = bytes([frames.APPLY_NOW, 0]) + cl.encode(
        1, 16, [(op, key(i % 16, b"%016d" % i), b"v%023d" % i) for i in range(count)])
    body = _frame_body(len(data))
    body[:] = data  # as the socket fills it
    del data
    base = _rss_bytes("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    except OSError as exc:
        pytest.skip(f"this kernel does not let a process reset its peak RSS: {exc}")
    status, reply = server._dispatch(frames.OP_APPLY, handle, body)
    peak = _rss_bytes("VmHWM") - base
    assert status == frames.STATUS_OK and reply == frames.count_reply(count)
    assert peak < 0.75 * len(body), f"applying a {len(body) >> 20} MiB frame took +{peak >> 20} MiB"
    assert body[:len(body) // 2] == bytes(len(body) // 2)  # the applied records' pages went back
    assert store.get(key(7, b"%016d" % 999_991)) == b"v%023d" % 999_991


def test_a_large_frame_held_is_applied_behind_after_the_channel_let_go_of_it(channel):
    """A held changelog read in place keeps its mapping alive on its own: the data channel drops
    the frame once it replied, and the applier reads the records after the RELEASE. A corrupt
    changelog is refused at the HOLD itself and leaves nothing held."""
    import gc

    from keyedstate.formats import frames
    from keyedstate.server.data import IN_PLACE_FRAME_BYTES, _frame_body

    server, handle, store = channel
    count = 50_000
    data = bytes([frames.APPLY_HOLD, 0]) + cl.encode(
        1, 16, [(cl.OP_PUT_NEW, key(i % 16, b"%08d" % i), b"v%030d" % i) for i in range(count)])
    assert len(data) >= IN_PLACE_FRAME_BYTES
    corrupt = _frame_body(len(data))
    corrupt[:] = data
    corrupt[100] ^= 0x01
    with pytest.raises(cl.CorruptChangelogError, match="CRC"):  # the channel replies ERROR with it
        server._dispatch(frames.OP_APPLY, handle, corrupt)
    body = _frame_body(len(data))
    body[:] = data
    assert server._dispatch(frames.OP_APPLY, handle, body) == (frames.STATUS_OK, frames.count_reply(0))
    del body, corrupt
    gc.collect()
    assert server._dispatch(frames.OP_RELEASE, handle, bytes([1]))[0] == frames.STATUS_OK
    assert store.get(key(9, b"%08d" % 49_993)) == b"v%030d" % 49_993  # waits for the apply behind
    assert store.info() == {"version": 1, "numKeys": count}


def test_a_store_without_a_memory_budget_caches_8_mib_of_blocks_as_sparks_provider_does(tmp_path):
    """RocksDB's own default is 32 MiB a database, which the counting multi-gets of a seed fill
    and keep (62 MiB a server on W5); Spark's RocksDB provider defaults to 8 MiB a store."""
    from keyedstate.formats import rocksdb

    s = VersionedStore("test", tmp_path / "store", key_groups=16, snapshot_interval=100)
    s.restore(0, None, "lineage-1", 0)
    try:
        records = [(cl.OP_PUT, key(i % 16, b"%08d" % i), b"v" * 200) for i in range(100_000)]
        assert s.apply(cl.encode(1, 16, records), "v1") == 100_000
        assert s.get_many([k for _, k, _ in records]) == [v for _, _, v in records]
        db = s._require_db()
        assert db.property_int_value("rocksdb.block-cache-capacity") == rocksdb.STORE_BLOCK_CACHE_BYTES == 8 << 20
        assert 4 << 20 < db.property_int_value("rocksdb.block-cache-usage") <= 8 << 20
    finally:
        s.close()


def _compacting(db) -> bool:
    """Whether RocksDB runs a compaction now ("compaction-pending" says only that L0 is at its trigger)."""
    return bool(db.property_int_value("rocksdb.num-running-compactions"))


def _level0_files(db) -> int:
    return db.property_int_value("rocksdb.num-files-at-level0") or 0


def _wait_for_level0_below(db, files: int, seconds: float = 60) -> None:
    import time

    deadline = time.monotonic() + seconds
    while (_level0_files(db) >= files or _compacting(db)) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_rescale_heir_is_restored_without_compacting_until_its_first_flush(tmp_path):
    """A heir of a split by files opens with its parent's three L0 files plus one of range
    deletes: RocksDB's L0 trigger (4). Its restore, which runs in the task that loads it,
    starts no compaction; with too few hidden entries for a reclaim, the first flush after it
    (here a read of the next version) resumes them, and the compaction that follows drops the
    hidden key groups' entries. Reads see the heir's keys alone throughout."""
    import time

    from keyedstate.formats import rocksdb
    from keyedstate.offline.rescale.clip import clipped_heir

    parent = rocksdb.open_db(tmp_path / "parent", compactions=False)  # partition 1 of 2: odd groups
    for part in range(3):  # three L0 files, as a snapshot plus later flushes leaves them
        for i in range(part * 4000, (part + 1) * 4000):
            parent[key(1 + 2 * (i % 8), b"k%06d" % i)] = b"v%d" % i
        parent.flush()
    assert parent.property_int_value("rocksdb.num-files-at-level0") == 3
    heir_dir = clipped_heir(parent, tmp_path / "clip", 1, 4, 16)  # heir 1 of 4 owns 1, 5, 9, 13
    parent.close()
    owned = [key(1 + 2 * (i % 8), b"k%06d" % i) for i in range(12_000) if (1 + 2 * (i % 8)) % 4 == 1]
    hidden = [key(1 + 2 * (i % 8), b"k%06d" % i) for i in range(12_000) if (1 + 2 * (i % 8)) % 4 == 3]

    heir = VersionedStore("heir", tmp_path / "heir", key_groups=16, snapshot_interval=100)
    try:
        heir.restore(5, str(heir_dir), "lineage", len(owned))
        db = heir._require_db()
        for _ in range(3):  # not at once, nor a little later
            assert _level0_files(db) == 4 and not _compacting(db)
            time.sleep(0.1)
        assert heir.get_many(hidden[:50]) == [None] * 50 and all(heir.get_many(owned[:50]))

        heir.apply(cl.encode(6, 16, [(cl.OP_PUT, owned[0], b"new")]), "v6")
        heir.sync()  # a read of version 6 flushes its write: compactions resume
        _wait_for_level0_below(db, 1)
        assert _level0_files(db) == 0 and not _compacting(db)
        entries = sum(f["num_entries"] for f in db.live_files())
        assert entries == len(owned), entries  # the hidden key groups' entries are gone
        assert heir.get(owned[0]) == b"new" and heir.get_many(hidden[:50]) == [None] * 50
        assert heir.num_keys == len(owned)
    finally:
        heir.close()


def test_a_restored_store_without_writes_compacts_from_its_first_snapshot(tmp_path):
    """A heir whose batches write nothing (a partition no key reaches) never flushes: its
    snapshots would keep the parent's L0 files, hidden key groups and all, restore after
    restore. The snapshot its commits stage resumes compactions as a flush does."""
    from keyedstate.formats import rocksdb
    from keyedstate.offline.rescale.clip import clipped_heir

    parent = rocksdb.open_db(tmp_path / "parent", compactions=False)
    for part in range(3):
        for i in range(part * 4000, (part + 1) * 4000):
            parent[key(1 + 2 * (i % 8), b"k%06d" % i)] = b"v%d" % i
        parent.flush()
    heir_dir = clipped_heir(parent, tmp_path / "clip", 1, 4, 16)
    parent.close()
    owned = [key(1 + 2 * (i % 8), b"k%06d" % i) for i in range(12_000) if (1 + 2 * (i % 8)) % 4 == 1]

    heir = VersionedStore("heir", tmp_path / "heir", key_groups=16, snapshot_interval=2)
    try:
        heir.restore(5, str(heir_dir), "lineage", len(owned))
        db = heir._require_db()
        assert _level0_files(db) == 4
        heir.apply(cl.encode(6, 16, []), "v6")  # a batch without writes: a snapshot is staged
        assert [s["version"] for s in heir.staged_snapshots()] == [6]
        _wait_for_level0_below(db, 1)
        assert _level0_files(db) == 0
        assert sum(f["num_entries"] for f in db.live_files()) == len(owned)  # hidden groups gone
        assert heir.get_many(owned[:50]) == [b"v%d" % i for i in range(12_000) if (1 + 2 * (i % 8)) % 4 == 1][:50]
    finally:
        heir.close()


def _heir_of_three_l0_files(tmp_path: Path, keys_per_file: int = 4000) -> tuple[Path, list[bytes], list[bytes]]:
    """Heir 1 of 4 (key groups 1, 5, 9, 13) split by files from partition 1 of 2; its owned and
    hidden keys."""
    from keyedstate.formats import rocksdb
    from keyedstate.offline.rescale.clip import clipped_heir

    parent = rocksdb.open_db(tmp_path / "parent", compactions=False)
    names = range(3 * keys_per_file)
    for part in range(3):
        for i in names[part * keys_per_file:(part + 1) * keys_per_file]:
            parent[key(1 + 2 * (i % 8), b"k%06d" % i)] = b"v%d" % i
        parent.flush()
    heir_dir = clipped_heir(parent, tmp_path / "clip", 1, 4, 16)
    parent.close()
    owned = [key(1 + 2 * (i % 8), b"k%06d" % i) for i in names if (1 + 2 * (i % 8)) % 4 == 1]
    hidden = [key(1 + 2 * (i % 8), b"k%06d" % i) for i in names if (1 + 2 * (i % 8)) % 4 == 3]
    return heir_dir, owned, hidden


def test_a_heir_reclaims_its_parents_hidden_entries_once_its_first_batch_is_over(tmp_path):
    """Half of a heir's entries are its parent's hidden key groups. The commit of its second
    version after the restore (its first batch is over by then) compacts them away in a thread
    of its own, with no flush needed; reads see the heir's keys alone throughout."""
    heir_dir, owned, hidden = _heir_of_three_l0_files(tmp_path, keys_per_file=8000)
    heir = VersionedStore("heir", tmp_path / "heir", key_groups=16, snapshot_interval=100)
    try:
        heir.restore(5, str(heir_dir), "lineage", len(owned))
        db = heir._require_db()
        heir.apply(cl.encode(6, 16, []), "v6")  # the first batch's commit: nothing yet
        assert heir._reclaim is None and sum(f["num_entries"] for f in db.live_files()) > 2 * len(owned)
        heir.apply(cl.encode(7, 16, [(cl.OP_PUT, owned[0], b"new")]), "v7")
        assert heir.wait_reclaimed(60)
        assert heir._dirty  # the reclaim needed no flush of the heir's own writes
        assert sum(f["num_entries"] for f in db.live_files()) == len(owned)  # the hidden ones are gone
        assert heir.get(owned[0]) == b"new" and heir.get_many(hidden[:50]) == [None] * 50
        assert heir.num_keys == len(owned)
    finally:
        heir.close()


def test_a_heir_compacts_its_parents_files_once_in_the_reclaim(tmp_path):
    """A heir whose reclaim is due keeps RocksDB's compactions off at its first flush, which
    would otherwise compact its parent's L0 files inside its first batch, and the reclaim then
    rewrite the result with the flushes since: its parent's entries are compacted once, by the
    reclaim, after which compactions go on as in any store."""
    import time

    heir_dir, owned, hidden = _heir_of_three_l0_files(tmp_path, keys_per_file=8000)
    heir = VersionedStore("heir", tmp_path / "heir", key_groups=16, snapshot_interval=100)
    try:
        heir.restore(5, str(heir_dir), "lineage", len(owned))
        db = heir._require_db()
        heir.apply(cl.encode(6, 16, [(cl.OP_PUT, owned[0], b"new")]), "v6")
        heir.sync()  # the first flush: the heir's 4 L0 files and this one, at the trigger
        for _ in range(5):  # no compaction starts, nor a little later
            assert _level0_files(db) == 5 and not _compacting(db)
            time.sleep(0.1)
        assert sum(f["num_entries"] for f in db.live_files()) > 2 * len(owned)
        heir.apply(cl.encode(7, 16, [(cl.OP_PUT, owned[1], b"newer")]), "v7")  # the reclaim starts
        assert heir.wait_reclaimed(60)
        assert sum(f["num_entries"] for f in db.live_files()) == len(owned)  # hidden ones gone, in one pass
        # The reclaim turned compactions back on: L0 files that reach the trigger, flushed
        # without the store (which would turn them on itself), are compacted again.
        for i in range(4):
            db.put(owned[2 + i], b"direct")
            db.flush()
        _wait_for_level0_below(db, 4)
        assert _level0_files(db) < 4
        assert heir.get_many([owned[0], owned[1]] + hidden[:50]) == [b"new", b"newer"] + [None] * 50
        assert heir.num_keys == len(owned)
    finally:
        heir.close()


def test_a_heir_whose_reclaim_waits_compacts_once_its_level0_fills(tmp_path):
    """While another store's reclaim holds the process's turn, a heir's flushes add L0 files
    with compactions off; at RECLAIM_HOLD_L0_FILES they compact anyway, so its reads never
    check an unbounded number of files. Its reclaim still runs when its turn comes."""
    from keyedstate.server import reclaim as reclaim_module, store as store_module

    heir_dir, owned, hidden = _heir_of_three_l0_files(tmp_path, keys_per_file=8000)
    heir = VersionedStore("heir", tmp_path / "heir", key_groups=16, snapshot_interval=100)
    assert reclaim_module._RECLAIMS.acquire(timeout=10)  # another store's reclaim runs
    released = False
    try:
        heir.restore(5, str(heir_dir), "lineage", len(owned))
        db = heir._require_db()
        version = 6
        while version < 6 + store_module.RECLAIM_HOLD_L0_FILES - 5:  # from the heir's 4 to the bound's 7
            heir.apply(cl.encode(version, 16, [(cl.OP_PUT, owned[version], b"v")]), f"v{version}")
            heir.sync()
            version += 1
        assert _level0_files(db) == store_module.RECLAIM_HOLD_L0_FILES - 1 and not _compacting(db)
        assert heir._reclaim is not None and not heir.wait_reclaimed(0)  # due, waiting for its turn
        heir.apply(cl.encode(version, 16, [(cl.OP_PUT, owned[version], b"v")]), f"v{version}")
        heir.sync()  # the flush that reaches the bound: compactions resume
        _wait_for_level0_below(db, 4)
        assert _level0_files(db) < 4
        reclaim_module._RECLAIMS.release()
        released = True
        assert heir.wait_reclaimed(60)
        assert sum(f["num_entries"] for f in db.live_files()) == len(owned)
        assert heir.get_many(hidden[:50]) == [None] * 50 and heir.get(owned[6]) == b"v"
    finally:
        if not released:
            reclaim_module._RECLAIMS.release()
        heir.close()


def test_a_heir_whose_reclaim_waits_bounds_the_level0_files_rocksdb_flushes(tmp_path, monkeypatch):
    """RocksDB flushes a full memtable by itself, between the store's own flushes: a changelog
    of many write batches, each over a memtable, adds L0 files while compactions wait for the
    reclaim. They resume once RECLAIM_HOLD_L0_FILES are there, here within one apply."""
    from keyedstate.formats import rocksdb
    from keyedstate.server import reclaim as reclaim_module, store as store_module

    heir_dir, owned, _ = _heir_of_three_l0_files(tmp_path, keys_per_file=8000)
    options = rocksdb._options

    def small_memtables(bulk_load, pool=None):
        made = options(bulk_load, pool)
        made.set_write_buffer_size(256 << 10)
        return made

    monkeypatch.setattr(rocksdb, "_options", small_memtables)
    monkeypatch.setattr(store_module, "APPLY_CHUNK_BYTES", 64 << 10)  # batches of 10,000 records
    heir = VersionedStore("heir", tmp_path / "heir", key_groups=16, snapshot_interval=100)
    assert reclaim_module._RECLAIMS.acquire(timeout=10)  # another store's reclaim runs
    try:
        heir.restore(5, str(heir_dir), "lineage", len(owned))
        db = heir._require_db()
        # 20 write batches of 10,000 records (~0.6 MiB each): a memtable switch after each
        added = [key(1 + 4 * (i % 4), b"n%07d" % i) for i in range(200_000)]
        heir.apply(cl.encode(6, 16, [(cl.OP_PUT_NEW, k, b"x" * 40) for k in added]), "v6")
        assert not heir._compactions_held and heir._reclaim_at == 7  # resumed by the cap, the reclaim still due
        _wait_for_level0_below(db, store_module.RECLAIM_HOLD_L0_FILES)
        assert _level0_files(db) < store_module.RECLAIM_HOLD_L0_FILES
        assert heir.get(added[-1]) == b"x" * 40 and heir.num_keys == len(owned) + len(added)
    finally:
        reclaim_module._RECLAIMS.release()
        heir.close()


def test_a_store_whose_files_hold_its_keys_alone_reclaims_nothing(tmp_path, store):
    """A plain restore (snapshot files of the store's own keys) starts no reclaim."""
    store.apply(cl.encode(1, 16, [(cl.OP_PUT, key(g, b"k%d" % g), b"v") for g in range(16)]), "v1")
    store.apply(cl.encode(2, 16, []), "v2")  # interval 2: a snapshot is staged
    staged = store.staged_snapshots()[0]
    plain = VersionedStore("plain", tmp_path / "plain", key_groups=16, snapshot_interval=2)
    try:
        shutil.copytree(staged["dir"], tmp_path / "download")
        plain.restore(2, str(tmp_path / "download"), "lineage-1", 16)
        for version in (3, 4):
            plain.apply(cl.encode(version, 16, []), f"v{version}")
        assert plain._reclaim is None
    finally:
        plain.close()


def test_a_store_closed_while_it_reclaims_cancels_the_compaction(tmp_path):
    """A reload or close while the reclaim compacts cancels it, so that the task that reloads
    never waits for a whole compaction: the database closes at once, the heir restores again
    whole and reclaims once its turn comes again."""
    heir_dir, owned, _ = _heir_of_three_l0_files(tmp_path, keys_per_file=150_000)
    shutil.copytree(heir_dir, tmp_path / "again")
    heir = VersionedStore("heir", tmp_path / "heir", key_groups=16, snapshot_interval=100)
    try:
        heir.restore(5, str(heir_dir), "lineage", len(owned))
        for version in (6, 7):
            heir.apply(cl.encode(version, 16, []), f"v{version}")
        reclaim = heir._reclaim
        assert reclaim is not None
        wait_until(lambda: reclaim._compacting, 30, "the reclaim's compaction to start", interval=0.002)
        heir.restore(5, str(tmp_path / "again"), "lineage", len(owned))  # closes the database first
        assert reclaim.wait(0) and reclaim.cancelled and heir._reclaim is None
        assert heir.get_many(owned[:50]) == [b"v%d" % int(k[4:].decode()[1:]) for k in owned[:50]]
        for version in (6, 7):
            heir.apply(cl.encode(version, 16, []), f"v{version}")
        assert heir.wait_reclaimed(120) and not heir._reclaim.cancelled
        db = heir._require_db()
        assert sum(f["num_entries"] for f in db.live_files()) == len(owned)
    finally:
        heir.close()


def test_a_reclaim_is_cancelled_at_once_with_level0_at_rocksdbs_stall_trigger(tmp_path):
    """While the reclaim compacts, no other compaction of its database runs, so flushes pile up
    in L0; at RocksDB's slowdown trigger (20 files) a flush with automatic compactions on waits
    for a compaction, and the cancel's own flush would wait holding the GIL. A stop turns them
    off first: the compaction is cancelled before its end, its dead entries still there."""
    from keyedstate.formats import rocksdb
    from keyedstate.server.reclaim import Reclaim

    heir_dir, owned, hidden = _heir_of_three_l0_files(tmp_path, keys_per_file=400_000)
    db = rocksdb.open_db(heir_dir, compactions=False)
    try:
        entries = sum(f["num_entries"] for f in db.live_files())
        db.set_options({"disable_auto_compactions": "false"})  # as _cap_level0 resumes them
        reclaim = Reclaim("heir", db)
        wait_until(lambda: reclaim._compacting, 30, "the reclaim's compaction to start", interval=0.001)
        for i in range(15):  # 4 L0 files + 15 = 19: the next flush reaches the trigger
            db.put(owned[i], b"during")
            db.flush()
        db.put(owned[15], b"unflushed")
        assert db.property_int_value("rocksdb.num-files-at-level0") == 19 and not reclaim.wait(0)
        reclaim.stop()
        assert reclaim.cancelled
        assert sum(f["num_entries"] for f in db.live_files()) > entries  # not compacted: cancelled
        assert db.get(owned[15]) == b"unflushed" and db.get(hidden[0]) is None
    finally:
        try:
            db.close()
        except Exception as exc:  # RocksDB's background work is shut down: the close's flush is refused
            assert str(exc).startswith("Shutdown in progress")


def test_a_store_whose_close_fails_can_be_restored_again(tmp_path, store):
    """rocksdict closes a database even when the flush of its close fails (here refused because
    RocksDB's background work was shut down, as after a background error): the store holds no
    version then, and the next restore or close works, where it once held the closed handle."""
    store.apply(cl.encode(1, 16, [(cl.OP_PUT, key(1, b"a"), b"1")]), "v1")
    store._require_db().cancel_all_background(False)
    with pytest.raises(Exception, match="Shutdown in progress"):
        store.restore(0, None, "lineage-2", 0)
    assert store._db is None and store.version == -1
    store.restore(0, None, "lineage-2", 0)
    store.apply(cl.encode(1, 16, [(cl.OP_PUT, key(2, b"b"), b"2")]), "v1")
    assert store.get(key(2, b"b")) == b"2" and store.get(key(1, b"a")) is None


def test_a_restore_while_a_scan_still_iterates_installs_beside_the_instance_it_closes(store, tmp_path):
    """rocksdict's close returns without closing while an iterator lives (a scan of a read
    racing a reload); that instance closes when the iterator goes and then deletes, as obsolete,
    every file of its directory it does not know. The restore must neither fail on the lock the
    instance still holds nor lose the files it installs."""
    store.apply(cl.encode(1, 16, [(cl.OP_PUT_NEW, key(g, b"old%d" % g), b"1") for g in range(16)]), "v1")
    store.apply(cl.encode(2, 16, [(cl.OP_PUT_NEW, key(1, b"only-in-v2"), b"2")]), "v2")
    [staged] = store.staged_snapshots()
    download = tmp_path / "download"
    shutil.copytree(staged["dir"], download)
    store.drop_staged(2)
    store.apply(cl.encode(3, 16, [(cl.OP_PUT_NEW, key(g, b"v3-%d" % g), b"3") for g in range(16)]), "v3")
    store.sync()
    scanning = store._require_db().iter()  # the instance of version 3 stays open through the close
    scanning.seek_to_first()

    store.restore(2, str(download), "lineage-1", staged["numKeys"])
    assert scanning.valid()
    del scanning  # the version-3 instance closes now, and purges what it calls obsolete
    gc.collect()

    expected = {key(g, b"old%d" % g): b"1" for g in range(16)} | {key(1, b"only-in-v2"): b"2"}
    assert dict(store._require_db(wait=True).items()) == expected
    assert [p.name for p in store.workdir.glob("db*")] == [store._db_dir.name]  # the closed one is gone
    store.apply(cl.encode(3, 16, [(cl.OP_PUT_NEW, key(2, b"new"), b"3")]), "v3")
    store.stage_snapshot()  # reads every file of the restored version
    [restaged] = store.staged_snapshots()
    again = VersionedStore("again", tmp_path / "again", key_groups=16, snapshot_interval=2)
    try:
        again.restore(3, restaged["dir"], "lineage-1", restaged["numKeys"])
        assert dict(again._require_db(wait=True).items()) == expected | {key(2, b"new"): b"3"}
        assert again.num_keys == len(expected) + 1
    finally:
        again.close()
