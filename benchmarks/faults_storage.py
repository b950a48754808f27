"""Faults on real checkpoint storage, and the S3 requests each provider makes per batch (issue 48,
items 3 and 4).

    python3 -m benchmarks.faults_storage                  # everything: 40 min on 2 cores at load 20-50
    python3 -m benchmarks.faults_storage --runs s3a-agg-503,requests --out /tmp/x.md

The storage is the tests' (tests/support/storage.py): a MiniDFSCluster (a NameNode, 2 DataNodes,
replication 2) in a JVM of its own, and moto's S3 API server behind an HTTP proxy
(tests/support/s3proxy.py) that the s3a client talks to. Each fault run drives one deterministic
query step by step (tests/support/scenarios.py), with its checkpoint on ``hdfs://`` or ``s3a://``,
and re-arms one kind of fault after every committed step:

- ``server kill`` (hdfs): SIGKILL of every state server of the JVM 0.1-0.6 s into the next batch
  (apply) and again 1.5-3 s into it (commit, maintenance);
- ``server kill at phase`` (s3a): SIGKILL of every state server when the proxy sees the request
  of a phase, two per step in turn: the changelog's write and a snapshot file's upload; the
  request that publishes the changelog's final name (its conditional PUT, which is also its
  write; or the COPY of s3a's rename where conditional writes are off) and a snapshot manifest's
  upload; apply (0.2 s into the batch, before any request) and a cleanup delete;
- ``datanode stop``: a DataNode stopped 0.05-0.6 s into every batch, restarted after it (the two
  in turn);
- ``namenode restart``: the NameNode restarted between batches (the query keeps running);
- ``503`` / ``500``: every S3 request answered 503 SlowDown (500 InternalError) for 1, 3 or 10 s
  from the start of the next batch (s3a's retries cover the shorter windows, the query fails in
  the longer ones);
- ``slow``: every S3 request held 1.5 s for 6 s;
- ``executor kill`` (run first, in a cluster of its own): an aggregation on ``local-cluster[2,1,1024]``
  whose executor JVMs are SIGKILLed one at a time while batches run; its output is known in closed
  form (what Spark's default provider outputs too).

A query that fails is restarted on its checkpoint, as a supervisor would, until every step is
committed. Each run's output is judged against Spark's default provider run uninterrupted on the
same storage and input (tests/support/faults.py's judge: rows lost, rows duplicated, a replayed
batch must be identical). The driver's own reads of the offset and commit logs go straight to
the storage (for s3a: to moto, not through the proxy), so they are neither faulted nor counted.

``requests``: a W1-like aggregation (benchmarks/workloads.py: groupBy(value % rows).count() on
rate-micro-batch, update, 4 partitions) on ``s3a://`` for Spark's default provider, Spark's RocksDB
provider with changelog checkpointing and keyedstate; the proxy counts every request by S3
operation and file, per batch (the window from one batch's start to the next's).
"""
from __future__ import annotations

import argparse
import collections
import datetime as dt
import logging
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
import types
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test support: drivers, scenarios, storage servers

from support import processes, scenarios as sc, testjar  # noqa: E402
from support.campaign import CONFS, LONG_KV_STEPS, confs as session_confs  # noqa: E402
from support.constants import HDFS_PROVIDER, KS, PFX, PROVIDER_CONF, STATE_PREFIX  # noqa: E402
from support.driver import _Inputs, drain, normalise, run_query  # noqa: E402
from support.faults import FaultyRun, judge, _message  # noqa: E402
from support.s3proxy import OPS, Request, S3Proxy  # noqa: E402
from support.storage import MiniHdfs, MotoS3, S3_KEY, S3_REGION, jars  # noqa: E402

log = logging.getLogger("faults_storage")

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
SCENARIOS = {
    "agg": (sc.agg_update, sc.KV, sc.KV_STEPS, "update"),
    # long enough for snapshot uploads and cleanup (a snapshot every 2 versions, 2 batches retained)
    "agg-long": (sc.agg_update, sc.KV, LONG_KV_STEPS[:9], "update"),
    "dedup": (sc.drop_duplicates, sc.IV, sc.DEDUP_STEPS, "append"),
}
# s3a's retries, shorter than its defaults so that a 10 s outage fails the query (and a restart
# must recover it) while a 1 s one is retried through
S3A_RETRIES = {"retry.limit": "3", "retry.interval": "250ms", "retry.throttle.limit": "4",
               "retry.throttle.interval": "200ms", "attempts.maximum": "2"}
