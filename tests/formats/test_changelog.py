"""Changelog framing: round trips, and refusal of foreign, truncated or corrupt files."""
import mmap

import pytest

from keyedstate.formats import changelog as cl
from keyedstate.offline import routing
from support.golden import GOLDEN


def sample():
    return cl.encode(7, 128, [(cl.OP_PUT, b"\x00\x00\x00\x01k1", b"\x01v1"),
                              (cl.OP_DELETE, b"\x00\x00\x00\x02k2", None),
                              (cl.OP_PUT, b"\x00\x00\x00\x03k3", b"")])


def test_round_trip():
    log = cl.decode(sample(), "mem")
    assert (log.version, log.key_groups, log.record_count) == (7, 128, 3)
    assert list(log.records()) == [(cl.OP_PUT, b"\x00\x00\x00\x01k1", b"\x01v1"),
                                   (cl.OP_DELETE, b"\x00\x00\x00\x02k2", None),
                                   (cl.OP_PUT, b"\x00\x00\x00\x03k3", b"")]


@pytest.mark.parametrize("cut", [1, 5, 13, 20])
def test_truncated_file_is_rejected_with_its_name(cut):
    data = sample()
    with pytest.raises(cl.CorruptChangelogError, match="/ckpt/3.ks-changelog"):
        cl.decode(data[:-cut], "/ckpt/3.ks-changelog")


def test_flipped_byte_fails_the_checksum():
    data = bytearray(sample())
    data[30] ^= 0x40
    with pytest.raises(cl.CorruptChangelogError, match="CRC"):
        cl.decode(bytes(data), "x")


def test_foreign_file_is_named_as_foreign():
    with pytest.raises(cl.CorruptChangelogError, match="not a keyedstate changelog"):
        cl.decode(b"\x00\x00\x00\x10some HDFS delta bytes", "/ckpt/1.delta")


def test_empty_version_round_trips():
    log = cl.decode(cl.encode(1, 5, []), "x")
    assert log.record_count == 0 and list(log.records()) == []


def _history(known: bool, seed: int = 3):
    """Three versions of random puts/deletes over 60 keys in 12 key groups, with the ops the
    JVM writes (existence known) or the ones it writes when it does not know."""
    import random

    rnd = random.Random(seed)
    live: set[bytes] = set()
    logs = []
    for version in (1, 2, 3):
        before = set(live)  # a version's ops are relative to the version before it
        records = {}
        for _ in range(40):
            key = (rnd.randrange(12)).to_bytes(4, "big") + bytes([rnd.randrange(5)])
            if rnd.random() < 0.7:
                records[key] = (cl.OP_PUT_EXISTING if key in before else cl.OP_PUT_NEW) if known else cl.OP_PUT
                live.add(key)
            else:
                # the JVM does not log a delete it knows to be of an absent key
                records[key] = (cl.OP_DELETE_EXISTING if key in before else None) if known else cl.OP_DELETE
                live.discard(key)
        encoded = [(op, k, None if op in cl.DELETES else b"v%d" % version) for k, op in records.items() if op]
        logs.append(cl.decode(cl.encode(version, 12, encoded), f"v{version}"))
    return logs


def _replay(logs) -> dict:
    state: dict = {}
    for log in logs:
        for op, key, value in log.records():
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    return state


@pytest.mark.parametrize("known", [True, False], ids=["ops-known", "ops-unknown"])
def test_routing_by_key_group_splits_the_state_exactly(known):
    logs = _history(known)
    final = _replay(logs)
    routed = routing.route_by_key_group(logs, 4, 9, 12)
    for q in range(4):
        data, keys = routed.get(q, (cl.encode(9, 12, []), 0))
        log = cl.decode(data, f"to-{q}")
        assert (log.version, log.key_groups) == (9, 12)
        mine = {k: v for k, v in final.items() if int.from_bytes(k[:4], "big") % 4 == q}
        assert _replay([log]) == mine
        assert keys == len(mine)
        # Every op states the key's existence, so a reader counts without looking up.
        ops = [r.op for r in log.records()]
        assert set(ops) <= {cl.OP_PUT_NEW, cl.OP_PUT_EXISTING, cl.OP_DELETE_EXISTING}
        assert ops.count(cl.OP_PUT_NEW) - ops.count(cl.OP_DELETE_EXISTING) == keys


