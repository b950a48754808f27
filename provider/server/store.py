"""One state store partition: a RocksDB instance that holds exactly one committed version.

The JVM shim buffers a version's writes and ships them here once, at commit, as a changelog
(:mod:`keyedstate.formats.changelog`); between commits the database is read-only, so reads and chunked
scans see a stable version without RocksDB snapshots. Durability comes from the changelog the
shim wrote to the checkpoint before calling :meth:`VersionedStore.apply`, so RocksDB's WAL is
off. Keys arrive already encoded (key-group prefix + Spark's UnsafeRow bytes); this module never
interprets them beyond prefixes.
"""
from __future__ import annotations

import contextlib
import logging
import shutil
import threading
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable, Iterator, MutableMapping

from rocksdict import Rdict, WriteBatch

from ..formats import changelog, key_group_counts, rocksdb
from ..formats.frames import TtlScan
from . import snapshots
from .reclaim import Reclaim, worth_reclaiming
from .ttl_scan import TtlScanner
from .write_behind import Applier, StoreStateError, WriteBehind

__all__ = ["Applier", "StoreStateError", "VersionedStore", "local_failure"]

log = logging.getLogger(__name__)

COMPACT_AFTER_DELETES = 1000
"""Deletes since the last compaction (and >= 1/4 of the keys) that make a snapshot compact first."""

RECLAIM_HOLD_L0_FILES = 8
"""L0 files at which a database whose reclaim is due, or waits for its turn, compacts anyway:
twice RocksDB's trigger, so that its point reads check a bounded number of files."""


def local_failure(exc: BaseException, where: Path) -> str:
    """An error of the store's own files, said as such: a full local disk must never read as a
    problem of the checkpoint (whose files are fine and reload the version on the retry)."""
    text = f"{type(exc).__name__}: {exc}"
    if "No space left" in text or getattr(exc, "errno", None) == 28:
        return (f"the state server's local disk is full (its files are in {where}); free space there: "
                f"the checkpoint is fine and the task's retry reloads the state from it ({text})")
    return text


Shipped = bytes | memoryview | changelog.Changelog
"""A committed version's changelog as the store takes it: decoded (the data channel decodes what
it receives) or its bytes (decoded by the store, see :func:`_decoded`)."""


