"""Key groups: Flink's unit of state redistribution, derived from Spark's partitioning hash.

Spark routes a state key to ``pmod(murmur3(partition key columns, seed 42), partitions)``.
keyedstate prefixes every stored key with ``pmod(that same hash, key_groups)`` (4 bytes,
big-endian, so a key group is one contiguous key range in RocksDB). When ``partitions``
divides ``key_groups``, ``hash mod partitions == key_group mod partitions``: a partition owns
whole key groups, which is what makes rescaling a matter of moving key-group ranges.
These functions are pure and tiny so that the invariant can be tested exhaustively.
"""
from __future__ import annotations

import struct

PREFIX_BYTES = 4
_PREFIX = struct.Struct(">I")


def key_group_of_hash(spark_hash: int, key_groups: int) -> int:
    """The key group of a key whose Spark Murmur3 partition hash is ``spark_hash`` (signed)."""
    return spark_hash % key_groups  # Python's % is already a non-negative pmod


def partition_of_key_group(key_group: int, key_groups: int, partitions: int) -> int:
    """The Spark partition that owns ``key_group``; only defined when partitions divide."""
    if key_groups % partitions:
        raise ValueError(f"{partitions} partitions do not divide {key_groups} key groups")
    return key_group % partitions


def key_groups_of_partition(partition: int, partitions: int, key_groups: int) -> range:
    """All key groups owned by ``partition`` when ``partitions`` divides ``key_groups``."""
    if key_groups % partitions:
        raise ValueError(f"{partitions} partitions do not divide {key_groups} key groups")
    return range(partition, key_groups, partitions)


def prefix(key_group: int) -> bytes:
    """The 4-byte prefix that starts every stored key of ``key_group``."""
    return _PREFIX.pack(key_group)


def key_group_of_stored_key(stored_key: bytes) -> int:
    """Recover the key group of a stored key without re-reading Spark."""
    return _PREFIX.unpack_from(stored_key, 0)[0]
