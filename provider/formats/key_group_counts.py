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
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    import numpy

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
    entries = _encoded_entries(counts, key_groups)
    if entries is None:  # counts the vectorised path does not take: the loop names what is wrong
        entries, total, n = _encoded_entries_slowly(counts, key_groups)
    else:
        entries, total, n = entries
    body = _HEAD.pack(MAGIC, FORMAT_VERSION, key_groups, total, n) + entries
    return body + _CRC.pack(zlib.crc32(body))


def _encoded_entries_slowly(counts: Mapping[int, int], key_groups: int) -> tuple[bytes, int, int]:
    entries = sorted((g, c) for g, c in counts.items() if c)
    out = bytearray()
    previous = 0
    for g, c in entries:
        if not 0 <= g < key_groups or c < 0:
            raise ValueError(f"cannot encode {c} keys in key group {g} of {key_groups}")
        _put_varint(out, g - previous)
        _put_varint(out, c)
        previous = g
    return bytes(out), sum(c for _, c in entries), len(entries)


def _encoded_entries(counts: Mapping[int, int], key_groups: int) -> tuple[bytes, int, int] | None:
    """(entries' bytes, total, entries) as :func:`_encoded_entries_slowly` gives them, with numpy
    (tens of thousands of key groups a snapshot); None for counts it does not take whole."""
    import numpy as np

    if not all(type(g) is int for g in counts) or not all(type(c) is int for c in counts.values()):
        return None  # np.fromiter would truncate a float
    try:
        groups = np.fromiter(counts.keys(), np.int64, len(counts))
        keys = np.fromiter(counts.values(), np.int64, len(counts))
    except (OverflowError, TypeError, ValueError):
        return None
    held = keys != 0
    groups, keys = groups[held], keys[held]
    if len(groups) and (groups.min() < 0 or groups.max() >= key_groups or keys.min() < 0):
        return None
    order = np.argsort(groups, kind="stable")
    groups, keys = groups[order], keys[order]
    values = np.empty(2 * len(groups), np.uint64)
    values[0::2] = np.diff(groups, prepend=0)
    values[1::2] = keys
    return _varints(values), sum(keys.tolist()), len(groups)


def _varints(values: "numpy.ndarray") -> bytes:
    """Unsigned LEB128 of each of ``values`` (uint64, below 2^63), concatenated."""
    import numpy as np

    lengths = np.ones(len(values), np.int64)
    for k in range(1, 9):
        lengths += (values >> np.uint64(7 * k)) > 0
    width = int(lengths.max()) if len(values) else 1
    shifts = (7 * np.arange(width)).astype(np.uint64)
    digits = ((values[:, None] >> shifts[None, :]) & np.uint64(0x7F)).astype(np.uint8)
    column = np.arange(width)[None, :]
    digits[column < lengths[:, None] - 1] |= 0x80
    return digits[column < lengths[:, None]].tobytes()


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
    counts = _decoded_entries(body, _HEAD.size, entries, key_groups, total)
    if counts is None:  # entries the vectorised path does not take: the loop names what is wrong
        counts = _decoded_entries_slowly(body, entries, key_groups, total, source)
    return key_groups, counts


def _decoded_entries_slowly(body: memoryview, entries: int, key_groups: int, total: int, source: str) -> Counter:
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
    return counts


def _decoded_entries(body: memoryview, pos: int, entries: int, key_groups: int, total: int) -> Counter | None:
    """The entries from ``pos`` to the end of ``body``, decoded with numpy when they hold to the
    spec; None otherwise (and for varints of 10 bytes or more), for the byte-by-byte reader."""
    import numpy as np

    data = np.frombuffer(body, np.uint8, offset=pos)
    n = 2 * entries
    if n == 0:
        return Counter() if len(data) == 0 and total == 0 else None
    ends = np.flatnonzero(data < 0x80)  # each varint's last byte
    if len(ends) < n or ends[n - 1] + 1 != len(data):
        return None
    ends = ends[:n]
    starts = np.empty(n, np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if lengths.max() > 9:  # at most 9 bytes: each value is below 2^63, as the spec bounds it
        return None
    digit = np.arange(len(data)) - np.repeat(starts, lengths)
    values = np.bitwise_or.reduceat((data & 0x7F).astype(np.uint64) << (7 * digit).astype(np.uint64), starts)
    deltas, keys = values[0::2], values[1::2]
    if (keys < 1).any() or (deltas[1:] < 1).any() or (deltas >= key_groups).any():
        return None
    groups = np.cumsum(deltas)  # each delta below keyGroups (< 2^32), so no overflow
    if groups[-1] >= key_groups:
        return None
    keys_list = keys.tolist()
    if sum(keys_list) != total:
        return None
    return Counter(dict(zip(groups.tolist(), keys_list)))


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
