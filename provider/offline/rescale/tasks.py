"""The split task (run on executors; plain data in, plain data out): rebuild one old store
partition's committed version and cut it into its heirs' SST files; a direct split (a scale-up
by a multiple) stages its heirs itself, so they need no merge task."""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ...formats import changelog, key_group_counts
from ...formats.layout import CHANGELOG_SUFFIX
from ... import checkpoint as ckpt
from ..routing import route_by_key_group
from .clip import (clipped_heir, count_by_key_group, counts_disagree, held_disagree,
                   owned_counts, replayed_batches, replayed_heir, replayed_logs, shared_files)
from .counts_through import CountsThrough
from .merge import layout_or_none, stage_ingested
from .routing import HeirFiles, write_by_hash, write_by_key_group, write_skipping

log = logging.getLogger(__name__)

SPLIT_IMPORTS = ("numpy",)
"""What a split imports only once it decodes its first changelog (the column codecs use numpy):
the driver's worker processes import it while they wait for their first split."""


@dataclass(frozen=True)
class SplitTask:
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
    merge_by_files: bool = False  # this partition's files are the base of some heirs (see split_into)

    @property
    def hides(self) -> bool:
        """Whether a heir built on this partition's files hides some of its key groups: all but
        a heir of a scale-down by a divisor, which owns every key group of its parent."""
        return self.from_partitions % self.partitions != 0

    @property
    def writes_other_heirs(self) -> bool:
        """Whether a split by files also writes this partition's keys of the new partitions it
        is not the base of into SST files (a merge by files whose heirs each have other parents)."""
        return self.merge_by_files and self.hides


def split(task: SplitTask) -> dict:
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
    temp.mkdir()  # not its parents: see driver.Rescale._run_jobs
    try:
        return finish_split(temp, out, split_into(task, temp))
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)  # a copy of the partition's data: never leave it
        raise


def split_into(task: SplitTask, temp: Path) -> dict:
    files = ckpt.list_store(Path(task.store_path), task.partition, task.store)
    if files is None:
        raise ckpt.CheckpointError(f"{task.store_path} holds no keyedstate files")
    if task.direct and not any(v <= task.version for v in files.snapshots):
        return replay_split(files, task, temp)
    started = time.monotonic()
    # Heirs built on this partition's files: new partitions q = partition + k * from_partitions.
    # A direct split publishes them itself; in a merge by files they are bases, on which the
    # merge tasks ingest the keys of their other parents (and the split writes its keys of the
    # heirs it is not the base of, as a merge's does).
    heirs = (range(task.partition, task.partitions, task.from_partitions) if task.direct or task.merge_by_files
             else None)
    # Without compactions: the rebuilt version is read once (a compaction, once the replay's
    # flush reaches L0's trigger, would rewrite it all beside that read), and a split by files
    # shares the snapshot's SSTs with the heirs, to which a compaction's output would be new.
    by_files = bool(heirs)
    # A split by files that cuts the changelogs by heir reads the base snapshot and the records
    # apart: the rebuild leaves them unapplied (applied below where the split needs the version).
    with ckpt.rebuild(files, task.version, workdir=temp, count_key_groups=by_files, compactions=False,
                      keep_logs=by_files, apply_logs=not by_files or task.writes_other_heirs) as rebuilt:
        check_key_groups(rebuilt, task)
        ttl = rebuilt.manifest.ttl if rebuilt.manifest else None
        rebuilt_at = time.monotonic()
        if by_files and rebuilt.manifest is not None:
            return split_by_files(files, rebuilt, task, temp, heirs, ttl, rebuilt_at - started)
        rebuilt = ckpt.apply_kept_logs(rebuilt)
        if task.merge_by_files:
            # The base of none, or without a usable snapshot (another run's, unreadable): its keys
            # all go to SST files, and its heirs' merges build them from those alone.
            heirs = None
        out = HeirFiles(temp, len(heirs) if heirs is not None else task.partitions)
        if task.hash_spec is None:
            counts = write_by_key_group(rebuilt.db, task, out)
        else:
            counts = write_by_hash(rebuilt.db, task, out)
        written = out.finish()
    if heirs is None:
        return {"keys": {str(q): c for q, c in counts.items()}, "ttl": ttl}
    written_at = time.monotonic()
    for q in heirs:
        stage_ingested(written.get(q, []), temp / f"to-{q}", ckpt.store_dir(Path(task.targets), q, task.store),
                        task.target_version, task.key_groups, counts.get(q, 0), ttl, task.origin,
                        layout_or_none(task.key_layout), move=True)
    return {"keys": {str(q): counts.get(q, 0) for q in heirs}, "ttl": ttl, "published": list(heirs),
            "seconds": {"rebuild": rebuilt_at - started, "split": written_at - rebuilt_at,
                        "stage": time.monotonic() - written_at}}


