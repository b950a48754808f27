"""The state processor: read, transform and bootstrap a stopped query's state from Python.

Flink's State Processor API is the model: state is data. ``keyedstate.state(spark, checkpoint)``
returns a :class:`StateProcessor` over any checkpoint location and any provider (HDFS-backed,
RocksDB, keyedstate):

* :meth:`~StateProcessor.read`: any operator's store at any retained batch, as a DataFrame
  ``(key struct, value struct, partition_id)`` (Spark's state data source underneath);
* :meth:`~StateProcessor.transform`: a user function over ``(key, value)`` rows, each given as
  a dict of the state schema's fields, returning the new value (a dict, or None to drop the key),
  optionally into a new value schema (the state schema of the new version of the query, e.g. a
  field added to an ``applyInPandasWithState`` state): the change that used to mean dropping
  the state;
* :meth:`~StateProcessor.bootstrap`: state from a batch DataFrame with ``key`` and ``value``
  struct columns (e.g. the ids a dedup has already seen, aggregates computed from history),
  merged over the store's current state or replacing it.

User functions reach the Python workers that run them as cloudpickle payloads (the same
serializer PySpark uses for closures, applied explicitly so that a function defined in a
notebook or ``__main__`` travels by value).

**What a change produces.** Every change is one *state batch* appended to the checkpoint, the
form Spark's own offline repartition writes: ``offsets/B+1`` (the last entry again: no input is
read in it), state version ``B+2`` of every store partition of every operator (the changed store
with its new rows, the others copied as they are; any files of that version there before, an
attempt that never committed, are deleted first), and ``commits/B+1``, in that order. Written
by the query's own provider classes, so that the result is a normal checkpoint version that the
query restarts from (with the same provider, or any other after ``keyedstate migrate``). The
restarted query's batch ids continue after ``B+1``. Nothing existing is modified, except Spark's
state schema file of the changed store when its value schema changes (rewritten after the state
is written, before the commit).

**Checked first.** A transform runs the function over every row before anything is written:
a value that does not fit the target value schema (an unknown or missing field, a value of
another type, None in a non-nullable field), or a function that raises, fails the change with
the first such row, and the checkpoint is left as it was. ``dry_run`` stops there and shows a
sample of rows before and after.

**Undo.** Before writing, a change records in ``_keyedstate_changes/<B+1>.json`` every name
under the checkpoint and the bytes of the schema file it will rewrite. :func:`undo` (``keyedstate
undo``) takes the change back exactly: ``commits/B+1`` first (from then on the change has not
happened), the schema file's old bytes, every file and directory the change added (snapshots
before changelogs: a changelog left alone is refused by a query's commit, a snapshot would be
taken as the version), ``offsets/B+1``, the record. It refuses when a batch has started on top of
the change (undoing it would lose that batch) and when there is no change to undo. A change that
fails is taken back the same way before its error is raised; if that too is cut short (a kill),
the next change or :func:`undo` recognises the leftover by its record and removes it first.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import struct
from typing import TYPE_CHECKING, Any, Callable

from .migration import (DEFAULT_PROVIDER, Plan, StorePlan, plan as plan_of, require_state_migrator,
                        write_store)
from .changes import (CHANGES_DIR, StateProcessorError, begin, roll_back, schema_path,  # noqa: F401
                      short, undo_last, unfinished_change)
from .progress import tracked
from .storage import HadoopStorage, LocalStorage, Storage, is_local, open_storage
from ..checkpoint import Checkpoint, partition_key_layout
from ..checkpoint.spark import read_spark_file

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

_SAMPLE = 5


def state(spark: "SparkSession", checkpoint: str | os.PathLike) -> "StateProcessor":
    """The state processor of a stopped query's checkpoint (any scheme Spark accepts)."""
    return StateProcessor(spark, checkpoint)


def undo(checkpoint: str | os.PathLike, spark: "SparkSession | None" = None) -> dict[str, Any]:
    """Take back the last change (transform, bootstrap) made to the stopped query's checkpoint,
    exactly (see the module doc); a local checkpoint needs no Spark. Returns what was undone."""
    return undo_last(Checkpoint(open_storage(checkpoint, spark)))


