"""Rescale a stopped query's keyedstate checkpoint to a new partition count, Flink-style.

Spark freezes a stateful query at the partition count of its first batch (the offset log
records ``spark.sql.shuffle.partitions``). Spark 4.2's offline repartition rereads all state
through the state data source, shuffles it and rewrites it, and only for its own RocksDB
provider. keyedstate moves key groups instead: every stored key starts with its key group, so a
new partition's state is the key groups it owns, cut out of the old partitions' RocksDB
snapshots in key order and ingested as SST files, with no shuffle and no decoding of rows.

What is written follows Spark's own repartition, so that Spark treats the result (and any
interrupted attempt) exactly as it treats its own:

1. ``offsets/B`` (B = last committed batch + 1): a copy of the last committed entry with only
   ``spark.sql.shuffle.partitions`` changed -- a "repartition batch". Until step 4, a restart is
   refused by Spark with STREAMING_UNFINISHED_REPARTITION_DETECTED, so nothing half-done runs.
2. *split* (a Spark job, one task per old store partition): rebuild the committed version, scan
   it once, write each key to an SST file for the new partition that owns it (its key group
   mod N when N divides the key-group count, else Spark's Murmur3 partition hash of the key).
3. *merge* (one task per new store partition): ingest its SST files into an empty RocksDB and
   stage it as snapshot version B + 1 of that partition; once every task has succeeded, the
   driver moves the staged snapshots into the partitions (files, then the manifest). Tasks
   write only into this run's staging directory, which a rollback moves away first: a task of
   a failed job that is still running (an executor that never got the kill) cannot publish.
4. ``commits/B``: a copy of the last commit; from now on the query runs with N partitions.
   Just before it, each operator's metadata (``state/<op>/_metadata/metadata``, v1) is given
   the count N, as a query started with N writes it: Spark's state-metadata source reads it
   there (Spark's own writer never replaces the file, nor does its repartition for v1).

A scale-up by a multiple (N = k x the old count, both dividing the key-group count) needs no
merge: new partition q's keys all sit in old partition q mod the old count, so each split task
stages its k heirs itself, from the SST files of its one scan (:func:`_write_by_key_group`).

Everything before the commit only adds files, so an interrupted rescale can be rerun (finished
splits are reused) or rolled back (:func:`rescale` with ``rollback=True``); the old state is
never modified. Old partitions beyond N are left on disk, as Spark's repartition leaves them.
Spark's logs are read and written through Spark's own ``OffsetSeqLog``/``CommitLog`` classes.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..formats import changelog, keygroups, rocksdb
from .progress import tracked
from ..formats import layout
from ..formats.layout import CHANGELOG_SUFFIX, DEFAULT_STORE, FILES_DIR, MANIFEST_SUFFIX
from ..formats.stored import KeyLayout
from ..shim import PROVIDER_CLASS
from .. import checkpoint as ckpt
from ..checkpoint import Checkpoint
from ..checkpoint.keylayout import legacy_key_layout as _legacy_key_layout
from ..checkpoint.storage import LocalStorage
from .routing import route_by_key_group

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
_PARTITIONS_KEY = "spark.sql.shuffle.partitions"
_FORMAT_KEY = "spark.sql.streaming.stateStore.checkpointFormatVersion"
_STAGING = "_keyedstate_rescale"
_JOURNAL = "journal.json"
_OUTBOX = "publish"  # inside a batch's staging: the new partitions' snapshots before _publish


class RescaleError(RuntimeError):
    """The checkpoint cannot be rescaled as asked; the message says why and what to do."""


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
    ckpt.refuse_links(root, "offsets", "commits", "state", _STAGING)
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
        return _Rescale(spark, root, partitions).run(skip_failed_batch, rollback, idle_seconds)
    finally:
        if owned:
            spark.stop()


def refuse_checkpoint_format_2(ck: Checkpoint, committed: int) -> None:
    """Under format 2 the commit log pins each state file by its unique id: a rescale cannot
    finish a batch there (a rollback of an orphan repartition batch still can)."""
    if ck.checkpoint_format(committed) == 2:
        raise RescaleError(f"{ck.path('commits', str(committed))}: the query runs with {_FORMAT_KEY}=2 "
                           "(the commit log pins each state file by its unique id); keyedstate rescale "
                           "handles checkpoint format 1 only")


class _Rescale:
    """One invocation: Spark's logs through the JVM, the state through Spark tasks."""

    def __init__(self, spark: "SparkSession", root: Path, partitions: int) -> None:
        self.spark = spark
        self.root = root
        self.n = partitions
        jvm = spark._jvm
        js = spark._jsparkSession
        logs = jvm.org.apache.spark.sql.execution.streaming.checkpointing
        self.offsets = logs.OffsetSeqLog(js, str(root / "offsets"), False)
        self.commits = logs.CommitLog(js, str(root / "commits"), False)
        self.utils = jvm.org.apache.spark.sql.execution.streaming.state.OfflineStateRepartitionUtils

    # -- Spark's logs ----------------------------------------------------------------------------
    def _latest(self, log_) -> int | None:
        latest = log_.getLatestBatchId()
        return int(latest.get()) if latest.isDefined() else None

    def _offset_entry(self, batch: int):
        entry = self.offsets.get(batch)
        if not entry.isDefined():
            raise RescaleError(f"{self.root / 'offsets' / str(batch)} is missing")
        seq = entry.get()
        if seq.getClass().getSimpleName() != "OffsetSeq":
            raise RescaleError(f"{self.root / 'offsets' / str(batch)} uses offset log format "
                               f"{seq.getClass().getSimpleName()}; keyedstate rescale supports Spark's default (v1)")
        meta = seq.metadataOpt()
        if not meta.isDefined():
            raise RescaleError(f"{self.root / 'offsets' / str(batch)} has no metadata (written by a Spark before 2.1?)")
        return seq, meta.get()

    def _conf(self, meta, key: str) -> str | None:
        value = meta.conf().get(key)
        return str(value.get()) if value.isDefined() else None

    def _partitions_of(self, batch: int) -> int:
        _, meta = self._offset_entry(batch)
        value = self._conf(meta, _PARTITIONS_KEY)
        if value is None:
            raise RescaleError(f"{self.root / 'offsets' / str(batch)} does not record {_PARTITIONS_KEY}")
        return int(value)

    # -- the procedure ---------------------------------------------------------------------------
    def run(self, skip_failed_batch: bool, rollback: bool, idle_seconds: float) -> RescaleResult | None:
        started = time.monotonic()
        committed = self._latest(self.commits)
        latest = self._latest(self.offsets)
        if committed is None or latest is None:
            raise RescaleError(f"{self.root} has no committed batch yet: nothing to rescale")
        seq, meta = self._offset_entry(committed)
        provider = self._conf(meta, _PROVIDER_KEY)
        if provider != PROVIDER_CLASS:
            raise RescaleError(
                f"{self.root} was written by state store provider {provider or 'HDFSBackedStateStoreProvider (default)'}, "
                f"not keyedstate ({PROVIDER_CLASS}); use Spark's own repartition for it")
        if not rollback:
            refuse_checkpoint_format_2(Checkpoint(LocalStorage(self.root)), committed)
        old_n = self._partitions_of(committed)
        staging = self.root / _STAGING

        resumed = False
        if latest > committed and self.utils.isRepartitionBatch(latest, self.offsets):
            pending_n = self._partitions_of(latest)
            ours = (staging / f"batch-{latest}" / _JOURNAL).is_file()
            who = ("an interrupted keyedstate rescale" if ours else
                   "Spark's own repartition, which does not support keyedstate and stopped after writing it")
            if rollback:
                self._rollback(latest)
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
            journal = _read_journal(staging / f"batch-{latest}" / _JOURNAL) if ours else {}
            if ours and not isinstance(journal.get("readBatch"), int):
                raise RescaleError(f"{staging / f'batch-{latest}' / _JOURNAL} is unreadable: cannot tell which "
                                   "batch the unfinished rescale reads; rerun with --rollback to remove it")
            read_batch = journal.get("readBatch", committed)
            skipped = _skipped_batches(journal, latest)
            batch, resumed = latest, True
        else:
            if rollback:
                raise RescaleError(f"{self.root} has no unfinished repartition to roll back "
                                   f"(latest batch {latest}, last committed {committed})")
            skipped = []
            if latest > committed:
                skipped = self._skippable(latest, committed, skip_failed_batch, idle_seconds)
                # The new batch continues from the skipped batch's end offsets: a file source
                # cannot step back to the last committed offsets (Spark asserts on restart).
                seq, meta = self._offset_entry(latest)
            if old_n == self.n:
                raise RescaleError(f"{self.root} already runs with {self.n} partitions")
            batch, read_batch = latest + 1, committed
            stale = staging / f"batch-{batch}"
            if stale.exists():  # a journal without its offsets entry: killed before step 1
                shutil.rmtree(stale)

        work = staging / f"batch-{batch}"
        work.mkdir(parents=True, exist_ok=True)
        if not resumed:
            ckpt.write_atomically(work / _JOURNAL, json.dumps({
                "batch": batch, "readBatch": read_batch, "fromPartitions": old_n, "toPartitions": self.n,
                "skipped": skipped, "startedAt": time.time()}).encode())
            new_meta = meta.copy(meta.batchWatermarkMs(), meta.batchTimestampMs(),
                                 meta.conf().updated(_PARTITIONS_KEY, str(self.n)))
            new_seq = seq.copy(seq.offsets(), self.spark._jvm.scala.Some(new_meta))
            if not self.offsets.add(batch, new_seq):
                raise RescaleError(f"{self.root / 'offsets' / str(batch)} appeared while rescaling: "
                                   "the query is running; stop it first")
            log.info("offsets/%d written: batch %d runs with %d partitions (was %d)", batch, batch, self.n, old_n)

        try:
            stores = self._stores(old_n)
            task_seconds: dict[str, float] = {}
            key_groups = self._key_groups(stores, read_batch + 1)
            whole = keygroups.divides(self.n, key_groups)
            # Scale-up by a multiple from a key-group-aligned layout: new partition q's keys all
            # sit in old partition q mod old_n: the split task that scans that partition stages
            # all its heirs from its SST files itself, so there is no merge job.
            direct = whole and keygroups.divides(old_n, key_groups) and self.n % old_n == 0
            read_version, write_version = read_batch + 1, batch + 1
            origin = {"batch": batch, "fromPartitions": old_n, "toPartitions": self.n}
            layouts = {(op, name): _key_layout(parts) for op, name, parts in stores}
            # Tasks write only below ``work``, into directories made here (never their parents):
            # a task still running after a rollback moved ``work`` away fails instead of
            # writing. New partitions are staged in ``outbox`` and published by this driver
            # once their job has succeeded (_publish).
            outbox = work / _OUTBOX
            for op, name, _ in stores:
                (work / str(op) / name).mkdir(parents=True, exist_ok=True)
                for q in range(self.n):
                    (ckpt.store_dir(outbox / str(op), q, name) / FILES_DIR).mkdir(parents=True, exist_ok=True)
            splits = [_SplitTask(op, name, str(s.path), s.partition, read_version,
                                 str(work / str(op) / name / f"from-{s.partition}"), self.n, key_groups,
                                 None if whole else _hash_spec(op, name, s.path, layouts[(op, name)]), direct, old_n,
                                 write_version, str(outbox / str(op)), origin,
                                 _json_or_none(layouts[(op, name)]))
                      for op, name, parts in stores for s in parts]
            split_results = self._run_tasks(_split, splits, "split")
            counts: dict[tuple[int, str, int], int] = {}
            ttl: dict[tuple[int, str], dict | None] = {}
            published = {(task.operator, task.store, q) for task, result in zip(splits, split_results)
                         for q in result.get("published", [])}
            for task, result in zip(splits, split_results):
                for q, c in result["keys"].items():
                    counts[(task.operator, task.store, int(q))] = counts.get((task.operator, task.store, int(q)), 0) + c
                if ttl.get((task.operator, task.store)) is None:
                    ttl[(task.operator, task.store)] = result["ttl"]
            merges = [_MergeTask(str(work / str(op) / name), q, str(ckpt.store_dir(outbox / str(op), q, name)),
                                 write_version, key_groups, counts.get((op, name, q), 0), ttl.get((op, name)),
                                 origin, self.n, _json_or_none(layouts[(op, name)]))
                      for op, name, _ in stores for q in range(self.n) if (op, name, q) not in published]
            if direct and merges:  # a direct split publishes each of its heirs itself
                raise RescaleError(f"internal: the split left new partitions {[t.partition for t in merges][:5]} unpublished")
            keys = sum(counts[p] for p in published) + sum(r["keys"] for r in self._run_tasks(_merge, merges, "merge"))
            for result in split_results:
                for phase, seconds in result.get("seconds", {}).items():
                    task_seconds[phase] = round(task_seconds.get(phase, 0.0) + seconds, 3)
            for op, name, _ in stores:
                for q in range(self.n):
                    _publish(ckpt.store_dir(outbox / str(op), q, name),
                             ckpt.store_dir(self.root / "state" / str(op), q, name), write_version, self.root)

            if self._latest(self.offsets) != batch:
                raise RescaleError(f"{self.root / 'offsets'} moved past batch {batch} while rescaling: the query is running")
            for op in sorted({op for op, _, _ in stores}):
                _set_metadata_partitions(self.root / "state" / str(op), self.n)
            # The skip is committed with the batch, not before it: a failure or a rollback up to
            # here leaves the skipped batches uncommitted, so a restart reruns them as they were.
            for b in skipped:
                if not self.commits.get(b).isDefined() and not self.commits.add(b, self.commits.get(read_batch).get()):
                    raise RescaleError(f"{self.root / 'commits' / str(b)} appeared while rescaling: the query is running")
            if skipped:
                log.warning("skipped the uncommitted batches %d..%d: their input does not reach the state",
                            skipped[0], skipped[-1])
            if not self.commits.add(batch, self.commits.get(read_batch).get()):
                raise RescaleError(f"{self.root / 'commits' / str(batch)} appeared while rescaling: the query is running")
        except BaseException:
            if not resumed and self._latest(self.commits) != batch and self._latest(self.offsets) == batch:
                # Undo what this call started, so that the query can restart as it was;
                # a kill leaves it to a rerun or to rollback=True instead.
                log.error("rescale failed; rolling back the repartition batch %d", batch)
                self._await_idle_executors()
                self._rollback(batch)
            raise
        shutil.rmtree(work, ignore_errors=True)
        if staging.is_dir() and not any(staging.iterdir()):
            staging.rmdir()
        result = RescaleResult(str(self.root), batch, old_n, self.n, len(stores), keys,
                               whole, resumed, round(time.monotonic() - started, 3), task_seconds)
        log.info("commits/%d written: %s rescaled from %d to %d partitions", batch, self.root, old_n, self.n)
        return result

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

    def _rollback(self, latest: int) -> None:
        """Remove the uncommitted repartition batch ``latest``: the snapshots it published and
        their files (in old and new partitions), files it wrote without a manifest yet, new
        partition directories left empty, its offsets entry and its staging."""
        staging = self.root / _STAGING
        work = staging / f"batch-{latest}"
        version = latest + 1
        journal = _read_journal(work / _JOURNAL)
        started = journal.get("startedAt")
        if work.exists():  # first, so that a task of the failed job still running fails to write
            os.rename(work, staging / f".discarded-{uuid.uuid4().hex}")
        committed = self._latest(self.commits)
        old_n = journal.get("fromPartitions") or (self._partitions_of(committed) if committed is not None else None)
        for op_dir in ckpt.numbered_dirs(self.root / "state"):
            for parts in ckpt.discover_stores(op_dir).values():
                for files in parts:
                    _remove_rescale_snapshot(files, version, started, self.root)
            if old_n is not None:
                _set_metadata_partitions(op_dir, old_n)
                for part_dir in list(ckpt.numbered_dirs(op_dir)):
                    if int(part_dir.name) >= old_n and not any(p.is_file() or p.is_symlink() for p in part_dir.rglob("*")):
                        shutil.rmtree(part_dir, ignore_errors=True)  # created by this batch, now empty
        skipped = _skipped_batches(journal, latest)
        if skipped:  # a run killed while committing the skip: those batches stay uncommitted
            self.commits.purgeAfter(journal["readBatch"])
            for b in skipped:
                (self.root / "commits" / f".{b}.crc").unlink(missing_ok=True)
        self.offsets.purgeAfter(latest - 1)
        crc = self.root / "offsets" / f".{latest}.crc"
        crc.unlink(missing_ok=True)
        for leftover in staging.glob(".discarded-*"):  # this one, and any a killed rollback left
            shutil.rmtree(leftover, ignore_errors=True)
        try:
            staging.rmdir()  # only if no other batch's staging is in it
        except OSError:
            pass

    def _await_idle_executors(self, timeout: float = 60.0) -> None:
        """Wait until no task runs any more (a failed job's other tasks may still be writing),
        so that a rollback does not race with them."""
        tracker = self.spark.sparkContext._jsc.sc().statusTracker()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(info.numRunningTasks() for info in tracker.getExecutorInfos()):
                return
            time.sleep(0.1)
        log.warning("tasks of the failed rescale still run after %.0f s; rolling back anyway", timeout)

    def _stores(self, old_n: int) -> list[tuple[int, str, list[ckpt.StoreFiles]]]:
        out = []
        for op_dir in sorted(ckpt.numbered_dirs(self.root / "state"), key=lambda p: int(p.name)):
            if (op_dir / "_metadata" / "v2").is_dir():
                raise RescaleError(f"{op_dir} has versioned operator metadata (transformWithState), which "
                                   "keyedstate does not serve")
            discovered = ckpt.discover_stores(op_dir)
            for name in sorted(discovered):
                parts = [p for p in discovered[name] if p.partition < old_n]
                missing = sorted(set(range(old_n)) - {p.partition for p in parts})
                if missing:
                    raise RescaleError(f"store {name} of {op_dir} has no keyedstate files for partitions {missing}")
                out.append((int(op_dir.name), name, parts))
        if not out:
            raise RescaleError(f"{self.root / 'state'} holds no keyedstate state")
        return out

    def _key_groups(self, stores, version: int) -> int:
        """The checkpoint's key-group count, from any manifest or changelog (it is fixed)."""
        for _, _, parts in stores:
            for files in parts:
                for v in sorted(files.snapshots, reverse=True):
                    manifest = _readable_manifest(files, v)
                    if manifest is not None:
                        return manifest.key_groups
                for v in sorted(files.changelogs, reverse=True):
                    try:
                        return changelog.read_file(str(files.changelog_path(v))).key_groups
                    except changelog.CorruptChangelogError as exc:
                        raise RescaleError(str(exc)) from exc
        raise RescaleError(f"no manifest or changelog at or below version {version} in {self.root / 'state'}")

    def _run_tasks(self, fn, tasks: list, phase: str) -> list[dict]:
        if not tasks:
            return []
        sc = self.spark.sparkContext
        started = time.monotonic()
        with tracked(sc, "rescale", phase, len(tasks), log, "store partitions"):
            results = sc.parallelize(tasks, len(tasks)).map(fn).collect()
        log.info("%s: %d tasks in %.1f s", phase, len(tasks), time.monotonic() - started)
        return results


