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
is written, before the commit). Until ``commits/B+1`` exists the change has not happened: a
failed one is undone by deleting ``offsets/B+1`` and the state files of version ``B+2`` (a
restarted query refuses to take an offline writer's file as its own batch's, and says which to
delete); the change can then be made again.
"""
from __future__ import annotations

import json
import os
import struct
from typing import TYPE_CHECKING, Any, Callable

from .migration import DEFAULT_PROVIDER, MigrateError, Plan, StorePlan, plan as plan_of, write_store
from .storage import HadoopStorage, LocalStorage, Storage, is_local
from .stores import Checkpoint, partition_key_layout

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class StateProcessorError(MigrateError):
    """A state change cannot be made as asked; the message says why and what to do."""


def state(spark: "SparkSession", checkpoint: str | os.PathLike) -> "StateProcessor":
    """The state processor of a stopped query's checkpoint (any scheme Spark accepts)."""
    return StateProcessor(spark, checkpoint)


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
                  value_schema: Any = None) -> dict[str, Any]:
        """Replace every value of one store by ``fn(key, value)`` (None drops the key), optionally
        into ``value_schema`` (a StructType or DDL string). Returns what was written."""
        import cloudpickle
        from pyspark.sql import types as T

        p, target = self._target(operator, store)
        new_value = _struct(self.spark, value_schema) if value_schema is not None else \
            T.StructType.fromJson(target.value_schema)
        key_type = T.StructType.fromJson(target.key_schema)
        payload = cloudpickle.dumps(fn)

        def apply(rows):
            import cloudpickle as cp

            user = cp.loads(payload)
            for r in rows:
                value = user(r.key.asDict(recursive=True), r.value.asDict(recursive=True))
                if value is not None:
                    yield (r.key, _row_of(new_value, value), r.partition_id)

        current = self.read(operator, target.store, p.batch)
        schema = T.StructType([T.StructField("key", key_type), T.StructField("value", new_value),
                               T.StructField("partition_id", T.IntegerType())])
        changed = self.spark.createDataFrame(current.rdd.mapPartitions(apply), schema)
        return self._write_state_batch(p, target, changed, json.loads(new_value.json()))

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
        return self._write_state_batch(p, target, rows, target.value_schema)

    # -- internals -----------------------------------------------------------------------------
    def _plan(self) -> Plan:
        p = plan_of(self.ck, "")
        p.target = p.source
        return p

    def _target(self, operator: int, store: str | None) -> tuple[Plan, StorePlan]:
        p = self._plan()
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

    def _write_state_batch(self, p: Plan, changed: StorePlan, rows: "DataFrame", value_schema: dict) -> dict:
        """offsets/B+1, every store's version B+2 (``changed`` from ``rows``), schema, commits/B+1."""
        batch = p.batch + 1
        provider = p.source or DEFAULT_PROVIDER
        offsets = self.ck.path("offsets", str(batch))
        if not self.storage.exists(offsets):
            self.storage.write_atomic(offsets, self.storage.read_bytes(self.ck.path("offsets", str(p.batch))))
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
        commit = self.storage.read_bytes(self.ck.path("commits", str(p.batch)))
        self.storage.write_atomic(self.ck.path("commits", str(batch)), commit)
        return {"checkpoint": self.ck.root, "batch": batch, "version": batch + 1, "provider": provider,
                "written": written}

    def _write_schema(self, s: StorePlan, value_schema: dict, batch: int) -> None:
        """Spark's state schema file (format v2) of the store, with the new value schema. Spark
        keeps one schema per store, so the state data source then reads the batches before the
        change with the new schema: the previous file is kept beside it as
        ``schema.before-batch-<batch>`` (for a rollback, or to read those batches)."""
        base = self.ck.path("state", str(s.operator), "0")
        path = self.storage.join(base, "_metadata", "schema") if s.store == "default" else \
            self.storage.join(base, s.store, "_metadata", "schema")
        data = _utf("v2") + _chunks(json.dumps(s.key_schema, separators=(",", ":"))) + \
            _chunks(json.dumps(value_schema, separators=(",", ":")))
        backup = f"{path}.before-batch-{batch}"
        if not self.storage.exists(backup):  # Spark keeps one schema per store: keep the old one
            self.storage.write_atomic(backup, self.storage.read_bytes(path))
        self.storage.replace(path, data)


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
    """A user's value (dict or sequence) as a tuple in the schema's field order (nested too)."""
    from pyspark.sql import types as T

    if value is None:
        return None
    if isinstance(schema, T.StructType):
        if isinstance(value, dict):
            return tuple(_row_of(f.dataType, value.get(f.name)) for f in schema.fields)
        return tuple(_row_of(f.dataType, v) for f, v in zip(schema.fields, value))
    if isinstance(schema, T.ArrayType):
        return [_row_of(schema.elementType, v) for v in value]
    return value
