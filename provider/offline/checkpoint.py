"""Offline view of a keyedstate checkpoint: where each store partition's files live and how a
version is rebuilt from them, without Spark or the JVM.

Tools that work on a stopped query (``inspect``, ``rescale``) read the layout the JVM's
``CheckpointFiles`` writes (formats/layout.py). The ``default`` store lives in the partition
directory itself, the others (a join's four) in subdirectories. A version is rebuilt the way a
load does it: the newest snapshot at or below it, then the changelogs after it, into a private
RocksDB copy (the checkpoint's files are never opened in place: RocksDB rewrites MANIFEST and
CURRENT when it opens read-write). Only local checkpoints (paths or ``file:`` URIs) are supported.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from rocksdict import Rdict

from ..formats import changelog, layout, rocksdb
from ..formats import manifest as mf
from ..formats.layout import CHANGELOG_SUFFIX, DEFAULT_STORE, FILES_DIR, MANIFEST_SUFFIX
from ..formats.stored import KeyLayout
from .storage import StorageError, inside, link_refused

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """The checkpoint is missing, not keyedstate's, or holds a corrupt file (named in the message)."""


@dataclass
class StoreFiles:
    """One store partition's directory listing: which versions it can still produce."""

    partition: int
    path: Path
    changelogs: set[int] = field(default_factory=set)
    snapshots: set[int] = field(default_factory=set)

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


def numbered_dirs(directory: Path) -> Iterator[Path]:
    """Subdirectories named by a number (operators, partitions), in no particular order."""
    return (p for p in directory.iterdir() if p.is_dir() and layout.number_of(p.name) is not None)


def store_dir(op_dir: Path, partition: int, store: str) -> Path:
    """Where one store partition lives (Spark's StateStoreId.storeCheckpointLocation)."""
    part = op_dir / str(partition)
    return part if store == DEFAULT_STORE else part / store


def latest_committed_batch(commits: Path) -> int | None:
    if not commits.is_dir():
        return None
    return max((n for p in commits.iterdir() if (n := layout.number_of(p.name)) is not None and p.is_file()),
               default=None)


def operator_metadata(op_dir: Path) -> tuple[str | None, dict[str, int]]:
    """Spark's operator metadata (``v1`` line, then JSON): the operator's name and its stores'
    partition counts. Older checkpoints lack it; then the directories are all we know."""
    path = op_dir / "_metadata" / "metadata"
    if not path.is_file():
        return None, {}
    try:
        text = layout.read_file(path, layout.MAX_SPARK_METADATA_BYTES, "Spark metadata file").decode("utf-8")
        version, _, body = text.partition("\n")
        if not version.startswith("v"):
            raise ValueError(f"unexpected first line {version!r}")
        meta = layout.json_of(body)
        name = meta["operatorInfo"]["operatorName"]
        stores = {layout.checked_store_name(s["storeName"], str(path)): int(s["numPartitions"])
                  for s in meta.get("stateStoreInfo", [])}
    except layout.UnsafePathError as exc:
        raise CheckpointError(str(exc)) from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"operator metadata {path} is truncated or corrupt ({exc})") from exc
    return name, stores


def list_store(path: Path, partition: int) -> StoreFiles | None:
    """The keyedstate files of one store partition; refuses another provider's files."""
    files = StoreFiles(partition, path)
    foreign = []
    for entry in path.iterdir():
        name = entry.name
        if not entry.is_file() or name.startswith("."):
            continue
        for suffix, versions in ((CHANGELOG_SUFFIX, files.changelogs), (MANIFEST_SUFFIX, files.snapshots)):
            version = layout.version_of(name, suffix)
            if version is not None:
                versions.add(version)
        if layout.FOREIGN_FILE.fullmatch(name):
            foreign.append(name)
    if foreign:
        raise CheckpointError(
            f"{path} holds files of another state store provider ({', '.join(sorted(foreign)[:5])}): "
            "this checkpoint was not written by keyedstate")
    if not files.changelogs and not files.snapshots and not (path / FILES_DIR).is_dir():
        return None
    return files


