"""The rescale driver: :func:`rescale`, and one invocation's four steps (plan, write the
repartition batch, run the split and merge jobs, commit), rolled back when a step fails."""
from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...formats import keygroups
from ...formats.layout import FILES_DIR
from ...shim import PROVIDER_CLASS
from ... import checkpoint as ckpt
from ...checkpoint import Checkpoint
from ...checkpoint.storage import LocalStorage
from .. import checkpoint_format
from ..progress import tracked
from .commit import mark_retired, publish, set_metadata_partitions
from .errors import RescaleError
from . import local_workers
from .merge import MergeTask, merge
from .plan import hash_spec, json_or_none, key_group_count, list_stores, store_key_layout
from .rollback import await_idle_executors, roll_back
from .sparklogs import FORMAT_KEY, LOGGER, PARTITIONS_KEY, PROVIDER_KEY, SparkLogs
from .staging import JOURNAL, OUTBOX, STAGING, read_journal, skipped_batches, work_dir
from .tasks import SPLIT_IMPORTS, SplitTask, base_dir_name, split

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(LOGGER)


@dataclass(frozen=True)
class RescaleResult:
    checkpoint: str
    batch: int  # the repartition batch written (offsets/B, commits/B); state version B + 1
    from_partitions: int
    to_partitions: int
    stores: int  # operator stores rescaled
    keys: int
    whole_key_groups: bool  # routed by key group (N divides the key-group count)
    resumed: bool
    seconds: float
    task_seconds: dict[str, float] | None = None  # summed over the tasks, by phase (direct splits)
    counted_by_keys: int = 0  # split-by-files parents whose snapshot carried no key-group counts
    splits_in_driver: bool = False  # the splits ran in the driver's worker processes, not as Spark tasks

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rescale(checkpoint: str | os.PathLike, partitions: int, *, spark: "SparkSession | None" = None,
            skip_failed_batch: bool = False, rollback: bool = False,
            idle_seconds: float = 30.0) -> RescaleResult | None:
    """Redistribute the state of the stopped query at ``checkpoint`` over ``partitions``
    partitions; restart the unchanged query afterwards and it runs with that many.

    ``skip_failed_batch``: if the last batch started but never committed (it failed), mark it
    done, like Spark's ``enforceExactlyOnceSink=False``: its input is dropped from the state
    (and whatever it wrote to the sink stays). Without it such a checkpoint is refused: restart
    the query once to complete the batch, stop it, then rescale -- the lossless way. Also
    refused if that batch started less than ``idle_seconds`` ago (the query may be running). ``rollback``: undo an unfinished repartition batch -- one
    this function was interrupted in, or the orphan that Spark's own repartition leaves on a
    keyedstate checkpoint -- and return ``None``. Uses ``spark`` (or the active session, or a
    local one it starts and stops) to run the work as Spark tasks.
    """
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise RescaleError(f"partitions must be an integer >= 1, got {partitions!r}")
    root = ckpt.local_path(checkpoint)
    for sub in ("offsets", "commits", "state"):
        if not (root / sub).is_dir():
            raise RescaleError(f"{root} has no {sub}/ directory: not the checkpoint of a stateful streaming query")
    ckpt.refuse_links(root, "offsets", "commits", "state", STAGING)
    if foreign := Checkpoint(LocalStorage(root)).not_keyedstate("rescale"):  # before starting Spark
        raise RescaleError(foreign)
    owned = spark is None
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        owned = spark is None
        if spark is None:
            spark = (SparkSession.builder.master("local[*]").appName("keyedstate rescale")
                     .config("spark.ui.enabled", "false")
                     .config("spark.ui.showConsoleProgress", "false")  # progress is logged per step
                     .config("spark.pyspark.python", sys.executable)
                     .getOrCreate())
    try:
        return Rescale(spark, root, partitions).run(skip_failed_batch, rollback, idle_seconds)
    finally:
        if owned:
            spark.stop()



refuse_checkpoint_format_2 = functools.partial(
    checkpoint_format.refuse_checkpoint_format_2, error=RescaleError,
    reason=f"the query runs with {FORMAT_KEY}=2 (the commit log pins each state file by its unique id); "
           "keyedstate rescale handles checkpoint format 1 only")
