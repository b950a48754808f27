"""The split by files: a scale-up by a multiple from a partition whose version has a snapshot.

Each heir is its parent's RocksDB files, shared with the parent in the checkpoint (its manifest
lists them in the parent's ``ks-files/``, FORMATS.md "The path rule"), plus one small file of
range deletes that hides the key groups the heir does not own, as Flink clips a parent's files
to a new key-group range; where the parent's version is its snapshot plus changelogs, that file
also holds the changelogs' records of the heir's key groups (:func:`replayed_heir`). No key of the
snapshot is counted or rewritten when the snapshot carries its key-group counts (FORMATS.md,
"Key-group counts"): each heir's exact count is the sum of its key groups', once a seek per key
group held (:func:`counts_disagree`), or the pass of a merge by files that writes the parent's
keys of its other new partitions (:func:`held_disagree`), has shown the counts name exactly those.
Without them, or with counts that fail that check, one pass over the parent's keys counts them,
and checks that every key is the parent's.
"""
from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

from ...formats import changelog, keygroups, layout, rocksdb
from ... import checkpoint as ckpt
from ...checkpoint.snapshots import fetch_snapshot
from .counts_through import CountsThrough


def not_owned_ranges(q: int, partitions: int, key_groups: int) -> list[tuple[bytes, bytes]]:
    """The key ranges, whole runs of key groups, that partition ``q`` of ``partitions`` does not
    own (it owns the key groups ``q, q + partitions, ...``): what its heir's range deletes hide."""
    ranges = []
    start = 0
    for g in range(q, key_groups, partitions):
        if g > start:
            ranges.append((keygroups.prefix(start), keygroups.prefix(g)))
        start = g + 1
    if start < key_groups:
        ranges.append((keygroups.prefix(start), keygroups.prefix(key_groups)))
    return ranges


def owned_counts(counts: Mapping[int, int], partition: int, from_partitions: int, key_groups: int,
                 describe: str) -> Counter:
    """The parent's key-group counts, each key group checked to be one the parent owns."""
    for g in counts:
        if not 0 <= g < key_groups or g % from_partitions != partition:
            raise ckpt.CheckpointError(
                f"the key-group counts of partition {partition} of {describe} name key group {g}, which it "
                f"does not own among {key_groups} key groups and {from_partitions} partitions: corrupt or misplaced")
    return Counter(counts)


def counts_disagree(db: Any, counts: Mapping[int, int]) -> str | None:
    """Why ``counts`` do not name exactly the key groups ``db`` holds keys of (None: they do),
    found with one seek per key group held, no key counted: counts that name an empty key group,
    or none for one that holds keys (a foreign or too short key included), are not its files'.
    How many keys each held key group has is taken on trust (FORMATS.md, "Key-group counts")."""
    from rocksdict import ReadOptions

    held: list[int] = []
    read = ReadOptions()
    read.fill_cache(False)
    # The seeks go forward through every file: one read of 2 MiB ahead instead of one per block
    # (RocksDB's own readahead starts over at each seek).
    read.set_readahead_size(2 << 20)
    it = db.iter(read)
    it.seek_to_first()
    while it.valid():
        key = it.key()
        if len(key) < keygroups.PREFIX_BYTES:
            return f"it holds key {key.hex()}, too short to name a key group"
        g = keygroups.key_group_of_stored_key(key)
        if g not in counts:  # a key group no count names: no need to look further
            break
        held.append(g)
        it.seek(keygroups.prefix(g + 1))  # g is one the counts name, so below keyGroups
    try:
        it.status()
    except Exception as exc:
        raise ckpt.CheckpointError(f"cannot read the keys: a corrupt file: {exc}") from exc
    if it.valid():
        held.append(keygroups.key_group_of_stored_key(it.key()))
    return held_disagree(held, counts)


