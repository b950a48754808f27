"""Spark's offset and commit logs, read and written through Spark's own ``OffsetSeqLog`` and
``CommitLog`` classes over py4j, so that Spark treats the result as it treats its own."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .errors import RescaleError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Every module of the package logs under the name the tool has always logged under (the CLI
# prints it in front of each step).
LOGGER = "keyedstate.offline.rescaling"
PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"
PARTITIONS_KEY = "spark.sql.shuffle.partitions"
FORMAT_KEY = "spark.sql.streaming.stateStore.checkpointFormatVersion"


class SparkLogs:
    """A checkpoint's ``offsets/`` and ``commits/`` through the JVM."""

    def __init__(self, spark: "SparkSession", root: Path) -> None:
        self.root = root
        jvm = spark._jvm
        js = spark._jsparkSession
        logs = jvm.org.apache.spark.sql.execution.streaming.checkpointing
        self.offsets = logs.OffsetSeqLog(js, str(root / "offsets"), False)
        self.commits = logs.CommitLog(js, str(root / "commits"), False)
        self.utils = jvm.org.apache.spark.sql.execution.streaming.state.OfflineStateRepartitionUtils

    def latest(self, log_) -> int | None:
        """The newest batch id in ``self.offsets`` or ``self.commits`` (None: empty)."""
        latest = log_.getLatestBatchId()
        return int(latest.get()) if latest.isDefined() else None

    def offset_entry(self, batch: int):
        entry = self.offsets.get(batch)
        if not entry.isDefined():
            raise RescaleError(f"{self.root / 'offsets' / str(batch)} is missing")
        seq = entry.get()
        if seq.getClass().getSimpleName() != "OffsetSeq":
            raise RescaleError(f"{self.root / 'offsets' / str(batch)} uses offset log format "
                               f"{seq.getClass().getSimpleName()}; keyedstate rescale supports Spark's default (v1)")
        meta = seq.metadataOpt()
        if not meta.isDefined():
            raise RescaleError(f"{self.root / 'offsets' / str(batch)} has no metadata (written by a Spark before 2.1?)")
        return seq, meta.get()

    def conf(self, meta, key: str) -> str | None:
        value = meta.conf().get(key)
        return str(value.get()) if value.isDefined() else None

    def partitions_of(self, batch: int) -> int:
        _, meta = self.offset_entry(batch)
        value = self.conf(meta, PARTITIONS_KEY)
        if value is None:
            raise RescaleError(f"{self.root / 'offsets' / str(batch)} does not record {PARTITIONS_KEY}")
        return int(value)

