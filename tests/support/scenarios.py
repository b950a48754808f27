"""The operator scenarios: every stateful operator keyedstate serves, with input steps designed so
that a restart half way and a rescale must preserve every row (see queries/test_operators.py).

Within-batch determinism: where an operator's choice among rows of one batch is arbitrary
(dropDuplicates keeps "a" row per key, a limit keeps "some" rows), the rows it chooses between
are identical, so any choice gives the same output.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

from .driver import ts

@dataclass(frozen=True)
class Scenario:
    name: str
    schema: object  # DDL string, or a list of them (one per source)
    steps: list
    build: Callable
    mode: str
    restart_after: int

    @property
    def multi(self) -> bool:
        return isinstance(self.schema, list)

    def inputs(self, root):
        """The input directory under ``root``, or one per source."""
        return [root / "input-left", root / "input-right"] if self.multi else root / "input"


# --- 1. streaming aggregation, update mode -----------------------------------------------------

KV = "k STRING, v LONG"
# keys repeat across batches, and the key space grows: k0..k3 at first, up to k8 at the end
KV_STEPS = [[(f"k{(b * 3 + i) % (4 + b)}", b * 100 + i) for i in range(8 + 2 * b)] for b in range(5)]


def agg_update(df):
    return df.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("total"))


# --- 2. windowed aggregation, append mode with watermark ---------------------------------------

KTV = "k STRING, ts TIMESTAMP, v LONG"
WINDOW_STEPS = [
    [("a", ts(1), 1), ("b", ts(3), 2), ("a", ts(9), 3), ("c", ts(7), 4)],  # wm -> 4
    [("a", ts(8), 5), ("b", ts(12), 6), ("a", ts(18), 7), ("c", ts(5), 8)],  # late-but-open; wm -> 13: [0,10) closes
    [("a", ts(3), 9), ("b", ts(16), 10), ("c", ts(25), 11), ("a", ts(21), 12)],  # ts 3 too late; wm -> 20
    [("b", ts(19), 13), ("a", ts(28), 14), ("c", ts(33), 15)],  # ts 19 too late; wm -> 28
    [("a", ts(29), 16), ("b", ts(36), 17), ("c", ts(44), 18)],  # wm -> 39: [20,30) closes
    [("a", ts(55), 19)],  # wm -> 50: [30,40) and [40,50) close
]


def window_append(df):
    return (df.withWatermark("ts", "5 seconds")
            .groupBy(F.window("ts", "10 seconds"), "k")
            .agg(F.count("*").alias("n"), F.sum("v").alias("total")))


# --- 3. dropDuplicates without watermark -------------------------------------------------------

IV = "id LONG, v STRING"


def _ids(step, ids):  # same id within a step => identical row; across steps the payload differs
    return [(i, f"s{step}") for i in ids]


DEDUP_STEPS = [
    _ids(0, [0, 1, 1, 2, 3, 3, 4, 5]),
    _ids(1, [3, 4, 6, 7, 7, 8, 9]),
    _ids(2, [0, 8, 10, 11, 11]),
    _ids(3, [5, 11, 12, 2, 12]),
    _ids(4, list(range(15)) + [14]),
]


def drop_duplicates(df):
    return df.dropDuplicates(["id"])


# --- 4. dropDuplicatesWithinWatermark ----------------------------------------------------------

ITV = "id LONG, ts TIMESTAMP, v STRING"
DEDUP_WM_STEPS = [  # state for an id lives until the watermark passes its first ts + 10 s
    [(1, ts(0), "a"), (2, ts(1), "a"), (2, ts(1), "a"), (3, ts(2), "a"), (4, ts(3), "a"), (5, ts(4), "a")],
    [(3, ts(10), "b"), (4, ts(10), "b"), (6, ts(11), "b"), (7, ts(11), "b")],  # 3, 4 dropped; wm -> 1
    [(8, ts(25), "c"), (1, ts(24), "c"), (9, ts(22), "c")],  # 1 still dropped; wm -> 15 evicts 1..5
    [(1, ts(26), "d"), (2, ts(26), "d"), (8, ts(27), "d"), (6, ts(27), "d"), (4, ts(2), "d")],  # 1, 2 again; 4 late
    [(9, ts(45), "e"), (10, ts(45), "e"), (3, ts(44), "e")],  # 9 (expires 32) dropped, 3 again; wm -> 35
    [(6, ts(46), "f"), (7, ts(46), "f"), (8, ts(47), "f"), (9, ts(47), "f"), (10, ts(47), "f")],  # all but 10 again
]


def drop_duplicates_within_watermark(df):
    return df.withWatermark("ts", "10 seconds").dropDuplicatesWithinWatermark(["id"])


# --- 5./6. stream-stream joins -----------------------------------------------------------------

LEFT, RIGHT = "lk LONG, lts TIMESTAMP, lv STRING", "rk LONG, rts TIMESTAMP, rv STRING"
# Spark checkpoints only the global (min) watermark, not each input's: after a restart an input
# counts as watermark 0 until it has data again. Each step runs a left-only then a right-only
# batch, so at the restart point the right input's watermark must be the binding one (<= the
# left's); otherwise the uninterrupted run advances the watermark one batch earlier than the
# restarted one and the batch ids diverge for reasons that have nothing to do with the provider.
JOIN_STEPS = [  # [left rows, right rows]; a match needs rts in [lts, lts + 5 s]
    [[(1, ts(0), "l1"), (2, ts(1), "l2"), (3, ts(2), "l3"), (1, ts(1), "l1b")],
     [(1, ts(2), "r1"), (4, ts(3), "r4")]],  # r4 waits in state for its left row
    [[(4, ts(1), "l4"), (5, ts(10), "l5")],
     [(2, ts(4), "r2"), (3, ts(9), "r3-too-late-for-l3"), (1, ts(5), "r1b")]],
    [[(6, ts(20), "l6"), (7, ts(21), "l7"), (5, ts(11), "l5b"), (12, ts(19), "l12-never-matched"),
      (7, ts(18), "l7b")],
     [(5, ts(12), "r5"), (6, ts(21), "r6"), (13, ts(20), "r13")]],  # wm -> 11: l1..l4 evicted; restart here
    [[(8, ts(30), "l8"), (1, ts(31), "l1c"), (13, ts(17), "l13")],  # l13 meets r13 from before the restart
     [(7, ts(22), "r7"), (1, ts(33), "r1c"), (8, ts(40), "r8-too-late-for-l8")]],  # r7 meets l7, l7b
    [[(9, ts(45), "l9"), (10, ts(46), "l10")],
     [(9, ts(47), "r9"), (6, ts(25), "r6b")]],
    [[(11, ts(60), "l11")],
     [(10, ts(50), "r10"), (11, ts(61), "r11")]],
]
JOIN_CONDITION = "lk = rk AND rts >= lts AND rts <= lts + interval 5 seconds"


def _watermarked(left, right):
    return left.withWatermark("lts", "10 seconds"), right.withWatermark("rts", "10 seconds")


def inner_join(left, right):
    left, right = _watermarked(left, right)
    return left.join(right, F.expr(JOIN_CONDITION), "inner")


def left_outer_join(left, right):
    left, right = _watermarked(left, right)
    return left.join(right, F.expr(JOIN_CONDITION), "left_outer")


# --- 7. session windows ------------------------------------------------------------------------

KT = "k STRING, ts TIMESTAMP"
SESSION_STEPS = [
    [("a", ts(0)), ("a", ts(2)), ("b", ts(1)), ("a", ts(10))],  # a: [0,7) [10,15); b: [1,6); wm -> 5
    [("a", ts(6)), ("b", ts(4)), ("c", ts(12))],  # a@6 merges both a sessions; b extends; wm -> 7
    [("a", ts(20)), ("b", ts(21)), ("c", ts(14)), ("b", ts(3))],  # b@3 late; wm -> 16: a, b close
    [("a", ts(23)), ("b", ts(30)), ("c", ts(16))],  # wm -> 25: c closes
    [("a", ts(40)), ("c", ts(41))],  # wm -> 36: a [20,28), b [21,26)+[30,35) close
    [("d", ts(60))],  # wm -> 55
]


def session_count(df):
    return (df.withWatermark("ts", "5 seconds")
            .groupBy(F.session_window("ts", "5 seconds"), "k").count())


# --- 8. applyInPandasWithState (flatMapGroupsWithState) ----------------------------------------

# The functions run in Python workers, which cannot import this test module: they are defined in
# the builders so that cloudpickle ships them by value.

def pandas_event_time_timeout(df):
    def count_until_idle(key, frames, state):
        """Count events per key; emit (key, count) once the key is idle for 5 s of event time."""
        if state.hasTimedOut:
            (count,) = state.get
            state.remove()
            yield pd.DataFrame({"k": [key[0]], "n": [count]})
            return
        count = state.get[0] if state.exists else 0
        latest_ms = None
        for frame in frames:
            count += len(frame)
            frame_ms = int(pd.Timestamp(frame["ts"].max()).value // 1_000_000)
            latest_ms = frame_ms if latest_ms is None else max(latest_ms, frame_ms)
        state.update((count,))
        state.setTimeoutTimestamp(max(latest_ms, state.getCurrentWatermarkMs()) + 5_000)

    return (df.withWatermark("ts", "5 seconds").groupBy("k").applyInPandasWithState(
        count_until_idle, "k string, n long", "n long", "append", GroupStateTimeout.EventTimeTimeout))


PANDAS_TIMEOUT_STEPS = [
    [("a", ts(0)), ("a", ts(1)), ("b", ts(2))],  # timeouts a: 6, b: 7
    [("a", ts(3)), ("c", ts(4)), ("b", ts(2))],  # a: 8, b: 7, c: 9; wm -> -1
    [("b", ts(12)), ("d", ts(11))],  # b: 17, d: 16; wm -> 7: nothing times out yet
    [("c", ts(20)), ("a", ts(9))],  # a@9 (wm 7) kept -> a: 14, c: 25; wm -> 15: a times out
    [("e", ts(30))],  # wm -> 25: b, d time out (c at 25 stays)
    [("f", ts(40)), ("c", ts(21))],  # c@21 late; wm -> 35: c, e out
]


def pandas_no_timeout(df):
    def running_totals(key, frames, state):
        count, total = state.get if state.exists else (0, 0)
        for frame in frames:
            count += len(frame)
            total += int(frame["v"].sum())
        state.update((count, total))
        yield pd.DataFrame({"k": [key[0]], "n": [count], "total": [total]})

    return df.groupBy("k").applyInPandasWithState(
        running_totals, "k string, n long, total long", "n long, total long", "update",
        GroupStateTimeout.NoTimeout)


# --- 9. streaming global limit -----------------------------------------------------------------

LIMIT_STEPS = [
    _ids(0, [1, 2]),
    _ids(1, [3, 4, 5]),
    _ids(2, [6]),  # 6 rows out so far; restart here
    [(7, "s3")] * 3,  # one of three identical rows reaches the limit of 7
    _ids(4, [8, 9]),  # nothing more
    _ids(5, [10]),
]


def global_limit(df):
    return df.limit(7)


SCENARIOS = [
    Scenario("aggregation-update", KV, KV_STEPS, agg_update, "update", 2),
    Scenario("window-aggregation-append", KTV, WINDOW_STEPS, window_append, "append", 2),
    Scenario("drop-duplicates", IV, DEDUP_STEPS, drop_duplicates, "append", 2),
    Scenario("drop-duplicates-within-watermark", ITV, DEDUP_WM_STEPS, drop_duplicates_within_watermark, "append", 2),
    Scenario("stream-stream-inner-join", [LEFT, RIGHT], JOIN_STEPS, inner_join, "append", 2),
    Scenario("stream-stream-left-outer-join", [LEFT, RIGHT], JOIN_STEPS, left_outer_join, "append", 2),
    Scenario("session-window-append", KT, SESSION_STEPS, session_count, "append", 2),
    Scenario("pandas-with-state-event-time-timeout", KT, PANDAS_TIMEOUT_STEPS, pandas_event_time_timeout, "append", 2),
    Scenario("pandas-with-state-no-timeout", KV, KV_STEPS, pandas_no_timeout, "update", 2),
    Scenario("global-limit", IV, LIMIT_STEPS, global_limit, "append", 2),
]
