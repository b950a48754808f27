"""``keyedstate migrate``: move a stopped query's state between state store providers.

Spark pins a stateful query to the provider of its first batch (the offset log records it). A
migration converts the state of the last committed batch ``B`` (state version ``B + 1``) of
every operator and store to another provider, both ways between Spark's built-in providers
(``hdfs``: HDFSBackedStateStoreProvider, ``rocksdb``: RocksDBStateStoreProvider) and keyedstate,
and preserves batch ids: restarted, the query runs batch ``B + 1`` on the new provider, from
exactly the state it had.

How, in order (every step can be rerun):

1. **Plan** (``--dry-run`` stops here): the last batch must be committed; the source provider is
   the one ``offsets/B`` records; per operator and store, the schemas (Spark's schema files), the
   prefix-key columns (operator metadata) and the partition count (``offsets/B``).
2. **Write** every store partition's version ``B + 1`` for the target provider, in the same
   directories, beside the source's files (their names never collide: ``<v>.delta``/``.snapshot``,
   ``<v>.zip``/``.changelog`` + ``SSTs/``, ``<v>.ks-changelog``/``.ks-snapshot`` + ``ks-files/``).
   The rows are read with Spark's state data source from the source provider and written with
   the target provider's own classes (``io.keyedstate.offline.StateMigrator``, in Spark tasks).
   Nothing the source provider reads is touched.
3. **Switch**: ``offsets/B`` is rewritten with the target provider class, in one atomic step (a
   rename over the old file on local disks and HDFS, a single PUT on object stores). Until then
   the checkpoint is the source provider's, whole; a migration killed before it is simply rerun.
   This is the only file the migration modifies.
4. **Retire** the source provider's files (unless ``keep_old``): a later ``rescale`` or
   ``verify`` then sees one provider's files. Deleting them can also be rerun.

Refused, with what to do: an uncommitted last batch, checkpoint format version 2 (its commit log
pins unique ids of the source's files), transformWithState operators.
"""
from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..checkpoint import spark as spark_files
from ..formats.layout import BORROWER_MARKER, RETIRED_MARKER, number_of
from .checkpoint_format import refuse_checkpoint_format_2
from .progress import tracked
from .storage import HadoopStorage, LocalStorage, Storage, active_or_new_session, is_local
from ..checkpoint import Checkpoint, CheckpointProblem

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
PROVIDERS = {
    "keyedstate": "io.keyedstate.spark.KeyedStateProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}
DEFAULT_PROVIDER = PROVIDERS["hdfs"]  # what Spark uses when the offset log records none
_UUID = r"(?:_[0-9a-fA-F-]{36})?"
FILES_OF = {  # a provider's files in a store partition directory: (file pattern, its directories)
    PROVIDERS["hdfs"]: (re.compile(r"[0-9]+\.(?:delta|snapshot)"), ()),
    PROVIDERS["rocksdb"]: (re.compile(r"[0-9]+" + _UUID + r"\.(?:zip|changelog)"), ("SSTs",)),
    PROVIDERS["keyedstate"]: (re.compile(r"[0-9]+" + _UUID + r"\.ks-(?:changelog|snapshot)"), ("ks-files",)),
}
UNVERSIONED_FILES_OF = {  # a provider's other files there, which retiring it deletes too
    PROVIDERS["keyedstate"]: re.compile(f"{BORROWER_MARKER.pattern}|{RETIRED_MARKER.pattern}"),  # a rescale's markers
}


class MigrateError(RuntimeError):
    """The checkpoint cannot be migrated as it is; the message names the path and what to do."""


def provider_class(name: str) -> str:
    if name in PROVIDERS:
        return PROVIDERS[name]
    if name in PROVIDERS.values():
        return name
    raise MigrateError(f"unknown provider {name!r}: one of {', '.join(PROVIDERS)}")


def short_name(cls: str) -> str:
    return next((k for k, v in PROVIDERS.items() if v == cls), cls)


@dataclass
class StorePlan:
    operator: int
    operator_name: str | None
    store: str
    partitions: int
    prefix_columns: int
    key_schema: dict
    value_schema: dict

    def to_dict(self) -> dict[str, Any]:
        return {"operator": self.operator, "operatorName": self.operator_name, "store": self.store,
                "partitions": self.partitions, "prefixKeyColumns": self.prefix_columns,
                "key": [f["name"] for f in self.key_schema["fields"]],
                "value": [f["name"] for f in self.value_schema["fields"]]}


@dataclass
class Plan:
    checkpoint: str
    batch: int
    source: str
    target: str
    stores: list[StorePlan] = field(default_factory=list)
    already: bool = False

    def to_dict(self) -> dict[str, Any]:
        steps = [] if self.already else [
            f"write version {self.batch + 1} of {len(self.stores)} store(s) with {short_name(self.target)} "
            "beside the current files",
            f"switch: rewrite offsets/{self.batch} with providerClass={self.target} (atomic)",
            f"retire the {short_name(self.source)} files"]
        return {"checkpoint": self.checkpoint, "batch": self.batch, "version": self.batch + 1,
                "from": self.source, "to": self.target, "alreadyMigrated": self.already,
                "stores": [s.to_dict() for s in self.stores], "steps": steps}


def plan(ck: Checkpoint, target: str, *, change: bool = True) -> Plan:
    """What a migration of ``ck`` to provider ``target`` would do (``change=False``: only what
    it reads, which a checkpoint-format-2 query also has)."""
    committed = ck.committed_batches()
    offsets = ck.offset_batches()
    if not committed:
        raise MigrateError(f"{ck.path('commits')}: the query never committed a batch; there is no state to migrate "
                           "(start the query with the new provider instead)")
    batch = committed[-1]
    if offsets and offsets[-1] > batch:
        raise MigrateError(f"{ck.path('offsets', str(offsets[-1]))}: batch {offsets[-1]} started but did not commit "
                           "(the query is running, or failed): stop the query, or restart it once so that it "
                           "completes the batch, then migrate")
    if change:
        refuse_checkpoint_format_2(ck, batch, error=MigrateError,
                                   reason="checkpoint format version 2 (the commit log pins the unique ids of the "
                                          "provider's files) is not supported by migrate or the state processor's "
                                          "changes (its reads are)")
    source = ck.provider_at(batch) or DEFAULT_PROVIDER
    if source == PROVIDERS["keyedstate"] and (foreign := ck.not_keyedstate("migrate")):
        raise MigrateError(foreign)  # the data source would fail on it in Spark, naming no file
    result = Plan(ck.root, batch, source, target, already=source == target)
    for op in ck.operators().values():
        meta = _operator_metadata(ck, op.path)
        if meta is None:
            raise MigrateError(f"{ck.storage.join(op.path, '_metadata', 'metadata')} is missing: migrate needs "
                               "Spark's operator metadata (written by Spark 3.5+ at the query's first batch)")
        name, stores = meta
        if name and "transformWithState" in name:
            raise MigrateError(f"{op.path}: transformWithState state runs only on Spark's RocksDB provider")
        partitions = ck.partitions_at(batch, op) or max(n for _, n, _ in stores)
        for store, _, prefix in stores:
            key_schema, value_schema = ck.schema(op.id, store)
            result.stores.append(StorePlan(op.id, name, store, partitions, prefix, key_schema, value_schema))
    return result


def _operator_metadata(ck: Checkpoint, op_path: str) -> tuple[str | None, list[tuple[str, int, int]]] | None:
    """The operator's name and stores (:func:`..checkpoint.spark.parse_operator_stores`); None
    when the operator has no metadata file."""
    p = ck.storage.join(op_path, "_metadata", "metadata")
    try:
        data = spark_files.read_spark_file(ck.storage, p)
    except OSError:
        return None
    try:
        return spark_files.parse_operator_stores(data, p)
    except CheckpointProblem as exc:  # a store name becomes a directory that _retire deletes from
        raise MigrateError(str(exc)) from None


def migrate(checkpoint: str | os.PathLike, provider: str, spark: "SparkSession | None" = None, *,
            dry_run: bool = False, keep_old: bool = False) -> dict[str, Any]:
    """Migrate a stopped query's state to ``provider`` (``keyedstate``, ``rocksdb``, ``hdfs`` or a
    class name); see the module doc. Returns the plan, and what was written."""
    target = provider_class(provider)
    location = os.fspath(checkpoint)
    local = is_local(location)
    if spark is None and not local:
        spark = active_or_new_session()
    storage: Storage = LocalStorage(location) if local else HadoopStorage(location, spark)
    ck = Checkpoint(storage)  # a local checkpoint is checked and planned before Spark starts
    if not storage.is_dir(ck.path("commits")):
        ck.require_streaming()  # else the plan says that no batch committed
    the_plan = plan(ck, target)
    out = the_plan.to_dict()
    if dry_run:
        return out
    if the_plan.already:
        _retire(ck, the_plan, keep_old)
        return out
    if spark is None:
        spark = active_or_new_session()
    started = time.monotonic()
    uri = _uri(storage, ck.root)
    _, meta, _ = ck.offset_entry(the_plan.batch)
    confs = {k: str(v) for k, v in (meta.get("conf") or {}).items() if k != PROVIDER_KEY}
    written = []
    for s in the_plan.stores:
        df = (spark.read.format("statestore").option("batchId", the_plan.batch).option("operatorId", s.operator)
              .option("storeName", s.store).load(uri))
        rows = write_store(spark, ck, s, df, s.value_schema, the_plan.batch, target, confs)
        written.append({"operator": s.operator, "store": s.store, "rows": rows})
        log.info("migrate: operator %s store %s: %s rows written for %s", s.operator, s.store, rows,
                 short_name(target))
    _switch(ck, the_plan)
    _retire(ck, the_plan, keep_old)
    out["written"] = written
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def write_store(spark: "SparkSession", ck: Checkpoint, s: StorePlan, rows, value_schema: dict, batch: int,
                provider: str, confs: dict[str, str]) -> int:
    """Write version ``batch + 1`` of every partition of one store with ``provider``'s own classes,
    from a DataFrame of ``key``, ``value``, ``partition_id`` (``StateMigrator``, in Spark tasks);
    returns the rows written. ``batch`` is the last committed batch, so whatever files of that
    version lie there are an attempt that never committed (a query's, or a killed or undone
    change's): they are deleted first, or a provider would keep them as the version."""
    _delete_version(ck, s, batch + 1, provider)
    uri = _uri(ck.storage, ck.root)
    with tracked(spark.sparkContext, "write", f"operator {s.operator} store {s.store}: writing", s.partitions, log,
                 "partitions"):
        counts = spark.sparkContext._jvm.io.keyedstate.offline.StateMigrator.migrateStore(
            spark._jsparkSession, rows._jdf, uri, s.operator, s.store, s.partitions, batch,
            json.dumps(s.key_schema), json.dumps(value_schema), s.prefix_columns, provider, confs)
    return int(sum(counts))


def require_state_migrator(spark: "SparkSession", error: type[MigrateError] = MigrateError) -> None:
    """Refuse, before anything is written, a session whose JVM cannot run :func:`write_store`
    (keyedstate's jar is not on its classpath: py4j then gives a package, not the class)."""
    from py4j.java_gateway import JavaClass

    if not isinstance(spark.sparkContext._jvm.io.keyedstate.offline.StateMigrator, JavaClass):
        raise error("this SparkSession's JVM has no io.keyedstate.offline.StateMigrator (keyedstate's jar is "
                           "not on its classpath): create the session with keyedstate.configure(builder), or pass "
                           "--jars $(keyedstate jar); nothing was written")


def _delete_version(ck: Checkpoint, s: StorePlan, version: int, provider: str) -> None:
    pattern = FILES_OF.get(provider, (None,))[0]
    if pattern is None:
        return
    for p in range(s.partitions):
        d = ck.path("state", str(s.operator), str(p)) if s.store == "default" else \
            ck.path("state", str(s.operator), str(p), s.store)
        stale = []
        for e in ck.storage.list(d):
            name = e.name[1:-4] if e.name.startswith(".") and e.name.endswith(".crc") else e.name
            if not e.is_dir and pattern.fullmatch(name) and int(re.match(r"[0-9]+", name).group()) == version:
                stale.append(e.name)
        # Snapshots first: one left without its changelog (a kill, a failed delete) would be
        # taken as the version, while a changelog left alone is refused by the query's commit.
        for name in sorted(stale, key=lambda n: not n.removesuffix(".crc").endswith(("snapshot", ".zip"))):
            log.info("deleting %s: version %d never committed", ck.storage.join(d, name), version)
            ck.storage.delete(ck.storage.join(d, name))


def _uri(storage: Storage, root: str) -> str:
    return "file://" + root if isinstance(storage, LocalStorage) else root


def _switch(ck: Checkpoint, the_plan: Plan) -> None:
    """Rewrite offsets/B with the target provider: the migration's one atomic commit."""
    path = ck.path("offsets", str(the_plan.batch))
    text = spark_files.read_spark_file(ck.storage, path).decode("utf-8")
    head, sep, rest = text.partition("\n")
    line, nl, tail = rest.partition("\n")
    meta = json.loads(line)
    meta.setdefault("conf", {})[PROVIDER_KEY] = the_plan.target
    new = head + sep + json.dumps(meta, separators=(",", ":")) + nl + tail
    ck.storage.replace(path, new.encode("utf-8"))


def _retire(ck: Checkpoint, the_plan: Plan, keep_old: bool) -> None:
    """Delete the files of providers other than the target in every store partition directory."""
    if keep_old:
        return
    storage = ck.storage
    for s in the_plan.stores:
        op_path = ck.path("state", str(s.operator))
        for part in storage.list(op_path):
            if not (part.is_dir and number_of(part.name) is not None):
                continue
            d = storage.join(op_path, part.name) if s.store == "default" else storage.join(op_path, part.name, s.store)
            for cls, (pattern, dirs) in FILES_OF.items():
                if cls == the_plan.target:
                    continue
                other = UNVERSIONED_FILES_OF.get(cls)
                for e in storage.list(d):
                    name = e.name[1:-4] if e.name.startswith(".") and e.name.endswith(".crc") else e.name
                    ours = pattern.fullmatch(name) or (other is not None and other.fullmatch(name))
                    if (not e.is_dir and ours) or (e.is_dir and e.name in dirs):
                        storage.delete(storage.join(d, e.name))


def render(result: dict[str, Any]) -> str:
    lines = [f"{result['checkpoint']}: batch {result['batch']} (state version {result['version']}), "
             f"{short_name(result['from'])} -> {short_name(result['to'])}"]
    if result["alreadyMigrated"]:
        lines.append("  already on the target provider: nothing to write")
    for s in result["stores"]:
        lines.append(f"  operator {s['operator']} ({s['operatorName']}) store {s['store']}: {s['partitions']} "
                     f"partition(s), key ({', '.join(s['key'])}), value ({', '.join(s['value'])})")
    for i, step in enumerate(result["steps"], 1):
        lines.append(f"  step {i}: {step}")
    if "written" in result:
        lines.append(f"  done in {result['seconds']} s: "
                     + ", ".join(f"op {w['operator']}/{w['store']}: {w['rows']} rows" for w in result["written"]))
    return "\n".join(lines) + "\n"
