"""Workload definitions and the runner for one (workload, provider) pair.

:func:`run_pair` starts ``python -m benchmarks.run_one`` in a fresh process group, so every pair
gets its own SparkSession and JVM (``spark.driver.memory`` is honoured, RSS peaks are per pair,
nothing is cached between providers). The child calls :func:`run_in_process`, which drives a
streaming query on the deterministic ``rate-micro-batch`` source into a ``noop`` sink and
rewrites its JSON result file after every micro-batch, so a run that times out still leaves the
batches it finished.

Definitions used in the results (see README.md):

* batch time: ``durationMs.triggerExecution`` of the batch's progress event.
* commit time: sum over the batch's state operators of ``stateOperators[].commitTimeMs``
  (the max is recorded too).
* checkpoint bytes of a batch: the total size of the files under ``<checkpoint>/state/`` whose
  mtime falls in the batch's window [start of batch i, start of batch i+1), listed once after the
  query stopped. Files are written once and renamed into place, so this is the bytes the provider
  wrote (and kept) for that batch, including ``.crc`` side files and anything maintenance wrote
  while the batch ran. Nothing is deleted during a run (``minBatchesToRetain`` defaults to 100).
* peak RSS: ``VmHWM`` from ``/proc/<pid>/status`` of the JVM (the ``java`` child of the runner)
  and the sum over every ``keyedstate.server`` process below it; sampled every second and once
  more just before the query stops (a pid's VmHWM only grows, so the last sample is its peak).
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
WORK_DIR = BENCH_DIR / ".work"

STATE_PREFIX = "spark.sql.streaming.stateStore."
KS_PREFIX = STATE_PREFIX + "keyedstate."
PROVIDER_CLASS_CONF = STATE_PREFIX + "providerClass"

# ---------------------------------------------------------------------------------------------
# Providers
# ---------------------------------------------------------------------------------------------
_HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

PROVIDERS: dict[str, dict[str, str]] = {
    "hdfs": {PROVIDER_CLASS_CONF: _HDFS},
    "rocksdb": {PROVIDER_CLASS_CONF: _ROCKSDB},
    "rocksdb_changelog": {PROVIDER_CLASS_CONF: _ROCKSDB,
                          STATE_PREFIX + "rocksdb.changelogCheckpointing.enabled": "true"},
    "keyedstate": {},  # keyedstate.configure() adds the jar and the provider class
    # The same with state TTL on (24h: nothing expires during a run, so the work is the same
    # as without TTL plus timestamps, expiry checks and incremental cleanup scans). Default
    # cleanup interval (10 versions, aligned with snapshotInterval): W1/W2 measure 10 batches,
    # so one full cleanup scan and one snapshot fall inside them, as they would in production.
    "keyedstate_ttl": {KS_PREFIX + "ttl": "24h"},
}
TTL_WORKLOADS = ("W1", "W2")
"""Workloads that run keyedstate_ttl by default (the TTL issue's W1/W2 overhead target)."""


def is_keyedstate(provider: str) -> bool:
    return provider.startswith("keyedstate")

# Same for every provider and workload.
BASE_CONFS: dict[str, str] = {
    "spark.master": "local[2]",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.driver.memory": "6g",
    "spark.ui.showConsoleProgress": "false",
}


# ---------------------------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Params:
    rows: int  # rows per micro-batch (per side for W3)
    keys: int  # key space (W1/W5 groups, W4 users); informational for W2/W3


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    shape: str  # one line for the report
    default_rows: int
    keys: Callable[[int], int]
    build: Callable[[Any, int, Params], tuple[Any, str]]  # (spark, source rows, params) -> (df, mode)
    no_data_batches: bool = True
    seed_rows: Callable[[Params], int] | None = None  # one extra batch of this size, then restart
    near_cache_default: bool = False  # keyedstate gets nearCacheBytes = 10% of estimated state
    warmup: int = 1  # batches run before the measured ones (after the seed batch, if any)
    batches: int = 5  # measured batches unless --batches says otherwise


def rate(spark, rows: int):
    return (spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", rows).option("numPartitions", 2)
            .option("startTimestamp", 0).option("advanceMillisPerBatch", 1000).load())


def _aggregation(spark, source_rows: int, p: Params):
    from pyspark.sql import functions as F
    df = rate(spark, source_rows).groupBy((F.col("value") % p.keys).alias("key")).count()
    return df, "update"


def _dedup(spark, source_rows: int, p: Params):
    from pyspark.sql import functions as F
    df = rate(spark, source_rows).select(F.col("value").alias("id"), "timestamp").dropDuplicates(["id"])
    return df, "append"


def _join(spark, source_rows: int, p: Params):
    # All rows of batch i carry event time i seconds. Right key k = value + rows/2, so half of the
    # right rows find their left partner in the same batch and half wait one batch in state.
    # Watermark 1 s and a +-1 s range: the watermark starts evicting at batch 4, after which each
    # side holds the rows of the last 4 batches (state is steady from batch 4 on: 4 warm-up batches).
    from pyspark.sql import functions as F
    shift = max(1, p.rows // 2)
    left = (rate(spark, source_rows)
            .select(F.col("value").alias("lkey"), F.col("timestamp").alias("lts"))
            .withWatermark("lts", "1 seconds"))
    right = (rate(spark, source_rows)
             .select((F.col("value") + shift).alias("rkey"), F.col("timestamp").alias("rts"),
                     (F.col("value") * 7).alias("payload"))
             .withWatermark("rts", "1 seconds"))
    cond = F.expr("lkey = rkey AND rts >= lts - interval 1 seconds AND rts <= lts + interval 1 seconds")
    return left.join(right, cond, "inner"), "append"


def _sessions(spark, source_rows: int, p: Params):
    # Per-user running event count and last-seen event time; every user appears rows/keys (100)
    # times per batch, so every batch reads and updates all `keys` states. The key space is kept
    # small on purpose: applyInPandasWithState costs ~1 ms of Python per group per batch on this
    # machine whatever the provider (10k users: ~10 s/batch), which would drown the state store.
    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    def track(key, pdfs, state):
        count, last = state.get if state.exists else (0, 0)
        for pdf in pdfs:
            count += len(pdf)
            last = max(last, int(pdf["ts"].max()))
        state.update((count, last))
        yield pd.DataFrame({"user": [key[0]], "count": [count], "last_seen": [last]})

    events = rate(spark, source_rows).select((F.col("value") % p.keys).alias("user"),
                                             F.unix_millis("timestamp").alias("ts"))
    df = events.groupBy("user").applyInPandasWithState(
        track, outputStructType="user long, count long, last_seen long",
        stateStructType="count long, last_seen long", outputMode="update",
        timeoutConf=GroupStateTimeout.NoTimeout)
    return df, "update"


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("W1", "aggregation", "groupBy(value % rows).count(), update; every batch updates all keys",
             1_000_000, keys=lambda rows: rows, build=_aggregation, no_data_batches=False, batches=10),
    Workload("W2", "dedup", "dropDuplicates(id = value), append; state grows by `rows` every batch",
             1_000_000, keys=lambda rows: rows, build=_dedup, no_data_batches=False, batches=10),
    Workload("W3", "stream-stream join",
             "inner join of two rate sources (`rows` per side) on key + event time +-1 s, watermark 1 s; "
             "state steady at ~4 batches per side after 4 warm-up batches",
             200_000, keys=lambda rows: rows, build=_join, warmup=4),
    Workload("W4", "applyInPandasWithState",
             "per-user running count + last seen, `rows`/100 users, NoTimeout, update",
             200_000, keys=lambda rows: max(1, rows // 100), build=_sessions),
    Workload("W5", "large state",
             "W1 with 10x`rows` keys: one seed batch of 10x`rows` rows fills the state, restart, "
             "then `rows` rows per batch update 10% of it",
             1_000_000, keys=lambda rows: 10 * rows, build=_aggregation, no_data_batches=False,
             seed_rows=lambda p: p.keys, near_cache_default=True),
)}

# keyedstate's near cache for W5 is 10% of the state, estimated at this many bytes per entry
# (8-byte key + 8-byte count as UnsafeRows plus per-entry overhead).
STATE_BYTES_PER_ENTRY = 64
NEAR_CACHE_KNOB = "nearCacheBytes"


# ---------------------------------------------------------------------------------------------
# /proc helpers (no psutil dependency)
# ---------------------------------------------------------------------------------------------
def _proc_table() -> dict[int, tuple[int, str, bytes]]:
    """pid -> (ppid, comm, cmdline) for every live process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
            comm = stat[stat.index("(") + 1: stat.rindex(")")]
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            cmdline = Path("/proc", entry, "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        table[int(entry)] = (ppid, comm, cmdline)
    return table


def _descendants(table, root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def _vm_hwm(pid: int) -> int | None:
    try:
        for line in Path("/proc", str(pid), "status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class RssSampler:
    """Peak RSS (VmHWM) of the JVM, the keyedstate state servers and the PySpark workers."""

    def __init__(self) -> None:
        self.peaks: dict[str, dict[int, int]] = {"jvm": {}, "state_servers": {}, "python_workers": {}}

    def sample(self) -> None:
        table = _proc_table()
        me = os.getpid()
        for pid in _descendants(table, me):
            ppid, comm, cmdline = table[pid]
            if comm == "java":
                kind = "jvm"
            elif b"keyedstate.server" in cmdline:
                kind = "state_servers"
            elif b"pyspark.daemon" in cmdline or b"pyspark.worker" in cmdline:
                kind = "python_workers"
            else:
                continue
            hwm = _vm_hwm(pid)
            if hwm is not None:
                self.peaks[kind][pid] = max(hwm, self.peaks[kind].get(pid, 0))

    def summary(self) -> dict[str, Any]:
        return {
            "rss_jvm_peak_bytes": max(self.peaks["jvm"].values(), default=None),
            "rss_state_servers_peak_bytes": sum(self.peaks["state_servers"].values()) or None,
            "state_server_processes": len(self.peaks["state_servers"]),
            # Forked workers share pages with the daemon, so this sum over-counts.
            "rss_python_workers_peak_bytes_sum": sum(self.peaks["python_workers"].values()) or None,
        }


def _busy_jiffies() -> int:
    """CPU time (clock ticks) all CPUs spent not idle since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # minus idle, iowait


def _tree_jiffies() -> int:
    """CPU time of this process and everything below it (reaped children included)."""
    table = _proc_table()
    total = 0
    for pid in [os.getpid(), *_descendants(table, os.getpid())]:
        try:
            stat = Path("/proc", str(pid), "stat").read_text()
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2:].split()
        total += sum(int(x) for x in f[11:15])  # utime stime cutime cstime
    return total


class CpuMonitor:
    """How much CPU *other* processes used while a run was measured (contention check)."""

    def __init__(self) -> None:
        self.start = (time.monotonic(), _busy_jiffies(), _tree_jiffies())

    def other_cpu_share(self) -> float:
        """Busy CPU of processes outside this run, as a share of all CPUs over the interval."""
        t0, busy0, tree0 = self.start
        elapsed = time.monotonic() - t0
        hz = os.sysconf("SC_CLK_TCK")
        other = (_busy_jiffies() - busy0) - (_tree_jiffies() - tree0)
        return max(0.0, other / hz / (elapsed * (os.cpu_count() or 1))) if elapsed > 0 else 0.0


def idle_check(seconds: float = 1.0) -> float:
    """Share of all CPUs busy over ``seconds`` (sampled before a run starts)."""
    hz, n = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1
    b0, t0 = _busy_jiffies(), time.monotonic()
    time.sleep(seconds)
    return (_busy_jiffies() - b0) / hz / ((time.monotonic() - t0) * n)


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _files_with_mtime(path: Path) -> list[tuple[float, int]]:
    out = []
    for root, _, files in os.walk(path):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            out.append((st.st_mtime, st.st_size))
    return out


def _epoch(ts: str) -> float:
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def environment() -> dict[str, Any]:
    import pyspark
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "mem_total_bytes": mem, "cpu_model": cpu,
            "python": platform.python_version(), "pyspark": pyspark.__version__,
            "platform": platform.platform()}


