"""Operator equivalence: every stateful operator gives, batch for batch, the same output with the
provider under test (stopped and restarted from its checkpoint half way) as with Spark's default
HDFS-backed provider running uninterrupted (scenarios in support/scenarios.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.constants import KS, REFERENCE_PROVIDER, STATE_PREFIX
from support.driver import assert_same_output, run_query, session_confs
from support.scenarios import SCENARIOS, Scenario

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def run(spark, scenario: Scenario, provider: str, root, restart_after=None):
    inputs = [root / "input-left", root / "input-right"] if scenario.multi else root / "input"
    return run_query(spark, provider, scenario.build, scenario.schema, scenario.steps,
                     root / "checkpoint", inputs, scenario.mode, restart_after=restart_after)


@pytest.fixture(scope="module")
def reference_output(spark, tmp_path_factory):
    """Each scenario's output on Spark's default provider, uninterrupted (computed once)."""
    outputs: dict[str, list] = {}

    def get(scenario: Scenario) -> list:
        if scenario.name not in outputs:
            outputs[scenario.name] = run(spark, scenario, REFERENCE_PROVIDER, tmp_path_factory.mktemp("reference"))
            # the scenario must produce output after the restart point, or it would not test recovery
            assert any(rows for _, rows in outputs[scenario.name][len(outputs[scenario.name]) // 2:])
        return outputs[scenario.name]

    return get


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_same_output_as_reference_across_a_restart(spark, candidate_provider, tmp_path, scenario, reference_output):
    reference = reference_output(scenario)
    candidate = run(spark, scenario, candidate_provider, tmp_path / "candidate",
                    restart_after=scenario.restart_after)
    assert_same_output(reference, candidate, labels=(f"reference ({REFERENCE_PROVIDER.rsplit('.', 1)[-1]})",
                                                     f"candidate ({candidate_provider.rsplit('.', 1)[-1]})"))


FORMAT_2_SCENARIOS = ["aggregation-update", "drop-duplicates-within-watermark", "stream-stream-inner-join",
                      "session-window-append", "pandas-with-state-event-time-timeout"]


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s.name in FORMAT_2_SCENARIOS], ids=lambda s: s.name)
def test_checkpoint_format_2_gives_the_same_output(spark, tmp_path, scenario, reference_output):
    """Spark's checkpointFormatVersion=2: a unique id per version, recorded in the commit log and
    loaded by id after the restart (Spark's HDFS provider refuses this format)."""
    with session_confs(spark, {STATE_PREFIX + "checkpointFormatVersion": "2"}):
        candidate = run(spark, scenario, KS, tmp_path / "candidate", restart_after=scenario.restart_after)
    assert_same_output(reference_output(scenario), candidate)
    commits = Path(tmp_path / "candidate" / "checkpoint" / "commits")
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    ids = json.loads((commits / str(last)).read_text().splitlines()[1])["stateUniqueIds"]
    files = list((tmp_path / "candidate" / "checkpoint" / "state").rglob("*.ks-changelog"))
    assert ids and files and all("_" in f.name for f in files)
