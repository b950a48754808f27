"""Rollback of an unfinished repartition batch: of one this tool was interrupted in, of one whose
job failed, or of the orphan Spark's own repartition leaves on a keyedstate checkpoint."""
from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from ...formats import layout
from ...formats.layout import FILES_DIR, MANIFEST_SUFFIX
from ... import checkpoint as ckpt
from .commit import set_metadata_partitions
from .sparklogs import LOGGER, SparkLogs
from .staging import JOURNAL, STAGING, read_journal, skipped_batches

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(LOGGER)


def roll_back(logs: SparkLogs, latest: int) -> None:
    """Remove the uncommitted repartition batch ``latest``: the snapshots it published and
    their files (in old and new partitions), files it wrote without a manifest yet, new
    partition directories left empty, its offsets entry and its staging."""
    staging = logs.root / STAGING
    work = staging / f"batch-{latest}"
    version = latest + 1
    journal = read_journal(work / JOURNAL)
    started = journal.get("startedAt")
    if work.exists():  # first, so that a task of the failed job still running fails to write
        os.rename(work, staging / f".discarded-{uuid.uuid4().hex}")
    committed = logs.latest(logs.commits)
    old_n = journal.get("fromPartitions") or (logs.partitions_of(committed) if committed is not None else None)
    for op_dir in ckpt.numbered_dirs(logs.root / "state"):
        for parts in ckpt.discover_stores(op_dir).values():
            for files in parts:
                remove_rescale_snapshot(files, version, started, logs.root)
        if old_n is not None:
            set_metadata_partitions(op_dir, old_n)
            for part_dir in list(ckpt.numbered_dirs(op_dir)):
                if int(part_dir.name) >= old_n and not any(p.is_file() or p.is_symlink() for p in part_dir.rglob("*")):
                    shutil.rmtree(part_dir, ignore_errors=True)  # created by this batch, now empty
    skipped = skipped_batches(journal, latest)
    if skipped:  # a run killed while committing the skip: those batches stay uncommitted
        logs.commits.purgeAfter(journal["readBatch"])
        for b in skipped:
            (logs.root / "commits" / f".{b}.crc").unlink(missing_ok=True)
    logs.offsets.purgeAfter(latest - 1)
    crc = logs.root / "offsets" / f".{latest}.crc"
    crc.unlink(missing_ok=True)
    for leftover in staging.glob(".discarded-*"):  # this one, and any a killed rollback left
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        staging.rmdir()  # only if no other batch's staging is in it
    except OSError:
        pass


def await_idle_executors(spark: "SparkSession", timeout: float = 60.0) -> None:
    """Wait until no task runs any more (a failed job's other tasks may still be writing),
    so that a rollback does not race with them."""
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(info.numRunningTasks() for info in tracker.getExecutorInfos()):
            return
        time.sleep(0.1)
    log.warning("tasks of the failed rescale still run after %.0f s; rolling back anyway", timeout)


def remove_rescale_snapshot(files: ckpt.StoreFiles, version: int, started: float | None, root: Path) -> None:
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