ERROR_WINDOWS = (1.0, 3.0, 10.0)
# two per step: one of the batch's commit, one of maintenance (snapshot upload, cleanup)
PHASE_PAIRS = (("changelog write", "snapshot file upload"), ("changelog published", "snapshot manifest upload"),
               ("apply", "cleanup delete"))


@dataclass(frozen=True)
class Plan:
    name: str
    storage: str  # hdfs | s3a
    scenario: str
    kind: str


PLANS = [
    Plan("hdfs-agg-server-kill", "hdfs", "agg-long", "server kill"),
    Plan("hdfs-dedup-server-kill", "hdfs", "dedup", "server kill"),
    Plan("hdfs-agg-datanode-stop", "hdfs", "agg-long", "datanode stop"),
    Plan("hdfs-agg-namenode-restart", "hdfs", "agg-long", "namenode restart"),
    Plan("s3a-agg-server-kill-phases", "s3a", "agg-long", "server kill at phase"),
    Plan("s3a-agg-503", "s3a", "agg-long", "503"),
    Plan("s3a-dedup-500", "s3a", "dedup", "500"),
    Plan("s3a-dedup-slow", "s3a", "dedup", "slow"),
]
EXECUTOR_KILLS = "executor-kills"
REQUESTS = "requests"
NAMENODE_RESTART_EVERY = 2  # steps


@dataclass
class Result:
    plan: Plan
    faults: collections.Counter = field(default_factory=collections.Counter)
    lost: int = 0
    duplicated: int = 0
    replays: int = 0
    failures: list[str] = field(default_factory=list)
    aborted: str | None = None  # the run gave up: the store could not recover
    injected_responses: int = 0
    seconds: float = 0.0
    detail: list[str] = field(default_factory=list)


