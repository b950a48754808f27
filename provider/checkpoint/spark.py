"""Spark's own files in a checkpoint, read the way Spark writes them (the twin of the JVM's
``SparkMetadata``): the offset and commit logs (``v1`` line, then JSON), an operator's metadata
(``state/<op>/_metadata/metadata``), and the state schema files (``SchemaHelper`` v1 and v2).
Every read is size-capped (``layout.MAX_SPARK_METADATA_BYTES``) and, locally, follows no link.
"""
from __future__ import annotations

import struct
from typing import Any

from ..formats import layout
from .errors import CheckpointError
from .storage import Storage


def read_spark_file(storage: Storage, path: str) -> bytes:
    """A Spark metadata file, size-capped; MissingFileError (a FileNotFoundError) when absent."""
    return storage.read_bytes(path, layout.MAX_SPARK_METADATA_BYTES, "Spark metadata file")


def parse_log_entry(data: bytes, path: str) -> tuple[str, Any, list[str]]:
    """(version line, JSON of the second line, the lines after it) of an offset or commit log
    entry."""
    try:
        lines = data.decode("utf-8").split("\n")
        return lines[0], layout.json_of(lines[1]), lines[2:]
    except (IndexError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise CheckpointError(f"{path} is truncated or corrupt ({exc})") from None


def parse_operator_stores(data: bytes, path: str) -> tuple[str | None, list[tuple[str, int, int]]]:
    """The operator's name and its stores as (name, partition count, prefix key columns) from
    Spark's operator metadata; store names are checked (they become paths)."""
    try:
        version, _, body = data.decode("utf-8").partition("\n")
        if not version.startswith("v"):
            raise ValueError(f"unexpected first line {version[:40]!r}")
        meta = layout.json_of(body)
        return (meta["operatorInfo"]["operatorName"],
                [(layout.checked_store_name(s["storeName"], path), int(s["numPartitions"]),
                  int(s.get("numColsPrefixKey", 0))) for s in meta.get("stateStoreInfo", [])])
    except layout.UnsafePathError as exc:
        raise CheckpointError(str(exc)) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"operator metadata {path} is truncated or corrupt ({exc})") from None


def parse_operator_metadata(data: bytes, path: str) -> tuple[str | None, dict[str, int]]:
    """The operator's name and its stores' partition counts (:func:`parse_operator_stores`)."""
    name, stores = parse_operator_stores(data, path)
    return name, {store: partitions for store, partitions, _ in stores}


def operator_metadata(storage: Storage, op_path: str) -> tuple[str | None, dict[str, int]]:
    """Spark's operator metadata of the operator at ``op_path``; older checkpoints lack it, then
    (None, {}) and the directories are all we know."""
    p = storage.join(op_path, "_metadata", "metadata")
    try:
        data = read_spark_file(storage, p)
    except FileNotFoundError:
        return None, {}
    except OSError as exc:
        raise CheckpointError(f"cannot read operator metadata {p}: {exc}") from None
    return parse_operator_metadata(data, p)


def read_utf(data: bytes, pos: int) -> tuple[str, int]:
    """Java ``DataInput.readUTF``: u16 big-endian byte count, then modified UTF-8."""
    if pos + 2 > len(data):
        raise ValueError(f"truncated at byte {pos} (expected a string length)")
    (n,) = struct.unpack_from(">H", data, pos)
    raw = data[pos + 2:pos + 2 + n]
    if len(raw) != n:
        raise ValueError(f"truncated at byte {pos}: string of {n} bytes, {len(raw)} left")
    # modified UTF-8 writes U+0000 as C0 80 and supplementary characters as two 3-byte
    # surrogates; the surrogates are rejoined once all chunks are concatenated
    return raw.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass"), pos + 2 + n


def read_chunks(data: bytes, pos: int) -> tuple[str, int]:
    """A string ``SchemaHelper`` v2 writes as a chunk count, then each chunk as :func:`read_utf`."""
    if pos + 4 > len(data):
        raise ValueError(f"truncated at byte {pos} (expected a chunk count)")
    (count,) = struct.unpack_from(">i", data, pos)
    if count < 0:
        raise ValueError(f"negative chunk count {count} at byte {pos}")
    pos += 4
    parts = []
    for _ in range(count):
        part, pos = read_utf(data, pos)
        parts.append(part)
    return "".join(parts), pos


def parse_schema_json(data: bytes) -> tuple[str, str]:
    """(key schema JSON, value schema JSON) of a state schema file; ValueError (naming no file)
    for a truncated file or a format other than v1 and v2 (v3: transformWithState's column
    families)."""
    version, pos = read_utf(data, 0)
    if version == "v1":
        key_json, pos = read_utf(data, pos)
        value_json, pos = read_utf(data, pos)
    elif version == "v2":
        key_json, pos = read_chunks(data, pos)
        value_json, pos = read_chunks(data, pos)
    elif version == "v3":
        raise ValueError("schema format v3 (transformWithState column families) is not supported: only "
                         "single-store operators (v1/v2) are read")
    else:
        raise ValueError(f"unknown schema format version {version[:20]!r} (expected v1 or v2)")
    fix = lambda s: s.encode("utf-16-le", "surrogatepass").decode("utf-16-le")  # noqa: E731
    return fix(key_json), fix(value_json)


def read_schema(storage: Storage, path: str) -> tuple[dict, dict]:
    """(key schema, value schema) from Spark's state schema file at ``path``."""
    try:
        data = read_spark_file(storage, path)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read Spark's state schema file ({exc}); offline tools need it to "
                              "decode keys and values") from None
    try:
        key_json, value_json = parse_schema_json(data)
        return layout.json_of(key_json), layout.json_of(value_json)
    except (ValueError, UnicodeError) as exc:
        raise CheckpointError(f"{path} is not a readable Spark state schema file ({exc})") from None
