"""``keyedstate get``: one key's value at any retained batch, decoded with the state schema.

No Spark, no JVM for a local checkpoint: the key is encoded as Spark's ``UnsafeProjection``
would (:mod:`.rows`), hashed with Spark's partition hash (:mod:`.sparkhash`) to find its
partition and key group, and looked up in that one store partition only:

1. the version is ``batch + 1``; its chain (:meth:`..checkpoint.query.Checkpoint.chain`) is the changelogs
   after the newest snapshot at or below it (format 2: the lineage of the committed unique id);
2. the changelogs are searched newest first, and a changelog is parsed only when its payload
   contains the key's length-prefixed bytes (a C-speed substring search), so the records of
   other keys are never decoded; the last record of the key in the newest changelog that has
   one decides (a put: its value; a delete: absent);
3. otherwise the base snapshot answers: its files are hard-linked (local) or downloaded into a
   temporary directory and opened read-only for one point read (RocksDB reads an index block
   and at most a few data blocks, whatever the state's size).

Other schemes go through :class:`~.storage.HadoopStorage` (a SparkSession's JVM, used for file
I/O only: downloads of the one partition's files that are needed).
"""
from __future__ import annotations

import json
import os
import struct
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..formats import changelog, rocksdb
from ..formats.layout import DEFAULT_STORE, MAX_CHANGELOG_BYTES
from ..formats.stored import TIMED_VALUE, KeyLayout
from ..checkpoint import Checkpoint, CheckpointProblem, Operator, partition_key_layout
from . import rows
from .storage import open_storage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_U32 = struct.Struct(">I")


class LookupError_(CheckpointProblem):
    """The key cannot be looked up (bad key, operator, store or batch); the message says why."""


def choose_store(op: Operator, store: str | None, root: str) -> str:
    names = sorted(op.stores) or [DEFAULT_STORE]
    if store is None:
        if len(names) == 1:
            return names[0]
        raise LookupError_(f"{root}: operator {op.id} has the stores {', '.join(names)}: name one with --store")
    if store not in op.stores:
        raise LookupError_(f"{root}: operator {op.id} has no store {store!r} (it has {', '.join(names)})")
    return store


def resolve_batch(ck: Checkpoint, batch: int | None) -> int:
    committed = ck.committed_batches()
    if not committed:
        raise LookupError_(f"{ck.root}: no committed batch (commits/ is empty): the query never completed a batch")
    if batch is None:
        return committed[-1]
    if batch not in committed:
        raise LookupError_(f"{ck.root}: batch {batch} is not committed (committed: "
                           f"{committed[0]}..{committed[-1]})")
    return batch


def stored_key(key_schema: dict, layout: KeyLayout, key: Any, key_groups: int,
               hasher) -> tuple[bytes, int, bytes]:
    """(stored key, Spark's hash, UnsafeRow of the key) for a key given as JSON values."""
    row = rows.encode_row(key_schema, key, "key")
    h = hasher.hash(row)
    group = h % key_groups
    if layout.prefix_columns == 0:
        return _U32.pack(group) + row, h, row
    fields = rows.fields(key_schema)[:layout.prefix_columns]
    values = [key[f["name"]] for f in fields] if isinstance(key, dict) else list(key)[:layout.prefix_columns]
    prefix = rows.encode_row({"type": "struct", "fields": fields}, values, "key prefix")
    return _U32.pack(group) + _U32.pack(len(prefix)) + prefix + row, h, row


