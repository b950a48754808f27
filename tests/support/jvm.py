"""Reaching keyedstate's JVM classes from pytest through py4j (layer tests, golden files)."""
from __future__ import annotations

from typing import Any


def to_bytes(buffer) -> bytes:
    """The remaining bytes of a java.nio.ByteBuffer."""
    data = bytes(buffer.array())
    start = buffer.arrayOffset() + buffer.position()
    return data[start:start + buffer.remaining()]


def byte_buffer(jvm, data: bytes):
    return jvm.java.nio.ByteBuffer.wrap(bytearray(data))


def byte_arrays(jvm, items: list[bytes]):
    """A Java byte[][] holding ``items``."""
    reflect = jvm.java.lang.reflect.Array
    out = reflect.newInstance(jvm.java.lang.Class.forName("[B"), len(items))
    for i, item in enumerate(items):
        reflect.set(out, i, bytearray(item))
    return out


def scala_iter(iterator) -> list:
    """The elements of a Scala Iterator."""
    out = []
    while iterator.hasNext():
        out.append(iterator.next())
    return out


def custom_metric(store, name: str) -> int:
    """A StateStore's custom metric ``name`` from its ``metrics()``: a count is what happened
    since the store's last report."""
    metrics = store.metrics().customMetrics()
    return metrics.apply(next(k for k in scala_iter(metrics.keysIterator()) if k.name() == name))


def struct(jvm, ddl: str):
    return jvm.org.apache.spark.sql.types.StructType.fromDDL(ddl)


def unsafe_row(jvm, schema, values: list[Any]):
    """An UnsafeRow of ``schema`` holding ``values`` (ints for INT/LONG/TIMESTAMP, str for STRING)."""
    row = jvm.org.apache.spark.sql.catalyst.expressions.GenericInternalRow(len(values))
    for i, (field, value) in enumerate(zip(schema.fields(), values)):
        kind = field.dataType().typeName()
        if value is None:
            row.setNullAt(i)
        elif kind == "string":
            row.update(i, jvm.org.apache.spark.unsafe.types.UTF8String.fromString(value))
        elif kind in ("long", "timestamp"):
            row.setLong(i, value)  # py4j would box a Python int as an Integer
        elif kind == "integer":
            row.setInt(i, value)
        else:
            raise ValueError(f"unsafe_row does not build {kind} columns")
    # The interpreted projection: py4j caches methods by class name, and generated projection
    # classes share one name across class loaders.
    expressions = jvm.org.apache.spark.sql.catalyst.expressions
    refs = [expressions.BoundReference(i, f.dataType(), True) for i, f in enumerate(schema.fields())]
    projection = expressions.InterpretedUnsafeProjection.createProjection(
        jvm.scala.jdk.javaapi.CollectionConverters.asScala(refs).toSeq())
    return projection.apply(row)


def key_codec(jvm, key_ddl: str, value_ddl: str, store: str = "default", key_groups: int = 201600,
              prefix_columns: int = 0):
    """keyedstate's KeyCodec for a key and value schema (prefix scans when prefix_columns > 0)."""
    state = jvm.org.apache.spark.sql.execution.streaming.state
    key, value = struct(jvm, key_ddl), struct(jvm, value_ddl)
    spec = (state.PrefixKeyScanStateEncoderSpec(key, prefix_columns) if prefix_columns
            else state.NoPrefixKeyStateEncoderSpec(key))
    return jvm.io.keyedstate.format.KeyCodec(key, value, spec, store, key_groups), key, value


class LayerStore:
    """keyedstate's provider for one store partition, driven directly through Spark's provider
    contract from pytest (no streaming query): a real state server, real RocksDB, real files."""

    def __init__(self, spark, checkpoint, key_ddl: str = "k INT", value_ddl: str = "n LONG",
                 confs: dict[str, str] | None = None, store: str = "default", operator: int = 0,
                 partition: int = 0, prefix_columns: int = 0, hadoop_conf: dict[str, str] | None = None) -> None:
        """``confs``: SQL confs of the store's StateStoreConf; ``hadoop_conf``: entries added to a
        copy of the session's Hadoop conf (e.g. ``sql.streaming.runId``, which Spark's StateStore
        sets for a running query)."""
        jvm = self.jvm = spark._jvm
        state = jvm.org.apache.spark.sql.execution.streaming.state
        self.key_schema, self.value_schema = struct(jvm, key_ddl), struct(jvm, value_ddl)
        spec = (state.PrefixKeyScanStateEncoderSpec(self.key_schema, prefix_columns) if prefix_columns
                else state.NoPrefixKeyStateEncoderSpec(self.key_schema))
        sql_conf = jvm.org.apache.spark.sql.internal.SQLConf()
        for key, value in (confs or {}).items():
            sql_conf.setConfString(key, value)
        self.store_id = state.StateStoreId(str(checkpoint), operator, partition, store)
        hadoop = spark._jsc.hadoopConfiguration()
        if hadoop_conf:
            hadoop = jvm.org.apache.hadoop.conf.Configuration(hadoop)
            for key, value in hadoop_conf.items():
                hadoop.set(key, value)
        self.provider = jvm.io.keyedstate.spark.KeyedStateProvider()
        self.provider.init(self.store_id, self.key_schema, self.value_schema, spec, False,
                           state.StateStoreConf.apply(sql_conf), hadoop, False,
                           jvm.scala.Option.empty())

    def store(self, version: int, unique_id: str | None = None):
        """The store of ``version`` (under checkpoint format 2 the one written with ``unique_id``)."""
        option = self.jvm.scala.Option.empty() if unique_id is None else self.jvm.scala.Some(unique_id)
        return self.provider.getStore(version, option, False, False)

    def store_from_empty(self, version: int):
        """The store an offline writer opens (migrate, the state processor, Spark's repartition):
        version ``version + 1`` written from empty (loadEmpty), its snapshot forced."""
        return self.provider.getStore(version, self.jvm.scala.Option.empty(), True, True)

    def key(self, *values):
        return unsafe_row(self.jvm, self.key_schema, list(values))

    def value(self, *values):
        return unsafe_row(self.jvm, self.value_schema, list(values))

    def put(self, store, key: tuple, value: tuple) -> None:
        store.put(self.key(*key), self.value(*value), "default")

    def get(self, store, *key):
        """The value's first column, or None."""
        row = store.get(self.key(*key), "default")
        return None if row is None else row.getLong(0)

    def close(self) -> None:
        self.provider.close()