def _key_layout(parts: list[ckpt.StoreFiles]) -> KeyLayout | None:
    """The store's key layout as its newest manifest records it (None: not recorded)."""
    for files in parts:
        for v in sorted(files.snapshots, reverse=True):
            manifest = _readable_manifest(files, v)
            if manifest is not None and manifest.key_layout is not None:
                return manifest.key_layout
    return None


def _readable_manifest(files: ckpt.StoreFiles, version: int):
    """A snapshot manifest, or None (with a warning naming it) when it is unusable: the splits
    then rebuild from an older snapshot plus changelogs, like a load."""
    try:
        return ckpt.read_manifest(files.manifest_path(version), version)
    except ckpt.CheckpointError as exc:
        log.warning("%s; rescaling without it", exc)
        return None


def _skipped_batches(journal: dict, batch: int) -> list[int]:
    """The batches the rescale journalled for repartition batch ``batch`` skips: only ever those
    between the batch it reads and ``batch`` (anything else in a journal is not this tool's, and
    no commit outside them is touched)."""
    skipped, read = journal.get("skipped", []), journal.get("readBatch")
    return skipped if isinstance(read, int) and skipped == list(range(read + 1, batch)) else []


def _read_journal(path: Path) -> dict:
    try:
        return json.loads(layout.read_file(path, layout.MAX_SPARK_METADATA_BYTES, "rescale journal"))
    except (OSError, ValueError):
        return {}


