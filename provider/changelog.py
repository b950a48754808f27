"""The changelog: one version's writes, as the JVM shim ships and persists them.

The JVM encodes a version's deduplicated writes once, writes the bytes to
``<partition dir>/<version>.ks-changelog`` in the checkpoint (that is the commit), and sends
the same bytes to the state server, which applies them to RocksDB. On load, changelogs are
replayed on top of the nearest snapshot. The layout (all integers big-endian)::

    header   8s magic b"KSCHLOG1" | u16 format version | u64 version | u32 key groups
    record   u8 op | u32 key length | key | (puts only) u32 value length | value
    trailer  u8 0xFF | u64 record count | u32 CRC-32 of header and records

Ops carry what the writer knew about the key's previous existence, so that keeping an exact
key count costs no read when the JVM's near cache already knew: 1 put (unknown), 2 delete
(unknown), 3 put of a new key, 4 put over an existing key, 5 delete of an existing key.

A file that does not start with the magic, or lacks a valid trailer, is rejected with the path
in the message: a foreign or truncated file must never be mistaken for an empty version.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Iterator

from rocksdict import WriteBatch

MAGIC = b"KSCHLOG1"
FORMAT_VERSION = 1
OP_PUT = 1
OP_DELETE = 2
OP_PUT_NEW = 3
OP_PUT_EXISTING = 4
OP_DELETE_EXISTING = 5
PUTS = frozenset((OP_PUT, OP_PUT_NEW, OP_PUT_EXISTING))
DELETES = frozenset((OP_DELETE, OP_DELETE_EXISTING))
_END = 0xFF
_HEADER = struct.Struct(">8sHQI")
_TRAILER = struct.Struct(">BQI")
_U32 = struct.Struct(">I")
_unpack_u32 = _U32.unpack_from
_U32_PAIR = struct.Struct(">II")


class CorruptChangelogError(ValueError):
    """A changelog is truncated, corrupt, or not written by keyedstate."""


@dataclass(frozen=True)
class Changelog:
    """A decoded changelog: which version it produces and the raw payload to apply."""

    version: int
    key_groups: int
    record_count: int
    payload: memoryview  # the records, between header and trailer

    def records(self) -> Iterator[tuple[int, bytes, bytes | None]]:
        """Yield ``(op, key, value)``; value is ``None`` for deletes."""
        buf = self.payload
        pos, end = 0, len(buf)
        unpack = _U32.unpack_from
        while pos < end:
            op = buf[pos]
            (klen,) = unpack(buf, pos + 1)
            pos += 5
            key = bytes(buf[pos:pos + klen])
            pos += klen
            if op in PUTS:
                (vlen,) = unpack(buf, pos)
                pos += 4
                yield op, key, bytes(buf[pos:pos + vlen])
                pos += vlen
            elif op in DELETES:
                yield op, key, None
            else:
                raise CorruptChangelogError(f"unknown record op {op} at byte {pos}")


def decode(data: bytes | memoryview, source: str) -> Changelog:
    """Check framing and checksum of a changelog; ``source`` names it in errors."""
    view = memoryview(data)
    if len(view) < _HEADER.size or bytes(view[:8]) != MAGIC:
        raise CorruptChangelogError(
            f"{source} is not a keyedstate changelog (bad magic; written by another state "
            f"store provider, or corrupt)")
    magic, fmt, version, key_groups = _HEADER.unpack_from(view, 0)
    if fmt != FORMAT_VERSION:
        raise CorruptChangelogError(
            f"{source} has changelog format version {fmt}; this keyedstate reads "
            f"format {FORMAT_VERSION}")
    if len(view) < _HEADER.size + _TRAILER.size:
        raise CorruptChangelogError(f"{source} is truncated ({len(view)} bytes)")
    end, count, crc = _TRAILER.unpack_from(view, len(view) - _TRAILER.size)
    body = view[:len(view) - _TRAILER.size]
    if end != _END or zlib.crc32(body) != crc:
        raise CorruptChangelogError(
            f"{source} is truncated or corrupt (trailer or CRC-32 mismatch, {len(view)} bytes)")
    return Changelog(version, key_groups, count, body[_HEADER.size:])


def encode(version: int, key_groups: int, records: list[tuple[int, bytes, bytes | None]]) -> bytes:
    """Encode a changelog; the JVM shim has its own encoder, this one serves tests and tools."""
    parts = []
    for op, key, value in records:
        parts.append(bytes([op]) + _U32.pack(len(key)) + key)
        if op in PUTS:
            assert value is not None
            parts.append(_U32.pack(len(value)) + value)
    return _frame(version, key_groups, parts, len(records))


def _frame(version: int, key_groups: int, records: list[bytes], count: int) -> bytes:
    """Header + encoded records + trailer."""
    body = b"".join([_HEADER.pack(MAGIC, FORMAT_VERSION, version, key_groups), *records])
    return body + _TRAILER.pack(_END, count, zlib.crc32(body))


def read_file(path: str) -> Changelog:
    with open(path, "rb") as fh:
        return decode(fh.read(), path)


def to_write_batch(log_: Changelog) -> tuple[WriteBatch, int, list[bytes], list[bytes], int]:
    """One tight pass over a changelog (the apply hot path, ~0.5 us a record; ``records()`` is
    the readable twin for tools and tests): the RocksDB write batch,
    the key-count delta the writer knew, the keys whose previous existence it did not, and
    the number of deletes."""
    batch = WriteBatch(raw_mode=True)
    put, delete = batch.put, batch.delete
    delta = deletes = 0
    unknown_puts: list[bytes] = []
    unknown_deletes: list[bytes] = []
    buf = bytes(log_.payload)
    pos, end = 0, len(buf)
    while pos < end:
        op = buf[pos]
        klen = _unpack_u32(buf, pos + 1)[0]
        pos += 5
        key = buf[pos:pos + klen]
        pos += klen
        if op in PUTS:
            vlen = _unpack_u32(buf, pos)[0]
            pos += 4
            put(key, buf[pos:pos + vlen])
            pos += vlen
            if op == OP_PUT_NEW:
                delta += 1
            elif op == OP_PUT:
                unknown_puts.append(key)
        elif op in DELETES:
            delete(key)
            deletes += 1
            if op == OP_DELETE_EXISTING:
                delta -= 1
            elif op == OP_DELETE:
                unknown_deletes.append(key)
        else:
            raise CorruptChangelogError(f"unknown record op {op} at byte {pos - 5 - klen}")
    return batch, delta, unknown_puts, unknown_deletes, deletes


def route_by_key_group(logs: list[Changelog], partitions: int, version: int,
                       key_groups: int) -> dict[int, tuple[bytes, int]]:
    """Consecutive changelogs of one partition, replayed from empty, as one changelog of
    ``version`` per partition ``key group % partitions``: replayed from empty, each gives that
    partition's share of the last log's state. The offline rescale moves whole key groups this
    way, copying records without building RocksDB. Returns ``{partition: (changelog, keys)}``.

    Records whose op says whether the key existed (the JVM knows it for almost every write)
    are copied as they are (~0.5 us a record). Concatenated logs cannot keep an op that leaves
    it to the reader (put/delete of a key of unknown existence: the reader would look in the
    store before the file, not at the records before it in the file), so when one occurs, ops
    are rewritten from an exact set of live keys instead."""
    routed = _route_fixed_width(logs, partitions)
    if routed is None:
        routed = _route_known(logs, partitions)
    if routed is None:
        routed = _route_tracking(logs, partitions)
    return {q: (_frame(version, key_groups, parts, count), keys)
            for q, (parts, count, keys) in enumerate(zip(*routed)) if parts}


def _route_fixed_width(logs: list[Changelog], partitions: int):
    """:func:`_route_known` with numpy, for logs whose records all have one layout (one op
    class, one key length, one value length: Spark's UnsafeRows of fixed-width columns, e.g.
    a count per long key). Checking every row's op and length fields against the first
    record's proves the sequential parse would find the same boundaries. None if they differ."""
    import numpy as np

    parts: list[list[bytes]] = [[] for _ in range(partitions)]
    keys = np.zeros(partitions, dtype=np.int64)
    records = np.zeros(partitions, dtype=np.int64)
    for log_ in logs:
        payload = log_.payload
        if not len(payload):
            continue
        op, klen = payload[0], _unpack_u32(payload, 1)[0]
        if op in (OP_PUT_NEW, OP_PUT_EXISTING):
            layout = (OP_PUT_NEW, OP_PUT_EXISTING)
            size = 9 + klen + _unpack_u32(payload, 5 + klen)[0]
        elif op == OP_DELETE_EXISTING:
            layout, size = (OP_DELETE_EXISTING,), 5 + klen
        else:
            return None
        if len(payload) % size or klen < 4:
            return None
        rows = np.frombuffer(payload, dtype=np.uint8).reshape(-1, size)
        ops = rows[:, 0]
        if not np.isin(ops, layout).all():
            return None
        lengths = [slice(1, 5)] + ([slice(5 + klen, 9 + klen)] if size > 5 + klen else [])
        if any(not (rows[:, cols] == rows[0, cols]).all() for cols in lengths):
            return None
        owner = np.ascontiguousarray(rows[:, 5:9]).view(">u4").ravel() % partitions
        sign = np.where(ops == OP_PUT_NEW, 1, np.where(ops == OP_DELETE_EXISTING, -1, 0))
        keys += np.bincount(owner, weights=sign, minlength=partitions).astype(np.int64)
        records += np.bincount(owner, minlength=partitions)
        for q in np.unique(owner):
            parts[q].append(rows[owner == q].tobytes())
    return parts, [int(r) for r in records], [int(k) for k in keys]


