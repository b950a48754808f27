"""Operator equivalence: every stateful operator gives, batch for batch, the same output with the
provider under test (stopped and restarted from its checkpoint half way) as with Spark's default
HDFS-backed provider running uninterrupted (scenarios in support/scenarios.py).

The candidate checkpoints on objtest:// (support/testjar.py): object-store semantics (rename is
copy + delete, no directories, objects appear on close; Spark's FileSystem-based checkpoint
manager, as for s3a), at no extra cost; the reference stays on local files."""
from __future__ import annotations

import json

import pytest

from support.constants import KS, REFERENCE_PROVIDER, STATE_PREFIX
from support.driver import assert_same_output, run_query, session_confs
from support.durability import disarm, objtest_location
from support.scenarios import SCENARIOS, Scenario

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def object_store(spark):
    disarm(spark)  # objtest:// as s3a: no faults, directory markers


def run(spark, scenario: Scenario, provider: str, root, restart_after=None, objtest=None):
    """``objtest``: (objtest:// location, its local directory) to checkpoint on, else in ``root``."""
    location, checkpoint = objtest or (None, root / "checkpoint")
    return run_query(spark, provider, scenario.build, scenario.schema, scenario.steps,
                     checkpoint, scenario.inputs(root), scenario.mode, restart_after=restart_after, location=location)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_same_output_as_reference_across_a_restart(spark, candidate_provider, tmp_path, scenario, reference_output):
    reference = reference_output(scenario)
    candidate = run(spark, scenario, candidate_provider, tmp_path / "candidate",
                    restart_after=scenario.restart_after, objtest=objtest_location(spark, "operators"))
    assert_same_output(reference, candidate, labels=(f"reference ({REFERENCE_PROVIDER.rsplit('.', 1)[-1]})",
                                                     f"candidate ({candidate_provider.rsplit('.', 1)[-1]})"))


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_checkpoint_format_2_gives_the_same_output(spark, tmp_path, scenario, reference_output):
    """Spark's checkpointFormatVersion=2: a unique id per version, recorded in the commit log and
    loaded by id after the restart (Spark's HDFS provider refuses this format). On objtest:// too."""
    location, checkpoint = objtest_location(spark, "operators-v2")
    with session_confs(spark, {STATE_PREFIX + "checkpointFormatVersion": "2"}):
        candidate = run(spark, scenario, KS, tmp_path / "candidate", restart_after=scenario.restart_after,
                        objtest=(location, checkpoint))
    assert_same_output(reference_output(scenario), candidate)
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    ids = json.loads((commits / str(last)).read_text().splitlines()[1])["stateUniqueIds"]
    files = list((checkpoint / "state").rglob("*.ks-changelog"))
    assert ids and files and all("_" in f.name for f in files)
