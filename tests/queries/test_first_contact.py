"""A new user's first session: keyedstate beside every way of adding its jar and the Spark
features a session uses (listeners, ``spark.streams``, ``foreachBatch``, the ``statestore`` and
``state-metadata`` sources), each route in a fresh driver process with Spark's UI on (the UI's
streaming tab loads the provider class on the driver); and what such a session logs.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import keyedstate

from support import jvmsession
from support.constants import PROVIDER_CONF

ROUTE_SCRIPT = r'''
import json, sys
from pathlib import Path
route, work = sys.argv[1], Path(sys.argv[2])
from pyspark.sql import SparkSession, functions as F
from pyspark.sql.streaming import StreamingQueryListener
import keyedstate

def builder():  # (under spark-submit the JVM runs already, with the options of its command line)
    return (SparkSession.builder.master("local[2]").config("spark.sql.shuffle.partitions", "2")
            .config("spark.ui.port", "0").config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.extraJavaOptions", QUICK_JVM_OPTIONS))

if route.startswith("reused-"):  # a session without keyedstate first: its JVM stays up
    (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
     .config("spark.driver.extraJavaOptions", QUICK_JVM_OPTIONS).getOrCreate().stop())
if route.endswith("configure"):
    spark = keyedstate.configure(builder()).getOrCreate()
elif route == "spark.jars":
    spark = (builder().config("spark.jars", keyedstate.jar_path())
             .config("spark.sql.streaming.stateStore.providerClass", keyedstate.PROVIDER_CLASS).getOrCreate())
else:  # spark-submit --jars: the jar and the provider are on its command line
    spark = builder().getOrCreate()
spark.sparkContext.setLogLevel("WARN")

events = []
class Listener(StreamingQueryListener):
    def onQueryStarted(self, event): events.append("started")
    def onQueryProgress(self, event):
        events.append([op.numRowsTotal for op in event.progress.stateOperators])
    def onQueryIdle(self, event): pass
    def onQueryTerminated(self, event): events.append("terminated")
spark.streams.addListener(Listener())

source = work / "in"
source.mkdir()
(source / "0.json").write_text('{"k": "a"}\n{"k": "b"}\n{"k": "a"}\n')
seen = {}
def sink(df, batch_id):
    seen.update({r["k"]: r["n"] for r in df.collect()})
checkpoint = str(work / "checkpoint")
query = (spark.readStream.schema("k STRING").json(str(source)).groupBy("k").agg(F.count("*").alias("n"))
         .writeStream.outputMode("update").foreachBatch(sink).option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start())
active = [q.id == query.id for q in spark.streams.active]
query.awaitTermination()
spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
state = {r[0]: r[1] for r in spark.read.format("statestore").load(checkpoint).select("key.k", "value.*").collect()}
operators = [r["operatorName"] for r in spark.read.format("state-metadata").load(checkpoint).collect()]
print("RESULT " + json.dumps({"provider": spark.conf.get("spark.sql.streaming.stateStore.providerClass"),
                              "jars": spark.sparkContext.getConf().get("spark.jars", ""),
                              "seen": seen, "state": state, "operators": operators, "events": events,
                              "active": active}), flush=True)
spark.stop()
'''

READ_SCRIPT = r'''
import json, sys, time
from pyspark.sql import SparkSession
import keyedstate
spark = keyedstate.configure(SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                             .config("spark.ui.showConsoleProgress", "false")
                             .config("spark.driver.extraJavaOptions", QUICK_JVM_OPTIONS)).getOrCreate()
spark.sparkContext.setLogLevel("WARN")
state = {r[0]: r[1] for r in spark.read.format("statestore").load(sys.argv[1]).select("key.k", "value.*").collect()}
operators = [r["operatorName"] for r in spark.read.format("state-metadata").load(sys.argv[1]).collect()]
time.sleep(3)  # the cleanup a load asks for runs in the background
print("RESULT " + json.dumps({"state": state, "operators": operators}), flush=True)
spark.stop()
'''


def _quick_jvm(script: str) -> str:
    """``script`` with ``QUICK_JVM_OPTIONS`` defined: its session's JVM starts with the options
    of the suite's other short-lived JVMs (C1 only, serial GC: a JIT and a collector, not what
    any route or read is about)."""
    return f"QUICK_JVM_OPTIONS = {jvmsession.QUICK_JVM_OPTIONS!r}\n" + script


def _run(cmd: list[str], cwd: Path) -> tuple[dict, str]:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    results = [line[len("RESULT "):] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    errors = [line for line in proc.stderr.splitlines() if "Error" in line or "Exception" in line][:20]
    assert proc.returncode == 0 and results, \
        f"exit {proc.returncode}\n{proc.stdout}\n" + "\n".join(errors) + "\n...\n" + proc.stderr[-3000:]
    return json.loads(results[-1]), proc.stderr


def _keyedstate_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if re.search(r"\b(WARN|ERROR)\b", line) and "keyedstate" in line]


def run_route(route: str, work: Path) -> tuple[dict, str]:
    script = work / "route.py"
    script.write_text(_quick_jvm(ROUTE_SCRIPT))
    spark_submit = Path(os.path.dirname(__import__("pyspark").__file__), "bin", "spark-submit")
    submit = [str(spark_submit), "--master", "local[2]", "--driver-java-options", jvmsession.QUICK_JVM_OPTIONS]
    if route == "--jars":
        cmd = [*submit, "--jars", keyedstate.jar_path(),
               "--conf", f"{PROVIDER_CONF}={keyedstate.PROVIDER_CLASS}",
               "--conf", f"{keyedstate.conf.PREFIX}pythonExec={sys.executable}",
               str(script), route, str(work)]
    elif route == "--jars+configure":  # the application's own jar on the command line, keyedstate's by configure()
        with zipfile.ZipFile(work / "app.jar", "w") as app_jar:
            app_jar.writestr("app.txt", "the application's jar")
        cmd = [*submit, "--jars", str(work / "app.jar"), str(script), route, str(work)]
    else:
        cmd = [sys.executable, str(script), route, str(work)]
    return _run(cmd, work)


@pytest.fixture(scope="module")
def configure_route(tmp_path_factory) -> tuple[dict, Path]:
    """The "configure" route, run once for the module: its result and its work directory, whose
    checkpoint tests copy before they change anything in it."""
    work = tmp_path_factory.mktemp("configure-route")
    result, _ = run_route("configure", work)
    return result, work


@pytest.mark.parametrize("route", ["--jars", "spark.jars", "configure", "reused-configure", "--jars+configure"])
def test_every_route_serves_listeners_streams_foreach_batch_and_state_sources(route, tmp_path, request):
    """``reused-configure``: keyedstate.configure() in a Python process whose JVM already ran a
    session; spark.jars then reaches only the executors, and ``spark.streams`` failed with
    ClassNotFoundException of the provider on the driver. ``--jars+configure``: configure() under
    spark-submit replaced the launcher's spark.jars (the application's own jar) with its own."""
    if route == "configure":
        result = request.getfixturevalue("configure_route")[0]
    else:
        result, _ = run_route(route, tmp_path)
    if route == "--jars+configure":
        jars = [Path(j.removeprefix("file:")).name for j in result["jars"].split(",")]
        assert jars == ["app.jar", Path(keyedstate.jar_path()).name], result["jars"]
    assert result["provider"] == keyedstate.PROVIDER_CLASS
    assert result["seen"] == {"a": 2, "b": 1}
    assert result["state"] == {"a": 2, "b": 1}
    assert result["operators"] == ["stateStoreSave"]
    assert result["active"] == [True]
    assert result["events"][0] == "started" and result["events"][-1] == "terminated"
    assert [2] in result["events"][1:-1], result["events"]


def test_configure_adds_keyedstate_jar_once_however_spark_jars_names_it(tmp_path, monkeypatch):
    """The jars configure() passes on: keyedstate's jar given already as a relative path, a
    ``file:`` URI (percent-encoded, as spark-submit writes one) or a path with ``..`` is listed
    once; another jar of the same file name in another directory is kept."""
    from keyedstate.shim.session import _merged_jars

    jar = Path(keyedstate.jar_path())
    work = tmp_path / "a dir"
    (work / "sub").mkdir(parents=True)
    monkeypatch.chdir(work)
    other = work / "sub" / jar.name
    other.write_bytes(b"another jar of the same name")
    for given in [os.path.relpath(jar, work), jar.as_uri(), f"{work}/sub/../{os.path.relpath(jar, work)}",
                  f"file:{jar}", str(jar)]:
        assert _merged_jars(given, str(jar)).split(",") == [given], given
    assert _merged_jars(f"{other.as_uri()},sub/{jar.name}", str(jar)).split(",") == [other.as_uri(), str(jar)]
    assert _merged_jars("sub/../sub/" + jar.name, str(jar)).split(",") == ["sub/../sub/" + jar.name, str(jar)]


UNREADABLE_SCRIPT = r'''
import json, sys
from pyspark.sql import SparkSession
import keyedstate
spark = keyedstate.configure(SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
                             .config("spark.ui.showConsoleProgress", "false")
                             .config("spark.driver.extraJavaOptions", QUICK_JVM_OPTIONS)).getOrCreate()
try:
    spark.read.format("statestore").options(**dict(o.split("=") for o in sys.argv[2:])).load(sys.argv[1]).collect()
except Exception as exc:  # Spark's error classes along the cause chain (None: not a SparkThrowable)
    from py4j.java_gateway import is_instance_of
    conditions, origin = [], getattr(exc, "_origin", None) or getattr(exc, "java_exception", None)
    while origin is not None:
        throwable = is_instance_of(spark.sparkContext._gateway, origin, "org.apache.spark.SparkThrowable")
        conditions.append(origin.getCondition() if throwable else None)
        origin = origin.getCause()
    print("CONDITIONS " + json.dumps(conditions), flush=True)
    raise
'''


def test_state_source_read_in_a_fresh_session_logs_no_keyedstate_warning(tmp_path, configure_route):
    """A session that never ran a query has no state store coordinator; the stores a read opens
    asked it whether they are active, and every such question logged a WARN with a stack trace.
    A read the checkpoint cannot serve (a change feed from a batch whose changelog is gone, a
    snapshot that does not exist) ends with one line naming the batch and the file: it ended
    with the Java stack traces of Spark's "Job aborted"."""
    written, work = configure_route
    assert written["state"] == {"a": 2, "b": 1}
    # Two copies of the written checkpoint: the fresh session reads one while the reads that
    # cannot be served run on the other, from which a changelog is gone.
    readable, unreadable = tmp_path / "checkpoint", tmp_path / "unreadable" / "checkpoint"
    shutil.copytree(work / "checkpoint", readable)
    shutil.copytree(work / "checkpoint", unreadable)
    (unreadable / "state" / "0" / "0" / "1.ks-changelog").unlink()
    (tmp_path / "unreadable.py").write_text(_quick_jvm(UNREADABLE_SCRIPT))
    cases = {("readChangeFeed=true", "changeStartBatchId=0"): "/state/0/0/1.ks-changelog (batch 0), which is not "
                                                                "in the checkpoint",
             ("snapshotStartBatchId=0", "snapshotPartitionId=0"): "has no snapshot of version 1 "
                                                                  "(snapshotStartBatchId 0)"}
    procs = {case: subprocess.Popen([sys.executable, str(tmp_path / "unreadable.py"), str(unreadable), *case],
                                    cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for case in cases}

    script = tmp_path / "read.py"
    script.write_text(_quick_jvm(READ_SCRIPT))
    try:
        result, stderr = _run([sys.executable, str(script), str(readable)], tmp_path)
    except BaseException:
        for proc in procs.values():
            proc.kill()
        raise
    assert result == {"state": {"a": 2, "b": 1}, "operators": ["stateStoreSave"]}
    assert _keyedstate_warnings(stderr) == []

    for case, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=1200)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        last = stderr.rstrip("\n").splitlines()[-5:]
        assert proc.returncode != 0, stderr[-3000:]
        assert [line for line in last if line.startswith("keyedstate: ") and cases[case] in line], \
            f"{case}: the last lines are\n" + "\n".join(last)
        # Spark's class for a state the checkpoint cannot serve, as its HDFS provider's change feed raises it
        conditions = json.loads(stdout.split("CONDITIONS ", 1)[1].splitlines()[0])
        assert "CANNOT_LOAD_STATE_STORE.UNCATEGORIZED" in conditions, (case, conditions)


