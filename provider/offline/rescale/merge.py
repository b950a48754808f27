"""The merge task (run on executors): one new store partition built from the SST files the
splits wrote for it, staged as a snapshot that the driver publishes (:mod:`.commit`)."""
from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...formats import rocksdb
from ...formats.stored import KeyLayout
from ... import checkpoint as ckpt

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


def merge(task: MergeTask) -> dict:
    """Build one new store partition from its SST files and publish it as a snapshot."""
    # Finished splits only (from-<p>): an attempt killed midway leaves from-<p>.<id>.tmp behind,
    # with partial files. to-<q>.sst: a split finished by an older keyedstate.
    splits = [d for d in Path(task.staging).iterdir() if re.fullmatch(r"from-\d+", d.name)]
    sources = sorted(f for d in splits for f in (*d.glob(f"to-{task.partition}.sst"), *d.glob(f"to-{task.partition}-*.sst")))
    with tempfile.TemporaryDirectory(prefix="keyedstate-merge-", dir=task.staging) as tmp:
        # the staging copy stays until the commit, for reruns; the target is made by the driver
        stage_ingested(sources, Path(tmp) / "new", Path(task.target), task.version, task.key_groups,
                        task.num_keys, task.ttl, task.origin, layout_or_none(task.key_layout), move=False)
    return {"partition": task.partition, "keys": task.num_keys}

def stage_ingested(sources: list[Path], scratch: Path, target: Path, version: int, key_groups: int,
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


def layout_or_none(node: dict | None) -> KeyLayout | None:
    return None if node is None else KeyLayout.from_json(node)

