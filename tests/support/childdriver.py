"""A streaming driver in a child process (Python driver + its own JVM, local mode), so that a
test can SIGKILL the whole driver at a precise moment and start it again on the checkpoint.

    python3 -m support.childdriver SPEC.json     # with tests/ on sys.path

The spec (JSON, :func:`launch` writes it) names an aggregation over a JSON file source
(``k STRING, v LONG`` -> count and sum per key, after ``filter``), the checkpoint (an
``objtest://`` location and its local directory), the input directory, the steps (one file, one
batch each; files already there are not written again, so a restart first re-executes what
the killed attempt left uncommitted) and the output file: every sink call appends one JSON line
``[batch_id, rows]`` and fsyncs it, so deliveries survive the kill. Kills are aimed by the
``objtest://`` control file (``<op>.action=kill``: the JVM SIGKILLs itself at that call); the
Python driver then exits with the py4j error.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SCHEMA = "k STRING, v LONG"
TESTS_DIR = Path(__file__).resolve().parent.parent


def session(spec: dict):
    from pyspark.sql import SparkSession

    import keyedstate
    from support import jvmsession, testjar
    from support.constants import PROVIDER_CONF, STATE_PREFIX

    builder = (SparkSession.builder.master("local[2]").appName("keyedstate-child-driver")
               .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.extraJavaOptions", jvmsession.QUICK_JVM_OPTIONS)
               .config("spark.sql.streaming.stateStore.maintenanceInterval", "1s"))
    for key, value in testjar.objtest_conf(spec["objtest_root"]).items():
        builder = builder.config(key, value)
    builder = keyedstate.configure(builder)
    confs = {PROVIDER_CONF: spec["provider"], STATE_PREFIX + "checkpointFormatVersion": spec["format_version"],
             **spec.get("confs", {})}
    for key, value in confs.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(spec_path: str) -> int:
    from pyspark.sql import functions as F

    from support.driver import _Inputs, drain, normalise

    spec = json.loads(Path(spec_path).read_text())
    spark = session(spec)
    inputs = _Inputs(spark, [SCHEMA], [Path(spec["input_dir"])])
    out = Path(spec["out"])

    def sink(df, batch_id):
        rows = normalise(df.collect())
        with open(out, "a") as f:
            f.write(json.dumps([int(batch_id), rows]) + "\n")
            f.flush()
            os.fsync(f.fileno())

    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(spec["input_dir"])
    counts = df.where(spec["filter"]).groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("total"))
    query = (counts.writeStream.outputMode("update").foreachBatch(sink)
             .option("checkpointLocation", spec["location"]).start())
    timeout = spec.get("timeout", 300)
    try:
        if inputs.total:  # what an earlier attempt published: its uncommitted batches run first
            drain(query, spec["checkpoint"], inputs.total, timeout=timeout)
        for rows in spec["steps"][inputs.total:]:
            inputs.publish(0, [tuple(r) for r in rows])
            drain(query, spec["checkpoint"], inputs.total, timeout=timeout)
    finally:
        query.stop()
    spark.stop()
    return 0


def launch(spec: dict, spec_path: Path, log: Path) -> subprocess.Popen:
    """Start a child driver on ``spec`` in a process group of its own (so that what it leaves
    behind after a kill, e.g. its state servers, can be stopped with it)."""
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")])))
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "support.childdriver", str(spec_path)], cwd=TESTS_DIR,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float) -> int:
    """Wait for a child driver (its return code; -9 on a timeout), then stop its process group."""
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        rc = -9
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    time.sleep(0.2)
    return rc


def deliveries(out: Path) -> list[tuple[int, list]]:
    """The sink calls a child driver's runs recorded, in order: (batch id, rows as tuples)."""
    if not out.exists():
        return []
    result = []
    for line in out.read_text().splitlines():
        batch, rows = json.loads(line)
        result.append((batch, [tuple(r) for r in rows]))
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
