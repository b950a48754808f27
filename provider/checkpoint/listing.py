"""Where a store partition's files live and which ones it has: the one listing of a store
partition (FORMATS.md, "Checkpoint layout"), on any :class:`~.storage.Storage`.

The ``default`` store lives in the partition directory itself, the others (a join's four) in
subdirectories. File names are ``<v>[_<uniqueId>].ks-changelog`` and ``.ks-snapshot``
(checkpoint format 2 adds the id). Path rules: every path is built here from a checked name
(:func:`versioned_name`), a local listing refuses a symbolic link among its entries
(:class:`~.storage.LocalStorage`), and :func:`refuse_links` checks a whole tree up front for the
tools that write and delete.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..formats import layout
from ..formats.layout import CHANGELOG_SUFFIX, DEFAULT_STORE, FILES_DIR, MANIFEST_SUFFIX, UNIQUE_ID
from .errors import CheckpointError
from .storage import Storage, StorageError, inside, link_refused

VersionId = tuple  # (version, unique id or None)

JOIN_STORES = ("left-keyToNumValues", "left-keyWithIndexToValue", "right-keyToNumValues",
               "right-keyWithIndexToValue")
"""A join's stores in the order Spark keeps their unique ids (checkpoint format 2)."""


def version_of(name: str, suffix: str) -> tuple[int, str | None] | None:
    """(version, unique id) of ``<v>[_<id>]<suffix>``, else None (``layout.versioned_file``)."""
    return layout.versioned_file(name, suffix)


def versioned_name(version: int, uid: str | None, suffix: str) -> str:
    """``<v>[_<id>]<suffix>``; ids come from the commit log and changelog headers, so anything
    but a UUID (a ``/`` or ``..`` would name another directory) is refused."""
    if uid and not (isinstance(uid, str) and UNIQUE_ID.fullmatch(uid)):
        raise CheckpointError(f"{uid!r} is not a unique id of a state store version (a UUID)")
    return f"{version}_{uid}{suffix}" if uid else f"{version}{suffix}"


@dataclass
class StorePartition:
    """One store partition's files: (version, id) -> size of its changelogs and snapshot
    manifests, other providers' files found beside them, and its snapshot files."""

    operator: int | None
    partition: int
    store: str
    path: str
    changelogs: dict[tuple[int, str | None], int] = field(default_factory=dict)
    snapshots: dict[tuple[int, str | None], int] = field(default_factory=dict)
    foreign: list[str] = field(default_factory=list)
    snapshot_files: dict[str, int] = field(default_factory=dict)  # ks-files/<name> -> size
    has_files_dir: bool = False

    @property
    def versions(self) -> list[int]:
        return sorted({v for v, _ in self.changelogs} | {v for v, _ in self.snapshots})

    @property
    def latest(self) -> int | None:
        vs = self.versions
        return vs[-1] if vs else None

    def changelog_path(self, storage: Storage, version: int, uid: str | None = None) -> str:
        return storage.join(self.path, versioned_name(version, uid, CHANGELOG_SUFFIX))

    def manifest_path(self, storage: Storage, version: int, uid: str | None = None) -> str:
        return storage.join(self.path, versioned_name(version, uid, MANIFEST_SUFFIX))

    def file_path(self, storage: Storage, rel: str) -> str:
        """Where a snapshot file a manifest of this store partition lists is (:func:`file_path`)."""
        return file_path(storage, self.path, self.store, self.partition, rel)

    def describe(self) -> str:
        if self.operator is None:
            return self.path
        return f"operator {self.operator} partition {self.partition} store '{self.store}'"


def list_partition(storage: Storage, operator: int | None, partition: int, store: str, path: str,
                   entries=None) -> StorePartition | None:
    """The files of one store partition directory (``entries``: its listing, if already made);
    None when it holds nothing of a state store's (no file of ours, no snapshot directory, no
    file of another provider)."""
    sp = StorePartition(operator, partition, store, path)
    for e in storage.list(path) if entries is None else entries:
        if e.is_dir:
            sp.has_files_dir |= e.name == FILES_DIR
            continue
        if e.name.startswith("."):
            continue
        for suffix, target in ((CHANGELOG_SUFFIX, sp.changelogs), (MANIFEST_SUFFIX, sp.snapshots)):
            vid = version_of(e.name, suffix)
            if vid is not None:
                target[vid] = e.size
        if layout.FOREIGN_FILE.fullmatch(e.name):
            sp.foreign.append(e.name)
    if sp.has_files_dir:
        files_dir = storage.join(path, FILES_DIR)
        sp.snapshot_files = {f"{FILES_DIR}/{e.name}": e.size for e in storage.list(files_dir)
                             if not e.is_dir and not e.name.startswith(".")}
    if not sp.changelogs and not sp.snapshots and not sp.has_files_dir and not sp.foreign:
        return None
    return sp


