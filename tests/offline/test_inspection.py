"""`keyedstate inspect` against real checkpoints: its key counts and key groups must agree with
what Spark's own state data sources read from the same checkpoint, and anything that is not an
intact keyedstate checkpoint must be refused naming the offending path."""
from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import functions as F

import keyedstate
from keyedstate.formats import changelog
from keyedstate.offline.inspection import render

from support.constants import HDFS_PROVIDER, KS, PFX, PROVIDER_CONF
from support.driver import FileStream, collect_into, session_confs, wait_for
JOIN_STORES = ["left-keyToNumValues", "left-keyWithIndexToValue",
               "right-keyToNumValues", "right-keyWithIndexToValue"]
T0 = dt.datetime(2024, 1, 1)


def at(seconds: float) -> str:
    return (T0 + dt.timedelta(seconds=seconds)).isoformat()


def windowed_count(df):
    return (df.withWatermark("ts", "10 seconds")
            .groupBy(F.window("ts", "10 seconds"), "k").agg(F.count("*").alias("n")))


@pytest.fixture(scope="module")
def agg_checkpoint(spark, tmp_path_factory) -> str:
    """A windowed count in append mode: evicted windows make later changelogs delete keys. One
    version per batch (no no-data batches), so version 3 = snapshot 2 + changelog 3 exactly."""
    stream = FileStream(spark, tmp_path_factory.mktemp("agg"), "k STRING, ts TIMESTAMP")
    confs = {PROVIDER_CONF: KS, PFX + "snapshotInterval": "2",
             "spark.sql.streaming.noDataMicroBatches.enabled": "false"}
    with session_confs(spark, confs):
        query = stream.start(windowed_count, collect_into({}), mode="append")
        try:
            for batch in range(3):
                if batch == 2:  # the last version must replay a changelog over snapshot 2
                    wait_for(lambda: all((stream.partition_dir(partition=p) / "2.ks-snapshot").exists()
                                         for p in (0, 1)), what="snapshot of version 2")
                stream.step(query, [{"k": f"k{(batch * 7 + i) % 40}", "ts": at(batch * 20 + i % 10)}
                                    for i in range(60)])
        finally:
            query.stop()
    return stream.checkpoint


@pytest.fixture(scope="module")
def join_checkpoint(spark, tmp_path_factory) -> str:
    """An inner stream-stream join with watermarks; the second step evicts the first's rows."""
    root = tmp_path_factory.mktemp("join")
    left = FileStream(spark, root / "left", "lk LONG, lts TIMESTAMP")
    right = FileStream(spark, root / "right", "rk LONG, rts TIMESTAMP", checkpoint=left.checkpoint)
    joined = left.df().withWatermark("lts", "10 seconds").join(
        right.df().withWatermark("rts", "10 seconds"),
        F.expr("lk = rk AND rts >= lts AND rts <= lts + interval 5 seconds"))
    with session_confs(spark, {PROVIDER_CONF: KS, PFX + "snapshotInterval": "100"}):
        query = (joined.writeStream.outputMode("append").foreachBatch(collect_into({}))
                 .option("checkpointLocation", left.checkpoint).start())
        try:
            for step in range(2):
                left.step(query, [{"lk": k, "lts": at(step * 30 + k % 5)} for k in range(12)], also=[right])
                right.step(query, [{"rk": k, "rts": at(step * 30 + k % 5 + 2)} for k in range(0, 16, 2)],
                           also=[left])
        finally:
            query.stop()
    return left.checkpoint


def _deletes_in(store: dict) -> int:
    """Delete records in the changelogs inspect replayed for ``store`` (test precondition)."""
    n = 0
    for part in store["partitions"]:
        first = (part["countedFrom"]["snapshot"] or 0) + 1
        for v in range(first, part["countedVersion"] + 1):
            log = changelog.read_file(str(Path(part["path"]) / f"{v}.ks-changelog"))
            n += sum(r.op in changelog.DELETES for r in log.records())
    return n


