"""Issue 45.1: a spark-submit job on keyedstate exits by itself once its work is done.

Every thread keyedstate starts in a JVM must be a daemon (or stop with the SparkContext), so that
the JVM's exit does not wait for it, and every state server must stop with its JVM. The test runs a
real ``spark-submit`` (pyspark's bin/spark-submit, the keyedstate jar through ``--jars``, the
provider through ``--conf``) of an ``availableNow`` count per key, in local mode and on
``local-cluster`` (executor JVMs of their own, each with its own state server), and requires it to
exit with code 0 within seconds of the query's end, leaving no state server behind."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from support import jvmsession
from support.cluster import _spark_home
from support.constants import PROVIDER_CONF
from support.processes import alive, cmdline, descendants

pytestmark = pytest.mark.timeout(900)

APP = textwrap.dedent('''
    import json, sys, time
    from pyspark.sql import SparkSession, functions as F

    input_dir, checkpoint, out = sys.argv[1:4]
    spark = SparkSession.builder.appName("keyedstate-submit-exit").getOrCreate()
    seen = {}

    def sink(df, batch_id):
        for row in df.collect():
            seen[row["k"]] = int(row["n"])

    query = (spark.readStream.schema("k STRING").json(input_dir).groupBy("k").agg(F.count("*").alias("n"))
             .writeStream.outputMode("update").foreachBatch(sink).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()
    with open(out, "w") as f:
        json.dump({"counts": seen, "done": time.time()}, f)
''')

EXIT_WITHIN_S = 30.0
"""From the query's end to the process's exit: the JVM's shutdown stops the state servers and
waits a few seconds at most for each."""


def submit(tmp_path: Path, master: str, home: Path) -> tuple[int, dict, float, set[int], str]:
    import keyedstate

    app = tmp_path / "app.py"
    app.write_text(APP)
    input_dir = tmp_path / "input"
    input_dir.mkdir()
    keys = [f"key-{i % 7}" for i in range(50)]
    (input_dir / "part-0.json").write_text("".join(json.dumps({"k": k}) + "\n" for k in keys))
    out = tmp_path / "result.json"
    log = tmp_path / "submit.log"
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    for name in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET"):
        env.pop(name, None)
    command = [str(home / "bin" / "spark-submit"), "--master", master, "--jars", keyedstate.jar_path(),
               "--conf", f"{PROVIDER_CONF}=io.keyedstate.spark.KeyedStateProvider",
               "--conf", "spark.sql.shuffle.partitions=2",
               "--conf", "spark.ui.enabled=false",
               "--conf", "spark.driver.host=127.0.0.1",
               "--conf", f"spark.pyspark.python={sys.executable}",
               "--conf", f"spark.driver.extraJavaOptions={jvmsession.QUICK_JVM_OPTIONS}",
               "--conf", f"spark.executor.extraJavaOptions={jvmsession.QUICK_JVM_OPTIONS}",
               str(app), str(input_dir), str(tmp_path / "checkpoint"), str(out)]
    servers: set[int] = set()
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                                cwd=tmp_path, start_new_session=True)
        try:
            deadline = time.monotonic() + 600
            while proc.poll() is None and not out.exists() and time.monotonic() < deadline:
                servers.update(p for p in descendants(proc.pid) if "keyedstate.server" in " ".join(cmdline(p)))
                time.sleep(0.2)
            assert out.exists() or proc.poll() is not None, \
                f"the job did not finish its query within 600 s: {log.read_text(errors='replace')[-3000:]}"
            try:
                code = proc.wait(EXIT_WITHIN_S)
            except subprocess.TimeoutExpired:
                code = None
            exited = time.time()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    result = json.loads(out.read_text()) if out.exists() else {}
    return code, result, exited, servers, log.read_text(errors="replace")


@pytest.mark.parametrize("master", ["local[2]", "local-cluster[2,1,1024]"])
def test_spark_submit_exits_when_its_query_is_done(tmp_path, master):
    home = _spark_home()  # local-cluster's Workers write executors' directories under SPARK_HOME
    try:
        code, result, exited, servers, log = submit(tmp_path, master, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert result.get("counts") == {f"key-{i}": sum(1 for j in range(50) if j % 7 == i) for i in range(7)}, \
        f"the query's results are wrong or missing: {result}; log:\n{log[-3000:]}"
    assert servers, "saw no keyedstate state server: the query did not run on keyedstate"
    assert code is not None, (f"spark-submit ({master}) was still running {EXIT_WITHIN_S:.0f} s after its "
                              f"query ended; log:\n{log[-3000:]}")
    assert code == 0, f"spark-submit ({master}) exited with {code}; log:\n{log[-3000:]}"
    assert exited - result["done"] < EXIT_WITHIN_S
    deadline = time.monotonic() + 10
    while any(alive(p) for p in servers) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in servers if alive(p)]
    assert not left, f"state servers still running after spark-submit exited: {left}"
