"""Open stores by handle; a handle is only meaningful inside this server process."""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from ..formats.rocksdb import MemoryPool
from .store import VersionedStore
from .write_behind import Applier


class StoreRegistry:
    """The stores of this process, and what they share: the write-behind applier and, under a
    ``memoryBudget``, one RocksDB memory pool (this process's share of the budget)."""

    def __init__(self, workdir: Path, processes: int | None = None) -> None:
        self.workdir = workdir
        self._stores: dict[int, VersionedStore] = {}
        self._next = 1
        self._lock = threading.Lock()
        self.applier = Applier()
        self.processes = processes or int(os.environ.get("KEYEDSTATE_SERVER_PROCESSES", "1") or 1)
        self.pool: MemoryPool | None = None

    def _pool_for(self, settings: dict[str, Any]) -> MemoryPool | None:
        """The pool of this process, sized by the last store opened (the stores of a query share
        their confs); None while no budget was set."""
        total = settings.get("serverMemoryBytes") or 0
        if not total:
            return self.pool
        share = total // max(1, self.processes)
        if self.pool is None:
            self.pool = MemoryPool(share)
        elif self.pool.capacity != share:
            self.pool.resize(share)
        return self.pool

    def memory_bytes(self) -> int:
        """RocksDB memory of the whole process: the pool's use, else the sum over its stores."""
        if self.pool is not None:
            return self.pool.usage()
        with self._lock:
            stores = list(self._stores.values())
        return sum(store.memory_bytes() for store in stores)

    def open(self, name: str, settings: dict[str, Any]) -> tuple[int, VersionedStore]:
        with self._lock:
            handle = self._next
            self._next += 1
            pool = self._pool_for(settings)
        store = VersionedStore(name, self.workdir / "stores" / str(handle),
                               settings["keyGroups"], settings["snapshotInterval"], self.applier, pool,
                               settings["snapshotBulkKeys"])
        with self._lock:
            self._stores[handle] = store
        return handle, store

    def get(self, handle: int) -> VersionedStore:
        try:
            return self._stores[handle]
        except KeyError:
            raise KeyError(f"no open store with handle {handle}") from None

    def close(self, handle: int) -> None:
        with self._lock:
            store = self._stores.pop(handle, None)
        if store is not None:
            store.close()
