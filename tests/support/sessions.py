"""A SparkSession on keyedstate in a child process, for tests that must control a JVM's
lifetime, environment, ``localDir`` or ``java.io.tmpdir`` (fixed per JVM by the first store it
opens), or kill it. The child is driven by JSON commands on stdin, one JSON reply per command on
stdout; every query is a count per key ``k``, over JSON files with a column ``k`` or (``text``)
over text files with one key a line. Share one session per test module where the tests allow
it: each costs a JVM start.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import testjar
from .processes import alive, children, cmdline, descendants, signal_quietly

QUICK_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""A session JVM does little work: C1 only and the serial GC start it faster."""

# What every child session program starts with: its spec (argv[1]), ``start_session`` (the
# SparkSession of the spec, with the settings tests rely on) and ``reply`` (one JSON line on the
# real stdout; everything else printed goes to stderr, the session's log).
CHILD_PRELUDE = r'''
import json, os, sys, time, traceback
from pathlib import Path

spec = json.loads(sys.argv[1])
_replies = sys.stdout
sys.stdout = sys.stderr  # only replies go to the real stdout

def start_session(app_name, **confs):
    """The spec's SparkSession on keyedstate: ``confs``, then the spec's own confs, over defaults."""
    from pyspark.sql import SparkSession
    import keyedstate
    builder = (SparkSession.builder.master(spec.get("master", "local[2]")).appName(app_name)
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.streaming.stateStore.maintenanceInterval", "1s")
               .config("spark.driver.extraJavaOptions", spec["javaOptions"]))
    for key, value in {**confs, **spec.get("confs", {})}.items():
        builder = builder.config(key, value)
    session = keyedstate.configure(builder).getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session

def reply(obj):
    _replies.write(json.dumps(obj, default=str) + "\n")
    _replies.flush()

def hello(session):
    """The first reply: the child is ready; its JVM's and its own pid."""
    reply({"ready": True, "jvmPid": int(session._jvm.ProcessHandle.current().pid()), "pid": os.getpid()})
'''

