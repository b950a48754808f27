"""Real checkpoint storage (issue 48): a MiniDFSCluster (2 DataNodes, replication 2) in a JVM of its
own, moto's S3 API server on loopback, and a child SparkSession with hadoop-aws that runs queries
and offline tools on them (support/storage.py). One of each per test run: they start in about a
minute on 2 loaded cores. The jars come from Maven Central through tests/storage/pom.xml on first
use; without ``mvn`` these tests are skipped with a message saying how to run them."""
from __future__ import annotations

import shutil

import pytest

from support.storage import MiniHdfs, MotoS3, StorageSession, StorageUnavailable

_servers: dict[str, object] = {}


@pytest.fixture(scope="session")
def hdfs(tmp_path_factory, request):
    """The MiniDFSCluster; its ``uri`` is ``hdfs://host:port``. Its log and data are kept (under
    pytest's basetemp, path in the failure report) when a test of the run failed."""
    base = tmp_path_factory.mktemp("minihdfs")
    try:
        cluster = MiniHdfs(base)
    except StorageUnavailable as missing:
        pytest.skip(str(missing))
    _servers["MiniDFSCluster"] = cluster
    yield cluster
    _servers.pop("MiniDFSCluster", None)
    cluster.stop()
    if not request.session.testsfailed:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """moto's S3 server with a bucket; ``s3a_confs()`` are a client's Spark confs."""
    try:
        server = MotoS3(tmp_path_factory.mktemp("moto"))
    except StorageUnavailable as missing:
        pytest.skip(str(missing))
    _servers["moto S3 server"] = server
    yield server
    _servers.pop("moto S3 server", None)
    server.stop()


@pytest.fixture(scope="session")
def storage_session(s3, hdfs, tmp_path_factory):
    """A SparkSession (child process) with the s3a client of ``s3``; hdfs:// files it creates get
    the cluster's replication, 2."""
    confs = {**s3.s3a_confs(), "spark.hadoop.dfs.replication": "2"}
    try:
        session = StorageSession(tmp_path_factory.mktemp("storage-session"), confs)
    except StorageUnavailable as missing:
        pytest.skip(str(missing))
    yield session
    session.exit()


@pytest.fixture(params=["hdfs", "s3a"])
def storage_root(request):
    """A checkpoint root URI on each real storage, unique to the test."""
    import uuid

    if request.param == "hdfs":
        base = request.getfixturevalue("hdfs").uri
    else:
        base = f"s3a://{request.getfixturevalue('s3').bucket}"
    return f"{base}/{request.node.name.split('[')[0]}-{uuid.uuid4().hex[:8]}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the storage servers' log paths and tails."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for what, server in _servers.items():
            report.sections.append((f"{what} log", f"{server.log_path}\n{server.log_tail(30)}"))
