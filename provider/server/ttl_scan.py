"""Incremental TTL cleanup of a state store: a scan for expired entries after an apply.

Runs right after an apply (in the background with write-behind), off the task's critical path.
The JVM deletes what was found through its next changelog, so cleanup is part of the
checkpoint, and it takes the keys only if it commits on top of exactly the version scanned:
nothing can have changed them since.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from rocksdict import Rdict

from ..formats import rocksdb, stored
from ..formats.frames import TtlScan


class TtlScanner:
    """Where the next scan resumes, and what the last one found (the version it scanned, ms,
    keys) for the JVM to take. The result is handed over under a lock of its own, so that a
    commit never waits for an apply or a scan."""

    def __init__(self) -> None:
        self._cursor: bytes | None = None
        self._found: tuple[int, int, list[bytes]] = (-1, 0, [])
        self._lock = threading.Lock()

    def reset(self) -> None:
        """A restored store: the next scan starts over, and nothing found is taken."""
        self._cursor = None
        with self._lock:
            self._found = (-1, 0, [])

    def scan(self, ttl: TtlScan, version: int, open_db: Callable[[], Rdict]) -> None:
        """Walk up to a budget of entries from the cursor of the database ``open_db`` gives
        (flushed) at ``version``, and remember the expired ones."""
        started = time.perf_counter()
        budget = ttl.budget
        found: list[bytes] = []
        if budget > 0 and ttl.expire_before >= 0:
            db = open_db()
            start = self._cursor
            entries = db.items() if start is None else db.items(from_key=start)
            expired = stored.expired_before(ttl.expire_before)
            cursor = None  # None: the scan reached the end, the next one wraps around
            key = None
            for examined, (key, value) in enumerate(entries):
                if examined == budget:
                    cursor = key
                    break
                if expired(value):
                    found.append(key)
            if cursor is None:  # a corrupt block ends items() quietly: not the end of the store
                rocksdb.check_scan_end(db, key, start)
            self._cursor = cursor
        with self._lock:
            self._found = (version, int((time.perf_counter() - started) * 1000), found)

    def take(self) -> tuple[int, int, list[bytes]]:
        """(version scanned, scan ms, expired keys) of the last finished scan, each result once.

        Never waits for a pending apply or scan: a commit must not stall on background cleanup.
        A result older than the version the JVM commits on is revalidated there.
        """
        with self._lock:
            found, self._found = self._found, (-1, 0, [])
            return found