# The child process: one SparkSession on keyedstate, driven by JSON commands on stdin, one JSON
# reply per command on stdout. Every query is a count per key k over JSON files with a column k,
# or over text files with one key a line.
SESSION_SCRIPT = CHILD_PRELUDE + r'''
from pyspark.sql import functions as F

spark = start_session("keyedstate-session")

class Query:
    def __init__(self, cmd):
        self.input = Path(cmd["input"])
        self.input.mkdir(parents=True, exist_ok=True)
        self.seen = {}
        for key, value in cmd.get("confs", {}).items():
            spark.conf.set(key, value)
        summary = cmd.get("summary", False)
        self.text = cmd.get("text", False)
        def sink(df, batch_id):
            if summary:  # large batches: two numbers instead of every row through the driver
                row = df.agg(F.count("*").alias("rows"), F.sum("n").alias("total")).collect()[0]
                self.seen.update(rows=int(row["rows"]), total=int(row["total"] or 0))
                return
            for row in df.collect():
                self.seen[row["k"]] = int(row["n"])
        if self.text:  # large batches: Spark reads text faster than it parses JSON
            df = spark.readStream.option("maxFilesPerTrigger", 1).text(str(self.input)).withColumnRenamed("value", "k")
        else:
            df = spark.readStream.schema("k STRING").option("maxFilesPerTrigger", 1).json(str(self.input))
        self.query = (df.groupBy("k").agg(F.count("*").alias("n")).writeStream.outputMode("update")
                      .foreachBatch(sink).option("checkpointLocation", cmd["checkpoint"]).start())

    def processAllAvailable(self):
        self.query.processAllAvailable()

    def stop(self):
        self.query.stop()

def start(cmd):
    return Query(cmd)

def feed(directory, cmd, text=False):
    directory.mkdir(parents=True, exist_ok=True)
    suffix = ".txt" if text else ".json"
    n = len([p for p in directory.iterdir() if p.name.endswith(suffix)])
    tmp = directory / f".{n:05d}.tmp"
    if text:
        if any("\n" in k or "\r" in k for k in cmd["keys"]):
            raise ValueError("a text query's keys are lines: no line breaks in them")
        tmp.write_text("".join(k + "\n" for k in cmd["keys"]))
    else:  # '{"k": <key>}' as json.dumps({"k": key}) writes it, ~4x as fast (large batches: 2 s a batch)
        tmp.write_text("".join(['{"k": %s}\n' % k for k in map(json.dumps, cmd["keys"])]))
    tmp.rename(directory / f"{n:05d}{suffix}")

queries = {}
hello(spark)
for line in sys.stdin:
    cmd = json.loads(line)
    op = cmd["op"]
    try:
        if op == "exit":
            spark.stop()
            reply({"ok": True})
            break
        elif op == "heap":  # the JVM heap in use after full collections
            rt = spark._jvm.java.lang.Runtime.getRuntime()
            for _ in range(3):
                spark._jvm.java.lang.System.gc()
            reply({"ok": True, "used": int(rt.totalMemory() - rt.freeMemory())})
        elif op == "run":  # one more input file, then start the query, run it, stop it
            feed(Path(cmd["input"]), cmd)
            query = start(cmd)
            try:
                query.processAllAvailable()
            finally:
                query.stop()
            reply({"ok": True, "counts": query.seen})
        elif op == "start":  # start a query that keeps running (its stores stay loaded)
            queries[cmd["name"]] = start(cmd)
            reply({"ok": True})
        elif op == "feed":  # one more input file through a running query
            query = queries[cmd["name"]]
            query.seen.clear()
            feed(query.input, cmd, query.text)
            query.processAllAvailable()
            while not query.seen:  # the stream thread may not have seen the new file yet
                time.sleep(0.05)
                query.processAllAvailable()
            progress = query.query.lastProgress or {}
            metrics = [op.get("customMetrics", {}) for op in progress.get("stateOperators", [])]
            reply({"ok": True, "counts": dict(query.seen), "stateMetrics": metrics,
                   "durationMs": progress.get("durationMs", {}),
                   "stateOperators": [{k: v for k, v in op.items() if k != "customMetrics"}
                                      for op in progress.get("stateOperators", [])]})
        elif op == "stop":
            queries.pop(cmd["name"]).stop()
            reply({"ok": True})
        else:
            reply({"ok": False, "error": f"unknown op {op}"})
    except Exception as exc:
        reply({"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()})
'''


