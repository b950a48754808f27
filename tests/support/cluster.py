"""A real multi-JVM Spark cluster for tests: ``local-cluster[N,cores,MB]``, or a standalone
Master and Workers on distinct loopback hosts (:func:`standalone_cluster_session`).

Local mode runs tasks in the driver JVM, so it cannot show what happens when an executor dies,
when state must be reloaded by another JVM, or when a class or conf does not reach executors.
``local-cluster`` starts a standalone Master and N Workers inside the driver JVM; each Worker
launches one executor JVM (CoarseGrainedExecutorBackend) as a child process, exactly as on a
real standalone cluster, and relaunches it when it dies.

    with local_cluster_session(conf=testjar.objtest_conf(root)) as cluster:
        spark = cluster.spark
        executor_id, pid = cluster.kill_executor()        # SIGKILL one executor JVM
        cluster.wait_for_executors(2, exclude={executor_id})  # its replacement

What it takes with a pip-installed pyspark:
- The Workers take SPARK_HOME as their home and write every executor's work directory (stdout,
  stderr, a copy of each ``spark.jars`` jar) to ``$SPARK_HOME/work/<app-id>/<executor-id>``,
  which for pip's pyspark is inside site-packages, never cleaned, and shared by concurrent runs
  whose app ids (``app-<second>-0000``) collide. So each cluster gets a SPARK_HOME of its own: a
  temporary directory whose ``bin`` and ``jars`` link to pyspark's.
- Executors run Python workers with ``spark.pyspark.python``; it is set to this interpreter.
- ``spark.executor.memory`` must not exceed the Worker's memory (the MB in the master URL), or
  the SparkContext fails to start; both are ``memory_mb``.
- Everything binds to 127.0.0.1 (SPARK_LOCAL_IP, spark.driver.host), so no network interface or
  hostname resolution is involved.
- Driver and executors run with jvmsession.QUICK_JVM_OPTIONS (C1 only, serial GC): on a loaded
  2-core machine that halved startup (50 -> 25 s), a small job and an executor's relaunch.
- The process must not have a Spark JVM yet (see jvmsession): the master URL and ``spark.jars``
  are fixed when the JVM starts.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Mapping

from support import jvmsession, testjar
from support.constants import PFX, PROVIDER_CONF

EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


class LocalCluster:
    """A running cluster session: the SparkSession and its executor JVMs (children of the
    driver JVM in local-cluster mode, of ``launchers`` when given: a standalone cluster's Workers)."""

    def __init__(self, spark, home: Path, launchers: Callable[[], set[int]] | None = None) -> None:
        self.spark = spark
        self.home = home
        self.app_id = spark.sparkContext.applicationId
        self.driver_pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())
        self._launchers = launchers or (lambda: {self.driver_pid})

    def executor_ids(self) -> list[str]:
        """Executors registered with the driver now."""
        ids = self.spark.sparkContext._jsc.sc().getExecutorIds()
        return sorted(ids.apply(i) for i in range(ids.size()))

    def executor_pids(self) -> dict[str, int]:
        """{executor id: pid} of this cluster's live executor JVMs."""
        found, parents = {}, self._launchers()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] == "Z" or int(fields[1]) not in parents:
                continue  # dead, or another driver's executor
            args = [a.decode(errors="replace") for a in args]
            if EXECUTOR_MAIN in args and "--executor-id" in args:
                found[args[args.index("--executor-id") + 1]] = int(entry)
        return found

    def wait_for_executors(self, count: int, exclude: set[str] = frozenset(), timeout: float = 180) -> dict[str, int]:
        """Wait until ``count`` executors other than ``exclude`` are registered and alive."""
        deadline = time.monotonic() + timeout
        while True:
            pids = self.executor_pids()
            ready = {e: pids[e] for e in self.executor_ids() if e in pids and e not in exclude}
            if len(ready) >= count:
                return ready
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(ready)} of {count} executors after {timeout}s "
                                   f"(registered {self.executor_ids()}, processes {pids}); logs in {self.home}/work")
            time.sleep(0.2)

    def kill_executor(self, executor_id: str | None = None, sig: int = signal.SIGKILL) -> tuple[str, int]:
        """Send ``sig`` to one executor JVM (the lowest id if none is named); return (id, pid)."""
        pids = self.executor_pids()
        if not pids:
            raise RuntimeError("no live executor to kill")
        executor_id = executor_id if executor_id is not None else min(pids, key=int)
        pid = pids[executor_id]
        os.kill(pid, sig)
        return executor_id, pid

    def executor_log(self, executor_id: str) -> str:
        """The executor's stderr (its log4j output), as its Worker captured it."""
        path = self.home / "work" / self.app_id / executor_id / "stderr"
        return path.read_text(errors="replace") if path.exists() else ""