def _remove_rescale_snapshot(files: ckpt.StoreFiles, version: int, started: float | None, root: Path) -> None:
    """Delete the snapshot of ``version`` a rescale published in one store partition (manifest
    and the files it lists), and files a rescale that started at ``started`` wrote into its
    ``ks-files/`` that no manifest lists (published before their manifest, or never); only
    inside the checkpoint ``root``, through no link."""
    ckpt.check_inside(files.path / FILES_DIR, root)
    path = files.manifest_path(version)
    if path.is_file():
        try:
            manifest = ckpt.read_manifest(path, version)
        except ckpt.CheckpointError as exc:
            log.warning("%s; left in place", exc)
            return
        if manifest.rescale is not None:
            path.unlink()
            for f in (*manifest.files, *([manifest.replay] if manifest.replay else [])):
                (files.path / f.path).unlink(missing_ok=True)  # names checked when it was read
    files_dir = files.path / FILES_DIR
    if started is None or not files_dir.is_dir():
        return
    listed: set[str] = set()
    for entry in files.path.iterdir():
        v = layout.version_of(entry.name, MANIFEST_SUFFIX)
        if v is None or not entry.is_file():
            continue
        try:
            m = ckpt.read_manifest(entry, v)
        except ckpt.CheckpointError:
            return  # cannot tell what it lists: leave the files alone
        listed.update(f.path for f in (*m.files, *([m.replay] if m.replay else [])))
    for entry in files_dir.iterdir():
        rel = f"{FILES_DIR}/{entry.name}"
        st = entry.lstat()
        if rel not in listed and st.st_mtime >= started - 1 and not entry.is_dir():
            entry.unlink()


