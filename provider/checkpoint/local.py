"""The local checkpoint-format-1 view the tools that rewrite a checkpoint in place (``inspect``,
``rescale``) work with: a store partition's listing (:mod:`.listing`) seen as local paths and
plain version numbers. Listing, reading and rebuilding are the package's own; only the shape
differs.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from ..formats import changelog, layout, rocksdb
from ..formats.layout import CHANGELOG_SUFFIX, DEFAULT_STORE, FILES_DIR, MANIFEST_SUFFIX
from . import rebuilder as rebuild_
from . import spark
from .errors import CheckpointError
from .listing import StorePartition, list_partition, numbered_dirs
from .plans import NoPlan, from_empty
from .rebuilder import Rebuilt
from .storage import LocalStorage, StorageError, local_path

RebuiltVersion = Rebuilt


class StoreFiles:
    """One local store partition: which format-1 versions it can still produce."""

    def __init__(self, listing: StorePartition, storage: LocalStorage) -> None:
        self.listing = listing
        self.storage = storage
        self.partition = listing.partition
        self.path = Path(listing.path)
        self.changelogs = {v for v, i in listing.changelogs if i is None}
        self.snapshots = {v for v, i in listing.snapshots if i is None}

    @property
    def latest(self) -> int | None:
        return max(self.changelogs | self.snapshots, default=None)

    def loadable(self) -> list[int]:
        """Versions a load can produce: a snapshot, or a loadable version plus its changelog."""
        out: list[int] = []
        for v in sorted(self.changelogs | self.snapshots):
            if v in self.snapshots or (v in self.changelogs and (v == 1 or (out and out[-1] == v - 1))):
                out.append(v)
        return out

    def changelog_path(self, version: int) -> Path:
        return self.path / f"{version}{CHANGELOG_SUFFIX}"

    def manifest_path(self, version: int) -> Path:
        return self.path / f"{version}{MANIFEST_SUFFIX}"


def list_store(path: Path, partition: int, store: str = DEFAULT_STORE) -> StoreFiles | None:
    """The keyedstate files of one local store partition (``path``: its directory in an operator's,
    which its manifests may share files with); refuses another provider's files and a symbolic
    link among them."""
    storage = LocalStorage(path.parent if store == DEFAULT_STORE else path.parent.parent)
    try:
        sp = list_partition(storage, None, partition, store, str(local_path(path)))
    except StorageError as exc:
        raise CheckpointError(str(exc)) from None
    if sp is None:
        return None
    if sp.foreign:
        raise CheckpointError(
            f"{sp.path} holds files of another state store provider ({', '.join(sorted(sp.foreign)[:5])}): "
            "this checkpoint was not written by keyedstate")
    files = StoreFiles(sp, storage)
    if not files.changelogs and not files.snapshots and not sp.has_files_dir:
        return None
    return files


def discover_stores(op_dir: Path) -> dict[str, list[StoreFiles]]:
    """Every store partition with keyedstate files under one local operator, by store name."""
    stores: dict[str, list[StoreFiles]] = {}
    for part_dir in sorted(numbered_dirs(op_dir), key=lambda p: int(p.name)):
        partition = int(part_dir.name)
        candidates = [(DEFAULT_STORE, part_dir)] + [
            (p.name, p) for p in sorted(part_dir.iterdir())
            if not p.is_symlink() and p.is_dir() and p.name not in (FILES_DIR, "_metadata")
            and not p.name.startswith(".")]
        for name, path in candidates:
            listed = list_store(path, partition, name)
            if listed is not None:
                stores.setdefault(name, []).append(listed)
    return stores


def latest_committed_batch(commits: Path) -> int | None:
    if not commits.is_dir():
        return None
    return max((n for p in commits.iterdir()
                if (n := layout.number_of(p.name)) is not None and not p.is_symlink() and p.is_file()), default=None)


def operator_metadata(op_dir: Path) -> tuple[str | None, dict[str, int]]:
    """Spark's operator metadata of a local operator directory (:func:`.spark.operator_metadata`)."""
    storage = LocalStorage(op_dir)
    try:
        return spark.operator_metadata(storage, storage.root)
    except StorageError as exc:
        raise CheckpointError(str(exc)) from None


def read_changelog(path: Path, version: int, key_groups: int | None) -> changelog.Changelog:
    """Read and check one local changelog (:func:`.rebuilder.read_changelog`)."""
    storage = LocalStorage(Path(path).parent)
    sp = StorePartition(None, 0, DEFAULT_STORE, storage.root)
    return rebuild_.read_changelog(storage, sp, version, None, key_groups,
                                   path=storage.join(storage.root, Path(path).name))


def written_from_empty(files: StoreFiles, version: int) -> int | None:
    """The newest changelog at or below ``version`` written from empty with every changelog
    after it present: the base of format 1's last plan (:func:`.plans.from_empty`), else None."""
    plan = from_empty(files.listing.changelogs, version,
                      lambda v, i: rebuild_.changelog_meta(files.storage, files.listing, v, i))
    if isinstance(plan, NoPlan):
        raise CheckpointError(plan.reason)
    return None if plan is None else plan[-2][0]


@contextlib.contextmanager
def rebuild(store: StoreFiles, version: int, manifests: dict | None = None,
            workdir: str | os.PathLike | None = None, count_key_groups: bool = False,
            compactions: bool = True, keep_logs: bool = False, apply_logs: bool = True) -> Iterator[Rebuilt]:
    """Rebuild ``version`` of a local store partition (:func:`.rebuilder.rebuild`)."""
    with rebuild_.rebuild(store.storage, store.listing, version, None,
                          None if workdir is None else os.fspath(workdir), manifests,
                          count_key_groups=count_key_groups, compactions=compactions,
                          keep_logs=keep_logs, apply_logs=apply_logs) as rebuilt:
        yield rebuilt


def open_copy(db_dir: Path, read_only: bool):
    """Open a private copy; read-write only when changelogs are to be applied on top."""
    return rocksdb.open_read_only(db_dir) if read_only else rocksdb.open_db(db_dir)