def _route_known(logs: list[Changelog], partitions: int):
    """Per partition: (records as copied, record count, key count); None at the first op of
    unknown existence."""
    parts: list[list[bytes]] = [[] for _ in range(partitions)]
    appends = [p.append for p in parts]
    keys = [0] * partitions
    length_and_group = _U32_PAIR.unpack_from  # key length, then the key's key-group prefix
    unpack = _unpack_u32
    for log_ in logs:
        buf = bytes(log_.payload)
        pos, end = 0, len(buf)
        while pos < end:
            op = buf[pos]
            klen, group = length_and_group(buf, pos + 1)
            q = group % partitions
            record_end = pos + 5 + klen
            if op == OP_PUT_NEW:
                record_end += 4 + unpack(buf, record_end)[0]
                keys[q] += 1
            elif op == OP_PUT_EXISTING:
                record_end += 4 + unpack(buf, record_end)[0]
            elif op == OP_DELETE_EXISTING:
                keys[q] -= 1
            elif op in PUTS or op in DELETES:
                return None
            else:
                raise CorruptChangelogError(f"unknown record op {op} at byte {pos}")
            appends[q](buf[pos:record_end])
            pos = record_end
    return parts, [len(p) for p in parts], keys


def _route_tracking(logs: list[Changelog], partitions: int):
    """:func:`_route_known` for logs with ops of unknown existence: ops rewritten from the set
    of live keys (deletes of absent keys vanish, a key's first put is new)."""
    parts: list[list[bytes]] = [[] for _ in range(partitions)]
    records = [0] * partitions
    keys = [0] * partitions
    live: set[bytes] = set()
    put_new, put_existing, delete_existing = (bytes([op]) for op in (OP_PUT_NEW, OP_PUT_EXISTING, OP_DELETE_EXISTING))
    for log_ in logs:
        for op, key, value in log_.records():
            q = _unpack_u32(key, 0)[0] % partitions
            head = _U32.pack(len(key)) + key
            if value is not None:
                if key in live:
                    parts[q] += (put_existing, head, _U32.pack(len(value)), value)
                else:
                    live.add(key)
                    parts[q] += (put_new, head, _U32.pack(len(value)), value)
                    keys[q] += 1
                records[q] += 1
            elif key in live:
                live.remove(key)
                parts[q] += (delete_existing, head)
                keys[q] -= 1
                records[q] += 1
    return parts, records, keys
