"""Counting keys by key group (FORMATS.md, "Key-group counts"): the one counter, the unknown
keys asked of a real RocksDB, the offline replay of a changelog into one, and the counts written
beside a snapshot."""
import zlib
from collections import Counter

import pytest

from keyedstate.formats import changelog as cl
from keyedstate.formats import keygroups, rocksdb


def key(group: int, name: bytes) -> bytes:
    return keygroups.prefix(group) + name


def held(db) -> dict[bytes, bytes]:
    return dict(db.items())


def by_group(keys) -> dict[int, int]:
    out: dict[int, int] = {}
    for k in keys:
        out[keygroups.key_group_of_stored_key(k)] = out.get(keygroups.key_group_of_stored_key(k), 0) + 1
    return out


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


def test_a_from_empty_changelog_replaces_the_db_and_its_counts(db):
    """A version written from empty is a base: what the db held goes, and the counts are its
    keys' (puts and deletes of unknown keys asked of the emptied db, not of what it held)."""
    for g in range(6):
        db[key(g, b"old")] = b"v"
    counts = Counter(by_group(held(db)))
    records = [(cl.OP_PUT, key(0, b"old"), b"n"), (cl.OP_PUT, key(1, b"new"), b"n"),
               (cl.OP_PUT_NEW, key(2, b"new"), b"n"), (cl.OP_DELETE, key(3, b"old"), None),
               (cl.OP_DELETE, key(4, b"gone"), None), (cl.OP_PUT, b"ab", b"short")]
    log_ = cl.decode(cl.compress(cl.encode(2, 8, records), {cl.FROM_EMPTY: True}, cl.CODEC_NONE), "mem")
    rocksdb.write_changelog(db, log_, counts)
    assert held(db) == {key(0, b"old"): b"n", key(1, b"new"): b"n", key(2, b"new"): b"n", b"ab": b"short"}
    assert {g: n for g, n in counts.items() if n} == {0: 1, 1: 1, 2: 1}


@pytest.mark.parametrize("from_empty", [True, False])
@pytest.mark.parametrize("with_counts", [True, False])
@pytest.mark.parametrize("damage", ["records cut", "trailer count"])
def test_a_changelog_that_is_not_whole_leaves_the_db_untouched(db, monkeypatch, from_empty, with_counts, damage):
    """Nothing is written before the changelog is known whole: not even a from-empty changelog's
    range delete, which would empty the db; nor are the counts changed, though feed adds to them
    as its keys wait. The framing and CRC-32 hold; the records end before the trailer's count (a
    writer cut off and framed anyway) or run past it."""
    monkeypatch.setattr(cl, "_COUNT_BATCH", 2)
    before = {key(g, b"k%d" % g): b"v" for g in range(8)}
    for k, v in before.items():
        db[k] = v
    records = [(cl.OP_PUT_NEW, key(g, b"n%d" % g), b"n") for g in range(8)]
    records += [(cl.OP_DELETE, key(1, b"k1"), None)]
    body = cl.encode(2, 8, records)
    cut = body[:-cl.TRAILER.size]
    if damage == "records cut":
        cut = cut[:-len(cl.encode_record(*records[-1]))]
        count = len(records)
    else:
        count = len(records) - 1
    inner = cut + cl.TRAILER.pack(cl.END, count, zlib.crc32(cut))
    log_ = cl.decode(cl.compress(inner, {cl.FROM_EMPTY: True} if from_empty else {}), "2.ks-changelog")
    assert (log_.meta.get(cl.FROM_EMPTY) is True) == from_empty
    counts = Counter(by_group(before)) if with_counts else None
    with pytest.raises(cl.CorruptChangelogError, match="2.ks-changelog holds .* records but its trailer says"):
        rocksdb.write_changelog(db, log_, counts)
    assert held(db) == before
    if with_counts:
        assert counts == Counter(by_group(before))


def _entries_of(counts: dict[int, int], key_groups: int) -> bytes:
    from keyedstate.formats import key_group_counts as kgc

    return kgc._encoded_entries_slowly(counts, key_groups)[0]