def list_operator(storage: Storage, operator: int | None, path: str) -> dict[str, list[StorePartition]]:
    """Every store partition under one operator directory, by store name, by partition."""
    found: dict[str, list[StorePartition]] = {}
    for e in storage.list(path):
        partition = layout.number_of(e.name) if e.is_dir else None
        if partition is None:
            continue
        part_path = storage.join(path, e.name)
        entries = storage.list(part_path)
        candidates = [(DEFAULT_STORE, part_path, entries)]
        for sub in entries:
            if sub.is_dir and sub.name not in (FILES_DIR, "_metadata") and not sub.name.startswith("."):
                sub_path = storage.join(part_path, sub.name)
                candidates.append((sub.name, sub_path, storage.list(sub_path)))
        for store, store_path, listing in candidates:
            sp = list_partition(storage, operator, partition, store, store_path, listing)
            if sp is not None:
                found.setdefault(store, []).append(sp)
    for parts in found.values():
        parts.sort(key=lambda s: s.partition)
    return dict(sorted(found.items()))


# -- local checkpoints: the directory rules the tools that write and delete apply ----------------

def local_path(checkpoint: str | os.PathLike) -> Path:
    """The local directory of a checkpoint location given as a path or ``file:`` URI."""
    text = os.fspath(checkpoint)
    if text.startswith("file:"):
        text = re.sub(r"^file:(//)?", "", text)
    elif re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", text):
        raise CheckpointError(f"{text}: only local checkpoints are supported; copy it to local disk first")
    return Path(text).absolute()


def refuse_links(root: Path, *subdirs: str) -> None:
    """Refuse a checkpoint with a symbolic link at or anywhere below ``root/<subdir>``: the tools
    list, read, write and delete by path, and a link would take them outside the checkpoint (a
    ``ks-files`` link made a rollback delete the files it pointed to). Checked once, up front."""
    pending = [root / sub for sub in subdirs]
    while pending:
        directory = pending.pop()
        if directory.is_symlink():
            raise CheckpointError(link_refused(directory))
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.is_symlink():
                        raise CheckpointError(link_refused(Path(entry.path)))
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(Path(entry.path))
        except (FileNotFoundError, NotADirectoryError):
            continue


def check_inside(path: Path, root: Path) -> Path:
    """``path``, if it lies below ``root`` through no symbolic link (as far as it exists) and
    resolves there (:func:`.storage.inside`): checked again right before a tool writes or deletes."""
    try:
        inside(str(root), str(path), write=True)
    except StorageError as exc:
        raise CheckpointError(str(exc)) from None
    return path


def file_path(storage: Storage, store_path: str, store: str, partition: int, rel: str) -> str:
    """Where the snapshot file ``rel`` (a path :func:`layout.checked_relative_path` accepted) that
    a manifest of store partition ``partition`` at ``store_path`` lists is: in its ``ks-files/``,
    or in that of another partition of the same operator and store (a rescale's shared files)."""
    owner, name = layout.owner_of(rel)
    if owner is None or owner == partition:
        return storage.join(store_path, FILES_DIR, name)
    part_dir = store_path if store == DEFAULT_STORE else storage.parent(store_path)
    other = storage.join(storage.parent(part_dir), str(owner))
    return storage.join(other if store == DEFAULT_STORE else storage.join(other, store), FILES_DIR, name)


def numbered_dirs(directory: Path) -> Iterator[Path]:
    """Subdirectories named by a number (operators, partitions), in no particular order; a link
    is not a directory here."""
    return (p for p in directory.iterdir()
            if not p.is_symlink() and p.is_dir() and layout.number_of(p.name) is not None)


def store_dir(op_dir: Path, partition: int, store: str) -> Path:
    """Where one store partition lives (Spark's StateStoreId.storeCheckpointLocation)."""
    part = op_dir / str(partition)
    return part if store == DEFAULT_STORE else part / store


def bytes_on_disk(path: Path) -> int:
    """The store's own files (not other stores' subdirectories) plus its snapshot files."""
    total = sum(p.lstat().st_size for p in path.iterdir() if not p.is_symlink() and p.is_file())
    files_dir = path / FILES_DIR
    if files_dir.is_dir() and not files_dir.is_symlink():
        total += sum(p.lstat().st_size for p in files_dir.rglob("*") if not p.is_symlink() and p.is_file())
    return total
