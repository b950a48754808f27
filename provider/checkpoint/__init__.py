"""A keyedstate checkpoint, read and written without Spark's query running: the Python twin of
the JVM's ``checkpoint`` package, used by every offline tool.

* :mod:`.storage`: where a checkpoint lives (local files, or any Hadoop file system).
* :mod:`.listing`: the one listing of a store partition's files, and the path rules.
* :mod:`.spark`: Spark's own files (offset and commit logs, operator metadata, state schema).
* :mod:`.query`: a query's checkpoint location (:class:`Checkpoint`): its logs, operators, stores.
* :mod:`.plans`: the ways to rebuild a version, best first (FORMATS.md, "Loading a version").
* :mod:`.rebuilder`: the one rebuilder, a version in a private local RocksDB.
* :mod:`.snapshots`: snapshot manifests read and written, snapshots published.
* :mod:`.keylayout`: the key layout of files that do not record it.
* :mod:`.local`: the local format-1 view the in-place tools (inspect, rescale) use.

Every error about a bad checkpoint is a :class:`CheckpointError` naming the file at fault.
"""
from __future__ import annotations

from .errors import CheckpointError, CheckpointProblem, NotKeyedstateCheckpoint
from .keylayout import legacy_key_layout, partition_key_layout
from .listing import (JOIN_STORES, StorePartition, bytes_on_disk, check_inside, local_path, numbered_dirs,
                      refuse_links, store_dir, versioned_name)
from .local import (RebuiltVersion, StoreFiles, discover_stores, latest_committed_batch, list_store, open_copy,
                    operator_metadata, read_changelog, rebuild, written_from_empty)
from .plans import NoPlan, plans
from .query import Checkpoint, Operator
from .rebuilder import apply_kept_logs
from .snapshots import decode_manifest, read_manifest, write_atomically, write_snapshot

__all__ = ["JOIN_STORES", "Checkpoint", "CheckpointError", "CheckpointProblem", "NoPlan", "NotKeyedstateCheckpoint",
           "Operator", "RebuiltVersion", "StoreFiles", "StorePartition", "apply_kept_logs", "bytes_on_disk",
           "check_inside", "decode_manifest", "discover_stores", "latest_committed_batch", "legacy_key_layout",
           "list_store", "local_path", "numbered_dirs", "open_copy", "operator_metadata", "partition_key_layout", "plans",
           "read_changelog", "read_manifest", "rebuild", "refuse_links", "store_dir", "versioned_name",
           "write_atomically", "write_snapshot", "written_from_empty"]