def split_by_files(files: ckpt.StoreFiles, rebuilt: ckpt.RebuiltVersion, task: SplitTask, temp: Path,
                   heirs: range, ttl: dict | None, rebuild_seconds: float) -> dict:
    """Stage each heir as its parent's files, shared in the checkpoint, clipped to the key
    groups it owns (:mod:`.clip`); only the range deletes are written, with the changelogs
    replayed on the snapshot cut to the heir's key groups (else the rebuild's own files). In a
    merge by files the parent's keys of the new partitions it is not the base of go to SST files
    too, in a pass that also checks the key-group counts (else checked by a seek per key group)."""
    started = time.monotonic()
    hide, writes = task.hides, task.writes_other_heirs
    logs = replayed_logs(rebuilt)
    if logs is None:  # the heirs are cut from the rebuilt version's files
        rebuilt = ckpt.apply_kept_logs(rebuilt)
    by_group = None if rebuilt.key_group_counts is None else \
        owned_counts(rebuilt.key_group_counts, task.partition, task.from_partitions, task.key_groups, task.store_path)
    heir_keys: dict[int, int] = {}  # each heir's keys, once the counts are settled
    if not writes:  # the counts are checked now, with a seek per key group held
        # Those of the database as it is: the base snapshot's where the changelogs are not applied,
        # brought through them as they are cut by heir below.
        by_group, counted_by_keys = _usable(by_group, lambda c: counts_disagree(rebuilt.db, c), rebuilt.db, task)
    counted_at = time.monotonic()
    through = None if rebuilt.applied else CountsThrough(rebuilt.db, by_group)
    batches = None if logs is None else replayed_batches(
        logs, heirs, task.partitions, task.partition, task.from_partitions, task.key_groups, task.store_path, through)
    if through is not None and (why := through.disagree()) is not None:
        # Changelogs whose ops contradict the files: the version rebuilt, its keys counted.
        log.warning("keyedstate: partition %d of %s: its changelogs do not bring its key-group counts to its "
                    "files' (%s); counting its keys", task.partition, task.store_path, why)
        rebuilt = ckpt.apply_kept_logs(rebuilt)
        by_group, counted_by_keys = _counted(rebuilt.db, task), True
    if not writes:
        heir_keys = key_group_counts.by_partition(by_group, task.partitions)
    for q in heirs:
        if batches is None:
            snapshot = clipped_heir(rebuilt.db, temp / f"to-{q}", q, task.partitions, task.key_groups, hide)
        else:
            snapshot = replayed_heir(files, rebuilt.manifest, batches.pop(q), temp / f"to-{q}", q, task.partitions,
                                     task.key_groups, hide)
        if task.merge_by_files:  # the merge task ingests the other parents' keys on it, then publishes it
            os.replace(snapshot, temp / base_dir_name(q))
        else:
            ckpt.write_snapshot(snapshot, ckpt.store_dir(Path(task.targets), q, task.store), task.target_version,
                                task.key_groups, heir_keys.get(q, 0), ttl,
                                rescale=task.origin, key_layout=layout_or_none(task.key_layout),
                                shared=shared_files(rebuilt.manifest, task.partition, q),
                                key_group_counts={g: c for g, c in by_group.items() if g % task.partitions == q})
        shutil.rmtree(temp / f"to-{q}")
    seconds = {"rebuild": rebuild_seconds, "count": counted_at - started, "clip": time.monotonic() - counted_at}
    written: dict[int, int] = {}
    if writes:  # its keys of the heirs it is not the base of, into SST files
        written_from = time.monotonic()
        out = HeirFiles(temp, task.partitions)
        written, held = write_skipping(rebuilt.db, task, out, skip=set(heirs))
        out.finish()
        seconds["split"] = time.monotonic() - written_from
        checked_from = time.monotonic()
        by_group, counted_by_keys = _usable(
            by_group, lambda c: held_disagree(held, c) or _written_disagree(written, c, task), rebuilt.db, task)
        seconds["count"] += time.monotonic() - checked_from
        heir_keys = key_group_counts.by_partition(by_group, task.partitions)
    result: dict = {"keys": {str(q): heir_keys.get(q, 0) for q in heirs}, "ttl": ttl,
                    "countedByKeys": counted_by_keys, "seconds": seconds}
    result["keys"].update({str(q): c for q, c in written.items()})
    if task.merge_by_files:
        result["bases"] = {str(q): [[name, size, path] for (name, size), path in
                                    shared_files(rebuilt.manifest, task.partition, q).items()] for q in heirs}
    else:
        result["published"] = list(heirs)
    return result


