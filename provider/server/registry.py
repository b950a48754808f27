"""Open stores by handle; a handle is only meaningful inside this server process."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from .store import Applier, VersionedStore


class StoreRegistry:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._stores: dict[int, VersionedStore] = {}
        self._next = 1
        self._lock = threading.Lock()
        self.applier = Applier()

    def open(self, name: str, settings: dict[str, Any]) -> tuple[int, VersionedStore]:
        with self._lock:
            handle = self._next
            self._next += 1
        store = VersionedStore(name, self.workdir / "stores" / str(handle),
                               settings["keyGroups"], settings["snapshotInterval"], self.applier)
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
