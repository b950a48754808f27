"""Routing changelog records to new partitions by key group, without building RocksDB.

A rescale of a partition whose version is changelogs only (a young query) copies each record
into the changelog of the new partition that owns its key group; replayed from empty, each
routed changelog gives that partition's share of the state. Records whose op states whether the
key existed (the JVM knows it for almost every write) are copied as they are; concatenated logs
cannot keep an op that leaves it to the reader (a put or delete of unknown existence: the reader
would look in the store before the file, not at the records before it in the file), so when one
occurs the ops are rewritten from an exact set of live keys instead.
"""
from __future__ import annotations

from ..formats import changelog, keygroups
from ..formats.changelog import OP_DELETE_EXISTING, OP_PUT_EXISTING, OP_PUT_NEW


def route_by_key_group(logs: list[changelog.Changelog], partitions: int, version: int,
                       key_groups: int) -> dict[int, tuple[bytes, int]]:
    """Consecutive changelogs of one partition, replayed from empty, as one changelog of
    ``version`` per new partition that gets any record: ``{partition: (changelog, keys)}``."""
    routed = _route_fixed_width(logs, partitions, key_groups)
    if routed is None:
        routed = _route_known(logs, partitions, key_groups)
    if routed is None:
        routed = _route_tracking(logs, partitions, key_groups)
    return {q: (changelog.frame(version, key_groups, parts, count), keys)
            for q, (parts, count, keys) in enumerate(zip(*routed)) if parts}


def _route_fixed_width(logs: list[changelog.Changelog], partitions: int, key_groups: int):
    """:func:`_route_known` vectorised with numpy, for logs whose records all have one layout
    (one op class, one key length, one value length: Spark's UnsafeRows of fixed-width columns,
    e.g. a count per long key). Every row's op and length fields are checked against the first
    record's, which proves the record parser would find the same boundaries. None if they differ."""
    import numpy as np

    if not keygroups.divides(partitions, key_groups):
        raise ValueError(f"{partitions} partitions do not divide {key_groups} key groups")
    parts: list[list[bytes]] = [[] for _ in range(partitions)]
    keys = np.zeros(partitions, dtype=np.int64)
    records = np.zeros(partitions, dtype=np.int64)
    for log_ in logs:
        payload = log_.payload
        if not len(payload):
            continue
        first = next(log_.entries())
        if first.op in (OP_PUT_NEW, OP_PUT_EXISTING):
            layout = (OP_PUT_NEW, OP_PUT_EXISTING)
        elif first.op == OP_DELETE_EXISTING:
            layout = (OP_DELETE_EXISTING,)
        else:
            return None
        size, key_length = first.end - first.start, len(first.key)
        if len(payload) % size or key_length < keygroups.PREFIX_BYTES or len(payload) // size != log_.record_count:
            return None
        rows = np.frombuffer(payload, dtype=np.uint8).reshape(-1, size)
        ops = rows[:, 0]
        if not np.isin(ops, layout).all():
            return None
        lengths = [slice(1, 5)] + ([slice(5 + key_length, 9 + key_length)] if size > 5 + key_length else [])
        if any(not (rows[:, cols] == rows[0, cols]).all() for cols in lengths):
            return None
        owner = np.ascontiguousarray(rows[:, 5:9]).view(">u4").ravel() % partitions
        sign = np.where(ops == OP_PUT_NEW, 1, np.where(ops == OP_DELETE_EXISTING, -1, 0))
        keys += np.bincount(owner, weights=sign, minlength=partitions).astype(np.int64)
        records += np.bincount(owner, minlength=partitions)
        for q in np.unique(owner):
            parts[q].append(rows[owner == q].tobytes())
    return parts, [int(r) for r in records], [int(k) for k in keys]


def _route_known(logs: list[changelog.Changelog], partitions: int, key_groups: int):
    """Per partition: (records as copied, record count, key count); None at the first op of
    unknown existence."""
    parts: list[list[bytes]] = [[] for _ in range(partitions)]
    keys = [0] * partitions
    owner = keygroups.partition_of_key_group
    group_of = keygroups.key_group_of_stored_key
    for log_ in logs:
        buf = log_.payload
        for op, key, _, start, end in log_.entries():
            q = owner(group_of(key), key_groups, partitions)
            if op == OP_PUT_NEW:
                keys[q] += 1
            elif op == OP_DELETE_EXISTING:
                keys[q] -= 1
            elif op != OP_PUT_EXISTING:
                return None
            parts[q].append(buf[start:end])
    return parts, [len(p) for p in parts], keys


def _route_tracking(logs: list[changelog.Changelog], partitions: int, key_groups: int):
    """:func:`_route_known` for logs with ops of unknown existence: ops rewritten from the set
    of live keys (deletes of absent keys vanish, a key's first put is new)."""
    parts: list[list[bytes]] = [[] for _ in range(partitions)]
    records = [0] * partitions
    keys = [0] * partitions
    live: set[bytes] = set()
    owner = keygroups.partition_of_key_group
    group_of = keygroups.key_group_of_stored_key
    for log_ in logs:
        for _, key, value in log_.records():
            q = owner(group_of(key), key_groups, partitions)
            if value is not None:
                if key in live:
                    parts[q].append(changelog.encode_record(OP_PUT_EXISTING, key, value))
                else:
                    live.add(key)
                    parts[q].append(changelog.encode_record(OP_PUT_NEW, key, value))
                    keys[q] += 1
                records[q] += 1
            elif key in live:
                live.remove(key)
                parts[q].append(changelog.encode_record(OP_DELETE_EXISTING, key, None))
                keys[q] -= 1
                records[q] += 1
    return parts, records, keys
