"""A dead state server: the task fails with a clear error, the retry reloads from the
checkpoint, and the output equals that of an uninterrupted run."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pandas as pd
from pyspark.sql.streaming.state import GroupStateTimeout

from support.constants import KS
from support.driver import run_query
from support.processes import state_server_pids

BATCHES = [[{"k": f"k{(b * 3 + i) % 10}", "v": b * 100 + i} for i in range(12)] for b in range(4)]


def running_totals(kill_marker: str | None, victims: list[int]):
    """applyInPandasWithState keeping a per-key running (count, sum); optionally SIGKILLs the
    state servers in ``victims`` once, from inside the stateful task, while its store is open."""

    def update(key, frames, state):
        count, total = state.get if state.exists else (0, 0)
        for frame in frames:
            if kill_marker and (frame["v"] == 205).any() and not os.path.exists(kill_marker):
                Path(kill_marker).touch()
                for pid in victims:
                    os.kill(pid, signal.SIGKILL)
            count += len(frame)
            total += int(frame["v"].sum())
        state.update((count, total))
        yield pd.DataFrame({"k": [key[0]], "count": [count], "total": [total]})

    def build(df):
        return df.groupBy("k").applyInPandasWithState(
            update, "k string, count long, total long", "count long, total long", "update",
            GroupStateTimeout.NoTimeout)

    return build


def our_state_servers(spark) -> set[int]:
    """State servers started by this test session's JVM (not other processes' on the machine)."""
    jvm_pid = spark.sparkContext._jvm.ProcessHandle.current().pid()
    return {pid for pid in state_server_pids()
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(jvm_pid)}


def run(spark, root: Path, kill_marker: str | None) -> list:
    victims = sorted(our_state_servers(spark)) if kill_marker else []
    return run_query(spark, KS, running_totals(kill_marker, victims), "k STRING, v LONG", BATCHES,
                     root / "checkpoint", root / "input", "update")


def test_sigkill_of_state_server_mid_batch_recovers_exactly(spark, tmp_path):
    reference = run(spark, tmp_path / "reference", kill_marker=None)
    before = our_state_servers(spark)
    assert before, "a state server should be running"
    marker = tmp_path / "killed"
    recovered = run(spark, tmp_path / "killed-run", kill_marker=str(marker))
    assert marker.exists(), "the server was never killed: the test did not test anything"
    after = our_state_servers(spark)
    assert after and not (after & before), "a new state server should have replaced the killed one"
    assert recovered == reference
