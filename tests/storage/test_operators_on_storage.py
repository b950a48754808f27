"""Operator scenarios with their checkpoint on real HDFS (MiniDFSCluster, replication 2) and on S3
through s3a (moto), the query stopped and restarted after every step: the output equals Spark's
default provider's, uninterrupted (restarted at the same steps for a query with several inputs;
its checkpoint on local disk: conftest's scenario_runs) (issue 48)."""
from __future__ import annotations

import pytest

from support.driver import assert_same_output
from support.scenarios import SCENARIOS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


# Every kind of operator the issue names, on both stores
CASES = [(scenario, where) for where in ("hdfs", "s3a")
         for scenario in ("aggregation-update", "drop-duplicates", "stream-stream-inner-join", "session-window-append",
                          "pandas-with-state-no-timeout")]


@pytest.mark.parametrize("scenario, where", CASES)
def test_restarted_every_step_equals_default_provider(scenario_runs, candidate_provider, scenario, where):
    run = scenario_runs(scenario, where)
    steps = len(next(s for s in SCENARIOS if s.name == scenario).steps)
    assert len({b for b, _ in run.reference}) >= steps and any(rows for _, rows in run.reference[steps // 2:])
    assert_same_output(run.reference, run.candidate, labels=("default provider, uninterrupted",
                                                             f"{candidate_provider}, restarted every step"))
