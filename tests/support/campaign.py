"""The fault campaign's engine (the command and its report: benchmarks/faults.py): runs of a
deterministic query with one kind of fault re-armed after every committed step, each judged
against an uninterrupted run of Spark's HDFS-backed provider. See benchmarks/faults.py for what
each kind injects and how faults are classified by phase."""
from __future__ import annotations

import collections
import os
import subprocess
import sys
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
from .offline import kill_rescale_after, kill_rescale_driver_while_splitting, rescale_cli

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
# again; the query continues on 4 partitions. SPLITTING: its driver process alone is SIGKILLed
# while a split runs (with snapshots, in the driver's worker processes, which must die with it).
# A split by files has no merge step: the "merge:" kills never come, the CLI finishes.
SPLITTING = "while a split runs"
RESCALE_KILLS = [("offsets/", "rerun"), ("split:", "rerun"), ("merge:", "rerun"), ("offsets/", "rollback"),
                 ("split:", "rollback"), ("merge:", "rollback"), (6.0, "rerun"), (9.0, "rollback"),
                 (SPLITTING, "rerun"), (SPLITTING, "rollback")]
PLANS += [Plan(f"{s}-rescale-{i}", s, "rescale", "1", i) for s, variants in (("agg", range(10)), ("dedup", (0, 1, 2, 3, 8, 9)))
          for i in variants]
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
            "seconds": time.monotonic() - started, "rescaled": rescaled}


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
        said = ""
    elif marker == SPLITTING:
        workers = kill_rescale_driver_while_splitting(proc, checkpoint)  # AssertionError if one outlives it
        said = f"{len(workers)} worker processes of the driver died with it"
        killed = f"{marker} ({said})"
    else:
        said = kill_rescale_after(proc, marker)
    proc.wait(120)
    if proc.returncode == 0:
        killed = "never (it finished first)"
    if then == "rollback":
        try:
            keyedstate.rescale(str(checkpoint), partitions, spark=spark, rollback=True)
        except keyedstate.RescaleError as exc:
            if "no unfinished repartition" not in str(exc):
                raise
    in_driver = None  # where the splits of the last rescale ran (None: the killed CLI finished it)
    try:
        in_driver = keyedstate.rescale(str(checkpoint), partitions, spark=spark).splits_in_driver
    except keyedstate.RescaleError as exc:
        if f"already runs with {partitions} partitions" not in str(exc):
            raise
    commits = [int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    return {"batch": max(commits), "killed": killed, "then": then, "splitsInDriver": in_driver,
            "cliLog": "\n".join(line for line in said.splitlines() if "keyedstate" in line)}


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


# ---------------------------------------------------------------------------------------------
# Aimed kills: the JVM that reaches a window SIGKILLs itself there (objtest://'s action=kill)
# ---------------------------------------------------------------------------------------------

def _kill(**spec) -> dict:
    return {**spec, "action": "kill", "scope": "global"}


WINDOWS = {  # window -> the objtest:// rule that kills the JVM reaching it (the first in any JVM);
    # each rule on an operation of its own or in a slot of its own (rename#1...), so all can be armed at once
    "commit: changelog written, not published": dict(rename=_kill(regex=r"\.ks-changelog", nth=1)),
    "commit: changelog published, task not returned":
        {"rename#1": _kill(regex=r"\.ks-changelog", nth=1, at="end")},
    # a snapshot file is created under its final name (objtest:// is no local disk): killed at the
    # second file's create, one file is uploaded
    "snapshot upload: files partly uploaded": {"create#1": _kill(path="/ks-files/", nth=2)},
    "snapshot upload: files uploaded, manifest not written": dict(create=_kill(regex=r"\.ks-snapshot", nth=1)),
    "snapshot upload: manifest written": {"rename#3": _kill(regex=r"\.ks-snapshot", nth=1, at="end")},
    "cleanup: part of the deletions done": dict(delete=_kill(path="/state/", nth=2)),
}


def armed(windows) -> dict:
    """The objtest:// rules of several windows at once."""
    return {op: spec for w in windows for op, spec in WINDOWS[w].items()}


COMMIT_LOG = "driver: state committed, commits/<N> not written"


def commit_log_kill(batch: int) -> dict:
    """Kill the driver JVM as Spark creates ``commits/<batch>`` (its temp file or the file): every
    task of the batch has committed its state, the sink ran, the batch is not done for Spark."""
    return dict(create=_kill(regex=rf"/commits/\.?{batch}(\.[^/]*)?$", nth=1))


def changelog_window(version: int) -> tuple[str, dict]:
    """The first window of the commit, aimed at the changelog of ``version`` only."""
    return (f"changelog of version {version} written, not published",
            dict(rename=_kill(regex=rf"/{version}(_[^/]*)?\.ks-changelog$", nth=1)))


def kills_logged(root: Path) -> list[dict]:
    return [f for f in testjar.injected_faults(root) if f["kind"].startswith("kill:")]


def window_of(fault: dict) -> str:
    """The window a logged kill was aimed at (from its operation, point and path)."""
    path, op, at = " ".join(fault["paths"]), fault["op"], fault["kind"].split(":", 1)[1]
    if "/commits/" in path:
        return COMMIT_LOG
    if op == "delete":
        return "cleanup: part of the deletions done"
    if "/ks-files/" in path:
        return "snapshot upload: files partly uploaded"
    if ".ks-snapshot" in path:
        return ("snapshot upload: manifest written" if at == "end"
                else "snapshot upload: files uploaded, manifest not written")
    if ".ks-changelog" in path:
        return "commit: changelog published, task not returned" if at == "end" else "commit: changelog written, not published"
    return "other"


# --- the driver killed between the state commit and Spark's commit log (child drivers) --------

DRIVER_STEPS = [[(f"k{i % 4}", b * 100 + i) for i in range(12)] for b in range(8)]
FILTERS = ["v % 3 != 0", "v % 2 = 0", "v % 5 != 1", "v % 4 != 3"]  # one per attempt


@dataclass(frozen=True)
class DriverPlan:
    """A child driver run: attempt i is armed with ``kills[i]`` (a batch id: the driver is
    killed at that batch's commit log; a window name: the first JVM to reach it is killed; a
    pair (label, objtest:// rules): those rules), the
    attempt after a commit-log kill runs a changed query (``variant`` "filter": the next filter of
    FILTERS) or the killed batch's input file rewritten with other rows ("input"), or the two
    alternately ("mixed"); several windows joined by "+" are armed at once. The last
    attempt is unarmed and runs to the end."""
    name: str
    provider: str
    format_version: str
    variant: str  # filter | input | mixed
    kills: tuple = (2, 3, 4, 5, 6)
    steps: int = len(DRIVER_STEPS)


def variant_of(plan: DriverPlan, batch: int) -> str:
    """What changes after the commit-log kill at ``batch``: "mixed" alternates, filter first."""
    if plan.variant != "mixed":
        return plan.variant
    return ("filter", "input")[[k for k in plan.kills if isinstance(k, int)].index(batch) % 2]


def other_rows(batch: int) -> list[tuple[str, int]]:
    """What a source that does not replay the same rows gives for ``batch`` the second time."""
    return [(f"k{i % 3}", batch * 1000 + i * 7) for i in range(20)]


def run_driver_plan(plan: DriverPlan, root: Path, work: Path, timeout: float = 600) -> dict:
    from . import childdriver

    started = time.monotonic()
    key = os.urandom(8).hex()
    base = work / plan.name
    base.mkdir(parents=True, exist_ok=True)
    spec = {"objtest_root": str(root), "location": f"objtest://drivers/{key}",
            "checkpoint": str(root / "drivers" / key), "input_dir": str(base / "input"),
            "out": str(base / "out.jsonl"), "provider": plan.provider, "format_version": plan.format_version,
            "filter": FILTERS[0], "steps": DRIVER_STEPS[:plan.steps], "confs": {PFX + "snapshotInterval": "2"}}
    # The HDFS-backed provider overwrites a re-executed version's delta file by a rename, which an
    # object store's rename refuses (it then keeps the first attempt's file, and the state after a
    # restart is the first attempt's): its reference runs with a file system's rename.
    store = OBJECT_STORE if plan.provider == KS else {**OBJECT_STORE, "rename.existing": "overwrite"}
    testjar.clear_fault_log(root)
    failures, kills, attempts = [], collections.Counter(), 0
    for attempt in range(len(plan.kills) + 1):
        armed_with = plan.kills[attempt] if attempt < len(plan.kills) else None
        if armed_with is None:
            testjar.arm(root, store)
        elif isinstance(armed_with, int):
            testjar.arm(root, store, **commit_log_kill(armed_with))
        elif isinstance(armed_with, tuple):  # (label, objtest:// rules)
            testjar.arm(root, store, **armed_with[1])
        else:
            testjar.arm(root, store, **armed(armed_with.split("+")))
        before = len(kills_logged(root))
        rc = childdriver.finish(childdriver.launch(spec, base / "spec.json", base / "driver.log"), timeout)
        attempts += 1
        new = kills_logged(root)[before:]
        kills.update(window_of(f) for f in new)
        if armed_with is None and rc != 0:
            failures.append(f"the unarmed attempt exited {rc}; see {base / 'driver.log'}")
        elif armed_with is not None and not new:
            failures.append(f"attempt {attempt} armed with {armed_with!r} killed nothing (exit {rc})")
        if isinstance(armed_with, int) and new:  # the next attempt runs a changed query or input
            if variant_of(plan, armed_with) == "filter":
                spec["filter"] = FILTERS[(FILTERS.index(spec["filter"]) + 1) % len(FILTERS)]
            else:
                lines = "".join(f'{{"k":"{k}","v":{v}}}\n' for k, v in other_rows(armed_with))
                tmp = base / "input" / f".{armed_with:05d}.json.tmp"
                tmp.write_text(lines)
                os.replace(tmp, base / "input" / f"{armed_with:05d}.json")
    testjar.arm(root, OBJECT_STORE)
    return {"plan": plan, "kills": kills, "failures": failures, "attempts": attempts,
            "outputs": childdriver.deliveries(Path(spec["out"])), "checkpoint": Path(spec["checkpoint"]),
            "seconds": time.monotonic() - started}


def attempts_by_batch(outputs) -> tuple[dict[int, list], int]:
    """Each batch's distinct deliveries in order (a delivery equal to the batch's previous one is
    a replay of the same attempt's result) and the number of such replays."""
    by_batch: dict[int, list] = collections.defaultdict(list)
    replays = 0
    for batch, rows in outputs:
        if by_batch[batch] and by_batch[batch][-1] == rows:
            replays += 1
        else:
            by_batch[batch].append(rows)
    return by_batch, replays


def judge_attempts(reference, run) -> "Verdict":
    """A run killed and restarted with changes against the reference under the same kills and
    changes: every batch must have delivered the same rows in each attempt, in the same order
    (the re-execution's rows after the first attempt's), replays of an attempt aside."""
    from .faults import Verdict

    ref, _ = attempts_by_batch(reference)
    got, replays = attempts_by_batch(run)
    lost = duplicated = 0
    detail = []
    for batch in sorted(set(ref) | set(got)):
        r, g = ref.get(batch, []), got.get(batch, [])
        for i in range(max(len(r), len(g))):
            want = collections.Counter(map(repr, r[i] if i < len(r) else []))
            have = collections.Counter(map(repr, g[i] if i < len(g) else []))
            missing, extra = want - have, have - want
            if missing or extra or (i < len(r)) != (i < len(g)):
                detail.append(f"batch {batch} delivery {i}: missing {sorted(missing.elements())}, "
                              f"extra {sorted(extra.elements())}")
            lost += sum(missing.values()) + (1 if i >= len(g) and not want else 0)
            duplicated += sum(extra.values()) + (1 if i >= len(r) and not have else 0)
    return Verdict(lost, duplicated, replays, detail)


# --- kills aimed at the windows of the commit, the snapshot upload and cleanup (executor JVMs) -

WINDOW_STEPS = [[(f"k{(b * 5 + i) % 11}", b * 100 + i) for i in range(8)] for b in range(9)]
# A snapshot of every version and two versions retained: every step commits, uploads a snapshot
# and (once a few versions exist) has older changelogs, manifests and files to delete.
WINDOW_GROUPS = [  # what is armed at step i: WINDOW_GROUPS[i % 3] (kills that do not preclude each other)
    ["commit: changelog written, not published", "snapshot upload: files partly uploaded",
     "cleanup: part of the deletions done"],
    ["commit: changelog published, task not returned", "snapshot upload: files uploaded, manifest not written"],
    ["snapshot upload: manifest written", "cleanup: part of the deletions done"],
]
WINDOW_CONFS = {PFX + "snapshotInterval": "1", "spark.sql.streaming.minBatchesToRetain": "2"}


def run_window_kills(work: Path, windows: list[str] | None = None, formats: tuple[str, ...] = ("1", "2"),
                     steps: list | None = None, rounds: int = 2, deadline: float | None = None,
                     progress: Callable[[dict], None] = lambda r: None) -> list[dict]:
    """``rounds`` runs (checkpoint formats in turn) of the aggregation on
    ``local-cluster[2,1,1024]`` (checkpoint on objtest://) with windows of ``windows`` (default
    all of WINDOWS) armed after every committed step, a group of WINDOW_GROUPS in turn, so that
    the first executor JVM to reach each armed window SIGKILLs itself there; its tasks run again
    on another executor (or the query is restarted), the Worker relaunches the JVM. Each run is
    judged against an uninterrupted run of the HDFS-backed provider on the same cluster. No new
    round starts after ``deadline`` (time.monotonic()). Needs a process without a JVM."""
    from pyspark import cloudpickle

    from . import cluster

    windows = windows or list(WINDOWS)
    steps = steps or WINDOW_STEPS
    root = work / "objtest-windows"
    conf = cluster.keyedstate_conf(root, **{"spark.sql.shuffle.partitions": "4",
                                            "spark.sql.streaming.stateStore.maintenanceInterval": "1s"})
    results = []
    with cluster.local_cluster_session(executors=2, conf=conf) as cl:
        spark = cl.spark
        spark.sparkContext.setLogLevel("OFF")
        cloudpickle.register_pickle_by_value(sc)  # Python workers cannot import the tests' support package
        testjar.arm(root, OBJECT_STORE)
        reference = run_query(spark, HDFS_PROVIDER, sc.agg_update, sc.KV, steps, work / "windows-ref" / "checkpoint",
                              work / "windows-ref" / "input", "update")
        for index in range(rounds):
            if deadline is not None and time.monotonic() > deadline:
                break
            version = formats[index % len(formats)]
            results.append(_window_run(spark, cl, root, work, windows, version, steps, reference, index))
            progress(results[-1])
        testjar.arm(root, OBJECT_STORE)
    return results


def _window_run(spark, cl, root: Path, work: Path, windows: list[str], version: str, steps: list,
                reference, index: int = 0) -> dict:
    name = f"agg-aimed-kills-{index}-v{version}"
    key = os.urandom(8).hex()
    started = time.monotonic()
    testjar.clear_fault_log(root)

    def after_step(index, query):
        group = [w for w in WINDOW_GROUPS[(index + 1) % len(WINDOW_GROUPS)] if w in windows]
        testjar.arm(root, OBJECT_STORE, **armed(group))
        if any(w.startswith("cleanup") for w in group):
            time.sleep(2.5)  # maintenance (every second) cleans up: into the armed window

    def on_failure(message):
        cl.wait_for_executors(1)

    after_step(-1, None)
    with confs(spark, {**WINDOW_CONFS, STATE_PREFIX + "checkpointFormatVersion": version}):
        run = run_through_failures(spark, KS, sc.agg_update, sc.KV, steps, root / "windows" / key,
                                   work / name / "input", "update", location=f"objtest://windows/{key}",
                                   after_step=after_step, on_failure=on_failure, max_failures=60, timeout=600)
    testjar.arm(root, OBJECT_STORE)
    verdict = judge(reference, run.outputs)
    kills = collections.Counter(window_of(f) for f in kills_logged(root))
    return {"plan": Plan(name, "agg (local-cluster)", "aimed kill", version), "faults": kills,
            "lost": verdict.lost, "duplicated": verdict.duplicated, "replays": verdict.replays,
            "failures": run.failures, "detail": verdict.detail, "seconds": time.monotonic() - started}


# --- two applications started on one checkpoint at once (child drivers) ------------------------

def run_two_apps(root: Path, work: Path, format_version: str = "1", first_steps: int = 4,
                 timeout: float = 600) -> dict:
    """Two drivers started at once on one checkpoint, over the same first ``first_steps`` input
    files; then ``keyedstate verify`` on the checkpoint, and a third driver that runs every
    step. Its output from batch ``first_steps`` on, and every delivery of the two, must equal an
    uninterrupted run of the HDFS-backed provider."""
    from . import childdriver
    from .faults import Verdict

    started = time.monotonic()
    base = work / f"two-apps-v{format_version}"
    reference = run_driver_plan(DriverPlan(f"two-apps-reference-v{format_version}", HDFS_PROVIDER, "1", "filter",
                                           kills=()), root, work)
    testjar.arm(root, OBJECT_STORE)
    key = os.urandom(8).hex()
    inputs = base / "input"
    inputs.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for index, rows in enumerate(DRIVER_STEPS[:first_steps]):
        path = inputs / f"{index:05d}.json"
        path.write_text("".join(f'{{"k":"{k}","v":{v}}}\n' for k, v in rows))
        # One second apart: Spark's file source takes files in modification-time order, and both
        # applications must read them in the reference's order (one file per batch).
        os.utime(path, (now - first_steps + index, now - first_steps + index))
    spec = {"objtest_root": str(root), "location": f"objtest://drivers/{key}", "checkpoint": str(root / "drivers" / key),
            "input_dir": str(inputs), "provider": KS, "format_version": format_version, "filter": FILTERS[0],
            "steps": DRIVER_STEPS[:first_steps], "confs": {PFX + "snapshotInterval": "2"}, "timeout": 240}
    procs = [childdriver.launch({**spec, "out": str(base / f"out-{app}.jsonl")}, base / f"spec-{app}.json",
                                base / f"driver-{app}.log") for app in ("a", "b")]
    codes = [childdriver.finish(p, timeout) for p in procs]
    verify = subprocess.run([sys.executable, "-m", "keyedstate.cli", "verify", "--checkpoint", spec["checkpoint"]],
                            capture_output=True, text=True, timeout=600)
    (base / "verify.txt").write_text(verify.stdout + verify.stderr)
    rc = childdriver.finish(childdriver.launch({**spec, "steps": DRIVER_STEPS, "out": str(base / "out-c.jsonl")},
                                               base / "spec-c.json", base / "driver-c.log"), timeout)
    ref = dict(reference["outputs"])
    lost = duplicated = 0
    detail: list[str] = []
    deliveries = {app: childdriver.deliveries(base / f"out-{app}.jsonl") for app in "abc"}
    for app, outputs in deliveries.items():
        for batch, rows in outputs:
            want, got = collections.Counter(map(repr, ref.get(batch, []))), collections.Counter(map(repr, rows))
            if want != got:
                detail.append(f"app {app} batch {batch}: missing {sorted((want - got).elements())}, "
                              f"extra {sorted((got - want).elements())}")
            lost += sum((want - got).values())
            duplicated += sum((got - want).values())
    final = {b for b, _ in deliveries["c"]} | {b for app in "ab" for b, _ in deliveries[app]}
    missing = sorted(set(ref) - final)
    if missing:
        detail.append(f"batches never delivered: {missing}")
        lost += sum(len(ref[b]) for b in missing)
    failures = [f"app {app} exited {code}" for app, code in zip("ab", codes) if code != 0]
    if verify.returncode != 0:
        failures.append(f"keyedstate verify exited {verify.returncode}: {verify.stdout[-500:]}")
        detail.append(f"keyedstate verify failed: {verify.stdout[-500:]}")
        duplicated += 1  # a corrupt checkpoint: counted as a wrong result
    if rc != 0:
        detail.append(f"the restart exited {rc}: see {base / 'driver-c.log'}")
        lost += 1
    verdict = Verdict(lost, duplicated, 0, detail)
    return {"plan": Plan(f"two-apps-v{format_version}", "agg (two drivers, one checkpoint)", "two applications",
                         format_version),
            "faults": collections.Counter({"two applications on one checkpoint": 1}), "lost": verdict.lost,
            "duplicated": verdict.duplicated, "replays": 0, "failures": failures, "detail": verdict.detail,
            "exit_codes": codes, "verify": verify.returncode, "seconds": time.monotonic() - started}


def run_driver_kills(root: Path, work: Path, formats: tuple[str, ...] = ("1", "2"),
                     kills: tuple = (2, 3, 4, 5, 6), progress: Callable[[dict], None] = lambda r: None) -> list[dict]:
    """Driver kills between the state commit and the commit log, the query changed after each
    (filter and input alternately): keyedstate in each format against the HDFS-backed provider
    under the same kills and changes."""
    reference = run_driver_plan(DriverPlan("driver-kills-reference", HDFS_PROVIDER, "1", "mixed", kills), root, work)
    if reference["failures"] or sum(reference["kills"].values()) != len(kills):
        raise AssertionError(f"the reference run did not go as planned: {reference['failures']} {reference['kills']}")
    results = []
    for version in formats:
        run = run_driver_plan(DriverPlan(f"driver-kills-v{version}", KS, version, "mixed", kills), root, work)
        verdict = judge_attempts(reference["outputs"], run["outputs"])
        results.append({"plan": Plan(run["plan"].name, "agg, filter/input changed after each kill", "driver kill",
                                     version),
                        "faults": run["kills"], "lost": verdict.lost, "duplicated": verdict.duplicated,
                        "replays": verdict.replays, "failures": run["failures"],
                        "detail": verdict.detail + run["failures"], "seconds": run["seconds"]})
        progress(results[-1])
    return results


# --- speculation: two attempts of one state version at once (standalone cluster) --------------

SPECULATION_CONFS = {
    "spark.speculation": "true", "spark.speculation.interval": "100ms", "spark.speculation.quantile": "0.5",
    "spark.speculation.multiplier": "1.5", "spark.speculation.minTaskRuntime": "500ms",
    "spark.speculation.efficiency.enabled": "false", "spark.locality.wait": "0s"}


def _slow_first_attempts(spark, checkpoint: str, out: list, sleep_s: float):
    """Counts per key of ``rate-micro-batch`` in applyInPandasWithState, whose first attempt of
    the task holding key 0 sleeps ``sleep_s`` inside the operator (its store open for writing)
    in every batch but the first: a speculative copy runs meanwhile on the other executor."""
    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from . import cluster

    rows_per_batch = cluster.ROWS_PER_BATCH  # a value in the closure: the workers cannot import support

    def count(key, frames, state):
        import time as _time

        from pyspark import TaskContext

        n = state.get[0] if state.exists else 0
        values = []
        for frame in frames:
            n += len(frame)
            values.extend(int(v) for v in frame["v"])
        if key[0] == 0 and values and min(values) >= rows_per_batch and TaskContext.get().attemptNumber() == 0:
            _time.sleep(sleep_s)
        state.update((n,))
        yield pd.DataFrame({"k": [key[0]], "n": [n]})

    return (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", cluster.ROWS_PER_BATCH).load()
            .select((F.col("value") % cluster.KEYS).alias("k"), F.col("value").alias("v"))
            .groupBy("k").applyInPandasWithState(count, "k long, n long", "n long", "update",
                                                 GroupStateTimeout.NoTimeout)
            .writeStream.outputMode("update").foreachBatch(lambda df, _: out.extend(map(tuple, df.collect())))
            .option("checkpointLocation", checkpoint).trigger(processingTime="0 seconds").start())


def run_speculation(work: Path, batches: int = 6, restart_batches: int = 3, sleep_s: float = 8.0) -> list[dict]:
    """Speculation on a standalone cluster whose two Workers sit on distinct loopback hosts (Spark
    never runs a speculative copy on the host of a running attempt, so local-cluster, one host,
    never speculates): per checkpoint format, ``batches`` batches whose key-0 task is slow in its
    first attempt, then a restart from the checkpoint for ``restart_batches`` more. The output is
    known in closed form (cluster.closed_form); speculative attempts are counted from the event
    log (SparkListenerTaskStart / TaskEnd with "Speculative": true). Needs a process without a JVM."""
    import json
    import sys as _sys

    from pyspark import cloudpickle

    from . import cluster

    events = work / "speculation-events"
    events.mkdir(parents=True, exist_ok=True)
    conf = cluster.keyedstate_conf(work / "objtest-speculation", **SPECULATION_CONFS, **{
        "spark.eventLog.enabled": "true", "spark.eventLog.dir": events.resolve().as_uri(),
        # one plain JSON-lines file per application, which the count below reads (Spark 4's
        # default is a rolling, zstd-compressed directory)
        "spark.eventLog.rolling.enabled": "false", "spark.eventLog.compress": "false"})
    results = []
    with cluster.standalone_cluster_session(conf=conf) as cl:
        spark = cl.spark
        spark.sparkContext.setLogLevel("OFF")
        cloudpickle.register_pickle_by_value(_sys.modules[__name__])
        for version in ("1", "2"):
            started = time.monotonic()
            spark.conf.set(STATE_PREFIX + "checkpointFormatVersion", version)
            checkpoint, out = f"objtest://bucket/speculation-v{version}", []
            for until in (batches, batches + restart_batches):
                query = _slow_first_attempts(spark, checkpoint, out, sleep_s)
                deadline = time.monotonic() + 900
                try:
                    while (query.lastProgress or {}).get("batchId", -1) + 1 < until:
                        assert query.exception() is None, query.exception()
                        assert time.monotonic() < deadline, f"only {query.lastProgress} after 900 s"
                        time.sleep(0.2)
                finally:
                    query.stop()
            rows = collections.Counter(out)
            done = max(n for _, n in rows) // (cluster.ROWS_PER_BATCH // cluster.KEYS)
            expected = collections.Counter(cluster.closed_form(done))
            # A batch that reached the sink but not the commit log before a stop is delivered again.
            lost = sum((collections.Counter(set(expected)) - collections.Counter(set(rows))).values())
            extra = sum((collections.Counter(set(rows)) - collections.Counter(set(expected))).values())
            results.append({"plan": Plan(f"agg-speculation-v{version}", "applyInPandasWithState (standalone, 2 hosts)",
                                         "speculation", version),
                            "faults": collections.Counter(), "lost": lost, "duplicated": extra, "replays": 0,
                            "failures": [], "detail": [] if not (lost or extra) else [f"rows {sorted(rows)}"],
                            "seconds": time.monotonic() - started})
    started_spec = ended_ok = 0
    for log in events.iterdir():
        for line in log.read_text(errors="replace").splitlines():
            if '"Speculative":true' not in line.replace(" ", ""):
                continue
            event = json.loads(line)
            if event.get("Event") == "SparkListenerTaskStart":
                started_spec += 1
            elif event.get("Event") == "SparkListenerTaskEnd" and event.get("Task End Reason", {}).get("Reason") == "Success":
                ended_ok += 1
    for r in results:  # the event log is the application's: both formats together
        r["speculative"] = (started_spec, ended_ok)
    return results
