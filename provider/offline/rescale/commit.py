"""The commit step's file moves: the new partitions' snapshots from the outbox into the
checkpoint, and the partition count in each operator's metadata."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ...formats import layout
from ...formats.layout import FILES_DIR
from ... import checkpoint as ckpt
from .errors import RescaleError
from .sparklogs import LOGGER

log = logging.getLogger(LOGGER)


def publish(staged: Path, target: Path, version: int, root: Path, partition: int, store: str) -> None:
    """Move the snapshot ``version`` of one new store partition from the outbox into the
    checkpoint ``root``: the files it lists first, its manifest last (the commit point of a
    snapshot), through no link. Only the driver calls this, after the job that staged it
    succeeded: no task writes into the checkpoint. Idempotent: a rerun after a kill finds part
    of it moved. A file it lists in another partition (``partition``'s share of its parent's
    files) stays there; that partition gets a borrower marker first, so that its cleanup keeps
    what this one lists."""
    name = layout.manifest_name(version)
    if not (staged / name).is_file():
        if (target / name).is_file():
            return  # published by the run this one resumes
        raise RescaleError(f"{staged / name} is missing: no task staged snapshot {version} of {target}")
    # The manifest published is the one read here, whose files were moved: a late attempt of
    # the same task (speculation, a kill not yet delivered) may restage the partition meanwhile.
    try:
        data = layout.read_file(staged / name, layout.MAX_MANIFEST_BYTES, "snapshot manifest")
    except layout.TooLargeError as exc:
        raise ckpt.CheckpointError(str(exc)) from None
    manifest = ckpt.decode_manifest(data, staged / name, version)
    ckpt.check_inside(target / FILES_DIR, root)
    (target / FILES_DIR).mkdir(parents=True, exist_ok=True)
    op_dir = target.parent if store == layout.DEFAULT_STORE else target.parent.parent
    for f in (*manifest.files, *([manifest.replay] if manifest.replay else [])):
        owner, lent = layout.owner_of(f.path)
        if owner is not None and owner != partition:
            lender = ckpt.store_dir(op_dir, owner, store)
            ckpt.check_inside(lender / FILES_DIR, root)
            if not (lender / FILES_DIR / lent).is_file():
                raise RescaleError(f"{lender / FILES_DIR / lent}, which snapshot {version} of {target} shares, is missing")
            marker = lender / f"ks-borrower-{partition}"
            if not marker.is_file():
                ckpt.write_atomically(marker, b"")
        elif (staged / f.path).is_file():
            os.replace(staged / f.path, target / f.path)
        elif not (target / f.path).is_file():
            raise RescaleError(f"{staged / f.path} is missing: snapshot {version} of {target} is incomplete")
    ckpt.write_atomically(target / name, data)
    (staged / name).unlink(missing_ok=True)


def set_metadata_partitions(op_dir: Path, partitions: int) -> None:
    """Give every store in the operator's metadata v1 (``v1`` line, then Spark's compact JSON)
    the partition count ``partitions``; Hadoop's checksum beside it goes (Spark then reads the
    file unchecked, as it reads one an object store holds)."""
    path = op_dir / "_metadata" / "metadata"
    if not path.is_file():
        return
    ckpt.check_inside(path, op_dir)
    _, stores = ckpt.operator_metadata(op_dir)  # refuses a corrupt file
    if all(n == partitions for n in stores.values()):
        return
    version, _, body = layout.read_file(path, layout.MAX_SPARK_METADATA_BYTES, "Spark metadata file").decode(
        "utf-8").partition("\n")
    meta = json.loads(body)
    for store in meta.get("stateStoreInfo", []):
        store["numPartitions"] = partitions
    ckpt.write_atomically(path, f"{version}\n{json.dumps(meta, separators=(',', ':'))}".encode())
    (path.parent / f".{path.name}.crc").unlink(missing_ok=True)
    log.info("%s: numPartitions %d", path, partitions)


def mark_retired(op_dir: Path, store: str, partitions: int, from_partitions: int, version: int) -> None:
    """Before a rescale commits: partition ``q mod partitions`` of each retired partition ``q``
    gets the marker ``ks-retired-<q>-<version>``, so that its cleanup deletes ``q``'s files once
    it retains no version below ``version`` (FORMATS.md, "Partitions a scale-down retires"). The
    retired: ``partitions .. from_partitions - 1``, and the store's partitions past both counts
    that no marker names (left by a scale-down that wrote none, or by Spark's repartition)."""
    parts = ckpt.discover_stores(op_dir).get(store, []) if op_dir.is_dir() else []
    named = {int(m.group(1)) for files in parts for entry in files.path.iterdir()
             if (m := layout.RETIRED_MARKER.fullmatch(entry.name)) is not None and entry.is_file()}
    left = {files.partition for files in parts if files.partition >= max(partitions, from_partitions)} - named
    for q in sorted(set(range(partitions, from_partitions)) | left):
        target = ckpt.store_dir(op_dir, q % partitions, store)
        marker = target / f"ks-retired-{q}-{version}"
        if not marker.is_file():
            ckpt.write_atomically(marker, b"")
