"""Stored key and value bytes: what every RocksDB entry of keyedstate looks like.

Spec: FORMATS.md, "Stored keys and values"; the JVM twin (the writer) is ``KeyCodec.scala``::

    key    u32 key group | UnsafeRow of the key                                  (no prefix scan)
    key    u32 key group | u32 prefix length | UnsafeRow of the prefix | UnsafeRow of the key
                                                                                  (prefix scans)
    value  u8 1 | UnsafeRow of the value                                          (plain)
    value  u8 2 | u64 time of the last write, epoch ms | UnsafeRow of the value   (with TTL)

The key group (formats/keygroups.py) is computed from the key's first ``partition_key_columns``
columns, the ones Spark partitions by. Python never decodes rows: it reads key groups, prefixes
and write times only.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

PLAIN_VALUE = 1
TIMED_VALUE = 2
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


@dataclass(frozen=True)
class KeyLayout:
    """How one store lays out its keys (recorded in manifests and read by offline tools).

    ``prefix_columns``: leading key columns stored again as a scan prefix (session windows: the
    grouping keys), 0 for none. ``partition_key_columns``: leading key columns Spark hashes to
    pick the partition (all of them, except for a join's ``keyWithIndexToValue`` store and for
    session windows, whose last column is not hashed). ``key_columns``: columns of the key row.
    """

    key_columns: int
    partition_key_columns: int
    prefix_columns: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"keyColumns": self.key_columns, "partitionKeyColumns": self.partition_key_columns,
                "prefixColumns": self.prefix_columns}

    @classmethod
    def from_json(cls, node: Any) -> "KeyLayout":
        if not isinstance(node, dict):
            raise ValueError(f"field 'keyLayout' is {type(node).__name__}, expected an object")
        values = [node[k] for k in ("keyColumns", "partitionKeyColumns", "prefixColumns")]
        if any(not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 0x7FFFFFFF for v in values):
            raise ValueError(f"field 'keyLayout' is {node!r}, expected non-negative integers")
        layout = cls(*values)
        if not layout.partition_key_columns <= layout.key_columns or layout.prefix_columns > layout.key_columns:
            raise ValueError(f"field 'keyLayout' is {node!r}: more hashed or prefix columns than key columns")
        return layout

    def row_offset(self, stored_key: bytes) -> int:
        """Where the full key row starts in a stored key."""
        if self.prefix_columns == 0:
            return 4
        return 8 + _U32.unpack_from(stored_key, 4)[0]


def written_at(stored_value: bytes) -> int | None:
    """The write time (epoch ms) of a value stored with TTL, else None."""
    if stored_value[:1] == bytes((TIMED_VALUE,)):
        return _U64.unpack_from(stored_value, 1)[0]
    return None


def expired_before(limit_ms: int):
    """A test ``value -> bool`` for "written at or before ``limit_ms``", comparing the
    big-endian write time as bytes (the TTL scan examines a million values in ~0.5 s)."""
    limit = limit_ms.to_bytes(8, "big")
    timed = TIMED_VALUE

    def expired(value: bytes) -> bool:
        return value[0] == timed and value[1:9] <= limit

    return expired
