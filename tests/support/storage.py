"""Real checkpoint storage for tests/storage: a MiniDFSCluster (HDFS: a NameNode and DataNodes) in
a JVM of its own, an S3 API server (moto) on loopback, and a SparkSession in a child process with
hadoop-aws on its classpath (the shared ``spark`` fixture has no s3a:// client).

The Hadoop jars are fetched once by Maven (``tests/storage/pom.xml``) into the cache of the test
jar (support/testjar.py), named by profile and a hash of the pom; nothing else goes to the network
at test time. Without ``mvn`` the tests are skipped with a message saying how to run them.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import testjar
from .sessions import CHILD_PRELUDE, SessionProcess

STORAGE_DIR = Path(__file__).resolve().parent.parent / "storage"
POM = STORAGE_DIR / "pom.xml"
LAUNCHER = STORAGE_DIR / "src" / "MiniHdfs.java"
TESTS_DIR = Path(__file__).resolve().parent.parent
MISSING_MAVEN = ("tests/storage need Maven (mvn) to fetch the Hadoop minicluster and hadoop-aws jars from Maven "
                 "Central once (into the keyedstate cache); install it (apt-get install -y maven) and run "
                 "`python3 -m pytest tests/storage`; .ci/run does both")
MISSING_MOTO = ("tests/storage need moto's S3 server: pip install -e '.[test]' (or pip install 'moto[server]'), "
                "then `python3 -m pytest tests/storage`")
S3_KEY = "keyedstate-test"  # moto accepts any credentials; s3a must still send some
S3_REGION = "us-east-1"


class StorageUnavailable(RuntimeError):
    """A tool the storage tests need is not installed; the message says how to get it."""


def jars(profile: str) -> Path:
    """The directory of the jars of ``profile`` (hdfs, s3a) in tests/storage/pom.xml, fetched by
    Maven on first use (under a lock: two test runs may race)."""
    mvn = shutil.which("mvn")
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:16]
    target = testjar._cache_dir() / "storage-jars" / f"{profile}-{digest}"
    if target.is_dir():
        return target
    if mvn is None:
        raise StorageUnavailable(MISSING_MAVEN)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_dir():
            staging = target.with_name(f".{target.name}.{os.getpid()}")
            shutil.rmtree(staging, ignore_errors=True)
            proc = subprocess.run([mvn, "-q", "-B", "-f", str(POM), "-P", profile, "dependency:copy-dependencies",
                                   f"-DoutputDirectory={staging}"], capture_output=True, text=True, timeout=900)
            if proc.returncode != 0 or not any(staging.glob("*.jar")):
                shutil.rmtree(staging, ignore_errors=True)
                raise RuntimeError(f"mvn could not fetch the {profile} jars of {POM} (exit {proc.returncode}):\n"
                                   f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
            staging.rename(target)
    return target


def _launcher_classes(hdfs_jars: Path) -> Path:
    """MiniHdfs.java compiled against the hdfs jars, cached by source and jar set."""
    digest = hashlib.sha256(LAUNCHER.read_bytes() + hdfs_jars.name.encode()).hexdigest()[:16]
    target = testjar._cache_dir() / "storage-jars" / f"minihdfs-{digest}"
    if target.is_dir():
        return target
    staging = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    proc = subprocess.run([testjar._javac(), "-d", str(staging), "-cp", f"{hdfs_jars}/*", str(LAUNCHER)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"javac {LAUNCHER} failed:\n{proc.stdout}\n{proc.stderr}")
    try:
        staging.rename(target)
    except OSError:  # another run compiled it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    return target


class _Server:
    """A child process that prints ``<ready word> <address>`` once serving, and stops when its stdin
    closes; its stdout and stderr go to ``log``."""

    def __init__(self, cmd: list[str], log: Path, ready: str, what: str, timeout: float) -> None:
        self.log_path = log
        self.what = what
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()  # stdout after the ready line
        self.address = self._await(ready, timeout)

    def _await(self, ready: str, timeout: float) -> str:
        found: list[str] = []

        def read() -> None:
            for line in self.proc.stdout:
                text = line.decode(errors="replace")
                if not found and text.startswith(ready + " "):
                    found.append(text.split(None, 1)[1].strip())
                elif found:
                    self.lines.put(text.strip())
                self._log.write(line)
                self._log.flush()

        thread = self._reader = threading.Thread(target=read, daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        while not found:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                state = (f"exited with {self.proc.returncode}" if self.proc.poll() is not None
                         else f"not ready within {timeout:.0f} s")
                self.stop()
                raise RuntimeError(f"{self.what} {state}; log {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.1)
        return found[0]

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout: float = 60.0) -> None:
        """Close its stdin (a clean shutdown), SIGKILL it if it has not exited within ``timeout``."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        if getattr(self, "_reader", None) is not None:
            self._reader.join(10)  # its last lines, before the log closes
        self._log.close()


