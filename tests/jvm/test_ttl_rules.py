"""TTL as a policy plus an injected clock, exercised through the provider contract: expiry,
visibility, refresh on read, and the write time every value carries."""
from __future__ import annotations

import pytest

from keyedstate.formats import stored

from support.constants import PFX
from support.jvm import LayerStore, custom_metric

HOUR_MS = 3_600_000


@pytest.fixture
def ttl_store(spark, tmp_path, ttl_clock):
    stores = []

    def make(**confs):
        store = LayerStore(spark, tmp_path / f"state{len(stores)}" / "0",
                           confs={PFX + "ttl": "1h", **{PFX + k: v for k, v in confs.items()}})
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


def commit(layer, version, *writes):
    s = layer.store(version)
    for k, v in writes:
        layer.put(s, (k,), (v,))
    return s.commit()


def test_an_entry_expires_once_its_ttl_passes(ttl_store, ttl_clock):
    layer = ttl_store()
    commit(layer, 0, (1, 10), (2, 20))
    ttl_clock.advance(1800)
    commit(layer, 1, (2, 21))  # rewritten: its TTL starts again
    ttl_clock.advance(1800)  # key 1 is now exactly 1 h old
    s = layer.store(2)
    assert (layer.get(s, 1), layer.get(s, 2)) == (None, 21)
    assert sum(1 for _ in iter_rows(s)) == 1  # scans hide it too
    assert custom_metric(s, "keyedstateTtlExpired") >= 1


def test_return_expired_until_cleanup(ttl_store, ttl_clock):
    layer = ttl_store(**{"ttl.visibility": "ReturnExpiredIfNotCleanedUp"})
    commit(layer, 0, (1, 10))
    ttl_clock.advance(7200)
    assert layer.get(layer.store(1), 1) == 10


def test_on_read_and_write_a_read_refreshes_the_entry(ttl_store, ttl_clock):
    layer = ttl_store(**{"ttl.updateType": "OnReadAndWrite"})
    commit(layer, 0, (1, 10), (2, 20))
    ttl_clock.advance(2400)
    s = layer.store(1)
    assert layer.get(s, 1) == 10  # read: refreshed, written again in this version
    s.commit()
    ttl_clock.advance(2400)  # 80 min after the first write, 40 after the read
    s = layer.store(2)
    assert (layer.get(s, 1), layer.get(s, 2)) == (10, None)


def test_values_carry_their_write_time(jvm, ttl_store, ttl_clock, tmp_path):
    layer = ttl_store()
    commit(layer, 0, (1, 10))
    codec_value = jvm.io.keyedstate.format.KeyCodec
    path = next((tmp_path / "state0").rglob("1.ks-changelog"))
    raw = jvm.io.keyedstate.format.ChangelogFormat.read(bytearray(path.read_bytes()), str(path)).iterator().next()
    assert codec_value.writtenAt(raw.value()) == stored.written_at(bytes(raw.value())) == ttl_clock.now_ms


def iter_rows(store):
    it = store.iterator("default")
    while it.hasNext():
        yield it.next()
