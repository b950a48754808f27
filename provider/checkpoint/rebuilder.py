"""The one rebuilder: a version of a store partition in a private local RocksDB, the way the
JVM's ``VersionLoader`` loads it (FORMATS.md, "Loading a version").

The plans (:mod:`.plans`) are tried best first. A plan's base snapshot that cannot be used (its
manifest corrupt, truncated, foreign or naming files it may not; a file missing or of the wrong
size; RocksDB refusing the files; its replay unreadable; under checkpoint format 1, another run's
attempt of its version, :func:`.manifest.of_another_run`) is skipped with a warning naming it,
in favour of the next plan. A changelog that cannot be read fails the rebuild: every plan after
it needs it too. The checkpoint's files are never opened in place (RocksDB rewrites MANIFEST
and CURRENT when it opens read-write): they are fetched (hard links for local storage).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ..formats import changelog, key_group_counts, layout, rocksdb
from ..formats import manifest as mf
from .errors import CheckpointError
from .listing import StorePartition
from .plans import NoPlan, Plan, plans
from .snapshots import check_size, fetch_snapshot, read_partition_manifest
from .storage import LocalStorage, Storage, inside

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rebuilt:
    """A private RocksDB copy holding one version of a store partition."""

    db: Any
    chain: list  # (version, id) newest first, down to the base (a snapshot's, or (0, None))
    key_groups: int | None
    manifest: mf.Manifest | None  # of the base snapshot
    skipped: tuple[str, ...] = ()  # unusable snapshots passed over, and why (naming them)
    # Keys by key group (asked for with count_key_groups=True); None: the base snapshot has none.
    key_group_counts: Counter | None = None
    logs: tuple = ()  # the changelogs applied on the base, oldest first (if asked to keep them)
    # False: db holds the base alone and logs the changelogs still to apply (apply_kept_logs).
    applied: bool = True

    @property
    def base_snapshot(self) -> int | None:
        return self.chain[-1][0] or None

    @property
    def changelogs_applied(self) -> int:
        return len(self.chain) - 1


def read_changelog(storage: Storage, sp: StorePartition, version: int, uid: str | None = None,
                   key_groups: int | None = None, path: str | None = None) -> changelog.Changelog:
    """Read and check one changelog (size-capped): framing, version, and the key-group count of
    the files before it (None: the first one). ``path``: a file other than the version's own."""
    p = path or sp.changelog_path(storage, version, uid)
    try:
        data = storage.read_bytes(p, layout.MAX_CHANGELOG_BYTES, "changelog")
    except OSError as exc:
        raise CheckpointError(f"cannot read changelog {p}: {exc}") from None
    try:
        log_ = changelog.decode(data, p)
    except changelog.CorruptChangelogError as exc:
        raise CheckpointError(str(exc)) from None
    if log_.version != version:
        raise CheckpointError(f"{p} holds version {log_.version}, expected {version}: corrupt or misplaced")
    if key_groups is not None and log_.key_groups != key_groups:
        raise CheckpointError(f"{p} was written with {log_.key_groups} key groups, the files before it with "
                              f"{key_groups}: corrupt or mixed checkpoint")
    return log_


def changelog_meta(storage: Storage, sp: StorePartition, version: int, uid: str | None) -> dict:
    """A changelog's header; a local file's body is not read."""
    p = sp.changelog_path(storage, version, uid)
    try:
        if isinstance(storage, LocalStorage):  # the header alone, opened without following a link
            return changelog.read_file_meta(inside(storage.root, p))
        return changelog.read_meta(storage.read_bytes(p, layout.MAX_CHANGELOG_BYTES, "changelog"), p)
    except changelog.CorruptChangelogError as exc:
        raise CheckpointError(str(exc)) from None
    except OSError as exc:
        raise CheckpointError(f"cannot read changelog {p}: {exc}") from None