# NameNode RPCs of the DataNodes (DatanodeProtocol), not of a client: left out of request counts
DATANODE_RPCS = frozenset({"versionRequest", "registerDatanode", "sendHeartbeat", "sendLifeline", "blockReport",
                           "cacheReport", "blockReceivedAndDeleted", "errorReport", "reportBadBlocks",
                           "commitBlockSynchronization"})


@dataclass(frozen=True)
class HdfsRequest:
    """One request the MiniDFSCluster answered (tests/storage/src/MiniHdfs.java's request log):
    ``audit`` an audited client call (``op`` HDFS's command: create, open, getfileinfo,
    listStatus, rename, delete, mkdirs, ...; ``key`` its path without the leading ``/``, ``dst``
    a rename's target), or ``rpc`` one RPC (``op`` the method: addBlock, complete, fsync, ...; no
    path). ``time`` is when it was answered (epoch seconds, ms resolution)."""
    time: float
    source: str  # audit | rpc
    op: str
    key: str = ""
    dst: str = ""
    ok: bool = True


class HdfsRequestLog:
    """The request log a MiniHdfs writes, read as it grows (only whole lines)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._seen: list[HdfsRequest] = []
        self._lock = threading.Lock()

    def since(self, start: float, end: float = float("inf")) -> list[HdfsRequest]:
        """The requests answered in [start, end)."""
        with self._lock:
            self._read()
            return [r for r in self._seen if start <= r.time < end]

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        whole = data[:data.rfind(b"\n") + 1]
        self._offset += len(whole)
        for line in whole.decode(errors="replace").splitlines():
            parts = line.split("\t")
            if parts[0] == "A" and len(parts) == 6:
                self._seen.append(HdfsRequest(int(parts[1]) / 1000, "audit", parts[2].split(" ", 1)[0],
                                              _rel(parts[3]), _rel(parts[4]), parts[5] == "ok"))
            elif parts[0] == "R" and len(parts) == 3:
                self._seen.append(HdfsRequest(int(parts[1]) / 1000, "rpc", parts[2]))


def _rel(path: str) -> str:
    """An audited path as the s3 proxy gives keys: no leading ``/`` (``null``: none)."""
    return "" if path == "null" else path.lstrip("/")


class MiniHdfs(_Server):
    """A MiniDFSCluster with ``datanodes`` DataNodes and replication 2, data under ``base``;
    ``uri`` is its ``hdfs://host:port``; ``requests`` the log of every request its NameNode
    answered (:class:`HdfsRequestLog`)."""

    def __init__(self, base: Path, datanodes: int = 2, log: Path | None = None, timeout: float = 300.0) -> None:
        hdfs_jars = jars("hdfs")
        classes = _launcher_classes(hdfs_jars)
        base.mkdir(parents=True, exist_ok=True)
        requests = base / "requests.log"
        requests.unlink(missing_ok=True)
        self.requests = HdfsRequestLog(requests)
        java = str(Path(os.environ["JAVA_HOME"], "bin", "java")) if os.environ.get("JAVA_HOME") else "java"
        cmd = [java, "-Xmx768m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-Dorg.slf4j.simpleLogger.defaultLogLevel=info", f"-Dminihdfs.requests={requests}",
               "-cp", f"{classes}{os.pathsep}{hdfs_jars}/*", "MiniHdfs", str(base / "data"), str(datanodes)]
        super().__init__(cmd, log or base / "minihdfs.log", "HDFS-READY", "the MiniDFSCluster", timeout)
        self.uri = self.address.rstrip("/")
        self._control = threading.Lock()

    def control(self, command: str, timeout: float = 180.0) -> str:
        """Run a command of tests/storage/src/MiniHdfs.java (``stop-datanode``, ``restart-datanode``,
        ``restart-namenode``) and return what it answered after OK; a refused or unanswered command
        raises, naming the log."""
        with self._control:
            self.proc.stdin.write(command.encode() + b"\n")
            self.proc.stdin.flush()
            deadline = time.monotonic() + timeout
            while True:
                try:
                    line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
                except queue.Empty:
                    raise TimeoutError(f"{self.what}: no answer to {command!r} within {timeout:.0f} s; "
                                       f"log {self.log_path}") from None
                if line.startswith(f"CTL OK {command}"):
                    return line[len(f"CTL OK {command}"):].strip()
                if line.startswith(f"CTL ERR {command}"):
                    raise RuntimeError(f"{self.what} refused {command!r}: {line[len(f'CTL ERR {command}'):].strip()}; "
                                       f"log {self.log_path}")


MOTO_SCRIPT = r'''
import functools
import sys
import threading
import werkzeug.serving
import moto.core.serialize
from moto.server import create_backend_app

# werkzeug answers every request that has "Expect: 100-continue" with an interim "100 Continue",
# which the AWS SDK's async client (s3a's copyFromLocalFile: Spark's RocksDB provider uploading
# its SST files) takes for the final response ("S3Exception: Status Code: 100"); without it the
# client sends the body all the same.
_run_wsgi = werkzeug.serving.WSGIRequestHandler.run_wsgi

def run_wsgi(self):
    del self.headers["Expect"]
    return _run_wsgi(self)

werkzeug.serving.WSGIRequestHandler.run_wsgi = run_wsgi

# A LIST answer gives every key's LastModified, which moto keeps as text and parses again (with
# dateutil) for every key of every LIST: the same few texts, parsed once each.
_parse = moto.core.serialize.parse_to_aware_datetime
_parsed = functools.lru_cache(maxsize=1 << 16)(_parse)
moto.core.serialize.parse_to_aware_datetime = lambda value: _parsed(value) if isinstance(value, str) else _parse(value)

# S3's app alone (threaded), not moto's dispatcher of every service: that one looks up the
# service of each request under a lock, scanning all of moto's modules.
server = werkzeug.serving.make_server("127.0.0.1", 0, create_backend_app("s3"), threaded=True)
threading.Thread(target=server.serve_forever, daemon=True).start()
host, port = server.server_address[:2]
print(f"S3-READY http://{host}:{port}", flush=True)
sys.stdin.read()  # runs until stdin closes
server.shutdown()
'''


class MotoS3(_Server):
    """moto's S3 API server on 127.0.0.1 and a port the OS chose, with ``bucket`` created;
    ``endpoint`` is its ``http://127.0.0.1:port``."""

    def __init__(self, base: Path, bucket: str = "checkpoints", log: Path | None = None,
                 timeout: float = 120.0) -> None:
        try:
            import boto3  # noqa: F401  (moto's dependency; the bucket is made with it)
            import moto.server  # noqa: F401
        except ImportError:
            raise StorageUnavailable(MISSING_MOTO) from None
        base.mkdir(parents=True, exist_ok=True)
        super().__init__([sys.executable, "-c", MOTO_SCRIPT], log or base / "moto.log", "S3-READY",
                         "moto's S3 server", timeout)
        self.endpoint = self.address
        self.bucket = bucket
        self.create_bucket(bucket)

    def create_bucket(self, name: str) -> None:
        """A new bucket ``name`` on this server (straight to it, not through any proxy)."""
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, region_name=S3_REGION, aws_access_key_id=S3_KEY,
                     aws_secret_access_key=S3_KEY).create_bucket(Bucket=name)

    def s3a_confs(self) -> dict[str, str]:
        """The Spark confs of an s3a:// client of this server (hadoop-aws 3.5, AWS SDK v2)."""
        prefix = "spark.hadoop.fs.s3a."
        return {prefix + "endpoint": self.endpoint,
                prefix + "endpoint.region": S3_REGION,
                prefix + "path.style.access": "true",  # bucket in the path: no DNS name per bucket
                prefix + "connection.ssl.enabled": "false",
                prefix + "aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
                prefix + "access.key": S3_KEY,
                prefix + "secret.key": S3_KEY,
                # hadoop-aws 3.5.0's default input stream (the analytics accelerator 1.3.1) can wait
                # forever on a read once its thread pool is shut down (awslabs/analytics-accelerator-s3#369)
                prefix + "input.stream.type": "classic",
                # a failing request fails a test within seconds, not after minutes of retries
                prefix + "retry.limit": "2",
                prefix + "attempts.maximum": "2"}


