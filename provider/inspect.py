"""Offline inspection of a keyedstate checkpoint: what each stateful operator keeps, and where.

Operators need to know how big their state is, how evenly it spreads over partitions (key
groups are what a rescale moves), which versions a restart can still load and whether TTL is
on, without starting the query. :func:`inspect` answers from the checkpoint's files alone
(no Spark, no JVM): it rebuilds the counted version of every store partition the way a load
does (newest snapshot at or below it, then the changelogs after it) in a temporary RocksDB copy,
and streams over its keys, so memory stays bounded by the number of key groups, not keys.

The counted version is the one of the latest committed batch (batch b commits version b + 1),
which is what a restart and Spark's ``statestore`` reader see; a newer changelog belongs to a
batch in flight or one that failed and will be redone. Without a commit log, the newest version
on disk is counted. Only local checkpoints (paths or ``file:`` URIs) are read.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from rocksdict import AccessType, Options, Rdict, WriteBatch, WriteOptions

from . import changelog, keygroups

log = logging.getLogger(__name__)

CHANGELOG_SUFFIX = ".ks-changelog"
MANIFEST_SUFFIX = ".ks-snapshot"
FILES_DIR = "ks-files"
MANIFEST_FORMAT = "keyedstate-snapshot"
MANIFEST_FORMAT_VERSION = 1
DEFAULT_STORE = "default"
# Files of Spark's HDFS-backed and RocksDB providers (the JVM's CheckpointFiles uses the same).
_FOREIGN_FILE = re.compile(r"\d+\.(delta|snapshot|zip|changelog)")
_BATCH_SIZE = 65536  # records per RocksDB write batch while replaying a changelog


class InspectError(ValueError):
    """The checkpoint is missing, not keyedstate's, or holds a corrupt file (named in the message)."""


@dataclass
class _StoreFiles:
    """One store partition's directory listing: which versions it can still produce."""

    partition: int
    path: Path
    changelogs: set[int] = field(default_factory=set)
    snapshots: set[int] = field(default_factory=set)

    @property
    def latest(self) -> int | None:
        return max(self.changelogs | self.snapshots, default=None)

    def loadable(self) -> list[int]:
        """Versions a load can produce: a snapshot, or a loadable version plus its changelog."""
        out: list[int] = []
        for v in sorted(self.changelogs | self.snapshots):
            if v in self.snapshots or (v in self.changelogs and (v == 1 or (out and out[-1] == v - 1))):
                out.append(v)
        return out


