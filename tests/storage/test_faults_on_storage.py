"""State servers SIGKILLed at commit with the checkpoint on real HDFS and on S3 through s3a
(issue 48): the aggregation scenario, every state server of the session's JVM killed as soon as
the changelog of version 2, then of version 3, of a partition is in the checkpoint (the commit has
made it durable; the server holds it to apply), the query restarted after each failure. Its
output equals Spark's default provider's on the same storage, uninterrupted: nothing lost or
duplicated, a replayed batch identical. The full campaign on real storage is
benchmarks/faults_storage.py; support/storage_ops.py's CommitKiller serves both.

S3 answering 503 SlowDown to every request for a while, from the moment a state store's commit
writes its changelog: s3a retries the throttled requests and the output equals the default
provider's. The full campaign (kills, DataNode stops, NameNode restarts, 500s, slow answers):
benchmarks/faults_storage.py."""
from __future__ import annotations

import pickle

import pytest

from support.constants import KS, PFX
from support.driver import assert_same_output
from support.scenarios import KV_STEPS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

KILL_VERSIONS = [2, 3]  # a snapshot version (snapshotInterval 2) and a changelog-only one


@pytest.mark.parametrize("where", ["hdfs", "s3a"])
def test_state_servers_killed_at_commit(storage_session, scenario_runs, storage_root, candidate_provider,
                                        tmp_path, where):
    if candidate_provider != KS:
        pytest.skip(f"kills keyedstate's state servers, which {candidate_provider} has none of")
    reference = scenario_runs("aggregation-update", where).reference
    reference_file = tmp_path / "reference.pickle"
    reference_file.write_bytes(pickle.dumps(reference))
    result = storage_session.tool("killed_at_commit", scenario="aggregation-update", provider=KS,
                                  checkpoint=f"{storage_root(where, 'faults')}/killed-at-commit", root=str(tmp_path),
                                  reference=str(reference_file), kill_versions=KILL_VERSIONS,
                                  confs={PFX + "snapshotInterval": "2"})
    assert [k["version"] for k in result["kills"]] == KILL_VERSIONS and all(k["servers"] for k in result["kills"]), \
        result
    assert result["lost"] == 0 and result["duplicated"] == 0, "\n".join(result["detail"])
    assert [b for b, _ in result["final"]] == [b for b, _ in reference], result["final"]


def test_503_during_a_commit_on_s3a_loses_nothing(scenario_runs, storage_session, storage_root, s3_proxy,
                                                  candidate_provider, tmp_path):
    reference = scenario_runs("aggregation-update", "s3a").reference
    throttled = []

    def throttle(request):
        throttled.append(request)
        s3_proxy.fail_for(2.0, status=503)

    s3_proxy.on_request(lambda r: r.op == "PUT" and "/state/" in r.key and ".ks-changelog" in r.key
                        or r.op == "PUT" and "/state/" in r.key and r.key.endswith((".delta", ".changelog")),
                        throttle)
    try:
        output = storage_session.run_scenario("aggregation-update", candidate_provider,
                                              f"{storage_root('s3a', 'faults')}/throttled-commit", tmp_path)
    finally:
        s3_proxy.disarm()
    assert throttled, "no state store commit wrote a changelog through the proxy"
    answered = [r for r in s3_proxy.since(throttled[0].time) if r.injected]
    assert answered and any("/state/" in r.key for r in answered), "the proxy answered no 503 to a state file"
    assert len({b for b, _ in output}) >= len(KV_STEPS)
    assert_same_output(reference, output, labels=("default provider, uninterrupted",
                                                  f"{candidate_provider}, 503 SlowDown during a commit"))