def _check_against_spark(spark, checkpoint: str, report: dict) -> None:
    """Per operator and store: partition count, operator and store names from Spark's
    state-metadata source; keys per partition and per key group from the statestore source."""
    metadata = spark.read.format("state-metadata").load(checkpoint).collect()
    assert {(r.operatorId, r.stateStoreName) for r in metadata} == {
        (op["operatorId"], s["storeName"]) for op in report["operators"] for s in op["stores"]}
    for op in report["operators"]:
        n = op["numPartitions"]
        for store in op["stores"]:
            assert store["keyGroups"] == keyedstate.conf.parse({})["keyGroups"]
            meta = [r for r in metadata if (r.operatorId, r.stateStoreName) == (op["operatorId"], store["storeName"])]
            assert (meta[0].operatorName, meta[0].numPartitions) == (op["operatorName"], n)
            assert len(store["partitions"]) == n
            state = (spark.read.format("statestore").option("operatorId", op["operatorId"])
                     .option("storeName", store["storeName"]).load(checkpoint))
            # keyedstate's key group: Spark's partitioning hash of the key (minus the join's index).
            fields = [f.name for f in state.schema["key"].dataType.fields]
            if store["storeName"].endswith("keyWithIndexToValue"):
                fields = fields[:-1]
            hashed = state.select("partition_id", F.expr(
                f"pmod(hash({', '.join(f'key.`{f}`' for f in fields)}), {store['keyGroups']})").alias("g"))
            expected = Counter((r.partition_id, r.g) for r in hashed.collect())
            found = Counter({(p["partitionId"], g): c for p in store["partitions"] for g, c in p["keysPerKeyGroup"]})
            assert found == expected, store["storeName"]
            per_partition = Counter()
            for (p, _), c in expected.items():
                per_partition[p] += c
            assert {p["partitionId"]: p["keys"] for p in store["partitions"]} == {p: per_partition[p] for p in range(n)}
            assert store["totalKeys"] == sum(per_partition.values()) > 0
            assert all(g % n == p for p, g in found)
            d = store["distribution"]
            assert (d["minKeys"], d["maxKeys"]) == (min(per_partition[p] for p in range(n)),
                                                    max(per_partition.values()))
            assert d["keyGroupsWithData"] == len(expected) and d["misplacedKeys"] == 0


def test_aggregation_counts_match_sparks_state_reader(spark, agg_checkpoint):
    report = keyedstate.inspect(agg_checkpoint)
    assert report["latestCommittedBatch"] == 2
    [op] = report["operators"]
    [store] = op["stores"]
    # The path under test: snapshot 2 restored, then changelog 3 applied, deletes included.
    assert store["countedVersion"] == 3 and store["snapshotVersions"] == [2]
    assert all(p["countedFrom"] == {"snapshot": 2, "changelogs": 1} for p in store["partitions"])
    assert _deletes_in(store) > 0
    assert store["ttl"] is None and store["bytesOnDisk"] > 0
    _check_against_spark(spark, agg_checkpoint, report)


def test_join_counts_match_sparks_state_reader(spark, join_checkpoint):
    report = keyedstate.inspect(join_checkpoint)
    [op] = report["operators"]
    assert op["operatorName"] == "symmetricHashJoin" and op["storeNames"] == JOIN_STORES
    for store in op["stores"]:  # no snapshot: every version replayed from the first changelog
        assert all(p["countedFrom"] == {"snapshot": None, "changelogs": store["countedVersion"]}
                   for p in store["partitions"])
    assert sum(_deletes_in(s) for s in op["stores"]) > 0
    _check_against_spark(spark, join_checkpoint, report)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "keyedstate.cli", "inspect", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_prints_every_operator_and_store(agg_checkpoint, join_checkpoint):
    for checkpoint, name, stores in ((agg_checkpoint, "stateStoreSave", ["default"]),
                                     (join_checkpoint, "symmetricHashJoin", JOIN_STORES)):
        report = keyedstate.inspect(checkpoint)
        text = _cli("--checkpoint", checkpoint)
        assert text.returncode == 0, text.stderr
        assert f"operator 0  {name}  partitions: 2" in text.stdout
        for store in report["operators"][0]["stores"]:
            assert f"store {store['storeName']}\n" in text.stdout
            assert f"keys       {store['totalKeys']} in " in text.stdout
        assert [s["storeName"] for s in report["operators"][0]["stores"]] == stores
        as_json = _cli("--checkpoint", checkpoint, "--json")
        assert as_json.returncode == 0, as_json.stderr
        assert json.loads(as_json.stdout) == json.loads(json.dumps(report))


