"""The deterministic micro-batch driver every streaming test uses.

A run feeds a streaming query from JSON files, one file per micro-batch, and records what a
``foreachBatch`` sink sees: ``[(batch_id, sorted rows), ...]``. Two runs of the same scenario
(e.g. two state store providers, one of them stopped and restarted from its checkpoint) see
identical micro-batches, so their outputs must be identical, batch ids included.

Determinism rules the driver follows:

* A new file is published (written under a hidden name, then renamed) only while the query is
  idle, and the driver then waits until the query has *committed* a batch containing it, and
  then for any no-data batches that follow (watermark advance, timeouts, evictions).
  ``processAllAvailable()`` alone is not enough: it can return before the stream thread has
  noticed a file renamed in just before the call, so the driver checks the offset log too.
* Queries with several sources (stream-stream joins) get their files one source at a time, each
  followed by the same wait. Publishing both sides' files "at once" is racy: the stream thread
  lists the sources one after the other, so it may see the left file and not yet the right one
  and split the step into two batches in one run but not in the other.

Caveat for several watermarked inputs: Spark checkpoints only the global watermark, not each
input's, and after a restart an input counts as watermark 0 until it has data again. With the
default "min" policy a restart then delays a watermark advance by a batch unless, at the restart
point, the input published first in a step is not the one holding the global watermark back.
Design multi-source steps accordingly (see the join data in queries/test_operators.py).
"""
from __future__ import annotations

import datetime as dt
import decimal
import difflib
import contextlib
import json
import os
import pprint
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from .constants import PROVIDER_CONF

Rows = list  # list of plain tuples
Output = list  # list of (batch_id, Rows)

BASE_TIME = dt.datetime(2024, 1, 1)


def ts(seconds: float) -> dt.datetime:
    """An event time ``seconds`` after a fixed origin (rendered in the session time zone)."""
    return BASE_TIME + dt.timedelta(seconds=seconds)


# ---------------------------------------------------------------------------------------------
# Rows: input encoding and output normalisation
# ---------------------------------------------------------------------------------------------

def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()  # no offset: parsed in spark.sql.session.timeZone
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(f"cannot encode {value!r} as JSON")


def field_names(spark, schema) -> list[str]:
    """Column names of a DDL string or StructType."""
    if isinstance(schema, str):
        schema = spark.createDataFrame([], schema).schema
    return list(schema.fieldNames())


def _as_dict(row: Any, names: list[str]) -> dict:
    if isinstance(row, dict):
        unknown = set(row) - set(names)
        if unknown:
            raise ValueError(f"row {row!r} has columns {sorted(unknown)} not in the schema {names}")
        return row
    row = tuple(row)
    if len(row) != len(names):
        raise ValueError(f"row {row!r} does not match the schema {names}")
    return dict(zip(names, row))


def plain(value: Any) -> Any:
    """Spark Rows (incl. nested structs such as window bounds) and lists -> plain tuples."""
    if isinstance(value, (tuple, list)):  # pyspark Row is a tuple
        return tuple(plain(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, plain(v)) for k, v in value.items()))
    return value


def _sort_key(value: Any) -> Any:
    """Total order over rows that tolerates None and nested tuples."""
    if value is None:
        return (0,)
    if isinstance(value, tuple):
        return (1, tuple(_sort_key(v) for v in value))
    return (1, value)


def normalise(rows) -> Rows:
    return sorted((plain(r) for r in rows), key=_sort_key)


# ---------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------

class _Inputs:
    """The input directories of one run, and the file counter used to name and await files."""

    def __init__(self, spark, schemas: Sequence, dirs: Sequence[Path]) -> None:
        self.dirs = [Path(d) for d in dirs]
        for d in self.dirs:
            d.mkdir(parents=True, exist_ok=True)
        self.names = [field_names(spark, s) for s in schemas]
        self.counts = [len([f for f in os.listdir(d) if not f.startswith((".", "_"))]) for d in self.dirs]

    @property
    def total(self) -> int:
        return sum(self.counts)

    def publish(self, source: int, rows: Sequence) -> None:
        directory, n = self.dirs[source], self.counts[source]
        lines = [json.dumps(_as_dict(r, self.names[source]), default=_json_default, sort_keys=True)
                 for r in rows]
        tmp = directory / f".{n:05d}.json.tmp"  # hidden: the file source ignores it
        tmp.write_text("".join(line + "\n" for line in lines))
        os.replace(tmp, directory / f"{n:05d}.json")
        self.counts[source] += 1


