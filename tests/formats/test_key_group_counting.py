"""Counting keys by key group (FORMATS.md, "Key-group counts"): the one counter, the unknown
keys asked of a real RocksDB, and the counts written beside a snapshot."""
from collections import Counter

import pytest

from keyedstate.formats import changelog as cl
from keyedstate.formats import keygroups, rocksdb


def key(group: int, name: bytes) -> bytes:
    return keygroups.prefix(group) + name


def test_count_key_groups_adds_by_key_group_and_skips_keys_shorter_than_the_prefix():
    counts = Counter({7: 5})
    keys = [key(7, b"a"), key(7, b"b"), key(3, b""), key(2**30 - 1, b"x"), b"", b"\x00", b"\x00\x00\x07"]
    keygroups.count_key_groups(counts, keys, -1)
    assert counts == Counter({7: 3, 3: -1, 2**30 - 1: -1})
    keygroups.count_key_groups(counts, iter(keys))  # any iterable; +1 by default
    assert {g: n for g, n in counts.items() if n} == {7: 5}
    assert len(keys) == 7  # the keys are left as they were


@pytest.fixture
def db(tmp_path):
    d = rocksdb.open_db(tmp_path / "db", bulk_load=False)
    yield d
    d.close()


def test_count_unknown_counts_changed_keys_and_skips_short_ones_by_key_group(db, monkeypatch):
    """Puts of absent keys add, deletes of present keys take away, the others change nothing;
    keys shorter than the 4-byte prefix change the delta but no key group's count."""
    monkeypatch.setattr(rocksdb, "MULTI_GET_KEYS", 3)  # the answers of several multi-gets
    present = [key(g % 4, b"p%d" % g) for g in range(10)] + [b"ab", b"\0\0\0\1", b"cd"]
    for k in present:
        db[k] = b"v"
    absent = [key(g % 4, b"a%d" % g) for g in range(7)] + [b"", b"xyz"]
    records = [(cl.OP_PUT, k, b"w") for k in present[:6] + absent[:5] + [b"", b"cd"]]
    records += [(cl.OP_DELETE, k, None) for k in present[6:9] + [b"ab", b"\0\0\0\1"] + absent[5:]]
    log_ = cl.decode(cl.encode(1, 4, records), "mem")
    fed = log_.feed(lambda *_: None, lambda *_: None)
    counts = Counter({0: 10, 1: 10, 2: 10, 3: 10})
    assert rocksdb.count_unknown(db, fed, counts) == (5 + 1) - (3 + 2)
    # +absent[:5] (groups 0, 1, 2, 3, 0), -present[6:9] (groups 2, 3, 0), -b"\0\0\0\1" (group 1, a
    # key of exactly the prefix); b"" added and b"ab" taken count in the delta only.
    assert counts == Counter({0: 11, 1: 10, 2: 10, 3: 10})
    assert rocksdb.count_unknown(db, fed, None) == 1  # nothing was written: the same answers


@pytest.mark.parametrize("counts, written", [({1: 2, 5: 1}, True), ({1: 2, 5: 0, 7: 1}, True),
                                             ({1: 2}, False), ({1: 4, 5: -1}, False)])
def test_counts_are_written_beside_a_snapshot_only_when_they_add_up_to_its_keys(tmp_path, caplog, counts, written):
    """FORMATS.md, "Key-group counts": counts that disagree with the snapshot's key count, or hold
    a negative count, are left out (logged), and the snapshot goes without them."""
    from keyedstate.formats import key_group_counts as kgc

    assert kgc.write_beside(tmp_path, counts, 8, 3, "version 4") is None
    assert (tmp_path / kgc.NAME).is_file() == written
    assert ("version 4" in caplog.text and "do not add up to its 3 keys" in caplog.text) == (not written)
    if written:
        assert kgc.decode((tmp_path / kgc.NAME).read_bytes(), "beside") == (8, {g: n for g, n in counts.items() if n})
