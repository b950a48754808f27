"""Write-behind for a state store: committed changelogs applied in the background.

The JVM's commit returns once the changelog is durable in the checkpoint and queued here;
RocksDB catches up while the next micro-batch runs. A changelog may also arrive while its
checkpoint file is still being written: it is held, unapplied, until the JVM says the file is
durable (:meth:`WriteBehind.release`). The bookkeeping has its own lock (a condition), so that
queueing a commit never waits for the applier, which holds the store's lock while it applies,
snapshots or scans.
"""
from __future__ import annotations

import contextlib
import queue
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ..formats.frames import TtlScan

if TYPE_CHECKING:
    from .store import Shipped, VersionedStore


class StoreStateError(RuntimeError):
    """A request does not fit the version the store holds (e.g. applying v+2 onto v)."""


class Applier:
    """Applies submitted changelogs in the background, in submission order.

    One thread per server process, since RocksDB writes hold the GIL anyway.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="keyedstate-applier", daemon=True).start()

    def submit(self, store: "VersionedStore", data: "Shipped", source: str, ttl: "TtlScan | None") -> None:
        self._queue.put((store, data, source, ttl))

    def _run(self) -> None:
        while True:
            store, data, source, ttl = self._queue.get()
            store._apply_submitted(data, source, ttl)
            del store, data, source, ttl  # not held while waiting for the next one


Held = tuple[Any, str, "TtlScan | None"]
"""A held changelog: what was shipped, where from, and the TTL scan its apply runs."""


class WriteBehind:
    """One store's write-behind bookkeeping: how many submitted changelogs are still pending,
    the version the last background apply left, the first failure (every later operation of
    the store raises it until a restore), and the changelog held while its file is written."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.state = threading.Condition()
        self.pending = 0  # submitted changelogs not yet applied
        self.applied = -1  # the version the last finished background apply left (staged if due)
        self.failure: str | None = None
        self.held: Held | None = None

    def reset(self, version: int) -> None:
        """A restore to ``version``: no failure, and nothing held (a commit that never said
        whether its file became durable)."""
        with self.state:
            self.failure = None
            self.applied = version
            self.held = None

    def drop_held(self) -> None:
        with self.state:
            self.held = None

    def queue(self) -> None:
        """Counts one more submitted changelog, unless an earlier one failed."""
        with self.state:
            if self.failure:
                raise StoreStateError(self.failure)
            self.pending += 1

    def hold(self, held: Held) -> None:
        with self.state:
            if self.failure:
                raise StoreStateError(self.failure)
            if self.held is not None:
                raise StoreStateError(f"{self.name}: a changelog arrived while another is still held "
                                      "(its commit neither applied nor dropped it)")
            self.held = held

    def take_held(self, apply: bool) -> Held:
        with self.state:
            held, self.held = self.held, None
        if held is None:
            raise StoreStateError(f"{self.name}: no changelog is held to "
                                  f"{'apply' if apply else 'drop'} (a restore dropped it, or none was shipped)")
        return held

    def fail(self, message: str, first_only: bool = False) -> None:
        with self.state:
            if not first_only or self.failure is None:
                self.failure = message

    def done(self, version: int) -> None:
        """One submitted changelog is done (applied or failed); the store holds ``version``."""
        with self.state:
            self.pending -= 1
            self.applied = version
            self.state.notify_all()

    def wait_applied(self, raise_failure: bool = True) -> None:
        """Wait until no submitted changelog is pending. Must not hold the store's lock (the
        applier needs it)."""
        with self.state:
            while self.pending:
                self.state.wait()
            if raise_failure and self.failure:
                raise StoreStateError(self.failure)

    @contextlib.contextmanager
    def settled(self, lock: threading.RLock, raise_failure: bool = True) -> Iterator[None]:
        """Hold ``lock`` (the store's) with nothing pending: the database holds the latest
        committed version and stays there until released (a commit queued meanwhile waits for
        the lock)."""
        while True:
            self.wait_applied(raise_failure)
            lock.acquire()
            with self.state:
                if not self.pending:
                    break
            lock.release()
        try:
            yield
        finally:
            lock.release()

    def wait_staged(self, through: int, staged: Callable[[int], bool]) -> None:
        """Wait until ``through``'s snapshot is ``staged``, or its apply is done without one, or
        nothing is pending, or an apply failed."""
        with self.state:
            while (through >= 0 and self.pending and not staged(through) and self.applied < through
                   and self.failure is None):
                self.state.wait()
