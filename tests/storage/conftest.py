"""Real checkpoint storage (issue 48): a MiniDFSCluster (2 DataNodes, replication 2) in a JVM of its
own, moto's S3 API server on loopback, and a child SparkSession with hadoop-aws that runs queries
and offline tools on them (support/storage.py). One of each per test run: they start in about a
minute on 2 loaded cores. The jars come from Maven Central through tests/storage/pom.xml on first
use; without ``mvn`` these tests are skipped with a message saying how to run them."""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from support.constants import PFX, REFERENCE_PROVIDER
from support.processes import started_beside
from support.scenarios import SCENARIOS
from support.s3proxy import S3Proxy
from support.storage import MiniHdfs, MotoS3, StorageSession, StorageUnavailable

_servers: dict[str, object] = {}


def _log(name: str) -> Path:
    """A server's log file, outside pytest's basetemp (which later runs rotate away): kept when a
    test of the run failed (its report names it), deleted otherwise."""
    logs = Path(tempfile.gettempdir()) / "keyedstate-storage-logs"
    logs.mkdir(exist_ok=True)
    return logs / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


@pytest.fixture(scope="session")
def hdfs(tmp_path_factory, request):
    """The MiniDFSCluster; its ``uri`` is ``hdfs://host:port``. Its data (under pytest's basetemp)
    and log are kept when a test of the run failed."""
    base = tmp_path_factory.mktemp("minihdfs")
    try:
        cluster = MiniHdfs(base, log=_log("minihdfs"))
    except StorageUnavailable as missing:
        pytest.skip(str(missing))
    _servers["MiniDFSCluster"] = cluster
    yield cluster
    _servers.pop("MiniDFSCluster", None)
    cluster.stop()
    if not request.session.testsfailed:
        shutil.rmtree(base, ignore_errors=True)
        cluster.log_path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def s3(tmp_path_factory, request):
    """moto's S3 server with a bucket; ``s3a_confs()`` are a client's Spark confs."""
    try:
        server = MotoS3(tmp_path_factory.mktemp("moto"), log=_log("moto"))
    except StorageUnavailable as missing:
        pytest.skip(str(missing))
    _servers["moto S3 server"] = server
    yield server
    _servers.pop("moto S3 server", None)
    server.stop()
    if not request.session.testsfailed:
        server.log_path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def s3_proxy(s3):
    """The HTTP proxy the storage session's s3a client talks to ``s3`` through: it forwards every
    request unless a test arms a fault (support/s3proxy.py), and counts them."""
    proxy = S3Proxy(s3.endpoint)
    yield proxy
    proxy.stop()


@pytest.fixture(scope="session")
def storage_session(s3, s3_proxy, tmp_path_factory, request):
    """A SparkSession (child process) with the s3a client of ``s3``, through ``s3_proxy``; hdfs://
    files it creates get the cluster's replication, 2. It starts while the MiniDFSCluster does,
    which is up once the session is (the session needs none of the cluster's addresses)."""
    # Spark's default maintenance interval (60 s), not the 1 s other sessions use: the first tick
    # after a store's commit cleans it up (a LIST on s3a, and HEADs), which at 1 s is once per
    # batch; keyedstate uploads snapshots at commit, so restarts load them all the same.
    confs = {**s3.s3a_confs(), "spark.hadoop.fs.s3a.endpoint": s3_proxy.endpoint,
             "spark.hadoop.dfs.replication": "2",
             "spark.sql.streaming.stateStore.maintenanceInterval": "60s"}
    directory = tmp_path_factory.mktemp("storage-session")
    try:
        session, _ = started_beside(lambda: StorageSession(directory, confs), lambda: request.getfixturevalue("hdfs"),
                                    stop_beside=lambda started: started.exit())
    except StorageUnavailable as missing:
        pytest.skip(str(missing))
    yield session
    session.exit()


@pytest.fixture(scope="session")
def storage_root(hdfs, s3) -> Callable[[str, str], str]:
    """``root(where, area)``: a root URI on ``where`` ("hdfs" | "s3a") for the checkpoints of
    ``area`` (a scenario's name, "faults", "requests"), unique to this test run. On s3a every
    area is a bucket of its own: moto lists a prefix by scanning every key of the bucket, so in
    one bucket for the whole run each LIST would cost more with every test that ran before."""
    run = uuid.uuid4().hex[:8]
    buckets: set[str] = set()

    def root(where: str, area: str) -> str:
        if where == "hdfs":
            return f"{hdfs.uri}/keyedstate-tests-{run}/{area}"
        if where != "s3a":
            raise ValueError(f"no storage {where!r}: hdfs or s3a")
        bucket = f"ks-{run}-{area}"
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]", bucket):
            raise ValueError(f"area {area!r} makes {bucket!r}, not an S3 bucket name (lower case, digits, '-')")
        if bucket not in buckets:
            s3.create_bucket(bucket)
            buckets.add(bucket)
        return f"s3a://{bucket}/keyedstate-tests-{run}/{area}"

    return root


@dataclass(frozen=True)
class ScenarioRun:
    reference: list  # Spark's default provider (support/driver.py's output), uninterrupted if it can be
    candidate: list  # the provider under test, restarted after every step
    checkpoint: str  # the candidate's checkpoint URI


@pytest.fixture(scope="session")
def scenario_runs(storage_session, storage_root, candidate_provider, tmp_path_factory) -> Callable:
    """``get(scenario, storage)``: the scenario of support/scenarios.py run on that storage, once
    per test run (the operator and offline tests share the runs). Its reference, Spark's default
    provider, runs once per scenario with its checkpoint on local disk: what is tested on the
    storage is the candidate, and the reference's output depends on its input and restarts only."""
    runs: dict[tuple[str, str], ScenarioRun] = {}
    references: dict[str, list] = {}

    def reference(scenario: str) -> list:
        if scenario not in references:
            local = tmp_path_factory.mktemp(f"{scenario}-reference")
            # Spark checkpoints only the global watermark: after a restart an input counts as
            # watermark 0 until it has data (support/driver.py), so the output of a query with
            # several inputs depends on where it restarted. Its reference restarts at the same steps.
            several_inputs = next(s for s in SCENARIOS if s.name == scenario).multi
            references[scenario] = storage_session.run_scenario(
                scenario, REFERENCE_PROVIDER, str(local / "checkpoint"), local,
                restart_every_step=several_inputs)
        return references[scenario]

    def get(scenario: str, where: str) -> ScenarioRun:
        if (scenario, where) not in runs:
            root = storage_root(where, scenario)
            local = tmp_path_factory.mktemp(f"{scenario}-{where}")
            # a snapshot every 2 versions: restarts load snapshots uploaded to the store, and the
            # changelogs after them
            candidate = storage_session.run_scenario(scenario, candidate_provider, f"{root}/candidate",
                                                     local / "candidate", restart_every_step=True,
                                                     confs={PFX + "snapshotInterval": "2"})
            runs[(scenario, where)] = ScenarioRun(reference(scenario), candidate, f"{root}/candidate")
        return runs[(scenario, where)]

    return get


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the storage servers' log paths and tails."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for what, server in _servers.items():
            report.sections.append((f"{what} log", f"{server.log_path}\n{server.log_tail(30)}"))
