"""keyedstate migrate with real Spark (issue 15, point 2): a query moved HDFS -> keyedstate ->
RocksDB -> keyedstate while stopped continues with the output of an uninterrupted run, batch ids
included, for every kind of stateful operator; an interrupted migration leaves a usable
checkpoint and is rerun; it works on objtest://; migrate then rescale works.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import keyedstate
from keyedstate.offline import migration, remote
from keyedstate.offline.verify import verify
from support.constants import HDFS_PROVIDER, KS, PROVIDER_CONF, ROCKSDB_PROVIDER
from support.driver import assert_same_output, normalise, run_query
from support.offline import objtest_local, to_objtest
from support.scenarios import SCENARIOS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SEGMENTS = [(0, 2), (2, 3), (3, 4), (4, None)]
CHAIN = ["keyedstate", "rocksdb", "keyedstate"]  # after segments 0, 1, 2; the query starts on HDFS


def _scenario(name):
    return next(s for s in SCENARIOS if s.name == name)


def _provider(checkpoint: Path) -> str:
    batch = max(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit())
    return json.loads((checkpoint / "offsets" / str(batch)).read_text().split("\n")[1])["conf"][PROVIDER_CONF]


def _state(spark, checkpoint, join: bool = False) -> list:
    """Every state row; a stream-stream join's by side (its stores have no default reading)."""
    read = lambda **opts: normalise(spark.read.format("statestore").options(**opts).load(str(checkpoint)).collect())
    return [read(joinSide="left"), read(joinSide="right")] if join else read()


@pytest.mark.parametrize("name", ["aggregation-update", "drop-duplicates", "stream-stream-inner-join",
                                  "pandas-with-state-event-time-timeout", "session-window-append"])
def test_migrate_chain_continues_like_an_uninterrupted_run(spark, tmp_path, name, monkeypatch, reference_output):
    scenario = _scenario(name)
    if scenario.multi:
        # Spark itself changes a stream-stream join's output when it restarts at most points (it
        # checkpoints only the global watermark: see support/driver.py): the reference restarts
        # where the migrated run does, on HDFS, without migrating.
        reference = _segments(spark, scenario, HDFS_PROVIDER, tmp_path / "reference")
    else:
        reference = reference_output(scenario)
    root = tmp_path / "migrated"
    checkpoint = root / "checkpoint"
    output = []
    for index, (start, end) in enumerate(SEGMENTS):
        output += run_query(spark, HDFS_PROVIDER, scenario.build, scenario.schema, scenario.steps[start:end],
                            checkpoint, scenario.inputs(root), scenario.mode)
        if index == len(CHAIN):
            break
        target = CHAIN[index]
        if index == 0 and name in ("aggregation-update", "stream-stream-inner-join"):
            _interrupted_then_rerun(spark, checkpoint, target, monkeypatch,
                                    during_writes=name == "stream-stream-inner-join", join=scenario.multi)
        else:
            before = _state(spark, checkpoint, scenario.multi)
            result = keyedstate.migrate(checkpoint, target, spark=spark)
            assert result["to"] == migration.PROVIDERS[target] and _provider(checkpoint) == result["to"]
            assert _state(spark, checkpoint, scenario.multi) == before
    assert_same_output(reference, output, labels=("uninterrupted (HDFS)", "migrated hdfs->ks->rocksdb->ks"))
    assert _provider(checkpoint) == KS
    assert verify(checkpoint)["ok"]


def _segments(spark, scenario, provider, root: Path) -> list:
    output = []
    for start, end in SEGMENTS:
        output += run_query(spark, provider, scenario.build, scenario.schema, scenario.steps[start:end],
                            root / "checkpoint", scenario.inputs(root), scenario.mode)
    return output


def _interrupted_then_rerun(spark, checkpoint: Path, target: str, monkeypatch, during_writes: bool,
                            join: bool = False) -> None:
    """A migration that dies half way through writing the new state (after the first store of
    several), or after writing it, before the switch: the checkpoint is still the old
    provider's, whole; the rerun completes it."""
    before = _state(spark, checkpoint, join)
    plan = keyedstate.migrate(checkpoint, target, spark=spark, dry_run=True)
    assert plan["from"] == HDFS_PROVIDER and len(plan["steps"]) == 3 and not list(checkpoint.rglob("*.ks-*"))
    write_store = migration.write_store
    calls = []

    def die_on_second_store(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed while writing the second store")
        return write_store(*args)

    def die(*_):
        raise KeyboardInterrupt("killed before the switch")
    with monkeypatch.context() as m:
        if during_writes:
            m.setattr(migration, "write_store", die_on_second_store)
        else:
            m.setattr(migration, "_switch", die)
        with pytest.raises(KeyboardInterrupt):
            keyedstate.migrate(checkpoint, target, spark=spark)
    assert _provider(checkpoint) == HDFS_PROVIDER
    assert list(checkpoint.rglob("*.ks-snapshot")) and list(checkpoint.rglob("*.delta"))
    assert _state(spark, checkpoint, join) == before  # still read with the HDFS provider
    keyedstate.migrate(checkpoint, target, spark=spark)
    assert _provider(checkpoint) == migration.PROVIDERS[target]
    assert _state(spark, checkpoint, join) == before
    assert not list(checkpoint.rglob("*.delta"))  # the old provider's files are retired
    again = keyedstate.migrate(checkpoint, target, spark=spark)
    assert again["alreadyMigrated"]


def test_migrate_on_objtest_then_rescale(spark, tmp_path, reference_output):
    scenario = _scenario("aggregation-update")
    reference = reference_output(scenario)
    root = tmp_path / "moved"
    local = root / "checkpoint"
    first = run_query(spark, ROCKSDB_PROVIDER, scenario.build, scenario.schema, scenario.steps[:3], local,
                      root / "input", scenario.mode)
    uri = to_objtest(spark, local)
    before = _state(spark, uri)
    result = keyedstate.migrate(uri, "keyedstate", spark=spark)
    assert result["written"] and _state(spark, uri) == before
    assert verify(uri, spark=spark)["ok"]
    rescaled = remote.rescale_anywhere(uri, 3, spark=spark)  # downloaded, rescaled, uploaded in commit order
    assert rescaled.to_dict()["toPartitions"] == 3 if "toPartitions" in rescaled.to_dict() else rescaled
    assert verify(uri, spark=spark)["ok"]
    # continued from the object store's copy (the driver reads the logs from local disk)
    shutil.rmtree(local)
    shutil.copytree(objtest_local(spark, uri), local)
    rest = run_query(spark, ROCKSDB_PROVIDER, scenario.build, scenario.schema, scenario.steps[3:], local,
                     root / "input", scenario.mode)
    shifted = [(b - 1, rows) for b, rows in rest]  # the rescale's repartition batch
    assert_same_output(reference, first + shifted)


def test_migrate_refusals_name_the_path_and_what_to_do(spark, tmp_path):
    with pytest.raises(migration.MigrateError, match="unknown provider"):
        keyedstate.migrate(tmp_path, "leveldb", spark=spark)
    (tmp_path / "commits").mkdir()
    with pytest.raises(migration.MigrateError, match=r"commits.*never committed"):
        keyedstate.migrate(tmp_path, "rocksdb", spark=spark)
