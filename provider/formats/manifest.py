"""The snapshot manifest: which files make up the RocksDB snapshot of one version.

Spec: FORMATS.md, "Snapshot manifest"; the JVM twin is ``ManifestFormat.scala``; golden files in
``tests/golden/``. A manifest is compact UTF-8 JSON with its keys in this order::

    {"format":"keyedstate-snapshot","formatVersion":1,"version":<v>,"keyGroups":<n>,
     "numKeys":<n>,"files":[{"name":..,"path":..,"size":..},..],
     ["replay":{"name":..,"path":..,"size":..},] ["keyLayout":{..},] ["ttl":{..},] ["rescale":{..},]
     ["runId":".."]}

``files`` are RocksDB's checkpoint files under their RocksDB ``name``, stored at ``path`` (inside
``ks-files/``, shared by every manifest listing it). ``replay``: a changelog holding the whole
version, to apply onto ``files`` taken as version ``version - 1`` (written by the offline
rescale). ``keyLayout`` says how stored keys are laid out (formats/stored.py), so offline tools
never guess it from operator names; it is absent in manifests written before it existed.
``runId``: the query run that uploaded the snapshot (absent in offline writers' and older
manifests); under checkpoint format 1 the snapshot is the version's only while the version's
changelog names the same run (:func:`of_another_run`).
Names and paths are checked with the rule in formats/layout.py when the manifest is read.
"""
from __future__ import annotations

import collections
import json
from dataclasses import dataclass, field
from typing import Any

from . import layout
from .stored import KeyLayout

FORMAT = "keyedstate-snapshot"
FORMAT_VERSION = 1


class CorruptManifestError(ValueError):
    """A manifest is truncated, corrupt, foreign or names files it may not; the message names it."""


@dataclass(frozen=True)
class SnapshotFile:
    name: str  # RocksDB's name for it
    path: str  # where it is, relative to the store partition's directory
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "size": self.size}


@dataclass(frozen=True)
class Manifest:
    version: int
    key_groups: int
    num_keys: int
    files: tuple[SnapshotFile, ...]
    replay: SnapshotFile | None = None
    key_layout: KeyLayout | None = None
    ttl: dict[str, Any] | None = None
    rescale: dict[str, Any] | None = None  # what an offline rescale records about itself
    run_id: str | None = None  # the query run that uploaded it
    extra: dict[str, Any] = field(default_factory=dict)  # fields of newer writers, kept as read

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT, "formatVersion": FORMAT_VERSION, "version": self.version,
                               "keyGroups": self.key_groups, "numKeys": self.num_keys,
                               "files": [f.to_json() for f in self.files]}
        if self.replay is not None:
            out["replay"] = self.replay.to_json()
        if self.key_layout is not None:
            out["keyLayout"] = self.key_layout.to_json()
        if self.ttl is not None:
            out["ttl"] = self.ttl
        if self.rescale is not None:
            out["rescale"] = self.rescale
        if self.run_id is not None:
            out["runId"] = self.run_id
        out.update(self.extra)
        return out


def encode(manifest: Manifest) -> bytes:
    return json.dumps(manifest.to_json(), separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode(data: bytes, source: str, version: int | None = None) -> Manifest:
    """Parse and check a manifest (of ``version``, if given); ``source`` names it in errors."""
    try:
        node = layout.json_of(data.decode("utf-8"))
        if not isinstance(node, dict) or node.get("format") != FORMAT:
            raise ValueError("not a keyedstate snapshot manifest")
        if node.get("formatVersion") != FORMAT_VERSION:
            raise ValueError(f"manifest format version {node.get('formatVersion')}, "
                             f"this keyedstate reads {FORMAT_VERSION}")
        found = _int(node, "version")
        if version is not None and found != version:
            raise ValueError(f"it describes version {found}")
        files = tuple(_file(f, source) for f in _list(node, "files"))
        # each name is a file of the restored RocksDB directory: two entries cannot share one
        names = collections.Counter(f.name for f in files)
        for name, times in names.items():
            if times > 1:
                raise ValueError(f"it lists the file name {name} {times} times")
        replay = _file(node["replay"], source) if node.get("replay") is not None else None
        # present means an object: null is refused, as by the JVM (FORMATS.md, "Text and metadata")
        key_layout = KeyLayout.from_json(node["keyLayout"]) if "keyLayout" in node else None
        ttl, rescale = node.get("ttl"), node.get("rescale")
        for name, value in (("ttl", ttl), ("rescale", rescale)):
            if value is not None and not isinstance(value, dict):
                raise ValueError(f"field '{name}' is {type(value).__name__}, expected an object")
        run_id = node.get("runId")
        if run_id is not None and not isinstance(run_id, str):
            raise ValueError(f"field 'runId' is {run_id!r}, expected a string")
        known = {"format", "formatVersion", "version", "keyGroups", "numKeys", "files", "replay", "keyLayout",
                 "ttl", "rescale", "runId"}
        return Manifest(found, _int(node, "keyGroups", _MAX_INT), _int(node, "numKeys"), files, replay, key_layout,
                        ttl, rescale, run_id, extra={k: v for k, v in node.items() if k not in known})
    except layout.UnsafePathError:
        raise
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise CorruptManifestError(f"snapshot manifest {source} is truncated or corrupt ({exc})") from exc


def of_another_run(manifest: Manifest, changelog_run: str | None, changelog_path: str) -> str | None:
    """Under checkpoint format 1, why ``manifest`` is not the snapshot of its version: the
    version's changelog (at ``changelog_path``, committed by ``changelog_run``) names another run,
    whose attempt replaced the one the snapshot was taken of. None when they agree or the
    manifest names no run (offline writers, older manifests). The JVM's twin is
    ``CheckpointFiles.otherRun``."""
    if manifest.run_id is None or changelog_run == manifest.run_id:
        return None
    committer = f"run {changelog_run}" if changelog_run is not None else "no query run"
    return (f"it was uploaded by run {manifest.run_id}, but {changelog_path} was committed by {committer}: "
            "a snapshot of another attempt of the version")


_MAX_INT = (1 << 31) - 1
_MAX_LONG = (1 << 63) - 1


def _int(node: dict, key: str, limit: int = _MAX_LONG) -> int:
    """A non-negative integer field, at most ``limit`` (the JVM's Int or Long)."""
    value = node[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"field '{key}' is {value!r}, expected a non-negative integer")
    if value > limit:
        raise ValueError(f"field '{key}' is {value}, expected at most {limit}")
    return value


def _list(node: dict, key: str) -> list:
    value = node[key]
    if not isinstance(value, list):
        raise ValueError(f"field '{key}' is {type(value).__name__}, expected a list")
    return value


def _file(node: Any, source: str) -> SnapshotFile:
    if not isinstance(node, dict):
        raise ValueError(f"a file entry is {type(node).__name__}, expected an object")
    return SnapshotFile(layout.checked_file_name(node["name"], source),
                        layout.checked_relative_path(node["path"], source), _int(node, "size"))
