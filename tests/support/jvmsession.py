"""SparkSessions that get a JVM of their own.

PySpark starts one JVM per Python process, with the classpath and ``spark.driver.*`` options of
the first session, and keeps it after ``stop()``: a later session with other ``spark.jars`` would
silently run on the old classpath. Tests that need their own jars or master therefore either
start the process's first JVM and shut it down afterwards (``own_jvm_session``), or, when the
process already has one (the suite's shared ``spark`` fixture), run in a fresh Python process
(``pytest_in_fresh_process``).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterator

CHILD_ENV = "KEYEDSTATE_FRESH_JVM_CHILD"
# For short-lived test JVMs on a small machine: C2 compiler threads and parallel GC threads
# compete with the tasks for the cores, and a test ends before C2's code would pay off. On a
# loaded 2-core box this halves JVM startup, a small job and an executor's relaunch.
QUICK_JVM_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"


def process_has_jvm() -> bool:
    from pyspark import SparkContext

    return SparkContext._gateway is not None


@contextlib.contextmanager
def own_jvm_session(builder) -> Iterator:
    """``builder.getOrCreate()`` on a new JVM, which is shut down on exit."""
    if process_has_jvm():
        raise RuntimeError("this Python process already has a Spark JVM; use pytest_in_fresh_process")
    try:
        spark = builder.getOrCreate()
    except Exception as error:  # the JVM started even if the SparkContext did not: stop it, but
        message = str(error)    # first read the message, which a Py4JJavaError fetches from it
        shutdown_jvm()
        raise RuntimeError(f"the SparkSession did not start: {message}") from error
    except BaseException:
        shutdown_jvm()
        raise
    try:
        yield spark
    finally:
        spark.stop()
        shutdown_jvm()


def shutdown_jvm(timeout: float = 60) -> None:
    """Stop the process's gateway JVM so the next session launches a new one."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    try:
        gateway.shutdown()
    finally:
        SparkContext._gateway = None
        SparkContext._jvm = None
        if proc is not None:  # the JVM exits when its stdin closes (PythonGatewayServer)
            proc.stdin.close()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def pytest_in_fresh_process(target: str | os.PathLike, junit_xml: Path, timeout: float = 1800) -> dict[str, str]:
    """Run a test file (or ``file::test`` node id) in a new Python process; return
    {test name: passed|failed|error|skipped}, plus the child's output under "__output__"."""
    env = dict(os.environ, **{CHILD_ENV: "1"})
    file = Path(str(target).split("::")[0]).resolve()
    node = str(file) + ("::" + str(target).split("::", 1)[1] if "::" in str(target) else "")
    cmd = [sys.executable, "-m", "pytest", node, "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           f"--junitxml={junit_xml}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=file.parent.parent)
    if not junit_xml.exists():
        raise RuntimeError(f"pytest child produced no report:\n{proc.stdout}\n{proc.stderr}")
    outcomes = {}
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        outcomes[case.get("name")] = {"failure": "failed"}.get(outcome, outcome)
    outcomes["__output__"] = proc.stdout[-20000:] + proc.stderr[-5000:]
    return outcomes


def run_here_or_delegate(request, tmp_path: Path) -> bool:
    """For a test that needs a JVM of its own: True if it can start one in this process (run the
    body); otherwise run this very test in a fresh process, fail if it failed there, and return
    False (the caller returns)."""
    if not process_has_jvm():
        return True
    outcomes = pytest_in_fresh_process(f"{request.node.path}::{request.node.name}", tmp_path / "fresh.xml")
    output = outcomes.pop("__output__")
    if outcomes.get(request.node.name) != "passed":
        raise AssertionError(f"in a fresh process: {outcomes}\n{output}")
    return False
