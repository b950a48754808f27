"""BytesMap, the paged hash map under the near cache and the write buffer, against a dict:
random puts (same and changed value sizes), tombstones, removes, reads, page drops (the near
cache's eviction) and compactions, on pages small enough that records fill hundreds of them."""
from __future__ import annotations

import random

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import IllegalArgumentException
from pyspark.java_gateway import ensure_callback_server_started


@pytest.fixture
def engine(jvm):
    return jvm.io.keyedstate.engine


def hashes(engine, keys) -> dict[bytes, int]:
    """The index's hash of each key (Bytes.hashOf, Murmur3), asked once per key: a page drop and a
    compaction rehash the keys where they lie, so the map must be given this one."""
    return {k: engine.Bytes.hashOf(k) for k in set(keys)}


def listed(bmap) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for pair in bmap.toArray():
        key = bytes(pair._1())
        assert key not in out, f"{key!r} is listed twice"
        out[key] = bytes(pair._2())
    return out


@pytest.mark.parametrize("seed,chunk_bits", [(1, 15), (2, 15), (3, 15), (1, 4), (3, 4), (2, 6)])
def test_bytes_map_behaves_like_a_dict(engine, jvm, seed, chunk_bits):
    rng = random.Random(seed)
    # Pages of 1 KiB; seed 3 also starts with an index sized for 500 keys (the write buffer's hint).
    # The index is kept in chunks of 2^15 slots; 2^4 makes probes, deletes' backward shifts and
    # resizes cross chunk boundaries and wrap around the table's end, 2^6 starts at one full chunk.
    bmap = engine.BytesMap(1024, 500 if seed == 3 else 0, chunk_bits)
    model: dict[bytes, bytes] = {}
    keys = [b"k%d" % i * rng.randint(1, 3) for i in range(300)]
    hash_of = hashes(engine, keys)
    dropped = 0
    for _ in range(3000):
        key = rng.choice(keys)
        h = hash_of[key]
        r = rng.random()
        if r < 0.55:
            value = bytes(rng.randrange(256) for _ in range(rng.choice([4, 4, 4, 9, 40])))
            assert bmap.put(key, h, value) == (key in model)
            model[key] = value
        elif r < 0.62:  # an empty value (tombstones need the JVM's instance: test_cache_and_buffer)
            assert bmap.put(key, h, b"") == (key in model)
            model[key] = b""
        elif r < 0.8:
            assert bmap.remove(key, h) == (key in model)
            model.pop(key, None)
        elif r < 0.99:
            got = bmap.get(key, h)
            assert (None if got is None else bytes(got)) == model.get(key)
            assert bmap.presence(key, h) == (2 if key in model else 0)
        elif r < 0.995:
            bmap.compact()
            assert listed(bmap) == model
        else:
            bmap.dropOldestPage()
            left = listed(bmap)
            assert all(model[k] == v for k, v in left.items())  # a drop only removes
            dropped += len(model) - len(left)
            model = left
        assert bmap.size() == len(model)
    assert listed(bmap) == model
    assert dropped > 0
    assert bmap.liveBytes() <= bmap.memoryBytes()
    assert all(hash_of[k] == engine.Bytes(k).hashCode() for k in keys[:50])


def test_a_dropped_page_keeps_what_was_read_since_it_was_written(engine, jvm):
    bmap = engine.BytesMap(1024)
    keys = [b"key-%04d" % i for i in range(200)]  # ~30 bytes each: ~34 per page
    hash_of = hashes(engine, keys)
    for k in keys:
        bmap.put(k, hash_of[k], b"v" * 8)
    hot = keys[:5]
    for k in hot:
        bmap.get(k, hash_of[k])
    dropped = bmap.dropOldestPage()
    left = listed(bmap)
    assert dropped > 20 and all(k in left for k in hot)
    assert len(left) == 200 - dropped
    bmap.dropOldestPage()  # the hot keys moved to the newest page, not the next oldest
    assert all(k in listed(bmap) for k in hot)


def test_a_key_hashes_alike_where_it_lies_in_a_page_and_as_its_own_array(engine):
    """A page drop or a compaction finds a record's slot by hashing the key in the page: that hash
    must be the one its own array got (every length mod 4, any offset), and a range outside the
    array is refused, not read."""
    page = bytes(range(7, 40))
    for length in range(14):
        for offset in range(10):
            key = page[offset:offset + length]
            assert engine.Bytes.hashOf(page, offset, length) == engine.Bytes.hashOf(key) == engine.Bytes(key).hashCode()
    assert len({engine.Bytes.hashOf(page[:n]) for n in range(14)}) == 14
    with pytest.raises(Py4JJavaError, match="IndexOutOfBounds"):
        engine.Bytes.hashOf(page, 30, 10)


class _Collect:
    """A Scala `Int => Unit` (py4j callback) that keeps what it is given: `foreachHash` calls its
    specialized `apply$mcVI$sp`, set below (not a Python name)."""

    def __init__(self):
        self.seen: list[int] = []

    def apply(self, value):
        self.seen.append(int(value))

    class Java:
        implements = ["scala.Function1"]


setattr(_Collect, "apply$mcVI$sp", _Collect.apply)


@pytest.mark.parametrize("chunk_bits", [15, 4])
def test_the_index_hashes_are_those_of_the_live_keys_after_drops_and_compactions(spark, engine, chunk_bits):
    """A cache that stops holding every key fills its filter from these hashes instead of its
    keys, so they must be every live key's, after removes, page drops and compactions (over an
    index of one chunk and of many)."""
    ensure_callback_server_started(spark.sparkContext._gateway)
    rng = random.Random(4)
    bmap = engine.BytesMap(1024, 0, chunk_bits)
    keys = [b"k%d" % i * rng.randint(1, 3) for i in range(400)]
    hash_of = hashes(engine, keys)
    live: set[bytes] = set()
    for step in range(1500):
        key = rng.choice(keys)
        if rng.random() < 0.7:
            bmap.put(key, hash_of[key], b"v" * rng.choice([4, 12]))
            live.add(key)
        elif bmap.remove(key, hash_of[key]):
            live.discard(key)
        if step % 400 == 399:
            bmap.dropOldestPage()
            live = set(listed(bmap))
        elif step % 400 == 199:
            bmap.compact()
    collect = _Collect()
    bmap.foreachHash(collect)
    assert live and sorted(collect.seen) == sorted(hash_of[k] for k in live)


def test_no_index_array_is_a_g1_humongous_object(engine):
    """G1 allocates an array of half a region or more (512 KiB at its smallest region) as a
    humongous object, rounded up to whole regions: as two flat arrays, a 250k-key map's index
    (524,288 slots) took three 4 MiB regions for 6 MiB. In chunks of 32,768 slots no array of
    it reaches 512 KiB, and its size is still counted whole."""
    sized = engine.BytesMap(4096, 250_000)  # sized at the first insert: 524,288 slots
    sized.put(b"k", engine.Bytes.hashOf(b"k"), b"x")
    chunks = list(sized.indexChunkSlots())
    assert chunks == [32_768] * 16
    assert max(chunks) * 8 < 512 * 1024  # the addresses' chunks (longs); the hashes' are ints
    assert sized.memoryBytes() == 4096 + 524_288 * 12
    assert bytes(sized.get(b"k", engine.Bytes.hashOf(b"k"))) == b"x"
    assert list(engine.BytesMap(1024).indexChunkSlots()) == [64]  # a new map: one small chunk
    with pytest.raises(IllegalArgumentException, match="index chunks of 2.16 slots"):
        engine.BytesMap(1024, 0, 16)  # 512 KiB chunks would be humongous
