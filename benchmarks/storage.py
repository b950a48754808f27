"""Checkpoint storage of a benchmark run (``--storage local|hdfs|s3a``, issue 48).

``local`` is the run's scratch dir. ``hdfs`` and ``s3a`` are the storage tests' servers
(tests/support/storage.py), started once per ``python3 -m benchmarks`` invocation: a
MiniDFSCluster (a NameNode, 2 DataNodes, replication 2) in a JVM of its own, or moto's S3 server
behind the counting proxy of tests/support/s3proxy.py, in this process. Each run's checkpoint is a
fresh directory there; the run's child session gets the client confs and hadoop-aws on its
classpath as :class:`support.storage.StorageSession` does.

What a run on real storage records per batch, besides the local figures:

* ``requests``: every request the storage answered in the batch's window, by kind. The window of
  batch i is [start of batch i, start of batch i+1); the last recorded batch's ends 50 ms after its
  end. Only one run talks to the storage at a time, so the window holds that run's requests alone:
  the query's offset and commit logs, the state store's files and whatever maintenance (snapshot
  uploads, cleanup) ran meanwhile. ``requests_by_file`` splits them by kind and file
  (benchmarks/faults_storage.py's ``file_class``).

  - s3a: every request of the s3a client by S3 operation (support/s3proxy.py's OPS), from the
    proxy's log of this process, timed when it arrived.
  - hdfs: every client RPC the NameNode answered by method, grouped into HDFS_KINDS (``open`` is
    getBlockLocations; ``fsync`` is a client's hsync/hflush of an open file; ``other`` holds
    renewLease, getServerDefaults and the rest), from the MiniDFSCluster's request log
    (tests/storage/src/MiniHdfs.java), timed when answered. The DataNodes' own RPCs to the
    NameNode (heartbeats, block reports, blockReceivedAndDeleted) are not a client's requests
    and are left out; block data goes to the DataNodes and is not counted as requests.
    ``requests_by_file`` splits HDFS's audited commands (create, open, getfileinfo, listStatus,
    rename, delete, mkdirs: those with a path) by file, and names the RPCs without one
    (addBlock, complete, fsync, ...) as ``<method> (RPC, no path)``.
* ``ckpt_bytes_written``: (s3a) the bytes of the request bodies the proxy forwarded for objects
  under ``<checkpoint>/state/`` in the window (PUTs, multipart parts; a COPY, s3a's rename, moves
  no bytes); (hdfs) the sizes of the files under ``state/`` whose modification time falls in the
  window, listed through Hadoop's FileSystem after the query stopped (as for local disk; HDFS
  keeps a file's mtime across a rename, and nothing is deleted during a run).
"""
from __future__ import annotations

import collections
import logging
import shutil
import statistics
import sys
import tempfile
import types
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))  # the storage servers of the tests

from support.s3proxy import OPS, S3Proxy  # noqa: E402
from support.storage import DATANODE_RPCS, MiniHdfs, MotoS3, jars  # noqa: E402

log = logging.getLogger(__name__)

STORAGES = ("local", "hdfs", "s3a")
DATANODES = 2
LAST_WINDOW_S = 0.05  # the last recorded batch's window ends this long after the batch
S3_BYTES = "PUT bodies under state/ seen by the proxy"
HDFS_BYTES = "sizes of files under state/ whose mtime falls in the batch (Hadoop listing after the run)"
HDFS_KINDS = ("create", "addBlock", "complete", "fsync", "open", "getFileInfo", "getListing", "mkdirs", "rename",
              "delete", "other")
"""The kinds of NameNode client RPCs counted per batch on hdfs (the RPC methods of HDFS_RPC_KIND
under another name; any other client method is ``other``)."""
HDFS_RPC_KIND = {"getBlockLocations": "open", "rename2": "rename", "getBatchedListing": "getListing",
                 "getFileLinkInfo": "getFileInfo"}


def s3a_jars() -> list[str]:
    return sorted(str(p) for p in jars("s3a").glob("*.jar"))