def _publish(staged: Path, target: Path, version: int, root: Path) -> None:
    """Move the snapshot ``version`` of one new store partition from the outbox into the
    checkpoint ``root``: the files it lists first, its manifest last (the commit point of a
    snapshot), through no link. Only the driver calls this, after the job that staged it
    succeeded: no task writes into the checkpoint. Idempotent: a rerun after a kill finds part
    of it moved."""
    name = layout.manifest_name(version)
    if not (staged / name).is_file():
        if (target / name).is_file():
            return  # published by the run this one resumes
        raise RescaleError(f"{staged / name} is missing: no task staged snapshot {version} of {target}")
    # The manifest published is the one read here, whose files were moved: a late attempt of
    # the same task (speculation, a kill not yet delivered) may restage the partition meanwhile.
    try:
        data = layout.read_file(staged / name, layout.MAX_MANIFEST_BYTES, "snapshot manifest")
    except layout.TooLargeError as exc:
        raise ckpt.CheckpointError(str(exc)) from None
    manifest = ckpt.decode_manifest(data, staged / name, version)
    ckpt.check_inside(target / FILES_DIR, root)
    (target / FILES_DIR).mkdir(parents=True, exist_ok=True)
    for f in (*manifest.files, *([manifest.replay] if manifest.replay else [])):
        if (staged / f.path).is_file():
            os.replace(staged / f.path, target / f.path)
        elif not (target / f.path).is_file():
            raise RescaleError(f"{staged / f.path} is missing: snapshot {version} of {target} is incomplete")
    ckpt.write_atomically(target / name, data)
    (staged / name).unlink(missing_ok=True)