# ---------------------------------------------------------------------------------------------
# In-process run (the child)
# ---------------------------------------------------------------------------------------------
@dataclass
class RunSpec:
    workload: str
    provider: str
    rows: int | None = None  # None: the workload's default
    batches: int | None = None  # measured batches (after the warm-up); None: the workload's default
    warmup: int | None = None  # None: the workload's default
    confs: list[str] = field(default_factory=list)  # "provider:key=value" or "key=value" (all)
    near_cache: str = "auto"  # auto (10% of W5 state) | off | a size such as 512m
    timeout: float = 300.0  # seconds for the whole run, JVM start included
    keep_checkpoint: bool = False
    wait_idle: float = 0.0  # wait up to this many seconds for the machine to be idle first

    def resolved_warmup(self) -> int:
        return WORKLOADS[self.workload].warmup if self.warmup is None else self.warmup

    def resolved_batches(self) -> int:
        return WORKLOADS[self.workload].batches if self.batches is None else self.batches

    def resolved_rows(self) -> int:
        return self.rows or WORKLOADS[self.workload].default_rows

    def slug(self) -> str:
        return f"{self.workload}__{self.provider}"


def parse_conf_args(items: list[str], provider: str) -> dict[str, str]:
    """``provider:key=value`` (or ``all:key=value`` / ``key=value``) -> confs for ``provider``."""
    out = {}
    for item in items:
        target, sep, rest = item.partition(":")
        if not sep or "=" in target:  # no provider prefix: applies to all
            target, rest = "all", item
        if target not in ("all", "*", provider):
            if target not in PROVIDERS and target not in ("all", "*"):
                raise ValueError(f"--conf {item!r}: unknown provider {target!r} ({', '.join(PROVIDERS)})")
            continue
        key, eq, value = rest.partition("=")
        if not eq:
            raise ValueError(f"--conf {item!r}: expected [provider:]key=value")
        out[key.strip()] = value.strip()
    return out