def discover_stores(op_dir: Path) -> dict[str, list[StoreFiles]]:
    """Every store partition with keyedstate files under one operator, by store name."""
    stores: dict[str, list[StoreFiles]] = {}
    for part_dir in sorted(numbered_dirs(op_dir), key=lambda p: int(p.name)):
        partition = int(part_dir.name)
        candidates = [(DEFAULT_STORE, part_dir)] + [
            (p.name, p) for p in sorted(part_dir.iterdir())
            if p.is_dir() and p.name not in (FILES_DIR, "_metadata") and not p.name.startswith(".")]
        for name, path in candidates:
            listed = list_store(path, partition)
            if listed is not None:
                stores.setdefault(name, []).append(listed)
    return stores


def bytes_on_disk(path: Path) -> int:
    """The store's own files (not other stores' subdirectories) plus its snapshot files."""
    total = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    files_dir = path / FILES_DIR
    if files_dir.is_dir():
        total += sum(p.stat().st_size for p in files_dir.rglob("*") if p.is_file())
    return total


# -- snapshot manifests ----------------------------------------------------------------------------

def read_manifest(path: Path, version: int) -> mf.Manifest:
    """Read and check a snapshot manifest (its names and paths included, see formats/layout.py)."""
    try:
        data = layout.read_file(path, layout.MAX_MANIFEST_BYTES, "snapshot manifest")
    except layout.TooLargeError as exc:
        raise CheckpointError(str(exc)) from exc
    except OSError as exc:
        raise CheckpointError(f"cannot read snapshot manifest {path}: {exc.strerror or exc}") from exc
    return decode_manifest(data, path, version)


def decode_manifest(data: bytes, path: Path, version: int) -> mf.Manifest:
    """Check the snapshot manifest ``data``, read from ``path`` (see :func:`read_manifest`)."""
    try:
        return mf.decode(data, str(path), version)
    except (mf.CorruptManifestError, layout.UnsafePathError) as exc:
        raise CheckpointError(str(exc)) from exc


def write_snapshot(db_dir: Path | None, target: Path, version: int, key_groups: int, num_keys: int,
                   ttl: dict | None = None, rescale: dict | None = None, replay: Path | None = None,
                   key_layout: KeyLayout | None = None) -> mf.Manifest:
    """Publish the RocksDB checkpoint in ``db_dir`` as snapshot ``version`` of the store
    partition at ``target``: files first (fresh names, never shared with another writer), then
    the manifest, atomically, so a reader sees all of the snapshot or none of it.

    ``replay``: a changelog of version ``version`` to apply on top of ``db_dir`` (None: empty)
    taken as version ``version - 1``; the rescale publishes a partition this way, routed from
    the old partitions' changelogs, where building RocksDB would cost a sort of every key.
    ``target`` must exist (a task whose staging was removed must fail, not recreate it)."""
    files_dir = target / FILES_DIR
    files_dir.mkdir(exist_ok=True)
    batch = uuid.uuid4()
    listed = []
    for local in sorted(p for p in db_dir.iterdir() if p.is_file()) if db_dir is not None else ():
        rel = f"{FILES_DIR}/{batch}-{local.name}"
        _link_or_copy(local, target / rel, sync=True)
        listed.append(mf.SnapshotFile(local.name, rel, local.stat().st_size))
    replayed = None
    if replay is not None:
        name = f"replay-{version}{CHANGELOG_SUFFIX}"
        rel = f"{FILES_DIR}/{batch}-{name}"
        _link_or_copy(replay, target / rel, sync=True)
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


def _link_or_copy(source: Path, dest: Path, sync: bool = False) -> None:
    """Hard-link an SST file (immutable; RocksDB synced it when it wrote it); copy the rest
    (RocksDB rewrites MANIFEST, CURRENT and OPTIONS when it opens a directory), and anything on
    another file system. ``sync``: fsync a copy before returning (for checkpoint files)."""
    if dest.suffix == ".sst":
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


# -- rebuilding a version --------------------------------------------------------------------------