def _set_metadata_partitions(op_dir: Path, partitions: int) -> None:
    """Give every store in the operator's metadata v1 (``v1`` line, then Spark's compact JSON)
    the partition count ``partitions``; Hadoop's checksum beside it goes (Spark then reads the
    file unchecked, as it reads one an object store holds)."""
    path = op_dir / "_metadata" / "metadata"
    if not path.is_file():
        return
    ckpt.check_inside(path, op_dir)
    _, stores = ckpt.operator_metadata(op_dir)  # refuses a corrupt file
    if all(n == partitions for n in stores.values()):
        return
    version, _, body = layout.read_file(path, layout.MAX_SPARK_METADATA_BYTES, "Spark metadata file").decode(
        "utf-8").partition("\n")
    meta = json.loads(body)
    for store in meta.get("stateStoreInfo", []):
        store["numPartitions"] = partitions
    ckpt.write_atomically(path, f"{version}\n{json.dumps(meta, separators=(',', ':'))}".encode())
    (path.parent / f".{path.name}.crc").unlink(missing_ok=True)
    log.info("%s: numPartitions %d", path, partitions)


def _hash_spec(op: int, store: str, path: Path, key_layout: KeyLayout | None) -> dict:
    """How to recompute Spark's partition hash of a stored key (when key groups cannot say):
    the key schema from Spark's schema file, and the key layout (which columns are hashed)."""
    from .sparkhash import read_key_schema

    op_dir = path.parent if store == DEFAULT_STORE else path.parent.parent
    schema_file = ckpt.store_dir(op_dir, 0, store) / "_metadata" / "schema"
    if not schema_file.is_file():
        raise RescaleError(f"{schema_file} is missing: rescaling to a partition count that does not divide "
                           "the key-group count needs Spark's state schema to rehash keys")
    if key_layout is None:
        key_layout = _legacy_key_layout(store, ckpt.operator_metadata(op_dir)[0] or "",
                                        len(read_key_schema(str(schema_file))["fields"]))
    return {"schemaFile": str(schema_file), "keyLayout": key_layout.to_json()}