class DirectS3:
    """The driver's reads of an s3a:// checkpoint's offset and commit logs, straight to the S3
    server (not through the proxy): the storage interface support/driver.py's drain uses."""

    def __init__(self, endpoint: str) -> None:
        import boto3
        import botocore.config

        self.client = boto3.client("s3", endpoint_url=endpoint, region_name=S3_REGION, aws_access_key_id=S3_KEY,
                                   aws_secret_access_key=S3_KEY,
                                   config=botocore.config.Config(s3={"addressing_style": "path"}))

    @staticmethod
    def join(base: str, *parts: str) -> str:
        return "/".join([base.rstrip("/"), *parts])

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        parsed = urllib.parse.urlsplit(path)
        return parsed.netloc, parsed.path.lstrip("/")

    def list(self, path: str) -> list:
        bucket, key = self._split(path)
        prefix = key.rstrip("/") + "/"
        names = set()
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
            names.update(o["Key"][len(prefix):] for o in page.get("Contents", []))
            names.update(p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", []))
        return [types.SimpleNamespace(name=n) for n in sorted(names) if n]

    def read_bytes(self, path: str) -> bytes:
        bucket, key = self._split(path)
        return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()


# -- the storage and the sessions -------------------------------------------------------------------

class Storage:
    """The MiniDFSCluster, moto and the proxy in front of it, for the whole campaign."""

    def __init__(self, work: Path) -> None:
        self.hdfs = MiniHdfs(work / "minihdfs", log=work / "minihdfs.log")
        self.moto = MotoS3(work / "moto", log=work / "moto.log")
        self.proxy = S3Proxy(self.moto.endpoint)
        self.direct = DirectS3(self.moto.endpoint)
        run = uuid.uuid4().hex[:8]
        self.roots = {"hdfs": f"{self.hdfs.uri}/faults-{run}", "s3a": f"s3a://{self.moto.bucket}/faults-{run}"}

    def confs(self) -> dict[str, str]:
        """A client's confs: s3a through the proxy, hdfs:// files with the cluster's replication."""
        s3a = {**self.moto.s3a_confs(), **{"spark.hadoop.fs.s3a." + k: v for k, v in S3A_RETRIES.items()}}
        s3a["spark.hadoop.fs.s3a.endpoint"] = self.proxy.endpoint
        return {**s3a, "spark.hadoop.dfs.replication": "2"}

    def stop(self) -> None:
        self.proxy.stop()
        self.moto.stop()
        self.hdfs.stop()


def s3a_jars() -> list[str]:
    return sorted(str(p) for p in jars("s3a").glob("*.jar"))


def local_session(storage: Storage):
    """local[2], keyedstate configured, hadoop-aws on the classpath."""
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    import keyedstate
    import support.driver

    for module in (support.driver, sc):  # Python workers cannot import the tests' support package
        cloudpickle.register_pickle_by_value(module)
    builder = (SparkSession.builder.master("local[2,4]").appName("keyedstate-storage-faults")
               .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.streaming.stateStore.maintenanceInterval", "1s")
               .config("spark.jars", ",".join(s3a_jars())))
    for key, value in storage.confs().items():
        builder = builder.config(key, value)
    spark = keyedstate.configure(builder).getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    return spark


# -- running a query through faults ---------------------------------------------------------------

def run_faulty(spark, provider: str, scenario: str, location: str, reader, input_dir: Path, *,
               after_step: Callable[[int], None], on_failure: Callable[[str], None] = lambda m: None,
               max_failures: int = 15, timeout: float = 90.0) -> FaultyRun:
    """support/faults.py's run_through_failures for a checkpoint URI read through ``reader``; a run
    that gives up is returned with ``aborted`` set (its outputs so far kept)."""
    build, schema, steps, mode = SCENARIOS[scenario]
    inputs = _Inputs(spark, [schema], [input_dir])
    result = FaultyRun()
    result.aborted = None

    def deliver(batch_df, batch_id):
        result.outputs.append((int(batch_id), normalise(batch_df.collect())))

    def start():
        spark.conf.set(PROVIDER_CONF, provider)
        frame = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(inputs.dirs[0]))
        return (build(frame).writeStream.outputMode(mode).foreachBatch(deliver)
                .option("checkpointLocation", location).start())

    def settle(query):
        while True:
            try:
                if query is None:
                    query = start()
                drain(query, location, inputs.total, timeout, reader)
                return query
            except Exception as error:
                message = _message(query, error) if query is not None else str(error)
                result.failures.append(message)
                if query is not None:
                    try:
                        query.stop()
                    except Exception:
                        pass
                query = None
                if len(result.failures) > max_failures:
                    raise RuntimeError(f"{len(result.failures)} failures; the last: {message}") from error
                on_failure(message)
                time.sleep(1.0)

    query = None
    try:
        for index, rows in enumerate(steps):
            inputs.publish(0, rows)
            query = settle(query)
            if index < len(steps) - 1:
                after_step(index)
    except RuntimeError as gave_up:
        result.aborted = str(gave_up)
    finally:
        if query is not None:
            try:
                query.stop()
            except Exception:
                pass
    return result


def own_servers(jvm_pid: int) -> list[int]:
    return [p for p in processes.state_server_pids() if p in processes.descendants(jvm_pid)]


def kill_servers(jvm_pid: int) -> int:
    pids = own_servers(jvm_pid)
    for pid in pids:
        processes.signal_quietly(pid, signal.SIGKILL)
    return len(pids)


def phase_matcher(phase: str) -> Callable[[Request], bool]:
    state = lambda r: "/state/" in r.key  # noqa: E731
    return {
        "changelog write": lambda r: r.op == "PUT" and state(r) and "ks-changelog" in r.key,
        # the request that makes the final name appear: s3a's conditional PUT of it, or (without
        # conditional writes) the COPY of its rename
        "changelog published": lambda r: r.op in ("PUT", "COPY") and state(r) and r.key.endswith(".ks-changelog"),
        "snapshot file upload": lambda r: r.op == "PUT" and "/ks-files/" in r.key,
        "snapshot manifest upload": lambda r: r.op in ("PUT", "COPY") and state(r) and "ks-snapshot" in r.key,
        "cleanup delete": lambda r: r.op == "DELETE" and state(r) and not r.key.endswith((".tmp", "/"))
        and "ks-" in r.key,
    }[phase]


