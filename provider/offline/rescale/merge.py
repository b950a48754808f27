"""The merge task (run on executors): one new store partition built from the SST files the
splits wrote for it, staged as a snapshot that the driver publishes (:mod:`.commit`)."""
from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ...formats import rocksdb
from ...formats.stored import KeyLayout
from ... import checkpoint as ckpt
from ...checkpoint.snapshots import link_or_copy

@dataclass(frozen=True)
class MergeTask:
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
    base: dict | None = None  # a merge by files: the split's "base" (its directory, the files it shares)


def merge(task: MergeTask) -> dict:
    """Build one new store partition from its SST files (on its base's files, when merged by
    files) and publish it as a snapshot."""
    # Finished splits only (from-<p>): an attempt killed midway leaves from-<p>.<id>.tmp behind,
    # with partial files. to-<q>.sst: a split finished by an older keyedstate.
    splits = [d for d in Path(task.staging).iterdir() if re.fullmatch(r"from-\d+", d.name)]
    sources = sorted(f for d in splits for f in (*d.glob(f"to-{task.partition}.sst"), *d.glob(f"to-{task.partition}-*.sst")))
    base = None
    if task.base is not None:
        base = (Path(task.base["dir"]), {(name, size): path for name, size, path in task.base["shared"]})
    with tempfile.TemporaryDirectory(prefix="keyedstate-merge-", dir=task.staging) as tmp:
        # the staging copy stays until the commit, for reruns; the target is made by the driver
        stage_ingested(sources, Path(tmp) / "new", Path(task.target), task.version, task.key_groups,
                        task.num_keys, task.ttl, task.origin, layout_or_none(task.key_layout), move=False, base=base)
    return {"partition": task.partition, "keys": task.num_keys}

def stage_ingested(sources: list[Path], scratch: Path, target: Path, version: int, key_groups: int,
                    num_keys: int, ttl: dict | None, origin: dict, key_layout: KeyLayout | None,
                    move: bool, base: tuple[Path, Mapping[tuple[str, int], str]] | None = None) -> None:
    """Stage a new partition built from SST files (sorted, each in the bottom level when they
    do not overlap) as snapshot ``version`` at ``target``. With ``base`` (a RocksDB checkpoint
    and the files of it that the checkpoint already holds, by (name, size)), the files are
    ingested on a copy of it (hard links, so the base stays for a rerun), and its shared files
    are listed where they are, not written again."""
    from rocksdict import Checkpoint, IngestExternalFileOptions

    scratch.mkdir()
    if base is not None:
        (scratch / "db").mkdir()
        for f in base[0].iterdir():
            link_or_copy(f, scratch / "db" / f.name)
    # A base keeps its files as they are: no compaction (the shared ones keep their names).
    db = rocksdb.open_db(scratch / "db", bulk_load=False, compactions=base is None)
    try:
        if sources:
            opts = IngestExternalFileOptions()
            opts.set_move_files(move)
            db.ingest_external_file([str(s) for s in sources], opts)
        snapshot = scratch / "snapshot"
        Checkpoint(db).create_checkpoint(str(snapshot))
    finally:
        db.close()
    ckpt.write_snapshot(snapshot, target, version, key_groups, num_keys, ttl, rescale=origin, key_layout=key_layout,
                        shared=base[1] if base is not None else None)
    shutil.rmtree(scratch)


def layout_or_none(node: dict | None) -> KeyLayout | None:
    return None if node is None else KeyLayout.from_json(node)