class StateProcessor:
    def __init__(self, spark: "SparkSession", checkpoint: str | os.PathLike) -> None:
        self.spark = spark
        location = os.fspath(checkpoint)
        self.storage: Storage = LocalStorage(location) if is_local(location) else HadoopStorage(location, spark)
        self.ck = Checkpoint(self.storage)
        self.uri = "file://" + self.ck.root if isinstance(self.storage, LocalStorage) else self.ck.root

    # -- reading -------------------------------------------------------------------------------
    def operators(self) -> list[dict[str, Any]]:
        """Every stateful operator: id, name, stores with their key and value schemas."""
        p = plan_of(self.ck, "", change=False)
        out: dict[int, dict[str, Any]] = {}
        for s in p.stores:
            op = out.setdefault(s.operator, {"operator": s.operator, "name": s.operator_name,
                                             "partitions": s.partitions, "stores": {}})
            op["stores"][s.store] = {"key": s.key_schema, "value": s.value_schema}
        return list(out.values())

    def read(self, operator: int = 0, store: str | None = None, batch: int | None = None) -> "DataFrame":
        """The store's rows at ``batch`` (default: the last committed): key, value, partition_id."""
        reader = self.spark.read.format("statestore").option("operatorId", operator)
        if store is not None:
            reader = reader.option("storeName", store)
        if batch is not None:
            reader = reader.option("batchId", batch)
        return reader.load(self.uri).select("key", "value", "partition_id")

    # -- changing ------------------------------------------------------------------------------
    def transform(self, operator: int, fn: Callable[[dict, dict], dict | None], *, store: str | None = None,
                  value_schema: Any = None, dry_run: bool = False, sample: int = _SAMPLE) -> dict[str, Any]:
        """Replace every value of one store by ``fn(key, value)`` (None drops the key), optionally
        into ``value_schema`` (a StructType or DDL string). Every returned value is checked against
        the target value schema before anything is written. ``dry_run``: write nothing; print and
        return the counts and ``sample`` rows before and after. Returns what was written."""
        import cloudpickle
        from pyspark import StorageLevel
        from pyspark.sql import types as T

        p, target = self._target(operator, store, take_over=not dry_run)
        new_value = _struct(self.spark, value_schema) if value_schema is not None else \
            T.StructType.fromJson(target.value_schema)
        key_type = T.StructType.fromJson(target.key_schema)
        payload = cloudpickle.dumps(fn)

        def apply(rows):
            import cloudpickle as cp

            user = cp.loads(payload)
            for r in rows:
                key = r.key.asDict(recursive=True)
                try:  # the function gets its own copies: one that edits them in place keeps "before" intact
                    value = user(r.key.asDict(recursive=True), r.value.asDict(recursive=True))
                except Exception as exc:
                    yield r.key, key, r.value.asDict(recursive=True), None, r.partition_id, \
                        f"raised {type(exc).__name__}: {short(str(exc))}"
                    continue
                why = None if value is None else _misfit(new_value, value, "")
                yield r.key, key, r.value.asDict(recursive=True), value, r.partition_id, \
                    why and f"returned {short(repr(value))}: {why}"

        current = self.read(operator, target.store, p.batch)
        results = current.rdd.mapPartitions(apply).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            with tracked(self.spark.sparkContext, "transform", f"operator {operator} store {target.store}: checking",
                         results.getNumPartitions(), log, "partitions"):
                counts = _summary(results.mapPartitions(_summarise).collect())
            where = f"{self.ck.root}: operator {operator} store {target.store}"
            if counts["bad"]:
                key, why = counts["first"]
                raise StateProcessorError(
                    f"{where}: the transform's function gave {counts['bad']} of {counts['rows']} value(s) that do "
                    f"not fit the value schema {new_value.simpleString()}; the first: key {short(repr(key))} "
                    f"{why}. Nothing was written")
            out = {"checkpoint": self.ck.root, "operator": operator, "store": target.store,
                   "rows": counts["rows"], "kept": counts["kept"], "dropped": counts["rows"] - counts["kept"]}
            if dry_run:
                out.update(dryRun=True, batch=p.batch + 1, valueSchema=new_value.simpleString(),
                           sample=[{"key": t[1], "before": t[2], "after": _plain(t[3])} for t in results.take(sample)])
                print(render_dry_run(out))
                return out
            schema = T.StructType([T.StructField("key", key_type), T.StructField("value", new_value),
                                   T.StructField("partition_id", T.IntegerType())])
            changed = self.spark.createDataFrame(
                results.filter(lambda t: t[3] is not None or t[5] is not None).map(_written(new_value)), schema)
            return {**self._write_state_batch(p, target, changed, json.loads(new_value.json()), "transform"),
                    **{k: out[k] for k in ("kept", "dropped")}}
        finally:
            results.unpersist()

    def bootstrap(self, operator: int, data: "DataFrame", *, store: str | None = None,
                  replace: bool = False) -> dict[str, Any]:
        """Put ``data``'s rows (columns ``key`` and ``value``, structs of the state schema) into
        one store: over its current state (a key in ``data`` wins), or instead of it
        (``replace``). Each row goes to the partition Spark's hash gives its key."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        p, target = self._target(operator, store)
        key_type = T.StructType.fromJson(target.key_schema)
        value_type = T.StructType.fromJson(target.value_schema)
        if "value" not in data.columns and all(isinstance(f.dataType, T.NullType) for f in value_type.fields):
            # a store whose values carry nothing (dropDuplicates): the keys are the state
            data = data.withColumn("value", F.struct(*[F.lit(None).cast(f.dataType).alias(f.name)
                                                       for f in value_type.fields]))
        missing = {"key", "value"} - set(data.columns)
        if missing:
            raise StateProcessorError(f"bootstrap data needs the columns key and value (structs of the state schema: "
                                      f"key {key_type.simpleString()}, value {value_type.simpleString()}); it has "
                                      f"{data.columns}")
        op = self.ck.operator(operator)
        layout = partition_key_layout(op, target.store, len(key_type.fields),
                                      self.ck.key_layout(op.stores.get(target.store, [])))
        hashed = [F.col(f"key.{f.name}") for f in key_type.fields[:layout.partition_key_columns]]
        rows = data.select(F.col("key").cast(key_type).alias("key"), F.col("value").cast(value_type).alias("value"))
        rows = rows.withColumn("partition_id", F.pmod(F.hash(*hashed), F.lit(p.stores[0].partitions)).cast("int"))
        if not replace:
            current = self.read(operator, target.store, p.batch)
            rows = rows.unionByName(current.join(rows.select("key"), "key", "left_anti"))
        return self._write_state_batch(p, target, rows, target.value_schema, "bootstrap")

    def undo(self) -> dict[str, Any]:
        """Take back the last change to this checkpoint (see :func:`undo`)."""
        return undo_last(self.ck)

    # -- internals -----------------------------------------------------------------------------
    def _plan(self, take_over: bool = True) -> Plan:
        leftover = unfinished_change(self.ck)
        if leftover is not None:
            batch = leftover["batch"]
            if not take_over:
                raise StateProcessorError(
                    f"{self.ck.path('offsets', str(batch))}: an unfinished {leftover['operation']} of the state "
                    f"processor (batch {batch}, cut short); the next change removes it first, or "
                    f"`keyedstate undo --checkpoint {self.ck.root}` does")
            log.warning("%s: removing the unfinished %s of batch %d that a state processor call left behind",
                        self.ck.root, leftover["operation"], batch)
            roll_back(self.ck, leftover)
        p = plan_of(self.ck, "")
        p.target = p.source
        return p

    def _target(self, operator: int, store: str | None, take_over: bool = True) -> tuple[Plan, StorePlan]:
        p = self._plan(take_over)
        stores = [s for s in p.stores if s.operator == operator]
        if not stores:
            raise StateProcessorError(f"{self.ck.path('state', str(operator))}: no stateful operator {operator} "
                                      f"(operators: {sorted({s.operator for s in p.stores})})")
        if store is None and len(stores) > 1:
            raise StateProcessorError(f"operator {operator} has the stores {[s.store for s in stores]}: name one")
        chosen = next((s for s in stores if store in (None, s.store)), None)
        if chosen is None:
            raise StateProcessorError(f"operator {operator} has no store {store!r} ({[s.store for s in stores]})")
        return p, chosen

    def _write_state_batch(self, p: Plan, changed: StorePlan, rows: "DataFrame", value_schema: dict,
                           operation: str) -> dict:
        """offsets/B+1, every store's version B+2 (``changed`` from ``rows``), schema, commits/B+1;
        recorded first, and taken back whole if any step fails."""
        batch = p.batch + 1
        provider = p.source or DEFAULT_PROVIDER
        require_state_migrator(self.spark, StateProcessorError)
        journal = begin(self.ck, p, changed, value_schema, operation)
        try:
            offsets = self.ck.path("offsets", str(batch))
            if not self.storage.exists(offsets):
                self.storage.write_atomic(offsets, read_spark_file(self.storage, self.ck.path("offsets", str(p.batch))))
            _, meta, _ = self.ck.offset_entry(batch)
            confs = {k: str(v) for k, v in (meta.get("conf") or {}).items()
                     if k != "spark.sql.streaming.stateStore.providerClass"}
            written = []
            for s in p.stores:
                if s is changed:
                    df, vs = rows, value_schema
                else:
                    df, vs = self.read(s.operator, s.store, p.batch), s.value_schema
                n = write_store(self.spark, self.ck, s, df, vs, batch, provider, confs)
                written.append({"operator": s.operator, "store": s.store, "rows": n})
            if value_schema != changed.value_schema:
                self._write_schema(changed, value_schema, batch)
            commit = read_spark_file(self.storage, self.ck.path("commits", str(p.batch)))
            self.storage.write_atomic(self.ck.path("commits", str(batch)), commit)
        except BaseException as failure:
            log.warning("%s: the %s of batch %d failed (%s); removing what it wrote", self.ck.root, operation,
                        batch, type(failure).__name__)
            try:
                roll_back(self.ck, journal)
            except BaseException as exc:
                log.error("%s: could not remove what the failed %s wrote (%s); the next change or `keyedstate "
                          "undo` removes it", self.ck.root, operation, exc)
            raise
        return {"checkpoint": self.ck.root, "batch": batch, "version": batch + 1, "provider": provider,
                "written": written}

    def _write_schema(self, s: StorePlan, value_schema: dict, batch: int) -> None:
        """Spark's state schema file (format v2) of the store, with the new value schema. Spark
        keeps one schema per store, so the state data source then reads the batches before the
        change with the new schema: the previous file is kept beside it as
        ``schema.before-batch-<batch>`` (to read those batches)."""
        path = schema_path(self.ck, s)
        data = _utf("v2") + _chunks(json.dumps(s.key_schema, separators=(",", ":"))) + \
            _chunks(json.dumps(value_schema, separators=(",", ":")))
        backup = f"{path}.before-batch-{batch}"
        if not self.storage.exists(backup):  # Spark keeps one schema per store: keep the old one
            self.storage.write_atomic(backup, read_spark_file(self.storage, path))
        self.storage.replace(path, data)


def render_dry_run(result: dict[str, Any]) -> str:
    """A transform's dry run as text: the counts, then each sampled row before -> after."""
    lines = [f"{result['checkpoint']}: dry run, nothing written: a transform of operator {result['operator']} store "
             f"{result['store']} would write batch {result['batch']} (value {result['valueSchema']}): "
             f"{result['rows']} rows, {result['kept']} kept, {result['dropped']} dropped"]
    for row in result["sample"]:
        after = "(dropped)" if row["after"] is None else row["after"]
        lines.append(f"  key {row['key']}: {row['before']} -> {after}")
    return "\n".join(lines)


