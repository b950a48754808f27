"""A quick subset of the fault campaign (``python3 -m benchmarks.faults``, report in
benchmarks/RESULTS-faults.md): state servers SIGKILLed mid-batch, and a checkpoint store that
runs out of space, each judged against an uninterrupted run of the HDFS provider."""
from __future__ import annotations

import pytest

from support.campaign import PLANS, run_campaign
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