FAILING_SCRIPT = r'''
import json, sys
from pathlib import Path
from pyspark.sql import SparkSession
import keyedstate
key, value, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
builder = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
           .config("spark.sql.shuffle.partitions", "1").config("spark.ui.showConsoleProgress", "false")
           .config("spark.driver.extraJavaOptions", QUICK_JVM_OPTIONS))
if key == "no-jar":  # the provider chosen, the jar forgotten
    spark = builder.config("spark.sql.streaming.stateStore.providerClass", keyedstate.PROVIDER_CLASS).getOrCreate()
else:
    spark = keyedstate.configure(builder).getOrCreate()
    spark.conf.set(keyedstate.conf.PREFIX + key, value)
(work / "in").mkdir()
(work / "in" / "0.json").write_text('{"k": "a"}\n')
query = (spark.readStream.schema("k STRING").json(str(work / "in")).groupBy("k").count().writeStream
         .outputMode("update").format("noop").option("checkpointLocation", str(work / "checkpoint"))
         .trigger(availableNow=True).start())
try:
    query.awaitTermination()
except Exception as exc:  # what the query says, its error classes, and whether any job ran before it failed
    from py4j.java_gateway import is_instance_of
    sc = spark.sparkContext._jsc.sc()
    sc.listenerBus().waitUntilEmpty()
    conditions, origin = [], getattr(exc, "_origin", None) or getattr(exc, "java_exception", None)
    while origin is not None:  # getCondition() along the cause chain (None: not a SparkThrowable)
        throwable = is_instance_of(spark.sparkContext._gateway, origin, "org.apache.spark.SparkThrowable")
        conditions.append(origin.getCondition() if throwable else None)
        origin = origin.getCause()
    print("FAILED " + json.dumps({"message": (exc.getMessageParameters() or {}).get("message"),
                                  "jobs": sc.statusStore().jobsList(None).size(), "conditions": conditions}), flush=True)
    raise
'''


