"""Routing a rebuilt old partition's keys into SST files, one series per new partition (its heir).

A key goes to the owner of its key group when the new count divides the key-group count, else
to Spark's own partition hash of its partition columns. (A partition that is changelogs only is
routed record by record instead: :mod:`keyedstate.offline.routing`.)
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

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


def write_by_key_group(db: Any, task: SplitTask, out: HeirFiles, skip: set[int] = frozenset()) -> dict[int, int]:
    """Scan a rebuilt old partition once, in key order, into each key's new partition (the
    owner of its key group); returns the keys written per new partition. Keys come in runs of
    one key group, routed once per run, which keeps the loop near the scan's and the SST
    write's own cost: one pass for all heirs, where a compaction per heir would cost k passes.
    A key of a key group the old partition does not own is refused (when the old count
    divides the key-group count, as Spark's routing then makes it), as is a run that starts
    with a key too short to name its key group; so is a scan that RocksDB stops on an error (a
    corrupt file), which rocksdict's ``items()`` would end quietly. (A short key sorting inside
    a run, which only a forged file that passed the checksums can hold, goes with that run, as
    any load of the partition keeps it.) The key groups of the new partitions in ``skip`` (built
    on this partition's files) are passed over with a seek to the next key group, their keys
    neither read nor counted."""
    from rocksdict import ReadOptions

    n, key_groups, prefix_bytes = task.partitions, task.key_groups, keygroups.PREFIX_BYTES
    old_n = task.from_partitions if keygroups.divides(task.from_partitions, key_groups) else 0
    counts: dict[int, int] = {}

    def writer_for(prefix: bytes) -> tuple[int, Any, bytes]:
        group = keygroups.key_group_of_stored_key(prefix) if len(prefix) == prefix_bytes else -1
        if not 0 <= group < key_groups or (old_n and group % old_n != task.partition):
            raise ckpt.CheckpointError(
                f"partition {task.partition} of {task.store_path} holds a key of key group {group} "
                f"(key prefix {prefix.hex()}), which it does not own among {key_groups} key groups "
                f"and {task.from_partitions} partitions: corrupt or misplaced")
        return group % n, None if group % n in skip else out.writer(group % n), keygroups.prefix(group + 1)

    read = ReadOptions()
    read.fill_cache(False)  # each block is read once
    # Keys come sorted (RocksDB's bytewise order is Python's), so a run ends at the first key at
    # or past the next key group's prefix: one comparison a key.
    q, writer, bound, run, seen, key, start = -1, None, b"", 0, 0, None, None
    while True:  # one pass from ``start``, until the first key group to pass over
        passed_over = None
        for key, value in db.items(from_key=start, read_opt=read):
            if key >= bound:
                if writer is not None:
                    counts[q] = counts.get(q, 0) + seen - run
                run = seen
                q, writer, bound = writer_for(key[:prefix_bytes])
                if writer is None:
                    passed_over = bound
                    break
            writer[key] = value
            seen += 1
        if passed_over is None:
            break
        start, key = passed_over, None
    if writer is not None:
        counts[q] = counts.get(q, 0) + seen - run
    _check_scanned(db, key, task, start)
    return counts


def _check_scanned(db: Any, last: bytes | None, task: SplitTask, start: bytes | None = None) -> None:
    try:
        rocksdb.check_scan_end(db, last, start)
    except rocksdb.ScanError as exc:
        raise ckpt.CheckpointError(f"version {task.version} of partition {task.partition} ({task.store_path}) "
                                   f"cannot be read whole, a corrupt file: {exc}") from exc


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