class SessionProcess:
    """A SparkSession on keyedstate in a child process (optionally wrapped, e.g. in ``unshare``)."""

    def __init__(self, workdir: Path, confs: dict[str, str] | None = None,
                 env: dict[str, str] | None = None, wrapper: list[str] | None = None,
                 master: str = "local[2]", java_options: str = "", startup_timeout: float = 180.0,
                 script: str = SESSION_SCRIPT, spec: dict | None = None,
                 cwd: Path | None = None) -> None:
        """``script``: the child's program (SESSION_SCRIPT, or another speaking the same protocol),
        given a JSON spec (confs, master, javaOptions, and ``spec``'s entries) as its argument;
        ``cwd``: the child's working directory (the caller's if None)."""
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.log_path = workdir / f"session-{time.monotonic_ns()}.log"
        main = workdir / "session_main.py"
        main.write_text(script)
        confs = {**testjar.forkless_local_conf(), **(confs or {})}
        spec = {**(spec or {}), "confs": confs, "master": master,
                "javaOptions": f"{QUICK_JVM_OPTIONS} {java_options}".strip()}
        full_env = {**os.environ, **(env or {})}
        full_env.pop("PYSPARK_GATEWAY_PORT", None)
        full_env.pop("PYSPARK_GATEWAY_SECRET", None)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([*(wrapper or []), sys.executable, str(main), json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     env=full_env, start_new_session=True, cwd=cwd)
        self._known: dict[int, list[str]] = {}  # pid -> cmdline of every process seen in the session
        self._replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            hello = self._next(startup_timeout, "session start")
            self.jvm_pid_in_ns = hello["jvmPid"]  # as the JVM sees itself (differs inside a PID namespace)
            self.jvm_pid = self._find_jvm()
            self._remember()
        except BaseException:
            self.kill()
            raise

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self._replies.put(json.loads(line))
            except ValueError:
                pass
        self._replies.put(None)

    def _next(self, timeout: float, what: str) -> dict:
        try:
            item = self._replies.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{what}: no reply within {timeout:.0f} s; log {self.log_path}:\n{self.log_tail()}")
        if item is None:
            raise RuntimeError(f"{what}: the session process exited; log:\n{self.log_tail()}")
        return item

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def _find_jvm(self) -> int:
        for pid in descendants(self.proc.pid):
            if cmdline(pid)[:1] and cmdline(pid)[0].endswith("java"):
                return pid
        raise RuntimeError("no JVM among the session's processes")

    def send(self, cmd: dict) -> None:
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()

    def call(self, cmd: dict, timeout: float = 180.0) -> dict:
        self.send(cmd)
        return self._next(timeout, f"command {cmd.get('op')}")

    def has_reply(self) -> bool:
        return not self._replies.empty()

    def reply(self, timeout: float) -> dict:
        return self._next(timeout, "reply")

    def run(self, checkpoint: Path, input_dir: Path, keys: list[str], confs: dict | None = None,
            timeout: float = 180.0) -> dict:
        return self.call({"op": "run", "checkpoint": str(checkpoint), "input": str(input_dir),
                          "keys": keys, "confs": confs or {}}, timeout)

    def start_query(self, name: str, checkpoint: Path, input_dir: Path, confs: dict | None = None,
                    timeout: float = 180.0, summary: bool = False, text: bool = False) -> dict:
        """Start a query that keeps running (see :meth:`feed`). ``summary``: a batch's counts are
        ``{"rows": keys in the batch, "total": sum of their counts}`` instead of one per key.
        ``text``: its input is text files, one key a line (no line breaks in keys), not JSON."""
        return self.call({"op": "start", "name": name, "checkpoint": str(checkpoint), "input": str(input_dir),
                          "confs": confs or {}, "summary": summary, "text": text}, timeout)

    def feed(self, name: str, keys: list[str], timeout: float = 180.0) -> dict:
        """One more input file through the running query ``name``; its batch's counts."""
        return self.call({"op": "feed", "name": name, "keys": keys}, timeout)

    def heap_used(self, timeout: float = 120.0) -> int:
        return self.call({"op": "heap"}, timeout)["used"]

    def servers(self) -> list[int]:
        """The keyedstate state servers this session's JVM started (alive)."""
        self._remember()
        return [p for p in children(self.jvm_pid) if b"keyedstate.server" in b"\0".join(
            c.encode() for c in cmdline(p))]

    def exit(self, timeout: float = 60.0) -> None:
        """A clean stop: spark.stop(), then the interpreter exits; waits until every process the
        session started (JVM, state servers) has exited on its own."""
        self._remember()
        try:
            self.call({"op": "exit"}, timeout)
            self.proc.wait(timeout)
            deadline = time.monotonic() + timeout
            while any(alive(p) for p in self._known) and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            self.kill()

    def _remember(self) -> None:
        for pid in descendants(self.proc.pid):
            self._known.setdefault(pid, cmdline(pid))

    def kill(self) -> None:
        """SIGKILL everything this session started: its process tree, and processes of it seen
        earlier that have been reparented since (e.g. state servers of a killed JVM)."""
        self._remember()
        pids = [self.proc.pid, *(p for p, cmd in self._known.items() if cmdline(p) == cmd)]
        for pid in pids:
            signal_quietly(pid, signal.SIGCONT)
            signal_quietly(pid, signal.SIGKILL)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()

    def __enter__(self) -> "SessionProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
