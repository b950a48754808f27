"""The layout of a store partition's checkpoint directory, and the one rule for paths read from it.

Spec: FORMATS.md, "Checkpoint layout"; the JVM twin is ``CheckpointLayout.scala``. One store
partition (``<checkpoint>/state/<operator>/<partition>[/<store>]``) holds::

    <v>.ks-changelog      the writes of version v (the commit record; formats/changelog.py)
    <v>.ks-snapshot       the manifest of a snapshot of version v (formats/manifest.py)
    ks-files/<id>-<name>  snapshot files, immutable, shared by every manifest that lists them

A manifest names files, and a tampered one could name anything. Every name or path read from a
checkpoint file goes through :func:`checked_file_name` / :func:`checked_relative_path` before it
is joined to a directory, so that it can only ever mean a file inside ``ks-files/`` (in the
checkpoint) or inside the local directory being filled; a store name read from Spark's operator
metadata goes through :func:`checked_store_name` (it becomes a directory of the checkpoint).
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, BinaryIO

CHANGELOG_SUFFIX = ".ks-changelog"
MANIFEST_SUFFIX = ".ks-snapshot"
FILES_DIR = "ks-files"
DEFAULT_STORE = "default"

FOREIGN_FILE = re.compile(r"[0-9]+(?:_[0-9a-fA-F-]+)?\.(?:delta|snapshot|zip|changelog)")
"""Files of Spark's HDFS-backed and RocksDB providers: a directory holding them is not ours."""

FILE_NAME = re.compile(
    r"(?:[0-9]{1,20}\.(?:sst|log|blob)|(?:MANIFEST|OPTIONS)-[0-9]{1,20}|CURRENT|IDENTITY|rocksdict-config\.json"
    r"|replay-[0-9]{1,20}\.ks-changelog|ks-key-group-counts)")
"""A snapshot file's local name: what RocksDB puts in a checkpoint, a rescale's replay log, or the
snapshot's key-group counts (formats/key_group_counts.py)."""

RELATIVE_PATH = re.compile(r"(?:\.\./([0-9]{1,10})/)?" + FILES_DIR + r"/([A-Za-z0-9][A-Za-z0-9._-]{0,254})")
"""Where a manifest may say a snapshot file lives: directly inside ``ks-files/`` of its own store
partition, or (``../<p>/ks-files/<name>``) of partition ``<p>`` of the same operator and store,
whose files a rescale shares with the partitions it split the state into."""

BORROWER_MARKER = re.compile(r"ks-borrower-([0-9]{1,10})")
"""A file in a store partition whose snapshot files partition ``<q>`` of the same operator and
store lists (a rescale's heir): cleanup keeps what that partition's manifests still list."""

RETIRED_MARKER = re.compile(r"ks-retired-([0-9]{1,10})-([0-9]{1,19})")
"""A file in a store partition naming partition ``<q>`` of the same operator and store, which a
scale-down retired at version ``<v>`` (the new partitions' first): once this partition retains no
version below ``<v>``, its cleanup deletes what ``<q>`` holds."""

STORE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
"""A store's name: ``default``, or a subdirectory of the partition directory such as a join's
``left-keyToNumValues`` (Spark names them so; it does not check a name read back from a file)."""


MAX_MANIFEST_BYTES = 16 << 20
MAX_SPARK_METADATA_BYTES = 16 << 20  # Spark's offsets, commits and operator metadata
MAX_CHANGELOG_BYTES = (1 << 31) - 65  # the JVM's ChangelogFormat.MaxBytes: what one Java array holds
"""The most bytes a file of each kind may have (FORMATS.md, "File sizes"; the JVM's twin is
``CheckpointFiles``): a longer one is refused, naming it, before its bytes are read."""


class TooLargeError(ValueError):
    """A checkpoint file is longer than a file of its kind may be; the message names it."""


def check_size(size: int, limit: int, source: str, kind: str) -> None:
    """Refuse ``source`` (a ``kind``) of ``size`` bytes above ``limit`` (see MAX_MANIFEST_BYTES)."""
    if size > limit:
        raise TooLargeError(f"{source} has {size} bytes, more than a {kind} may have ({limit}): corrupt, "
                            f"or not a {kind}; it is not read")


def open_file(path: str | os.PathLike) -> BinaryIO:
    """A local checkpoint file opened for reading without following a link (O_NOFOLLOW); OSError
    as ``open`` raises it."""
    return open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb")


def read_file(path: str | os.PathLike, limit: int | None, kind: str) -> bytes:
    """A whole local checkpoint file (:func:`open_file`), refused unread when it is longer than
    ``limit`` (:func:`check_size`; None: no limit)."""
    with open_file(path) as fh:
        if limit is None:
            return fh.read()
        check_size(os.fstat(fh.fileno()).st_size, limit, str(path), kind)
        data = fh.read(limit + 1)
        check_size(len(data), limit, str(path), kind)  # it grew while read
        return data