@dataclass(frozen=True)
class RebuiltVersion:
    """A private RocksDB copy holding one version of a store partition."""

    db: Rdict
    base_snapshot: int | None
    changelogs_applied: int
    key_groups: int | None
    manifest: mf.Manifest | None  # of the base snapshot
    skipped: tuple[str, ...] = ()  # unusable newer snapshots passed over, and why (naming them)


@contextlib.contextmanager
def rebuild(store: StoreFiles, version: int, manifests: dict[int, "mf.Manifest | CheckpointError"] | None = None,
            workdir: str | os.PathLike | None = None) -> Iterator[RebuiltVersion]:
    """Rebuild ``version`` of one store partition in a temporary RocksDB directory (deleted on
    exit).

    Like a load (and Spark's auto snapshot repair), the base is the newest snapshot at or below
    ``version`` that is usable; a snapshot whose manifest is corrupt, truncated, foreign or
    names files it may not, or whose files are missing or of the wrong size, or that another
    run's attempt of its version replaced (:func:`.manifest.of_another_run`), is skipped with a
    warning naming it, in favour of an older one (or none) plus the changelogs after it. If no
    consistent version can be rebuilt, :class:`CheckpointError` names the file at fault.
    ``manifests``: manifests already read, by version (a value may be the error reading it gave).

    Snapshot files are hard-linked when the checkpoint is on the same file system (they are
    immutable) and copied otherwise."""
    with tempfile.TemporaryDirectory(prefix="keyedstate-rebuild-", dir=workdir) as tmp:
        db_dir = Path(tmp) / "db"
        db, base, manifest, key_groups, skipped, first = _rebuild_base(store, version, manifests or {}, db_dir)
        needed = range(first, version + 1)
        try:
            for v in needed:
                key_groups = apply_changelog(db, store.changelog_path(v), v, key_groups)
            if needed or (manifest is not None and manifest.replay):
                db.flush()
            yield RebuiltVersion(db, base, len(needed), key_groups, manifest, tuple(skipped))
        finally:
            db.close()


def _changelog_run(path: Path) -> str | None:
    """The run that committed a changelog, from its header alone (its body is not read)."""
    try:
        return changelog.read_file_meta(str(path)).get(changelog.RUN_ID)
    except changelog.CorruptChangelogError as exc:
        raise CheckpointError(str(exc)) from exc
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc


def _rebuild_base(store: StoreFiles, version: int, manifests: dict, db_dir: Path):
    """The newest usable snapshot at or below ``version`` opened in ``db_dir`` (its replay
    applied), with the changelogs after it present, and the first changelog to apply on it; see
    :func:`rebuild`. Without one, an empty database and a changelog written from empty, if the
    changelogs back from ``version`` reach one (nothing older is needed then)."""
    skipped: list[str] = []
    for base in sorted((s for s in store.snapshots if s <= version), reverse=True) + [None]:
        missing = [v for v in range((base or 0) + 1, version + 1) if v not in store.changelogs]
        if missing:
            start = written_from_empty(store, version)
            if start is not None:
                if db_dir.exists():
                    shutil.rmtree(db_dir)
                db_dir.mkdir(parents=True)
                return open_copy(db_dir, read_only=False), None, None, None, skipped, start
            what = (f"missing {', '.join(str(store.changelog_path(v)) for v in missing[:3])}"
                    f"{' ...' if len(missing) > 3 else ''}")
            # An older base needs these changelogs too: nothing consistent can be rebuilt.
            raise CheckpointError(f"cannot rebuild version {version} of {store.path}: "
                                  + "; ".join(skipped + [("and without it: " if skipped else "") + what]))
        if db_dir.exists():
            shutil.rmtree(db_dir)
        db_dir.mkdir(parents=True)
        if base is None:
            if skipped:
                log.warning("rebuilding version %d of %s from its changelogs alone", version, store.path)
            return open_copy(db_dir, read_only=False), None, None, None, skipped, 1
        path = store.manifest_path(base)
        try:
            known = manifests.get(base)
            if isinstance(known, CheckpointError):
                raise known
            manifest = known or read_manifest(path, base)
            if manifest.run_id is not None and base in store.changelogs:
                committed = _changelog_run(store.changelog_path(base))
                why = mf.of_another_run(manifest, committed, str(store.changelog_path(base)))
                if why is not None:
                    raise CheckpointError(f"snapshot manifest {path}: {why}")
            _link_snapshot(store.path, path, manifest, db_dir)
            replay = manifest.replay
            needs_writes = base < version or replay is not None
            try:
                db = open_copy(db_dir, read_only=not needs_writes)
            except Exception as exc:  # rocksdict raises plain exceptions for unreadable files
                raise CheckpointError(f"the RocksDB files of snapshot manifest {path} cannot be opened: {exc}") from exc
            key_groups = manifest.key_groups
            if replay is not None:  # the snapshot's version itself, as a changelog (see write_snapshot)
                try:
                    _check_size(store.path / replay.path, replay.size, path)
                    key_groups = apply_changelog(db, store.path / replay.path, base, key_groups)
                except CheckpointError:
                    db.close()
                    raise
        except CheckpointError as exc:
            log.warning("skipping snapshot %s in favour of an older one plus changelogs: %s", path, exc)
            skipped.append(f"snapshot {path} is unusable ({exc})")
            continue
        return db, base, manifest, key_groups, skipped, base + 1
    raise AssertionError("unreachable")