def test_a_failed_query_ends_with_one_line_naming_the_problem(tmp_path):
    """A wrong conf or a missing jar: one line naming it among the last 5 lines of what an
    uncaught StreamingQueryException prints (Spark prints the plan and stack traces after the
    cause). A conf conf.py refuses is the query's own exception, raised before any task: it
    failed the first task, and the query's message was Spark's "Job aborted"."""
    script = tmp_path / "fail.py"
    script.write_text(_quick_jvm(FAILING_SCRIPT))
    cases = {
        ("snapshotIntervall", "5"): f"did you mean '{keyedstate.conf.PREFIX}snapshotInterval'?",
        ("ttl", "-1"): f"Invalid value '-1' for conf '{keyedstate.conf.PREFIX}ttl'",
        ("ttl.9", "1h"): f"Invalid conf '{keyedstate.conf.PREFIX}ttl.9': this query has no stateful operator 9",
        ("no-jar", ""): f'Spark cannot load {keyedstate.PROVIDER_CLASS} on the driver; add the keyedstate jar: '
                        f'spark-submit --jars "$(keyedstate jar)"',
    }
    # The confs conf.py rules on are checked on the driver as the query plans its first batch:
    # the query's exception is conf.py's message, and no job (no task) ran.
    checked_on_driver = {("snapshotIntervall", "5"), ("ttl", "-1")}
    # Spark's error class of the query's cause: a refused value is INVALID_CONF_VALUE; an unknown
    # key fits no class of Spark's (a plain IllegalArgumentException).
    condition = {("snapshotIntervall", "5"): None, ("ttl", "-1"): "INVALID_CONF_VALUE.REQUIREMENT"}
    procs = {}
    for n, (key, value) in enumerate(cases):
        work = tmp_path / str(n)
        work.mkdir()
        procs[key, value] = subprocess.Popen([sys.executable, str(script), key, value, str(work)], cwd=work,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for case, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=1200)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        last = stderr.rstrip("\n").splitlines()[-5:]
        assert proc.returncode != 0, stderr[-3000:]
        assert [line for line in last if line.startswith("keyedstate: ") and cases[case] in line], \
            f"{case}: the last lines are\n" + "\n".join(last)
        if case in checked_on_driver:
            failed = json.loads(stdout.split("FAILED ", 1)[1].splitlines()[0])
            assert cases[case] in failed["message"] and "\n" not in failed["message"], failed
            assert failed["jobs"] == 0, failed
            assert failed["conditions"][:2] == ["STREAM_FAILED", condition[case]], failed


def test_demo_logs_no_keyedstate_warning(tmp_path):
    """The first command a user runs: its counts, and not one WARN or ERROR line of keyedstate's."""
    proc = subprocess.run([sys.executable, "-m", "keyedstate.cli", "demo", "--batches", "2"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "equal to the running counts the query emitted" in proc.stdout, proc.stdout
    assert _keyedstate_warnings(proc.stderr) == []
