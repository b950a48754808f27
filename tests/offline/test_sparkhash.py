"""keyedstate.sparkhash against real Spark: the hash of UnsafeRow bytes must be Spark's own.

Spark computes ``hash(cols)`` (Murmur3Hash, seed 42: the function HashPartitioning uses) in the
same projection that hands us the rows' UnsafeRow bytes, so every row is checked against the JVM.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import random
import struct
from decimal import Decimal
from pathlib import Path

import pytest
from keyedstate.offline.sparkhash import RowHasher, UnsupportedKeyType, read_key_schema

HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


# --- getting UnsafeRows and Spark's hashes out of the JVM ------------------------------------

def collect_unsafe_rows(df) -> list[bytes]:
    """The UnsafeRow bytes of every row of ``df``, fetched in one py4j call.

    ``UnsafeRow.toString`` prints the row's 64-bit words in hex (a ``getBytes`` per row would
    cost a py4j round trip each); ``executeToIterator`` decodes each row into its own UnsafeRow.
    """
    text = df._jdf.queryExecution().executedPlan().executeToIterator().mkString("|")
    rows = text.split("|") if text else []
    assert all(row.startswith("[") and row.endswith("]") for row in rows), text[:200]
    return [b"".join(int(word, 16).to_bytes(8, "little") for word in row[1:-1].split(","))
            for row in rows]


def slot(row: bytes, num_fields: int, ordinal: int, offset: int = 0) -> int:
    """The 8-byte slot of field ``ordinal`` of the UnsafeRow at ``offset``, unsigned."""
    bitset = ((num_fields + 63) // 64) * 8
    return struct.unpack_from("<Q", row, offset + bitset + 8 * ordinal)[0]


def int_slot(row: bytes, num_fields: int, ordinal: int) -> int:
    return struct.unpack_from("<i", slot(row, num_fields, ordinal).to_bytes(8, "little"))[0]


def spark_rows(df, cols) -> tuple[dict, list[tuple[bytes, int]]]:
    """(schema JSON as the JVM writes it, [(UnsafeRow bytes, Spark's hash)]) for ``cols`` of df.

    The row carries the hash as an extra trailing column, so the hasher also has to honour
    ``hashed_columns`` < number of fields. ``repartition`` keeps the projection from being
    folded into a local relation: the hash is Spark's generated code, as in a shuffle.
    """
    from pyspark.sql import functions as F

    selected = df.repartition(2).select(*cols, F.hash(*cols).alias("spark_hash"))
    schema = json.loads(selected._jdf.schema().json())
    n = len(cols)
    return schema, [(row, int_slot(row, n + 1, n)) for row in collect_unsafe_rows(selected)]


def assert_hashes_match(df, cols) -> int:
    schema, rows = spark_rows(df, cols)
    hasher = RowHasher(schema, len(cols))
    wrong = [(row.hex(), expected, hasher.hash(row)) for row, expected in rows
             if hasher.hash(row) != expected]
    assert not wrong, f"{len(wrong)}/{len(rows)} rows differ (bytes, spark, ours): {wrong[:5]}"
    assert rows, "no rows were checked"
    return len(rows)


# --- values ----------------------------------------------------------------------------------

RNG = random.Random(1234)
STRINGS = ([None] + ["x" * n for n in range(10)] + ["abcdefghi"[:n] for n in range(10)]
           + ["é", "日本", "日本語", "üüü", "😀", "a😀", "ab€", "abcd€", "\u00ff\u00fe"]
           + ["\x00", "long" * 300 + "é", "ü" * 1001]
           + ["".join(RNG.choice("aZ9 _éß中😀") for _ in range(RNG.randrange(0, 20)))
              for _ in range(60)])
INT_EDGES = [0, 1, -1, 2**31 - 1, -2**31, 42, -42]
LONG_EDGES = [0, 1, -1, 2**63 - 1, -2**63, 2**32, -2**32, 2**31, 1 << 40]
SPECIAL_FLOATS = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1.0, -1.5, 0.1]
DOUBLES = SPECIAL_FLOATS + [5e-324, 2.2250738585072014e-308, 1.7976931348623157e308] + [
    RNG.uniform(-1e6, 1e6) for _ in range(40)]
FLOATS = SPECIAL_FLOATS + [1e-45, 3.4e38] + [RNG.uniform(-1e4, 1e4) for _ in range(40)]
EPOCH = dt.datetime(1970, 1, 1)
TIMESTAMPS = [EPOCH + dt.timedelta(microseconds=m) for m in
              [0, 1, -1, 1_700_000_000_123_456, -86_400_000_001, 253_402_300_799_999_999]
              + [RNG.randrange(-2**50, 2**50) for _ in range(40)]]
DATES = [dt.date(1970, 1, 1) + dt.timedelta(days=d) for d in
         [0, -1, -719_162, 2_932_896] + [RNG.randrange(-700_000, 700_000) for _ in range(40)]]
SMALL_DECIMALS = [Decimal(d) for d in ["0", "0.01", "-0.01", "99999999.99", "-99999999.99"]] + [
    Decimal(RNG.randrange(-10**10 + 1, 10**10)).scaleb(-2) for _ in range(40)]
BIG_DECIMALS = [Decimal(d) for d in ["0", "1", "-1", "0.00001", "-0.00001", "9" * 25 + ".99999",
                                     "-" + "9" * 25 + ".99999", "128", "-128", "0.00128",
                                     "0.00255", "-0.00129", str(2**63), str(-2**63 - 1)]] + [
    Decimal(RNG.randrange(-10**30 + 1, 10**30)).scaleb(-5) for _ in range(60)]
BINARIES = [None, bytearray(b""), bytearray(b"\x80"), bytearray(b"\xff\xff\xff"),
            bytearray(b"\x7f\x80\x81\xff\x00")] + [
    bytearray(RNG.randrange(256) for _ in range(n)) for n in range(10) for _ in range(4)]


def with_nulls(values: list) -> list:
    return [None, *values, None]


SINGLE_COLUMN_CASES = {  # case -> (DDL type, values)
    "int": ("int", with_nulls(INT_EDGES + [RNG.randrange(-2**31, 2**31) for _ in range(60)])),
    "long": ("bigint", with_nulls(LONG_EDGES + [RNG.randrange(-2**63, 2**63) for _ in range(60)])),
    "string": ("string", STRINGS),
    "boolean": ("boolean", [True, False, None, True]),
    "short": ("smallint", with_nulls([0, 1, -1, 32767, -32768, 255, -129, 128])),
    "byte": ("tinyint", with_nulls([0, 1, -1, 127, -128, 64, -65])),
    "date": ("date", with_nulls(DATES)),
    "timestamp": ("timestamp", with_nulls(TIMESTAMPS)),
    "timestamp_ntz": ("timestamp_ntz", with_nulls(TIMESTAMPS)),
    "double": ("double", with_nulls(DOUBLES)),
    "float": ("float", with_nulls(FLOATS)),
    "decimal(10,2)": ("decimal(10,2)", with_nulls(SMALL_DECIMALS)),
    "decimal(18,0)": ("decimal(18,0)",
                      with_nulls([Decimal(v) for v in [10**18 - 1, 1 - 10**18, 0, 7]])),
    "decimal(30,5)": ("decimal(30,5)", with_nulls(BIG_DECIMALS)),
    "decimal(38,0)": ("decimal(38,0)",
                      with_nulls([Decimal(v) for v in [10**38 - 1, 1 - 10**38, 0, 255]])),
    "binary": ("binary", BINARIES),
    "day-time interval": ("interval day to second", with_nulls(
        [dt.timedelta(0), dt.timedelta(microseconds=-1), dt.timedelta(days=3, seconds=7)]
        + [dt.timedelta(microseconds=RNG.randrange(-2**50, 2**50)) for _ in range(20)])),
}


# --- hashes against Spark --------------------------------------------------------------------

@pytest.fixture(scope="module")
def single_column_rows(spark) -> dict[str, tuple[dict, list[tuple[bytes, int, int]]]]:
    """All single-column cases in one Spark job: case -> (key schema, [(row, offset, hash)]).

    Column ``c<i>`` becomes the one-field struct ``struct<k: T>`` (a nested UnsafeRow, found
    through its slot, hashed at its ``offset``) next to Spark's ``hash(c<i>)``; hashing a struct
    folds its fields from the running seed, so both are the same hash.
    """
    from pyspark.sql import functions as F

    cases = list(SINGLE_COLUMN_CASES.values())
    length = max(len(values) for _, values in cases)
    rows = [tuple(values[i % len(values)] for _, values in cases) for i in range(length)]
    ddl = ", ".join(f"c{i} {ddl_type}" for i, (ddl_type, _) in enumerate(cases))
    columns = [f"c{i}" for i in range(len(cases))]
    selected = spark.createDataFrame(rows, ddl).repartition(2).select(
        *[F.struct(F.col(c).alias("k")).alias(c) for c in columns],
        *[F.hash(c).alias(f"hash_{c}") for c in columns])
    fields = json.loads(selected._jdf.schema().json())["fields"]
    data = collect_unsafe_rows(selected)
    assert len(data) == length
    n = len(fields)
    return {case: (fields[i]["type"],
                   [(row, slot(row, n, i) >> 32, int_slot(row, n, len(cases) + i)) for row in data])
            for i, case in enumerate(SINGLE_COLUMN_CASES)}


@pytest.mark.parametrize("case", list(SINGLE_COLUMN_CASES))
def test_single_column_matches_spark(single_column_rows, case):
    key_schema, rows = single_column_rows[case]
    hasher = RowHasher(key_schema, 1)
    wrong = [(row[offset:].hex(), expected, hasher.hash(row, offset))
             for row, offset, expected in rows if hasher.hash(row, offset) != expected]
    assert not wrong, f"{len(wrong)}/{len(rows)} rows differ (bytes, spark, ours): {wrong[:5]}"
    assert len(rows) >= len(SINGLE_COLUMN_CASES[case][1])


def test_negative_zero_reaches_the_hasher_as_is(single_column_rows):
    """UnsafeRow keeps -0.0 (only NaN is canonicalised on write): the hasher must fold it to 0."""
    for case, sign_bit in (("double", 1 << 63), ("float", 1 << 31)):
        _, rows = single_column_rows[case]
        assert any(slot(row, 1, 0, offset) == sign_bit for row, offset, _ in rows), case


def test_window_and_session_keys_match_spark(spark):
    """Time-window aggregation keys: struct<start:timestamp,end:timestamp>, alone or with others."""
    from pyspark.sql import functions as F

    rng = random.Random(1)
    rows = [(ts, rng.choice([None, rng.randrange(-2**40, 2**40)]), rng.choice(STRINGS))
            for ts in TIMESTAMPS[:40]]
    df = (spark.createDataFrame(rows, "ts timestamp, n bigint, s string")
          .withColumn("window", F.window("ts", "10 minutes", "5 minutes"))
          .withColumn("session", F.session_window("ts", "5 minutes")))
    assert assert_hashes_match(df, ["window", "n"]) == 80  # two sliding windows per row
    assert assert_hashes_match(df, ["s", "session", "window"]) == 80


def test_multi_column_and_nested_struct_keys_match_spark(spark):
    from pyspark.sql import functions as F

    rng = random.Random(2)
    rows = [(rng.choice(STRINGS), rng.choice([*INT_EDGES, None]), rng.choice([*DOUBLES, None]),
             rng.choice([*BIG_DECIMALS, None]), i % 3 == 0) for i in range(80)]
    df = spark.createDataFrame(rows, "s string, i int, d double, big decimal(30,5), flag boolean")
    df = df.select(
        F.when(F.col("flag"), None).otherwise(F.struct("s", "i")).alias("maybe_null"),
        F.struct("i", F.struct("s", "d", F.struct("big").alias("inner")).alias("mid"),
                 "flag").alias("deep"),
        "s", "i", "d", "big", "flag")
    assert assert_hashes_match(df, ["s", "i"]) == 80  # the classic (string, int) aggregation key
    assert assert_hashes_match(df, ["deep", "maybe_null", "i", "s", "d", "big", "flag"]) == 80


def test_array_keys_match_spark(spark):
    from pyspark.sql import functions as F

    rng = random.Random(3)

    def some(values: list, most: int) -> list:
        return [rng.choice(values) for _ in range(rng.randrange(0, most))]

    rows = [(some([*INT_EDGES, None], 70), some(STRINGS, 6),
             rng.choice([None, some([*DOUBLES, None], 4)]), some([0, 1, -1, -32768, None], 9),
             some([True, False, None], 11), some([*BIG_DECIMALS, None], 4)) for _ in range(60)]
    df = spark.createDataFrame(rows, "ai array<int>, astr array<string>, ad array<double>, "
                                     "ash array<smallint>, ab array<boolean>, "
                                     "abig array<decimal(30,5)>")
    df = (df.withColumn("astruct", F.transform("astr", lambda s: F.struct(s, F.length(s))))
          .withColumn("nested", F.array("ai", "ash")))
    assert assert_hashes_match(
        df, ["ai", "astr", "ad", "ash", "ab", "abig", "astruct", "nested"]) == 60


def test_interval_null_and_udt_keys_match_spark(spark):
    """Year-month intervals (int months), NullType columns, and UDTs (hashed as their sqlType)."""
    from pyspark.ml.linalg import Vectors
    from pyspark.sql import functions as F

    rng = random.Random(4)
    df = spark.createDataFrame([(rng.randrange(-1000, 1000), i) for i in range(30)], "m int, i int")
    df = df.select(F.expr("make_ym_interval(0, m)").alias("ym"), F.lit(None).alias("nothing"), "i")
    assert assert_hashes_match(df, ["ym", "nothing", "i"]) == 30

    vectors = [(Vectors.dense([1.0, -0.0, 2.5]),), (Vectors.sparse(5, [1, 3], [0.5, -2.0]),),
               (None,), (Vectors.dense([]),)]
    assert assert_hashes_match(spark.createDataFrame(vectors, ["v"]), ["v"]) == 4


def test_time_keys_match_spark(spark):
    try:
        df = spark.sql("SELECT time'12:00:00.123456' AS t UNION ALL SELECT time'00:00:00' "
                       "UNION ALL SELECT time'23:59:59.999999'")
        schema, rows = spark_rows(df, ["t"])
    except Exception as e:  # noqa: BLE001 -- TIME is behind a feature flag in some Spark builds
        pytest.skip(f"TIME type not available: {str(e)[:100]}")
    hasher = RowHasher(schema, 1)
    assert [hasher.hash(row) for row, _ in rows] == [expected for _, expected in rows]


def test_partition_is_the_one_hash_partitioning_picks(spark):
    """The point of it all: pmod(hash, n) is the partition a shuffle on the key sends a row to."""
    from pyspark.sql import functions as F

    rng = random.Random(5)
    rows = [(rng.choice(STRINGS), rng.choice([*INT_EDGES, None])) for _ in range(200)]
    df = spark.createDataFrame(rows, "s string, i int")
    n = 7
    shuffled = df.repartition(n, "s", "i").select("s", "i", F.spark_partition_id())
    hasher = RowHasher(json.loads(shuffled._jdf.schema().json()), 2)
    rows = collect_unsafe_rows(shuffled)
    assert len(rows) == 200
    assert [hasher.partition(row, n) for row in rows] == [int_slot(row, 3, 2) for row in rows]
    assert len({int_slot(row, 3, 2) for row in rows}) == n


def test_offset_and_buffer_types(spark):
    df = spark.createDataFrame([("abcde", 7), (None, -1)], "s string, i int")
    schema, rows = spark_rows(df, ["s", "i"])
    hasher = RowHasher(schema, 2)
    for row, expected in rows:
        assert hasher.hash(memoryview(b"\xde\xad\xbe" + row + b"\x01"), 3) == expected
        assert hasher.hash(bytearray(row)) == expected


# --- schema validation (no Spark needed) -----------------------------------------------------

def _schema(*fields: tuple[str, object], metadata: dict | None = None) -> dict:
    return {"type": "struct", "fields": [
        {"name": name, "type": t, "nullable": True, "metadata": metadata or {}}
        for name, t in fields]}


MAP = {"type": "map", "keyType": "string", "valueType": "integer", "valueContainsNull": True}


@pytest.mark.parametrize("bad_type, what", [
    (MAP, "map"),
    ("interval", "interval"),  # CalendarInterval: Spark's codegen and interpreted hashes differ
    ("variant", "variant"),
    (_schema(("inner", "variant")), "variant"),
    ({"type": "array", "elementType": MAP, "containsNull": True}, "map"),
    ("string collate UTF8_LCASE", "UTF8_LCASE"),
])
def test_unsupported_types_are_refused_naming_field_and_type(bad_type, what):
    with pytest.raises(UnsupportedKeyType) as info:
        RowHasher(_schema(("ok", "string"), ("bad_field", bad_type)), 2)
    assert "bad_field" in str(info.value) and what in str(info.value)
    RowHasher(_schema(("ok", "string"), ("bad_field", bad_type)), 1)  # unhashed: anything goes


def test_collated_strings_are_refused():
    lcase = {"__COLLATIONS": {"name": "spark.UTF8_LCASE"}}
    with pytest.raises(UnsupportedKeyType, match="name.*UTF8_LCASE"):
        RowHasher(_schema(("name", "string"), metadata=lcase), 1)
    nested = _schema(("outer", _schema(("name", "string"), metadata=lcase)))
    with pytest.raises(UnsupportedKeyType, match=r"outer\.name.*UTF8_LCASE"):
        RowHasher(nested, 1)
    binary = {"__COLLATIONS": {"name": "spark.UTF8_BINARY"}}
    RowHasher(_schema(("name", "string"), metadata=binary), 1)


def test_bad_arguments_and_rows():
    with pytest.raises(ValueError, match="hashed_columns"):
        RowHasher(_schema(("a", "integer")), 2)
    with pytest.raises(ValueError, match="hashed_columns"):
        RowHasher(_schema(("a", "integer")), 0)
    with pytest.raises(ValueError, match="no fields"):
        RowHasher(_schema(), 1)
    with pytest.raises(ValueError, match="struct"):
        RowHasher({"type": "array"}, 1)
    string_of_40_bytes_but_3_there = bytes(8) + struct.pack("<q", (16 << 32) | 40) + b"abc"
    with pytest.raises(ValueError, match="truncated"):
        RowHasher(_schema(("a", "string")), 1).hash(string_of_40_bytes_but_3_there)


# --- read_key_schema --------------------------------------------------------------------------

@contextlib.contextmanager
def session_conf(spark, key: str, value: str):
    previous = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


def test_read_key_schema_of_a_real_checkpoint(spark, tmp_path):
    from pyspark.sql import functions as F

    source = tmp_path / "input"
    source.mkdir()
    events = [("a", 1), ("b", 2), ("a", 1), ("é", 3)]
    (source / "0.json").write_text("\n".join(
        json.dumps({"clé": s, "n": n, "ts": f"2024-01-01T00:0{n}:00Z"}) for s, n in events))
    checkpoint = tmp_path / "checkpoint"
    stream = (spark.readStream.schema("`clé` string, n bigint, ts timestamp").json(str(source))
              .groupBy("clé", F.window("ts", "1 minute"), "n").agg(F.count("*").alias("c")))
    with session_conf(spark, "spark.sql.streaming.stateStore.providerClass", HDFS_PROVIDER):
        query = (stream.writeStream.format("noop").outputMode("update")
                 .trigger(availableNow=True).option("checkpointLocation", str(checkpoint)).start())
        try:
            assert query.awaitTermination(90), "the streaming query did not finish"
        finally:
            query.stop()
    operator = checkpoint / "state" / "0"
    files = sorted(operator.glob("0/**/_metadata/schema"))
    assert files, f"no schema file under {operator}: {sorted(map(str, operator.rglob('*')))}"

    key_schema = read_key_schema(files[0])
    expected_ddl = "`clé` string, window struct<start: timestamp, end: timestamp>, n bigint"
    expected = json.loads(spark.createDataFrame([], expected_ddl).schema.json())
    assert [(f["name"], f["type"]) for f in key_schema["fields"]] == [
        (f["name"], f["type"]) for f in expected["fields"]]

    # the rescale use case end to end: each key Spark stored in partition p hashes to p
    hasher = RowHasher(key_schema, 3)
    stored = {p: delta_file_keys(spark, operator / str(p) / "1.delta") for p in (0, 1)}
    assert sorted(len(keys) for keys in stored.values()) in ([0, 3], [1, 2])  # 3 distinct keys
    assert {p: [hasher.partition(key, 2) for key in keys] for p, keys in stored.items()} == {
        p: [p] * len(keys) for p, keys in stored.items()}


def delta_file_keys(spark, path: Path) -> list[bytes]:
    """Keys (UnsafeRow bytes) written to an HDFSBackedStateStore delta file, read by the JVM.

    The file is the store's compression codec over records ``keySize, key, valueSize, value``
    (valueSize -1 for a removal) ending with keySize -1.
    """
    jvm = spark._jvm
    codec = jvm.org.apache.spark.io.CompressionCodec.createCodec(
        spark.sparkContext._jsc.sc().conf(),
        spark.conf.get("spark.sql.streaming.stateStore.compression.codec", "lz4"))
    stream = jvm.java.io.DataInputStream(
        codec.compressedInputStream(jvm.java.io.FileInputStream(str(path))))
    keys = []
    try:
        while (key_size := stream.readInt()) != -1:
            keys.append(bytes(stream.readNBytes(key_size)))
            value_size = stream.readInt()
            if value_size >= 0:
                stream.readNBytes(value_size)
    finally:
        stream.close()
    return keys


def _write_utf(text: str) -> bytes:
    """Java DataOutputStream.writeUTF: u16 length, modified UTF-8 (a surrogate is 3 bytes)."""
    units = text.encode("utf-16-be", "surrogatepass")
    encoded = b"".join(b"\xc0\x80" if u == 0 else chr(u).encode("utf-8", "surrogatepass")
                       for u in struct.unpack(f">{len(units) // 2}H", units))
    return struct.pack(">H", len(encoded)) + encoded


def _schema_file_v2(key_json: str, value_json: str, chunk: int = 65535) -> bytes:
    def chunks(text: str) -> bytes:
        units = text.encode("utf-16-be", "surrogatepass")  # Spark chunks by Java chars
        parts = [units[i:i + 2 * chunk].decode("utf-16-be", "surrogatepass")
                 for i in range(0, len(units), 2 * chunk)]
        return struct.pack(">i", len(parts)) + b"".join(_write_utf(p) for p in parts)
    return _write_utf("v2") + chunks(key_json) + chunks(value_json)


KEY = _schema(("k😀", "string"), ("n", "integer"))
KEY_JSON = json.dumps(KEY, ensure_ascii=False)  # like Spark's: non-ASCII characters as they are
VALUE_JSON = json.dumps(_schema(("count", "long")))


def test_read_key_schema_formats(tmp_path):
    v2 = tmp_path / "v2"
    emoji = KEY_JSON.encode("utf-16-be", "surrogatepass").index("😀".encode("utf-16-be")) // 2
    v2.write_bytes(_schema_file_v2(KEY_JSON, VALUE_JSON, chunk=emoji + 1))  # splits the emoji
    assert read_key_schema(v2) == KEY
    v1 = tmp_path / "v1"
    v1.write_bytes(_write_utf("v1") + _write_utf(KEY_JSON) + _write_utf(VALUE_JSON))
    assert read_key_schema(str(v1)) == KEY


@pytest.mark.parametrize("content, message", [
    (b"", "truncated"),
    (b"\x00\x02v2\x00\x00", "truncated"),
    (b"garbage that is not a schema", "truncated"),
    (_schema_file_v2(KEY_JSON, VALUE_JSON)[:-5], "truncated"),
    (_write_utf("v3") + b'{"stateStoreColFamilySchema": []}', "v3"),
    (_write_utf("v9") + bytes(8), "version"),
    (_schema_file_v2("{not json", "{}"), "Expecting"),
    (_schema_file_v2(json.dumps({"type": "array"}), "{}"), "struct"),
])
def test_read_key_schema_rejects_corrupt_files_naming_them(tmp_path, content, message):
    path = tmp_path / "schema"
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        read_key_schema(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_read_key_schema_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        read_key_schema(Path(tmp_path, "nope"))
