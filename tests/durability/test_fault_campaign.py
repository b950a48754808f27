"""A quick subset of the fault campaign (``python3 -m benchmarks.faults``, report in
benchmarks/RESULTS-faults.md): state servers SIGKILLed mid-batch, and a checkpoint store that
runs out of space, each judged against an uninterrupted run of the HDFS provider; a driver
killed in a commit window and between the state commit and the commit log."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from support.campaign import (COMMIT_LOG, PLANS, DriverPlan, changelog_window, judge_attempts, run_campaign,
                              run_driver_plan)
from support.constants import HDFS_PROVIDER, KS
from support.durability import disarm, objtest_root

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_quick_fault_campaign_loses_and_duplicates_nothing(spark, tmp_path):
    plans = [p for p in PLANS if p.name in ("agg-kill-v2", "dedup-diskfull-v1")]
    try:
        results = run_campaign(spark, plans, objtest_root(spark), tmp_path)
    finally:
        disarm(spark)
    for r in results:
        assert sum(r["faults"].values()) > 0, f"{r['plan'].name} injected nothing"
        assert (r["lost"], r["duplicated"]) == (0, 0), "\n".join(r["detail"])


def test_aimed_kills_of_a_child_driver_lose_and_duplicate_nothing(tmp_path):
    """A driver (child process: Python + its JVM) SIGKILLed between the state commit and
    ``commits/3`` and restarted over a changed filter, then SIGKILLed in the commit window of
    batch 4 (its changelog written, not published) and restarted, so that the re-executed
    version is loaded from the checkpoint: the output equals Spark's default provider's under the
    same commit-log kill and change (batch 3 delivered by both attempts, the second one's rows
    counting from then on)."""
    # The two plans at once: they share nothing, each on an objtest:// root of its own (its own
    # fault rules, kill counters and fault log, which run_driver_plan reads back).
    with ThreadPoolExecutor(1) as pool:
        reference = pool.submit(run_driver_plan, DriverPlan("reference", HDFS_PROVIDER, "1", "filter", kills=(3,),
                                                            steps=5), tmp_path / "objtest-reference", tmp_path)
        run = run_driver_plan(DriverPlan("keyedstate", KS, "1", "filter", kills=(3, changelog_window(5)), steps=5),
                              tmp_path / "objtest", tmp_path)
        reference = reference.result()
    assert reference["failures"] == [] and run["failures"] == [], (reference["failures"], run["failures"])
    assert run["kills"] == {COMMIT_LOG: 1, "commit: changelog written, not published": 1}, run["kills"]
    assert [b for b, _ in reference["outputs"]].count(3) == 2, reference["outputs"]  # batch 3 ran twice
    verdict = judge_attempts(reference["outputs"], run["outputs"])
    assert (verdict.lost, verdict.duplicated) == (0, 0), "\n".join(verdict.detail)