def test_checkpoint_of_hdfs_provider_is_refused(spark, tmp_path):
    stream = FileStream(spark, tmp_path, "k STRING, ts TIMESTAMP")
    with session_confs(spark, {PROVIDER_CONF: HDFS_PROVIDER}):
        query = stream.start(lambda df: df.groupBy("k").count(), collect_into({}))
        try:
            for batch in range(2):
                stream.step(query, [{"k": f"k{i}", "ts": at(i)} for i in range(batch, batch + 10)])
        finally:
            query.stop()
    with pytest.raises(keyedstate.InspectError) as err:
        keyedstate.inspect(stream.checkpoint)
    message = str(err.value)
    assert str(stream.partition_dir(partition=0)) in message
    assert "1.delta" in message and "not written by keyedstate" in message
    cli = _cli("--checkpoint", stream.checkpoint)
    assert cli.returncode == 1 and cli.stdout == ""
    assert message in cli.stderr


def test_missing_or_corrupt_checkpoint_is_refused_naming_the_path(agg_checkpoint, tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(keyedstate.InspectError, match=f"{missing} does not exist"):
        keyedstate.inspect(missing)

    copy = tmp_path / "truncated-changelog"
    shutil.copytree(agg_checkpoint, copy)
    victim = copy / "state" / "0" / "1" / "3.ks-changelog"  # replayed over snapshot 2
    victim.write_bytes(victim.read_bytes()[:-3])
    with pytest.raises(keyedstate.InspectError) as err:
        keyedstate.inspect(copy)
    assert str(victim) in str(err.value) and "truncated or corrupt" in str(err.value)

    # A corrupt snapshot is skipped for the changelogs before it (like a load's auto repair),
    # with a warning naming it; once those are cleaned up, nothing consistent is left: refused.
    copy = tmp_path / "corrupt-manifest"
    shutil.copytree(agg_checkpoint, copy)
    victim = copy / "state" / "0" / "0" / "2.ks-snapshot"
    victim.write_text(victim.read_text()[:50])
    repaired, good = keyedstate.inspect(copy), keyedstate.inspect(agg_checkpoint)
    part, good_part = repaired["operators"][0]["stores"][0], good["operators"][0]["stores"][0]
    assert [p["keysPerKeyGroup"] for p in part["partitions"]] == [p["keysPerKeyGroup"] for p in good_part["partitions"]]
    assert part["partitions"][0]["countedFrom"] == {"snapshot": None, "changelogs": 3}
    assert any(str(victim) in w and "truncated or corrupt" in w for w in part["warnings"]), part["warnings"]
    for v in (1, 2):
        (victim.parent / f"{v}.ks-changelog").unlink()
    with pytest.raises(keyedstate.InspectError) as err:
        keyedstate.inspect(copy)
    assert str(victim) in str(err.value) and "truncated or corrupt" in str(err.value)


def test_ttl_is_read_from_the_newest_manifest(agg_checkpoint, tmp_path):
    copy = tmp_path / "ttl"
    shutil.copytree(agg_checkpoint, copy)
    ttl = {"ttlMs": 3600000, "updateType": "OnCreateAndWrite", "visibility": "NeverReturnExpired"}
    for part in (0, 1):
        manifest = copy / "state" / "0" / str(part) / "2.ks-snapshot"
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "ttl": ttl}))
    report = keyedstate.inspect(copy)
    assert report["operators"][0]["stores"][0]["ttl"] == ttl
    assert "TTL        ttlMs=3600000, updateType=OnCreateAndWrite, visibility=NeverReturnExpired\n" in render(report)
    assert "TTL        off/unknown\n" in render(keyedstate.inspect(agg_checkpoint))