def written_from_empty(store: StoreFiles, version: int) -> int | None:
    """The newest changelog at or below ``version`` written from empty with every changelog
    after it present (read back from ``version``; only once no snapshot-based way is left)."""
    v = version
    while v >= 1 and v in store.changelogs:
        if read_changelog(store.changelog_path(v), v, None).meta.get(changelog.FROM_EMPTY) is True:
            return v
        v -= 1
    return None


def _check_size(source: Path, size: int, manifest_path: Path) -> None:
    try:
        found = source.stat().st_size
    except OSError as exc:
        raise CheckpointError(f"snapshot manifest {manifest_path} lists {source}, which is missing") from exc
    if found != size:
        raise CheckpointError(f"{source} has {found} bytes but snapshot manifest {manifest_path} says {size}: "
                              "truncated or corrupt")


def open_copy(db_dir: Path, read_only: bool) -> Rdict:
    """Open a private copy; read-write only when changelogs are to be applied on top (into a
    vector memtable, unreadable until flushed, which rebuild() does before anyone reads)."""
    return rocksdb.open_read_only(db_dir) if read_only else rocksdb.open_db(db_dir)


def _link_snapshot(store_dir: Path, manifest_path: Path, manifest: mf.Manifest, db_dir: Path) -> None:
    """Give the manifest's files their RocksDB names in ``db_dir`` (names and paths were checked
    when the manifest was read). SST files are hard-linked (immutable); the small mutable ones
    (MANIFEST, CURRENT, OPTIONS) are always copied."""
    for f in manifest.files:
        source = store_dir / f.path
        _check_size(source, f.size, manifest_path)
        _link_or_copy(source, db_dir / f.name)


def apply_changelog(db: Rdict, path: Path, version: int, key_groups: int | None) -> int:
    """Write one changelog's records into ``db``; returns its key-group count (checked against
    the previous file's, since the count is fixed for a checkpoint)."""
    log_ = read_changelog(path, version, key_groups)
    try:
        rocksdb.write_changelog(db, log_)
    except changelog.CorruptChangelogError as exc:
        raise CheckpointError(str(exc)) from exc
    return log_.key_groups


def read_changelog(path: Path, version: int, key_groups: int | None) -> changelog.Changelog:
    """Read and check one changelog: framing, version, and the key-group count of the files
    before it (None: the first one)."""
    try:
        log_ = changelog.read_file(str(path))
    except changelog.CorruptChangelogError as exc:
        raise CheckpointError(str(exc)) from exc
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if log_.version != version:
        raise CheckpointError(f"{path} holds version {log_.version}, expected {version}: corrupt or misplaced")
    if key_groups is not None and log_.key_groups != key_groups:
        raise CheckpointError(f"{path} was written with {log_.key_groups} key groups, the files before "
                              f"it with {key_groups}: corrupt or mixed checkpoint")
    return log_