def _json_or_none(layout: KeyLayout | None) -> dict | None:
    return None if layout is None else layout.to_json()


def _layout_or_none(node: dict | None) -> KeyLayout | None:
    return None if node is None else KeyLayout.from_json(node)


# -- the tasks (run on executors; plain data in, plain data out) ------------------------------------

@dataclass(frozen=True)
class _SplitTask:
    operator: int
    store: str
    store_path: str
    partition: int
    version: int
    staging: str  # this old partition's output directory
    partitions: int
    key_groups: int
    hash_spec: dict | None  # None: route by key group
    direct: bool  # cut the new partitions from the rebuilt old one itself, no merge task (see run)
    from_partitions: int
    target_version: int  # the version the new partitions get
    targets: str  # the operator's state directory, holding the new partitions
    origin: dict  # what the published snapshots record about the rescale
    key_layout: dict | None  # recorded in the published snapshots' manifests


@dataclass(frozen=True)
class _MergeTask:
    staging: str  # the store's staging directory (from-<p>/to-<q>.sst inside)
    partition: int
    target: str  # the new partition's store directory in the checkpoint
    version: int
    key_groups: int
    num_keys: int
    ttl: dict | None
    origin: dict
    partitions: int
    key_layout: dict | None


def _split(task: _SplitTask) -> dict:
    """Cut one old store partition into per-new-partition SST files (reused if already done);
    a direct split stages its new partitions itself."""
    out = Path(task.staging)
    done = out / "done.json"
    if done.is_file():
        result = json.loads(done.read_text())
        if not task.direct or "published" in result:
            return result
        # A direct split finished by an older keyedstate, which left its old partition for
        # merge tasks to cut: redo it here (the old state is untouched).
        shutil.rmtree(out)
    temp = out.with_name(f"{out.name}.{uuid.uuid4().hex}.tmp")  # one per attempt (speculation)
    temp.mkdir()  # not its parents: see _Rescale.run
    try:
        return _finish_split(temp, out, _split_into(task, temp))
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)  # a copy of the partition's data: never leave it
        raise


def _split_into(task: _SplitTask, temp: Path) -> dict:
    files = ckpt.list_store(Path(task.store_path), task.partition)
    if files is None:
        raise ckpt.CheckpointError(f"{task.store_path} holds no keyedstate files")
    if task.direct and not any(v <= task.version for v in files.snapshots):
        return _replay_split(files, task, temp)
    started = time.monotonic()
    heirs = range(task.partition, task.partitions, task.from_partitions) if task.direct else None
    with ckpt.rebuild(files, task.version, workdir=temp) as rebuilt:
        _check_key_groups(rebuilt, task)
        ttl = rebuilt.manifest.ttl if rebuilt.manifest else None
        rebuilt_at = time.monotonic()
        out = _HeirFiles(temp, len(heirs) if heirs is not None else task.partitions)
        if task.hash_spec is None:
            counts = _write_by_key_group(rebuilt.db, task, out)
        else:
            counts = _write_by_hash(rebuilt.db, task, out)
        written = out.finish()
    if heirs is None:
        return {"keys": {str(q): c for q, c in counts.items()}, "ttl": ttl}
    written_at = time.monotonic()
    for q in heirs:
        _stage_ingested(written.get(q, []), temp / f"to-{q}", ckpt.store_dir(Path(task.targets), q, task.store),
                        task.target_version, task.key_groups, counts.get(q, 0), ttl, task.origin,
                        _layout_or_none(task.key_layout), move=True)
    return {"keys": {str(q): counts.get(q, 0) for q in heirs}, "ttl": ttl, "published": list(heirs),
            "seconds": {"rebuild": rebuilt_at - started, "split": written_at - rebuilt_at,
                        "stage": time.monotonic() - written_at}}


