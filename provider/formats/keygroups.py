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

PREFIX_BYTES = 4
_PREFIX = struct.Struct(">I")


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


unpack_key_group = _PREFIX.unpack_from
"""``unpack_key_group(buffer, offset)[0]``: the key group of the stored key at ``offset``."""


def key_group_of_stored_key(stored_key: bytes) -> int:
    """The key group a stored key carries."""
    return _PREFIX.unpack_from(stored_key, 0)[0]