def inspect(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """Report, per stateful operator and store, versions, exact key counts, key-group spread,
    bytes on disk and TTL of the keyedstate checkpoint at ``checkpoint``.

    Raises :class:`InspectError` naming the offending path if the directory is missing, was
    written by another state store provider, or holds a corrupt manifest or changelog.
    """
    root = _local_path(checkpoint)
    if not root.is_dir():
        raise InspectError(f"checkpoint directory {root} does not exist")
    state = root / "state"
    if not state.is_dir():
        raise InspectError(
            f"{root} has no state/ directory: not the checkpoint of a stateful streaming query")
    try:
        committed = _latest_committed_batch(root / "commits")
        operators = [_inspect_operator(op_dir, committed)
                     for op_dir in sorted(_numbered_dirs(state), key=lambda p: int(p.name))]
    except OSError as exc:  # e.g. a running query's cleanup deleted a file while we read
        raise InspectError(f"cannot read {exc.filename}: {exc.strerror or exc}") from exc
    if not any(store["partitions"] for op in operators for store in op["stores"]):
        raise InspectError(
            f"{state} holds no keyedstate state files (*{CHANGELOG_SUFFIX}, *{MANIFEST_SUFFIX}): "
            "this checkpoint was not written by keyedstate, or no batch has committed yet")
    return {"checkpoint": str(root), "latestCommittedBatch": committed, "operators": operators}


# -- the checkpoint layout -----------------------------------------------------------------------

def _local_path(checkpoint: str | os.PathLike) -> Path:
    text = os.fspath(checkpoint)
    if text.startswith("file:"):
        text = re.sub(r"^file:(//)?", "", text)
    elif re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", text):
        raise InspectError(f"{text}: inspect reads local checkpoints only; copy it to local disk first")
    return Path(text).absolute()


def _numbered_dirs(directory: Path) -> Iterator[Path]:
    return (p for p in directory.iterdir() if p.is_dir() and p.name.isdigit())


def _latest_committed_batch(commits: Path) -> int | None:
    if not commits.is_dir():
        return None
    return max((int(p.name) for p in commits.iterdir() if p.name.isdigit() and p.is_file()), default=None)


def _operator_metadata(op_dir: Path) -> tuple[str | None, dict[str, int]]:
    """Spark's operator metadata (``v1`` line, then JSON): the operator's name and its stores'
    partition counts. Older checkpoints lack it; then the directories are all we know."""
    path = op_dir / "_metadata" / "metadata"
    if not path.is_file():
        return None, {}
    try:
        version, _, body = path.read_text(encoding="utf-8").partition("\n")
        if not version.startswith("v"):
            raise ValueError(f"unexpected first line {version!r}")
        meta = json.loads(body)
        name = meta["operatorInfo"]["operatorName"]
        stores = {s["storeName"]: int(s["numPartitions"]) for s in meta.get("stateStoreInfo", [])}
    except (ValueError, KeyError, TypeError) as exc:
        raise InspectError(f"operator metadata {path} is truncated or corrupt ({exc})") from exc
    return name, stores


def _list_store(path: Path, partition: int) -> _StoreFiles | None:
    """The keyedstate files of one store partition; refuses another provider's files."""
    files = _StoreFiles(partition, path)
    foreign = []
    for entry in path.iterdir():
        name = entry.name
        if not entry.is_file() or name.startswith("."):
            continue
        for suffix, versions in ((CHANGELOG_SUFFIX, files.changelogs), (MANIFEST_SUFFIX, files.snapshots)):
            if name.endswith(suffix) and name[: -len(suffix)].isdigit():
                versions.add(int(name[: -len(suffix)]))
        if _FOREIGN_FILE.fullmatch(name):
            foreign.append(name)
    if foreign:
        raise InspectError(
            f"{path} holds files of another state store provider ({', '.join(sorted(foreign)[:5])}): "
            "this checkpoint was not written by keyedstate")
    if not files.changelogs and not files.snapshots and not (path / FILES_DIR).is_dir():
        return None
    return files


def _discover_stores(op_dir: Path) -> dict[str, list[_StoreFiles]]:
    """``default`` lives in the partition directory itself, other stores in subdirectories."""
    stores: dict[str, list[_StoreFiles]] = {}
    for part_dir in sorted(_numbered_dirs(op_dir), key=lambda p: int(p.name)):
        partition = int(part_dir.name)
        candidates = [(DEFAULT_STORE, part_dir)] + [
            (p.name, p) for p in sorted(part_dir.iterdir())
            if p.is_dir() and p.name not in (FILES_DIR, "_metadata") and not p.name.startswith(".")]
        for name, path in candidates:
            listed = _list_store(path, partition)
            if listed is not None:
                stores.setdefault(name, []).append(listed)
    return stores


def _bytes_on_disk(path: Path) -> int:
    """The store's own files (not other stores' subdirectories) plus its snapshot files."""
    total = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    files_dir = path / FILES_DIR
    if files_dir.is_dir():
        total += sum(p.stat().st_size for p in files_dir.rglob("*") if p.is_file())
    return total


# -- snapshot manifests ----------------------------------------------------------------------------

def _read_manifest(path: Path, version: int) -> dict[str, Any]:
    """Parse and check a snapshot manifest as the JVM's CheckpointFiles.readManifest does."""
    try:
        node = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(node, dict) or node.get("format") != MANIFEST_FORMAT:
            raise ValueError("not a keyedstate snapshot manifest")
        if node.get("formatVersion") != MANIFEST_FORMAT_VERSION:
            raise ValueError(f"manifest format version {node.get('formatVersion')}, "
                             f"this keyedstate reads {MANIFEST_FORMAT_VERSION}")
        if int(node["version"]) != version:
            raise ValueError(f"it describes version {node['version']}")
        int(node["keyGroups"]), int(node["numKeys"])
        for f in node["files"]:
            str(f["name"]), str(f["path"]), int(f["size"])
        ttl = node.get("ttl")
        if ttl is not None and not isinstance(ttl, dict):
            raise ValueError(f"field 'ttl' is {type(ttl).__name__}, expected an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InspectError(f"snapshot manifest {path} is truncated or corrupt ({exc})") from exc
    return node


# -- rebuilding a version --------------------------------------------------------------------------

def _count_version(store: _StoreFiles, version: int,
                   manifests: dict[int, dict]) -> tuple[Counter, int | None, int, int | None]:
    """Rebuild ``version`` of one store partition in a temporary RocksDB and count its keys per
    key group. Returns ``(counts, base snapshot, changelogs applied, key groups)``."""
    base = max((s for s in store.snapshots if s <= version), default=None)
    needed = range((base or 0) + 1, version + 1)
    missing = [v for v in needed if v not in store.changelogs]
    if missing:
        raise InspectError(
            f"cannot rebuild version {version} of {store.path}: missing "
            f"{', '.join(str(store.path / f'{v}{CHANGELOG_SUFFIX}') for v in missing[:3])}"
            f"{' ...' if len(missing) > 3 else ''}")
    key_groups = int(manifests[base]["keyGroups"]) if base is not None else None
    with tempfile.TemporaryDirectory(prefix="keyedstate-inspect-") as tmp:
        db_dir = Path(tmp) / "db"
        db_dir.mkdir()
        if base is not None:
            _copy_snapshot(store.path, store.path / f"{base}{MANIFEST_SUFFIX}", manifests[base], db_dir)
        db = _open(db_dir, read_only=base is not None and not needed)
        try:
            for v in needed:
                key_groups = _apply_changelog(db, store.path / f"{v}{CHANGELOG_SUFFIX}", v, key_groups)
            counts: Counter = Counter()
            group_of = keygroups.key_group_of_stored_key
            for key in db.keys():
                counts[group_of(key)] += 1
        finally:
            db.close()
    log.debug("counted version %d of %s: snapshot %s + %d changelogs", version, store.path, base, len(needed))
    return counts, base, len(needed), key_groups


def _open(db_dir: Path, read_only: bool) -> Rdict:
    """Open the private copy; read-write only when changelogs are to be applied on top.

    The default column family gets explicit options: otherwise rocksdict takes them from the
    snapshot's OPTIONS file, i.e. the state server's vector memtable, which RocksDB refuses
    without its other settings."""
    options = Options(raw_mode=True)
    families = {"default": Options(raw_mode=True)}
    if read_only:
        return Rdict(str(db_dir), options=options, column_families=families,
                     access_type=AccessType.read_only())
    options.create_if_missing(True)
    db = Rdict(str(db_dir), options=options, column_families=families)
    write_options = WriteOptions()
    write_options.disable_wal = True  # a throwaway copy
    db.set_write_options(write_options)
    return db


def _copy_snapshot(store_dir: Path, manifest_path: Path, manifest: dict, db_dir: Path) -> None:
    """Copy the manifest's files into ``db_dir`` under their RocksDB names (never touch the
    checkpoint's own copies: RocksDB rewrites MANIFEST and CURRENT when it opens read-write)."""
    for f in manifest["files"]:
        source = store_dir / f["path"]
        try:
            size = source.stat().st_size
        except OSError as exc:
            raise InspectError(f"snapshot manifest {manifest_path} lists {source}, which is missing") from exc
        if size != int(f["size"]):
            raise InspectError(
                f"{source} has {size} bytes but snapshot manifest {manifest_path} says {f['size']}: "
                "truncated or corrupt")
        shutil.copyfile(source, db_dir / f["name"])


def _apply_changelog(db: Rdict, path: Path, version: int, key_groups: int | None) -> int:
    """Write one changelog's records into ``db``; returns its key-group count (checked against
    the previous file's, since the count is fixed for a checkpoint)."""
    try:
        log_ = changelog.read_file(str(path))
    except changelog.CorruptChangelogError as exc:
        raise InspectError(str(exc)) from exc
    except OSError as exc:
        raise InspectError(f"cannot read {path}: {exc}") from exc
    if log_.version != version:
        raise InspectError(f"{path} holds version {log_.version}, expected {version}: corrupt or misplaced")
    if key_groups is not None and log_.key_groups != key_groups:
        raise InspectError(f"{path} was written with {log_.key_groups} key groups, the files before "
                           f"it with {key_groups}: corrupt or mixed checkpoint")
    batch, pending = WriteBatch(raw_mode=True), 0
    try:
        for op, key, value in log_.records():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
            pending += 1
            if pending == _BATCH_SIZE:
                db.write(batch)
                batch, pending = WriteBatch(raw_mode=True), 0
    except changelog.CorruptChangelogError as exc:
        raise InspectError(f"{path}: {exc}") from exc
    if pending:
        db.write(batch)
    return log_.key_groups


# -- the report ------------------------------------------------------------------------------------

def _inspect_operator(op_dir: Path, committed: int | None) -> dict[str, Any]:
    name, meta_partitions = _operator_metadata(op_dir)
    discovered = _discover_stores(op_dir)
    found_partitions = {f.partition for parts in discovered.values() for f in parts}
    num_partitions = max(meta_partitions.values(), default=0) or (max(found_partitions) + 1 if found_partitions else 0)
    store_names = list(meta_partitions) + sorted(set(discovered) - set(meta_partitions))
    stores = [_inspect_store(op_dir, store, discovered.get(store, []), num_partitions, committed)
              for store in store_names]
    return {"operatorId": int(op_dir.name), "operatorName": name, "numPartitions": num_partitions,
            "storeNames": store_names, "stores": stores}


def _inspect_store(op_dir: Path, name: str, parts: list[_StoreFiles], num_partitions: int,
                   committed: int | None) -> dict[str, Any]:
    warnings: list[str] = []
    absent = sorted(set(range(num_partitions)) - {p.partition for p in parts})
    if absent:
        warnings.append(f"no keyedstate files for partitions {absent}")
    extra = sorted(p.partition for p in parts if p.partition >= num_partitions)
    if extra:
        warnings.append(f"partitions {extra} are beyond the operator's {num_partitions} partitions")
    latest = max((p.latest for p in parts if p.latest is not None), default=None)
    target = committed + 1 if committed is not None else latest

    partitions: list[dict[str, Any]] = []
    key_groups_seen: set[int] = set()
    ttls: dict[int, dict | None] = {}  # newest manifest version -> its TTL, per partition
    for files in parts:
        manifests = {v: _read_manifest(files.path / f"{v}{MANIFEST_SUFFIX}", v) for v in sorted(files.snapshots)}
        key_groups_seen.update(int(m["keyGroups"]) for m in manifests.values())
        ttl = manifests[max(manifests)].get("ttl") if manifests else None
        if manifests:
            ttls.setdefault(max(manifests), ttl)
        counts, base, applied, kg = (Counter(), None, 0, None) if not target else \
            _count_version(files, target, manifests)
        if kg is not None:
            key_groups_seen.add(kg)
        loadable = files.loadable()
        partitions.append({
            "partitionId": files.partition,
            "path": str(files.path),
            "latestVersion": files.latest,
            "retainedVersions": [loadable[0], loadable[-1]] if loadable else None,
            "snapshotVersions": sorted(files.snapshots),
            "changelogCount": len(files.changelogs),
            "countedVersion": target,
            "countedFrom": {"snapshot": base, "changelogs": applied},
            "keys": sum(counts.values()),
            "keyGroupsWithData": len(counts),
            "keysPerKeyGroup": sorted([g, n] for g, n in counts.items()),
            "ttl": ttl,
            "bytesOnDisk": _bytes_on_disk(files.path),
        })
    if len(key_groups_seen) > 1:
        raise InspectError(f"store {name} of {op_dir} mixes key-group counts {sorted(key_groups_seen)}: "
                           "the count is fixed for a checkpoint, so the files are corrupt or mixed")
    key_groups = next(iter(key_groups_seen), None)
    if len({json.dumps(t, sort_keys=True) for t in ttls.values()}) > 1:
        warnings.append("partitions' newest snapshot manifests disagree on TTL; showing the newest")
    keys = [p["keys"] for p in partitions]
    total = sum(keys)
    mean = total / num_partitions if num_partitions else 0.0
    misplaced = None
    if key_groups and num_partitions and key_groups % num_partitions == 0:
        misplaced = sum(n for p in partitions for g, n in p["keysPerKeyGroup"]
                        if g % num_partitions != p["partitionId"])
        if misplaced:
            warnings.append(f"{misplaced} keys sit in a partition that does not own their key group")
    for w in warnings:
        log.warning("%s store %s: %s", op_dir, name, w)
    # Partitions without files hold no keys: they count in the spread as zeros.
    spread = keys + [0] * len(absent)
    retained = [p["retainedVersions"] for p in partitions if p["retainedVersions"]]
    return {
        "storeName": name,
        "keyGroups": key_groups,
        "latestVersion": latest,
        "countedVersion": target,
        "retainedVersions": [max(r[0] for r in retained), min(r[1] for r in retained)] if retained else None,
        "snapshotVersions": sorted({v for p in partitions for v in p["snapshotVersions"]}),
        "totalKeys": total,
        "bytesOnDisk": sum(p["bytesOnDisk"] for p in partitions),
        "distribution": {
            "minKeys": min(spread, default=0),
            "maxKeys": max(spread, default=0),
            "meanKeys": mean,
            "maxToMean": max(spread) / mean if mean else None,
            "keyGroupsWithData": sum(p["keyGroupsWithData"] for p in partitions),
            "misplacedKeys": misplaced,
        },
        "ttl": ttls[max(ttls)] if ttls else None,
        "warnings": warnings,
        "partitions": partitions,
    }


def render(report: dict[str, Any]) -> str:
    """The report as readable tables, one per operator store (what ``keyedstate inspect`` prints)."""
    lines = [f"checkpoint {report['checkpoint']}",
             f"latest committed batch: {_or(report['latestCommittedBatch'], 'none')}"]
    for op in report["operators"]:
        lines += ["", f"operator {op['operatorId']}  {_or(op['operatorName'], '(name unknown)')}  "
                      f"partitions: {op['numPartitions']}  stores: {', '.join(op['storeNames'])}"]
        for s in op["stores"]:
            d = s["distribution"]
            retained = s["retainedVersions"]
            lines += [
                "",
                f"  store {s['storeName']}",
                f"    versions   counted {_or(s['countedVersion'], '-')}, latest {_or(s['latestVersion'], '-')}, "
                f"retained {f'{retained[0]}..{retained[1]}' if retained else '-'}, "
                f"snapshots {', '.join(map(str, s['snapshotVersions'])) or 'none'}",
                f"    keys       {s['totalKeys']} in {d['keyGroupsWithData']} key groups "
                f"(of {_or(s['keyGroups'], '?')}); {_size(s['bytesOnDisk'])} on disk",
                f"    balance    min {d['minKeys']}, max {d['maxKeys']}, mean {d['meanKeys']:.1f}, "
                f"max/mean {_or(d['maxToMean'] and round(d['maxToMean'], 2), '-')}",
                f"    TTL        {_ttl(s['ttl'])}",
            ]
            lines += [f"    warning    {w}" for w in s["warnings"]]
            rows = [("partition", "keys", "key groups", "from snapshot", "+changelogs", "on disk")]
            rows += [(str(p["partitionId"]), str(p["keys"]), str(p["keyGroupsWithData"]),
                      _or(p["countedFrom"]["snapshot"], "-"), str(p["countedFrom"]["changelogs"]),
                      _size(p["bytesOnDisk"])) for p in s["partitions"]]
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
            lines += ["    " + "  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines) + "\n"


def _or(value: Any, default: str) -> str:
    return default if value is None else str(value)


def _ttl(ttl: dict | None) -> str:
    if ttl is None:
        return "off/unknown"
    return ", ".join(f"{k}={v}" for k, v in ttl.items())


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
