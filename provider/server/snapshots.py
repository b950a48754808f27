"""Local side of incremental snapshots: RocksDB checkpoints staged for upload, and restores.

A snapshot of version v is a RocksDB checkpoint (hard links to the immutable SST files plus the
small MANIFEST/CURRENT/OPTIONS files) created right after v is applied, so it captures exactly
v even if later versions are applied before the maintenance thread uploads it. The JVM shim
uploads the files it has not uploaded before (SST names never repeat within one RocksDB
lineage), writes the manifest, and then asks us to drop the staged directory.
"""
from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from rocksdict import Checkpoint, Rdict

from ..formats import key_group_counts


@dataclass(frozen=True)
class StagedSnapshot:
    """A local RocksDB checkpoint of one version waiting to be uploaded."""

    version: int
    lineage: str
    num_keys: int
    directory: Path

    def describe(self) -> dict:
        files = sorted(p for p in self.directory.iterdir() if p.is_file())
        return {
            "version": self.version,
            "lineage": self.lineage,
            "numKeys": self.num_keys,
            "dir": str(self.directory),
            "files": [{"name": p.name, "size": p.stat().st_size} for p in files],
        }


def stage(db: Rdict, directory: Path, version: int, lineage: str, num_keys: int,
          counts: Mapping[int, int] | None = None, key_groups: int = 0) -> StagedSnapshot:
    """Create a RocksDB checkpoint of ``db`` in ``directory`` (flushes the memtable first), with
    the key-group ``counts`` beside it when they are known and add up to ``num_keys``."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    Checkpoint(db).create_checkpoint(str(directory))
    if counts is not None:
        key_group_counts.write_beside(directory, counts, key_groups, num_keys, f"version {version}")
    return StagedSnapshot(version, lineage, num_keys, directory)


def install(snapshot_dir: Path, db_dir: Path) -> None:
    """Make the downloaded checkpoint files in ``snapshot_dir`` the database at ``db_dir``
    (private to the user, whatever mode the JVM's download gave them). A file the JVM hard-linked
    to the checkpoint's keeps that file's mode: a chmod here would change the checkpoint's file,
    and its bytes are no more readable through this directory (0700) than through the checkpoint."""
    if db_dir.exists():
        shutil.rmtree(db_dir)
    os.replace(snapshot_dir, db_dir)
    os.chmod(db_dir, 0o700)
    with os.scandir(db_dir) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_nlink == 1:
                os.chmod(entry.path, 0o600)


class StagedSnapshots:
    """One store's snapshots staged for upload, by version. Their directories are created,
    listed and removed under this one's lock alone: the uploader lists them while applies run,
    and must never see one half created or removed."""

    def __init__(self) -> None:
        self._staged: dict[int, StagedSnapshot] = {}
        self._lock = threading.Lock()

    def __contains__(self, version: int) -> bool:
        return version in self._staged

    def stage(self, db: Rdict, directory: Path, version: int, lineage: str, num_keys: int,
              counts: Mapping[int, int] | None = None, key_groups: int = 0) -> None:
        with self._lock:
            self._staged[version] = stage(db, directory, version, lineage, num_keys, counts, key_groups)

    def describe(self) -> list[dict]:
        with self._lock:
            return [s.describe() for _, s in sorted(self._staged.items())]

    def drop(self, version: int) -> None:
        with self._lock:
            staged = self._staged.pop(version, None)
            if staged is not None:
                shutil.rmtree(staged.directory, ignore_errors=True)

    def drop_all(self) -> None:
        for version in list(self._staged):
            self.drop(version)