def render_undo(result: dict[str, Any]) -> str:
    return (f"{result['checkpoint']}: undid the {result['operation']} of batch {result['batch']}"
            f"{'' if result['committed'] else ' (unfinished)'}; the last committed batch is {result['lastCommitted']} "
            f"again ({result['deleted']} files and directories removed)\n")


# -- checking what a function returns -----------------------------------------------------------

def _misfit(schema: Any, value: Any, path: str) -> str | None:
    """Why ``value`` does not fit ``schema`` (a struct: a dict with exactly its fields, a Row, or a
    sequence of its length; each field of its type), or None when it fits."""
    from pyspark.sql import Row
    from pyspark.sql import types as T

    where = path or "the value"
    if isinstance(schema, T.StructType):
        if isinstance(value, Row):
            value = value.asDict()
        if isinstance(value, dict):
            names = schema.fieldNames()
            unknown = [k for k in value if k not in names]
            missing = [n for n in names if n not in value]
            if unknown or missing:
                return "; ".join(
                    [f"unknown field {', '.join(_at(path, str(k)) for k in unknown)}"] * bool(unknown) +
                    [f"missing field {', '.join(_at(path, n) for n in missing)}"] * bool(missing))
            items = [(f, value[f.name]) for f in schema.fields]
        elif isinstance(value, (tuple, list)):
            if len(value) != len(schema.fields):
                return f"{where} has {len(value)} fields, {schema.simpleString()} has {len(schema.fields)}"
            items = list(zip(schema.fields, value))
        else:
            return f"{where} is {type(value).__name__} {short(repr(value))}, not {schema.simpleString()}"
        for f, v in items:
            why = _misfit_nullable(f.dataType, v, f.nullable, _at(path, f.name))
            if why:
                return why
        return None
    if isinstance(schema, T.ArrayType):
        if not isinstance(value, (list, tuple)):
            return f"{where} is {type(value).__name__} {short(repr(value))}, not {schema.simpleString()}"
        for i, v in enumerate(value):
            why = _misfit_nullable(schema.elementType, v, schema.containsNull, f"{where}[{i}]")
            if why:
                return why
        return None
    if isinstance(schema, T.MapType):
        if not isinstance(value, dict):
            return f"{where} is {type(value).__name__} {short(repr(value))}, not {schema.simpleString()}"
        for k, v in value.items():
            why = _misfit_nullable(schema.keyType, k, False, f"{where} key {k!r}") or \
                _misfit_nullable(schema.valueType, v, schema.valueContainsNull, f"{where}[{k!r}]")
            if why:
                return why
        return None
    try:  # a leaf: PySpark's own check (Python types, integer ranges), as its createDataFrame applies it
        _leaf_verifier(schema)(value)
    except (TypeError, ValueError):
        return f"{where} is {type(value).__name__} {short(repr(value))}, not {schema.simpleString()}"
    return None


