"""``keyedstate demo``: a real streaming word count whose state lives in keyedstate.

Three rounds each drop a file of words into an input directory and run the query with an
``availableNow`` trigger: every round is a restart from the checkpoint, so the running counts
prove that state survived in keyedstate between runs. The state is then read back with Spark's
``statestore`` data source.
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


def run(batches: int = 3) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from . import PROVIDER_CLASS, configure

    with tempfile.TemporaryDirectory(prefix="keyedstate-demo-") as tmp:
        source, checkpoint = Path(tmp, "in"), str(Path(tmp, "checkpoint"))
        source.mkdir()
        builder = (SparkSession.builder.master("local[2]").appName("keyedstate-demo")
                   .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false"))
        spark = configure(builder).getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        print(f"provider: {spark.conf.get('spark.sql.streaming.stateStore.providerClass')}")
        assert spark.conf.get("spark.sql.streaming.stateStore.providerClass") == PROVIDER_CLASS

        def show(batch, batch_id):
            print(f"--- micro-batch {batch_id}: running word counts ---")
            # Sort on the driver: an orderBy here would re-run the stateful plan to sample ranges.
            for row in sorted(batch.collect(), key=lambda r: (-r["count"], r["word"])):
                print(f"{row['word']:>12} {row['count']}")

        for round_ in range(batches):
            lines = [WORDS[round_ % len(WORDS)]]
            (source / f"{round_:03d}.json").write_text("\n".join(json.dumps({"line": line}) for line in lines))
            words = (spark.readStream.schema("line STRING").json(str(source))
                     .select(F.explode(F.split("line", " ")).alias("word")))
            query = (words.groupBy("word").count().writeStream.outputMode("update")
                     .foreachBatch(show).option("checkpointLocation", checkpoint)
                     .trigger(availableNow=True).start())
            query.awaitTermination()
            progress = query.lastProgress or {}
            for op in progress.get("stateOperators", []):
                print(f"state: {op['numRowsTotal']} keys, custom metrics {op['customMetrics']}")

        state = spark.read.format("statestore").load(checkpoint)
        print("--- state read back with spark.read.format('statestore') ---")
        for row in state.select("key.word", "value.count").orderBy("word").collect():
            print(f"{row['word']:>12} {row['count']}")
        spark.stop()