def _committed_files(checkpoint: Path | str, storage: Any = None) -> int:
    """Files consumed by the last committed batch, summed over sources (-1: nothing committed).

    Reads the offset log: line 3+ of ``offsets/<id>`` is one offset per source, ``-`` for a
    source without one yet; a file source's offset is ``{"logOffset": n}`` after n+1 batches that
    read from it. With one file per batch per source, n+1 is the number of files consumed.
    ``storage``: for a checkpoint URI of another scheme (hdfs://, s3a://), the offline tools'
    storage (keyedstate.offline.storage) it is read through; None for a local directory.
    """
    if storage is None:
        names = _listdir(Path(checkpoint) / "commits")
    else:
        names = [e.name for e in storage.list(storage.join(str(checkpoint), "commits"))
                 if not e.name.startswith(".")]
    commits = [int(f) for f in names if f.isdigit()]
    if not commits:
        return -1
    if storage is None:
        text = (Path(checkpoint) / "offsets" / str(max(commits))).read_text()
    else:
        text = storage.read_bytes(storage.join(str(checkpoint), "offsets", str(max(commits)))).decode()
    total = 0
    for line in text.splitlines()[2:]:
        line = line.strip()
        if line and line != "-":
            offset = json.loads(line)
            if "logOffset" not in offset:
                raise AssertionError(f"unexpected source offset {line!r} in {checkpoint}/offsets")
            total += int(offset["logOffset"]) + 1
    return total


def _listdir(path: Path) -> list[str]:
    try:
        return [f for f in os.listdir(path) if not f.startswith(".")]
    except FileNotFoundError:
        return []


def drain(query, checkpoint: Path | str, expected_files: int, timeout: float = 120.0, storage: Any = None) -> None:
    """Block until a committed batch has consumed ``expected_files`` files and every batch that
    follows without new data (no-data batches) has run too (``storage``: see _committed_files)."""
    deadline = time.monotonic() + timeout
    while True:
        query.processAllAvailable()
        consumed = _committed_files(checkpoint, storage)
        if consumed >= expected_files:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"query did not consume file #{expected_files} within {timeout}s "
                                 f"(committed offsets cover {consumed} files)")
        time.sleep(0.05)
    if consumed > expected_files:
        raise AssertionError(f"committed offsets cover {consumed} files, only {expected_files} were written")
    # The batch that read the file is committed; any no-data batch it triggers is decided by the
    # stream thread only after that commit, so a second processAllAvailable waits for it.
    query.processAllAvailable()


