"""The query the rescale tests rescale: a W1-shaped count by key over batches of 3,000 keys
(700 new each), run at a partition count on a FileStream, and the same stopped with snapshots."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import keyedstate
from keyedstate import checkpoint as ckpt
from support.constants import PROVIDER_CONF
from support.driver import FileStream, session_confs


def count_by_key(df):
    from pyspark.sql import functions as F

    return df.groupBy("k").agg(F.count("*").alias("n"))


def batch_rows(b: int) -> list[dict]:
    return [{"k": k} for k in range(b * 700, b * 700 + 3000)]


def expected(batches: int) -> dict:
    counts: dict[int, int] = {}
    for b in range(batches):
        for row in batch_rows(b):
            counts[row["k"]] = counts.get(row["k"], 0) + 1
    return counts


def run(spark, stream: FileStream, batches: range, out: dict, partitions: int = 4,
        until: Callable[[], bool] | None = None) -> None:
    """Runs ``batches``; with ``until``, keeps the query (and so its maintenance) running after
    them until ``until()`` holds or 30 s pass: cleanup runs only in the maintenance of a running
    query, so a query stopped right after its last batch may not have had its last cleanup."""
    with session_confs(spark, {PROVIDER_CONF: keyedstate.PROVIDER_CLASS,
                               "spark.sql.shuffle.partitions": str(partitions)}):
        query = stream.start(count_by_key, lambda df, _: out.update({r.k: r.n for r in df.collect()}))
        try:
            for b in batches:
                stream.step(query, batch_rows(b))
            deadline = time.monotonic() + 30
            while until is not None and not until() and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            query.stop()


def await_snapshots(op_dir: Path, version: int) -> None:
    """Waits until every partition of the operator uploaded the snapshot of ``version``
    (maintenance runs every second in the tests)."""
    deadline = time.monotonic() + 60
    while not all(version in s.snapshots for s in ckpt.discover_stores(op_dir)["default"]):
        assert time.monotonic() < deadline, f"no snapshot of version {version} uploaded"
        time.sleep(0.5)


def unlisted_snapshot_files(op_dir: Path) -> list[Path]:
    """The files in any partition's ``ks-files/`` that no manifest of any partition lists (a
    checksum file goes with the file it belongs to). Listed again where a version went while it
    was read: the maintenance of a stopped query's stores may still clean up old versions."""
    for _ in range(20):
        try:
            return _unlisted_snapshot_files(op_dir)
        except ckpt.CheckpointError as exc:
            if not isinstance(exc.__cause__, FileNotFoundError):
                raise
            time.sleep(0.2)
    return _unlisted_snapshot_files(op_dir)


def _unlisted_snapshot_files(op_dir: Path) -> list[Path]:
    listed = set()
    for files in ckpt.discover_stores(op_dir)["default"]:
        for v in files.snapshots:
            m = ckpt.read_manifest(files.manifest_path(v), v)
            listed |= {Path(files.listing.file_path(files.storage, f.path)) for f in m.files}

    def checksummed(f: Path) -> Path:
        return f.with_name(f.name[1:-4]) if f.name.startswith(".") and f.name.endswith(".crc") else f

    return [f for d in op_dir.iterdir() if (d / "ks-files").is_dir() for f in (d / "ks-files").iterdir()
            if checksummed(f) not in listed]


def files_of_partitions(op_dir: Path, partitions: range) -> list[str]:
    """Every file under the operator's ``partitions``, relative to ``op_dir``."""
    return sorted(str(p.relative_to(op_dir)) for q in partitions for p in (op_dir / str(q)).rglob("*") if p.is_file())


def marker_files(op_dir: Path, pattern: str = "ks-*") -> list[str]:
    """The markers (``ks-borrower-*``, ``ks-retired-*``: ``pattern``) the operator's partitions hold."""
    return sorted(str(p.relative_to(op_dir)) for p in op_dir.glob(f"*/{pattern}") if p.is_file())


def partition_listings(op_dir: Path) -> dict[str, list[str]]:
    """Each partition's own files (not its ``ks-files/``): what a failed cleanup check shows."""
    return {d.name: sorted(p.name for p in d.iterdir() if p.is_file()) for d in sorted(op_dir.iterdir()) if d.is_dir()}


def await_every_file_listed(op_dir: Path) -> None:
    """Waits until every snapshot file is listed by a manifest: an upload of the stopped query
    may still be finishing."""
    deadline = time.monotonic() + 30
    while unlisted := unlisted_snapshot_files(op_dir):
        assert time.monotonic() < deadline, sorted(str(f.relative_to(op_dir)) for f in unlisted)
        time.sleep(0.5)


def snapshotted_query(spark, tmp_path: Path, retain: int) -> tuple[FileStream, dict, Path, dict]:
    """3 batches at 4 partitions with a snapshot every version and ``retain`` batches retained,
    stopped once every partition uploaded version 3's snapshot: the stream, its output so far,
    the operator's directory and the confs to run it on with."""
    confs = {"spark.sql.streaming.stateStore.keyedstate.snapshotInterval": "1",
             "spark.sql.streaming.minBatchesToRetain": str(retain)}
    stream = FileStream(spark, tmp_path, "k LONG")
    out: dict = {}
    op_dir = Path(stream.checkpoint) / "state" / "0"
    with session_confs(spark, confs):
        run(spark, stream, range(3), out)
    await_snapshots(op_dir, 3)
    return stream, out, op_dir, confs


def quiet_snapshotted_query(spark, tmp_path: Path):
    """snapshotted_query, once every upload of the stopped query is done and a second old (a
    rollback takes files from a second before the rescale as its own); with a function that
    lists the operator's files and their sizes."""
    stream, out, op_dir, confs = snapshotted_query(spark, tmp_path, 2)
    await_every_file_listed(op_dir)
    time.sleep(1.5)
    return stream, out, op_dir, confs, lambda: {p.relative_to(op_dir): p.stat().st_size
                                               for p in op_dir.rglob("*") if p.is_file()}


def continues_exactly(spark, stream, out: dict, confs: dict) -> None:
    with session_confs(spark, confs):
        run(spark, stream, range(3, 5), out)
    assert out == expected(5)
