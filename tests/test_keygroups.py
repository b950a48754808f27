"""Key-group invariants (pure) — the integration test against Spark's own hash is in
test_checkpoint_files.py, where stored key prefixes are compared with Spark SQL's hash()."""
from hypothesis import given, strategies as st

from keyedstate import conf, keygroups as kg

DEFAULT_GROUPS = conf.parse({})["keyGroups"]
COMMON_PARTITIONS = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 32, 64, 100, 128, 200]


def test_default_key_group_count_is_divisible_by_common_partition_counts():
    assert all(DEFAULT_GROUPS % n == 0 for n in COMMON_PARTITIONS)


@given(st.integers(-2**31, 2**31 - 1), st.sampled_from(COMMON_PARTITIONS))
def test_partition_of_key_group_equals_sparks_partition(spark_hash, partitions):
    # Spark: partition = pmod(hash, partitions). Ours: key group = pmod(hash, K), then mod n.
    group = kg.key_group_of_hash(spark_hash, DEFAULT_GROUPS)
    assert 0 <= group < DEFAULT_GROUPS
    assert kg.partition_of_key_group(group, DEFAULT_GROUPS, partitions) == spark_hash % partitions


@given(st.integers(0, DEFAULT_GROUPS - 1))
def test_prefix_round_trips_and_sorts_by_group(group):
    stored = kg.prefix(group) + b"rest-of-key"
    assert kg.key_group_of_stored_key(stored) == group
    if group + 1 < DEFAULT_GROUPS:
        assert kg.prefix(group) < kg.prefix(group + 1)


@given(st.sampled_from(COMMON_PARTITIONS))
def test_partitions_own_disjoint_key_groups_covering_all(partitions):
    owned = [set(kg.key_groups_of_partition(p, partitions, DEFAULT_GROUPS)) for p in range(partitions)]
    assert sum(map(len, owned)) == DEFAULT_GROUPS
    assert set().union(*owned) == set(range(DEFAULT_GROUPS))
