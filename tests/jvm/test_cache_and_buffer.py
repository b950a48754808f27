"""The JVM's write buffer and near cache, exercised directly: budget and eviction, the Bloom
filter that keeps answering "absent", and how each write is classified for the changelog."""
from __future__ import annotations

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.java_gateway import ensure_callback_server_started

from keyedstate.formats import changelog

from support.jvm import LayerStore, byte_arrays, to_bytes

BUDGET = 16 * 1024


@pytest.fixture
def engine(jvm):
    return jvm.io.keyedstate.engine


@pytest.fixture(params=[0, 64 * 1024], ids=["alone", "beside-other-caches"])
def budget(jvm, engine, request):
    """A small shared budget on top of what other caches of this JVM hold right now (plus, in
    the second case, 64 KiB charged as if by other stores, which a full suite run leaves);
    restored after. The stores an earlier test's query left loaded are unloaded first: Spark's
    maintenance would unload them within seconds, during the test, and their caches' bytes
    would leave this cache room beyond the budget (and nothing to evict)."""
    jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()  # restarts with the next query
    budget = engine.CacheBudget
    previous = budget.limitBytes()
    budget.add(request.param)
    budget.configure(budget.usedBytes() + BUDGET)
    yield budget
    budget.add(-request.param)
    budget.configure(previous)


def set_complete(cache, complete: bool) -> None:
    getattr(cache, "complete_$eq")(complete)  # a Scala var's setter


def key(engine, i: int):
    return engine.Bytes(i.to_bytes(4, "big") + b"key-%06d" % i)


def test_write_buffer_keeps_the_last_write_logs_every_write_and_copies_for_iterators(engine):
    buffer = engine.WriteBuffer(8, 201600)
    buffer.put(key(engine, 1), b"\x01a", changelog.OP_PUT_NEW)
    buffer.put(key(engine, 1), b"\x01b", changelog.OP_PUT_EXISTING)
    buffer.delete(key(engine, 2), changelog.OP_DELETE)
    buffer.delete(key(engine, 3), 0)  # known absent: kept as the version's view, not logged
    snapshot = buffer.snapshot()
    buffer.put(key(engine, 4), b"\x01c", changelog.OP_PUT)
    assert buffer.size() == 4 and len(snapshot) == 3
    assert bytes(buffer.lookup(key(engine, 1))) == b"\x01b"
    assert len(buffer.lookup(key(engine, 2))) == 0  # the tombstone
    assert [buffer.presence(key(engine, i)) for i in (1, 2, 9)] == [2, 1, 0]  # present, deleted, missing
    assert buffer.lookup(key(engine, 9)) is None
    assert (buffer.keyDelta(), buffer.unknownOps(), buffer.recordCount()) == (1, 2, 4)
    log = changelog.decode(to_bytes(buffer.finish().format1()), "buffer")
    assert log.version == 8 and [r.op for r in log.records()] == [
        changelog.OP_PUT_NEW, changelog.OP_PUT_EXISTING, changelog.OP_DELETE, changelog.OP_PUT]


def test_cache_stays_within_budget_and_never_answers_absent_for_a_present_key(engine, budget):
    cache = engine.NearCache(0.01)
    set_complete(cache, True)  # as after loading an empty version
    try:
        for i in range(500):  # ~130 bytes each: about 4x the budget
            cache.put(key(engine, i), b"\x01" + b"v" * 20)
            assert budget.usedBytes() <= budget.limitBytes()
        counters = cache.takeCounters()
        assert counters.evictions() > 0 and not cache.complete()
        assert cache.sizeBytes() <= BUDGET
        for i in range(500):  # evicted or not, a key that is there is never "absent"
            found = cache.lookup(key(engine, i))
            assert found is None or len(found) > 0
        answers = [cache.lookup(key(engine, i)) for i in range(500, 1000)]
        absent = sum(1 for a in answers if a is not None and len(a) == 0)
        assert absent > 450  # the Bloom filter answers most new keys without a read (fpp 1%)
    finally:
        cache.clear()


