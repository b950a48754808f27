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
from .offline import kill_rescale_after, rescale_cli

IO_FAULTS = dict(
    create={"nth": 1, "path": ".ks-changelog"},
    rename={"nth": 2, "path": "ks-", "at": "afterCopy"},
    open={"nth": 1, "path": "ks-"},
    listStatus={"nth": 3, "path": "/state/"},
    delete={"nth": 1, "path": "/state/"},
)
OBJECT_STORE = {"dirMarkers": "true", "rename.existing": "fail"}
CONFS = {PFX + "snapshotInterval": "2", "spark.sql.streaming.minBatchesToRetain": "2"}

# Long enough for cleanup: with a snapshot every 2 versions and 2 batches retained, each
# maintenance tick after the sixth batch has older changelogs and snapshots to delete.
LONG_KV_STEPS = [[(f"k{(b * 5 + i) % 11}", b * 100 + i) for i in range(8)] for b in range(14)]

SCENARIOS = {
    "agg": (sc.agg_update, sc.KV, sc.KV_STEPS, "update"),
    "dedup": (sc.drop_duplicates, sc.IV, sc.DEDUP_STEPS, "append"),
    "agg-long": (sc.agg_update, sc.KV, LONG_KV_STEPS, "update"),
}


@dataclass(frozen=True)
class Plan:
    name: str
    scenario: str
    kind: str  # io | diskfull | kill | cleanup | rescale
    format_version: str = "1"
    variant: int = 0  # rescale: which of RESCALE_KILLS


PLANS = ([Plan(f"{s}-{k}-v{v}", s, k, v) for s in ("agg", "dedup") for k in ("io", "diskfull", "kill")
          for v in ("1", "2")]
         + [Plan(f"agg-long-cleanup-v{v}", "agg-long", "cleanup", v) for v in ("1", "2")])
# Rescale (2 -> 4 partitions, after the third step, on a local checkpoint: rescale writes
# checkpoint format 1): the CLI is SIGKILLed after a step it logs (offsets written, splits done,
# merges done) or after a delay, then the rescale is finished by a rerun or rolled back and done
# again; the query continues on 4 partitions.
RESCALE_KILLS = [("offsets/", "rerun"), ("split:", "rerun"), ("merge:", "rerun"), ("offsets/", "rollback"),
                 ("split:", "rollback"), ("merge:", "rollback"), (6.0, "rerun"), (9.0, "rollback")]
PLANS += [Plan(f"{s}-rescale-{i}", s, "rescale", "1", i) for s, n in (("agg", 8), ("dedup", 4)) for i in range(n)]
RESCALE_AFTER = 2
# Cleanup: the first two deletes of keyedstate's files after every step fail (maintenance
# retries at its next tick), and each step waits for maintenance to have run.
CLEANUP_FAULTS = dict(delete={"nth": 1, "path": "/state/"})


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
    rescaled: dict = {}
    if plan.kind == "rescale":
        location, checkpoint = None, work / plan.name / "checkpoint"

    def after_step(index, query):
        if plan.kind == "io":
            testjar.arm(root, {**OBJECT_STORE, "shortReads": "true"}, **IO_FAULTS)
        elif plan.kind == "diskfull":
            testjar.arm(root, {**OBJECT_STORE, "diskFull.afterBytes": 2048, "diskFull.path": "ks-"})
        elif plan.kind == "cleanup":
            testjar.arm(root, OBJECT_STORE, **CLEANUP_FAULTS)
            time.sleep(2.5)  # maintenance (every second) runs cleanup against the armed fault
        elif plan.kind == "kill":
            killer.arm()

    def on_failure(message):
        if plan.kind == "diskfull":
            testjar.arm(root, OBJECT_STORE)  # space is back

    after_step(-1, None)
    started = time.monotonic()
    with confs(spark, {**CONFS, STATE_PREFIX + "checkpointFormatVersion": plan.format_version}):
        run = run_through_failures(spark, KS, build, schema, steps, checkpoint, work / plan.name / "input", mode,
                                   location=location, after_step=after_step, on_failure=on_failure,
                                   restart_after=RESCALE_AFTER if plan.kind == "rescale" else 2, max_failures=60,
                                   on_restart=(lambda: rescaled.update(rescale_killed(spark, checkpoint, plan.variant)))
                                   if plan.kind == "rescale" else None)
    testjar.arm(root, OBJECT_STORE)
    outputs = run.outputs
    if plan.kind == "rescale":  # the repartition batch has no output: later batch ids are one higher
        outputs = [(b - 1 if b > rescaled["batch"] else b, rows) for b, rows in outputs]
    verdict = judge(references[plan.scenario], outputs)
    faults = collections.Counter(classify(f) for f in testjar.injected_faults(root))
    if plan.kind == "kill":
        faults = collections.Counter({"write-behind apply (server killed)": killer.kills})
    elif plan.kind == "rescale":
        faults = collections.Counter({f"rescale (CLI killed {rescaled['killed']}, then {rescaled['then']})": 1})
    return {"plan": plan, "faults": faults, "lost": verdict.lost, "duplicated": verdict.duplicated,
            "replays": verdict.replays, "failures": run.failures, "detail": verdict.detail,
            "seconds": time.monotonic() - started}


