"""The offline tools on keyedstate checkpoints on real HDFS and on S3 through s3a (issue 48), on
the checkpoints the operator scenarios wrote there (restarted after every step; conftest's
scenario_runs), each compared with the state the scenario's steps imply: inspect, verify, get and
the change feed read the aggregation's; migrate moves dropDuplicates' to Spark's providers and
back; rescale splits applyInPandasWithState's over 3 partitions; the state processor transforms
the aggregation's and undoes it (last: it leaves the checkpoint as it found it)."""
from __future__ import annotations

import collections
import json
import subprocess
import sys

import pytest

from support.constants import HDFS_PROVIDER, KS, ROCKSDB_PROVIDER
from support.scenarios import DEDUP_STEPS, KV_STEPS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _expected() -> dict[str, tuple[int, int]]:
    """key -> (count, sum of v) after every step of the aggregation scenario."""
    count, total = collections.Counter(), collections.Counter()
    for step in KV_STEPS:
        for k, v in step:
            count[k] += 1
            total[k] += v
    return {k: (count[k], total[k]) for k in count}


@pytest.fixture(scope="module")
def checkpoints(scenario_runs, candidate_provider):
    """{"hdfs" | "s3a": the URI of the aggregation's keyedstate checkpoint there, restarted after
    every step, a snapshot every 2 versions (conftest's scenario_runs)}."""
    if candidate_provider != KS:
        pytest.skip(f"the offline tools read keyedstate checkpoints, not {candidate_provider}'s")
    return {where: scenario_runs("aggregation-update", where).checkpoint for where in ("hdfs", "s3a")}


def _counts(rows: list[dict]) -> dict[str, tuple[int, int]]:
    """key -> (count, sum) of the statestore rows of the aggregation (or of applyInPandasWithState,
    whose value is its group state)."""
    out = {}
    for row in rows:
        value = row["value"].get("groupState", row["value"])
        out[row["key"]["k"]] = tuple(value.values())
    return out


@pytest.mark.parametrize("where", ["hdfs", "s3a"])
def test_inspect(storage_session, checkpoints, where):
    report = storage_session.offline("inspect", checkpoints[where])
    assert report["latestCommittedBatch"] == len(KV_STEPS) - 1, report
    [op] = report["operators"]
    [store] = op["stores"]
    assert store["totalKeys"] == len(_expected()), store
    assert store["countedVersion"] == len(KV_STEPS) and store["bytesOnDisk"] > 0, store


@pytest.mark.parametrize("where", ["hdfs", "s3a"])
def test_verify(storage_session, checkpoints, where):
    report = storage_session.offline("verify", checkpoints[where])
    assert report["ok"], report
    assert report["checked"]["keysChecked"] > 0 and report["checked"]["snapshots"] > 0, report


@pytest.mark.parametrize("where", ["hdfs", "s3a"])
def test_get(storage_session, checkpoints, where):
    for key, (count, total) in sorted(_expected().items()):
        result = storage_session.offline("get", checkpoints[where], operator=0, key={"k": key})
        assert result["found"] and list(result["value"].values()) == [count, total], (key, result)
        assert result["from"].startswith(checkpoints[where].split("://")[0] + "://"), result
    missing = storage_session.offline("get", checkpoints[where], operator=0, key={"k": "absent"})
    assert missing["found"] is False and missing["value"] is None