UNIQUE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""A version's unique id (checkpoint format 2), as the JVM's ``CheckpointLayout.UniqueId``."""

_NUMBER = re.compile(r"[0-9]{1,19}")
_VERSION_NAME = re.compile(r"([0-9]{1,19})(?:_(" + UNIQUE_ID.pattern + r"))?")
_MAX_LONG = (1 << 63) - 1
_MAX_INT = (1 << 31) - 1  # a Spark partition id


class UnsafePathError(ValueError):
    """A checkpoint file names a path outside the directories keyedstate may touch."""


def is_table_file(name: str) -> bool:
    """A RocksDB table file among a snapshot's: immutable once written (RocksDB only reads it and
    deletes its own name for it), so an upload may reuse it and a local restore may link it
    (FORMATS.md, "Table files"; the JVM's ``CheckpointLayout.isTableFile``)."""
    return name.endswith(".sst")


def checked_file_name(name: object, source: str) -> str:
    if not isinstance(name, str) or not FILE_NAME.fullmatch(name):
        raise UnsafePathError(f"{source} names the snapshot file {name!r}, which is not a RocksDB or "
                              "keyedstate file name: the manifest is corrupt or was tampered with")
    return name


def checked_relative_path(path: object, source: str) -> str:
    match = RELATIVE_PATH.fullmatch(path) if isinstance(path, str) else None
    if match is None or ".." in match.group(2) or (match.group(1) is not None and int(match.group(1)) > _MAX_INT):
        raise UnsafePathError(f"{source} lists the path {path!r}, which is not a file directly inside "
                              f"{FILES_DIR}/ of a partition of its store: the manifest is corrupt or was tampered with")
    return path


def owner_of(path: str) -> tuple[int | None, str]:
    """(the partition whose ``ks-files/`` holds it, None for the manifest's own; its name there)
    of a path :func:`checked_relative_path` accepted."""
    match = RELATIVE_PATH.fullmatch(path)
    if match is None:
        raise UnsafePathError(f"{path!r} is not a snapshot file path")
    return (None if match.group(1) is None else int(match.group(1))), match.group(2)


def path_from(owner: int | None, name: str, partition: int) -> str:
    """The path a manifest of ``partition`` lists for file ``name`` of ``owner``'s ``ks-files/``."""
    return f"{FILES_DIR}/{name}" if owner is None or owner == partition else f"../{owner}/{FILES_DIR}/{name}"


def checked_store_name(name: object, source: str) -> str:
    """A store name read from ``source`` (Spark's operator metadata): offline tools write into
    and delete from ``<partition>/<store>``, so it must be one plain directory name."""
    if not isinstance(name, str) or not STORE_NAME.fullmatch(name):
        raise UnsafePathError(f"{source} names the store {name!r}, which is not a plain directory name: the "
                              "operator metadata is corrupt or was tampered with")
    return name


def changelog_name(version: int) -> str:
    return f"{version}{CHANGELOG_SUFFIX}"


def manifest_name(version: int) -> str:
    return f"{version}{MANIFEST_SUFFIX}"


def number_of(name: str) -> int | None:
    """The number a name is, by the rule of every store file name (FORMATS.md, "Checkpoint
    layout"): ASCII digits only (``str.isdigit`` also takes ``²`` or ``٣``), at most 19, within
    a signed 64-bit integer, as the JVM's ``CheckpointLayout.versionOf`` reads them. Also used
    for Spark's numbered directories and log files (operators, partitions, batches)."""
    if _NUMBER.fullmatch(name):
        value = int(name)
        if value <= _MAX_LONG:
            return value
    return None


def versioned_file(name: str, suffix: str) -> tuple[int, str | None] | None:
    """(version, unique id or None) of ``<v>[_<id>]<suffix>``, else None (see :func:`number_of`)."""
    if not name.endswith(suffix):
        return None
    m = _VERSION_NAME.fullmatch(name[: -len(suffix)])
    if m is None or number_of(m.group(1)) is None:
        return None
    return int(m.group(1)), m.group(2)


def version_of(name: str, suffix: str) -> int | None:
    """The version in ``<v><suffix>`` (no unique id: checkpoint format 1), or None for any other name."""
    found = versioned_file(name, suffix)
    return found[0] if found is not None and found[1] is None else None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")  # JSON has no NaN or Infinity; neither reader takes them


def json_of(text: str | bytes) -> Any:
    """JSON read from a checkpoint file (a manifest, a changelog's metadata, Spark's logs and
    metadata): as ``json.loads``, and a document nested deeper than Python's recursion limit is
    a ``ValueError`` like any other malformed one (``json`` raises ``RecursionError``, which no
    reader's ``except ValueError`` catches: it escaped without the file's name)."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
