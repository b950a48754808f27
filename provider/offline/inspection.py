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
from collections import Counter
from pathlib import Path
from typing import Any

from ..formats import keygroups, rocksdb
from ..formats.layout import CHANGELOG_SUFFIX, MANIFEST_SUFFIX, MAX_SPARK_METADATA_BYTES, json_of, read_file
from ..checkpoint import (CheckpointError, StoreFiles, bytes_on_disk, discover_stores, latest_committed_batch,
                         local_path, numbered_dirs, operator_metadata, read_manifest, rebuild, refuse_links)
from .checkpoint_format import refuse_checkpoint_format_2
from .storage import LocalStorage
from ..checkpoint import Checkpoint, CheckpointProblem

log = logging.getLogger(__name__)

InspectError = CheckpointError
"""The checkpoint is missing, not keyedstate's, or holds a corrupt file (named in the message)."""


FORMAT_2_REASON = ("checkpoint format version 2 (state files named <version>_<unique id>): keyedstate inspect "
                   "reads format 1 only; keyedstate verify reads both")
"""Why inspect refuses a checkpoint under format 2 (:func:`.checkpoint_format.refuse_checkpoint_format_2`)."""


def inspect(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """Report, per stateful operator and store, versions, exact key counts, key-group spread,
    bytes on disk and TTL of the keyedstate checkpoint at ``checkpoint``.

    Raises :class:`InspectError` naming the offending path if the directory is missing, was
    written by another state store provider, or holds a corrupt manifest or changelog.
    """
    root = local_path(checkpoint)
    if not root.is_dir():
        raise InspectError(f"checkpoint directory {root} does not exist")
    state = root / "state"
    if not state.is_dir():
        raise InspectError(
            f"{root} has no state/ directory: not the checkpoint of a stateful streaming query")
    refuse_links(root, "offsets", "commits", "state")
    try:
        Checkpoint(LocalStorage(root)).refuse_foreign("inspect")
    except CheckpointProblem as exc:
        raise InspectError(str(exc)) from None
    try:
        committed = latest_committed_batch(root / "commits")
        if committed is not None:
            refuse_checkpoint_format_2(Checkpoint(LocalStorage(root)), committed, error=InspectError,
                                       reason=FORMAT_2_REASON)
        partitions = _committed_partition_count(root, committed)
        operators = [_inspect_operator(op_dir, committed, partitions)
                     for op_dir in sorted(numbered_dirs(state), key=lambda p: int(p.name))]
    except OSError as exc:  # e.g. a running query's cleanup deleted a file while we read
        raise InspectError(f"cannot read {exc.filename}: {exc.strerror or exc}") from exc
    if not any(store["partitions"] for op in operators for store in op["stores"]):
        raise InspectError(
            f"{state} holds no keyedstate state files (*{CHANGELOG_SUFFIX}, *{MANIFEST_SUFFIX}): "
            "this checkpoint was not written by keyedstate, or no batch has committed yet")
    return {"checkpoint": str(root), "latestCommittedBatch": committed, "operators": operators}


def _committed_partition_count(root, committed: int | None) -> int | None:
    """The partition count the latest committed batch ran with (its offset-log entry records
    it; after a rescale it differs from the count in Spark's unversioned operator metadata)."""
    if committed is None:
        return None
    path = root / "offsets" / str(committed)
    try:
        lines = read_file(path, MAX_SPARK_METADATA_BYTES, "Spark metadata file").decode("utf-8").split("\n")
        value = json_of(lines[1]).get("conf", {}).get("spark.sql.shuffle.partitions")
        return int(value) if value is not None else None
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _count_version(store: StoreFiles, version: int,
                   manifests: dict) -> tuple[Counter, int | None, int, int | None, tuple[str, ...]]:
    """Rebuild ``version`` of one store partition and count its keys per key group.
    Returns ``(counts, base snapshot, changelogs applied, key groups, snapshots skipped)``."""
    with rebuild(store, version, manifests) as rebuilt:
        counts: Counter = Counter()
        group_of = keygroups.key_group_of_stored_key
        key = None
        for key in rebuilt.db.keys():
            counts[group_of(key)] += 1
        try:
            rocksdb.check_scan_end(rebuilt.db, key)
        except rocksdb.ScanError as exc:
            raise CheckpointError(f"version {version} of {store.path}: {exc}") from exc
    log.debug("counted version %d of %s: snapshot %s + %d changelogs",
              version, store.path, rebuilt.base_snapshot, rebuilt.changelogs_applied)
    return counts, rebuilt.base_snapshot, rebuilt.changelogs_applied, rebuilt.key_groups, rebuilt.skipped


def _read_manifests(files: StoreFiles) -> dict:
    """Every snapshot manifest of a store partition by version; an unreadable one maps to the
    error naming it (rebuild() then passes it over for an older snapshot, like a load)."""
    out: dict = {}
    for v in sorted(files.snapshots):
        try:
            out[v] = read_manifest(files.manifest_path(v), v)
        except InspectError as exc:
            out[v] = exc
    return out


# -- the report ------------------------------------------------------------------------------------

def _inspect_operator(op_dir: Path, committed: int | None, committed_partitions: int | None) -> dict[str, Any]:
    name, meta_partitions = operator_metadata(op_dir)
    discovered = discover_stores(op_dir)
    found_partitions = {f.partition for parts in discovered.values() for f in parts}
    num_partitions = committed_partitions or max(meta_partitions.values(), default=0) or \
        (max(found_partitions) + 1 if found_partitions else 0)
    store_names = list(meta_partitions) + sorted(set(discovered) - set(meta_partitions))
    stores = [_inspect_store(op_dir, store, discovered.get(store, []), num_partitions, committed)
              for store in store_names]
    return {"operatorId": int(op_dir.name), "operatorName": name, "numPartitions": num_partitions,
            "storeNames": store_names, "stores": stores}


def _inspect_store(op_dir: Path, name: str, parts: list[StoreFiles], num_partitions: int,
                   committed: int | None) -> dict[str, Any]:
    warnings: list[str] = []
    absent = sorted(set(range(num_partitions)) - {p.partition for p in parts})
    if absent:
        warnings.append(f"no keyedstate files for partitions {absent}")
    extra = sorted(p.partition for p in parts if p.partition >= num_partitions)
    if extra:
        # Left by a rescale to fewer partitions (kept, like Spark's repartition keeps them, so
        # the old layout stays readable); the query no longer loads them.
        warnings.append(f"partitions {extra} are beyond the operator's {num_partitions} partitions "
                        "(left by a rescale; not counted)")
        parts = [p for p in parts if p.partition < num_partitions]
    latest = max((p.latest for p in parts if p.latest is not None), default=None)
    target = committed + 1 if committed is not None else latest

    partitions: list[dict[str, Any]] = []
    key_groups_seen: set[int] = set()
    ttls: dict[int, dict | None] = {}  # newest manifest version -> its TTL, per partition
    for files in parts:
        read = _read_manifests(files)
        manifests = {v: m for v, m in read.items() if not isinstance(m, InspectError)}
        key_groups_seen.update(m.key_groups for m in manifests.values())
        ttl = manifests[max(manifests)].ttl if manifests else None
        if manifests:
            ttls.setdefault(max(manifests), ttl)
        counts, base, applied, kg, skipped = (Counter(), None, 0, None, ()) if not target else \
            _count_version(files, target, read)
        warnings += [f"partition {files.partition}: {s}; counted from an older snapshot or changelogs"
                     for s in skipped]
        warnings += [f"partition {files.partition}: {e}" for v, e in read.items() if isinstance(e, InspectError)
                     and not any(str(files.manifest_path(v)) in s for s in skipped)]
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
            "bytesOnDisk": bytes_on_disk(files.path),
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
    if key_groups and keygroups.divides(num_partitions, key_groups):
        owner = keygroups.partition_of_key_group
        misplaced = sum(n for p in partitions for g, n in p["keysPerKeyGroup"]
                        if owner(g, key_groups, num_partitions) != p["partitionId"])
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