def test_verify_command_on_hdfs(checkpoints):
    """The command line, as a user runs it: a local session of its own reaches hdfs:// with
    pyspark's Hadoop client alone."""
    proc = subprocess.run([sys.executable, "-m", "keyedstate.cli", "verify", "--checkpoint", checkpoints["hdfs"],
                           "--json", "--conf", "spark.hadoop.dfs.replication=2"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout)["ok"] is True


@pytest.mark.parametrize("where", ["hdfs", "s3a"])
def test_change_feed(storage_session, checkpoints, where):
    """readChangeFeed through the statestore data source: every batch's updates, each with the
    key's value after that batch."""
    count, total, expected = collections.Counter(), collections.Counter(), []
    for batch, step in enumerate(KV_STEPS):
        for k, v in step:
            count[k] += 1
            total[k] += v
        expected += [(batch, "update", k, count[k], total[k]) for k in sorted({k for k, _ in step})]
    last = len(KV_STEPS) - 1

    def feed(start: int, end: int) -> list:
        rows = storage_session.offline("state_rows", checkpoints[where], readChangeFeed="true",
                                       changeStartBatchId=start, changeEndBatchId=end)
        return sorted((r["batch_id"], r["change_type"], r["key"]["k"], *r["value"].values()) for r in rows)

    assert feed(0, last) == sorted(expected)
    assert feed(2, 3) == sorted(e for e in expected if 2 <= e[0] <= 3)


@pytest.mark.parametrize("where", ["hdfs", "s3a"])
def test_migrate_to_sparks_providers_and_back(storage_session, scenario_runs, candidate_provider, where):
    """dropDuplicates' state moved keyedstate -> RocksDB -> HDFS-backed -> keyedstate: after each
    migration the state reads as every id the steps had, and the offset log names the provider."""
    if candidate_provider != KS:
        pytest.skip(f"migrates a keyedstate checkpoint, not {candidate_provider}'s")
    checkpoint = scenario_runs("drop-duplicates", where).checkpoint
    ids = sorted({i for step in DEDUP_STEPS for i, _ in step})
    state = lambda: sorted(r["key"]["id"] for r in storage_session.offline("state_rows", checkpoint))  # noqa: E731
    assert state() == ids
    for target, cls in (("rocksdb", ROCKSDB_PROVIDER), ("hdfs", HDFS_PROVIDER), ("keyedstate", KS)):
        result = storage_session.offline("migrate", checkpoint, provider=target)
        assert result["to"] == cls and result["written"], result
        assert state() == ids, f"after the migration to {target}"
    assert storage_session.offline("verify", checkpoint)["ok"]


@pytest.mark.parametrize("where", ["hdfs", "s3a"])
def test_rescale(storage_session, scenario_runs, candidate_provider, where):
    """applyInPandasWithState's state, 2 -> 3 partitions (downloaded, rescaled, uploaded in commit
    order): the same (count, sum) per key, spread over 3 partitions, and verify passes."""
    if candidate_provider != KS:
        pytest.skip(f"rescales a keyedstate checkpoint, not {candidate_provider}'s")
    checkpoint = scenario_runs("pandas-with-state-no-timeout", where).checkpoint
    result = storage_session.offline("rescale", checkpoint, partitions=3)
    assert (result["from_partitions"], result["to_partitions"]) == (2, 3), result
    rows = storage_session.offline("state_rows", checkpoint)
    assert _counts(rows) == _expected() and {r["partition_id"] for r in rows} <= {0, 1, 2}, rows
    [store] = storage_session.offline("inspect", checkpoint)["operators"][0]["stores"]
    assert len(store["partitions"]) == 3, store
    assert storage_session.offline("verify", checkpoint)["ok"]


@pytest.mark.parametrize("where", ["hdfs", "s3a"])
def test_state_processor_transform_and_undo(storage_session, checkpoints, where):
    """The state processor reads the aggregation's state, transforms it (count x 1000, a new state
    batch), and undo takes the change back to the byte: every file's hash as before."""
    checkpoint = checkpoints[where]
    before = storage_session.offline("file_hashes", checkpoint)
    assert _counts(storage_session.offline("state_rows", checkpoint)) == _expected()
    result = storage_session.offline("multiply_counts", checkpoint, operator=0, factor=1000)
    assert result["batch"] == len(KV_STEPS) and result["written"][0]["rows"] == len(_expected()), result
    assert _counts(storage_session.offline("state_rows", checkpoint)) == {
        k: (n * 1000, s) for k, (n, s) in _expected().items()}
    storage_session.offline("undo", checkpoint)
    assert storage_session.offline("file_hashes", checkpoint) == before
    assert _counts(storage_session.offline("state_rows", checkpoint)) == _expected()