def partition_plans(storage: Storage, sp: StorePartition, version: int, uid: str | None) -> Iterator[Plan]:
    """:func:`.plans.plans` for one store partition's listing."""
    return plans(sp.changelogs, sp.snapshots, version, uid,
                 lambda v, i: changelog_meta(storage, sp, v, i), lambda v, i: sp.changelog_path(storage, v, i))


def of_another_run(storage: Storage, sp: StorePartition, version: int, manifest: mf.Manifest) -> str | None:
    """Why snapshot ``version`` (checkpoint format 1) is of another run's attempt of the version
    than its changelog, else None; an unreadable changelog header is a reason too."""
    if manifest.run_id is None or (version, None) not in sp.changelogs:
        return None
    path = sp.changelog_path(storage, version)
    try:
        committed = changelog_meta(storage, sp, version, None).get(changelog.RUN_ID)
    except CheckpointError as exc:
        return f"cannot be checked against {path}: {exc}"
    return mf.of_another_run(manifest, committed, path)


def cannot_rebuild(sp: StorePartition, version: int, problems: list[str]) -> CheckpointError:
    hint = (" (deleted by cleanup, or lost: only retained versions can be read)"
            if problems and problems[-1].startswith("missing ") else "")
    return CheckpointError(f"cannot rebuild version {version} of {sp.describe()}: {'; '.join(problems)}{hint}")


@contextlib.contextmanager
def rebuild(storage: Storage, sp: StorePartition, version: int, uid: str | None = None,
            workdir: str | None = None, manifests: dict | None = None,
            skip_unusable: bool = True, count_key_groups: bool = False,
            compactions: bool = True, keep_logs: bool = False, apply_logs: bool = True) -> Iterator[Rebuilt]:
    """A private local RocksDB holding ``version`` (deleted on exit). ``manifests``: manifests
    already read, by version (format 1; a value may be the error reading it gave).
    ``skip_unusable=False``: a base snapshot that cannot be used fails the rebuild, naming why
    (for a check of that very snapshot); one of another run is still passed over.
    ``count_key_groups``: keep the base snapshot's key-group counts (FORMATS.md, "Key-group
    counts") exact through the changelogs applied on it, asking RocksDB whether the keys their
    writer did not know were there. ``compactions=False``: no automatic compaction runs, so the
    base snapshot's SST files stay live as they are and the replay adds only its flush's files (a
    split by files shares them). ``keep_logs``: the changelogs applied stay decoded in
    :attr:`Rebuilt.logs` (a caller that reads them again); otherwise each is freed once applied.
    ``apply_logs=False``: the changelogs are read and checked but not applied: the db holds the
    base snapshot (key-group counts its), :attr:`Rebuilt.logs` what :func:`apply_kept_logs`
    would apply (for a caller that can use the base and the records apart)."""
    problems: list[str] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="keyedstate-rebuild-", dir=workdir) as tmp:
        db_dir = Path(tmp) / "db"
        found = None
        for plan in partition_plans(storage, sp, version, uid):
            if isinstance(plan, NoPlan):
                problems.append(plan.reason)
                continue
            if db_dir.exists():
                shutil.rmtree(db_dir)
            db_dir.mkdir()
            try:
                found = plan, *_open_base(storage, sp, plan, uid, db_dir, manifests or {}, count_key_groups,
                                          compactions)
            except _Unusable as exc:
                if not skip_unusable and not isinstance(exc, _OfAnotherRun):
                    raise CheckpointError(str(exc)) from None
                source = sp.manifest_path(storage, *plan[-1])
                log.warning("skipping snapshot %s in favour of an older one plus changelogs: %s", source, exc)
                skipped.append(f"snapshot {source} is unusable ({exc})")
                problems.append(skipped[-1])
                continue
            break
        if found is None:
            raise cannot_rebuild(sp, version, problems)
        plan, db, manifest, key_groups, counts = found
        try:
            to_apply = list(reversed(plan[:-1]))
            logs = []
            for v, i in to_apply:
                log_ = read_changelog(storage, sp, v, i, key_groups)
                key_groups = log_.key_groups
                if apply_logs:
                    _apply(db, log_, counts)
                if keep_logs or not apply_logs:
                    logs.append(log_)
            applied = apply_logs or not to_apply  # else apply_kept_logs applies them
            replayed = manifest is not None and bool(manifest.replay)
            if applied and (to_apply or replayed):  # one flush for the replay and the changelogs
                db.flush()
            yield Rebuilt(db, list(plan), key_groups, manifest, tuple(skipped), counts, tuple(logs), applied=applied)
        finally:
            db.close()


