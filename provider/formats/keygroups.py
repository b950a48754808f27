"""Key groups: Flink's unit of state redistribution, derived from Spark's partitioning hash.

Spark routes a state key to ``pmod(murmur3(partition key columns, seed 42), partitions)``. The
JVM (``KeyGroups.scala``, the only place that hashes keys) prefixes every stored key with
``pmod(that same hash, key_groups)`` (4 bytes, big-endian, so a key group is one contiguous key
range in RocksDB). When ``partitions`` divides ``key_groups``, ``hash mod partitions ==
key_group mod partitions``: a partition owns whole key groups, which is what makes rescaling a
matter of moving key-group ranges. These are the functions the offline tools route with.
"""
from __future__ import annotations

import struct
from collections import Counter
from operator import itemgetter
from typing import Iterable, MutableMapping

PREFIX_BYTES = 4
_PREFIX = struct.Struct(">I")
_FIRST_FOUR = itemgetter(slice(0, PREFIX_BYTES))


def divides(partitions: int, key_groups: int) -> bool:
    """Whether every partition owns whole key groups."""
    return partitions >= 1 and key_groups % partitions == 0


def partition_of_key_group(key_group: int, key_groups: int, partitions: int) -> int:
    """The Spark partition that owns ``key_group``; only defined when partitions divide."""
    if not divides(partitions, key_groups):
        raise ValueError(f"{partitions} partitions do not divide {key_groups} key groups")
    return key_group % partitions


def key_groups_of_partition(partition: int, partitions: int, key_groups: int) -> range:
    """All key groups owned by ``partition`` when ``partitions`` divides ``key_groups``."""
    if not divides(partitions, key_groups):
        raise ValueError(f"{partitions} partitions do not divide {key_groups} key groups")
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} is not in [0, {partitions})")
    return range(partition, key_groups, partitions)


def prefix(key_group: int) -> bytes:
    """The 4-byte prefix that starts every stored key of ``key_group``."""
    return _PREFIX.pack(key_group)


def key_group_of_stored_key(stored_key: bytes) -> int:
    """The key group a stored key carries."""
    return _PREFIX.unpack_from(stored_key, 0)[0]


def count_key_groups(counts: MutableMapping[int, int], stored_keys: Iterable[bytes], sign: int = 1) -> None:
    """Add ``sign`` to ``counts`` (a Counter) for each of ``stored_keys`` by its key group;
    keys shorter than the prefix carry no key group and are skipped. One C-level pass over the
    keys and a lookup per distinct prefix: cheaper than a Counter update per key."""
    unpack = _PREFIX.unpack
    for prefix, n in Counter(map(_FIRST_FOUR, stored_keys)).items():
        if len(prefix) == PREFIX_BYTES:
            counts[unpack(prefix)[0]] += sign * n
