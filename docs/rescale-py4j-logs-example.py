"""Minimal py4j access to a checkpoint's offset and commit logs (Spark 4.3 classes)."""
import sys, os, shutil
from pyspark.sql import SparkSession

ckpt = sys.argv[1]
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate())
jvm, js = spark._jvm, spark._jsparkSession
cp = jvm.org.apache.spark.sql.execution.streaming.checkpointing

# --- read
olog = cp.OffsetSeqLog(js, ckpt + "/offsets", False)   # 3rd arg: readOnly
clog = cp.CommitLog(js, ckpt + "/commits", False)
last_off = olog.getLatestBatchId()                      # scala.Option[Long]
last_com = clog.getLatestBatchId()
print("latest offsets batch", last_off.get() if last_off.isDefined() else None,
      "latest commit batch", last_com.get() if last_com.isDefined() else None)
bid = last_com.get()
seq = olog.get(bid).get()                               # OffsetSeq (v1) or OffsetMap (v2)
md = seq.metadataOpt().get()                            # OffsetSeqMetadata
print("class", seq.getClass().getSimpleName(), "log version", seq.version())
print("watermark", md.batchWatermarkMs(), "ts", md.batchTimestampMs())
print("state partitions", md.conf().get("spark.sql.shuffle.partitions").get())
print("provider", md.conf().get("spark.sql.streaming.stateStore.providerClass").get())
print("source offsets", seq.toString())
com = clog.get(bid).get()
print("commit", com.json(), "commit log version", com.version())

# --- write batch bid+1 = copy of batch bid with a new partition count (what Spark's runner does)
n = int(sys.argv[2])
new_conf = md.conf().updated("spark.sql.shuffle.partitions", str(n))
new_md = md.copy(md.batchWatermarkMs(), md.batchTimestampMs(), new_conf)
new_seq = seq.copy(seq.offsets(), jvm.scala.Some(new_md))   # OffsetSeq (v1) only
print("offsets add:", olog.add(bid + 1, new_seq))           # False if the file already exists
print("commits add:", clog.add(bid + 1, com))
print("re-add refused:", olog.add(bid + 1, new_seq))
spark.stop()
