"""A fault of real storage that keyedstate must ride through (issue 48): S3 answering 503 SlowDown
to every request for a while, from the moment a state store's commit writes its changelog. s3a
retries the throttled requests; the query's output equals Spark's default provider's on the same
storage. The full campaign (kills, DataNode stops, NameNode restarts, 500s, slow answers):
benchmarks/faults_storage.py."""
from __future__ import annotations

import pytest

from support.driver import assert_same_output
from support.scenarios import KV_STEPS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_503_during_a_commit_on_s3a_loses_nothing(scenario_runs, storage_session, storage_roots, s3_proxy,
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
                                              f"{storage_roots['s3a']}/faults/throttled-commit", tmp_path)
    finally:
        s3_proxy.disarm()
    assert throttled, "no state store commit wrote a changelog through the proxy"
    answered = [r for r in s3_proxy.since(throttled[0].time) if r.injected]
    assert answered and any("/state/" in r.key for r in answered), "the proxy answered no 503 to a state file"
    assert len({b for b, _ in output}) >= len(KV_STEPS)
    assert_same_output(reference, output, labels=("default provider, uninterrupted",
                                                  f"{candidate_provider}, 503 SlowDown during a commit"))