def test_commit_classifies_puts_by_what_the_cache_knows(engine, budget):
    cache = engine.NearCache(0.01)
    set_complete(cache, True)
    try:
        cache.put(key(engine, 1), b"\x01old")
        assert cache.commitWrite(key(engine, 1), b"\x01new") == changelog.OP_PUT_EXISTING
        assert cache.commitWrite(key(engine, 2), b"\x01new") == changelog.OP_PUT_NEW
        set_complete(cache, False)  # partial, no Bloom filter: existence unknown
        assert cache.commitWrite(key(engine, 4), b"\x01v") == changelog.OP_PUT
    finally:
        cache.clear()


def test_committed_deletes_are_logged_by_what_was_known(spark, tmp_path):
    layer = LayerStore(spark, tmp_path / "state")
    try:
        v0 = layer.store(0)
        for k in (1, 2):
            layer.put(v0, (k,), (k,))
        v0.commit()
        v1 = layer.store(1)
        v1.remove(layer.key(1), "default")  # existed
        v1.remove(layer.key(9), "default")  # never existed: the complete cache knows, nothing logged
        v1.commit()
        path = next(tmp_path.rglob("2.ks-changelog"))
        ops = [r.op for r in changelog.decode(path.read_bytes(), str(path)).records()]
        assert ops == [changelog.OP_DELETE_EXISTING]
        assert layer.store(2).metrics().numKeys() == 1
    finally:
        layer.close()


@pytest.mark.parametrize("op,existed,settled", [
    (changelog.OP_PUT, True, changelog.OP_PUT_EXISTING), (changelog.OP_PUT, False, changelog.OP_PUT_NEW),
    (changelog.OP_DELETE, True, changelog.OP_DELETE_EXISTING), (changelog.OP_DELETE, False, 0),
    (changelog.OP_PUT_NEW, False, changelog.OP_PUT_NEW), (changelog.OP_PUT, None, changelog.OP_PUT)])
def test_what_a_read_learnt_settles_an_unknown_op(jvm, op, existed, settled):
    known = None if existed is None else jvm.java.lang.Boolean.valueOf(existed)
    assert jvm.io.keyedstate.format.ChangelogFormat.settle(op, known) == settled


def test_key_filter_grows_in_stages_and_never_forgets_a_key(engine):
    keys = [b"key-%06d" % i for i in range(3000)]
    others = [b"other-%06d" % i for i in range(3000)]
    # Each key's twin under a polynomial hash (Arrays.hashCode): its last two bytes (a, b) become
    # (a + 1, b - 31). The filter takes a key's index hash, so that hash must tell them apart.
    twins = [k[:-2] + bytes([k[-2] + 1, k[-1] - 31]) for k in keys]
    hash_of = {k: engine.Bytes.hashOf(k) for k in keys + others + twins}
    bloom = engine.KeyFilter(200, 0.01)
    grown = [bloom.add(hash_of[k], 1 << 40) for k in keys]
    assert bloom.stageCount() == 4  # 200 + 400 + 800 keys, then a stage for 1,600
    assert sum(1 for g in grown if g > 0) == 3  # each new stage reports the bytes it took
    assert all(bloom.mightContain(hash_of[k]) for k in keys)
    for strangers in (others, twins):
        false_positives = sum(1 for k in strangers if bloom.mightContain(hash_of[k]))
        # Stages at 1%, 0.5%, 0.25%, ...: under 2% in all (these keys: 51 and 41 of 3,000); a
        # polynomial hash would let every twin through.
        assert false_positives < 0.02 * len(strangers)


def _stopped_caching(engine, keys: int):
    """A near cache that was complete, took ``keys`` written keys, then saw 1,200 reads that found
    nothing: it no longer caches writes, and a Bloom filter over those keys answers for them."""
    cache = engine.NearCache(0.01)
    set_complete(cache, True)  # as after loading an empty version
    for i in range(keys):
        cache.commitWrite(key(engine, i), b"\x01v")
    answers = [cache.lookup(key(engine, i)) for i in range(keys, keys + 1200)]
    assert sum(1 for a in answers if a is not None and len(a) == 0) >= 1100  # absent (a filter may err)
    cache.review()
    return cache


