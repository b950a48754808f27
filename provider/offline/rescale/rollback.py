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
    op_dirs = list(ckpt.numbered_dirs(logs.root / "state"))
    # Every manifest first, then the files: a file one partition shares with another stays
    # while a manifest that is not the rescale's lists it.
    removed = [(op_dir, name, files, remove_rescale_manifest(files, version, logs.root))
               for op_dir in op_dirs for name, parts in ckpt.discover_stores(op_dir).items() for files in parts]
    for op_dir, name, files, listed_by_removed in removed:
        remove_unlisted_files(files, op_dir, name, listed_by_removed, started, logs.root)
        remove_retired_markers(files.path, version)
    for op_dir in op_dirs:
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


def remove_rescale_manifest(files: ckpt.StoreFiles, version: int, root: Path) -> set[str] | None:
    """Delete the snapshot manifest of ``version`` a rescale published in one store partition;
    returns the files of this partition's ``ks-files/`` it listed (None: no such manifest, or an
    unreadable one, left in place)."""
    ckpt.check_inside(files.path / FILES_DIR, root)
    path = files.manifest_path(version)
    if not path.is_file():
        return None
    try:
        manifest = ckpt.read_manifest(path, version)
    except ckpt.CheckpointError as exc:
        log.warning("%s; left in place", exc)
        return None
    if manifest.rescale is None:
        return None
    path.unlink()
    return _own_files(manifest, files.partition)


def remove_unlisted_files(files: ckpt.StoreFiles, op_dir: Path, store: str, candidates: set[str] | None,
                          started: float | None, root: Path) -> None:
    """Delete from one store partition's ``ks-files/`` the ``candidates`` (the files a removed
    rescale manifest listed) and the files written since the rescale ``started``, those of them
    that no remaining manifest of this partition, nor of a partition it lends files to, lists;
    only inside the checkpoint ``root``, through no link."""
    files_dir = files.path / FILES_DIR
    ckpt.check_inside(files_dir, root)
    if not files_dir.is_dir() or (candidates is None and started is None):
        return
    listed = _listed(files.path, files.partition, own=True)
    if listed is None:
        return  # cannot tell what is listed: leave the files alone
    for entry in files.path.iterdir():
        borrower = layout.BORROWER_MARKER.fullmatch(entry.name)
        if borrower is None or not entry.is_file():
            continue
        theirs = _listed(ckpt.store_dir(op_dir, int(borrower.group(1)), store), files.partition, own=False)
        if theirs is None:
            return
        if theirs:
            listed |= theirs
        else:
            entry.unlink()  # the borrower lists nothing of this partition's (any more)
    for entry in files_dir.iterdir():
        rel = f"{FILES_DIR}/{entry.name}"
        if rel in listed or entry.is_dir():
            continue
        if rel in (candidates or ()) or (started is not None and entry.lstat().st_mtime >= started - 1):
            entry.unlink()


def remove_retired_markers(store_path: Path, version: int) -> None:
    """Delete the markers of partitions the rolled-back scale-down would have retired at ``version``
    (commit.mark_retired): those partitions stay the checkpoint's."""
    for entry in store_path.iterdir():
        retired = layout.RETIRED_MARKER.fullmatch(entry.name)
        if retired is not None and int(retired.group(2)) == version and entry.is_file():
            entry.unlink()


def _own_files(manifest, partition: int) -> set[str]:
    """The files a manifest lists in ``partition``'s ``ks-files/``, as ``ks-files/<name>``."""
    out = set()
    for f in (*manifest.files, *([manifest.replay] if manifest.replay else [])):
        owner, name = layout.owner_of(f.path)
        if owner is None or owner == partition:
            out.add(f"{FILES_DIR}/{name}")
    return out


def _listed(store_path: Path, partition: int, own: bool) -> set[str] | None:
    """The files of ``partition``'s ``ks-files/`` that the manifests in ``store_path`` list (``own``:
    the partition's own directory, else another partition's of the same store); None when one
    cannot be read."""
    listed: set[str] = set()
    if not store_path.is_dir():
        return listed
    for entry in store_path.iterdir():
        v = layout.version_of(entry.name, MANIFEST_SUFFIX)
        if v is None or not entry.is_file():
            continue
        try:
            m = ckpt.read_manifest(entry, v)
        except ckpt.CheckpointError:
            return None
        for f in (*m.files, *([m.replay] if m.replay else [])):
            owner, name = layout.owner_of(f.path)
            if owner == partition or (owner is None and own):
                listed.add(f"{FILES_DIR}/{name}")
    return listed