def held_disagree(held: Sequence[int], counts: Mapping[int, int]) -> str | None:
    """Why ``counts`` do not name exactly the key groups ``held`` (in key order: those a pass
    over the files met) as the ones with keys; None when they do."""
    expected = sorted(g for g, c in counts.items() if c > 0)
    for i, g in enumerate(held):
        if i >= len(expected) or expected[i] != g:
            return f"key group {g} holds keys, the counts say {counts.get(g, 0)}"
    if len(held) < len(expected):
        return f"key group {expected[len(held)]} holds no key, the counts say {counts[expected[len(held)]]}"
    return None


def count_by_key_group(db: Any, partition: int, from_partitions: int, key_groups: int, describe: str) -> Counter:
    """The parent's keys per key group, in one pass over the keys alone; a key of a key group
    the parent does not own, or too short to name one, is refused."""
    from rocksdict import ReadOptions

    prefix_bytes = keygroups.PREFIX_BYTES
    counts: Counter = Counter()

    def run_of(prefix: bytes) -> tuple[int, bytes]:
        group = keygroups.key_group_of_stored_key(prefix) if len(prefix) == prefix_bytes else -1
        if not 0 <= group < key_groups or group % from_partitions != partition:
            raise ckpt.CheckpointError(
                f"partition {partition} of {describe} holds a key of key group {group} (key prefix "
                f"{prefix.hex()}), which it does not own among {key_groups} key groups and "
                f"{from_partitions} partitions: corrupt or misplaced")
        return group, keygroups.prefix(group + 1)

    read = ReadOptions()
    read.fill_cache(False)  # each block is read once
    # Keys come sorted, so a key group's run ends at the first key at or past the next prefix.
    g, bound, run, seen, key = -1, b"", 0, 0, None
    for key in db.keys(read_opt=read):
        if key >= bound:
            if g >= 0:
                counts[g] = seen - run
                run = seen
            g, bound = run_of(key[:prefix_bytes])
        seen += 1
    if g >= 0:
        counts[g] = seen - run
    try:
        rocksdb.check_scan_end(db, key)
    except rocksdb.ScanError as exc:
        raise ckpt.CheckpointError(f"partition {partition} of {describe} cannot be read whole, a corrupt "
                                   f"file: {exc}") from exc
    return counts


def clipped_heir(parent: Any, scratch: Path, q: int, partitions: int, key_groups: int, hide: bool = True) -> Path:
    """A RocksDB checkpoint in ``scratch`` of the parent's files (hard links) plus one file of
    range deletes hiding what heir ``q`` does not own (``hide=False``: a heir that owns every
    key group of its parent, and no file); returns the checkpoint's directory."""
    from rocksdict import Checkpoint

    scratch.mkdir()
    Checkpoint(parent).create_checkpoint(str(scratch / "db"))
    return _cut(scratch, q, partitions, key_groups, hide=hide)


def _cut(scratch: Path, q: int, partitions: int, key_groups: int, batch: Any = None, hide: bool = True) -> Path:
    """Open the parent's files in ``scratch/db`` (its compactions off, so they stay as they are),
    write the range deletes hiding what heir ``q`` does not own (unless not ``hide``), with
    ``batch`` (records of key groups the heir owns, so the two never overlap), into one memtable
    flushed once; checkpoint it to ``scratch/snapshot``."""
    from rocksdict import Checkpoint, WriteBatch

    db_dir, snapshot = scratch / "db", scratch / "snapshot"
    db = rocksdb.open_db(db_dir, bulk_load=False, compactions=False)
    try:
        if batch is None:
            batch = WriteBatch(raw_mode=True)
        for begin, end in not_owned_ranges(q, partitions, key_groups) if hide else ():
            batch.delete_range(begin, end)
        if not batch.is_empty():
            db.write(batch)
            db.flush()
        Checkpoint(db).create_checkpoint(str(snapshot))
    finally:
        db.close()
    shutil.rmtree(db_dir)
    return snapshot