def _misfit_nullable(schema: Any, value: Any, nullable: bool, path: str) -> str | None:
    if value is None:
        return None if nullable else f"{path} is None, but it is not nullable"
    return _misfit(schema, value, path)


@functools.lru_cache(maxsize=None)
def _leaf_verifier(schema: Any) -> Callable[[Any], None]:
    from pyspark.sql.types import _make_type_verifier

    return _make_type_verifier(schema, nullable=False)


def _at(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name



def _summarise(results):
    """One partition's (rows, kept, misfits, first misfit as (key, why))."""
    rows = kept = bad = 0
    first = None
    for _, key, _, value, _, why in results:
        rows += 1
        kept += value is not None and why is None
        if why is not None:
            bad += 1
            first = first or (key, why)
    yield rows, kept, bad, first


def _summary(parts: list) -> dict[str, Any]:
    return {"rows": sum(p[0] for p in parts), "kept": sum(p[1] for p in parts), "bad": sum(p[2] for p in parts),
            "first": next((p[3] for p in parts if p[3] is not None), None)}


def _written(schema: Any) -> Callable:
    """A checked result as the row to write. A result recomputed after the check (its cached
    copy lost) is checked again: one that no longer fits fails the write, which is then taken back."""
    def row(t):
        key_row, key, _, value, partition, why = t
        if why is None:
            why = _misfit(schema, value, "")
        if why is not None:
            raise StateProcessorError(f"the transform's function gave key {short(repr(key))} a value that does not "
                                      f"fit the value schema {schema.simpleString()} when run again: {why}")
        return key_row, _row_of(schema, value), partition
    return row


def _plain(value: Any) -> Any:
    from pyspark.sql import Row

    if isinstance(value, Row):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _utf(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass").replace(b"\x00", b"\xc0\x80")  # Java's modified UTF-8
    return struct.pack(">H", len(raw)) + raw


def _chunks(text: str, size: int = 16384) -> bytes:
    parts = [text[i:i + size] for i in range(0, len(text), size)] or [""]
    return struct.pack(">i", len(parts)) + b"".join(_utf(p) for p in parts)


def _struct(spark, schema: Any):
    from pyspark.sql import types as T

    if isinstance(schema, T.StructType):
        return schema
    if isinstance(schema, dict):
        return T.StructType.fromJson(schema)
    return spark.createDataFrame([], schema).schema


def _row_of(schema, value: Any):
    """A checked value (dict, Row or sequence) as a tuple in the schema's field order (nested too)."""
    from pyspark.sql import Row
    from pyspark.sql import types as T

    if value is None:
        return None
    if isinstance(schema, T.StructType):
        if isinstance(value, Row):
            value = value.asDict()
        if isinstance(value, dict):
            return tuple(_row_of(f.dataType, value.get(f.name)) for f in schema.fields)
        return tuple(_row_of(f.dataType, v) for f, v in zip(schema.fields, value))
    if isinstance(schema, T.ArrayType):
        return [_row_of(schema.elementType, v) for v in value]
    if isinstance(schema, T.MapType):
        return {k: _row_of(schema.valueType, v) for k, v in value.items()}
    return value