def test_fixed_width_routing_matches_the_record_by_record_one():
    """Logs whose records share one layout are routed with numpy; same bytes, same counts."""
    import random

    rnd = random.Random(5)
    keys = [rnd.randrange(1000).to_bytes(4, "big") + rnd.randbytes(12) for _ in range(500)]
    first = cl.decode(cl.encode(1, 1000, [(cl.OP_PUT_NEW, k, rnd.randbytes(9)) for k in keys]), "v1")
    second = cl.decode(cl.encode(2, 1000, [(cl.OP_PUT_EXISTING, k, rnd.randbytes(9)) for k in keys[:200]]
                                 + [(cl.OP_PUT_NEW, rnd.randrange(1000).to_bytes(4, "big") + rnd.randbytes(12),
                                     rnd.randbytes(9)) for _ in range(50)]), "v2")
    vectorised = routing._route_fixed_width([first, second], 8, 1000)
    plain = routing._route_known([first, second], 8, 1000)
    assert vectorised is not None
    assert [b"".join(p) for p in vectorised[0]] == [b"".join(p) for p in plain[0]]
    assert vectorised[1:] == plain[1:] and sum(vectorised[2]) == 550
    # One record of another length: the layout check refuses it (the parse would differ).
    odd = cl.decode(cl.encode(3, 1000, [(cl.OP_PUT_NEW, keys[0] + b"x", b"1" * 8), (cl.OP_PUT_NEW, keys[1], b"1" * 9)]), "v3")
    assert routing._route_fixed_width([first, odd], 8, 1000) is None
    assert routing.route_by_key_group([first, odd], 8, 4, 1000) == {
        q: (cl.frame(4, 1000, parts, n), k)
        for q, (parts, n, k) in enumerate(zip(*routing._route_known([first, odd], 8, 1000))) if parts}


@pytest.mark.parametrize("shape", ["fixed-width puts", "fixed-width deletes", "variable", "mixed ops"])
def test_codec_2_round_trips_records_of_every_shape(shape):
    """Codec 2 (key groups apart) gives back every record, whichever join reads it back: numpy's
    for one record layout, the boundary walk for the rest (whose insertion goes a chunk of
    records at a time: more than two chunks here)."""
    import random

    rnd = random.Random(shape)
    records = []
    for i in range(2 * cl._INSERT_CHUNK + 7):
        group = rnd.randrange(1 << 32).to_bytes(4, "big")
        if shape == "fixed-width puts":
            records.append((rnd.choice([cl.OP_PUT_NEW, cl.OP_PUT_EXISTING]), group + b"k%05d" % i, b"v" * 9))
        elif shape == "fixed-width deletes":
            records.append((cl.OP_DELETE_EXISTING, group + b"k%05d" % i, None))
        else:
            key = group + bytes(rnd.randrange(256) for _ in range(rnd.randrange(0 if shape == "variable" else 1, 30)))
            op = cl.OP_PUT_NEW if shape == "variable" else rnd.choice(sorted(cl.PUTS | cl.DELETES))
            records.append((op, key, None if op in cl.DELETES else bytes(rnd.randrange(40))))
    inner = cl.encode(9, 1 << 20, records)
    data = cl.compress(inner, {"version": 9, "keyGroups": 1 << 20}, cl.CODEC_ZSTD_SPLIT)
    log = cl.decode(data, "x")
    assert list(log.records()) == records


def test_codec_2_with_key_groups_that_disagree_with_the_records_is_refused():
    import zstandard

    records = [(cl.OP_PUT_NEW, b"\x00\x00\x00\x01k%d" % i, b"v" * i) for i in range(20)]
    data = cl.compress(cl.encode(2, 8, records), {"version": 2, "keyGroups": 8}, cl.CODEC_ZSTD_SPLIT)
    meta_length = cl.HEADER_V2.unpack_from(data, 0)[3]
    head = data[:cl.HEADER_V2.size + meta_length + 4]  # header, metadata and their CRC
    groups, rest = cl._split_key_groups(cl.encode(2, 8, records))
    short = zstandard.ZstdCompressor(write_content_size=True).compress(groups[:-4])  # one group missing
    tampered = head + len(short).to_bytes(4, "big") + short + zstandard.ZstdCompressor().compress(rest)
    with pytest.raises(cl.CorruptChangelogError, match="key groups and records disagree"):
        cl.decode(tampered, "/ck/2.ks-changelog")


def _parse_with_entries(log):
    try:
        return [(r.op, r.key, r.value) for r in log.records()], None
    except cl.CorruptChangelogError as exc:
        return None, str(exc)


