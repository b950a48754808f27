"""The conf registry: validation messages and the generated reference."""
from pathlib import Path

import pytest

from keyedstate import conf

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_are_typed():
    values = conf.parse({})
    assert values["keyGroups"] == 201600
    assert values["snapshotInterval"] == 10
    assert values["scanChunkBytes"] == 4 << 20
    assert values["pythonExec"] is None


def test_values_are_parsed():
    values = conf.parse({conf.PREFIX + "snapshotInterval": "3", conf.PREFIX + "scanChunkBytes": "1m",
                         conf.PREFIX + "bridgeTimeout": "90s", "spark.sql.other": "ignored"})
    assert (values["snapshotInterval"], values["scanChunkBytes"], values["bridgeTimeout"]) == (3, 1 << 20, 90.0)


@pytest.mark.parametrize("name,raw,allowed", [
    ("snapshotInterval", "abc", "an integer in [1, 1000000]"),
    ("snapshotInterval", "0", "an integer in [1, 1000000]"),
    ("keyGroups", "-5", "an integer in [1, 1073741824]"),
    ("scanChunkBytes", "4 parsecs", "a byte size"),
    ("scanChunkBytes", "4g", "a byte size from 4k to 256m"),  # the JVM's Int would wrap to 0
    ("scanChunkBytes", "0", "a byte size from 4k to 256m"),
    ("bridgeTimeout", "soon", "a duration"),
])
def test_malformed_values_name_key_and_allowed_values(name, raw, allowed):
    with pytest.raises(conf.ConfError) as err:
        conf.parse({conf.PREFIX + name: raw})
    assert conf.PREFIX + name in str(err.value)
    assert allowed in str(err.value)
    assert repr(raw).strip("'") in str(err.value)


def test_unknown_key_lists_known_keys():
    with pytest.raises(conf.ConfError) as err:
        conf.parse({conf.PREFIX + "snapshotIntervall": "3"})
    assert "snapshotIntervall" in str(err.value)
    assert conf.PREFIX + "snapshotInterval" in str(err.value)


def test_reference_is_generated_from_the_registry():
    committed = (ROOT / "conf" / "REFERENCE.md").read_text()
    assert committed == conf.reference_markdown(), (
        "conf/REFERENCE.md is stale: run `keyedstate conf-reference --write conf/REFERENCE.md`")
    for knob in conf.KNOBS:
        assert knob.key in (ROOT / "conf" / "spark-defaults.conf.template").read_text()


def test_ttl_overrides_are_parsed_per_operator_and_store():
    values = conf.parse({conf.PREFIX + "ttl": "24h", conf.PREFIX + "ttl.1": "15m",
                         conf.PREFIX + "ttl.0.left-keyToNumValues": "0"})
    assert values["ttl"] == 86400.0
    assert values["ttlOverrides"] == {"1": 900.0, "0.left-keyToNumValues": 0.0}
    assert conf.parse({})["ttl"] == 0.0 and conf.parse({})["ttlOverrides"] == {}


@pytest.mark.parametrize("key", ["ttl.", "ttl.x", "ttl.1.", "testing.clockFile"])
def test_malformed_ttl_keys_and_the_test_clock_are_not_confs(key):
    # The TTL test clock is a JVM system property of the test JVM only: no Spark conf enables it.
    with pytest.raises(conf.ConfError) as err:
        conf.parse({conf.PREFIX + key: "1h"})
    assert "Unknown keyedstate conf" in str(err.value) and "ttl.<operatorId>" in str(err.value)


@pytest.mark.parametrize("key,nearest", [("snapshotIntervall", "snapshotInterval"),
                                         ("nearcachebytes", "nearCacheBytes"),
                                         ("ttlUpdateType", "ttl.updateType")])
def test_an_unknown_knob_names_the_nearest_one_in_one_line(key, nearest):
    with pytest.raises(conf.ConfError) as err:
        conf.parse({conf.PREFIX + key: "5"})
    message = str(err.value)
    assert f"did you mean '{conf.PREFIX}{nearest}'?" in message
    assert "\n" not in message and message.count(conf.PREFIX) == 2  # not every knob listed


def test_memory_budget_is_split_over_near_cache_native_cache_and_servers():
    p = conf.PREFIX
    off = conf.parse({})
    assert off["memoryBudget"] == 0 and off["serverMemoryBytes"] == 0 and off["nearCacheBytes"] == -1
    split = conf.parse({p + "memoryBudget": "1g"})
    assert split["nearCacheBytes"] == (1 << 30) // 2
    assert split["nativeBlockCacheBytes"] == int((1 << 30) * 0.1)
    assert split["nearCacheBytes"] + split["nativeBlockCacheBytes"] + split["serverMemoryBytes"] == 1 << 30
    explicit = conf.parse({p + "memoryBudget": "1g", p + "nearCacheBytes": "100m"})
    assert explicit["nearCacheBytes"] == 100 << 20  # an explicit part stays; the servers get the rest
    assert explicit["serverMemoryBytes"] == (1 << 30) - (100 << 20) - explicit["nativeBlockCacheBytes"]
    with pytest.raises(conf.ConfError, match="memoryBudget.*expected 'off' or a byte size of at least 16m"):
        conf.parse({p + "memoryBudget": "1m"})
    with pytest.raises(conf.ConfError, match="leave less than 10% of .*memoryBudget"):
        conf.parse({p + "memoryBudget": "1g", p + "nearCacheBytes": "950m"})
