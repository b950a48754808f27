"""memoryBudget bounds what keyedstate holds in an executor: with a state ten times the budget,
the JVM and its state servers peak no higher than with a state that (nearly) fits, plus the
budget. Real Spark in a child process (its own JVM, so that peak RSS is this test's alone)."""
from __future__ import annotations

import pytest

from support.processes import peak_rss_bytes
from support.sessions import SessionProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BUDGET = 40 << 20
BATCHES = 7
KEYS_PER_BATCH = 500_000
NEAR_CACHE_ENTRY = 150  # heap of one near-cache entry of this query (key row with group prefix, count row, overhead)
PFX = "spark.sql.streaming.stateStore.keyedstate."


def _peak(tmp_path, name: str, new_keys_every_batch: bool) -> tuple[int, list[dict]]:
    """Peak RSS of JVM + state servers over BATCHES batches of KEYS_PER_BATCH keys, and each
    batch's state-operator metrics."""
    session = SessionProcess(tmp_path / name, confs={PFX + "memoryBudget": str(BUDGET)})
    try:
        session.start_query("q", tmp_path / name / "ckpt", tmp_path / name / "in")
        metrics = []
        for b in range(BATCHES):
            first = b * KEYS_PER_BATCH if new_keys_every_batch else 0
            reply = session.feed("q", [f"k{k:08d}" for k in range(first, first + KEYS_PER_BATCH)], timeout=300)
            assert reply["ok"], reply
            assert len(reply["counts"]) == KEYS_PER_BATCH
            metrics.append(reply["stateMetrics"][0])
        peak = peak_rss_bytes(session.jvm_pid) + sum(peak_rss_bytes(p) for p in session.servers())
        session.call({"op": "stop", "name": "q"})
        return peak, metrics
    finally:
        session.kill()


def test_a_state_ten_times_the_budget_stays_within_it(tmp_path):
    state_bytes = BATCHES * KEYS_PER_BATCH * NEAR_CACHE_ENTRY
    assert state_bytes >= 10 * BUDGET
    # Spark's own baseline: the same batches over the same keys each time (the state is one
    # batch's keys), then new keys every batch (the state grows to ten times the budget).
    baseline, _ = _peak(tmp_path, "baseline", new_keys_every_batch=False)
    large, metrics = _peak(tmp_path, "large", new_keys_every_batch=True)
    print(f"peak RSS JVM + servers: baseline {baseline >> 20} MiB, state {state_bytes >> 20} MiB: {large >> 20} MiB "
          f"(budget {BUDGET >> 20} MiB); keyedstateMemoryBytes per batch "
          f"{[m.get('keyedstateMemoryBytes', 0) >> 20 for m in metrics]} MiB")
    assert large <= baseline + BUDGET, (large >> 20, baseline >> 20)
    used = [m["keyedstateMemoryBytes"] for m in metrics]
    assert all(0 < u <= BUDGET * 1.05 for u in used), used  # the metric reports the bound it keeps
    assert metrics[-1]["keyedstateCacheEvictions"] > 0  # the near cache did spill: the state is larger
