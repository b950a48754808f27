"""Snapshots of a store partition: reading a manifest (size-capped, no link followed, its names
and paths checked, formats/manifest.py), fetching its files, and publishing one (files first,
then the manifest, atomically)."""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Mapping

from ..formats import key_group_counts as kgc
from ..formats import layout
from ..formats import manifest as mf
from ..formats.layout import CHANGELOG_SUFFIX, FILES_DIR
from ..formats.stored import KeyLayout
from .errors import CheckpointError
from .listing import StorePartition
from .storage import Storage, StorageError


def read_manifest(path: Path, version: int) -> mf.Manifest:
    """Read and check the local snapshot manifest ``path`` (see formats/layout.py)."""
    try:
        data = layout.read_file(path, layout.MAX_MANIFEST_BYTES, "snapshot manifest")
    except layout.TooLargeError as exc:
        raise CheckpointError(str(exc)) from exc
    except OSError as exc:
        raise CheckpointError(f"cannot read snapshot manifest {path}: {exc.strerror or exc}") from exc
    return decode_manifest(data, path, version)


def decode_manifest(data: bytes, path: str | Path, version: int) -> mf.Manifest:
    """Check the snapshot manifest ``data``, read from ``path`` (see :func:`read_manifest`)."""
    try:
        return mf.decode(data, str(path), version)
    except (mf.CorruptManifestError, layout.UnsafePathError) as exc:
        raise CheckpointError(str(exc)) from exc


def read_partition_manifest(storage: Storage, sp: StorePartition, version: int, uid: str | None = None) -> mf.Manifest:
    """The manifest of snapshot (``version``, ``uid``) of ``sp``, through ``storage``."""
    p = sp.manifest_path(storage, version, uid)
    try:
        data = storage.read_bytes(p, layout.MAX_MANIFEST_BYTES, "snapshot manifest")
    except OSError as exc:
        raise CheckpointError(f"cannot read snapshot manifest {p}: {exc}") from None
    return decode_manifest(data, p, version)


def fetch_snapshot(storage: Storage, sp: StorePartition, manifest: mf.Manifest, source: str, db_dir: Path) -> None:
    """The snapshot's files under their RocksDB names in ``db_dir`` (sizes checked against the
    manifest ``source``; names and paths were checked when it was read)."""
    for f in manifest.files:
        path = sp.file_path(storage, f.path)
        check_size(storage, path, f.size, source)
        # only table files are immutable; RocksDB rewrites the others when it opens the directory
        try:
            storage.fetch(path, db_dir / f.name, link=layout.is_table_file(f.name))
        except StorageError as exc:
            raise CheckpointError(f"snapshot manifest {source} lists {path}: {exc}") from None


def check_size(storage: Storage, path: str, size: int, source: str) -> None:
    """Refuse a snapshot file that is missing or not of the size its manifest ``source`` says."""
    found = storage.size(path)
    if found is None:
        raise CheckpointError(f"snapshot manifest {source} lists {path}, which is missing")
    if found != size:
        raise CheckpointError(f"{path} has {found} bytes but snapshot manifest {source} says {size}: "
                              "truncated or corrupt")


def write_snapshot(db_dir: Path | None, target: Path, version: int, key_groups: int, num_keys: int,
                   ttl: dict | None = None, rescale: dict | None = None, replay: Path | None = None,
                   key_layout: KeyLayout | None = None,
                   shared: Mapping[tuple[str, int], str] | None = None,
                   key_group_counts: Mapping[int, int] | None = None) -> mf.Manifest:
    """Publish the RocksDB checkpoint in ``db_dir`` as snapshot ``version`` of the local store
    partition at ``target``: files first (fresh names, never shared with another writer), then
    the manifest, atomically, so a reader sees all of the snapshot or none of it.

    ``replay``: a changelog of version ``version`` to apply on top of ``db_dir`` (None: empty)
    taken as version ``version - 1``; the rescale publishes a partition this way, routed from
    the old partitions' changelogs, where building RocksDB would cost a sort of every key.
    ``target`` must exist (a task whose staging was removed must fail, not recreate it).
    ``shared``: SST files already in the checkpoint, by (name, size): listed by their path there,
    not written again (a rescale's heirs share their parent's files). ``key_group_counts``: the
    keys of ``db_dir`` by key group, published beside its files when they add up to ``num_keys``."""
    if key_group_counts is not None and db_dir is not None:
        kgc.write_beside(db_dir, key_group_counts, key_groups, num_keys, f"version {version} of {target}")
    files_dir = target / FILES_DIR
    files_dir.mkdir(exist_ok=True)
    batch = uuid.uuid4()
    listed = []
    for local in sorted(p for p in db_dir.iterdir() if p.is_file()) if db_dir is not None else ():
        size = local.stat().st_size
        rel = (shared or {}).get((local.name, size)) if layout.is_table_file(local.name) else None
        if rel is None:
            rel = f"{FILES_DIR}/{batch}-{local.name}"
            link_or_copy(local, target / rel, sync=True)
        listed.append(mf.SnapshotFile(local.name, rel, size))
    replayed = None
    if replay is not None:
        name = f"replay-{version}{CHANGELOG_SUFFIX}"
        rel = f"{FILES_DIR}/{batch}-{name}"
        link_or_copy(replay, target / rel, sync=True)
        replayed = mf.SnapshotFile(name, rel, replay.stat().st_size)
    manifest = mf.Manifest(version, key_groups, num_keys, tuple(listed), replayed, key_layout, ttl, rescale)
    write_atomically(target / layout.manifest_name(version), mf.encode(manifest))
    return manifest


def write_atomically(path: Path, data: bytes) -> None:
    """Temp file, fsync, rename: a reader never sees half a file under its final name."""
    temp = path.parent / f".{path.name}.{uuid.uuid4()}.tmp"
    try:
        with open(temp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def link_or_copy(source: Path, dest: Path, sync: bool = False) -> None:
    """Hard-link a table file (immutable; RocksDB synced it when it wrote it); copy the rest
    (RocksDB rewrites MANIFEST, CURRENT and OPTIONS when it opens a directory), and anything on
    another file system. ``sync``: fsync a copy before returning (for checkpoint files)."""
    if layout.is_table_file(dest.name):
        try:
            os.link(source, dest)
            return
        except OSError:
            pass
    with open(source, "rb") as src, open(dest, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
        if sync:
            out.flush()
            os.fsync(out.fileno())
