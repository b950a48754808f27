"""A real multi-JVM Spark cluster for tests: ``local-cluster[N,cores,MB]``.

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
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Mapping

from support import jvmsession

EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


class LocalCluster:
    """A running local-cluster session: the SparkSession and its executor JVMs."""

    def __init__(self, spark, home: Path) -> None:
        self.spark = spark
        self.home = home
        self.app_id = spark.sparkContext.applicationId
        self.driver_pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())

    def executor_ids(self) -> list[str]:
        """Executors registered with the driver now."""
        ids = self.spark.sparkContext._jsc.sc().getExecutorIds()
        return sorted(ids.apply(i) for i in range(ids.size()))

    def executor_pids(self) -> dict[str, int]:
        """{executor id: pid} of this cluster's live executor JVMs (children of the driver JVM)."""
        found = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] == "Z" or int(fields[1]) != self.driver_pid:
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
    import pyspark
    from pyspark.sql import SparkSession

    pyspark_home = Path(pyspark.__file__).resolve().parent
    home = Path(tempfile.mkdtemp(prefix="keyedstate-cluster-"))
    for name in ("bin", "jars"):
        (home / name).symlink_to(pyspark_home / name)
    builder = (SparkSession.builder.master(f"local-cluster[{executors},{cores},{memory_mb}]")
               .appName(app_name)
               .config("spark.executor.memory", f"{memory_mb}m")
               .config("spark.executor.cores", str(cores))
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.extraJavaOptions", jvmsession.QUICK_JVM_OPTIONS)
               .config("spark.executor.extraJavaOptions", jvmsession.QUICK_JVM_OPTIONS))
    for key, value in (conf or {}).items():  # may replace any of the above
        builder = builder.config(key, value)
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


def _restore(saved: Mapping[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