# The child process: one SparkSession with the s3a client, driven by JSON commands on stdin, one
# JSON reply per command on stdout (the protocol of support/sessions.py); a command names a
# function of support/storage_ops.py, which it runs with the session and the command's arguments.
STORAGE_SESSION_SCRIPT = CHILD_PRELUDE + r'''
sys.path.insert(0, spec["tests"])
from pyspark import cloudpickle
import support.driver, support.scenarios, support.storage_ops
for module in (support.driver, support.scenarios, support.storage_ops):  # Python UDF workers cannot import them
    cloudpickle.register_pickle_by_value(module)

spark = start_session("keyedstate-storage", **{"spark.sql.session.timeZone": "UTC"})
hello(spark)
for line in sys.stdin:
    cmd = json.loads(line)
    try:
        if cmd["op"] == "exit":
            spark.stop()
            reply({"ok": True})
            break
        elif cmd["op"] == "tool":
            reply({"ok": True, "result": getattr(support.storage_ops, cmd["tool"])(spark, **cmd["args"])})
        else:
            reply({"ok": False, "error": f"unknown op {cmd['op']}"})
    except Exception as exc:
        reply({"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()})
'''


class StorageSession(SessionProcess):
    """A SparkSession on keyedstate in a child process, with hadoop-aws on its classpath and the
    given confs (the s3a client's): it runs operator scenarios with their checkpoint on any scheme
    and the offline tools on such checkpoints."""

    def __init__(self, workdir: Path, confs: dict[str, str], startup_timeout: float = 300.0) -> None:
        s3a = sorted(str(p) for p in jars("s3a").glob("*.jar"))
        super().__init__(workdir, confs={"spark.jars": ",".join(s3a), **confs}, script=STORAGE_SESSION_SCRIPT,
                         spec={"tests": str(TESTS_DIR)}, startup_timeout=startup_timeout)

    def tool(self, name: str, timeout: float = 600.0, **args):
        """support/storage_ops.py's function ``name`` run in the session with ``args``; its result
        as JSON gives it back (tuples become lists)."""
        reply = self.call({"op": "tool", "tool": name, "args": args}, timeout)
        if not reply.get("ok"):
            raise AssertionError(f"{name} failed in the storage session: {reply.get('error')}\n"
                                 f"{reply.get('trace', '')}\nsession log {self.log_path}:\n{self.log_tail()}")
        return reply.get("result")

    def run_scenario(self, scenario: str, provider: str, checkpoint: str, root: Path, *, steps: int | None = None,
                     restart_every_step: bool = False, confs: dict[str, str] | None = None,
                     timeout: float = 900.0) -> list:
        """The scenario's output (support/driver.py's ``[(batch_id, rows)]``), its checkpoint at the
        URI ``checkpoint`` and its input files under ``root``; with ``restart_every_step`` the query
        is stopped and started again on its checkpoint after every step."""
        import pickle

        root.mkdir(parents=True, exist_ok=True)
        output = root / f"output-{time.monotonic_ns()}.pickle"
        self.tool("scenario", timeout, scenario=scenario, provider=provider, checkpoint=checkpoint, root=str(root),
                  output=str(output), steps=steps, restartEveryStep=restart_every_step, confs=confs or {})
        return pickle.loads(output.read_bytes())

    def offline(self, tool: str, checkpoint: str, timeout: float = 600.0, **args):
        """An offline tool of support/storage_ops.py (inspect, verify, get, state_rows, migrate,
        rescale, ...) on ``checkpoint``, through this session's storage."""
        return self.tool(tool, timeout, checkpoint=checkpoint, **args)