def replayed_logs(rebuilt: Any) -> tuple | None:
    """The changelogs the rebuild replayed on its base snapshot, oldest first; None where
    :func:`replayed_heir` cannot cut them by heir (a base with a replay of its own, a changelog
    written from empty: the snapshot's files are then not the base of every key)."""
    manifest = rebuilt.manifest
    if manifest is None or manifest.replay is not None or not rebuilt.logs:
        return None
    return None if any(log_.meta.get(changelog.FROM_EMPTY) is True for log_ in rebuilt.logs) else rebuilt.logs


def replayed_batches(logs: tuple, heirs: range, partitions: int, owner: int, from_partitions: int,
                     key_groups: int, describe: str, counts: CountsThrough | None = None) -> dict[int, Any]:
    """One write batch per heir of ``partitions``, in one pass over ``logs``: the records of the
    key groups it owns (a merge by files writes those of its other new partitions apart). A
    delete is kept by every heir unless its key is certainly another heir's (a key too short for
    a key group sorts below every range delete). A put of a key that old partition ``owner`` of
    ``from_partitions`` does not own is refused, as a pass over the rebuilt version's keys would.
    ``counts``: brought through the changelogs in the same pass."""
    from rocksdict import WriteBatch

    batches = {q: WriteBatch(raw_mode=True) for q in heirs}
    everyone = list(batches.values())
    prefix_bytes, group_of = keygroups.PREFIX_BYTES, keygroups.key_group_of_stored_key

    after: dict[bytes, bool] = {}  # the keys of the changelog fed: there after it (for counts)
    tracked = counts is not None

    def put(key: bytes, value: bytes) -> None:
        group = group_of(key) if len(key) >= prefix_bytes else -1
        if not 0 <= group < key_groups or group % from_partitions != owner:
            raise _ForeignKey(key)
        if (batch := batches.get(group % partitions)) is not None:  # else a new partition it is not the base of
            batch.put(key, value)
        if tracked:
            after[key] = True

    def delete(key: bytes) -> None:
        if len(key) < prefix_bytes:
            for batch in everyone:
                batch.delete(key)
        elif (batch := batches.get(group_of(key) % partitions)) is not None:
            batch.delete(key)
        if tracked:
            after[key] = False

    for log_ in logs:
        try:
            if counts is None:
                log_.feed(put, delete, unknown_keys=False)
            else:
                counts.feed(log_, put, delete, after)
                after.clear()
        except _ForeignKey as exc:
            key = exc.args[0]
            raise ckpt.CheckpointError(
                f"changelog {log_.source} of partition {owner} of {describe} puts key {key.hex()}, which names no "
                f"key group it owns among {key_groups} key groups and {from_partitions} partitions: corrupt or "
                "misplaced") from None
        except changelog.CorruptChangelogError as exc:
            raise ckpt.CheckpointError(str(exc)) from None
    return batches


class _ForeignKey(Exception):
    """A changelog's put of a key its partition does not own (raised out of the parser's callback)."""


def replayed_heir(files: Any, manifest: Any, batch: Any, scratch: Path, q: int, partitions: int,
                  key_groups: int, hide: bool = True) -> Path:
    """Heir ``q`` as its parent's base snapshot (hard links) plus one new file: the range deletes
    of :func:`clipped_heir` and ``batch``, its records of the changelogs (:func:`replayed_batches`),
    in one memtable flushed once; returns the checkpoint's directory."""
    (scratch / "db").mkdir(parents=True)
    fetch_snapshot(files.storage, files.listing, manifest, str(files.manifest_path(manifest.version)), scratch / "db")
    return _cut(scratch, q, partitions, key_groups, batch, hide)


def shared_files(manifest: Any, parent: int, heir: int) -> dict[tuple[str, int], str]:
    """The parent snapshot's table files, by (name, size), as paths a manifest of ``heir`` lists
    them by (they stay where they are: in the parent's ``ks-files/``, or in the partition the
    parent itself shares them from)."""
    out = {}
    for f in manifest.files if manifest is not None else ():
        if layout.is_table_file(f.name):
            owner, name = layout.owner_of(f.path)
            out[(f.name, f.size)] = layout.path_from(parent if owner is None else owner, name, heir)
    return out