def rescale_killed(spark, checkpoint: Path, variant: int, partitions: int = 4) -> dict:
    """Start ``keyedstate rescale`` on the stopped query's checkpoint, SIGKILL it as
    RESCALE_KILLS[variant] says, then finish it (rerun) or roll it back and rescale again."""
    import keyedstate

    marker, then = RESCALE_KILLS[variant]
    proc = rescale_cli("--checkpoint", str(checkpoint), "--partitions", str(partitions))
    killed = f"{marker}s after its start" if isinstance(marker, float) else f"after '{marker}'"
    if isinstance(marker, float):
        timer = threading.Timer(marker, lambda: processes.signal_group_quietly(proc.pid, signal.SIGKILL))
        timer.start()
        proc.communicate()
        timer.cancel()
    else:
        kill_rescale_after(proc, marker)
    proc.wait(120)
    if proc.returncode == 0:
        killed = "never (it finished first)"
    if then == "rollback":
        try:
            keyedstate.rescale(str(checkpoint), partitions, spark=spark, rollback=True)
        except keyedstate.RescaleError as exc:
            if "no unfinished repartition" not in str(exc):
                raise
    try:
        keyedstate.rescale(str(checkpoint), partitions, spark=spark)
    except keyedstate.RescaleError as exc:
        if f"already runs with {partitions} partitions" not in str(exc):
            raise
    commits = [int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    return {"batch": max(commits), "killed": killed, "then": then}


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


def run_executor_kills(work: Path, kills: int = 6) -> dict:
    """SIGKILL of whole executor JVMs: an aggregation on ``local-cluster[2,1,1024]`` (checkpoint
    on objtest://), one executor killed while a batch runs, ``kills`` times (each after the
    previous one's replacement registered). Each batch of ``rate-micro-batch`` adds the same rows
    to every key, so the exact output is known in closed form (cluster.slow_counts). Needs a
    process without a JVM."""
    from . import cluster

    started = time.monotonic()
    conf = cluster.keyedstate_conf(work / "objtest-cluster", **{"spark.sql.streaming.minBatchesToRetain": "2"})
    done_kills: list[tuple[str, int]] = []
    with cluster.local_cluster_session(executors=2, conf=conf) as cl:
        spark = cl.spark
        spark.sparkContext.setLogLevel("OFF")
        query = cluster.slow_counts(spark, "objtest://bucket/campaign-executor-kills", "campaign_counts")
        tracker = spark.sparkContext.statusTracker()
        try:
            deadline = time.monotonic() + 900
            last_kill_batch = -1
            while len(done_kills) < kills or _batches_done(query) < last_kill_batch + 3:
                assert query.exception() is None, query.exception()
                assert time.monotonic() < deadline, f"{len(done_kills)} kills, {_batches_done(query)} batches"
                done = _batches_done(query)
                if len(done_kills) < kills and done > last_kill_batch + 1 and tracker.getActiveStageIds():
                    alive = cl.wait_for_executors(2, exclude={e for e, _ in done_kills})
                    victim = sorted(alive)[len(done_kills) % 2]
                    time.sleep(0.3)  # into the batch: load, apply, commit
                    if tracker.getActiveStageIds():
                        done_kills.append(cl.kill_executor(victim))
                        last_kill_batch = done
                time.sleep(0.05)
        finally:
            query.stop()
        rows = collections.Counter(map(tuple, spark.table("campaign_counts").collect()))
    batches = max(n for _, n in rows) // (cluster.ROWS_PER_BATCH // cluster.KEYS)
    expected = collections.Counter(cluster.closed_form(batches))
    lost, extra = expected - rows, rows - expected
    return {"plan": Plan("agg-executor-kills", "agg (local-cluster)", "executor kill"),
            "faults": collections.Counter({"executor JVM killed mid-batch": len(done_kills)}),
            "lost": sum(lost.values()), "duplicated": sum(extra.values()), "replays": 0, "failures": [],
            "detail": [f"missing {sorted(lost.elements())}, extra {sorted(extra.elements())}"] if lost or extra else [],
            "seconds": time.monotonic() - started}


def _batches_done(query) -> int:
    progress = query.lastProgress
    return 0 if progress is None else progress["batchId"] + 1
