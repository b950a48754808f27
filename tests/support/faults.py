"""Running a query while things fail: the deterministic driver of support/driver.py, except that
a query that fails is restarted on its checkpoint (as a supervisor would) until every step is
committed, and the output is judged the way Spark's exactly-once contract allows.

A batch may reach a ``foreachBatch`` sink more than once (a failure after the sink ran and before
Spark's commit log recorded the batch replays it), so a run's output is judged per batch id: the
rows of the *last* delivery of every batch must equal the reference's, and every earlier delivery
of the same batch must be identical too (a replay that differs lost or duplicated something).
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .constants import PROVIDER_CONF
from .driver import Output, _Inputs, drain, normalise


@dataclass
class FaultyRun:
    """What a run under faults produced: every sink delivery in order, and each failure."""
    outputs: Output = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def final(self) -> dict[int, list]:
        return dict(self.outputs)


@dataclass
class Verdict:
    lost: int  # reference rows missing from the run's output
    duplicated: int  # rows the run output more often than the reference (incl. differing replays)
    replays: int  # deliveries of a batch id seen before
    detail: list[str]

    @property
    def exact(self) -> bool:
        return self.lost == 0 and self.duplicated == 0


def judge(reference: Output, run: Output) -> Verdict:
    """Compare a run's deliveries with an uninterrupted reference run (see the module doc)."""
    ref = dict(reference)
    if len(ref) != len(reference):
        raise ValueError("the reference delivered a batch twice")
    lost = duplicated = replays = 0
    detail: list[str] = []
    seen: dict[int, list] = {}
    for batch, rows in run:
        if batch in seen:
            replays += 1
            if seen[batch] != rows:
                extra = collections.Counter(map(repr, rows)) - collections.Counter(map(repr, seen[batch]))
                duplicated += sum(extra.values()) or 1
                detail.append(f"batch {batch} was delivered again with other rows: {rows} after {seen[batch]}")
        seen[batch] = rows
    for batch in sorted(set(ref) | set(seen)):
        want = collections.Counter(map(repr, ref.get(batch, [])))
        got = collections.Counter(map(repr, seen.get(batch, [])))
        missing, extra = want - got, got - want
        if batch not in seen:
            detail.append(f"batch {batch} never delivered")
            if not want:
                lost += 1  # a missing empty batch still means the run diverged
        if missing or extra:
            detail.append(f"batch {batch}: missing {sorted(missing.elements())}, extra {sorted(extra.elements())}")
        lost += sum(missing.values())
        duplicated += sum(extra.values())
    return Verdict(lost, duplicated, replays, detail)


def run_through_failures(spark, provider_class: str, build_query: Callable, schema, steps: Sequence,
                         checkpoint: Path | str, input_dir, output_mode: str, *, location: str | None = None,
                         max_failures: int = 25, timeout: float = 180.0,
                         after_step: Callable[[int, object], None] | None = None,
                         on_failure: Callable[[str], None] | None = None,
                         restart_after: int | None = None, on_restart: Callable[[], None] | None = None,
                         extra_confs: dict | None = None) -> FaultyRun:
    """Run ``steps`` like driver.run_query, restarting the query after each failure.

    ``after_step(index, query)`` runs once a step is committed (e.g. to arm the next faults),
    ``on_failure(message)`` after a failure, before the restart. ``restart_after``: one planned
    stop and restart after that step, with ``on_restart()`` in between (the query is stopped:
    e.g. an offline tool runs on its checkpoint). Gives up after ``max_failures`` failures.
    """
    multi = isinstance(schema, (list, tuple))
    schemas = list(schema) if multi else [schema]
    dirs = list(input_dir) if multi else [input_dir]
    if not multi:
        steps = [[rows] for rows in steps]
    inputs = _Inputs(spark, schemas, dirs)
    result = FaultyRun()
    from keyedstate.offline.storage import is_local, open_storage

    # a checkpoint URI of another scheme (hdfs://, s3a://): its offset log is read through Spark
    storage = None if is_local(checkpoint) else open_storage(str(checkpoint), spark)

    def deliver(batch_df, batch_id):
        result.outputs.append((int(batch_id), normalise(batch_df.collect())))

    def start():
        spark.conf.set(PROVIDER_CONF, provider_class)
        for key, value in (extra_confs or {}).items():
            spark.conf.set(key, value)
        frames = [spark.readStream.schema(s).option("maxFilesPerTrigger", 1).json(str(d))
                  for s, d in zip(schemas, inputs.dirs)]
        return (build_query(*frames).writeStream.outputMode(output_mode).foreachBatch(deliver)
                .option("checkpointLocation", location or str(checkpoint)).start())

    def settle(query):
        """Wait for every published file; restart the query after each failure."""
        deadline = time.monotonic() + timeout * (max_failures + 1)
        while True:
            try:
                drain(query, checkpoint, inputs.total, timeout, storage)
                return query
            except Exception as error:  # the query failed (or hung): note why, start it again
                message = _message(query, error)
                result.failures.append(message)
                try:
                    query.stop()
                except Exception:
                    pass
                if len(result.failures) > max_failures or time.monotonic() > deadline:
                    raise AssertionError(f"{len(result.failures)} failures; the last: {message}") from error
                if on_failure is not None:
                    on_failure(message)
                query = start()

    previous_provider = spark.conf.get(PROVIDER_CONF, None)
    previous = {key: spark.conf.get(key, None) for key in (extra_confs or {})}
    query = None
    try:
        query = start()
        for index, step in enumerate(steps):
            for source, rows in enumerate(step):
                inputs.publish(source, rows)
                query = settle(query)
            if after_step is not None:
                after_step(index, query)
            if index == restart_after:
                query.stop()
                if on_restart is not None:
                    on_restart()
                query = settle(start())
    finally:
        if query is not None:
            try:
                query.stop()
            except Exception:
                pass
        for key, value in {PROVIDER_CONF: previous_provider, **previous}.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    return result


def _message(query, error: BaseException) -> str:
    exception = None
    try:
        exception = query.exception()
    except Exception:
        pass
    return str(exception if exception is not None else error)
