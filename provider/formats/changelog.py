"""The changelog: one version's writes, as the JVM shim writes them to the checkpoint.

Spec: FORMATS.md, "Changelog"; the JVM twin is ``ChangelogFormat.scala``; golden files in
``tests/golden/``. The JVM writes ``<partition dir>/<version>.ks-changelog`` (that is the commit)
and ships the same bytes to the state server, which applies them to RocksDB; a load replays
changelogs on top of the nearest snapshot. Format 1 (all integers big-endian)::

    header   8s magic b"KSCHLOG1" | u16 format version | u64 version | u32 key groups
    record   u8 op | u32 key length | key | (puts only) u32 value length | value
    trailer  u8 0xFF | u64 record count | u32 CRC-32 of header and records

Ops carry what the writer knew of the key's existence before the record, so that an exact key
count costs no read when the JVM's near cache already knew (see ``OP_*``).

:func:`decode` reads the header once and checks framing and checksum; :meth:`Changelog.records`
is the one parser of the records, shared by the state server's apply, offline rebuilds and the
rescale's routing; it checks every length against the payload and the count against the trailer,
and names the file in every error. A foreign or truncated file is never taken for an empty version.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Iterator, NamedTuple

MAGIC = b"KSCHLOG1"
FORMAT_VERSION = 1
OP_PUT = 1  # put; whether the key existed is unknown
OP_DELETE = 2  # delete; whether the key existed is unknown
OP_PUT_NEW = 3  # put of a key that did not exist
OP_PUT_EXISTING = 4  # put over an existing key
OP_DELETE_EXISTING = 5  # delete of an existing key
PUTS = frozenset((OP_PUT, OP_PUT_NEW, OP_PUT_EXISTING))
DELETES = frozenset((OP_DELETE, OP_DELETE_EXISTING))
END = 0xFF
HEADER = struct.Struct(">8sHQI")
TRAILER = struct.Struct(">BQI")
_U32 = struct.Struct(">I")
_unpack_u32 = _U32.unpack_from


class CorruptChangelogError(ValueError):
    """A changelog is truncated, corrupt, or not written by keyedstate; the message names it."""


class Record(NamedTuple):
    op: int
    key: bytes
    value: bytes | None  # None for deletes


class Entry(NamedTuple):
    """A record and where its bytes are in the payload (``payload[start:end]``)."""

    op: int
    key: bytes
    value: bytes | None
    start: int
    end: int


@dataclass(frozen=True)
class Changelog:
    """A changelog whose framing and checksum were checked: the version it produces and its records."""

    version: int
    key_groups: int
    record_count: int
    payload: bytes  # the records, between header and trailer
    source: str  # names the file in errors

    def records(self) -> Iterator[Record]:
        """Every record, in order (see :meth:`entries`)."""
        for op, key, value, _, _ in self.entries():
            yield Record(op, key, value)

    def entries(self) -> Iterator[Entry]:
        """Every record with its place in the payload, in order: the one parser of records. It
        fails naming the file on any length, op or count that does not fit the payload (a CRC
        only proves the bytes are the writer's, not that they parse)."""
        buf, source = self.payload, self.source
        pos, end, count = 0, len(buf), 0
        puts, deletes, unpack = PUTS, DELETES, _unpack_u32
        try:
            while pos < end:
                op = buf[pos]
                key_start = pos + 5
                key_end = key_start + unpack(buf, pos + 1)[0]
                if op in puts:
                    value_start = key_end + 4
                    record_end = value_start + unpack(buf, key_end)[0]
                    if record_end > end:
                        raise CorruptChangelogError(f"{source}: record {count} at byte {pos} overruns the file")
                    yield Entry(op, buf[key_start:key_end], buf[value_start:record_end], pos, record_end)
                elif op in deletes:
                    if key_end > end:
                        raise CorruptChangelogError(f"{source}: record {count} at byte {pos} overruns the file")
                    yield Entry(op, buf[key_start:key_end], None, pos, key_end)
                    record_end = key_end
                else:
                    raise CorruptChangelogError(f"{source}: unknown record op {op} at byte {pos}")
                pos = record_end
                count += 1
        except struct.error:
            raise CorruptChangelogError(f"{source}: record {count} at byte {pos} overruns the file") from None
        if count != self.record_count:
            raise CorruptChangelogError(
                f"{source} holds {count} records but its trailer says {self.record_count}: corrupt")


def decode(data: bytes | bytearray | memoryview, source: str) -> Changelog:
    """Check the framing and checksum of a changelog; ``source`` names it in errors."""
    view = memoryview(data)
    if len(view) < HEADER.size or bytes(view[:8]) != MAGIC:
        raise CorruptChangelogError(
            f"{source} is not a keyedstate changelog (bad magic; written by another state "
            f"store provider, or corrupt)")
    _, fmt, version, key_groups = HEADER.unpack_from(view, 0)
    if fmt != FORMAT_VERSION:
        raise CorruptChangelogError(
            f"{source} has changelog format version {fmt}; this keyedstate reads format {FORMAT_VERSION}")
    if len(view) < HEADER.size + TRAILER.size:
        raise CorruptChangelogError(f"{source} is truncated ({len(view)} bytes)")
    end, count, crc = TRAILER.unpack_from(view, len(view) - TRAILER.size)
    body = view[:len(view) - TRAILER.size]
    if end != END or zlib.crc32(body) != crc:
        raise CorruptChangelogError(
            f"{source} is truncated or corrupt (trailer or CRC-32 mismatch, {len(view)} bytes)")
    return Changelog(version, key_groups, count, bytes(body[HEADER.size:]), source)


def read_file(path: str) -> Changelog:
    with open(path, "rb") as fh:
        return decode(fh.read(), path)


def encode_record(op: int, key: bytes, value: bytes | None) -> bytes:
    if op in PUTS:
        if value is None:
            raise ValueError(f"op {op} is a put and needs a value")
        return b"".join((bytes((op,)), _U32.pack(len(key)), key, _U32.pack(len(value)), value))
    if op not in DELETES:
        raise ValueError(f"unknown op {op}")
    return b"".join((bytes((op,)), _U32.pack(len(key)), key))


def encode(version: int, key_groups: int, records: list[tuple[int, bytes, bytes | None]]) -> bytes:
    """A changelog of ``(op, key, value)`` records (offline tools and tests; the JVM has its own writer)."""
    return frame(version, key_groups, [encode_record(*r) for r in records], len(records))


def frame(version: int, key_groups: int, encoded_records: list[bytes], count: int) -> bytes:
    """Header + already encoded records + trailer."""
    body = b"".join([HEADER.pack(MAGIC, FORMAT_VERSION, version, key_groups), *encoded_records])
    return body + TRAILER.pack(END, count, zlib.crc32(body))