"""Under format 2 the commit log pins each state file by its unique id: a rescale cannot
finish a batch there (a rollback of an orphan repartition batch still can)."""


@dataclass(frozen=True)
class _Plan:
    """What one invocation does: write (or resume) repartition batch ``batch``, reading the
    state of ``read_batch`` (version ``read_batch + 1``) from ``old_n`` partitions."""
    batch: int
    read_batch: int
    old_n: int
    skipped: list[int]
    resumed: bool
    seq: Any  # the offset log entry the new batch copies (py4j)
    meta: Any


@dataclass(frozen=True)
class _Route:
    """How keys reach the new partitions: by key group (``whole``), each old partition staging
    its heirs itself (``direct``), from its snapshot's files (``by_files``); ``splits`` tasks."""
    key_groups: int
    whole: bool
    direct: bool
    by_files: bool
    splits: int
    merge_by_files: bool = False  # other whole counts: each heir built on one parent's files (a merge)


class Rescale:
    """One invocation: Spark's logs through the JVM, the state through Spark tasks (a split by
    files: through worker processes of the driver)."""

    def __init__(self, spark: "SparkSession", root: Path, partitions: int) -> None:
        self.spark = spark
        self.root = root
        self.n = partitions
        self.logs = SparkLogs(spark, root)

    def run(self, skip_failed_batch: bool, rollback: bool, idle_seconds: float) -> RescaleResult | None:
        started = time.monotonic()
        plan = self._plan(skip_failed_batch, rollback, idle_seconds)
        if plan is None:
            return None  # rolled back
        stores = list_stores(self.root, plan.old_n)
        route = self._route(plan, stores)
        # The workers of a split by files start now: they import keyedstate while the driver
        # writes the repartition batch.
        workers = (local_workers.Workers(local_workers.worker_count(route.splits), preload=SPLIT_IMPORTS)
                   if route.by_files else None)
        try:
            work = self._write_repartition_batch(plan)
            try:
                keys, task_seconds, counted_by_keys = self._run_jobs(plan, stores, route, work, workers)
                self._commit(plan, stores)
            except BaseException:
                if workers is not None:
                    workers.close(kill=True)  # nothing of this run writes during the rollback
                if (not plan.resumed and self.logs.latest(self.logs.commits) != plan.batch
                        and self.logs.latest(self.logs.offsets) == plan.batch):
                    # Undo what this call started, so that the query can restart as it was;
                    # a kill leaves it to a rerun or to rollback=True instead.
                    log.error("rescale failed; rolling back the repartition batch %d", plan.batch)
                    await_idle_executors(self.spark)
                    roll_back(self.logs, plan.batch)
                raise
        finally:
            if workers is not None:
                workers.close()
        shutil.rmtree(work, ignore_errors=True)
        staging = self.root / STAGING
        if staging.is_dir() and not any(staging.iterdir()):
            staging.rmdir()
        result = RescaleResult(str(self.root), plan.batch, plan.old_n, self.n, len(stores), keys,
                               route.whole, plan.resumed, round(time.monotonic() - started, 3), task_seconds,
                               counted_by_keys, route.by_files)
        log.info("commits/%d written: %s rescaled from %d to %d partitions", plan.batch, self.root, plan.old_n, self.n)
        return result

    # -- step 1: plan --------------------------------------------------------------------------
    def _plan(self, skip_failed_batch: bool, rollback: bool, idle_seconds: float) -> _Plan | None:
        """Which batch to write or resume and which one it reads; with ``rollback``, undo the
        unfinished repartition batch instead and return None."""
        logs = self.logs
        committed = logs.latest(logs.commits)
        latest = logs.latest(logs.offsets)
        if committed is None or latest is None:
            raise RescaleError(f"{self.root} has no committed batch yet: nothing to rescale")
        seq, meta = logs.offset_entry(committed)
        provider = logs.conf(meta, PROVIDER_KEY)
        if provider != PROVIDER_CLASS:
            raise RescaleError(
                f"{self.root} was written by state store provider {provider or 'HDFSBackedStateStoreProvider (default)'}, "
                f"not keyedstate ({PROVIDER_CLASS}); use Spark's own repartition for it")
        if not rollback:
            refuse_checkpoint_format_2(Checkpoint(LocalStorage(self.root)), committed)
        old_n = logs.partitions_of(committed)
        if latest > committed and logs.utils.isRepartitionBatch(latest, logs.offsets):
            pending_n = logs.partitions_of(latest)
            ours = (work_dir(self.root, latest) / JOURNAL).is_file()
            who = ("an interrupted keyedstate rescale" if ours else
                   "Spark's own repartition, which does not support keyedstate and stopped after writing it")
            if rollback:
                roll_back(logs, latest)
                log.warning("rolled back the unfinished repartition batch %d (left by %s); the checkpoint "
                            "is back at batch %d with %d partitions", latest, who, committed, old_n)
                return None
            if pending_n != self.n:
                raise RescaleError(
                    f"the latest batch {latest} of {self.root} is an unfinished repartition to {pending_n} "
                    f"partitions, left by {who}; the query cannot restart until it is finished or removed: "
                    f"rerun with --partitions {pending_n} to finish it, or with --rollback to remove it")
            if not ours:
                log.warning("finishing the repartition batch %d that Spark's own repartition left unfinished", latest)
            # The journal knows which version the batch reads: after --skip-failed-batch the
            # commits before it include skipped batches, whose state versions are not committed.
            journal = read_journal(work_dir(self.root, latest) / JOURNAL) if ours else {}
            if ours and not isinstance(journal.get("readBatch"), int):
                raise RescaleError(f"{work_dir(self.root, latest) / JOURNAL} is unreadable: cannot tell which "
                                   "batch the unfinished rescale reads; rerun with --rollback to remove it")
            return _Plan(latest, journal.get("readBatch", committed), old_n, skipped_batches(journal, latest),
                         True, seq, meta)
        if rollback:
            raise RescaleError(f"{self.root} has no unfinished repartition to roll back "
                               f"(latest batch {latest}, last committed {committed})")
        skipped = []
        if latest > committed:
            skipped = self._skippable(latest, committed, skip_failed_batch, idle_seconds)
            # The new batch continues from the skipped batch's end offsets: a file source
            # cannot step back to the last committed offsets (Spark asserts on restart).
            seq, meta = logs.offset_entry(latest)
        if old_n == self.n:
            raise RescaleError(f"{self.root} already runs with {self.n} partitions")
        stale = work_dir(self.root, latest + 1)
        if stale.exists():  # a journal without its offsets entry: killed before writing it
            shutil.rmtree(stale)
        return _Plan(latest + 1, committed, old_n, skipped, False, seq, meta)

    def _skippable(self, latest: int, committed: int, skip: bool, idle_seconds: float) -> list[int]:
        """The uncommitted batches after ``committed`` that ``--skip-failed-batch`` drops; they
        are committed (like Spark's enforceExactlyOnceSink=false, with the watermark of the last
        commit) together with the repartition batch, so a failed rescale leaves them as they were."""
        offsets_file = self.root / "offsets" / str(latest)
        age = time.time() - offsets_file.stat().st_mtime
        if age < idle_seconds:
            raise RescaleError(
                f"batch {latest} of {self.root} started {age:.0f} s ago and has not committed: the query "
                "looks running; stop it first (or wait, if it failed)")
        if not skip:
            raise RescaleError(
                f"the last batch {latest} of {self.root} did not commit (the query failed or was killed "
                f"during it; last committed batch {committed}): restart the query once so that it "
                "completes the batch, then stop it and rescale; or pass --skip-failed-batch to drop "
                "the batch: its input does not reach the state, what it wrote to the sink stays")
        return list(range(committed + 1, latest + 1))


    # -- step 2: write the repartition batch ---------------------------------------------------
    def _write_repartition_batch(self, plan: _Plan) -> Path:
        """Journal the plan and write ``offsets/B`` (unless resumed); returns the batch's staging."""
        work = work_dir(self.root, plan.batch)
        work.mkdir(parents=True, exist_ok=True)
        if plan.resumed:
            return work
        ckpt.write_atomically(work / JOURNAL, json.dumps({
            "batch": plan.batch, "readBatch": plan.read_batch, "fromPartitions": plan.old_n, "toPartitions": self.n,
            "skipped": plan.skipped, "startedAt": time.time()}).encode())
        meta, seq = plan.meta, plan.seq
        new_meta = meta.copy(meta.batchWatermarkMs(), meta.batchTimestampMs(),
                             meta.conf().updated(PARTITIONS_KEY, str(self.n)))
        new_seq = seq.copy(seq.offsets(), self.spark._jvm.scala.Some(new_meta))
        if not self.logs.offsets.add(plan.batch, new_seq):
            raise RescaleError(f"{self.root / 'offsets' / str(plan.batch)} appeared while rescaling: "
                               "the query is running; stop it first")
        log.info("offsets/%d written: batch %d runs with %d partitions (was %d)", plan.batch, plan.batch, self.n,
                 plan.old_n)
        return work

    # -- step 3: run the split and merge jobs --------------------------------------------------
    def _route(self, plan: _Plan, stores) -> _Route:
        key_groups = key_group_count(self.root, stores, plan.read_batch + 1)
        whole = keygroups.divides(self.n, key_groups)
        # Scale-up by a multiple from a key-group-aligned layout: new partition q's keys all
        # sit in old partition q mod old_n: the split task that scans that partition stages
        # all its heirs from its SST files itself, so there is no merge job.
        direct = whole and keygroups.divides(plan.old_n, key_groups) and self.n % plan.old_n == 0
        # A direct split of partitions that all have a snapshot is a split by files: a few
        # files per heir, run in the driver's own worker processes (:mod:`.local_workers`).
        with_snapshots = all(any(v <= plan.read_batch + 1 for v in s.snapshots) for _, _, parts in stores for s in parts)
        by_files = direct and with_snapshots
        # Any other count that divides the key groups, from partitions that all have a snapshot:
        # new partition q is built on old partition q mod old_n's files (shared, clipped unless
        # it owns all their key groups) with its keys of the other old partitions ingested.
        merge_by_files = whole and not direct and keygroups.divides(plan.old_n, key_groups) and with_snapshots
        return _Route(key_groups, whole, direct, by_files, sum(len(parts) for _, _, parts in stores), merge_by_files)

    def _run_jobs(self, plan: _Plan, stores, route: _Route, work: Path,
                  workers: local_workers.Workers | None) -> tuple[int, dict[str, float], int]:
        """Split every old store partition (in ``workers`` if given, else as a Spark job),
        merge the new partitions no split staged, and publish them all; returns the keys moved,
        the task seconds by phase, and the parents split by files whose keys were read to count them."""
        old_n, batch = plan.old_n, plan.batch
        task_seconds: dict[str, float] = {}
        key_groups, whole, direct = route.key_groups, route.whole, route.direct
        read_version, write_version = plan.read_batch + 1, batch + 1
        origin = {"batch": batch, "fromPartitions": old_n, "toPartitions": self.n}
        layouts = {(op, name): store_key_layout(parts) for op, name, parts in stores}
        # Tasks write only below ``work``, into directories made here (never their parents):
        # a task still running after a rollback moved ``work`` away fails instead of
        # writing. New partitions are staged in ``outbox`` and published by this driver
        # once their job has succeeded (commit.publish).
        outbox = work / OUTBOX
        for op, name, _ in stores:
            (work / str(op) / name).mkdir(parents=True, exist_ok=True)
            for q in range(self.n):
                (ckpt.store_dir(outbox / str(op), q, name) / FILES_DIR).mkdir(parents=True, exist_ok=True)
        splits = [SplitTask(op, name, str(s.path), s.partition, read_version,
                            str(work / str(op) / name / f"from-{s.partition}"), self.n, key_groups,
                            None if whole else hash_spec(op, name, s.path, layouts[(op, name)]), direct, old_n,
                            write_version, str(outbox / str(op)), origin,
                            json_or_none(layouts[(op, name)]), route.merge_by_files)
                  for op, name, parts in stores for s in parts]
        split_results = self._run_tasks(split, splits, "split", workers=workers)
        bases = {(task.operator, task.store, int(q)): {"dir": str(Path(task.staging) / base_dir_name(int(q))),
                                                        "shared": shared}
                 for task, result in zip(splits, split_results) for q, shared in result.get("bases", {}).items()}
        counts: dict[tuple[int, str, int], int] = {}
        ttl: dict[tuple[int, str], dict | None] = {}
        published = {(task.operator, task.store, q) for task, result in zip(splits, split_results)
                     for q in result.get("published", [])}
        for task, result in zip(splits, split_results):
            for q, c in result["keys"].items():
                counts[(task.operator, task.store, int(q))] = counts.get((task.operator, task.store, int(q)), 0) + c
            if ttl.get((task.operator, task.store)) is None:
                ttl[(task.operator, task.store)] = result["ttl"]
        merges = [MergeTask(str(work / str(op) / name), q, str(ckpt.store_dir(outbox / str(op), q, name)),
                            write_version, key_groups, counts.get((op, name, q), 0), ttl.get((op, name)),
                            origin, self.n, json_or_none(layouts[(op, name)]), bases.get((op, name, q)))
                  for op, name, _ in stores for q in range(self.n) if (op, name, q) not in published]
        if direct and merges:  # a direct split publishes each of its heirs itself
            raise RescaleError(f"internal: the split left new partitions {[t.partition for t in merges][:5]} unpublished")
        keys = sum(counts[p] for p in published) + sum(r["keys"] for r in self._run_tasks(merge, merges, "merge"))
        for result in split_results:
            for phase, seconds in result.get("seconds", {}).items():
                task_seconds[phase] = round(task_seconds.get(phase, 0.0) + seconds, 3)
        for op, name, _ in stores:
            for q in range(self.n):
                publish(ckpt.store_dir(outbox / str(op), q, name),
                        ckpt.store_dir(self.root / "state" / str(op), q, name), write_version, self.root, q, name)
            mark_retired(self.root / "state" / str(op), name, self.n, old_n, write_version)
        return keys, task_seconds, sum(bool(r.get("countedByKeys")) for r in split_results)

    def _run_tasks(self, fn, tasks: list, phase: str, workers: local_workers.Workers | None = None) -> list[dict]:
        """``fn`` over ``tasks`` as a Spark job, or in ``workers``, processes of the driver."""
        if not tasks:
            return []
        started = time.monotonic()
        if workers is not None:
            results = workers.run(fn, tasks, phase, log, "store partitions", _describe)
        else:
            sc = self.spark.sparkContext
            with tracked(sc, "rescale", phase, len(tasks), log, "store partitions"):
                results = sc.parallelize(tasks, len(tasks)).map(fn).collect()
        log.info("%s: %d tasks in %.1f s", phase, len(tasks), time.monotonic() - started)
        return results


    # -- step 4: commit ------------------------------------------------------------------------
    def _commit(self, plan: _Plan, stores) -> None:
        """The operators' metadata, the skipped batches' commits, then ``commits/B``."""
        batch, logs = plan.batch, self.logs
        if logs.latest(logs.offsets) != batch:
            raise RescaleError(f"{self.root / 'offsets'} moved past batch {batch} while rescaling: the query is running")
        for op in sorted({op for op, _, _ in stores}):
            set_metadata_partitions(self.root / "state" / str(op), self.n)
        # The skip is committed with the batch, not before it: a failure or a rollback up to
        # here leaves the skipped batches uncommitted, so a restart reruns them as they were.
        for b in plan.skipped:
            if not logs.commits.get(b).isDefined() and not logs.commits.add(b, logs.commits.get(plan.read_batch).get()):
                raise RescaleError(f"{self.root / 'commits' / str(b)} appeared while rescaling: the query is running")
        if plan.skipped:
            log.warning("skipped the uncommitted batches %d..%d: their input does not reach the state",
                        plan.skipped[0], plan.skipped[-1])
        if not logs.commits.add(batch, logs.commits.get(plan.read_batch).get()):
            raise RescaleError(f"{self.root / 'commits' / str(batch)} appeared while rescaling: the query is running")


def _describe(task: SplitTask | MergeTask) -> str:
    if isinstance(task, SplitTask):
        return f"the split of partition {task.partition} of {task.store_path}"
    return f"the merge of new partition {task.partition} into {task.target}"
