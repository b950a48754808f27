"""BytesMap, the paged hash map under the near cache and the write buffer, against a dict:
random puts (same and changed value sizes), tombstones, removes, reads, page drops (the near
cache's eviction) and compactions, on pages small enough that records fill hundreds of them."""
from __future__ import annotations

import random

import pytest


@pytest.fixture
def engine(jvm):
    return jvm.io.keyedstate.engine


def java_hash(key: bytes) -> int:
    """java.util.Arrays.hashCode(byte[]), computed here: one py4j round trip fewer per operation."""
    h = 1
    for b in key:
        h = (31 * h + (b - 256 if b > 127 else b)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def listed(bmap) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for pair in bmap.toArray():
        key = bytes(pair._1())
        assert key not in out, f"{key!r} is listed twice"
        out[key] = bytes(pair._2())
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_bytes_map_behaves_like_a_dict(engine, jvm, seed):
    rng = random.Random(seed)
    # Pages of 1 KiB; seed 3 also starts with an index sized for 500 keys (the write buffer's hint).
    bmap = engine.BytesMap(1024) if seed < 3 else engine.BytesMap(1024, 500)
    model: dict[bytes, bytes] = {}
    keys = [b"k%d" % i * rng.randint(1, 3) for i in range(300)]
    dropped = 0
    for _ in range(3000):
        key = rng.choice(keys)
        h = java_hash(key)
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
    assert all(java_hash(k) == jvm.java.util.Arrays.hashCode(k) for k in keys[:50] + [bytes(range(256))])


def test_a_dropped_page_keeps_what_was_read_since_it_was_written(engine, jvm):
    bmap = engine.BytesMap(1024)
    keys = [b"key-%04d" % i for i in range(200)]  # ~30 bytes each: ~34 per page
    for k in keys:
        bmap.put(k, jvm.java.util.Arrays.hashCode(k), b"v" * 8)
    hot = keys[:5]
    for k in hot:
        bmap.get(k, jvm.java.util.Arrays.hashCode(k))
    dropped = bmap.dropOldestPage()
    left = listed(bmap)
    assert dropped > 20 and all(k in left for k in hot)
    assert len(left) == 200 - dropped
    bmap.dropOldestPage()  # the hot keys moved to the newest page, not the next oldest
    assert all(k in listed(bmap) for k in hot)