def test_a_store_whose_reads_find_nothing_stops_caching_what_it_writes(engine, budget):
    budget.configure(budget.usedBytes() + 4 * 1024 * 1024)
    cache = _stopped_caching(engine, 1200)
    try:
        assert not cache.admitsWrites() and cache.sizeBytes() == 0 and not cache.complete()
        assert all(cache.lookup(key(engine, i)) is None for i in range(0, 1200, 7))  # unknown, not absent
        # A new key answered absent, then written: logged as new, not cached, known from then on.
        assert len(cache.lookup(key(engine, 5000))) == 0
        assert cache.commitWrite(key(engine, 5000), b"\x01v") == changelog.OP_PUT_NEW
        assert cache.lookup(key(engine, 5000)) is None and cache.sizeBytes() == 0
        # A key read (found) is cached, and so is a later write of it.
        cache.putRead(key(engine, 3), b"\x01v")
        assert cache.commitWrite(key(engine, 3), b"\x01w") == changelog.OP_PUT_EXISTING
        assert bytes(cache.lookup(key(engine, 3))) == b"\x01w"
        # Scanned in since (complete again), a write it does not admit must not be claimed absent.
        set_complete(cache, True)
        assert cache.commitWrite(key(engine, 6000), b"\x01v") == changelog.OP_PUT_NEW
        assert cache.lookup(key(engine, 6000)) is None and not cache.complete()
        # Reads that find keys bring admission back.
        for _ in range(1200):
            cache.lookup(key(engine, 3))
        cache.review()
        assert cache.admitsWrites()
        cache.commitWrite(key(engine, 7000), b"\x01v")
        assert bytes(cache.lookup(key(engine, 7000))) == b"\x01v"
    finally:
        cache.clear()


def test_reads_do_not_refill_the_filter_and_a_full_budget_stops_its_growth(engine, budget):
    cache = _stopped_caching(engine, 1500)  # with a filter for ~16 KiB of budget
    try:
        bloom = cache.bloomBytes()
        assert bloom > 0 and not cache.bloomSaturated()
        found = [key(engine, i) for i in range(1500)]  # one py4j call each, not one per read
        for _ in range(6):  # found by reads: the filter holds these keys already
            for k in found:
                cache.putRead(k, b"\x01v")
        assert cache.bloomBytes() == bloom and not cache.bloomSaturated()
        budget.configure(budget.usedBytes())  # no room left: new keys fill the stage past its size
        for i in range(10_000, 16_000):
            assert cache.commitWrite(key(engine, i), b"\x01v") in (changelog.OP_PUT_NEW, changelog.OP_PUT)
        assert cache.bloomBytes() == bloom and cache.bloomSaturated()
        assert budget.usedBytes() <= budget.limitBytes()
    finally:
        cache.clear()


class _ScanFailingHalfway:
    """Committed reads (py4j callback) whose key scan yields one chunk, then fails, as a disk
    error in the middle of the native scan would."""

    def __init__(self, jvm, first: list[bytes]):
        self.chunk = jvm.io.keyedstate.format.ScanChunk(byte_arrays(jvm, first), byte_arrays(jvm, [b""] * len(first)), True)

    def get(self, key):
        return None

    def getMany(self, keys):  # noqa: N802 (the Java interface's name)
        return None

    def scan(self, prefix, start_after, keys_only):
        if start_after is None:
            return self.chunk
        raise OSError("injected: the disk failed halfway through the scan")

    class Java:
        implements = ["io.keyedstate.engine.CommittedReads"]


def test_a_filter_rebuild_that_fails_halfway_keeps_the_old_filter(spark, engine, jvm, budget):
    """A load rebuilds an outgrown filter by scanning every key; if the scan fails, the task
    fails, and its retry must not find a filter that calls the keys it never saw absent."""
    ensure_callback_server_started(spark.sparkContext._gateway)
    cache = _stopped_caching(engine, 1500)  # a filter over keys 0-1499 answers for them
    try:
        first = [i.to_bytes(4, "big") + b"key-%06d" % i for i in range(10)]
        with pytest.raises(Py4JJavaError, match="halfway"):
            engine.CacheWarmer.indexKeys(cache, _ScanFailingHalfway(jvm, first), 1500)
        answers = [cache.lookup(key(engine, i)) for i in range(1500)]
        assert [i for i, a in enumerate(answers) if a is not None and len(a) == 0] == []  # none "absent"
    finally:
        cache.clear()
