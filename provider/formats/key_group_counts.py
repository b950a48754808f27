"""Key-group counts: how many keys a snapshot holds in each key group.

Spec: FORMATS.md, "Key-group counts"; golden file ``tests/golden/key-group-counts.bin``. A
snapshot may carry them as the file :data:`NAME` beside RocksDB's files. They are derived data:
a split by files takes each heir's exact key count from them instead of reading every key of its
parent, and a snapshot without them (older, or written by a tool that did not count) is read as
before. Bytes (integers big-endian)::

    b"KSGC" | u8 format version (1) | u32 keyGroups | u64 total keys | u32 entries
    | entries x (varint key-group delta, varint count) | u32 CRC-32 of every byte before it

Entries are the key groups with at least one key, ascending; the first delta is the key group
itself, each later one the distance from the previous key group (>= 1). Counts are >= 1 and sum
to the total.
"""
from __future__ import annotations

import logging
import struct
import zlib
from collections import Counter
from pathlib import Path
from typing import Mapping

log = logging.getLogger(__name__)

NAME = "ks-key-group-counts"
"""The file's name among a snapshot's files (its local name, as RocksDB's files have theirs)."""

MAGIC = b"KSGC"
FORMAT_VERSION = 1
_HEAD = struct.Struct(">4sBIQI")
_CRC = struct.Struct(">I")
_MAX_COUNT = (1 << 63) - 1


class CorruptKeyGroupCountsError(ValueError):
    """A key-group counts file is truncated, corrupt or foreign; the message names it."""


def encode(counts: Mapping[int, int], key_groups: int) -> bytes:
    """The file's bytes for ``counts`` (key group -> keys; zero counts are left out)."""
    entries = sorted((g, c) for g, c in counts.items() if c)
    out = bytearray()
    previous = 0
    for g, c in entries:
        if not 0 <= g < key_groups or c < 0:
            raise ValueError(f"cannot encode {c} keys in key group {g} of {key_groups}")
        _put_varint(out, g - previous)
        _put_varint(out, c)
        previous = g
    body = _HEAD.pack(MAGIC, FORMAT_VERSION, key_groups, sum(c for _, c in entries), len(entries)) + bytes(out)
    return body + _CRC.pack(zlib.crc32(body))


def decode(data: bytes, source: str) -> tuple[int, Counter]:
    """(keyGroups, counts) of a file's bytes; anything that does not hold to the spec is refused."""
    if len(data) < _HEAD.size + _CRC.size:
        raise CorruptKeyGroupCountsError(f"{source} is {len(data)} bytes, too short for key-group counts")
    body, (crc,) = memoryview(data)[:-_CRC.size], _CRC.unpack_from(data, len(data) - _CRC.size)
    magic, version, key_groups, total, entries = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise CorruptKeyGroupCountsError(f"{source} is not a key-group counts file (magic {magic!r})")
    if version != FORMAT_VERSION:
        raise CorruptKeyGroupCountsError(f"{source} has key-group counts format {version}; this build reads {FORMAT_VERSION}")
    if zlib.crc32(body) != crc:
        raise CorruptKeyGroupCountsError(f"{source}: checksum mismatch, corrupt")
    counts: Counter = Counter()
    pos, group, seen = _HEAD.size, -1, 0
    try:
        for i in range(entries):
            delta, pos = _get_varint(body, pos)
            count, pos = _get_varint(body, pos)
            if i and delta < 1 or count < 1:
                raise CorruptKeyGroupCountsError(f"{source}: entry {i} has delta {delta} and count {count}, corrupt")
            group = delta if i == 0 else group + delta
            if group >= key_groups:
                raise CorruptKeyGroupCountsError(f"{source}: key group {group} is not below {key_groups}, corrupt")
            counts[group] = count
            seen += count
    except IndexError:
        raise CorruptKeyGroupCountsError(f"{source}: entries run past the end, corrupt") from None
    except _BadVarint as exc:
        raise CorruptKeyGroupCountsError(f"{source}: {exc}, corrupt") from None
    if pos != len(body):
        raise CorruptKeyGroupCountsError(f"{source}: {len(body) - pos} bytes after the last entry, corrupt")
    if seen != total:
        raise CorruptKeyGroupCountsError(f"{source}: counts sum to {seen}, the header says {total}, corrupt")
    return key_groups, counts


def write_beside(directory: Path, counts: Mapping[int, int], key_groups: int, num_keys: int, describe: str) -> None:
    """Write ``counts`` as the file :data:`NAME` in ``directory``, unless they
    disagree with ``num_keys`` (then a snapshot goes without them, and a rescale counts keys)."""
    if sum(counts.values()) != num_keys or any(c < 0 for c in counts.values()):
        log.warning("keyedstate: the key-group counts of %s do not add up to its %d keys; its snapshot "
                    "is written without them", describe, num_keys)
        return
    (directory / NAME).write_bytes(encode(counts, key_groups))


def take_beside(db_dir: Path, key_groups: int, num_keys: int, describe: str) -> Counter | None:
    """The key-group counts a restored snapshot carries, removed from ``db_dir`` (RocksDB's
    directory); None if it carries none, or ones that do not hold (logged: the state is intact,
    only a later rescale counts keys)."""
    path = db_dir / NAME
    if not path.is_file():
        return None
    try:
        found_groups, counts = decode(path.read_bytes(), str(path))
        if found_groups != key_groups or sum(counts.values()) != num_keys:
            raise CorruptKeyGroupCountsError(
                f"{path} counts {sum(counts.values())} keys in {found_groups} key groups, the version "
                f"{num_keys} keys in {key_groups}")
        return counts
    except CorruptKeyGroupCountsError as exc:
        log.warning("keyedstate: %s: ignoring its key-group counts: %s", describe, exc)
        return None
    finally:
        path.unlink(missing_ok=True)


def by_partition(counts: Mapping[int, int], partitions: int) -> dict[int, int]:
    """Keys per partition of ``partitions`` (partition = key group mod ``partitions``)."""
    out: dict[int, int] = {}
    for g, c in counts.items():
        out[g % partitions] = out.get(g % partitions, 0) + c
    return out


def _put_varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)


class _BadVarint(ValueError):
    pass


def _get_varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if value > _MAX_COUNT:
                raise _BadVarint(f"a varint of {value} is out of range")
            return value, pos
        shift += 7
        if shift > 63:
            raise _BadVarint("a varint longer than 9 bytes")