def run_plan(spark, storage: Storage, plan: Plan, work: Path, references: dict) -> Result:
    location_root = storage.roots[plan.storage]
    reader = storage.direct if plan.storage == "s3a" else _hdfs_reader(spark, location_root)
    ref_key = (plan.storage, plan.scenario)
    if ref_key not in references:
        build, schema, steps, mode = SCENARIOS[plan.scenario]
        ref_dir = work / f"reference-{plan.storage}-{plan.scenario}"
        references[ref_key] = run_query(spark, HDFS_PROVIDER, build, schema, steps,
                                        f"{location_root}/reference-{plan.scenario}", ref_dir / "input", mode)
    jvm_pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())
    proxy, hdfs = storage.proxy, storage.hdfs
    result = Result(plan)
    rng = random.Random(plan.name)
    pending: list[threading.Thread] = []
    armed: dict = {}

    def later(delay: float, action: Callable[[], None]) -> None:
        def run():
            time.sleep(delay)
            action()
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        pending.append(thread)

    def settle_pending():
        for thread in pending:
            thread.join(240)
        pending.clear()

    def after_step(index: int) -> None:
        settle_pending()
        kind = plan.kind
        if kind == "server kill":  # twice: early in the batch (apply), later (commit, maintenance)
            def kill(when: str):
                if kill_servers(jvm_pid):
                    result.faults[f"state servers killed {when}"] += 1
            later(rng.uniform(0.1, 0.6), lambda: kill("0.1-0.6 s into a batch"))
            later(rng.uniform(1.5, 3.0), lambda: kill("1.5-3 s into a batch"))
        elif kind == "server kill at phase":
            missed = [phase for phase in armed.get("phases", ()) if phase]
            if missed:
                proxy.disarm()
                result.detail.append(f"after step {index - 1}: {', '.join(missed)} did not come within a step")
            pair = PHASE_PAIRS[index % len(PHASE_PAIRS)]
            armed["phases"] = list(pair)
            for slot, phase in enumerate(pair):
                def hit(request: Request, phase=phase, slot=slot):
                    if kill_servers(jvm_pid):
                        result.faults[f"state servers killed at {phase}"] += 1
                    armed["phases"][slot] = None
                if phase == "apply":
                    later(0.2, lambda hit=hit: hit(Request(time.time(), "", "")))
                else:
                    proxy.on_request(phase_matcher(phase), hit)
        elif kind == "datanode stop":  # one of the two down during every other batch, in turn
            if armed.pop("datanode", False):
                hdfs.control("restart-datanode")

            def stop():
                hdfs.control("stop-datanode")
                armed["datanode"] = True
                result.faults["DataNode stopped mid-batch, restarted after it"] += 1
            later(rng.uniform(0.05, 0.6), stop)
        elif kind == "namenode restart":
            if index % NAMENODE_RESTART_EVERY == 0:
                hdfs.control("restart-namenode")
                result.faults["NameNode restarted between batches"] += 1
        elif kind in ("503", "500"):
            seconds = ERROR_WINDOWS[index % len(ERROR_WINDOWS)]
            proxy.fail_for(seconds, status=int(kind))
            result.faults[f"S3 {kind} for {seconds:.0f} s"] += 1
        elif kind == "slow":
            proxy.slow_for(6.0, delay=1.5)
            result.faults["S3 answers held 1.5 s for 6 s"] += 1

    started = time.time()
    location = f"{location_root}/{plan.name}"
    with session_confs(spark, CONFS):
        run = run_faulty(spark, KS, plan.scenario, location, reader, work / plan.name / "input",
                         after_step=after_step)
    settle_pending()
    proxy.disarm()
    if plan.kind == "datanode stop":  # every DataNode back for the next run
        while True:
            try:
                hdfs.control("restart-datanode")
            except RuntimeError:
                break
    verdict = judge(references[ref_key], run.outputs)
    result.lost, result.duplicated, result.replays = verdict.lost, verdict.duplicated, verdict.replays
    result.failures, result.aborted = run.failures, run.aborted
    result.detail += verdict.detail
    result.injected_responses = proxy.injected(started)
    result.seconds = time.time() - started
    return result