def _counted(db: Any, task: SplitTask) -> Counter:
    """The parent's keys counted by key group, in one pass (each key checked to be the parent's)."""
    return count_by_key_group(db, task.partition, task.from_partitions, task.key_groups, task.store_path)


def _usable(by_group: Counter | None, disagree: Callable[[Counter], str | None], db: Any,
            task: SplitTask) -> tuple[Counter, bool]:
    """The parent's key-group counts and whether they were counted by keys: ``by_group`` if
    ``disagree`` finds nothing wrong with it; else (none, an older snapshot's, an offline
    writer's, or counts that are not the files', which would give the heirs wrong numKeys) the
    keys counted."""
    if by_group is not None:
        why = disagree(by_group)
        if why is None:
            return by_group, False
        log.warning("keyedstate: partition %d of %s: its key-group counts are not its files' (%s); counting its keys",
                    task.partition, task.store_path, why)
    return _counted(db, task), True


def _written_disagree(written: dict[int, int], by_group: Counter, task: SplitTask) -> str | None:
    """Why the keys written for each new partition are not what the counts give it (None: they are)."""
    expected = key_group_counts.by_partition(by_group, task.partitions)
    for q, c in sorted(written.items()):
        if expected.get(q, 0) != c:
            return f"{c} keys of new partition {q} were written, the counts say {expected.get(q, 0)}"
    return None


def base_dir_name(heir: int) -> str:
    """The directory in a base's split output holding heir ``heir``'s base (a RocksDB checkpoint)."""
    return f"base-{heir}"


def replay_split(files: ckpt.StoreFiles, task: SplitTask, temp: Path) -> dict:
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
                            key_layout=layout_or_none(task.key_layout))
    return {"keys": counts, "ttl": None, "published": list(heirs)}


def check_key_groups(rebuilt: ckpt.RebuiltVersion, task: SplitTask) -> None:
    if rebuilt.key_groups is not None and rebuilt.key_groups != task.key_groups:
        raise ckpt.CheckpointError(f"{task.store_path} has {rebuilt.key_groups} key groups, other stores "
                                   f"{task.key_groups}: corrupt or mixed checkpoint")


def finish_split(temp: Path, out: Path, result: dict) -> dict:
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