def session_confs(spec: RunSpec, params: Params, notes: list[str]) -> dict[str, str]:
    wl = WORKLOADS[spec.workload]
    confs = dict(BASE_CONFS)
    if not wl.no_data_batches:
        confs["spark.sql.streaming.noDataMicroBatches.enabled"] = "false"
    confs.update(PROVIDERS[spec.provider])
    if is_keyedstate(spec.provider) and wl.near_cache_default and spec.near_cache != "off":
        from keyedstate import conf as ks_conf
        size = (str(int(params.keys * STATE_BYTES_PER_ENTRY * 0.10)) if spec.near_cache == "auto"
                else spec.near_cache)
        if NEAR_CACHE_KNOB in ks_conf.BY_NAME:
            confs[KS_PREFIX + NEAR_CACHE_KNOB] = size
            notes.append(f"keyedstate near cache {size} bytes (10% of ~{STATE_BYTES_PER_ENTRY} B/entry)")
        else:
            notes.append(f"keyedstate has no '{NEAR_CACHE_KNOB}' knob yet: near cache not set")
    confs.update(parse_conf_args(spec.confs, spec.provider))
    return confs


def build_session(spec: RunSpec, confs: dict[str, str], run_dir: Path):
    from pyspark.sql import SparkSession
    tmp = run_dir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    builder = SparkSession.builder.appName(f"bench-{spec.slug()}")
    # Scratch space inside the run dir so that it is removed even after a hard kill.
    builder = (builder.config("spark.local.dir", str(tmp))
               .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={tmp}"))
    ks_options = {}
    for key, value in confs.items():
        if is_keyedstate(spec.provider) and key.startswith(KS_PREFIX):
            ks_options[key[len(KS_PREFIX):]] = value  # validated by configure()
        else:
            builder = builder.config(key, value)
    if is_keyedstate(spec.provider):
        import keyedstate
        builder = keyedstate.configure(builder, **ks_options)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def _batch_record(progress: dict) -> dict:
    ops = progress.get("stateOperators") or []
    commits = [op.get("commitTimeMs", 0) or 0 for op in ops]
    return {
        "batchId": progress["batchId"],
        "timestamp": progress["timestamp"],
        "start_epoch": _epoch(progress["timestamp"]),
        "batch_ms": progress["durationMs"].get("triggerExecution"),
        "durationMs": progress["durationMs"],
        "numInputRows": progress.get("numInputRows"),
        "commit_ms": sum(commits) if ops else None,
        "commit_ms_max": max(commits) if ops else None,
        "numRowsTotal": sum(op.get("numRowsTotal", 0) or 0 for op in ops) if ops else None,
        "numRowsUpdated": sum(op.get("numRowsUpdated", 0) or 0 for op in ops) if ops else None,
        "stateOperators": ops,  # every field incl. customMetrics, per operator
    }


def _drive(spark, spec: RunSpec, params: Params, source_rows: int, checkpoint: Path,
           first_measured: int | None, last_batch: int, deadline: float, result: dict,
           out: Path, sampler: RssSampler, phase: str) -> None:
    """Run one query until batch ``last_batch`` completed, recording batches into ``result``."""
    wl = WORKLOADS[spec.workload]
    df, mode = wl.build(spark, source_rows, params)
    state_dir = checkpoint / "state"
    writer = (df.writeStream.format("noop").outputMode(mode)
              .option("checkpointLocation", str(checkpoint)).queryName(f"{spec.slug()}_{phase}"))
    if phase == "seed":
        # exactly one batch: stopping a free-running query would leave the next (seed-sized)
        # batch in the offset log, to be replayed after the restart
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    seen = {b["batchId"] for b in result["batches"]}
    next_rss = 0.0
    cpu = CpuMonitor()
    try:
        while True:
            active = query.isActive
            new = False
            for p in query.recentProgress:
                p = json.loads(p.json)
                if p["batchId"] in seen or not p.get("durationMs", {}).get("triggerExecution"):
                    continue
                if phase == "measure" and p["batchId"] < (first_measured or 0) - spec.resolved_warmup():
                    continue
                rec = _batch_record(p)
                rec["phase"] = phase if phase == "seed" else (
                    "warmup" if p["batchId"] < first_measured else "measured")
                rec["state_dir_bytes"] = _dir_bytes(state_dir)
                result["batches"].append(rec)
                seen.add(p["batchId"])
                new = True
            if new:
                result["batches"].sort(key=lambda b: b["batchId"])
                _write_json(out, result)
            if max(seen, default=-1) >= last_batch:
                break
            if not active:
                exc = query.exception()
                raise RuntimeError(f"query failed: {exc}" if exc else "query stopped before its last batch")
            now = time.monotonic()
            if now >= next_rss:
                sampler.sample()
                next_rss = now + 1.0
            if now > deadline:
                result["status"] = "timeout"
                break
            time.sleep(0.2)
    finally:
        sampler.sample()  # final sample: before the query (and the state servers) stop
        result.update(sampler.summary())
        share = round(cpu.other_cpu_share(), 3)
        result.setdefault("other_cpu_share", {})[phase] = share
        if share > 0.10:
            result["notes"].append(f"other processes used {share:.0%} of the CPUs during the {phase} "
                                   "phase: timings are contended")
        try:
            query.stop()
        except Exception as exc:  # noqa: BLE001 - recorded, not fatal
            result.setdefault("notes", []).append(f"query.stop() failed: {exc}")


def _attribute_checkpoint_bytes(result: dict, state_dir: Path) -> None:
    batches = result["batches"]
    if not batches or not state_dir.exists():
        return
    files = _files_with_mtime(state_dir)
    starts = [b["start_epoch"] for b in batches]
    for i, b in enumerate(batches):
        lo = starts[i]
        hi = starts[i + 1] if i + 1 < len(batches) else starts[i] + b["batch_ms"] / 1000 + 0.5
        # a file renamed into place while batch i commits has mtime <= its end; the clock of the
        # progress timestamp has ms resolution, so allow 1 ms of slack at the window start
        b["ckpt_bytes_written"] = sum(size for mtime, size in files if lo - 0.001 <= mtime < hi)
    result["state_dir_bytes_final"] = sum(size for _, size in files)


def summarize(result: dict) -> dict:
    measured = [b for b in result["batches"] if b.get("phase") == "measured"]
    times = [b["batch_ms"] for b in measured if b.get("batch_ms") is not None]
    commits = [b["commit_ms"] for b in measured if b.get("commit_ms") is not None]
    ckpt = [b["ckpt_bytes_written"] for b in measured if b.get("ckpt_bytes_written") is not None]
    seed = [b for b in result["batches"] if b.get("phase") == "seed"]
    last = result["batches"][-1] if result["batches"] else {}
    return {
        "measured_batches": len(measured),
        "median_batch_ms": statistics.median(times) if times else None,
        "mean_batch_ms": statistics.fmean(times) if times else None,
        "min_batch_ms": min(times) if times else None,
        "max_batch_ms": max(times) if times else None,
        "commit_p50_ms": percentile(commits, 50),
        "commit_p99_ms": percentile(commits, 99),
        "ckpt_bytes_per_batch_median": statistics.median(ckpt) if ckpt else None,
        "ckpt_bytes_measured_total": sum(ckpt) if ckpt else None,
        "num_rows_total_final": last.get("numRowsTotal"),
        "warmup_batch_ms": [b["batch_ms"] for b in result["batches"] if b.get("phase") == "warmup"],
        "seed_batch_ms": seed[0]["batch_ms"] if seed else None,
    }


def run_in_process(spec: RunSpec, out: Path, run_dir: Path) -> dict:
    started = time.monotonic()
    deadline = started + spec.timeout
    wl = WORKLOADS[spec.workload]
    rows = spec.resolved_rows()
    params = Params(rows=rows, keys=wl.keys(rows))
    notes: list[str] = []
    result: dict[str, Any] = {
        "workload": spec.workload, "workload_title": wl.title, "workload_shape": wl.shape,
        "provider": spec.provider, "status": "running", "rows_per_batch": rows, "keys": params.keys,
        "batches_requested": spec.resolved_batches(), "warmup_batches": spec.resolved_warmup(),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "timeout_s": spec.timeout, "env": environment(), "notes": notes, "batches": [],
    }
    sampler = RssSampler()
    spark = None
    checkpoint = run_dir / "checkpoint"
    try:
        confs = session_confs(spec, params, notes)
        result["confs"] = confs
        _write_json(out, result)
        spark = build_session(spec, confs, run_dir)
        result["env"]["java"] = spark.sparkContext._jvm.System.getProperty("java.version")
        result["session_start_s"] = round(time.monotonic() - started, 2)
        first_measured = spec.resolved_warmup()
        if wl.seed_rows is not None:
            seed_rows = wl.seed_rows(params)
            result["seed_rows"] = seed_rows
            _drive(spark, spec, params, seed_rows, checkpoint, None, 0, deadline, result, out,
                   sampler, "seed")
            first_measured = 1 + spec.resolved_warmup()
        if result["status"] == "running":
            _drive(spark, spec, params, rows, checkpoint, first_measured,
                   first_measured + spec.resolved_batches() - 1, deadline, result, out, sampler, "measure")
        if result["status"] == "running":
            result["status"] = "ok"
    except BaseException as exc:  # noqa: BLE001 - everything goes into the result
        result["status"] = "failed"
        result["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        result["traceback"] = traceback.format_exc()[-8000:]
    finally:
        try:
            _attribute_checkpoint_bytes(result, checkpoint / "state")
        except Exception as exc:  # noqa: BLE001
            notes.append(f"checkpoint bytes not attributed: {exc}")
        result["summary"] = summarize(result)
        result["wall_s"] = round(time.monotonic() - started, 2)
        _write_json(out, result)
        if spark is not None:
            try:
                spark.stop()
            except Exception:  # noqa: BLE001
                pass
    return result


# ---------------------------------------------------------------------------------------------
# Subprocess runner (the parent)
# ---------------------------------------------------------------------------------------------
def run_pair(spec: RunSpec, work_dir: Path = WORK_DIR) -> dict:
    """Run one (workload, provider) pair in a fresh subprocess and JVM; return its metrics."""
    if spec.workload not in WORKLOADS:
        raise ValueError(f"unknown workload {spec.workload!r} ({', '.join(WORKLOADS)})")
    if spec.provider not in PROVIDERS:
        raise ValueError(f"unknown provider {spec.provider!r} ({', '.join(PROVIDERS)})")
    runs, logs = work_dir / "runs", work_dir / "logs"
    runs.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    # Checkpoint + Spark/Java scratch of this run. Kept short and under the system temp dir:
    # keyedstate puts a Unix socket below java.io.tmpdir, and AF_UNIX paths are limited to 108 bytes.
    run_dir = Path(tempfile.mkdtemp(prefix=f"ksb-{spec.workload}-{spec.provider}-"))
    out = runs / f"{spec.slug()}.json"
    out.unlink(missing_ok=True)
    log_path = logs / f"{spec.slug()}.log"
    cmd = [sys.executable, "-m", "benchmarks.run_one", "--workload", spec.workload,
           "--provider", spec.provider, "--batches", str(spec.resolved_batches()),
           "--near-cache", spec.near_cache, "--timeout", str(spec.timeout),
           "--out", str(out), "--run-dir", str(run_dir)]
    if spec.rows:
        cmd += ["--rows", str(spec.rows)]
    if spec.warmup is not None:
        cmd += ["--warmup", str(spec.warmup)]
    for item in spec.confs:
        cmd += ["--conf", item]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               TMPDIR=str(run_dir / "tmp"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_DIR), env.get("PYTHONPATH")]))
    (run_dir / "tmp").mkdir(exist_ok=True)
    busy_before = idle_check()
    waited_until = time.monotonic() + spec.wait_idle
    while busy_before > 0.10 and time.monotonic() < waited_until:
        time.sleep(4)
        busy_before = idle_check(2.0)
    status = None
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=REPO_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=spec.timeout + 60)  # the child stops itself at spec.timeout
        except subprocess.TimeoutExpired:
            status = "killed"
        finally:
            # The child's process group holds its JVM, state servers and Python workers.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    try:
        result = json.loads(out.read_text())
    except (OSError, ValueError):
        result = {"workload": spec.workload, "provider": spec.provider, "batches": [],
                  "status": "failed", "error": f"no result written (exit code {proc.returncode})",
                  "rows_per_batch": spec.resolved_rows(), "notes": []}
        result["summary"] = summarize(result)
    if status or result.get("status") == "running":
        result["status"] = "timeout" if status == "killed" else "failed"
        result.setdefault("error", f"child exited with {proc.returncode} before finishing; see {log_path}")
        result["summary"] = summarize(result)
    result["exit_code"] = proc.returncode
    result["busy_cpu_share_before"] = round(busy_before, 3)
    if busy_before > 0.10:
        result.setdefault("notes", []).append(
            f"machine was {busy_before:.0%} busy just before the run started")
    result["run_dir"] = str(run_dir)
    result["log"] = str(log_path.relative_to(REPO_DIR)) if log_path.is_relative_to(REPO_DIR) else str(log_path)
    _write_json(out, result)
    if not spec.keep_checkpoint:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result
