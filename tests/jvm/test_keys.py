"""Key groups and stored keys, on the functions production uses: the JVM's KeyGroups and
KeyCodec (which write every key) and the offline tools' keygroups module (which route them)."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from keyedstate import conf
from keyedstate.formats import keygroups as kg

from support.jvm import key_codec, unsafe_row

DEFAULT_GROUPS = conf.parse({})["keyGroups"]
COMMON_PARTITIONS = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 32, 64, 100, 128, 200]


def test_default_key_group_count_is_divisible_by_common_partition_counts():
    assert all(kg.divides(n, DEFAULT_GROUPS) for n in COMMON_PARTITIONS)


@given(st.integers(-2**31, 2**31 - 1), st.sampled_from(COMMON_PARTITIONS))
def test_a_key_groups_partition_is_sparks_partition_of_the_key(jvm, spark_hash, partitions):
    # Spark: partition = pmod(hash, partitions). keyedstate: group = pmod(hash, K), partition of group.
    groups = jvm.io.keyedstate.format.KeyGroups
    group = groups.keyGroupOf(spark_hash, DEFAULT_GROUPS)
    assert 0 <= group < DEFAULT_GROUPS
    assert groups.partitionOf(group, DEFAULT_GROUPS, partitions) == spark_hash % partitions
    assert kg.partition_of_key_group(group, DEFAULT_GROUPS, partitions) == spark_hash % partitions


@given(st.integers(0, DEFAULT_GROUPS - 1))
def test_prefix_round_trips_and_sorts_by_group(group):
    stored = kg.prefix(group) + b"rest-of-key"
    assert kg.key_group_of_stored_key(stored) == group
    if group + 1 < DEFAULT_GROUPS:
        assert kg.prefix(group) < kg.prefix(group + 1)


@given(st.sampled_from(COMMON_PARTITIONS))
def test_partitions_own_disjoint_key_groups_covering_all(partitions):
    owned = [kg.key_groups_of_partition(p, partitions, DEFAULT_GROUPS) for p in range(partitions)]
    assert sum(map(len, owned)) == DEFAULT_GROUPS
    assert all(kg.partition_of_key_group(g, DEFAULT_GROUPS, partitions) == p
               for p, groups in enumerate(owned) for g in groups[:50])


def test_counts_that_do_not_divide_are_refused(jvm):
    with pytest.raises(ValueError, match="do not divide"):
        kg.partition_of_key_group(5, DEFAULT_GROUPS, 11)
    with pytest.raises(Exception, match="do not divide"):
        jvm.io.keyedstate.format.KeyGroups.partitionOf(5, DEFAULT_GROUPS, 11)


def test_keys_round_trip_and_a_prefix_key_starts_every_key_of_its_prefix(jvm):
    codec, key_schema, value_schema = key_codec(jvm, "k STRING, start LONG", "n LONG", prefix_columns=1)
    key = unsafe_row(jvm, key_schema, ["user-1", 123])
    stored = bytes(codec.encodeKey(key))
    decoded = codec.decodeKey(bytearray(stored))
    assert (decoded.getUTF8String(0).toString(), decoded.getLong(1)) == ("user-1", 123)
    prefix = bytes(codec.encodePrefix(unsafe_row(jvm, jvm.org.apache.spark.sql.types.StructType.fromDDL("k STRING"),
                                                 ["user-1"])))
    assert stored.startswith(prefix)
    other = bytes(codec.encodeKey(unsafe_row(jvm, key_schema, ["user-1", 456])))
    assert other.startswith(prefix) and other != stored
    value = codec.decodeValue(codec.encodeValue(unsafe_row(jvm, value_schema, [42])))
    assert value.getLong(0) == 42


def test_a_join_index_key_finds_its_count_key(jvm):
    index, index_key, _ = key_codec(jvm, "jk INT, index LONG", "v STRING", store="left-keyWithIndexToValue")
    count, count_key, _ = key_codec(jvm, "jk INT", "count LONG", store="left-keyToNumValues")
    stored = index.encodeKey(unsafe_row(jvm, index_key, [7, 3]))
    pair = index.countKeyAndIndex(stored)
    assert bytes(pair._1()) == bytes(count.encodeKey(unsafe_row(jvm, count_key, [7]))) and pair._2() == 3
    assert (index.layout().partitionKeyColumns(), count.layout().partitionKeyColumns()) == (1, 1)
