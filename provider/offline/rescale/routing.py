"""Routing a rebuilt old partition's keys into SST files, one series per new partition (its heir).

A key goes to the owner of its key group when the new count divides the key-group count, else
to Spark's own partition hash of its partition columns. (A partition that is changelogs only is
routed record by record instead: :mod:`keyedstate.offline.routing`.)
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ...formats import keygroups, rocksdb
from ...formats.stored import KeyLayout
from ... import checkpoint as ckpt

if TYPE_CHECKING:
    from .tasks import SplitTask

class HeirFiles:
    """The SST files a split writes for each new partition, in key order (non-overlapping),
    named ``to-<q>-<n>.sst``. A file stops at about SST_FILE_BYTES / ``open_writers`` (at least
    2 MiB): an SST writer holds its file's Bloom-filter input, 8 bytes a key, until it finishes,
    so the writers open at once stay within about one RocksDB file's worth; and a later
    compaction into the bottom level then rewrites a file, not a partition."""

    def __init__(self, directory: Path, open_writers: int) -> None:
        self._directory = directory
        self._limit = max(min(2 << 20, rocksdb.SST_FILE_BYTES), rocksdb.SST_FILE_BYTES // max(1, open_writers))
        self._options = rocksdb.sst_options()
        self._writers: dict[int, Any] = {}
        self._files: dict[int, list[Path]] = {}

    def writer(self, q: int) -> Any:
        """New partition ``q``'s current writer (a new file once the current one is full)."""
        from rocksdict import SstFileWriter

        writer = self._writers.get(q)
        if writer is None or writer.file_size() >= self._limit:
            if writer is not None:
                writer.finish()
            names = self._files.setdefault(q, [])
            path = self._directory / f"to-{q}-{len(names):05d}.sst"
            writer = self._writers[q] = SstFileWriter(options=self._options)
            writer.open(str(path))
            names.append(path)
        return writer

    def finish(self) -> dict[int, list[Path]]:
        """Finish every open file; the files by new partition."""
        writers, self._writers = self._writers, {}
        for writer in writers.values():
            writer.finish()
        return self._files


def write_by_key_group(db: Any, task: SplitTask, out: HeirFiles) -> dict[int, int]:
    """Scan a rebuilt old partition once, in key order, into each key's new partition (the
    owner of its key group); returns the keys written per new partition. Keys come in runs of
    one key group, routed once per run, which keeps the loop near the scan's and the SST
    write's own cost: one pass for all heirs, where a compaction per heir would cost k passes.
    A key of a key group the old partition does not own is refused (:func:`_owner_of_run`), as
    is a scan that RocksDB stops on an error (a corrupt file), which rocksdict's ``items()``
    would end quietly. (A short key sorting inside a run, which only a forged file that passed
    the checksums can hold, goes with that run, as any load of the partition keeps it.)"""
    from rocksdict import ReadOptions

    owner_of_run = _owner_of_run(task)
    counts: dict[int, int] = {}
    read = ReadOptions()
    read.fill_cache(False)  # each block is read once
    # Keys come sorted (RocksDB's bytewise order is Python's), so a run ends at the first key at
    # or past the next key group's prefix: one comparison a key.
    q, writer, bound, run, seen, key = -1, None, b"", 0, 0, None
    for key, value in db.items(read_opt=read):
        if key >= bound:
            if writer is not None:
                counts[q] = counts.get(q, 0) + seen - run
            run = seen
            _, q, bound = owner_of_run(key)
            writer = out.writer(q)
        writer[key] = value
        seen += 1
    if writer is not None:
        counts[q] = counts.get(q, 0) + seen - run
    _check_scanned(db, key, task)
    return counts


def write_skipping(db: Any, task: SplitTask, out: HeirFiles, skip: set[int]) -> tuple[dict[int, int], list[int]]:
    """:func:`write_by_key_group` for the new partitions not in ``skip`` (those built on this
    partition's files): a skipped key group's keys are passed over with one seek, neither read
    nor counted. Returns the keys written per new partition, and every key group met (in key
    order, a run's first key read whether written or skipped), which checks the key-group counts
    (:func:`.clip.held_disagree`) without a pass of their own. One iterator throughout: a seek
    costs a fraction of a new iterator, and a third to two thirds of the key groups are skipped."""
    from rocksdict import ReadOptions

    owner_of_run = _owner_of_run(task)
    counts: dict[int, int] = {}
    held: list[int] = []
    read = ReadOptions()
    read.fill_cache(False)
    it = db.iter(read)
    it.seek_to_first()
    key = it.key()  # None once the iterator is past the end (or stopped on an error)
    while key is not None:
        group, q, bound = owner_of_run(key)
        held.append(group)
        if q in skip:
            it.seek(bound)
            key = it.key()
            continue
        writer, written = out.writer(q), 0
        while key is not None and key < bound:
            writer[key] = it.value()
            written += 1
            it.next()
            key = it.key()
        counts[q] = counts.get(q, 0) + written
    try:
        it.status()
    except Exception as exc:  # rocksdict raises plain Exceptions with RocksDB's message
        raise _unreadable(task, exc) from exc
    return counts, held


def _owner_of_run(task: SplitTask) -> Callable[[bytes], tuple[int, int, bytes]]:
    """For the first key of a run: (its key group, that key group's new partition, the prefix
    that ends the run). A key of a key group the old partition does not own is refused (when the
    old count divides the key-group count, as Spark's routing then makes it), as is a key too
    short to name its key group."""
    n, key_groups, prefix_bytes = task.partitions, task.key_groups, keygroups.PREFIX_BYTES
    old_n = task.from_partitions if keygroups.divides(task.from_partitions, key_groups) else 0

    def owner_of_run(key: bytes) -> tuple[int, int, bytes]:
        prefix = key[:prefix_bytes]
        group = keygroups.key_group_of_stored_key(prefix) if len(prefix) == prefix_bytes else -1
        if not 0 <= group < key_groups or (old_n and group % old_n != task.partition):
            raise ckpt.CheckpointError(
                f"partition {task.partition} of {task.store_path} holds a key of key group {group} "
                f"(key prefix {prefix.hex()}), which it does not own among {key_groups} key groups "
                f"and {task.from_partitions} partitions: corrupt or misplaced")
        return group, group % n, keygroups.prefix(group + 1)

    return owner_of_run


def _check_scanned(db: Any, last: bytes | None, task: SplitTask) -> None:
    try:
        rocksdb.check_scan_end(db, last)
    except rocksdb.ScanError as exc:
        raise _unreadable(task, exc) from exc


def _unreadable(task: SplitTask, exc: Exception) -> ckpt.CheckpointError:
    return ckpt.CheckpointError(f"version {task.version} of partition {task.partition} ({task.store_path}) "
                                f"cannot be read whole, a corrupt file: {exc}")


def write_by_hash(db: Any, task: SplitTask, out: HeirFiles) -> dict[int, int]:
    """Like :func:`write_by_key_group` when N does not divide the key-group count: each key
    goes to Spark's own partition hash of its partition columns (~3 us a key with the hash)."""
    from ..sparkhash import RowHasher, read_key_schema

    layout = KeyLayout.from_json(task.hash_spec["keyLayout"])
    hasher = RowHasher(read_key_schema(task.hash_spec["schemaFile"]), layout.partition_key_columns)
    row_offset, n = layout.row_offset, task.partitions
    counts: dict[int, int] = {}
    key = None
    for key, value in db.items():
        q = hasher.hash(key, row_offset(key)) % n
        out.writer(q)[key] = value
        counts[q] = counts.get(q, 0) + 1
    _check_scanned(db, key, task)
    return counts


