"""What a rescale reads before it writes anything: the stores and their partitions, the
key-group count, each store's key layout, and how to rehash keys when key groups cannot route."""
from __future__ import annotations

import logging
from pathlib import Path

from ...formats import changelog
from ...formats.layout import DEFAULT_STORE
from ...formats.stored import KeyLayout
from ... import checkpoint as ckpt
from ...checkpoint.keylayout import legacy_key_layout
from .errors import RescaleError
from .sparklogs import LOGGER

log = logging.getLogger(LOGGER)


def list_stores(root: Path, old_n: int) -> list[tuple[int, str, list[ckpt.StoreFiles]]]:
    """The keyedstate stores of every stateful operator, each with its old partitions."""
    out = []
    for op_dir in sorted(ckpt.numbered_dirs(root / "state"), key=lambda p: int(p.name)):
        if (op_dir / "_metadata" / "v2").is_dir():
            raise RescaleError(f"{op_dir} has versioned operator metadata (transformWithState), which "
                               "keyedstate does not serve")
        discovered = ckpt.discover_stores(op_dir)
        for name in sorted(discovered):
            parts = [p for p in discovered[name] if p.partition < old_n]
            missing = sorted(set(range(old_n)) - {p.partition for p in parts})
            if missing:
                raise RescaleError(f"store {name} of {op_dir} has no keyedstate files for partitions {missing}")
            out.append((int(op_dir.name), name, parts))
    if not out:
        raise RescaleError(f"{root / 'state'} holds no keyedstate state")
    return out


def key_group_count(root: Path, stores, version: int) -> int:
    """The checkpoint's key-group count, from any manifest or changelog (it is fixed)."""
    for _, _, parts in stores:
        for files in parts:
            for v in sorted(files.snapshots, reverse=True):
                manifest = readable_manifest(files, v)
                if manifest is not None:
                    return manifest.key_groups
            for v in sorted(files.changelogs, reverse=True):
                try:
                    return changelog.read_file(str(files.changelog_path(v))).key_groups
                except changelog.CorruptChangelogError as exc:
                    raise RescaleError(str(exc)) from exc
    raise RescaleError(f"no manifest or changelog at or below version {version} in {root / 'state'}")


def store_key_layout(parts: list[ckpt.StoreFiles]) -> KeyLayout | None:
    """The store's key layout as its newest manifest records it (None: not recorded)."""
    for files in parts:
        for v in sorted(files.snapshots, reverse=True):
            manifest = readable_manifest(files, v)
            if manifest is not None and manifest.key_layout is not None:
                return manifest.key_layout
    return None


def readable_manifest(files: ckpt.StoreFiles, version: int):
    """A snapshot manifest, or None (with a warning naming it) when it is unusable: the splits
    then rebuild from an older snapshot plus changelogs, like a load."""
    try:
        return ckpt.read_manifest(files.manifest_path(version), version)
    except ckpt.CheckpointError as exc:
        log.warning("%s; rescaling without it", exc)
        return None


def hash_spec(op: int, store: str, path: Path, key_layout: KeyLayout | None) -> dict:
    """How to recompute Spark's partition hash of a stored key (when key groups cannot say):
    the key schema from Spark's schema file, and the key layout (which columns are hashed)."""
    from ..sparkhash import read_key_schema

    op_dir = path.parent if store == DEFAULT_STORE else path.parent.parent
    schema_file = ckpt.store_dir(op_dir, 0, store) / "_metadata" / "schema"
    if not schema_file.is_file():
        raise RescaleError(f"{schema_file} is missing: rescaling to a partition count that does not divide "
                           "the key-group count needs Spark's state schema to rehash keys")
    if key_layout is None:
        key_layout = legacy_key_layout(store, ckpt.operator_metadata(op_dir)[0] or "",
                                       len(read_key_schema(str(schema_file))["fields"]))
    return {"schemaFile": str(schema_file), "keyLayout": key_layout.to_json()}


def json_or_none(layout: KeyLayout | None) -> dict | None:
    return None if layout is None else layout.to_json()


