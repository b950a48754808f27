"""The offline tools (inspect, verify, get) on keyedstate checkpoints on real HDFS and on S3 through
s3a (issue 48): each reads the checkpoint the aggregation scenario wrote there (restarted after
every step) and reports the state its steps imply."""
from __future__ import annotations

import collections
import json
import subprocess
import sys

import pytest

from support.constants import KS
from support.scenarios import KV_STEPS

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
