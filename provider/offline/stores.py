"""A keyedstate checkpoint as the offline tools see it, on any :class:`~.storage.Storage`.

The same layout as ``checkpoint.py`` (FORMATS.md, "Checkpoint layout"), read through the storage
layer so that it works on every checkpoint location, plus what ``checkpoint.py`` predates:
checkpoint format version 2 (file names ``<v>_<uniqueId>``; the commit log records which id each
store partition committed per batch; a changelog's header records its lineage back to a
snapshot), Spark's offset and commit logs, state schema files, and partition counts per batch.

A version is rebuilt the way the JVM's ``VersionLoader`` loads it: the chain of (version, id)
from the version down to a snapshot (format 1: the newest snapshot at or below it; format 2: the
lineage in the changelogs' headers), the snapshot's files copied to a private local directory
(hard links for local storage), then the changelogs after it.
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ..formats import changelog, layout, rocksdb
from ..formats import manifest as mf
from ..formats.layout import CHANGELOG_SUFFIX, DEFAULT_STORE, FILES_DIR, MANIFEST_SUFFIX
from ..formats.stored import KeyLayout
from ..shim import PROVIDER_CLASS
from .storage import Storage

JOIN_STORES = ("left-keyToNumValues", "left-keyWithIndexToValue", "right-keyToNumValues",
               "right-keyWithIndexToValue")
"""A join's stores in the order Spark keeps their unique ids (checkpoint format 2)."""

UNIQUE_ID = layout.UNIQUE_ID

log = logging.getLogger(__name__)

VersionId = tuple  # (version, unique id or None)


class CheckpointProblem(ValueError):
    """A checkpoint is missing, not keyedstate's, or holds a corrupt file (named in the message,
    with what to do)."""


class NotKeyedstateCheckpoint(CheckpointProblem):
    """The checkpoint's state is another state store provider's (the message names it)."""


PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"


def version_of(name: str, suffix: str) -> tuple[int, str | None] | None:
    """(version, unique id) of ``<v>[_<id>]<suffix>``, else None (``layout.versioned_file``)."""
    return layout.versioned_file(name, suffix)


def versioned_name(version: int, uid: str | None, suffix: str) -> str:
    """``<v>[_<id>]<suffix>``; ids come from the commit log and changelog headers, so anything
    but a UUID (a ``/`` or ``..`` would name another directory) is refused."""
    if uid and not (isinstance(uid, str) and UNIQUE_ID.fullmatch(uid)):
        raise CheckpointProblem(f"{uid!r} is not a unique id of a state store version (a UUID)")
    return f"{version}_{uid}{suffix}" if uid else f"{version}{suffix}"


@dataclass
class StorePartition:
    """One store partition's files."""

    operator: int
    partition: int
    store: str
    path: str
    changelogs: dict[tuple[int, str | None], int] = field(default_factory=dict)  # (v, id) -> size
    snapshots: dict[tuple[int, str | None], int] = field(default_factory=dict)
    foreign: list[str] = field(default_factory=list)
    snapshot_files: dict[str, int] = field(default_factory=dict)  # ks-files/<name> -> size

    @property
    def versions(self) -> list[int]:
        return sorted({v for v, _ in self.changelogs} | {v for v, _ in self.snapshots})

    @property
    def latest(self) -> int | None:
        vs = self.versions
        return vs[-1] if vs else None

    def changelog_path(self, storage: Storage, version: int, uid: str | None = None) -> str:
        return storage.join(self.path, versioned_name(version, uid, CHANGELOG_SUFFIX))

    def manifest_path(self, storage: Storage, version: int, uid: str | None = None) -> str:
        return storage.join(self.path, versioned_name(version, uid, MANIFEST_SUFFIX))

    def describe(self) -> str:
        return f"operator {self.operator} partition {self.partition} store '{self.store}'"


