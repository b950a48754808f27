"""Every operator scenario's output with its checkpoint on real HDFS (MiniDFSCluster, replication 2)
and on S3 through s3a (moto), the query stopped and restarted after every step, equals Spark's
default provider's uninterrupted output on the same storage (issue 48)."""
from __future__ import annotations

import pytest

from support.constants import PFX, REFERENCE_PROVIDER
from support.driver import assert_same_output
from support.scenarios import SCENARIOS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CASES = ["aggregation-update", "drop-duplicates"]


@pytest.mark.parametrize("scenario", CASES)
def test_restarted_every_step_equals_default_provider(storage_session, storage_root, candidate_provider,
                                                     scenario, tmp_path):
    steps = len(next(s for s in SCENARIOS if s.name == scenario).steps)
    reference = storage_session.run_scenario(scenario, REFERENCE_PROVIDER, f"{storage_root}/reference",
                                             tmp_path / "reference")
    # a snapshot every 2 versions: restarts load snapshots uploaded to the store, and changelogs after them
    candidate = storage_session.run_scenario(scenario, candidate_provider, f"{storage_root}/candidate",
                                             tmp_path / "candidate", restart_every_step=True,
                                             confs={PFX + "snapshotInterval": "2"})
    assert len({b for b, _ in reference}) >= steps and any(rows for _, rows in reference[steps // 2:])
    assert_same_output(reference, candidate, labels=("default provider, uninterrupted",
                                                     f"{candidate_provider}, restarted every step"))
