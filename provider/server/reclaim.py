"""A restored store's reclaim: one full compaction that drops the entries its files hold beyond
its keys (a rescale's heir: its parent's key groups that range deletes hide), in a thread of its
own, one in the process at a time, cancelled when the store closes or reloads."""
from __future__ import annotations

import logging
import re
import threading
import time

from rocksdict import Rdict

log = logging.getLogger(__name__)

RECLAIM_MIN_DEAD_ENTRIES = 10_000
"""Entries beyond the keys that a restored store's files, hiding some behind range deletes (a
rescale's heir), must hold, and at least half as many as its keys, to be reclaimed."""

_RECLAIMS = threading.BoundedSemaphore(1)
"""One reclaim at a time in this process: a rescale's heirs all restore in the same batch, and
their compactions together must not take every core from the batches that follow."""


def worth_reclaiming(db: Rdict, num_keys: int) -> bool:
    """Whether the restored files hide entries behind range deletes (a rescale's heir, an
    offline writer's version written from empty) and hold many more entries than keys. Entries
    a store superseded itself are left to RocksDB's own compactions."""
    properties = db.property_value("rocksdb.aggregated-table-properties") or ""
    found = re.search(r"# range deletions=(\d+)", properties)
    if found is None or int(found.group(1)) == 0:
        return False
    dead = sum(f["num_entries"] for f in db.live_files()) - num_keys
    return dead >= max(RECLAIM_MIN_DEAD_ENTRIES, num_keys // 2)


class Reclaim:
    """A full compaction of a restored store's database in a thread of its own: the entries
    that its keys do not account for are dropped without any task, the write-behind applier
    included, waiting for it; :meth:`stop` cancels it."""

    def __init__(self, name: str, db: Rdict) -> None:
        self._name, self._db = name, db
        self._state = threading.Lock()  # orders the start of the compaction with stop
        self._stopped = threading.Event()
        self._compacting = False
        self.cancelled = False  # stopped while it compacted: RocksDB's background work is shut down
        self._thread = threading.Thread(target=self._run, name=f"keyedstate-reclaim-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not _RECLAIMS.acquire(timeout=0.2):
            if self._stopped.is_set():
                return
        try:
            with self._state:
                if self._stopped.is_set():
                    return
                self._compacting = True
            self._compact()
        finally:
            with self._state:
                self._compacting = False
            _RECLAIMS.release()
            self._resume_compactions()

    def _compact(self) -> None:
        started = time.monotonic()
        try:
            # Releases the GIL. rocksdict reports no error of it: one (a full disk) stops RocksDB's
            # background work, and the store's next write fails with RocksDB's message.
            self._db.compact_range(None, None)
        except Exception:
            log.warning("%s: compacting the restored files' dead entries failed", self._name, exc_info=True)
            return
        if self._stopped.is_set():
            log.info("%s: the reclaim was stopped after %.2f s", self._name, time.monotonic() - started)
        else:
            log.info("%s: compacted the restored files' dead entries away in %.2f s", self._name,
                     time.monotonic() - started)

    def _resume_compactions(self) -> None:
        """RocksDB's own compactions, held for the reclaim (``VersionedStore._resume_compactions``),
        go on after it (a no-op where the store resumed them already). Not after a stop: the
        database is about to close."""
        if self._stopped.is_set():
            return
        try:
            self._db.set_options({"disable_auto_compactions": "false"})
        except Exception:
            log.warning("%s: cannot resume compactions after the reclaim", self._name, exc_info=True)

    def wait(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        """Give up a reclaim still waiting for its turn, or cancel its compaction, so that the
        database may close at once (a reload inside a task never waits for a whole compaction).
        A cancel flushes the memtable first (the flush releases the GIL; RocksDB's cancel would
        flush holding it) and shuts down the database's background work, after which only its
        close is left (:attr:`cancelled`); the files stay as they were, the compaction's partial
        output being RocksDB's to delete."""
        with self._state:
            self._stopped.set()
            compacting = self._compacting
        if compacting:
            try:
                # Automatic compactions off first: with them on, a flush waits while L0 is at RocksDB's
                # stall trigger (the reclaim holds the compactions that would lower it), and the cancel's
                # own flush would wait so holding the GIL. The database closes next anyway.
                self._db.set_options({"disable_auto_compactions": "true"})
                self._db.flush()
                self._db.cancel_all_background(False)
                self.cancelled = True
            except Exception:  # the compaction ends by itself; the join below waits for it
                log.warning("%s: cannot cancel the reclaim; waiting for it", self._name, exc_info=True)
        self._thread.join()