def _hdfs_reader(spark, location: str):
    from keyedstate.offline.storage import open_storage

    return open_storage(location, spark)


# -- executor kills -------------------------------------------------------------------------------

def run_executor_kills(storage: Storage, kills: int = 3, storages: tuple[str, ...] = ("hdfs", "s3a")) -> list[Result]:
    """SIGKILL of executor JVMs on ``local-cluster[2,1,1024]``, ``kills`` times per storage (each after
    the previous one's replacement registered), the checkpoint on each of ``storages`` in turn."""
    import keyedstate
    from support import cluster

    s3a = s3a_jars()
    conf = {**storage.confs(), "spark.jars": ",".join([keyedstate.jar_path(), *s3a]),
            # beside the test jar that serves file: (testjar.forkless_local_conf), which s3a's upload
            # buffers on local disk use
            "spark.executor.extraClassPath": os.pathsep.join(
                filter(None, [testjar.forkless_local_conf().get("spark.executor.extraClassPath"), *s3a])),
            PROVIDER_CONF: KS,
            "spark.sql.shuffle.partitions": "4", PFX + "snapshotInterval": "2",
            "spark.sql.streaming.minBatchesToRetain": "2",
            "spark.sql.streaming.stateStore.maintenanceInterval": "1s"}
    results = []
    with cluster.local_cluster_session(executors=2, conf=conf) as cl:
        spark = cl.spark
        spark.sparkContext.setLogLevel("OFF")
        tracker = spark.sparkContext.statusTracker()
        killed: set[str] = set()
        for where in storages:
            started = time.time()
            result = Result(Plan(f"{where}-agg-executor-kills", where, "agg (local-cluster)", "executor kill"))
            table = f"counts_{where}"
            query = cluster.slow_counts(spark, f"{storage.roots[where]}/executor-kills", table)
            done_kills = 0
            try:
                deadline = time.monotonic() + 600
                last_kill_batch = -1
                while done_kills < kills or _batches_done(query) < last_kill_batch + 3:
                    if query.exception() is not None:
                        result.aborted = str(query.exception())
                        break
                    if time.monotonic() > deadline:
                        result.aborted = f"{done_kills} kills, {_batches_done(query)} batches in 600 s"
                        break
                    done = _batches_done(query)
                    if done_kills < kills and done > last_kill_batch + 1 and tracker.getActiveStageIds():
                        alive = cl.wait_for_executors(2, exclude=killed)
                        victim = sorted(alive)[done_kills % 2]
                        time.sleep(0.3)  # into the batch: load, apply, commit
                        if tracker.getActiveStageIds():
                            killed.add(cl.kill_executor(victim)[0])
                            done_kills += 1
                            last_kill_batch = done
                    time.sleep(0.05)
            finally:
                query.stop()
            rows = collections.Counter(map(tuple, spark.table(table).collect()))
            batches = max((n for _, n in rows), default=0) // (cluster.ROWS_PER_BATCH // cluster.KEYS)
            expected = collections.Counter(cluster.closed_form(batches))
            lost, extra = expected - rows, rows - expected
            result.faults["executor JVM killed mid-batch"] = done_kills
            result.lost, result.duplicated = sum(lost.values()), sum(extra.values())
            if lost or extra:
                result.detail.append(f"missing {sorted(lost.elements())}, extra {sorted(extra.elements())}")
            result.seconds = time.time() - started
            results.append(result)
    return results


def _batches_done(query) -> int:
    progress = query.lastProgress
    return 0 if progress is None else progress["batchId"] + 1


# -- request counts -------------------------------------------------------------------------------

COUNTED = {
    "default (HDFSBackedStateStoreProvider)": (HDFS_PROVIDER, {}),
    "RocksDB, changelog checkpointing": (ROCKSDB_PROVIDER,
                                         {STATE_PREFIX + "rocksdb.changelogCheckpointing.enabled": "true"}),
    "keyedstate": (KS, {}),
}