def get(checkpoint: str | os.PathLike, operator: int, key: Any, *, store: str | None = None,
        batch: int | None = None, spark: "SparkSession | None" = None) -> dict[str, Any]:
    """Look one key up; returns a dict with ``found``, ``value`` (decoded, JSON-ready), where it
    was found, and timings. ``key``: a dict by field name, a list in field order, or JSON text."""
    started = time.perf_counter()
    if isinstance(key, str):
        try:
            key = json.loads(key)
        except ValueError as exc:
            raise LookupError_(f"--key is not JSON ({exc}): give an object by key field name, e.g. "
                               "'{\"k\": \"a\"}', or a list in key field order") from None
    storage = open_storage(checkpoint, spark)
    ck = Checkpoint(storage)
    ck.refuse_foreign("get")
    batch = resolve_batch(ck, batch)
    op = ck.operator(operator)
    store = choose_store(op, store, ck.root)
    key_schema, value_schema = ck.schema(operator, store)
    parts = op.stores.get(store, [])
    layout = partition_key_layout(op, store, len(rows.fields(key_schema)), ck.key_layout(parts[-1:] or parts))
    partitions = ck.partitions_at(batch, op)
    if partitions is None:
        raise LookupError_(f"{ck.root}: cannot tell the partition count of batch {batch} (offsets/{batch} is missing)")
    from .sparkhash import RowHasher

    hasher = RowHasher(key_schema, layout.partition_key_columns)
    version = batch + 1
    try:
        row = rows.encode_row(key_schema, key, "key")
    except (KeyError, ValueError, TypeError) as exc:
        raise LookupError_(f"the key {json.dumps(key)} does not fit the key schema of operator {operator} store "
                           f"'{store}' ({_schema_text(key_schema)}): {exc}") from None
    partition = hasher.hash(row) % partitions
    sp = next((s for s in parts if s.partition == partition), None)
    if sp is None:
        raise LookupError_(f"{ck.path('state', str(operator), str(partition))}: the key's partition {partition} has "
                           f"no state files for store '{store}'")
    uid = ck.unique_id(batch, operator, partition, store)
    chain = ck.chain(sp, version, uid)
    key_groups = None
    result: dict[str, Any] = {"operator": operator, "store": store, "batch": batch, "version": version,
                              "partition": partition, "key": rows.to_json_value(rows.decode_row(key_schema, row))}
    found: tuple[str, bytes | None] | None = None
    for v, i in chain[:-1]:
        log_ = ck.read_changelog(sp, v, i)
        key_groups = log_.key_groups
        skey, _, _ = stored_key(key_schema, layout, key, key_groups, hasher)
        record = _last_record(log_, skey)
        if record is not _NO_RECORD:
            found = (sp.changelog_path(storage, v, i), record)
            break
    if found is None and chain[-1][0] > 0:
        base_v, base_id = chain[-1]
        source = sp.manifest_path(storage, base_v, base_id)
        manifest = ck.read_manifest(sp, base_v, base_id)
        key_groups = manifest.key_groups
        skey, _, _ = stored_key(key_schema, layout, key, key_groups, hasher)
        if manifest.replay is not None:
            rpath = sp.file_path(storage, manifest.replay.path)
            try:
                data = storage.read_bytes(rpath, MAX_CHANGELOG_BYTES, "changelog")
                record = _last_record(changelog.decode(data, rpath), skey)
            except changelog.CorruptChangelogError as exc:
                raise CheckpointProblem(str(exc)) from None
            if record is not _NO_RECORD:
                found = (rpath, record)
        if found is None and manifest.files:
            with tempfile.TemporaryDirectory(prefix="keyedstate-get-") as tmp:
                ck.fetch_snapshot(sp, manifest, source, Path(tmp))
                db = rocksdb.open_read_only(Path(tmp))
                try:
                    value = db.get(skey)
                finally:
                    db.close()
            found = (source, value)
    where, value = found if found is not None else (None, None)
    result["found"] = value is not None
    result["from"] = where
    if value is not None:
        offset = 9 if value[0] == TIMED_VALUE else 1
        if value[0] == TIMED_VALUE:
            result["writtenAtMs"] = struct.unpack_from(">Q", value, 1)[0]
        result["value"] = rows.to_json_value(rows.decode_row(value_schema, value, offset))
    else:
        result["value"] = None
    result["elapsedMs"] = round((time.perf_counter() - started) * 1000, 1)
    return result


def _last_record(log_: changelog.Changelog, skey: bytes) -> Any:
    """The key's last record in a changelog: its value (put), None (delete), _NO_RECORD (none).

    A C-speed substring search for the length-prefixed key finds the candidates; a candidate
    counts only if a record starts there, which a walk over the record boundaries (lengths
    only, no slicing: the records were checked when the changelog was read) decides exactly,
    up to the last candidate. A value that happens to contain the key's bytes is not a match."""
    payload = log_.payload
    needle = _U32.pack(len(skey)) + skey
    hits = []
    at = payload.find(needle)
    while at >= 0:
        hits.append(at - 1)  # the op byte before the key length
        at = payload.find(needle, at + 1)
    if not hits:
        return _NO_RECORD
    candidates, last_hit = set(hits), hits[-1]
    unpack, puts = _U32.unpack_from, changelog.PUTS
    result: Any = _NO_RECORD
    pos = 0
    while pos <= last_hit:
        key_end = pos + 5 + unpack(payload, pos + 1)[0]
        if payload[pos] in puts:
            end = key_end + 4 + unpack(payload, key_end)[0]
            if pos in candidates:
                result = payload[key_end + 4:end]
        else:
            end = key_end
            if pos in candidates:
                result = None
        pos = end
    return result


class _NoRecord:
    def __repr__(self) -> str:
        return "<no record>"


_NO_RECORD = _NoRecord()


def _schema_text(schema: dict) -> str:
    return ", ".join(f"{f['name']}: {f['type'] if isinstance(f['type'], str) else f['type'].get('type')}"
                     for f in rows.fields(schema))
