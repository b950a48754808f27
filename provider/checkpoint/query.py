"""A query's checkpoint location as the offline tools see it, on any :class:`~.storage.Storage`:
Spark's offset and commit logs (checkpoint format, unique ids, partition counts per batch), its
stateful operators and their store partitions (:mod:`.listing`), and their versions
(:mod:`.plans`, :mod:`.rebuilder`).
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

from ..formats import changelog, layout
from ..formats import manifest as mf
from ..formats.layout import DEFAULT_STORE, UNIQUE_ID
from ..formats.stored import KeyLayout
from ..shim import PROVIDER_CLASS
from . import rebuilder as rebuild_
from . import spark
from .errors import CheckpointError, NotKeyedstateCheckpoint
from .listing import JOIN_STORES, StorePartition, list_operator
from .plans import NoPlan
from .rebuilder import Rebuilt
from .snapshots import fetch_snapshot, read_partition_manifest
from .storage import Storage

log = logging.getLogger(__name__)

PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"


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
            raise CheckpointError(f"{self.root}: no such checkpoint directory (give the query's "
                                    "checkpointLocation)")
        self._operators: dict[int, Operator] | None = None

    def path(self, *parts: str) -> str:
        return self.storage.join(self.root, *parts)

    def require_streaming(self) -> None:
        """Refuse a directory that is not a streaming query's checkpoint (Spark writes ``offsets/``
        when the query starts)."""
        if not self.storage.is_dir(self.path("offsets")):
            raise CheckpointError(f"{self.root} has no offsets/ directory: not the checkpoint of a streaming query "
                                    "(give the query's checkpointLocation)")

    def state_provider(self) -> tuple[str | None, str | None]:
        """(provider class, the offset-log entry that records it) of the newest batch; (None,
        None) when no entry records one."""
        batches = self.offset_batches()
        if not batches:
            return None, None
        try:
            _, meta, _ = self.offset_entry(batches[-1])
        except (CheckpointError, FileNotFoundError):
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
        return spark.parse_log_entry(spark.read_spark_file(self.storage, p), p)

    def commit_entry(self, batch: int) -> dict:
        return self._commit(batch)[1]

    def _commit(self, batch: int) -> tuple[str, dict]:
        """Commit ``batch``'s version line and its entry."""
        p = self.path("commits", str(batch))
        header, entry, _ = spark.parse_log_entry(spark.read_spark_file(self.storage, p), p)
        return header, entry

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
            raise CheckpointError(f"{self.path('commits', str(batch))} records {uid!r} as the unique id of "
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
                    path = self.storage.join(state, e.name)
                    name, stores = self.operator_metadata(path)
                    ops[n] = Operator(n, path, name, stores, list_operator(self.storage, n, path))
            self._operators = dict(sorted(ops.items()))
        return self._operators

    def operator(self, op: int) -> Operator:
        ops = self.operators()
        if op not in ops:
            raise CheckpointError(f"{self.path('state', str(op))}: the checkpoint has no stateful operator {op} "
                                  f"(it has {sorted(ops) or 'none'})")
        return ops[op]

    def operator_metadata(self, op_path: str) -> tuple[str | None, dict[str, int]]:
        return spark.operator_metadata(self.storage, op_path)

    def schema(self, op: int, store: str = DEFAULT_STORE) -> tuple[dict, dict]:
        """(key schema, value schema) from Spark's state schema file (partition 0's)."""
        base = self.path("state", str(op), "0")
        p = self.storage.join(base, "_metadata", "schema") if store == DEFAULT_STORE else \
            self.storage.join(base, store, "_metadata", "schema")
        return spark.read_schema(self.storage, p)

    # -- files and versions (see snapshots.py, plans.py, rebuild.py) -------------------------
    def read_manifest(self, sp: StorePartition, version: int, uid: str | None = None) -> mf.Manifest:
        return read_partition_manifest(self.storage, sp, version, uid)

    def read_changelog(self, sp: StorePartition, version: int, uid: str | None = None,
                       key_groups: int | None = None) -> changelog.Changelog:
        return rebuild_.read_changelog(self.storage, sp, version, uid, key_groups)

    def fetch_snapshot(self, sp: StorePartition, manifest: mf.Manifest, source: str, db_dir: Path) -> None:
        fetch_snapshot(self.storage, sp, manifest, source, db_dir)

    def chain(self, sp: StorePartition, version: int, uid: str | None = None) -> list[tuple[int, str | None]]:
        """The best plan for ``version`` (:mod:`.plans`), (version, id) down to its base: a
        snapshot's, or (0, None) for empty. Under checkpoint format 1 a snapshot of another run's
        attempt of its version is passed over, with a warning, as a load does."""
        problems = []
        for plan in rebuild_.partition_plans(self.storage, sp, version, uid):
            if isinstance(plan, NoPlan):
                problems.append(plan.reason)
                continue
            base_v, base_id = plan[-1]
            if base_v and uid is None and self._snapshot_of_another_run(sp, base_v):
                continue
            return list(plan)
        raise rebuild_.cannot_rebuild(sp, version, problems)

    def _snapshot_of_another_run(self, sp: StorePartition, version: int) -> bool:
        """An unreadable manifest is left to the reader of the snapshot to report."""
        try:
            manifest = self.read_manifest(sp, version, None)
        except CheckpointError:
            return False
        why = rebuild_.of_another_run(self.storage, sp, version, manifest)
        if why is not None:
            log.warning("skipping snapshot manifest %s in favour of an older one plus changelogs: %s",
                        sp.manifest_path(self.storage, version), why)
        return why is not None

    def key_layout(self, sp_list: list[StorePartition]) -> KeyLayout | None:
        """The store's key layout, from the newest manifest or changelog header that records it."""
        for sp in sp_list:
            for v, i in sorted(sp.snapshots, key=_newest, reverse=True):
                with contextlib.suppress(CheckpointError):
                    found = self.read_manifest(sp, v, i).key_layout
                    if found is not None:
                        return found
            for v, i in sorted(sp.changelogs, key=_newest, reverse=True)[:1]:
                with contextlib.suppress(CheckpointError):
                    node = rebuild_.changelog_meta(self.storage, sp, v, i).get("keyLayout")
                    if node is not None:
                        return KeyLayout.from_json(node)
        return None

    def rebuild(self, sp: StorePartition, version: int, uid: str | None = None, workdir: str | None = None,
                skip_unusable: bool = True, count_key_groups: bool = False) -> contextlib.AbstractContextManager[Rebuilt]:
        """A private local RocksDB holding ``version`` (deleted on exit; :func:`.rebuilder.rebuild`)."""
        return rebuild_.rebuild(self.storage, sp, version, uid, workdir, skip_unusable=skip_unusable,
                                count_key_groups=count_key_groups)


def _newest(vid: tuple[int, str | None]) -> tuple[int, str]:
    return vid[0], vid[1] or ""