def file_class(request: Request) -> str:
    """Which file a request is for, by the name Spark or the provider gives it."""
    key = request.key
    if "/state/" not in key:
        top = re.sub(r"^.*?/(offsets|commits|metadata|sources|\.?[a-z_]+)(/.*)?$", r"\1", key)
        return f"query log ({top})" if top in ("offsets", "commits", "metadata", "sources") else "query dir / other"
    tail = key.split("/state/", 1)[1]
    if request.op == "LIST":
        return "state listing of ks-files/" if "/ks-files" in tail else "state listing of a store's dir"
    if key.endswith("/"):
        return "state dir marker"
    if "/ks-files/" in key:  # RocksDB's own names there have no dot (CURRENT, MANIFEST-N, OPTIONS-N)
        return "ks-files/ (snapshot files)"
    if "." not in tail.rsplit("/", 1)[-1]:
        return "state dir (probe of a path without a file)"
    if "/_metadata/" in f"/{tail}":
        return "state _metadata"
    name = tail.rsplit("/", 1)[-1].lstrip(".")
    name = re.sub(r"\.[0-9a-f-]{36}\.tmp$|\.tmp$", "", name)
    for suffix in ("ks-changelog", "ks-snapshot", "changelog", "zip", "delta", "snapshot", "sst", "log", "crc"):
        if name.endswith("." + suffix) or f".{suffix}." in name:
            return "." + suffix + (" (temp)" if key.endswith(".tmp") else "")
    if "/SSTs/" in key:
        return "SSTs/"
    return "state other"


def count_requests(spark, storage: Storage, rows: int, batches: int, warmup: int) -> dict:
    """Per provider: [(batch id, Counter of op, Counter of (op, file class))] of the measured
    batches of a W1-like aggregation on s3a://."""
    from pyspark.sql import functions as F

    out = {}
    for label, (provider, extra) in COUNTED.items():
        location = f"{storage.roots['s3a']}/requests-{re.sub(r'[^a-z]+', '-', label.lower()).strip('-')}"
        with session_confs(spark, {PROVIDER_CONF: provider, "spark.sql.shuffle.partitions": "4",
                                   "spark.sql.streaming.noDataMicroBatches.enabled": "false", **extra}):
            df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows)
                  .option("numPartitions", 2).option("startTimestamp", 0).option("advanceMillisPerBatch", 1000)
                  .load().groupBy((F.col("value") % rows).alias("key")).count())
            query = df.writeStream.outputMode("update").format("noop").option("checkpointLocation", location).start()
            try:
                deadline = time.monotonic() + 600
                while _batches_done(query) < warmup + batches + 1 and time.monotonic() < deadline:
                    if query.exception() is not None:
                        raise RuntimeError(f"{label}: {query.exception()}")
                    time.sleep(0.2)
            finally:
                query.stop()
            progress = [p for p in query.recentProgress if p.get("batchId") is not None]
        starts = {}
        for p in progress:
            starts.setdefault(int(p["batchId"]), dt.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00"))
                              .timestamp())
        ids = sorted(starts)
        per_batch = []
        for a, b in zip(ids, ids[1:]):
            if a < warmup or a >= warmup + batches:
                continue
            requests = storage.proxy.since(starts[a], starts[b])
            per_batch.append((a, collections.Counter(r.op for r in requests),
                              collections.Counter((r.op, file_class(r)) for r in requests)))
        out[label] = per_batch
    return out


# -- the report -----------------------------------------------------------------------------------