def apply_kept_logs(rebuilt: Rebuilt) -> Rebuilt:
    """``rebuilt`` with the changelogs a ``rebuild(apply_logs=False)`` kept applied (its counts
    brought along, in place), as ``rebuild`` itself would have; itself if they are."""
    if rebuilt.applied:
        return rebuilt
    for log_ in rebuilt.logs:
        _apply(rebuilt.db, log_, rebuilt.key_group_counts)
    rebuilt.db.flush()
    return dataclasses.replace(rebuilt, applied=True)


class _Unusable(CheckpointError):
    """The plan's base snapshot cannot be used; the next plan may do."""


class _OfAnotherRun(_Unusable):
    """The plan's base snapshot is of another run's attempt of its version (format 1)."""


def _open_base(storage: Storage, sp: StorePartition, plan: tuple, uid: str | None, db_dir: Path,
               manifests: dict, count_key_groups: bool,
               compactions: bool) -> tuple[Any, mf.Manifest | None, int | None, Counter | None]:
    """The plan's base opened in ``db_dir`` (its replay applied): (db, manifest, key groups,
    key-group counts if asked for and known)."""
    base_v, base_id = plan[-1]
    if base_v == 0:
        return rocksdb.open_db(db_dir, compactions=compactions), None, None, Counter() if count_key_groups else None
    source = sp.manifest_path(storage, base_v, base_id)
    try:
        known = manifests.get(base_v) if base_id is None else None
        if isinstance(known, CheckpointError):
            raise known
        manifest = known or read_partition_manifest(storage, sp, base_v, base_id)
        if uid is None:
            why = of_another_run(storage, sp, base_v, manifest)
            if why is not None:
                raise _OfAnotherRun(f"snapshot manifest {source}: {why}")
        fetch_snapshot(storage, sp, manifest, source, db_dir)
        # The counts are of the snapshot's RocksDB files, before its replay (a replay's alone start empty).
        counts = None
        if count_key_groups:
            counts = key_group_counts.take_beside(db_dir, manifest.key_groups, manifest.num_keys, str(source)) \
                if manifest.files else Counter()
        replay = manifest.replay
        read_only = len(plan) == 1 and replay is None and bool(manifest.files)
        try:
            db = rocksdb.open_read_only(db_dir) if read_only else rocksdb.open_db(db_dir, compactions=compactions)
        except Exception as exc:  # rocksdict raises plain exceptions for unreadable files
            raise CheckpointError(f"the RocksDB files of snapshot manifest {source} cannot be opened: {exc}") from exc
    except _Unusable:
        raise
    except CheckpointError as exc:
        raise _Unusable(str(exc)) from exc
    key_groups = manifest.key_groups
    if replay is not None:  # the snapshot's version itself, as a changelog (snapshots.write_snapshot)
        try:
            rpath = sp.file_path(storage, replay.path)
            check_size(storage, rpath, replay.size, source)
            log_ = read_changelog(storage, sp, base_v, key_groups=key_groups, path=rpath)
            _apply(db, log_, counts)
            key_groups = log_.key_groups
        except CheckpointError as exc:
            db.close()
            raise _Unusable(str(exc)) from exc
    return db, manifest, key_groups, counts


def _apply(db, log_: changelog.Changelog, counts: Counter | None = None) -> None:
    try:
        rocksdb.write_changelog(db, log_, counts)
    except changelog.CorruptChangelogError as exc:
        raise CheckpointError(str(exc)) from None
