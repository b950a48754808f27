"""``inspect`` and ``rescale`` on checkpoints that are not on a local disk.

Those two tools (``inspection.py``, the ``rescale`` package) read and write a local directory with
pathlib, and the rescale's split/merge tasks run in Python workers, which have no py4j. Until
they are ported to :mod:`.storage`, a non-local checkpoint is handled on the driver: the files
they read are downloaded to a local temporary directory (through :class:`.storage.HadoopStorage`:
Spark's CheckpointFileManager with the session's Hadoop conf), the unchanged local tool runs
there, and for a rescale what it created is uploaded back, in commit order: state files first,
then ``offsets/``, then ``commits/`` (the commit is what makes Spark take the new batch, exactly
as for a local rescale), and what it deleted (a rollback) is deleted. Downloading costs the
checkpoint's retained state once; the rescale's tasks must run where that directory is, so a
non-local rescale needs a local-mode session (the command line starts one).
"""
from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .storage import HadoopStorage, Storage, StorageError, open_storage
from ..checkpoint import Checkpoint

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_ORDER = ("state", "offsets", "commits")


def _walk(storage: Storage, path: str, rel: str = "") -> Iterator[tuple[str, int]]:
    for e in storage.list(path):
        if e.name.startswith(".") or e.name.startswith("_keyedstate_migration"):
            continue
        child_rel = f"{rel}/{e.name}" if rel else e.name
        if e.is_dir:
            yield from _walk(storage, storage.join(path, e.name), child_rel)
        else:
            yield child_rel, e.size


@contextlib.contextmanager
def local_copy(storage: Storage, root: str) -> Iterator[tuple[Path, dict[str, int]]]:
    """The checkpoint downloaded into a temporary directory, and its files' sizes by path."""
    with tempfile.TemporaryDirectory(prefix="keyedstate-remote-") as tmp:
        local = Path(tmp) / "checkpoint"
        local.mkdir()
        files = dict(_walk(storage, root))
        for rel in files:
            target = local / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            storage.fetch(storage.join(root, rel), target, link=False)
        try:
            yield local, files
        except (ValueError, RuntimeError) as exc:
            renamed = _at_origin(exc, str(local), root)
            if renamed is None:
                raise
            raise renamed from exc


def _at_origin(exc: BaseException, local: str, root: str) -> BaseException | None:
    """keyedstate's own error, raised by a tool run on the local copy, naming the checkpoint's
    own paths instead of the copy's (which is gone once the error is read); None if nothing to
    rename."""
    text = str(exc)
    if not type(exc).__module__.startswith("keyedstate.") or local not in text:
        return None
    return type(exc)(_renamed(text, local, root))


def _local_files(local: Path) -> dict[str, int]:
    out = {}
    for p in local.rglob("*"):
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(local).parts):
            out[p.relative_to(local).as_posix()] = p.stat().st_size
    return out


def sync_back(storage: Storage, root: str, local: Path, before: dict[str, int]) -> dict[str, int]:
    """Upload files the local tool created (or changed), in commit order; delete the ones it
    deleted (after the uploads: a rollback deletes, it does not create)."""
    after = _local_files(local)
    changed = [rel for rel, size in after.items() if before.get(rel) != size]
    rank = lambda rel: (_ORDER.index(rel.split("/")[0]) if rel.split("/")[0] in _ORDER else 0, rel)  # noqa: E731
    for rel in sorted(changed, key=rank):
        storage.upload(local / rel, storage.join(root, rel))
    gone = [rel for rel in before if rel not in after]
    for rel in sorted(gone, key=rank, reverse=True):  # commits first: an undone batch disappears first
        storage.delete(storage.join(root, rel))
    return {"uploaded": len(changed), "deleted": len(gone)}


def inspect_anywhere(checkpoint: str | os.PathLike, spark: "SparkSession | None" = None) -> dict[str, Any]:
    """``keyedstate.inspect`` on any scheme (a local one directly)."""
    from .checkpoint_format import refuse_checkpoint_format_2
    from .inspection import FORMAT_2_REASON, inspect

    storage = open_storage(checkpoint, spark)
    if storage.local:
        return inspect(checkpoint)
    _refuse_before_download(storage, functools.partial(refuse_checkpoint_format_2, reason=FORMAT_2_REASON), "inspect")
    with local_copy(storage, storage.root) as (local, _):
        report = inspect(local)
    return _renamed(report, str(local), storage.root)


def rescale_anywhere(checkpoint: str | os.PathLike, partitions: int, *, spark: "SparkSession | None" = None,
                     **options: Any):
    """``keyedstate.rescale`` on any scheme (a local one directly); see the module doc."""
    from .rescale import refuse_checkpoint_format_2, rescale

    storage = open_storage(checkpoint, spark)
    if storage.local:
        return rescale(checkpoint, partitions, spark=spark, **options)
    assert isinstance(storage, HadoopStorage)
    master = storage.spark.sparkContext.master
    if not master.startswith("local"):
        raise StorageError(f"{storage.root}: rescaling a checkpoint that is not on a local disk runs its tasks "
                           f"on this machine's copy of it, which the executors of {master} cannot see: run "
                           "`keyedstate rescale` (it starts a local session), or from a local-mode session")
    if not options.get("rollback"):
        _refuse_before_download(storage, refuse_checkpoint_format_2, "rescale")
    with local_copy(storage, storage.root) as (local, before):
        result = rescale(local, partitions, spark=storage.spark, **options)
        sync_back(storage, storage.root, local, before)
    return result


def _refuse_before_download(storage: Storage, refuse: Callable[[Checkpoint, int], None], tool: str) -> None:
    """A tool's refusal of another provider's checkpoint and of the checkpoint's format, checked
    on the store itself: a download of its state would be wasted (the local tool checks again)."""
    ck = Checkpoint(storage)
    ck.refuse_foreign(tool)
    committed = ck.latest_committed() if storage.is_dir(ck.path("commits")) else None
    if committed is not None:
        refuse(ck, committed)


def _renamed(node: Any, old: str, new: str) -> Any:
    if isinstance(node, dict):
        return {k: _renamed(v, old, new) for k, v in node.items()}
    if isinstance(node, list):
        return [_renamed(v, old, new) for v in node]
    if isinstance(node, str) and old in node:
        return node.replace(old, new)
    return node