def first_line(message: str) -> str:
    """The line of a failure a user would read first: one naming keyedstate or a checkpoint file."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    said = [line for line in lines if "keyedstate" in line or "hdfs://" in line or "s3a://" in line]
    return (said or lines or [""])[0][:400]


def report(results: list[Result], counts: dict | None, seconds: float, setup: str) -> str:
    total = sum(sum(r.faults.values()) for r in results)
    lost = sum(r.lost for r in results)
    dup = sum(r.duplicated for r in results)
    aborted = [r for r in results if r.aborted]
    lines = ["# keyedstate on real storage: faults and S3 requests", "",
             f"- Generated {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC by `python3 -m benchmarks.faults_storage` "
             f"({seconds / 60:.1f} min, {os.cpu_count()} CPUs, shared with other work). {setup}",
             f"- **{total} faults on real storage in {len(results)} runs: {lost} rows lost, {dup} rows duplicated"
             f"{'' if not aborted else f', {len(aborted)} run(s) gave up (below)'}.**",
             "- Storage: a MiniDFSCluster (hadoop-client-minicluster 3.5.0: a NameNode, 2 DataNodes, replication 2) "
             "and moto's S3 server behind a proxy (tests/support/s3proxy.py) that sees, counts and faults every "
             "request of the s3a client (hadoop-aws 3.5.0). moto is an emulator of S3's API: strongly consistent, "
             "no throttling or latency of its own (the proxy adds them), no request limits.",
             "- Reference: the same steps on Spark's default provider (HDFSBackedStateStoreProvider), "
             "uninterrupted, with its checkpoint on the same storage; executor-kill runs against the closed-form "
             "output (which the default provider produces). A failed query is restarted on its checkpoint, as a "
             "supervisor would. What each fault kind does: `benchmarks/faults_storage.py`.",
             f"- s3a retries: `{', '.join(f'fs.s3a.{k}={v}' for k, v in S3A_RETRIES.items())}` "
             "(a 1 s outage is retried through, a 10 s one fails the query).", "",
             "## Faults by kind", "", "| storage | fault | injected | runs |", "|---|---|---:|---:|"]
    by_fault: dict = collections.defaultdict(lambda: [0, 0])
    for r in results:
        for fault, n in r.faults.items():
            by_fault[(r.plan.storage, fault)][0] += n
            by_fault[(r.plan.storage, fault)][1] += 1
    for (where, fault), (n, runs) in sorted(by_fault.items()):
        lines.append(f"| {where} | {fault} | {n} | {runs} |")
    lines += ["", "## Runs", "",
              "| run | storage | operator | fault kind | faults | error answers | query failures (restarts) | "
              "replayed batches | lost | duplicated | s |",
              "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        p = r.plan
        lines.append(f"| {p.name} | {p.storage} | {p.scenario} | {p.kind} | {sum(r.faults.values())} | "
                     f"{r.injected_responses} | {len(r.failures)} | {r.replays} | {r.lost} | {r.duplicated} | "
                     f"{r.seconds:.0f} |")
    if aborted:
        lines += ["", "## Runs that gave up", ""]
        lines += [f"- {r.plan.name}: `{first_line(r.aborted)}`" for r in aborted]
    said: dict[str, str] = {}
    for r in results:
        for f in r.failures:
            said.setdefault(r.plan.kind + f" ({r.plan.storage})", first_line(f))
    if said:
        lines += ["", "## What a failed query said (first per kind)", ""]
        lines += [f"- {kind}: `{msg}`" for kind, msg in sorted(said.items())]
    notes = [f"- {r.plan.name}: {d}" for r in results for d in r.detail[:5]]
    if notes:
        lines += ["", "## Notes per run", ""] + notes
    if counts:
        lines += request_report(counts)
    return "\n".join(lines) + "\n"


def request_report(counts: dict) -> list[str]:
    lines = ["", "## S3 requests per batch (s3a, W1-like aggregation)", ""]
    base = "RocksDB, changelog checkpointing"

    def median(label: str, op: str) -> float:
        values = [c[op] for _, c, _ in counts[label]] or [0]
        return statistics.median(values)

    def mean(label: str, op: str) -> float:
        values = [c[op] for _, c, _ in counts[label]] or [0]
        return statistics.mean(values)

    lines += ["Median requests per batch (mean in brackets), and the ratio of the medians to Spark's RocksDB "
              "provider with changelog checkpointing. Every request the s3a client made in the batch's window "
              "(from its start to the next batch's start): the query's offset and commit logs, the state "
              "store's files, and whatever maintenance (snapshot upload; nothing is deleted: 100 batches are "
              "retained) ran meanwhile.", "",
              "| provider | " + " | ".join(OPS) + " | all |", "|---|" + "---:|" * (len(OPS) + 1)]
    for label in counts:
        cells = [f"{median(label, op):g} ({mean(label, op):.1f})" for op in OPS]
        all_ = statistics.median([sum(c.values()) for _, c, _ in counts[label]] or [0])
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {all_:g} |")
    for label in counts:
        if label == base or base not in counts:
            continue
        ratios = []
        for op in OPS + ("all",):
            a = (statistics.median([sum(c.values()) for _, c, _ in counts[label]] or [0]) if op == "all"
                 else median(label, op))
            b = (statistics.median([sum(c.values()) for _, c, _ in counts[base]] or [0]) if op == "all"
                 else median(base, op))
            ratios.append(f"{a / b:.2f}x" if b else ("=" if a == b else f"{a:g} vs 0"))
        lines.append(f"| {label} / RocksDB | " + " | ".join(ratios) + " |")
    lines += ["", "### Per batch", "", "| provider | batch | " + " | ".join(OPS) + " |",
              "|---|---:|" + "---:|" * len(OPS)]
    for label, per_batch in counts.items():
        for batch, c, _ in per_batch:
            lines.append(f"| {label} | {batch} | " + " | ".join(str(c[op]) for op in OPS) + " |")
    lines += ["", "### Where (mean requests per batch by operation and file)", ""]
    for label, per_batch in counts.items():
        n = max(1, len(per_batch))
        where = collections.Counter()
        for _, _, w in per_batch:
            where.update(w)
        top = ", ".join(f"{op} {cls} {v / n:.1f}" for (op, cls), v in where.most_common(14))
        lines.append(f"- {label}: {top}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.faults_storage", description=__doc__.split("\n")[0])
    names = [EXECUTOR_KILLS] + [p.name for p in PLANS] + [REQUESTS]
    parser.add_argument("--runs", help="comma-separated run names (default all: " + ",".join(names) + ")")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS-faults-storage.md"))
    parser.add_argument("--executor-kills-on", default="hdfs,s3a", help="the storages of the executor kills")
    parser.add_argument("--rows", type=int, default=10_000, help="rows (and keys) per batch of the request count")
    parser.add_argument("--batches", type=int, default=10, help="measured batches of the request count")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    wanted = set(args.runs.split(",")) if args.runs else set(names)
    work = Path(tempfile.mkdtemp(prefix="keyedstate-faults-storage-"))
    started = time.monotonic()
    storage = Storage(work)
    log.info("storage up: %s, %s (proxy %s); work %s", storage.hdfs.uri, storage.moto.endpoint,
             storage.proxy.endpoint, work)
    results: list[Result] = []
    counts = None

    def progress(r: Result) -> None:
        log.info("%s: %d faults, %d failures, lost %d, duplicated %d%s (%.0f s)", r.plan.name, sum(r.faults.values()),
                 len(r.failures), r.lost, r.duplicated, f", GAVE UP: {first_line(r.aborted)}" if r.aborted else "",
                 r.seconds)
    try:
        if EXECUTOR_KILLS in wanted:  # first: its cluster needs a process without a JVM
            for r in run_executor_kills(storage, storages=tuple(args.executor_kills_on.split(","))):
                progress(r)
                results.append(r)
        plans = [p for p in PLANS if p.name in wanted]
        if plans or REQUESTS in wanted:
            spark = local_session(storage)
            try:
                references: dict = {}
                for plan in plans:
                    results.append(run_plan(spark, storage, plan, work, references))
                    progress(results[-1])
                if REQUESTS in wanted:
                    counts = count_requests(spark, storage, args.rows, args.batches, warmup=2)
                    log.info("request counts: %s", {k: len(v) for k, v in counts.items()})
            finally:
                spark.stop()
    finally:
        storage.stop()
    setup = f"Request counts: {args.rows} rows and keys per batch, {args.batches} batches measured after 2."
    Path(args.out).write_text(report(results, counts, time.monotonic() - started, setup))
    print("wrote", args.out)
    return 0 if all(r.lost == 0 and r.duplicated == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