def _parse_with_feed(log, per_call, ops_of_records):
    """The records as feed passes them on, ``per_call`` at a time, with the tally checked
    against the ops of what was passed."""
    calls = []
    pos, done = log.first, 0
    try:
        while True:
            fed = log.feed(lambda k, v: calls.append(("put", k, v)), lambda k: calls.append(("delete", k, None)),
                           pos, done, per_call)
            passed = calls[len(calls) - fed.records:] if fed.records else []
            ops = ops_of_records[done:done + fed.records]
            assert fed.key_delta == ops.count(cl.OP_PUT_NEW) - ops.count(cl.OP_DELETE_EXISTING)
            assert fed.deletes == sum(op in cl.DELETES for op in ops)
            assert fed.unknown_puts == [k for (_, k, _), op in zip(passed, ops) if op == cl.OP_PUT]
            assert fed.unknown_deletes == [k for (_, k, _), op in zip(passed, ops) if op == cl.OP_DELETE]
            pos, done = fed.end, done + fed.records
            if pos >= log.end:
                break
    except cl.CorruptChangelogError as exc:
        return None, str(exc)
    return calls, None


def _variants():
    """A payload of every op, and ways to break it: each truncation, a length that overruns,
    an unknown op, a trailer count that disagrees."""
    records = [(cl.OP_PUT, b"\x00\x00\x00\x01k1", b"v1"), (cl.OP_PUT_NEW, b"\x00\x00\x00\x02k2", b""),
               (cl.OP_PUT_EXISTING, b"\x00\x00\x00\x03k3", b"v333"), (cl.OP_DELETE, b"\x00\x00\x00\x04k4", None),
               (cl.OP_DELETE_EXISTING, b"\x00\x00\x00\x05k5", None), (cl.OP_PUT_NEW, b"", b"v6")]
    payload = b"".join(cl.encode_record(*r) for r in records)
    out = [(payload, len(records)), (payload, len(records) + 1), (payload, len(records) - 1)]
    out += [(payload[:cut], len(records)) for cut in range(len(payload))]
    for at in range(len(payload)):
        broken = bytearray(payload)
        broken[at] ^= 0x80
        out.append((bytes(broken), len(records)))
    return [(p, n, records) for p, n in out]


@pytest.mark.parametrize("per_call", [None, 1, 2, 4])
def test_the_servers_parser_agrees_with_the_tools_parser_on_every_input(per_call):
    """``feed`` (the state server's apply) and ``entries`` (the offline tools) must take the
    same records from a valid payload and refuse a broken one with the same message: one byte
    format, two parsers, never two verdicts."""
    for payload, count, records in _variants():
        log = cl.Changelog(1, 16, count, payload, "/ckpt/1.ks-changelog")
        expected, error = _parse_with_entries(log)
        got, got_error = _parse_with_feed(log, per_call, [r[0] for r in (expected or records)])
        if error is None:
            assert got_error is None and got == [("put" if v is not None else "delete", k, v) for _, k, v in expected]
        else:
            assert got is None and got_error == error, payload.hex()


def _in_a_mapping(payload: bytes, head: int = 7, tail: int = 5) -> tuple[mmap.mmap, int, int]:
    """``payload`` inside an anonymous mapping, between bytes no parser may read (op 0xFF, and
    lengths that would overrun): as the state server receives a large frame."""
    mapping = mmap.mmap(-1, head + len(payload) + tail, flags=mmap.MAP_PRIVATE)
    mapping[:head] = b"\xff" * head
    mapping[head:head + len(payload)] = payload
    mapping[head + len(payload):] = b"\x01" * tail
    return mapping, head, head + len(payload)


@pytest.mark.parametrize("per_call", [None, 2])
def test_records_read_in_place_from_a_mapping_parse_as_their_copy(per_call):
    """The state server reads a large shipped frame's records where they were received
    (``payload[first:end]`` of a mapping, whose slices are bytes): both parsers take the same
    records as from a copy, and refuse what they refuse, never reading outside the bounds."""
    for payload, count, records in _variants():
        copy = cl.Changelog(1, 16, count, payload, "/ckpt/1.ks-changelog")
        mapping, first, end = _in_a_mapping(payload)
        log = cl.Changelog(1, 16, count, mapping, "/ckpt/1.ks-changelog", first=first, end=end)
        expected, error = _parse_with_entries(copy)
        got, got_error = _parse_with_entries(log)
        fed, fed_error = _parse_with_feed(log, per_call, [r[0] for r in (expected or records)])
        if error is None:
            assert (got_error, fed_error) == (None, None) and got == expected
            assert fed == [("put" if v is not None else "delete", k, v) for _, k, v in expected]
        else:  # the same verdict, in the same words (a byte offset counts from the first record)
            assert got is None and fed is None and got_error == fed_error == error, payload.hex()


