"""How keyedstate's RocksDB databases are configured: the on-disk form of every snapshot.

The state server writes these databases, the JVM reads them natively (``NativeReader.scala``,
Spark's rocksdbjni, a secondary instance) and the offline tools rebuild and cut them, so the
choices that decide what the files contain live here once.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Callable, Iterable, Iterator, MutableMapping

from rocksdict import (AccessType, BlockBasedOptions, Cache, DBCompressionType, MemtableFactory, Options, Rdict,
                       WriteBatch, WriteBufferManager, WriteOptions)

from . import changelog, keygroups


class MemoryPool:
    """One bound on the RocksDB memory of every database of a process, the way Spark's RocksDB
    provider bounds it (boundedMemoryUsage): a shared block cache that also holds the index
    and filter blocks, with the memtables charged to it by a write buffer manager."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.cache = Cache(capacity)
        # Half for memtables, as Spark's provider does (writeBufferCacheRatio 0.5).
        self.write_buffers = WriteBufferManager.new_write_buffer_manager_with_cache(capacity // 2, False, self.cache)

    @property
    def sst_file_bytes(self) -> int:
        """Target size of compaction's output files. A compaction builds each output file's
        Bloom filter from 8 bytes per key, held until the file is done and outside any cache: with
        RocksDB's 64 MiB files of small records that is tens of MiB above the pool (measured: a
        server's peak RSS grew 32 MiB over 3.5M keys with a 10 MiB pool; 4 MiB with 4 MiB files).
        Files of half the pool keep that within about half the pool."""
        return min(64 << 20, max(2 << 20, self.capacity // 2))

    def resize(self, capacity: int) -> None:
        self.capacity = capacity
        self.cache.set_capacity(capacity)
        self.write_buffers.set_buffer_size(capacity // 2)

    def usage(self) -> int:
        return self.cache.get_usage()


def _options(bulk_load: bool, pool: MemoryPool | None = None) -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_max_background_jobs(2)
    # LZ4 blocks decompress in ~10 us in the JVM's native reads where Snappy's took ~50 us
    # (measured with Spark's rocksdbjni); Bloom filters let a point read skip the L0 files
    # that cannot hold the key. Spark's RocksDB provider makes the same two choices.
    options.set_compression_type(DBCompressionType.lz4())
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    if pool is not None:
        table.set_block_cache(pool.cache)
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        options.set_write_buffer_manager(pool.write_buffers)
        options.set_target_file_size_base(pool.sst_file_bytes)
    else:
        table.set_block_cache(Cache(STORE_BLOCK_CACHE_BYTES))
    options.set_block_based_table_factory(table)
    if bulk_load:
        # A vector memtable takes a whole changelog at ~0.07 us a key instead of ~1 us for the
        # skip list (RocksDB writes hold the GIL); it must not be read while mutable, so the
        # owner flushes before reading.
        options.set_memtable_factory(MemtableFactory.vector())
        options.set_allow_concurrent_memtable_write(False)
    return options


STORE_BLOCK_CACHE_BYTES = 8 << 20
"""A database's block cache when no memoryBudget pools them: Spark's RocksDB provider's default
(blockCacheSizeMB, 8 per store instance). RocksDB's own default is 32 MiB a database, which a
store's counting reads (multi-gets of keys of unknown existence) fill and keep. The JVM's
point reads have their own cache (nativeBlockCacheBytes)."""

SST_FILE_BYTES = 64 << 20
"""Size of the SST files written outside a database (a rescale's): RocksDB's default target
for compaction output, so that a later compaction into their level rewrites a file at a time."""


def sst_options() -> Options:
    """Options for SST files written outside a database and ingested later (a rescale's): the
    same table format as the databases' own files (LZ4, Bloom filters), so that a partition
    built from them reads as fast as one that was compacted."""
    return _options(bulk_load=False)


def open_db(path: Path, *, bulk_load: bool = True, pool: MemoryPool | None = None,
            compactions: bool = True) -> Rdict:
    """Open (creating) a database for writing whole changelogs at a time; the WAL is off
    because durability comes from the changelogs in the checkpoint. ``pool``: the process's
    memory bound (None: each database has its own :data:`STORE_BLOCK_CACHE_BYTES` of block
    cache and RocksDB's default memtables). ``compactions=False``: no automatic compaction
    rewrites the files it opened with (their names stay those of a snapshot's)."""
    options, family = _options(bulk_load, pool), _options(bulk_load, pool)
    if not compactions:
        options.set_disable_auto_compactions(True)
        family.set_disable_auto_compactions(True)
    # Explicit column-family options: otherwise rocksdict takes them from the directory's
    # OPTIONS file, and RocksDB refuses a vector memtable without its other settings.
    db = Rdict(str(path), options=options, column_families={"default": family})
    write_options = WriteOptions()
    write_options.disable_wal = True
    db.set_write_options(write_options)
    return db


def open_read_only(path: Path) -> Rdict:
    """Open a database read-only (nothing in the directory is rewritten), with the table options
    its files were written with: RocksDB uses a file's Bloom filter only for a reader configured
    with the same filter policy, and without it every point read of an absent key searches a
    data block in each file that may hold it."""
    return Rdict(str(path), options=_options(bulk_load=False),
                 column_families={"default": _options(bulk_load=False)}, access_type=AccessType.read_only())


class ScanError(RuntimeError):
    """A scan of a database stopped before its end: RocksDB's message (a corrupt file) or what
    is known of where."""


def check_scan_end(db: Rdict, last: bytes | None, from_key: bytes | None = None) -> None:
    """Raise :class:`ScanError` unless ``last`` (None: nothing was given from ``from_key`` on)
    is really the last entry of ``db``: a fresh iterator past it must end without an error.
    Call it after a loop over ``items()``/``keys()``, which rocksdict ends quietly where RocksDB's
    iterator stops on an error (a block whose checksum does not match), so that a corrupt file
    does not pass for the end of the data; one seek, not a check per entry."""
    it = db.iter()
    if last is not None:
        it.seek(last)
        if it.valid():
            it.next()
    elif from_key is not None:
        it.seek(from_key)
    else:
        it.seek_to_first()
    try:
        it.status()
    except Exception as exc:  # rocksdict raises plain Exceptions with RocksDB's message
        raise ScanError(f"reading {db.path()} failed after {'key ' + last.hex() if last else 'its start'}: {exc}") from exc
    if it.valid():
        raise ScanError(f"a scan of {db.path()} ended after {'key ' + last.hex() if last else 'its start'} "
                        f"though key {it.key().hex()} follows")


def write_changelog(db: Rdict, log_: changelog.Changelog, counts: MutableMapping[int, int] | None = None) -> None:
    """Write a changelog's records into ``db`` as one write batch: the replay of the offline
    tools (the state server writes its chunks with the same parser, :meth:`Changelog.feed`).
    A corrupt changelog raises before anything is written. A version written from empty (an
    offline writer's, ``fromEmpty``) is a base, not a delta: it replaces what ``db`` held.
    ``counts``: the keys by key group of what ``db`` held, brought to what it holds after
    (unchanged when the changelog does not parse)."""
    from_empty = log_.meta.get(changelog.FROM_EMPTY) is True
    batch = WriteBatch(raw_mode=True)
    if from_empty:
        batch.delete_range(b"", EVERY_STORED_KEY_BELOW)
    change: Counter[int] = Counter()  # added to counts once the changelog is known whole
    fed = log_.feed(batch.put, batch.delete, unknown_keys=counts is not None, counts=None if counts is None else change)
    if counts is not None:
        if from_empty:
            # After the range delete no stored key is left: a put of an unknown key adds it, a
            # delete of one takes nothing away.
            keygroups.count_key_groups(change, fed.unknown_puts, 1)
            counts.clear()
        else:
            count_unknown(db, fed, change)  # asked of db before the batch is written
        for group, n in change.items():
            counts[group] = counts.get(group, 0) + n
    db.write(batch)


def multi_get(db: Rdict, keys: list[bytes]) -> Iterator[bytes | None]:
    """The value of each of ``keys`` (None: absent), asked a slice at a time."""
    for i in range(0, len(keys), MULTI_GET_KEYS):
        yield from db.get(keys[i:i + MULTI_GET_KEYS])


MULTI_GET_KEYS = 16_384
"""Keys asked of RocksDB in one multi-get. It holds per-key state for every key it is given, so
a large changelog whose keys' existence the writer did not know is asked a slice at a time:
memory stays bounded by the slice, not by the changelog."""


def count_unknown(db: Rdict | None, fed: changelog.Fed, counts: MutableMapping[int, int] | None,
                  existed: Callable[[list[bytes]], Iterable[bool]] | None = None) -> int:
    """The change in ``db``'s keys from the records :meth:`Changelog.feed` passed on without
    saying whether their key was there (asked of ``db`` before they are written, or of
    ``existed``, whether each key was there before these records, where ``db`` alone cannot
    say), added to ``counts`` by key group when given; what their ops said is in ``fed`` already."""
    if existed is None:
        existed = lambda keys: (value is not None for value in multi_get(db, keys))  # noqa: E731
    delta = 0
    for keys, sign in ((fed.unknown_puts, 1), (fed.unknown_deletes, -1)):
        if not keys:
            continue
        # A put of an absent key, a delete of a present one.
        changed = [key for key, there in zip(keys, existed(keys)) if there != (sign > 0)]
        delta += sign * len(changed)
        if counts is not None:
            keygroups.count_key_groups(counts, changed, sign)
    return delta


EVERY_STORED_KEY_BELOW = b"\xff" * 5
"""Above every stored key: each starts with its 4-byte key group, and key groups are below 2^30."""