class VersionedStore:
    """A RocksDB database plus the version it holds and an exact key count."""

    def __init__(self, name: str, workdir: Path, key_groups: int, snapshot_interval: int,
                 applier: Applier | None = None, pool: rocksdb.MemoryPool | None = None,
                 bulk_keys: int = 1_000_000) -> None:
        """``bulk_keys``: the snapshotBulkKeys conf (0: off), see :func:`_bulk_load`."""
        self.name = name
        self.workdir = workdir
        self.key_groups = key_groups
        self.snapshot_interval = snapshot_interval
        self.bulk_keys = bulk_keys
        self.version = -1  # nothing loaded
        self.num_keys = 0
        # Keys by key group, kept with num_keys while known (FORMATS.md, "Key-group counts"):
        # None after a restore from a snapshot that does not carry them.
        self.key_group_counts: Counter | None = None
        self.lineage = ""
        self._db: Rdict | None = None
        self._restores = 0  # names the database's directory: each restore opens a new one
        self._staged = snapshots.StagedSnapshots()
        self._lock = threading.RLock()  # the database and the version it holds
        self._applier = applier
        self._pool = pool  # the process's RocksDB memory bound (None: unbounded)
        self._behind = WriteBehind(name)  # its own lock: queueing a commit never waits for _lock
        self._dirty = False  # the mutable memtable holds writes (vector memtables are unreadable)
        self._unflushed = (0, 0)  # puts, and changelog bytes, written since the last flush
        self._deletes_since_compaction = 0
        self._compactions_held = False  # automatic compactions off since a restore, see restore
        self._reclaim_at: int | None = None  # the version whose commit starts the reclaim
        self._reclaim: Reclaim | None = None
        self._ttl = TtlScanner()  # incremental TTL cleanup, for the JVM's next changelog
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def _failure(self) -> str | None:
        """The first failure of a background apply: every later operation raises it."""
        return self._behind.failure

    @_failure.setter
    def _failure(self, message: str | None) -> None:
        self._behind.failure = message

    @property
    def _held(self) -> tuple[Shipped, str, TtlScan | None] | None:
        """The changelog held while its checkpoint file is written (see :meth:`hold`)."""
        return self._behind.held

    @property
    def _db_dir(self) -> Path:
        return self.workdir / f"db.{self._restores}"

    # -- loading -------------------------------------------------------------------------------
    def restore(self, version: int, snapshot_dir: str | None, lineage: str, num_keys: int) -> None:
        """Reset to ``version``: the downloaded snapshot in ``snapshot_dir``, or empty (v0)."""
        with _local_disk(self.name, self.workdir, f"installing version {version}"), self._settled(raise_failure=False):
            self._behind.reset(version)
            self._close_db()
            self._staged.drop_all()
            # A new directory each time: a closed instance may still be open (rocksdict's close
            # returns without closing while a scan's iterator lives), and when it does close,
            # RocksDB deletes from its directory every file it does not know as obsolete.
            closed = self._db_dir
            self._restores += 1
            _remove_closed(self.name, closed)
            counts: Counter | None = Counter()
            if snapshot_dir:
                snapshots.install(Path(snapshot_dir), self._db_dir)  # replacing what may be there
                counts = key_group_counts.take_beside(self._db_dir, self.key_groups, num_keys, self.name)
            elif self._db_dir.exists():  # never made by this store: not a database to open as empty
                shutil.rmtree(self._db_dir)
            # A restored database opens without automatic compactions, which it would otherwise
            # start at once (a rescale's heir opens with its parent's L0 files plus one of range
            # deletes: a compaction of the whole parent inside the task that loads it). They
            # resume at its first flush (:meth:`_resume_compactions`)...
            self._db = rocksdb.open_db(self._db_dir, pool=self._pool, compactions=not snapshot_dir)
            self._compactions_held = bool(snapshot_dir)
            # ...unless its files hold its parent's hidden key groups too (a heir): one full
            # compaction, the reclaim, drops them once its first batch is over (at the commit of
            # its second batch), off every task, and compactions resume after it. Resumed at the
            # first flush, they would compact the parent's L0 files inside the first batch and the
            # reclaim would then rewrite the result again with the flushes since.
            self._reclaim_at = version + 2 if snapshot_dir and worth_reclaiming(self._db, num_keys) else None
            self.version, self.num_keys, self.lineage = version, num_keys, lineage
            self.key_group_counts = counts
            self._ttl.reset()

    def replay(self, changelogs: Iterable[tuple[int, str, str]]) -> None:
        """Apply downloaded changelogs ``(version, local path, checkpoint path)`` in order."""
        with _local_disk(self.name, self.workdir, "replaying changelogs"):
            self._replay(changelogs)

    def _replay(self, changelogs: Iterable[tuple[int, str, str]]) -> None:
        for version, local, origin in changelogs:
            with open(local, "rb") as fh:
                log_ = changelog.decode(fh.read(), origin)
            if log_.version != version:
                raise changelog.CorruptChangelogError(
                    f"{origin} holds version {log_.version}, expected {version}")
            self._apply(log_, source=origin, stage_snapshot=False)

    # -- the data path -------------------------------------------------------------------------
    def get(self, key: bytes) -> bytes | None:
        return self._require_db(wait=True).get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return list(rocksdb.multi_get(self._require_db(wait=True), keys)) if keys else []

    def sync(self) -> tuple[int, str]:
        """The version held and the database directory, once every submitted changelog is
        applied and flushed: the JVM then reads the files directly (a RocksDB secondary
        instance), which sees flushed data only, since the WAL is off."""
        self._require_db(wait=True)
        return self.version, str(self._db_dir)

    def scan(self, prefix: bytes, start_after: bytes | None, max_bytes: int,
             keys_only: bool = False) -> tuple[list[tuple[bytes, bytes]], bool]:
        """About ``max_bytes`` of entries with ``prefix`` after ``start_after``, and whether more
        remain; with ``keys_only`` the values are empty (for building the JVM's Bloom filter)."""
        return _scan(self._require_db(wait=True), prefix, start_after, max_bytes, keys_only)

    def apply(self, data: Shipped, source: str, ttl: TtlScan | None = None) -> int:
        """Apply a committed version's changelog now (decoded, as the data channel passes it, or
        its bytes, see :func:`_decoded`); returns the new exact key count."""
        with _local_disk(self.name, self.workdir, f"applying {source}"), self._settled():
            self._apply(_decoded(data, source), source, stage_snapshot=True)
            if ttl is not None and ttl.interval and self.version % ttl.interval == 0:
                self._scan_expired(ttl)
            return self.num_keys

    def submit(self, data: Shipped, source: str, ttl: TtlScan | None = None) -> None:
        """Queue a committed version's changelog for the background applier (write-behind)."""
        if self._applier is None:
            self.apply(data, source, ttl)
            return
        self._behind.queue()
        self._applier.submit(self, data, source, ttl)

    def hold(self, data: Shipped, source: str, ttl: TtlScan | None = None) -> None:
        """Keep a version's changelog, unapplied, while the JVM writes its checkpoint file (the
        two overlap); :meth:`release` then applies it behind or drops it. Until then the store
        serves and snapshots the version before it: a version the checkpoint may lack is never
        applied, so never read, staged or uploaded. A restore drops what is held."""
        self._behind.hold((data, source, ttl))

    def release(self, apply: bool) -> None:
        """Apply the held changelog behind (its checkpoint file is durable) or drop it (the file
        was not written, or another attempt's was)."""
        held = self._behind.take_held(apply)
        if apply:
            self.submit(*held)

    def _apply_submitted(self, data: bytes, source: str, ttl: TtlScan | None) -> None:
        with self._lock:
            try:
                if self._behind.failure is None:
                    self._apply(_decoded(data, source), source, stage_snapshot=True)
                    if ttl is not None and ttl.interval and self.version % ttl.interval == 0:
                        self._scan_expired(ttl)
            except Exception as exc:  # surfaced by the store's next operation
                log.exception("background apply of %s failed", source)
                self._behind.fail(f"{self.name}: applying {source} failed: {local_failure(exc, self.workdir)}")
            finally:
                self._behind.done(self.version)

    def _wait_applied(self, raise_failure: bool = True) -> None:
        """Wait until no submitted changelog is pending. Must not hold _lock (the applier needs it)."""
        self._behind.wait_applied(raise_failure)

    def _settled(self, raise_failure: bool = True) -> contextlib.AbstractContextManager[None]:
        """Hold _lock with nothing pending (see :meth:`WriteBehind.settled`)."""
        return self._behind.settled(self._lock, raise_failure)

    def _apply(self, log_: changelog.Changelog, source: str, stage_snapshot: bool) -> None:
        with self._lock:
            db = self._require_db()
            if log_.version != self.version + 1:
                raise StoreStateError(
                    f"{self.name}: cannot apply {source} (version {log_.version}) on top of "
                    f"version {self.version}; versions must be consecutive")
            if log_.key_groups != self.key_groups:
                raise StoreStateError(
                    f"{source} was written with {log_.key_groups} key groups but the store uses "
                    f"{self.key_groups}; the keyGroups conf cannot change for an existing checkpoint")
            total = puts = 0
            written = False
            try:
                for batch, fed in _write_batches(log_, self._pool, self._flush_if_dirty, self.key_group_counts):
                    delta = fed.key_delta
                    self._deletes_since_compaction += fed.deletes
                    puts += fed.records - fed.deletes
                    # Only keys whose previous existence the writer did not know cost a read here
                    # (a key occurs once in a changelog, so chunk by chunk is the same).
                    if fed.unknown_puts or fed.unknown_deletes:
                        self._flush_if_dirty()
                        delta += rocksdb.count_unknown(db, fed, self.key_group_counts)
                    if not batch.is_empty():
                        written = True
                        db.write(batch)
                        self._dirty = True
                        self._cap_level0()  # RocksDB flushes a full memtable by itself
                    total += delta
            except BaseException as exc:
                self.key_group_counts = None  # part of the records may be counted: no longer known
                if written:  # some chunks are in: the database holds no version now
                    self._behind.fail(f"{self.name}: applying {source} failed after part of it was written "
                                      f"({type(exc).__name__}); the store must be restored", first_only=True)
                raise
            self.version = log_.version
            self.num_keys += total
            if self._reclaim_at is not None:
                if not stage_snapshot:  # a load's replay: counted from the version it loads
                    self._reclaim_at = self.version + 2
                elif self.version >= self._reclaim_at:
                    self._start_reclaim(db)
            if self._dirty:  # (under a memoryBudget every chunk is flushed already)
                unflushed_puts, size = self._unflushed
                self._unflushed = (unflushed_puts + puts, size + log_.size)
                if _superseded(self._unflushed, self.num_keys):
                    # In the background, as RocksDB flushes a full memtable: the applier goes on
                    # with the next store's changelog. _dirty stays set, so that a read, a sync
                    # or a snapshot still waits for this flush before it looks at the files.
                    db.flush(wait=False)
                    self._unflushed = (0, 0)
                    self._resume_compactions()
            if stage_snapshot and (self.version % self.snapshot_interval == 0 or _bulk_load(total, self.num_keys, self.bulk_keys)):
                self._stage()

    # -- TTL cleanup ---------------------------------------------------------------------------
    def _scan_expired(self, ttl: TtlScan) -> None:
        """Scan for expired entries from where the last scan stopped (:mod:`.ttl_scan`)."""
        self._ttl.scan(ttl, self.version, self._flushed_db)

    def _flushed_db(self) -> Rdict:
        self._flush_if_dirty()  # free when a snapshot was just staged
        return self._require_db()

    def take_ttl_candidates(self) -> tuple[int, int, list[bytes]]:
        """(version scanned, scan ms, expired keys) of the last finished scan, each result once
        (:meth:`TtlScanner.take`: never waits for a pending apply or scan)."""
        return self._ttl.take()

    # -- snapshots -----------------------------------------------------------------------------
    def stage_snapshot(self) -> None:
        """Checkpoint the current version locally; the shim uploads it during maintenance."""
        with self._settled():
            self._stage()

    def _stage(self) -> None:
        with _local_disk(self.name, self.workdir, f"staging a snapshot of version {self.version}"):
            self._stage_now()

    def _stage_now(self) -> None:
        self._flush_if_dirty()  # the checkpoint must hold every write of the version
        # A snapshot comes after a commit, off the load: compactions resume here even without a
        # flush (a store no batch writes to), or its snapshots would keep what it restored,
        # unmerged (a heir's reclaim, when due, merges it instead).
        self._resume_compactions()
        # After mass deletes (TTL cleanup, watermark eviction) the SSTs still hold the deleted
        # entries and their tombstones; compact first so the snapshot, and the disk, shrink.
        if self._deletes_since_compaction > max(COMPACT_AFTER_DELETES, self.num_keys // 4):
            self._require_db().compact_range(None, None)
            self._deletes_since_compaction = 0
        directory = self.workdir / "staged" / str(self.version)
        self._staged.stage(self._require_db(), directory, self.version, self.lineage, self.num_keys,
                           self.key_group_counts, self.key_groups)

    def staged_snapshots(self, through: int = -1) -> list[dict]:
        """The snapshots staged so far. With ``through`` >= 0 (an upload asked for by the commit
        of that version) first wait until that version's snapshot is staged, or its apply is
        done without one (the JVM's rule for a bulk version is the server's, but a snapshot
        already uploaded and dropped is not there either), or nothing is pending. Never for
        every pending apply: in a running query the next one is always
        queued, so such a wait would hold the store's uploads until
        the query paused, and a query stopped first restarted without its last snapshot."""
        self._behind.wait_staged(through, self._staged.__contains__)
        return self._staged.describe()  # not under _lock: waiting for a running apply would hold up the uploader

    def drop_staged(self, version: int) -> None:
        self._staged.drop(version)

    # -- lifecycle -----------------------------------------------------------------------------
    def memory_bytes(self) -> int:
        """RocksDB's memtables and table readers; lock-free, so a metrics call never waits
        for a write-behind apply."""
        db = self._db
        if db is None:
            return 0
        try:
            return sum(db.property_int_value(prop) or 0
                       for prop in ("rocksdb.cur-size-all-mem-tables", "rocksdb.estimate-table-readers-mem"))
        except Exception:  # closed concurrently by a reload
            return 0

    def close(self) -> None:
        with self._settled(raise_failure=False):
            self._behind.drop_held()
            self._close_db()
            self._staged.drop_all()
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _start_reclaim(self, db: Rdict) -> None:
        self._reclaim_at = None
        try:
            self._reclaim = Reclaim(self.name, db)
        except Exception:  # the version is applied: a reclaim that cannot start leaves it to the compactions
            log.warning("%s: cannot start compacting the restored files' dead entries", self.name, exc_info=True)
            try:
                self._resume_compactions()
            except Exception:  # the next flush or snapshot tries again
                log.warning("%s: cannot resume compactions", self.name, exc_info=True)

    def wait_reclaimed(self, timeout: float | None = None) -> bool:
        """Whether no reclaim runs (one started is done) within ``timeout`` seconds."""
        reclaim = self._reclaim
        return reclaim is None or reclaim.wait(timeout)

    def _close_db(self) -> None:
        self._reclaim_at = None
        cancelled = False
        if self._reclaim is not None:
            self._reclaim.stop()  # before the close: the compaction holds the database
            cancelled, self._reclaim = self._reclaim.cancelled, None
        db, self._db = self._db, None
        try:
            if db is not None:
                self._close(db, cancelled)
        finally:
            if self._db is None:  # closed: the store holds no version (else still open, see _close)
                self._dirty = False
                self._unflushed = (0, 0)
                self.version = -1

    def _close(self, db: Rdict, cancelled: bool) -> None:
        try:
            db.close()
        except RuntimeError:  # rocksdict: another thread is inside a call on it, so nothing was closed
            self._db = db
            raise
        except Exception as exc:  # rocksdict closed it all the same, its closing flush having failed
            if not (cancelled and str(exc).startswith("Shutdown in progress")):
                raise
            # A cancelled reclaim shut RocksDB's background work down; the memtable was flushed.
            log.debug("%s: closed after its reclaim was cancelled", self.name)

    def info(self) -> dict:
        with self._settled():
            return {"version": self.version, "numKeys": self.num_keys}

    def _require_db(self, wait: bool = False) -> Rdict:
        """The database; with ``wait``, for reading: pending applies done, memtable flushed."""
        if wait and (self._behind.pending or self._dirty or self._behind.failure):  # else the per-read fast path
            with self._settled():
                self._flush_if_dirty()
        db = self._db
        if db is None:
            raise StoreStateError(f"{self.name}: no version is loaded")
        return db

    def _flush_if_dirty(self) -> None:
        if self._dirty and self._db is not None:
            self._db.flush()  # releases the GIL while RocksDB sorts and writes the SST
            self._dirty = False
            self._resume_compactions()
        self._unflushed = (0, 0)

    def _resume_compactions(self) -> None:
        """Let RocksDB compact a restored database again, at its first flush or snapshot: where a
        store that was not restored would next compact too (a flush adds an L0 file). A restore
        with nothing to replay (a rescale's heir, a snapshot at the version) resumes after a
        commit, on the write-behind applier or at a read of a later version; one that replays
        changelogs resumes at the replay's flush, inside that load, as it compacted before.
        While a reclaim is due or runs, they stay off, the reclaim resuming them when it is
        over, unless L0 fills (:meth:`_cap_level0`)."""
        if not self._compactions_held or self._db is None:
            return
        if self._reclaim_pending() and self._level0_files() < RECLAIM_HOLD_L0_FILES:
            return
        self._db.set_options({"disable_auto_compactions": "false"})
        self._compactions_held = False

    def _cap_level0(self) -> None:
        """Compactions held for a reclaim resume once :data:`RECLAIM_HOLD_L0_FILES` L0 files wait
        for them, whoever flushed them (RocksDB flushes a full memtable by itself): with
        compactions off RocksDB never stalls writes, but its reads check every L0 file."""
        if self._compactions_held and self._reclaim_pending():
            self._resume_compactions()  # which holds them below the bound

    def _level0_files(self) -> int:
        return self._require_db().property_int_value("rocksdb.num-files-at-level0") or 0

    def _reclaim_pending(self) -> bool:
        """Whether a reclaim is due (at a later commit) or has not finished."""
        return self._reclaim_at is not None or (self._reclaim is not None and not self._reclaim.wait(0))


def _remove_closed(name: str, directory: Path) -> None:
    """Remove a closed database's directory; an instance still open there (see
    :meth:`VersionedStore.restore`) may keep it from going, and the store's close removes it."""
    try:
        shutil.rmtree(directory)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("%s: cannot remove the closed database's directory %s yet: %s", name, directory, exc)


def _decoded(data: Shipped, source: str) -> changelog.Changelog:
    """A changelog, decoded. The data channel decodes what it receives (a large frame's records
    in place, ``server/data.py``); bytes or a memoryview (in-process callers) are decoded here,
    which copies the records out, and a memoryview is released at once, so that the buffer it
    views can be freed while the records are written."""
    if isinstance(data, changelog.Changelog):
        return data
    try:
        return changelog.decode(data, source)
    finally:  # a changelog that fails to decode is not applied either
        if isinstance(data, memoryview):
            data.release()


APPLY_CHUNK_BYTES = 4 << 20
"""Changelog bytes written to RocksDB in one write batch when no memoryBudget bounds the
process (under one, an eighth of its pool). A write batch holds a copy of every record it
writes, so one batch per changelog would add the changelog's size again at the apply's peak;
smaller writes cost time (benchmarks/ANALYSIS.md, "Measurements behind constants")."""


SUPERSEDED_FLUSH_RATIO = 2
"""Puts per key that make a memtable worth flushing early (:func:`_superseded`):
at 2, at least half of the memtable is superseded; at 1, flushes double for little more memory
(benchmarks/ANALYSIS.md, "Measurements behind constants")."""
SUPERSEDED_FLUSH_BYTES = 16 << 20
"""Changelog bytes since the last flush below which a store's memtable is left to fill: at this
size a flush frees at least half of it, 8 MiB."""


def _scan(db: Rdict, prefix: bytes, start_after: bytes | None, max_bytes: int,
          keys_only: bool) -> tuple[list[tuple[bytes, bytes]], bool]:
    """About ``max_bytes`` of entries with ``prefix`` after ``start_after``, and whether more
    remain; with ``keys_only`` the values are empty (for building the JVM's Bloom filter)."""
    it = db.iter()
    if start_after is not None:
        it.seek(start_after)
        if it.valid() and it.key() == start_after:
            it.next()
    else:
        it.seek(prefix)
    out: list[tuple[bytes, bytes]] = []
    size = 0
    while it.valid():
        key = it.key()
        if not key.startswith(prefix):
            return out, False
        value = b"" if keys_only else it.value()
        out.append((key, value))
        size += len(key) + len(value) + 8
        it.next()
        if size >= max_bytes:
            return out, it.valid() and it.key().startswith(prefix)
    it.status()  # the iterator stops on an error (a corrupt block) too: raise it, not "the end"
    return out, False


def _superseded(unflushed: tuple[int, int], num_keys: int) -> bool:
    """Whether a store's memtable holds mostly values that newer records replace, by its
    ``unflushed`` (puts, changelog bytes) since its last flush and its ``num_keys``: puts at
    least :data:`SUPERSEDED_FLUSH_RATIO` (2) times its keys, and at least
    :data:`SUPERSEDED_FLUSH_BYTES` of changelog. Since the puts' live keys are among
    the store's keys, at least half of those puts are then overwritten or deleted, and a
    flush keeps one record a key. Without it a store whose keys are all rewritten every
    batch (an aggregation) fills RocksDB's two 64 MiB memtables with old values, many times
    the state's own size. Deletes do not count: a
    store that deletes what it put long ago (eviction) holds no more than its tombstones.
    A store that grows (a dedup), or rewrites under a fifth of its keys a batch (the
    snapshot every 10 versions flushes first), is not affected. The count only errs high
    (RocksDB's own flushes of full memtables are not seen), so at worst a flush comes early."""
    puts, size = unflushed
    return size >= SUPERSEDED_FLUSH_BYTES and puts >= SUPERSEDED_FLUSH_RATIO * num_keys


def _write_batches(log_: changelog.Changelog, pool: rocksdb.MemoryPool | None, flush: Callable[[], None],
                   counts: MutableMapping[int, int] | None) -> Iterator[tuple[WriteBatch, changelog.Fed]]:
    """The changelog's records as write batches of about :data:`APPLY_CHUNK_BYTES` of
    records (the record count that makes, 10,000 at least), or, under a memoryBudget, of about
    an eighth of the process's pool each, each flushed once written: one write lands whole in
    one memtable, so a large batch written at once would hold a write batch and a memtable of
    its size (and overrun the pool). Each batch is filled when asked for and must be written
    before the next is; the trailer's record count is checked as the last one is filled, so
    a lying trailer is refused before the last batch is written."""
    chunk_bytes = APPLY_CHUNK_BYTES if pool is None else pool.capacity // 8
    size = log_.size
    per_chunk = None
    if pool is not None or size > chunk_bytes:
        per_chunk = max(10_000, chunk_bytes * log_.record_count // max(1, size))
    pos, done = log_.first, 0
    while True:
        batch = WriteBatch(raw_mode=True)
        fed = log_.feed(batch.put, batch.delete, pos, done, per_chunk, counts=counts)
        yield batch, fed
        log_.discard_before(fed.end)  # written: a shipped frame's pages go back as it is applied
        if pool is not None:  # the last batch too: no version leaves a memtable behind
            flush()
        pos, done = fed.end, done + fed.records
        if pos >= log_.end:
            return


@contextlib.contextmanager
def _local_disk(name: str, workdir: Path, what: str) -> Iterator[None]:
    """Turns a failure of the local disk into a message that says so (and where)."""
    try:
        yield
    except StoreStateError:
        raise
    except Exception as exc:  # rocksdict raises plain Exceptions for RocksDB IO errors
        if "No space left" in str(exc) or getattr(exc, "errno", None) == 28:
            raise StoreStateError(f"{name}: {what} failed: {local_failure(exc, workdir)}") from exc
        raise


def _bulk_load(added: int, num_keys: int, bulk_keys: int) -> bool:
    """Whether a version just applied, which left ``num_keys``, is a bulk load (a first batch
    over a backlog, a catch-up that brings new keys): it added at least ``bulk_keys`` keys
    (net), at least half of those it holds. Its snapshot is staged at once instead of at the next
    snapshotInterval, and the JVM's commit, which applies the same rule
    (``StoreSettings.bulkLoad``), asks for its upload, so that no later load replays it (a
    restart right after a seed would otherwise replay the whole seed). Net growth, not
    records: a steady query that rewrites most of its keys every batch is not a bulk load."""
    return 0 < bulk_keys <= added and added >= num_keys - added