@dataclass
class Operator:
    id: int
    path: str
    name: str | None
    store_partitions: dict[str, int]  # store name -> partition count (operator metadata)
    stores: dict[str, list[StorePartition]]


class Checkpoint:
    """A query's checkpoint location: its logs, operators and store partitions."""

    def __init__(self, storage: Storage, location: str | None = None) -> None:
        self.storage = storage
        self.root = location or storage.root
        if not storage.is_dir(self.root):
            raise CheckpointProblem(f"{self.root}: no such checkpoint directory (give the query's "
                                    "checkpointLocation)")
        self._operators: dict[int, Operator] | None = None

    def path(self, *parts: str) -> str:
        return self.storage.join(self.root, *parts)

    def require_streaming(self) -> None:
        """Refuse a directory that is not a streaming query's checkpoint (Spark writes ``offsets/``
        when the query starts)."""
        if not self.storage.is_dir(self.path("offsets")):
            raise CheckpointProblem(f"{self.root} has no offsets/ directory: not the checkpoint of a streaming query "
                                    "(give the query's checkpointLocation)")

    def state_provider(self) -> tuple[str | None, str | None]:
        """(provider class, the offset-log entry that records it) of the newest batch; (None,
        None) when no entry records one."""
        batches = self.offset_batches()
        if not batches:
            return None, None
        try:
            _, meta, _ = self.offset_entry(batches[-1])
        except (CheckpointProblem, FileNotFoundError):
            return None, None
        cls = (meta.get("conf") or {}).get(PROVIDER_KEY) if isinstance(meta, dict) else None
        return (cls, self.path("offsets", str(batches[-1]))) if isinstance(cls, str) else (None, None)

    def not_keyedstate(self, tool: str) -> str | None:
        """Why the checkpoint's state is not keyedstate's, in one line naming the provider class
        the offset log records (and the first store partition holding another provider's files,
        ``layout.FOREIGN_FILE``); None when it is keyedstate's. Also when the offset log records
        keyedstate (or nothing) while the store partitions hold only another provider's files."""
        cls, where = self.state_provider()
        parts = [sp for op in self.operators().values() for sps in op.stores.values() for sp in sps]
        foreign = next((sp for sp in parts if sp.foreign), None)
        files = (f"; its files were not written by keyedstate ({foreign.path} holds "
                 f"{', '.join(sorted(foreign.foreign)[:3])})" if foreign is not None else "")
        if cls is not None and cls != PROVIDER_CLASS:
            return (f"{self.root} is not a keyedstate checkpoint: its state store provider is {cls}, not keyedstate "
                    f"({where}){files}; keyedstate {tool} reads keyedstate's state only"
                    + ("" if tool == "migrate" else " (keyedstate migrate --to keyedstate converts it)"))
        if foreign is not None and not any(sp.changelogs or sp.snapshots or sp.snapshot_files for sp in parts):
            recorded = f" although {where} records {cls}" if cls else ""
            return (f"{self.root} is not a keyedstate checkpoint{recorded}{files}; restore its state files from a "
                    "copy of the checkpoint, or run the query with the provider that wrote them")
        return None

    def refuse_foreign(self, tool: str) -> None:
        """Refuse what is not a streaming checkpoint, and one whose state is not keyedstate's
        (:class:`NotKeyedstateCheckpoint`, see :meth:`not_keyedstate`)."""
        self.require_streaming()
        why = self.not_keyedstate(tool)
        if why is not None:
            raise NotKeyedstateCheckpoint(why)

    # -- Spark's logs ------------------------------------------------------------------------
    def _log_batches(self, name: str) -> list[int]:
        return sorted(n for e in self.storage.list(self.path(name))
                      if not e.is_dir and (n := layout.number_of(e.name)) is not None)

    def committed_batches(self) -> list[int]:
        return self._log_batches("commits")

    def offset_batches(self) -> list[int]:
        return self._log_batches("offsets")

    def latest_committed(self) -> int | None:
        b = self.committed_batches()
        return b[-1] if b else None

    def offset_entry(self, batch: int) -> tuple[str, dict, list[str]]:
        """(version line, metadata JSON, source offset lines) of ``offsets/<batch>``."""
        p = self.path("offsets", str(batch))
        text = self.storage.read_bytes(p, layout.MAX_SPARK_METADATA_BYTES, "Spark metadata file").decode("utf-8")
        lines = text.split("\n")
        try:
            return lines[0], layout.json_of(lines[1]), lines[2:]
        except (IndexError, ValueError) as exc:
            raise CheckpointProblem(f"{p} is truncated or corrupt ({exc})") from None

    def commit_entry(self, batch: int) -> dict:
        return self._commit(batch)[1]

    def _commit(self, batch: int) -> tuple[str, dict]:
        """Commit ``batch``'s version line and its entry."""
        p = self.path("commits", str(batch))
        header, _, body = self.storage.read_bytes(
            p, layout.MAX_SPARK_METADATA_BYTES, "Spark metadata file").decode("utf-8").partition("\n")
        try:
            return header, layout.json_of(body)
        except ValueError as exc:
            raise CheckpointProblem(f"{p} is truncated or corrupt ({exc})") from None

    def conf_at(self, batch: int, key: str) -> str | None:
        try:
            _, meta, _ = self.offset_entry(batch)
        except FileNotFoundError:
            return None
        return (meta.get("conf") or {}).get(key)

    def provider_at(self, batch: int) -> str | None:
        return self.conf_at(batch, "spark.sql.streaming.stateStore.providerClass")

    def recorded_partitions(self, batch: int) -> int | None:
        """The shuffle partition count ``offsets/<batch>`` records; None once Spark purged the
        entry (it keeps ``minBatchesToRetain`` batches, while a state version can be older)."""
        value = self.conf_at(batch, "spark.sql.shuffle.partitions")
        return int(value) if value is not None else None

    def partitions_at(self, batch: int, op: Operator | None = None) -> int | None:
        """The shuffle partition count of ``batch`` (what the query ran that batch with)."""
        value = self.recorded_partitions(batch)
        if value is not None:
            return value
        if op is not None and op.store_partitions:
            return max(op.store_partitions.values())
        return None

    def checkpoint_format(self, batch: int) -> int:
        """Spark's checkpoint format of commit ``batch``, by Spark's own rule on restart
        (``CheckpointVersionManager``): 2 for a ``v2`` entry or one that records
        ``stateUniqueIds``, else 1 (also when the entry is missing). The offset log's conf does
        not record the format (Spark 4.3)."""
        if not self.storage.exists(self.path("commits", str(batch))):
            return 1
        header, entry = self._commit(batch)
        return 2 if header == "v2" or "stateUniqueIds" in entry else 1

    def unique_ids(self, batch: int) -> dict[str, list[list[str]]] | None:
        """Checkpoint format 2: commit ``batch``'s ``stateUniqueIds`` (operator -> [partition][store])."""
        try:
            return self.commit_entry(batch).get("stateUniqueIds")
        except FileNotFoundError:
            return None

    def unique_id(self, batch: int, operator: int, partition: int, store: str) -> str | None:
        ids = self.unique_ids(batch)
        if not ids or str(operator) not in ids:
            return None
        per_store = ids[str(operator)][partition]
        index = JOIN_STORES.index(store) if store in JOIN_STORES else 0
        uid = per_store[index] if index < len(per_store) else None
        if uid is not None and not (isinstance(uid, str) and UNIQUE_ID.fullmatch(uid)):
            raise CheckpointProblem(f"{self.path('commits', str(batch))} records {uid!r} as the unique id of "
                                    f"operator {operator} partition {partition} store '{store}', which is not a "
                                    "UUID: the commit log is corrupt or was tampered with")
        return uid

    # -- operators and stores ----------------------------------------------------------------
    def operators(self) -> dict[int, Operator]:
        if self._operators is None:
            state = self.path("state")
            ops = {}
            for e in self.storage.list(state):
                if e.is_dir and (n := layout.number_of(e.name)) is not None:
                    ops[n] = self._operator(n, self.storage.join(state, e.name))
            self._operators = dict(sorted(ops.items()))
        return self._operators

    def operator(self, op: int) -> Operator:
        ops = self.operators()
        if op not in ops:
            raise CheckpointProblem(f"{self.path('state', str(op))}: the checkpoint has no stateful operator {op} "
                                    f"(it has {sorted(ops) or 'none'})")
        return ops[op]

    def _operator(self, op: int, path: str) -> Operator:
        name, stores = self.operator_metadata(path)
        found: dict[str, list[StorePartition]] = {}
        for e in self.storage.list(path):
            partition = layout.number_of(e.name) if e.is_dir else None
            if partition is None:
                continue
            part_path = self.storage.join(path, e.name)
            entries = self.storage.list(part_path)
            candidates = [(DEFAULT_STORE, part_path, entries)]
            for sub in entries:
                if sub.is_dir and sub.name not in (FILES_DIR, "_metadata") and not sub.name.startswith("."):
                    sub_path = self.storage.join(part_path, sub.name)
                    candidates.append((sub.name, sub_path, self.storage.list(sub_path)))
            for store, store_path, listing in candidates:
                sp = self._store_partition(op, partition, store, store_path, listing)
                if sp is not None:
                    found.setdefault(store, []).append(sp)
        for parts in found.values():
            parts.sort(key=lambda s: s.partition)
        return Operator(op, path, name, stores, dict(sorted(found.items())))

    def _store_partition(self, op: int, partition: int, store: str, path: str, entries) -> StorePartition | None:
        sp = StorePartition(op, partition, store, path)
        has_files_dir = False
        for e in entries:
            if e.is_dir:
                has_files_dir |= e.name == FILES_DIR
                continue
            if e.name.startswith("."):
                continue
            for suffix, target in ((CHANGELOG_SUFFIX, sp.changelogs), (MANIFEST_SUFFIX, sp.snapshots)):
                vid = version_of(e.name, suffix)
                if vid is not None:
                    target[vid] = e.size
            if layout.FOREIGN_FILE.fullmatch(e.name):
                sp.foreign.append(e.name)
        if has_files_dir:
            files_dir = self.storage.join(path, FILES_DIR)
            sp.snapshot_files = {f"{FILES_DIR}/{e.name}": e.size for e in self.storage.list(files_dir)
                                 if not e.is_dir and not e.name.startswith(".")}
        if not sp.changelogs and not sp.snapshots and not has_files_dir and not sp.foreign:
            return None
        return sp

    def operator_metadata(self, op_path: str) -> tuple[str | None, dict[str, int]]:
        p = self.storage.join(op_path, "_metadata", "metadata")
        try:
            text = self.storage.read_bytes(p, layout.MAX_SPARK_METADATA_BYTES, "Spark metadata file").decode("utf-8")
        except (FileNotFoundError, OSError):
            if self.storage.exists(p):
                raise
            return None, {}
        try:
            version, _, body = text.partition("\n")
            meta = layout.json_of(body)
            return (meta["operatorInfo"]["operatorName"],
                    {layout.checked_store_name(s["storeName"], p): int(s["numPartitions"])
                     for s in meta.get("stateStoreInfo", [])})
        except layout.UnsafePathError as exc:
            raise CheckpointProblem(str(exc)) from None
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointProblem(f"operator metadata {p} is truncated or corrupt ({exc})") from None

    def schema(self, op: int, store: str = DEFAULT_STORE) -> tuple[dict, dict]:
        """(key schema, value schema) from Spark's state schema file (partition 0's)."""
        from .sparkhash import _read_chunks, _read_utf

        base = self.path("state", str(op), "0")
        p = self.storage.join(base, "_metadata", "schema") if store == DEFAULT_STORE else \
            self.storage.join(base, store, "_metadata", "schema")
        try:
            data = self.storage.read_bytes(p)
        except OSError as exc:
            raise CheckpointProblem(f"{p}: cannot read Spark's state schema file ({exc}); offline tools need it to "
                                    "decode keys and values") from None
        try:
            version, pos = _read_utf(data, 0)
            if version == "v1":
                key_json, pos = _read_utf(data, pos)
                value_json, pos = _read_utf(data, pos)
            elif version == "v2":
                key_json, pos = _read_chunks(data, pos)
                value_json, pos = _read_chunks(data, pos)
            else:
                raise ValueError(f"schema format {version[:20]!r} (v1 and v2 are read)")
            fix = lambda s: s.encode("utf-16-le", "surrogatepass").decode("utf-16-le")  # noqa: E731
            return layout.json_of(fix(key_json)), layout.json_of(fix(value_json))
        except (ValueError, UnicodeError) as exc:
            raise CheckpointProblem(f"{p} is not a readable Spark state schema file ({exc})") from None

    # -- files -------------------------------------------------------------------------------
    def read_manifest(self, sp: StorePartition, version: int, uid: str | None = None) -> mf.Manifest:
        p = sp.manifest_path(self.storage, version, uid)
        try:
            data = self.storage.read_bytes(p, layout.MAX_MANIFEST_BYTES, "snapshot manifest")
        except OSError as exc:
            raise CheckpointProblem(f"cannot read snapshot manifest {p}: {exc}") from None
        try:
            return mf.decode(data, p, version)
        except (mf.CorruptManifestError, layout.UnsafePathError) as exc:
            raise CheckpointProblem(str(exc)) from None

    def read_changelog(self, sp: StorePartition, version: int, uid: str | None = None,
                       key_groups: int | None = None) -> changelog.Changelog:
        p = sp.changelog_path(self.storage, version, uid)
        try:
            data = self.storage.read_bytes(p, layout.MAX_CHANGELOG_BYTES, "changelog")
        except OSError as exc:
            raise CheckpointProblem(f"cannot read changelog {p}: {exc}") from None
        try:
            log_ = changelog.decode(data, p)
        except changelog.CorruptChangelogError as exc:
            raise CheckpointProblem(str(exc)) from None
        if log_.version != version:
            raise CheckpointProblem(f"{p} holds version {log_.version}, expected {version}: corrupt or misplaced")
        if key_groups is not None and log_.key_groups != key_groups:
            raise CheckpointProblem(f"{p} was written with {log_.key_groups} key groups, the files before it with "
                                    f"{key_groups}: corrupt or mixed checkpoint")
        return log_

    def chain(self, sp: StorePartition, version: int, uid: str | None = None) -> list[tuple[int, str | None]]:
        """(version, id) from ``version`` down to its base: a snapshot's version, or 0 (empty)."""
        if uid is None:
            for base in sorted((v for v, i in sp.snapshots if v <= version and i is None), reverse=True) + [0]:
                needed = range(base + 1, version + 1)
                missing = [v for v in needed if (v, None) not in sp.changelogs]
                if not missing and not (base and self._snapshot_of_another_run(sp, base)):
                    return [(v, None) for v in range(version, base, -1)] + ([(base, None)] if base else [(0, None)])
            v = version  # no snapshot-based way: back to a changelog written from empty, if any
            while v >= 1 and (v, None) in sp.changelogs:
                if self.read_changelog(sp, v, None).meta.get(changelog.FROM_EMPTY) is True:
                    return [(w, None) for w in range(version, v - 1, -1)] + [(0, None)]
                v -= 1
            missing = [v for v in range(1, version + 1) if (v, None) not in sp.changelogs]
            newest = max((v for v, i in sp.snapshots if v <= version), default=0)
            gap = [v for v in missing if v > newest]
            raise CheckpointProblem(
                f"cannot rebuild version {version} of {sp.describe()}: missing "
                f"{', '.join(sp.changelog_path(self.storage, v) for v in (gap or missing)[:3])}"
                " (deleted by cleanup, or lost: only retained versions can be read)")
        chain = [(version, uid)]
        while True:
            v, i = chain[-1]
            if (v, i) in sp.snapshots or v == 0:
                return chain
            if (v, i) not in sp.changelogs:
                raise CheckpointProblem(f"cannot rebuild version {version} of {sp.describe()}: missing "
                                        f"{sp.changelog_path(self.storage, v, i)}")
            if v == 1:
                chain.append((0, None))
                continue
            meta = self.read_changelog(sp, v, i).meta
            if meta.get(changelog.FROM_EMPTY) is True:  # a base: nothing older is needed
                chain.append((0, None))
                continue
            source = sp.changelog_path(self.storage, v, i)
            older = _older_lineage(meta.get("lineage"), v, source)
            for ov, oid in older:
                if (ov, oid) not in sp.snapshots and (ov, oid) not in sp.changelogs:
                    raise CheckpointProblem(f"cannot rebuild version {version} of {sp.describe()}: {source} records "
                                            f"version {ov} with id {oid} in its lineage, and "
                                            f"{sp.changelog_path(self.storage, ov, oid)} is missing")
                chain.append((ov, oid))
                if (ov, oid) in sp.snapshots:
                    return chain
            # the lineage ends at the last snapshot the writer knew; continue from its changelog

    def _snapshot_of_another_run(self, sp: StorePartition, version: int) -> bool:
        """Whether the snapshot of ``version`` (checkpoint format 1) is of another run's attempt of
        the version than its changelog (:func:`.manifest.of_another_run`): skipped with a warning,
        as the JVM's load does. An unreadable manifest is left to :meth:`rebuild` to report."""
        if (version, None) not in sp.changelogs:
            return False
        try:
            manifest = self.read_manifest(sp, version, None)
        except CheckpointProblem:
            return False
        if manifest.run_id is None:
            return False
        path = sp.changelog_path(self.storage, version)
        try:  # the header alone: a body the replay never reads cannot fail this
            committed = changelog.read_meta(self.storage.read_bytes(path, layout.MAX_CHANGELOG_BYTES, "changelog"),
                                            path).get(changelog.RUN_ID)
        except (OSError, changelog.CorruptChangelogError) as exc:
            why = f"cannot be checked against {path}: {exc}"  # as the JVM's load: skipped
        else:
            why = mf.of_another_run(manifest, committed, path)
        if why is not None:
            log.warning("skipping snapshot manifest %s in favour of an older one plus changelogs: %s",
                        sp.manifest_path(self.storage, version), why)
        return why is not None

    def key_layout(self, sp_list: list[StorePartition]) -> KeyLayout | None:
        """The store's key layout, from the newest manifest or changelog header that records it."""
        for sp in sp_list:
            for v, i in sorted(sp.snapshots, reverse=True):
                with contextlib.suppress(CheckpointProblem):
                    found = self.read_manifest(sp, v, i).key_layout
                    if found is not None:
                        return found
            for v, i in sorted(sp.changelogs, reverse=True)[:1]:
                with contextlib.suppress(CheckpointProblem):
                    node = self.read_changelog(sp, v, i).meta.get("keyLayout")
                    if node is not None:
                        return KeyLayout.from_json(node)
        return None

    def fetch_snapshot(self, sp: StorePartition, manifest: mf.Manifest, source: str, db_dir: Path) -> None:
        """The snapshot's files under their RocksDB names in ``db_dir`` (sizes checked)."""
        for f in manifest.files:
            path = self.storage.join(sp.path, f.path)
            size = self.storage.size(path)
            if size is None:
                raise CheckpointProblem(f"snapshot manifest {source} lists {path}, which is missing")
            if size != f.size:
                raise CheckpointProblem(f"{path} has {size} bytes but snapshot manifest {source} says {f.size}: "
                                        "truncated or corrupt")
            # only SST/blob files are immutable; RocksDB rewrites the others when it opens the directory
            self.storage.fetch(path, db_dir / f.name, link=f.name.endswith((".sst", ".blob")))

    @contextlib.contextmanager
    def rebuild(self, sp: StorePartition, version: int, uid: str | None = None,
                workdir: str | None = None) -> Iterator["Rebuilt"]:
        """A private local RocksDB holding ``version`` (deleted on exit)."""
        chain = self.chain(sp, version, uid)
        base_v, base_id = chain[-1]
        with tempfile.TemporaryDirectory(prefix="keyedstate-offline-", dir=workdir) as tmp:
            db_dir = Path(tmp) / "db"
            db_dir.mkdir()
            manifest = None
            key_groups = None
            if base_v > 0:
                source = sp.manifest_path(self.storage, base_v, base_id)
                manifest = self.read_manifest(sp, base_v, base_id)
                key_groups = manifest.key_groups
                self.fetch_snapshot(sp, manifest, source, db_dir)
            replay = manifest.replay if manifest is not None else None
            to_apply = list(reversed(chain[:-1]))
            db = rocksdb.open_read_only(db_dir) if (manifest is not None and manifest.files and not to_apply
                                                     and not replay) else rocksdb.open_db(db_dir)
            try:
                if replay is not None:
                    data = self.storage.read_bytes(self.storage.join(sp.path, replay.path))
                    try:
                        log_ = changelog.decode(data, self.storage.join(sp.path, replay.path))
                    except changelog.CorruptChangelogError as exc:
                        raise CheckpointProblem(str(exc)) from None
                    _apply(db, log_)
                for v, i in to_apply:
                    log_ = self.read_changelog(sp, v, i, key_groups)
                    key_groups = log_.key_groups
                    _apply(db, log_)
                if to_apply or replay:
                    db.flush()
                yield Rebuilt(db, chain, key_groups, manifest)
            finally:
                db.close()


