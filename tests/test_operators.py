"""Operator equivalence: every stateful operator gives, batch for batch, the same output with the
provider under test (stopped and restarted from its checkpoint half way) as with Spark's default
HDFS-backed provider running uninterrupted (scenarios in support/scenarios.py)."""
from __future__ import annotations

import pytest

from support.constants import REFERENCE_PROVIDER
from support.driver import assert_same_output, run_query
from support.scenarios import SCENARIOS, Scenario

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def run(spark, scenario: Scenario, provider: str, root, restart_after=None):
    inputs = [root / "input-left", root / "input-right"] if scenario.multi else root / "input"
    return run_query(spark, provider, scenario.build, scenario.schema, scenario.steps,
                     root / "checkpoint", inputs, scenario.mode, restart_after=restart_after)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_same_output_as_reference_across_a_restart(spark, candidate_provider, tmp_path, scenario):
    reference = run(spark, scenario, REFERENCE_PROVIDER, tmp_path / "reference")
    # the scenario must produce output after the restart point, or it would not test recovery
    assert any(rows for _, rows in reference[len(reference) // 2:]), reference
    candidate = run(spark, scenario, candidate_provider, tmp_path / "candidate",
                    restart_after=scenario.restart_after)
    assert_same_output(reference, candidate, labels=(f"reference ({REFERENCE_PROVIDER.rsplit('.', 1)[-1]})",
                                                     f"candidate ({candidate_provider.rsplit('.', 1)[-1]})"))