def run_query(spark, provider_class: str, build_query: Callable, schema, steps: Sequence,
              checkpoint_dir, input_dir, output_mode: str, restart_after: int | Sequence[int] | None = None,
              *, trigger_timeout: float = 120.0, on_restart: Callable[[Path], None] | None = None,
              location: str | None = None) -> Output:
    """Run a stateful query over ``steps`` and return ``[(batch_id, sorted rows as tuples)]``.

    * ``schema``: DDL string / StructType for one source, or a list of them for several sources
      (then ``input_dir`` is a list of directories, ``build_query`` takes one DataFrame per
      source, and each step is a list with one list of rows per source; each source's file is
      published and awaited in turn, so a step is one micro-batch per source).
    * ``steps``: rows are dicts or tuples in schema order; ``datetime`` values become ISO strings.
    * ``restart_after=k``: after step k (0-based), stop the query and continue the remaining steps
      with a brand-new query on the same checkpoint and input; ``on_restart(checkpoint)`` runs
      while the query is stopped (e.g. a rescale). A sequence of steps: a restart after each.
    * The provider is set as the session's ``providerClass`` before every start (Spark then keeps
      the checkpoint's value on restarts) and the previous session value is restored at the end.
    * ``location``: the checkpointLocation Spark gets when it is not ``checkpoint_dir`` itself, e.g.
      an ``objtest://`` URI whose objects are the files under ``checkpoint_dir``.
    * ``checkpoint_dir`` may be a URI of another scheme (``hdfs://``, ``s3a://``): the driver then
      reads its offset log through the session's Hadoop FileSystem.
    * Every sink call is recorded, in call order, including batches without rows. Nothing is ever
      replayed here (the driver stops a query only once all its batches are committed), so a
      batch id seen twice means the query re-ran a batch, and the comparison will show it.
    """
    multi = isinstance(schema, (list, tuple))
    schemas = list(schema) if multi else [schema]
    dirs = list(input_dir) if multi else [input_dir]
    if len(dirs) != len(schemas):
        raise ValueError("one input directory per schema is required")
    if not multi:
        steps = [[rows] for rows in steps]
    restarts = {restart_after} if isinstance(restart_after, int) else set(restart_after or ())
    if any(not 0 <= r < len(steps) - 1 for r in restarts):
        raise ValueError(f"restart_after={restart_after} must leave steps on both sides of every restart")
    from keyedstate.offline.storage import is_local, open_storage

    if is_local(checkpoint_dir):
        checkpoint, storage = Path(checkpoint_dir), None
    else:
        checkpoint, storage = str(checkpoint_dir), open_storage(str(checkpoint_dir), spark)
    inputs = _Inputs(spark, schemas, dirs)

    outputs: Output = []

    def sink(batch_df, batch_id):
        outputs.append((int(batch_id), normalise(batch_df.collect())))

    def start():
        spark.conf.set(PROVIDER_CONF, provider_class)
        frames = [spark.readStream.schema(s).option("maxFilesPerTrigger", 1).json(str(d))
                  for s, d in zip(schemas, inputs.dirs)]
        return (build_query(*frames).writeStream.outputMode(output_mode).foreachBatch(sink)
                .option("checkpointLocation", location or str(checkpoint)).start())

    previous_provider = spark.conf.get(PROVIDER_CONF, None)
    query = None
    try:
        query = start()
        for index, step in enumerate(steps):
            if len(step) != len(schemas):
                raise ValueError(f"step {index} has {len(step)} row lists for {len(schemas)} sources")
            for source, rows in enumerate(step):
                inputs.publish(source, rows)
                drain(query, checkpoint, inputs.total, trigger_timeout, storage)
            if index in restarts:
                query.stop()
                if on_restart is not None:
                    on_restart(checkpoint)
                query = start()
                query.processAllAvailable()  # whatever the new query runs unprompted, runs now
    finally:
        if query is not None:
            query.stop()
        if previous_provider is None:  # leave the session's provider as it was
            spark.conf.unset(PROVIDER_CONF)
        else:
            spark.conf.set(PROVIDER_CONF, previous_provider)
    return outputs


# ---------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------

def _render(output: Output) -> list[str]:
    lines = []
    for batch_id, rows in output:
        lines.append(f"batch {batch_id}: {len(rows)} row(s)")
        lines.extend(f"    {row!r}" for row in rows)
    return lines


def assert_same_output(reference: Output, candidate: Output, *, labels=("reference", "candidate")) -> None:
    """Exact comparison of per-batch outputs, with a unified diff of the rendered batches."""
    if reference == candidate:
        return
    ref_ids = [b for b, _ in reference]
    cand_ids = [b for b, _ in candidate]
    summary = []
    if ref_ids != cand_ids:
        summary.append(f"batch ids differ: {labels[0]}={ref_ids} {labels[1]}={cand_ids}")
    cand = dict(candidate)
    differing = [b for b, rows in reference if b in cand and cand[b] != rows]
    if differing:
        summary.append(f"batches with different rows: {differing}")
    diff = difflib.unified_diff(_render(reference), _render(candidate), labels[0], labels[1], lineterm="", n=2)
    raise AssertionError("\n".join(summary + list(diff)))