class BenchStorage:
    """The checkpoint storage of one invocation; ``stop()`` ends its servers."""

    def __init__(self, kind: str, work: Path | None = None) -> None:
        if kind not in STORAGES or kind == "local":
            raise ValueError(f"storage {kind!r}: hdfs or s3a (local needs no server)")
        self.kind = kind
        self.work = Path(work or tempfile.mkdtemp(prefix=f"ksb-storage-{kind}-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.run = uuid.uuid4().hex[:8]
        self.hdfs: MiniHdfs | None = None
        self.moto: MotoS3 | None = None
        self.proxy: S3Proxy | None = None
        if kind == "hdfs":
            self.hdfs = MiniHdfs(self.work / "minihdfs", datanodes=DATANODES, log=self.work / "minihdfs.log")
            self.root = f"{self.hdfs.uri}/bench-{self.run}"
        else:
            self.moto = MotoS3(self.work / "moto", log=self.work / "moto.log")
            self.proxy = S3Proxy(self.moto.endpoint)
            self.root = f"s3a://{self.moto.bucket}/bench-{self.run}"
        log.info("benchmark storage %s up: %s (logs in %s)", kind, self.root, self.work)

    def describe(self) -> str:
        if self.kind == "hdfs":
            return f"MiniDFSCluster ({DATANODES} DataNodes, replication 2)"
        return "moto's S3 server behind the counting proxy"

    def confs(self) -> dict[str, str]:
        """Spark confs of a client: s3a through the proxy, hdfs:// files with replication 2,
        hadoop-aws on the classpath (as support/storage.py's StorageSession has it)."""
        out = {"spark.jars": ",".join(s3a_jars()), "spark.hadoop.dfs.replication": "2"}
        if self.kind == "s3a":
            out.update(self.moto.s3a_confs())
            out["spark.hadoop.fs.s3a.endpoint"] = self.proxy.endpoint
        return out

    def checkpoint_for(self, slug: str) -> str:
        """A fresh checkpoint directory for one run."""
        return f"{self.root}/{slug}-{uuid.uuid4().hex[:6]}"

    def attribute(self, result: dict) -> None:
        """Per batch of the run and of its restart: requests by kind and (s3a) the PUT bytes to
        ``state/``, from the proxy's log; the storage summary into ``result['summary']``."""
        result["storage"] = self.kind
        result["storage_detail"] = self.describe()
        result["ckpt_bytes_source"] = S3_BYTES if self.kind == "s3a" else HDFS_BYTES
        for rec in (result, result.get("restart") or {}):
            if self.proxy is not None:
                self._requests(rec.get("batches") or [], result.get("checkpoint"))
            elif self.hdfs is not None:
                self._hdfs_requests(rec.get("batches") or [])
        from .workloads import summarize
        result["summary"] = {**summarize(result), **storage_summary(result)}

    def _requests(self, batches: list[dict], checkpoint: str | None) -> None:
        from .faults_storage import file_class

        state_prefix = _key(checkpoint) + "/state/" if checkpoint else "/state/"
        for b, (lo, hi) in zip(batches, _windows(batches)):
            seen = self.proxy.since(lo, hi)
            b["requests"] = {op: sum(1 for r in seen if r.op == op) for op in OPS}
            by_file = collections.Counter(f"{r.op} {file_class(r)}" for r in seen)
            b["requests_by_file"] = dict(by_file.most_common())
            b["ckpt_bytes_listed"] = b.get("ckpt_bytes_written")
            b["ckpt_bytes_written"] = sum(r.size for r in seen if r.op == "PUT" and r.key.startswith(state_prefix)
                                          and r.status < 300)

    def _hdfs_requests(self, batches: list[dict]) -> None:
        from .faults_storage import file_class

        for b, (lo, hi) in zip(batches, _windows(batches)):
            seen = self.hdfs.requests.since(lo, hi)
            kinds = [hdfs_kind(r.op) for r in seen if r.source == "rpc" and r.op not in DATANODE_RPCS]
            b["requests"] = {kind: kinds.count(kind) for kind in HDFS_KINDS}
            by_file: collections.Counter = collections.Counter()
            for r in seen:
                if r.source == "audit":
                    # file_class knows a listing by S3's name for it
                    as_s3 = types.SimpleNamespace(op="LIST" if r.op == "listStatus" else r.op, key=r.key)
                    by_file[f"{r.op} {file_class(as_s3)}"] += 1
                elif r.op not in DATANODE_RPCS and r.op not in PATH_AUDITED:
                    by_file[f"{r.op} (RPC, no path)"] += 1
            b["requests_by_file"] = dict(by_file.most_common())

    def stop(self) -> None:
        for server in (self.proxy, self.moto, self.hdfs):
            if server is not None:
                try:
                    server.stop()
                except Exception as exc:  # noqa: BLE001 - the others still stop
                    log.warning("stopping %s: %s", type(server).__name__, exc)
        shutil.rmtree(self.work / "minihdfs" / "data", ignore_errors=True)


# client RPCs whose calls the audit log gives with their paths (requests_by_file names those)
PATH_AUDITED = frozenset({"create", "append", "getBlockLocations", "getFileInfo", "getFileLinkInfo", "getListing",
                          "getBatchedListing", "mkdirs", "rename", "rename2", "delete", "setPermission", "setOwner",
                          "setReplication", "setTimes", "concat", "truncate", "getContentSummary", "getAclStatus"})


def hdfs_kind(method: str) -> str:
    """The kind of HDFS_KINDS a NameNode client RPC counts as."""
    kind = HDFS_RPC_KIND.get(method, method)
    return kind if kind in HDFS_KINDS else "other"


def _windows(batches: list[dict]) -> list[tuple[float, float]]:
    """Each batch's window [lo, hi): its start to the next batch's, the last one's end plus
    LAST_WINDOW_S."""
    out = []
    for i, b in enumerate(batches):
        lo = b["start_epoch"] - 0.001  # progress timestamps have ms resolution
        hi = (batches[i + 1]["start_epoch"] - 0.001 if i + 1 < len(batches)
              else b["start_epoch"] + (b.get("batch_ms") or 0) / 1000 + LAST_WINDOW_S)
        out.append((lo, hi))
    return out


def _key(uri: str) -> str:
    """The object key of ``s3a://bucket/<key>``, as the proxy records keys."""
    return uri.split("://", 1)[1].split("/", 1)[1].rstrip("/")


def storage_summary(result: dict) -> dict[str, Any]:
    """Medians and means over the measured batches of the requests per kind (s3a's OPS, hdfs's
    HDFS_KINDS, in that order) and of the state bytes written; recomputed from the batches, so it
    holds after ``summarize``."""
    measured = [b for b in result.get("batches") or [] if b.get("phase") == "measured"]
    out: dict[str, Any] = {}
    with_requests = [b["requests"] for b in measured if b.get("requests") is not None]
    if with_requests:
        kinds = list(with_requests[0])
        out["requests_per_batch_median"] = {k: statistics.median(r.get(k, 0) for r in with_requests) for k in kinds}
        out["requests_per_batch_median"]["all"] = statistics.median(sum(r.values()) for r in with_requests)
        out["requests_per_batch_mean"] = {k: statistics.fmean(r.get(k, 0) for r in with_requests) for k in kinds}
        where: collections.Counter = collections.Counter()
        for b in measured:
            where.update(b.get("requests_by_file") or {})
        out["requests_by_file_mean"] = {k: v / len(measured) for k, v in where.most_common(16)}
    return out


def remote_files(spark, uri: str) -> list[tuple[float, int, str]]:
    """(mtime, size, path relative to ``uri``) of every file below ``uri``, through the session's
    Hadoop FileSystem (what ``workloads._state_files`` gives for a local directory)."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(path):
        return []
    base = fs.makeQualified(path).toString().rstrip("/") + "/"
    out = []
    files = fs.listFiles(path, True)
    while files.hasNext():
        status = files.next()
        full = status.getPath().toString()
        out.append((status.getModificationTime() / 1000.0, int(status.getLen()),
                    full[len(base):] if full.startswith(base) else full))
    return out


def remote_names(spark, uri: str) -> list[str]:
    """The names directly below ``uri`` (files and directories)."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(path):
        return []
    return [status.getPath().getName() for status in fs.listStatus(path)]