def test_decode_reads_a_format_1_changelog_in_place_and_gives_back_what_was_applied():
    records = [(cl.OP_PUT_NEW, b"\x00\x00\x00\x01" + b"%08d" % i, b"v%030d" % i) for i in range(2_000)]
    data = cl.encode(3, 16, records)
    mapping = mmap.mmap(-1, 2 + len(data), flags=mmap.MAP_PRIVATE)
    mapping[2:] = data
    log = cl.decode(mapping, "frame", offset=2)
    assert log.payload is mapping  # not copied
    assert (log.version, log.first, log.end) == (3, 2 + cl.HEADER.size, 2 + len(data) - cl.TRAILER.size)
    assert list(log.records()) == list(cl.decode(data, "bytes").records())
    assert isinstance(cl.decode(bytearray(data), "frame").payload, bytes)  # a bytearray is copied out
    half = log.feed(lambda k, v: None, lambda k: None, max_records=1_000)
    log.discard_before(half.end)
    cut = half.end // mmap.PAGESIZE * mmap.PAGESIZE
    assert cut > 0 and mapping[:cut] == bytes(cut) and mapping[cut:half.end] == data[cut - 2:half.end - 2]
    put: list[tuple[bytes, bytes]] = []
    rest = log.feed(lambda k, v: put.append((k, v)), lambda k: None, half.end, half.records)
    assert rest.end == log.end and put == [(k, v) for _, k, v in records[1_000:]]

    broken = mmap.mmap(-1, len(data), flags=mmap.MAP_PRIVATE)
    broken[:] = data
    broken[40] ^= 0x01
    with pytest.raises(cl.CorruptChangelogError, match="CRC"):
        cl.decode(broken, "frame")


def test_read_meta_reads_the_header_alone(tmp_path):
    """A changelog's metadata comes from its header (checked by its own CRC-32), as the JVM's
    ``readMeta``: a corrupt body, which ``decode`` refuses, does not stop it; a corrupt header does."""
    golden = (GOLDEN / "changelog-v2-run.bin").read_bytes()
    corrupt = bytearray(golden)
    corrupt[-1] ^= 0xFF
    with pytest.raises(cl.CorruptChangelogError):
        cl.decode(bytes(corrupt), "corrupt body")
    path = tmp_path / "3.ks-changelog"
    path.write_bytes(bytes(corrupt))
    meta = cl.decode(golden, "golden").meta
    assert meta[cl.RUN_ID] and cl.read_meta(bytes(corrupt), "corrupt body") == meta == cl.read_file_meta(str(path))
    assert cl.read_meta((GOLDEN / "changelog-v1.bin").read_bytes(), "v1") == {}
    bad_header = bytearray(golden)
    bad_header[cl.HEADER_V2.size] ^= 0xFF
    with pytest.raises(cl.CorruptChangelogError, match="header CRC-32"):
        cl.read_meta(bytes(bad_header), "corrupt header")


@pytest.mark.parametrize("in_place", [False, True])
def test_feed_counts_the_known_ops_by_key_group_across_chunks_and_batches(monkeypatch, in_place):
    """FORMATS.md, "Key-group counts": feed adds PUT_NEW and takes DELETE_EXISTING by the key
    group of each key of at least 4 bytes, whatever the chunks and however many keys wait to be
    counted; ops of unknown keys are left to the caller, and shorter keys carry no key group."""
    from collections import Counter

    monkeypatch.setattr(cl, "_COUNT_BATCH", 3)

    def k(g: int, name: bytes) -> bytes:
        return g.to_bytes(4, "big") + name

    records = [(cl.OP_PUT_NEW, k(i % 5, b"n%d" % i), b"v") for i in range(23)]
    records += [(cl.OP_DELETE_EXISTING, k(i % 3, b"d%d" % i), None) for i in range(8)]
    records += [(cl.OP_PUT, k(4, b"u"), b"v"), (cl.OP_DELETE, k(4, b"w"), None), (cl.OP_PUT_EXISTING, k(2, b"e"), b"v"),
                (cl.OP_PUT_NEW, b"abc", b"v"), (cl.OP_DELETE_EXISTING, b"", None), (cl.OP_PUT_NEW, k(9, b""), b"v")]
    data = cl.encode(1, 16, records)
    expected = {15: 2, 9: 1}  # what counts held before, plus the PUT_NEW of a key of 4 bytes
    for i in range(23):
        expected[i % 5] = expected.get(i % 5, 0) + 1
    for i in range(8):
        expected[i % 3] -= 1
    if in_place:
        mm = mmap.mmap(-1, len(data))
        mm.write(data)
        log = cl.decode(mm, "mem")
    else:
        log = cl.decode(data, "mem")
    for per_chunk in (None, 1, 4, 7):
        counts: Counter = Counter({15: 2})  # counts of the keys a store held before
        pos, done = log.first, 0
        while pos < log.end:
            fed = log.feed(lambda *_: None, lambda *_: None, pos, done, per_chunk, counts=counts)
            pos, done = fed.end, done + fed.records
        assert {g: v for g, v in counts.items() if v} == {g: v for g, v in expected.items() if v}, per_chunk