def rows_of(output: Output) -> Rows:
    """All rows of an output, batch boundaries ignored (for ad-hoc inspection)."""
    return normalise(r for _, rows in output for r in rows)


def show(output: Output) -> str:
    return pprint.pformat(output, width=120)


# ---------------------------------------------------------------------------------------------
# Ad-hoc queries: a file stream driven one file at a time, with the same deterministic wait
# ---------------------------------------------------------------------------------------------

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
    """A JSON file source fed one file (= one micro-batch) at a time. :meth:`step` publishes a
    file and waits, deterministically (see :func:`drain`), until a committed batch consumed it
    and any no-data batch after it ran. Queries over several streams share one checkpoint:
    pass the other streams as ``also`` so that the wait counts their files too."""

    def __init__(self, spark, root: Path, schema: str, checkpoint: Path | str | None = None,
                 readers: int = 1) -> None:
        """``readers``: how many streaming sources of the query read this input (a self-join: 2)."""
        self.spark, self.schema, self.readers = spark, schema, readers
        self.inputs = _Inputs(spark, [schema], [Path(root) / "input"])
        self.input = self.inputs.dirs[0]
        self.checkpoint = str(checkpoint or Path(root) / "checkpoint")

    @property
    def files(self) -> int:
        """Files the query's sources will have consumed once they read everything published."""
        return self.inputs.total * self.readers

    def df(self):
        return (self.spark.readStream.schema(self.schema).option("maxFilesPerTrigger", 1)
                .json(str(self.input)))

    def add(self, rows: Sequence) -> None:
        """Publish one file without waiting (e.g. before the query starts)."""
        self.inputs.publish(0, rows)

    def start(self, build: Callable, sink: Callable, mode: str = "update"):
        return (build(self.df()).writeStream.outputMode(mode).foreachBatch(sink)
                .option("checkpointLocation", self.checkpoint).start())

    def step(self, query, rows: Sequence, also: Sequence["FileStream"] = (), timeout: float = 120.0) -> None:
        """Publish one file and wait until the query has committed it."""
        self.add(rows)
        self.settle(query, also, timeout)

    def settle(self, query, also: Sequence["FileStream"] = (), timeout: float = 120.0) -> None:
        """Wait until the query has committed every file published so far (after a restart too)."""
        drain(query, Path(self.checkpoint), self.files + sum(s.files for s in also), timeout)

    def partition_dir(self, operator: int = 0, partition: int = 0, store: str | None = None) -> Path:
        path = Path(self.checkpoint) / "state" / str(operator) / str(partition)
        return path / store if store else path


def collect_into(store: dict) -> Callable:
    """A foreachBatch sink keeping the latest row per key: store[first column] = row."""
    def sink(batch, batch_id):
        for row in batch.collect():
            store[row[0]] = tuple(row)
    return sink


def count_by_key(df):
    """The aggregation most ad-hoc tests run: a count ``n`` per ``k``."""
    from pyspark.sql import functions as F

    return df.groupBy("k").agg(F.count("*").alias("n"))


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.25)


def error_conditions(exc: BaseException) -> list[str | None]:
    """Spark's error class (``getCondition()``) of each JVM exception in ``exc``'s cause chain,
    outermost first (None: not a SparkThrowable); [] when ``exc`` did not come from the JVM."""
    from py4j.java_gateway import is_instance_of
    from pyspark import SparkContext

    origin = getattr(exc, "_origin", None) or getattr(exc, "java_exception", None)
    gateway = SparkContext._gateway
    conditions: list[str | None] = []
    while origin is not None and len(conditions) < 20:
        throwable = is_instance_of(gateway, origin, "org.apache.spark.SparkThrowable")
        conditions.append(origin.getCondition() if throwable else None)
        origin = origin.getCause()
    return conditions
