"""The fault campaign's engine (the command and its report: benchmarks/faults.py): runs of a
deterministic query with one kind of fault re-armed after every committed step, each judged
against an uninterrupted run of Spark's HDFS-backed provider. See benchmarks/faults.py for what
each kind injects and how faults are classified by phase."""
from __future__ import annotations

import collections
import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import processes, testjar
from . import scenarios as sc
from .constants import HDFS_PROVIDER, KS, PFX, STATE_PREFIX
from .driver import run_query
from .faults import judge, run_through_failures

IO_FAULTS = dict(
    create={"nth": 1, "path": ".ks-changelog"},
    rename={"nth": 2, "path": "ks-", "at": "afterCopy"},
    open={"nth": 1, "path": "ks-"},
    listStatus={"nth": 3, "path": "/state/"},
    delete={"nth": 1, "path": "/state/"},
)
OBJECT_STORE = {"dirMarkers": "true", "rename.existing": "fail"}
CONFS = {PFX + "snapshotInterval": "2", "spark.sql.streaming.minBatchesToRetain": "2"}

SCENARIOS = {
    "agg": (sc.agg_update, sc.KV, sc.KV_STEPS, "update"),
    "dedup": (sc.drop_duplicates, sc.IV, sc.DEDUP_STEPS, "append"),
}


@dataclass(frozen=True)
class Plan:
    name: str
    scenario: str
    kind: str  # io | diskfull | kill
    format_version: str = "1"


PLANS = [Plan(f"{s}-{k}-v{v}", s, k, v) for s in ("agg", "dedup") for k in ("io", "diskfull", "kill")
         for v in ("1", "2")]


def classify(fault: dict) -> str:
    path = " ".join(fault["paths"])
    if fault["kind"] == "shortRead":
        return "load (short read)"
    if fault["op"] == "open":
        return "load (open)"
    if fault["op"] == "listStatus":
        return "listing (load, cleanup)"
    if fault["op"] == "delete":
        return "cleanup"
    if ".ks-changelog" in path and "ks-files/" not in path:
        return "commit"
    if "ks-files/" in path or ".ks-snapshot" in path:
        return "snapshot upload"
    return "other"


class Killer:
    """SIGKILLs every state server of this JVM a moment after the next batch starts."""

    def __init__(self, jvm_pid: int, seed: int = 12) -> None:
        self.jvm_pid, self.kills = jvm_pid, 0
        self.random = random.Random(seed)

    def arm(self) -> None:
        delay = self.random.uniform(0.1, 1.0)  # anywhere in the next batch: apply, commit, upload

        def later():
            time.sleep(delay)
            for pid in [p for p in processes.state_server_pids() if p in processes.descendants(self.jvm_pid)]:
                processes.signal_quietly(pid, signal.SIGKILL)
                self.kills += 1
        threading.Thread(target=later, daemon=True).start()


def run_plan(spark, plan: Plan, root: Path, work: Path, references: dict) -> dict:
    build, schema, steps, mode = SCENARIOS[plan.scenario]
    if plan.scenario not in references:
        ref_dir = work / f"reference-{plan.scenario}"
        references[plan.scenario] = run_query(spark, HDFS_PROVIDER, build, schema, steps, ref_dir / "checkpoint",
                                              ref_dir / "input", mode)
    testjar.arm(root, OBJECT_STORE)
    testjar.clear_fault_log(root)
    key = os.urandom(8).hex()
    location, checkpoint = f"objtest://campaign/{key}", root / "campaign" / key
    killer = Killer(int(spark.sparkContext._jvm.ProcessHandle.current().pid()))

    def after_step(index, query):
        if plan.kind == "io":
            testjar.arm(root, {**OBJECT_STORE, "shortReads": "true"}, **IO_FAULTS)
        elif plan.kind == "diskfull":
            testjar.arm(root, {**OBJECT_STORE, "diskFull.afterBytes": 2048, "diskFull.path": "ks-"})
        else:
            killer.arm()

    def on_failure(message):
        if plan.kind == "diskfull":
            testjar.arm(root, OBJECT_STORE)  # space is back

    after_step(-1, None)
    started = time.monotonic()
    with confs(spark, {**CONFS, STATE_PREFIX + "checkpointFormatVersion": plan.format_version}):
        run = run_through_failures(spark, KS, build, schema, steps, checkpoint, work / plan.name / "input", mode,
                                   location=location, after_step=after_step, on_failure=on_failure,
                                   restart_after=2, max_failures=60)
    testjar.arm(root, OBJECT_STORE)
    verdict = judge(references[plan.scenario], run.outputs)
    faults = collections.Counter(classify(f) for f in testjar.injected_faults(root))
    if plan.kind == "kill":
        faults = collections.Counter({"write-behind apply (server killed)": killer.kills})
    return {"plan": plan, "faults": faults, "lost": verdict.lost, "duplicated": verdict.duplicated,
            "replays": verdict.replays, "failures": run.failures, "detail": verdict.detail,
            "seconds": time.monotonic() - started}


class confs:
    def __init__(self, spark, values: dict) -> None:
        self.spark, self.values = spark, values

    def __enter__(self):
        self.saved = {k: self.spark.conf.get(k, None) for k in self.values}
        for k, v in self.values.items():
            self.spark.conf.set(k, v)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            self.spark.conf.unset(k) if v is None else self.spark.conf.set(k, v)


def run_campaign(spark, plans: list[Plan], root: Path, work: Path,
                 progress: Callable[[dict], None] = lambda r: None) -> list[dict]:
    references: dict = {}
    results = []
    for plan in plans:
        result = run_plan(spark, plan, root, work, references)
        progress(result)
        results.append(result)
    return results