@pytest.mark.parametrize("seed", range(6))
def test_the_vectorised_codec_gives_the_byte_loops_bytes_and_counts(seed):
    """Counts of every varint width (1-9 bytes) and key groups up to 2^32 - 1: encode's bytes
    are the byte loop's, and decode gives back the counts."""
    import random

    from keyedstate.formats import key_group_counts as kgc

    rng = random.Random(seed)
    key_groups = rng.choice([8, 201_600, 2**32 - 1])
    counts = {rng.randrange(key_groups): rng.choice([1, 127, 128, 2**14, 2**21 + 5, 2**35])
              for _ in range(rng.randrange(1, 3000))}
    counts[rng.randrange(key_groups)] = 2**62 + 3  # 9 bytes; the total stays below 2^63
    counts[rng.randrange(key_groups)] = 0  # left out
    data = kgc.encode(counts, key_groups)
    held = {g: c for g, c in counts.items() if c}
    assert data[kgc._HEAD.size:-4] == _entries_of(held, key_groups)
    assert kgc.decode(data, "mem") == (key_groups, held)


def _file(entries: bytes, n: int, total: int, key_groups: int = 100) -> bytes:
    from keyedstate.formats import key_group_counts as kgc

    body = kgc._HEAD.pack(kgc.MAGIC, kgc.FORMAT_VERSION, key_groups, total, n) + entries
    return body + kgc._CRC.pack(zlib.crc32(body))


@pytest.mark.parametrize("entries,n,total,error", [
    (bytes([3, 2, 0, 1]), 2, 3, "entry 1 has delta 0"),
    (bytes([3, 0]), 1, 0, "entry 0 has delta 3 and count 0"),
    (bytes([3, 2, 97, 1]), 2, 3, "key group 100 is not below 100"),
    (bytes([3, 2, 1]), 2, 3, "entries run past the end"),
    (bytes([3, 2, 0x81]), 1, 2, "1 bytes after the last entry"),
    (bytes([3, 2, 1, 1, 5]), 2, 3, "1 bytes after the last entry"),
    (bytes([3, 2, 1, 1]), 2, 4, "counts sum to 3, the header says 4"),
    (bytes([3]) + bytes([0xFF] * 9) + bytes([0x7F]), 1, 1, "out of range"),
    (bytes([3]) + bytes([0x80] * 10) + bytes([1]), 1, 1, "longer than 9 bytes"),
    (bytes([]), 1, 0, "entries run past the end"),
    (bytes([3, 2]), 0, 0, "2 bytes after the last entry"),
])
def test_entries_against_the_spec_are_refused_by_name(entries, n, total, error):
    """What the vectorised decoder does not take goes to the byte loop, whose error names it."""
    from keyedstate.formats import key_group_counts as kgc

    with pytest.raises(kgc.CorruptKeyGroupCountsError, match=error):
        kgc.decode(_file(entries, n, total), "mem")


def test_a_ten_byte_varint_below_two_to_the_63_is_read_as_the_spec_allows_no_more():
    """Both paths agree on the edge: a 9-byte varint is read; the byte loop also takes a 10th
    byte of 0 (the value is still below 2^63)."""
    from keyedstate.formats import key_group_counts as kgc

    nine = bytes([0xFF] * 8 + [0x7F])  # 2^63 - 1
    assert kgc.decode(_file(bytes([3]) + nine, 1, 2**63 - 1), "mem") == (100, {3: 2**63 - 1})
    ten = bytes([0x81] + [0x80] * 8 + [0x00])  # 1, in 10 bytes
    assert kgc.decode(_file(bytes([3]) + ten, 1, 1), "mem") == (100, {3: 1})


def test_counts_that_are_not_integers_are_refused_as_the_byte_loop_refuses_them():
    from keyedstate.formats import key_group_counts as kgc

    for counts in ({3: 1.5}, {3.0: 2}):
        with pytest.raises(TypeError):
            kgc.encode(counts, 100)
