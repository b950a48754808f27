"""keyedstate: a Spark Structured Streaming state store with Flink-grade state management.

Keyed state lives in RocksDB, owned by a Python state server per executor; a thin JVM shim
implements Spark's StateStoreProvider and talks to it over py4j (control) and a Unix domain
socket (bulk data). Enable it with :func:`configure`, or with spark-submit::

    --jars $(keyedstate jar) \\
    --conf spark.sql.streaming.stateStore.providerClass=io.keyedstate.spark.KeyedStateProvider

The package: :mod:`.formats` (byte formats shared with the JVM), :mod:`.checkpoint` (a
checkpoint's files: listing, loading a version, snapshots), :mod:`.server` (the state server),
:mod:`.offline` (tools on stopped queries' checkpoints), :mod:`.shim` (the JVM jar and
:func:`configure`).
"""
from __future__ import annotations

import importlib
from typing import Any

from . import failures
from .version import __version__

# Each public name and the module that defines it, imported on first use (PEP 562): a state
# server or a CLI command imports only what it runs, not every offline tool.
_PUBLIC = {
    "CheckpointError": ".checkpoint", "CheckpointProblem": ".checkpoint",
    "InspectError": ".offline.inspection", "inspect": ".offline.inspection",
    "get": ".offline.lookup",
    "MigrateError": ".offline.migration", "migrate": ".offline.migration",
    "StateProcessor": ".offline.processor", "StateProcessorError": ".offline.processor",
    "state": ".offline.processor", "undo": ".offline.processor",
    "RescaleError": ".offline.rescale", "rescale": ".offline.rescale",
    "StorageError": ".checkpoint.storage",
    "verify": ".offline.verify",
    "PROVIDER_CLASS": ".shim",
    "jar_path": ".shim.jar",
    "PROVIDER_CLASS_CONF": ".shim.session", "configure": ".shim.session",
}


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:  # a subpackage or module (keyedstate.conf), as an import of it would give
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


__all__ = ["PROVIDER_CLASS", "CheckpointError", "CheckpointProblem", "InspectError", "MigrateError", "RescaleError",
           "StateProcessor", "StateProcessorError", "StorageError", "configure", "get", "inspect", "jar_path", "migrate", "rescale", "state", "undo", "verify", "__version__"]

failures.install()  # an uncaught query failure ends with the one line keyedstate can name
