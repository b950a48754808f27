"""``keyedstate demo``: a real streaming word count whose state lives in keyedstate.

Each round drops a file of words into an input directory and runs the query with an
``availableNow`` trigger: every round is a restart from the checkpoint, so the running counts
prove that state survived in keyedstate between runs. The state is then read back with Spark's
``statestore`` data source and compared with the last counts.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

WORDS = [
    "spark streaming keeps state",
    "keyedstate keeps state in rocksdb",
    "state grows and state shrinks",
]
QUIET_LOGGING = Path(__file__).resolve().parent / "shim" / "log4j2-quiet.properties"


def run(batches: int = 3) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from . import PROVIDER_CLASS, configure

    print("keyedstate demo: a streaming word count on keyedstate, restarted from its checkpoint every round")
    with tempfile.TemporaryDirectory(prefix="keyedstate-demo-") as tmp:
        source, checkpoint = Path(tmp, "in"), str(Path(tmp, "checkpoint"))
        source.mkdir()
        builder = (SparkSession.builder.master("local[2]").appName("keyedstate-demo")
                   .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={QUIET_LOGGING.as_uri()}"))
        spark = configure(builder).getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        if spark.conf.get("spark.sql.streaming.stateStore.providerClass") != PROVIDER_CLASS:
            raise RuntimeError("the session does not use keyedstate's provider")
        print(f"provider: {PROVIDER_CLASS}\n")

        latest: dict[str, int] = {}

        def show(batch, batch_id):
            rows = sorted(batch.collect(), key=lambda r: (-r["count"], r["word"]))
            latest.update({r["word"]: r["count"] for r in rows})
            print(f"micro-batch {batch_id}: counts of the words it saw (running totals)")
            print(_table([(r["word"], r["count"]) for r in rows]))

        for round_ in range(batches):
            line = WORDS[round_ % len(WORDS)]
            (source / f"{round_:03d}.json").write_text(json.dumps({"line": line}))
            print(f"round {round_ + 1}: a new file says {line!r}")
            words = (spark.readStream.schema("line STRING").json(str(source))
                     .select(F.explode(F.split("line", " ")).alias("word")))
            query = (words.groupBy("word").count().writeStream.outputMode("update")
                     .foreachBatch(show).option("checkpointLocation", checkpoint)
                     .trigger(availableNow=True).start())
            query.awaitTermination()
            for op in (query.lastProgress or {}).get("stateOperators", []):
                metrics = op["customMetrics"]
                print(f"state: {op['numRowsTotal']} keys; commit {metrics.get('keyedstateCommitLatencyMs', 0)} ms, "
                      f"{metrics.get('keyedstateCacheHits', 0)} reads from the near cache\n")

        state = {r["word"]: r["count"] for r in
                 spark.read.format("statestore").load(checkpoint).select("key.word", "value.count").collect()}
        print('state read back with spark.read.format("statestore"):')
        print(_table(sorted(state.items(), key=lambda kv: (-kv[1], kv[0]))))
        verdict = "equal to" if state == latest else "DIFFERENT FROM"
        print(f"{len(state)} keys, {verdict} the running counts the query emitted")
        spark.stop()
        if state != latest:
            raise SystemExit(1)


def _table(rows: list[tuple[str, int]]) -> str:
    width = max([len("word")] + [len(w) for w, _ in rows])
    lines = [f"  {'word':<{width}}  count", f"  {'-' * width}  -----"]
    lines += [f"  {word:<{width}}  {count:>5}" for word, count in rows]
    return "\n".join(lines)
