"""Small helpers for the provider-level integration tests (real Spark, real files)."""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Callable, Iterator

PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


@contextlib.contextmanager
def session_confs(spark, confs: dict[str, str]) -> Iterator[None]:
    """Set SQL confs for the duration of a block, restoring the previous values."""
    previous = {key: spark.conf.get(key, None) for key in confs}
    for key, value in confs.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


class FileStream:
    """A JSON file source driven one file (= one micro-batch) at a time."""

    def __init__(self, spark, root: Path, schema: str) -> None:
        self.spark, self.schema = spark, schema
        self.input = root / "input"
        self.input.mkdir(parents=True, exist_ok=True)
        self.checkpoint = str(root / "checkpoint")
        self._files = 0

    def df(self):
        return (self.spark.readStream.schema(self.schema).option("maxFilesPerTrigger", 1)
                .json(str(self.input)))

    def add(self, rows: list[dict]) -> None:
        tmp = self.input / f".tmp-{self._files}"
        tmp.write_text("\n".join(json.dumps(r) for r in rows))
        tmp.rename(self.input / f"{self._files:05d}.json")
        self._files += 1

    def start(self, build: Callable, sink: Callable, mode: str = "update"):
        return (build(self.df()).writeStream.outputMode(mode).foreachBatch(sink)
                .option("checkpointLocation", self.checkpoint).start())

    def partition_dir(self, operator: int = 0, partition: int = 0, store: str | None = None) -> Path:
        path = Path(self.checkpoint) / "state" / str(operator) / str(partition)
        return path / store if store else path


def collect_into(store: dict) -> Callable:
    """A foreachBatch sink keeping the latest value per key: store[key] = row."""
    def sink(batch, batch_id):
        for row in batch.collect():
            store[row[0]] = tuple(row)
    return sink


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.25)


def state_server_pids() -> list[int]:
    """PIDs of running keyedstate state servers (read from /proc, no extra dependency)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"keyedstate.server" in cmdline:
                pids.append(int(entry))
    return pids