def _older_lineage(lineage: object, version: int, source: str) -> list[tuple[int, str]]:
    """The (version, id) pairs below ``version`` in the lineage of changelog ``source``'s header:
    consecutive from ``version - 1`` down, each id a UUID (the header is checkpoint data: an id
    becomes part of a file name)."""
    try:
        older = [(int(a), b) for a, b in lineage if int(a) < version]
    except (TypeError, ValueError):
        older = []
    if (not older or older[0][0] != version - 1 or any(b[0] != a[0] - 1 for a, b in zip(older, older[1:]))
            or not all(isinstance(i, str) and UNIQUE_ID.fullmatch(i) for _, i in older)):
        raise CheckpointProblem(f"{source} records the lineage {lineage!r}, which is not the versions before "
                                f"{version} with their unique ids: the changelog is corrupt or was tampered with")
    return older


def _apply(db, log_: changelog.Changelog) -> None:
    try:
        rocksdb.write_changelog(db, log_)
    except changelog.CorruptChangelogError as exc:
        raise CheckpointProblem(str(exc)) from None


@dataclass(frozen=True)
class Rebuilt:
    db: Any
    chain: list
    key_groups: int | None
    manifest: mf.Manifest | None


def partition_key_layout(op: Operator, store: str, key_fields: int, recorded: KeyLayout | None) -> KeyLayout:
    """The recorded key layout, else the one KeyCodec.scala chose (see rescaling._legacy_key_layout)."""
    if recorded is not None:
        return recorded
    if store.endswith("keyWithIndexToValue"):
        return KeyLayout(key_fields, key_fields - 1)
    if "session" in (op.name or "").lower():
        return KeyLayout(key_fields, key_fields - 1, prefix_columns=key_fields - 1)
    return KeyLayout(key_fields, key_fields)