@contextlib.contextmanager
def local_cluster_session(executors: int = 2, cores: int = 1, memory_mb: int = 1024,
                          conf: Mapping[str, str] | None = None, app_name: str = "keyedstate-cluster-test",
                          keep_home: bool = False) -> Iterator[LocalCluster]:
    """Start a local-cluster of ``executors`` JVMs (``cores`` and ``memory_mb`` each), wait for
    them all to register, yield it, and stop it with its JVMs and temporary SPARK_HOME.

    The default (2 x 1 core x 1 GiB, plus the 1 GiB driver) fits a 2-core machine; give ``conf``
    ``spark.sql.shuffle.partitions`` etc. as needed. ``keep_home`` keeps the executor logs.
    """
    home = _spark_home()
    builder = _builder(f"local-cluster[{executors},{cores},{memory_mb}]", app_name, cores, memory_mb, conf)
    saved = {k: os.environ.get(k) for k in ("SPARK_HOME", "SPARK_LOCAL_IP")}
    os.environ.update(SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1")  # read once, at JVM launch
    try:
        with jvmsession.own_jvm_session(builder) as spark:
            _restore(saved)
            saved = {}
            cluster = LocalCluster(spark, home)
            cluster.wait_for_executors(executors)
            yield cluster
    finally:
        _restore(saved)
        if not keep_home:
            shutil.rmtree(home, ignore_errors=True)


def _builder(master: str, app_name: str, cores: int, memory_mb: int, conf: Mapping[str, str] | None):
    """A SparkSession builder for a test cluster; ``conf`` may replace any of its settings."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.executor.memory", f"{memory_mb}m")
               .config("spark.executor.cores", str(cores))
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.extraJavaOptions", jvmsession.QUICK_JVM_OPTIONS)
               .config("spark.executor.extraJavaOptions", jvmsession.QUICK_JVM_OPTIONS))
    # The test jar (objtest://) on the class paths, keyedstate's only in spark.jars, as a user's
    # executors get it; Spark's local files through Hadoop's own file system, keyedstate's
    # through its own (ForklessLocalFileSystem.confFor, loaded from spark.jars).
    jar = testjar.test_jar_path()
    for key, value in {"spark.driver.extraClassPath": jar, "spark.executor.extraClassPath": jar, **(conf or {})}.items():
        builder = builder.config(key, value)
    return builder


def keyedstate_conf(objtest_root: Path, **extra: str) -> dict[str, str]:
    """Conf for a cluster on keyedstate: the objtest:// filesystem and keyedstate's jar shipped to
    the executors, 4 shuffle partitions, a snapshot every 2 versions; ``extra`` on top."""
    import keyedstate

    conf = testjar.objtest_conf(objtest_root)
    conf.update({"spark.jars": f"{conf['spark.jars']},{keyedstate.jar_path()}",
                 PROVIDER_CONF: keyedstate.PROVIDER_CLASS, "spark.sql.shuffle.partitions": "4",
                 PFX + "snapshotInterval": "2", **extra})
    return conf


ROWS_PER_BATCH = 20
KEYS = 10


def slow_counts(spark, checkpoint: str, name: str):
    """The cluster tests' aggregation: a count per key k = value % KEYS of ``rate-micro-batch``
    (ROWS_PER_BATCH rows a batch) through a Python UDF slow enough to kill an executor mid-batch,
    into the memory table ``name``. Every batch adds the same rows to every key, so the output
    is known in closed form (:func:`closed_form`), whatever the provider."""
    from pyspark.sql import functions as F

    keys = KEYS

    @F.udf("long")
    def slow_key(value):
        time.sleep(0.05)
        return value % keys

    return (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", ROWS_PER_BATCH).load()
            .select(slow_key("value").alias("k")).groupBy("k").count()
            .writeStream.outputMode("update").format("memory").queryName(name)
            .option("checkpointLocation", checkpoint).trigger(processingTime="0 seconds").start())


def closed_form(batches: int) -> list[tuple[int, int]]:
    """Every (k, count) row :func:`slow_counts` emits over ``batches`` batches, sorted."""
    return sorted((k, ROWS_PER_BATCH // KEYS * (b + 1)) for k in range(KEYS) for b in range(batches))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spark_home() -> Path:
    import pyspark

    pyspark_home = Path(pyspark.__file__).resolve().parent
    home = Path(tempfile.mkdtemp(prefix="keyedstate-cluster-"))
    for name in ("bin", "jars"):
        (home / name).symlink_to(pyspark_home / name)
    return home


@contextlib.contextmanager
def standalone_cluster_session(hosts: tuple[str, ...] = ("127.0.0.2", "127.0.0.3"), cores: int = 1,
                               memory_mb: int = 1024, conf: Mapping[str, str] | None = None,
                               app_name: str = "keyedstate-standalone-test") -> Iterator[LocalCluster]:
    """A standalone Master and one Worker per entry of ``hosts``, each its own JVM started with
    ``spark-class``, and an application with one executor per Worker.

    Unlike local-cluster, whose executors all report the same host, each executor here runs on
    a host of its own (distinct loopback addresses, which Linux routes to ``lo``): Spark never
    launches a speculative copy of a task on a host where an attempt already runs
    (TaskSetManager.dequeueTaskHelper / hasAttemptOnHost), so speculation needs two hosts."""
    home = _spark_home()
    (home / "work").mkdir()
    spark_class = str(home / "bin" / "spark-class")
    daemons: list[subprocess.Popen] = []
    base_env = dict(os.environ, SPARK_HOME=str(home), SPARK_DAEMON_MEMORY="256m",
                    SPARK_DAEMON_JAVA_OPTS=jvmsession.QUICK_JVM_OPTIONS, PYSPARK_PYTHON=sys.executable)

    def start(args: list[str], host: str, log: str) -> subprocess.Popen:
        out = open(home / log, "wb")
        proc = subprocess.Popen([spark_class, *args], env=dict(base_env, SPARK_LOCAL_IP=host),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        daemons.append(proc)
        return proc

    master_port = _free_port()
    master_url = f"spark://127.0.0.1:{master_port}"
    saved = {k: os.environ.get(k) for k in ("SPARK_HOME", "SPARK_LOCAL_IP")}
    try:
        start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(master_port),
               "--webui-port", str(_free_port())], "127.0.0.1", "master.log")
        _wait_for_port("127.0.0.1", master_port, home / "master.log")
        for i, host in enumerate(hosts):
            start(["org.apache.spark.deploy.worker.Worker", "--host", host, "--cores", str(cores),
                   "--memory", f"{memory_mb}M", "--work-dir", str(home / "work"),
                   "--webui-port", str(_free_port()), master_url], host, f"worker-{i}.log")
        builder = _builder(master_url, app_name, cores, memory_mb,
                           {"spark.cores.max": str(cores * len(hosts)), **(conf or {})})
        os.environ.update(SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1")
        with jvmsession.own_jvm_session(builder) as spark:
            _restore(saved)
            saved = {}
            cluster = LocalCluster(spark, home, launchers=lambda: {p.pid for p in daemons[1:]})
            cluster.wait_for_executors(len(hosts))
            yield cluster
    finally:
        _restore(saved)
        for proc in reversed(daemons):  # Workers first (they stop their executors), then the Master
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(daemons):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        shutil.rmtree(home, ignore_errors=True)


def _wait_for_port(host: str, port: int, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as sock:
            if sock.connect_ex((host, port)) == 0:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s: {log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)


def _restore(saved: Mapping[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
