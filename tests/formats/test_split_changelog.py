"""The JVM's commit path holds a changelog split as codec 2 stores it (SplitChangelog): the split
made as records are written must be exactly codec 2's split, its file exactly the file of the
whole changelog (and Python's), and the format-1 bytes it ships, joined a chunk at a time,
exactly the changelog the writer encoded."""
from __future__ import annotations

import random
import struct

import pytest
from py4j.protocol import Py4JJavaError

from keyedstate.formats import changelog

from support.jvm import to_bytes

META = {"uniqueId": "0b3c", "lineage": [[4, "a1"], [5, "b2"]]}


@pytest.fixture(scope="module")
def fmt(spark):
    return spark._jvm.io.keyedstate.format


def records(seed: int, count: int) -> list[tuple[int, bytes, bytes | None]]:
    """Puts and deletes of every shape: 4-byte keys (a group and nothing else), empty values,
    and values larger than the writer's 64 KiB buffer (written around it)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        key = rng.randbytes(4) + rng.randbytes(rng.choice([0, 1, 8, 40]))
        if rng.random() < 0.2:
            out.append((rng.choice([changelog.OP_DELETE, changelog.OP_DELETE_EXISTING]), key, None))
        else:
            size = rng.choice([0, 3, 24, 300, 70_000 if i % 50 == 0 else 24])
            out.append((rng.choice([changelog.OP_PUT, changelog.OP_PUT_NEW, changelog.OP_PUT_EXISTING]), key,
                        rng.randbytes(size)))
    return out


def write(fmt, log_records, expected_bytes=0, expected_records=0):
    memory = getattr(fmt, "ChangelogFormat$InMemoryWriter")(9, 1024, expected_bytes, expected_records)
    for op, key, value in log_records:
        memory.writer().delete(op, key) if value is None else memory.writer().put(op, key, value)
    return memory.finish()


@pytest.mark.parametrize("seed,count,expected", [(1, 0, 0), (2, 1, 0), (3, 3000, 0), (4, 3000, 10 << 20)],
                         ids=["empty", "one", "grows", "presized"])
def test_split_as_written_is_codec_2s_split_and_its_file_codec_2s_file(spark, fmt, seed, count, expected):
    log_records = records(seed, count)
    inner = changelog.encode(9, 1024, log_records)
    split = write(fmt, log_records, expected, count)
    assert (split.length(), split.recordCount(), split.version(), split.keyGroups()) == (len(inner), count, 9, 1024)
    assert to_bytes(split.format1()) == inner
    python_file = changelog.compress(inner, META, changelog.CODEC_ZSTD_SPLIT)
    meta = fmt.ChangelogFormat.read(bytearray(python_file), "python").meta()
    body_start = 15 + struct.unpack_from(">I", python_file, 11)[0] + 4
    body = len(python_file) - body_start
    groups = struct.unpack_from(">I", python_file, body_start)[0]
    # The body's room: none asked (compressBound); none at all; too little for the key groups;
    # for the groups but not the rest; a byte short; exactly enough; more than enough.
    for room in (0, 1, 5, 4 + groups + 1, body - 1, body, body + 100, 1 << 30):
        assert to_bytes(fmt.ChangelogFormat.compress(split, meta, room)) == python_file, room
    decoded = changelog.decode(python_file, "split")
    assert [tuple(r) for r in decoded.records()] == log_records


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 18])
def test_format_1_is_joined_a_chunk_at_a_time(spark, fmt, chunk):
    log_records = records(5, 800)
    split = write(fmt, log_records)
    collector = spark._jvm.io.keyedstate.testing.StateStores.chunkCollector()
    split.writeFormat1(spark._jvm.java.nio.ByteBuffer.allocate(chunk), collector)
    assert collector.sizesButLast() in (f"[{chunk}]", "[]") and 0 < collector.last() <= chunk
    assert bytes(collector.bytes()) == changelog.encode(9, 1024, log_records)


def test_splitter_takes_any_pieces(spark, fmt):
    """Fields straddle pieces (a length's bytes, a key group's) and still split exactly."""
    inner = changelog.encode(9, 1024, records(6, 200))
    rng = random.Random(6)
    splitter = getattr(fmt, "SplitChangelog$Splitter")(0, 0)
    pos = 0
    while pos < len(inner):
        n = rng.choice([1, 2, 3, 5, 9, 1000])
        splitter.write(inner[pos:pos + n], 0, len(inner[pos:pos + n]))
        pos += n
    assert to_bytes(splitter.finish().format1()) == inner


def test_a_key_without_a_key_group_and_an_unfinished_changelog_are_refused(fmt):
    memory = getattr(fmt, "ChangelogFormat$InMemoryWriter")(9, 1024, 0, 0)
    with pytest.raises(Py4JJavaError, match="key of 3 bytes has no key group"):
        memory.writer().put(changelog.OP_PUT, b"abc", b"v")
        memory.writer().finish()  # the key reaches the splitter when the writer's buffer flushes
    splitter = getattr(fmt, "SplitChangelog$Splitter")(0, 0)
    head = changelog.encode(9, 1024, [])[:22]
    splitter.write(head, 0, len(head))
    with pytest.raises(Py4JJavaError, match="incomplete"):
        splitter.finish()
    whole = changelog.encode(9, 1024, [])
    splitter = getattr(fmt, "SplitChangelog$Splitter")(0, 0)
    splitter.write(whole, 0, len(whole))
    with pytest.raises(Py4JJavaError, match="after a changelog's trailer"):
        splitter.write(b"\x01", 0, 1)  # a byte after the trailer
    forged = changelog.encode(9, 1024, [])[:22] + bytes([changelog.OP_PUT]) + struct.pack(">I", 5) + b"\0\0\0\1k" + \
        struct.pack(">i", -13)  # a negative value length would send a parser backwards
    splitter = getattr(fmt, "SplitChangelog$Splitter")(0, 0)
    with pytest.raises(Py4JJavaError, match="value of -13 bytes"):
        splitter.write(forged, 0, len(forged))


def _codec_2_file(groups: bytes, rest: bytes) -> bytes:
    """A codec-2 file of these parts, its header and metadata as the writer makes them."""
    import zstandard

    data = changelog.compress(changelog.encode(2, 8, []), {}, changelog.CODEC_ZSTD_SPLIT)
    head = data[:changelog.HEADER_V2.size + changelog.HEADER_V2.unpack_from(data, 0)[3] + 4]
    g = zstandard.ZstdCompressor(write_content_size=True).compress(groups)
    return head + len(g).to_bytes(4, "big") + g + zstandard.ZstdCompressor(write_content_size=True).compress(rest)


@pytest.mark.parametrize("tamper", ["a group missing", "a group too many", "key shorter than its group",
                                    "value past the end", "negative value length", "value length -1",
                                    "key length past the end"])
def test_the_jvm_refuses_key_groups_that_disagree_with_the_records(fmt, tamper):
    """The JVM's join of a loaded codec-2 file checks every length against the bytes it has."""
    records = [(changelog.OP_PUT_NEW, b"\x00\x00\x00\x01k%d" % i, b"v" * i) for i in range(20)]
    groups, rest = changelog._split_key_groups(changelog.encode(2, 8, records))
    rest = bytearray(rest)
    first = 22  # the first record: op | u32 key length | key without its group | u32 value length | value
    if tamper == "a group missing":
        groups = groups[:-4]
    elif tamper == "a group too many":
        groups += b"\x00\x00\x00\x02"
    elif tamper == "key shorter than its group":
        rest[first + 1:first + 5] = (3).to_bytes(4, "big")
    elif tamper == "value past the end":
        rest[first + 7:first + 11] = (1 << 20).to_bytes(4, "big")  # key "k0": 2 bytes after its group
    elif tamper == "negative value length":
        rest[first + 7:first + 11] = (-40).to_bytes(4, "big", signed=True)
    elif tamper == "value length -1":  # short of the length field itself: a sum check alone passes it
        rest[first + 7:first + 11] = (-1).to_bytes(4, "big", signed=True)
    else:
        rest[first + 1:first + 5] = (0x7FFFFFF0).to_bytes(4, "big")
    data = _codec_2_file(groups, bytes(rest))
    with pytest.raises(Exception, match="ks-changelog is corrupt \\(key groups and records disagree\\)"):
        fmt.ChangelogFormat.read(bytearray(data), "/ck/2.ks-changelog")