class _HeirFiles:
    """The SST files a split writes for each new partition, in key order (non-overlapping),
    named ``to-<q>-<n>.sst``. A file stops at about SST_FILE_BYTES / ``open_writers`` (at least
    2 MiB): an SST writer holds its file's Bloom-filter input, 8 bytes a key, until it finishes,
    so the writers open at once stay within about one RocksDB file's worth; and a later
    compaction into the bottom level then rewrites a file, not a partition."""

    def __init__(self, directory: Path, open_writers: int) -> None:
        self._directory = directory
        self._limit = max(min(2 << 20, rocksdb.SST_FILE_BYTES), rocksdb.SST_FILE_BYTES // max(1, open_writers))
        self._options = rocksdb.sst_options()
        self._writers: dict[int, Any] = {}
        self._files: dict[int, list[Path]] = {}

    def writer(self, q: int) -> Any:
        """New partition ``q``'s current writer (a new file once the current one is full)."""
        from rocksdict import SstFileWriter

        writer = self._writers.get(q)
        if writer is None or writer.file_size() >= self._limit:
            if writer is not None:
                writer.finish()
            names = self._files.setdefault(q, [])
            path = self._directory / f"to-{q}-{len(names):05d}.sst"
            writer = self._writers[q] = SstFileWriter(options=self._options)
            writer.open(str(path))
            names.append(path)
        return writer

    def finish(self) -> dict[int, list[Path]]:
        """Finish every open file; the files by new partition."""
        writers, self._writers = self._writers, {}
        for writer in writers.values():
            writer.finish()
        return self._files


def _write_by_key_group(db: Any, task: _SplitTask, out: _HeirFiles) -> dict[int, int]:
    """Scan a rebuilt old partition once, in key order, into each key's new partition (the
    owner of its key group); returns the keys written per new partition. Keys come in runs of
    one key group, routed once per run, which keeps the loop near the scan's and the SST
    write's own cost: one pass for all heirs, where a compaction per heir would cost k passes.
    A key of a key group the old partition does not own is refused (when the old count
    divides the key-group count, as Spark's routing then makes it), as is a run that starts
    with a key too short to name its key group; so is a scan that RocksDB stops on an error (a
    corrupt file), which rocksdict's ``items()`` would end quietly. (A short key sorting inside
    a run, which only a forged file that passed the checksums can hold, goes with that run, as
    any load of the partition keeps it.)"""
    from rocksdict import ReadOptions

    n, key_groups, prefix_bytes = task.partitions, task.key_groups, keygroups.PREFIX_BYTES
    old_n = task.from_partitions if keygroups.divides(task.from_partitions, key_groups) else 0
    counts: dict[int, int] = {}

    def writer_for(prefix: bytes) -> tuple[int, Any, bytes]:
        group = keygroups.key_group_of_stored_key(prefix) if len(prefix) == prefix_bytes else -1
        if not 0 <= group < key_groups or (old_n and group % old_n != task.partition):
            raise ckpt.CheckpointError(
                f"partition {task.partition} of {task.store_path} holds a key of key group {group} "
                f"(key prefix {prefix.hex()}), which it does not own among {key_groups} key groups "
                f"and {task.from_partitions} partitions: corrupt or misplaced")
        return group % n, out.writer(group % n), keygroups.prefix(group + 1)

    read = ReadOptions()
    read.fill_cache(False)  # each block is read once
    # Keys come sorted (RocksDB's bytewise order is Python's), so a run ends at the first key at
    # or past the next key group's prefix: one comparison a key.
    q, writer, bound, run, seen, key = -1, None, b"", 0, 0, None
    for key, value in db.items(read_opt=read):
        if key >= bound:
            if writer is not None:
                counts[q] = counts.get(q, 0) + seen - run
                run = seen
            q, writer, bound = writer_for(key[:prefix_bytes])
        writer[key] = value
        seen += 1
    if writer is not None:
        counts[q] = counts.get(q, 0) + seen - run
    _check_scanned(db, key, task)
    return counts


def _check_scanned(db: Any, last: bytes | None, task: _SplitTask) -> None:
    try:
        rocksdb.check_scan_end(db, last)
    except rocksdb.ScanError as exc:
        raise ckpt.CheckpointError(f"version {task.version} of partition {task.partition} ({task.store_path}) "
                                   f"cannot be read whole, a corrupt file: {exc}") from exc


def _write_by_hash(db: Any, task: _SplitTask, out: _HeirFiles) -> dict[int, int]:
    """Like :func:`_write_by_key_group` when N does not divide the key-group count: each key
    goes to Spark's own partition hash of its partition columns (~3 us a key with the hash)."""
    from .sparkhash import RowHasher, read_key_schema

    layout = KeyLayout.from_json(task.hash_spec["keyLayout"])
    hasher = RowHasher(read_key_schema(task.hash_spec["schemaFile"]), layout.partition_key_columns)
    row_offset, n = layout.row_offset, task.partitions
    counts: dict[int, int] = {}
    key = None
    for key, value in db.items():
        q = hasher.hash(key, row_offset(key)) % n
        out.writer(q)[key] = value
        counts[q] = counts.get(q, 0) + 1
    _check_scanned(db, key, task)
    return counts


def _stage_ingested(sources: list[Path], scratch: Path, target: Path, version: int, key_groups: int,
                    num_keys: int, ttl: dict | None, origin: dict, key_layout: KeyLayout | None,
                    move: bool) -> None:
    """Stage a new partition built from SST files (sorted, each in the bottom level when they
    do not overlap) as snapshot ``version`` at ``target``."""
    from rocksdict import Checkpoint, IngestExternalFileOptions

    scratch.mkdir()
    db = rocksdb.open_db(scratch / "db", bulk_load=False)
    try:
        if sources:
            opts = IngestExternalFileOptions()
            opts.set_move_files(move)
            db.ingest_external_file([str(s) for s in sources], opts)
        snapshot = scratch / "snapshot"
        Checkpoint(db).create_checkpoint(str(snapshot))
    finally:
        db.close()
    ckpt.write_snapshot(snapshot, target, version, key_groups, num_keys, ttl, rescale=origin, key_layout=key_layout)
    shutil.rmtree(scratch)


def _replay_split(files: ckpt.StoreFiles, task: _SplitTask, temp: Path) -> dict:
    """Direct split of a partition whose version is changelogs only (no snapshot yet, as in a
    young query): its records are routed by key group into one changelog per new partition
    (see offline/routing.py), staged right here as that partition's snapshot to
    replay (checkpoint.snapshots.write_snapshot), so these partitions need no merge task. No RocksDB is built: a flush would sort every key
    (~3 us each here), and the restarted query replays the file the way it replays any
    changelog."""
    # From the newest version written from empty (a base: routing replays from empty), else 1.
    needed = range(ckpt.written_from_empty(files, task.version) or 1, task.version + 1)
    missing = [v for v in needed if v not in files.changelogs]
    if missing:
        raise ckpt.CheckpointError(
            f"cannot read version {task.version} of {files.path}: missing "
            f"{', '.join(str(files.changelog_path(v)) for v in missing[:3])}{' ...' if len(missing) > 3 else ''}")
    logs = [ckpt.read_changelog(files.changelog_path(v), v, task.key_groups) for v in needed]
    try:
        routed = route_by_key_group(logs, task.partitions, task.target_version, task.key_groups)
    except changelog.CorruptChangelogError as exc:
        raise ckpt.CheckpointError(f"{files.path}: {exc}") from exc
    heirs = range(task.partition, task.partitions, task.from_partitions)
    strays = set(routed) - set(heirs)
    if strays:
        raise ckpt.CheckpointError(
            f"changelogs of {files.path} hold keys of key groups that partition {task.partition} "
            f"of {task.from_partitions} does not own (for new partitions {sorted(strays)[:5]}): corrupt or misplaced")
    counts = {}
    for q in heirs:  # staged here: a merge task would only copy the file
        data, counts[str(q)] = routed.get(q) or (changelog.encode(task.target_version, task.key_groups, []), 0)
        routed_file = temp / f"to-{q}{CHANGELOG_SUFFIX}"
        routed_file.write_bytes(changelog.compress(data, {"keyLayout": task.key_layout} if task.key_layout else {}))
        ckpt.write_snapshot(None, ckpt.store_dir(Path(task.targets), q, task.store), task.target_version,
                            task.key_groups, counts[str(q)], None, rescale=task.origin, replay=routed_file,
                            key_layout=_layout_or_none(task.key_layout))
    return {"keys": counts, "ttl": None, "published": list(heirs)}


def _check_key_groups(rebuilt: ckpt.RebuiltVersion, task: _SplitTask) -> None:
    if rebuilt.key_groups is not None and rebuilt.key_groups != task.key_groups:
        raise ckpt.CheckpointError(f"{task.store_path} has {rebuilt.key_groups} key groups, other stores "
                                   f"{task.key_groups}: corrupt or mixed checkpoint")


def _finish_split(temp: Path, out: Path, result: dict) -> dict:
    """Publish a split's output directory whole (rename), so a rerun reuses it or redoes it;
    the first of two attempts of the same split (speculation, a rerun) to finish wins."""
    (temp / "done.json").write_text(json.dumps(result))
    if not (out / "done.json").is_file():
        shutil.rmtree(out, ignore_errors=True)  # an unfinished one (not written by this code)
        try:
            os.replace(temp, out)
            return result
        except OSError:
            if not (out / "done.json").is_file():
                raise
    shutil.rmtree(temp, ignore_errors=True)
    return json.loads((out / "done.json").read_text())


def _merge(task: _MergeTask) -> dict:
    """Build one new store partition from its SST files and publish it as a snapshot."""
    # Finished splits only (from-<p>): an attempt killed midway leaves from-<p>.<id>.tmp behind,
    # with partial files. to-<q>.sst: a split finished by an older keyedstate.
    splits = [d for d in Path(task.staging).iterdir() if re.fullmatch(r"from-\d+", d.name)]
    sources = sorted(f for d in splits for f in (*d.glob(f"to-{task.partition}.sst"), *d.glob(f"to-{task.partition}-*.sst")))
    with tempfile.TemporaryDirectory(prefix="keyedstate-merge-", dir=task.staging) as tmp:
        # the staging copy stays until the commit, for reruns; the target is made by the driver
        _stage_ingested(sources, Path(tmp) / "new", Path(task.target), task.version, task.key_groups,
                        task.num_keys, task.ttl, task.origin, _layout_or_none(task.key_layout), move=False)
    return {"partition": task.partition, "keys": task.num_keys}


