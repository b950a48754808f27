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

from . import failures
from .checkpoint import CheckpointError, CheckpointProblem
from .offline.inspection import InspectError, inspect
from .offline.lookup import get
from .offline.migration import MigrateError, migrate
from .offline.processor import StateProcessor, StateProcessorError, state, undo
from .offline.rescale import RescaleError, rescale
from .checkpoint.storage import StorageError
from .offline.verify import verify
from .shim import PROVIDER_CLASS
from .shim.jar import jar_path
from .shim.session import PROVIDER_CLASS_CONF, configure
from .version import __version__

__all__ = ["PROVIDER_CLASS", "CheckpointError", "CheckpointProblem", "InspectError", "MigrateError", "RescaleError",
           "StateProcessor", "StateProcessorError", "StorageError", "configure", "get", "inspect", "jar_path", "migrate", "rescale", "state", "undo", "verify", "__version__"]

failures.install()  # an uncaught query failure ends with the one line keyedstate can name
