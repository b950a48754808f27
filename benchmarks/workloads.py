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
  query stopped, each inode once (a hard link is not a second write). Files are written once and
  renamed into place, so this is the bytes the provider wrote (and kept) for that batch:
  changelogs/deltas as stored (compressed or not), snapshot files and SSTs, ``.crc`` side files,
  and whatever maintenance uploaded while the batch ran. Maintenance (snapshot uploads, for every
  provider but ``rocksdb``) runs every ``maintenanceInterval``: the session sets it to 1 s (Spark's
  default, 60 s, is longer than most runs, so no snapshot would ever be counted). Nothing is
  deleted during a run (``minBatchesToRetain`` defaults to 100). On hdfs:// the same, listed
  through Hadoop's FileSystem; on s3a:// the PUT bodies under ``state/`` the proxy forwarded in the
  window (benchmarks/storage.py, which also counts the requests per batch).
* peak RSS: ``VmHWM`` from ``/proc/<pid>/status`` of the JVM (the ``java`` child of the runner)
  and the sum over every ``keyedstate.server`` process below it; sampled every second and once
  more just before the query stops (a pid's VmHWM only grows, so the last sample is its peak).
"""
from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from .fmt import CONTENDED_SHARE

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
    # Changelogs hsynced before the commit reports them (on HDFS: one NameNode fsync per
    # changelog more than Spark's providers ask); run only when named.
    "keyedstate_sync": {KS_PREFIX + "changelogSync": "true"},
}
ON_REQUEST_PROVIDERS = ("keyedstate_sync",)
"""Providers a run includes only when ``--providers`` names them."""
TTL_WORKLOADS = ("W1", "W2")
"""Workloads that run keyedstate_ttl by default (the TTL issue's W1/W2 overhead target)."""


def is_keyedstate(provider: str) -> bool:
    return provider.startswith("keyedstate")


BUILTIN_PROVIDERS = tuple(PROVIDERS)
PROVIDER_PYTHON: dict[str, str] = {}
"""Providers whose runs use another Python interpreter (``--provider-python NAME=PYTHON``)."""


def base_provider(name: str) -> str | None:
    """The built-in provider an alias runs: the longest one that ``name`` is or starts with + '_'."""
    for p in sorted(BUILTIN_PROVIDERS, key=len, reverse=True):
        if name == p or name.startswith(p + "_"):
            return p
    return None


def register_provider_python(item: str) -> str:
    """``NAME=PYTHON``: run provider NAME with interpreter PYTHON (its child process, its PySpark
    workers and, for keyedstate, its state servers and the jar built from *that* interpreter's
    ``keyedstate`` sources). NAME is a built-in provider or ``<built-in>_<suffix>`` (an alias
    with the built-in's confs, e.g. ``keyedstate_before``). Returns NAME."""
    name, sep, python = item.partition("=")
    name, python = name.strip(), python.strip()
    if not sep or not name or not python:
        raise ValueError(f"--provider-python {item!r}: expected NAME=PYTHON")
    base = base_provider(name)
    if base is None or not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise ValueError(f"--provider-python {item!r}: NAME must be one of {', '.join(BUILTIN_PROVIDERS)} "
                         "or start with one of them followed by '_' (e.g. keyedstate_before)")
    path = shutil.which(python)
    if path is None:
        raise ValueError(f"--provider-python {item!r}: {python} is not an executable")
    PROVIDER_PYTHON[name] = os.path.abspath(python) if os.path.exists(python) else path
    PROVIDERS.setdefault(name, dict(PROVIDERS[base]))
    return name


def conf_targets(provider: str) -> set[str]:
    """``--conf TARGET:key=value`` prefixes that apply to ``provider``: its own name, and for an
    alias also its base (``keyedstate:...`` reaches ``keyedstate_before`` too)."""
    base = base_provider(provider)
    return {provider} | ({base} if provider in PROVIDER_PYTHON and base else set())

# Same for every provider and workload.
BASE_CONFS: dict[str, str] = {
    "spark.master": "local[2]",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.driver.memory": "6g",
    "spark.ui.showConsoleProgress": "false",
    # Snapshot uploads (hdfs, rocksdb_changelog, keyedstate) and cleanup happen in Spark's
    # maintenance task. Its default period, 60 s, is longer than most runs: no snapshot would
    # ever be uploaded (or counted in ckpt/batch) during the measured batches. 1 s uploads each
    # provider's snapshots (every 10 versions for all three) within about a second of their
    # creation, as a long-running query pays for them.
    "spark.sql.streaming.stateStore.maintenanceInterval": "1s",
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
    restart: bool = False  # after the measured batches, restart the query in a fresh JVM (recovery)


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
             1_000_000, keys=lambda rows: rows, build=_aggregation, no_data_batches=False, batches=10,
             restart=True),
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
             seed_rows=lambda p: p.keys, near_cache_default=True, restart=True),
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


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 on: state, ppid, ...),
    or None for a process that is gone."""
    try:
        stat = Path("/proc", str(pid), "stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time a process has used."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


class RssSampler:
    """Peak RSS (VmHWM) of the JVM, the keyedstate state servers and the PySpark workers."""

    def __init__(self) -> None:
        self.peaks: dict[str, dict[int, int]] = {"jvm": {}, "state_servers": {}, "python_workers": {}}
        # CPU seconds (user + system) each process had used at its last sample: what a change
        # to one side's work saves, which batch times on a shared 2-core machine blur.
        self.cpu: dict[str, dict[int, float]] = {"jvm": {}, "state_servers": {}, "python_workers": {}}

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
            cpu = _cpu_seconds(pid)
            if cpu is not None:
                self.cpu[kind][pid] = max(cpu, self.cpu[kind].get(pid, 0.0))

    def cpu_totals(self) -> dict[str, float]:
        """CPU seconds used so far by the JVM and by the state servers together."""
        return {"jvm": round(sum(self.cpu["jvm"].values()), 2),
                "state_servers": round(sum(self.cpu["state_servers"].values()), 2)}

    def summary(self) -> dict[str, Any]:
        cpu = self.cpu_totals()
        return {
            "rss_jvm_peak_bytes": max(self.peaks["jvm"].values(), default=None),
            "rss_state_servers_peak_bytes": sum(self.peaks["state_servers"].values()) or None,
            "state_server_processes": len(self.peaks["state_servers"]),
            # Forked workers share pages with the daemon, so this sum over-counts.
            "rss_python_workers_peak_bytes_sum": sum(self.peaks["python_workers"].values()) or None,
            # Up to the last sample (just before the query stops), not the processes' exit.
            "cpu_jvm_s": cpu["jvm"] or None,
            "cpu_state_servers_s": cpu["state_servers"] or None,
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
        f = _stat_fields(pid)
        if f is not None:
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


# A store partition's version files, by provider: hdfs <v>.delta / <v>.snapshot; RocksDB
# <v>.changelog / <v>.zip (checkpoint format v2 adds _<uuid>); keyedstate <v>.ks-changelog /
# <v>.ks-snapshot (the manifest; its SSTs live in ks-files/, Spark's in SSTs/).
_SNAPSHOT_FILE = re.compile(r"^(\d+)(?:_[0-9a-fA-F-]+)?\.(?:snapshot|zip|ks-snapshot)$")
_CHANGELOG_FILE = re.compile(r"^(\d+)(?:_[0-9a-fA-F-]+)?\.(?:delta|changelog|ks-changelog)$")


def file_inodes(path: Path) -> dict[tuple[int, int], tuple[os.stat_result, str]]:
    """(dev, inode) -> (its stat, relative path of the first name found) of every file below
    ``path``: each inode once (a hard link is not another write)."""
    out: dict[tuple[int, int], tuple[os.stat_result, str]] = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            try:
                st = os.stat(full)
            except OSError:
                continue
            out.setdefault((st.st_dev, st.st_ino), (st, os.path.relpath(full, path)))
    return out


def _state_files(path: Path) -> list[tuple[float, int, str]]:
    """(mtime, size, relative path) of every file below ``path``, each inode once."""
    return [(st.st_mtime, st.st_size, rel) for st, rel in file_inodes(path).values()]


def _dir_bytes(path: Path) -> int:
    """Bytes of the files below ``path``, each inode once (what the directory occupies)."""
    return sum(size for _, size, _ in _state_files(path))


def snapshot_version(name: str) -> int | None:
    """Version of a snapshot file (one per store partition and snapshot) from its base name."""
    m = _SNAPSHOT_FILE.match(os.path.basename(name))
    return int(m.group(1)) if m else None


def checkpoint_versions(state_dir: Path) -> dict[str, Any]:
    """What a load of the newest version needs, over every store partition under ``state_dir``:
    its newest snapshot and how many changelogs/deltas after it it replays (min/max over stores)."""
    return checkpoint_versions_of((root, name) for root, _, files in os.walk(state_dir) for name in files)


def checkpoint_versions_of(files) -> dict[str, Any]:
    """:func:`checkpoint_versions` of the files ``(directory, name)`` of a state dir (listed
    locally or through Hadoop's FileSystem)."""
    stores: dict[str, dict[str, set[int]]] = {}
    for root, name in files:
        for kind, pattern in (("snapshots", _SNAPSHOT_FILE), ("changelogs", _CHANGELOG_FILE)):
            m = pattern.match(name)
            if m:
                stores.setdefault(root, {"snapshots": set(), "changelogs": set()})[kind].add(int(m.group(1)))
    if not stores:
        return {"stores": 0}
    latest, newest_snapshot, replay = [], [], []
    for v in stores.values():
        last = max(v["snapshots"] | v["changelogs"])
        snap = max(v["snapshots"], default=0)
        latest.append(last)
        newest_snapshot.append(snap)
        replay.append(sum(1 for c in v["changelogs"] if snap < c <= last))
    return {"stores": len(stores), "latest_version": max(latest),
            "newest_snapshot_min": min(newest_snapshot), "newest_snapshot_max": max(newest_snapshot),
            "stores_without_snapshot": sum(1 for x in newest_snapshot if x == 0),
            "replay_min": min(replay), "replay_max": max(replay)}


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
            "platform": platform.platform(), "cpu_probe_s": cpu_probe_s()}


def cpu_probe_s(loops: int = 2_000_000) -> float:
    """Seconds a fixed pure-Python loop takes on one core (best of 3): the machine's speed at
    that moment, so that runs of one build at different times can be told apart from a change
    (a host can slow a virtual machine without any steal time showing)."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        total = 0
        for i in range(loops):
            total += i
        best = min(best, time.perf_counter() - started)
    return round(best, 4)


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
    restart: bool | None = None  # restart in a fresh JVM after the measured batches; None: the workload's default
    provider_python: list[str] = field(default_factory=list)  # every --provider-python NAME=PYTHON of the run
    invocation: str | None = None  # the `python3 -m benchmarks` (pytest) run this pair belongs to
    storage: str = "local"  # local | hdfs | s3a (benchmarks/storage.py)
    checkpoint: str | None = None  # the checkpoint's URI on hdfs/s3a; local: <run dir>/checkpoint

    def resolved_restart(self) -> bool:
        return WORKLOADS[self.workload].restart if self.restart is None else self.restart

    def python(self) -> str:
        """The interpreter of this pair's child process (and its workers and state servers)."""
        return PROVIDER_PYTHON.get(self.provider, sys.executable)

    def resolved_warmup(self) -> int:
        return WORKLOADS[self.workload].warmup if self.warmup is None else self.warmup

    def resolved_batches(self) -> int:
        return WORKLOADS[self.workload].batches if self.batches is None else self.batches

    def resolved_rows(self) -> int:
        return self.rows or WORKLOADS[self.workload].default_rows

    def slug(self) -> str:
        return f"{self.workload}__{self.provider}" + ("" if self.storage == "local" else f"__{self.storage}")

    def checkpoint_in(self, run_dir: Path) -> Path | str:
        return self.checkpoint or run_dir / "checkpoint"


def parse_conf_args(items: list[str], provider: str) -> dict[str, str]:
    """``provider:key=value`` (or ``all:key=value`` / ``key=value``) -> confs for ``provider``."""
    out = {}
    for item in items:
        target, sep, rest = item.partition(":")
        if not sep or "=" in target:  # no provider prefix: applies to all
            target, rest = "all", item
        if target not in ("all", "*") and target not in conf_targets(provider):
            if target not in PROVIDERS:
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


def _drive(spark, spec: RunSpec, params: Params, source_rows: int, checkpoint: Path | str,
           first_measured: int | None, last_batch: int, deadline: float, result: dict,
           save: Callable[[], None], sampler: RssSampler, phase: str) -> None:
    """Run one query until batch ``last_batch`` completed, recording batches, peak RSS, notes and
    contention into ``result`` (``save()`` persists it after every batch)."""
    wl = WORKLOADS[spec.workload]
    df, mode = wl.build(spark, source_rows, params)
    # a remote state dir is listed once after the run: a listing per batch would be requests in
    # the batch's count
    state_dir = None if _remote(checkpoint) else checkpoint / "state"
    writer = (df.writeStream.format("noop").outputMode(mode)
              .option("checkpointLocation", str(checkpoint)).queryName(f"{spec.slug()}_{phase}"))
    if phase == "seed":
        # exactly one batch: stopping a free-running query would leave the next (seed-sized)
        # batch in the offset log, to be replayed after the restart
        writer = writer.trigger(availableNow=True)
    result.setdefault("query_start_epoch", {})[phase] = time.time()
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
                rec["phase"] = phase if phase != "measure" else (
                    "warmup" if p["batchId"] < first_measured else "measured")
                rec["state_dir_bytes"] = _dir_bytes(state_dir) if state_dir is not None else None
                sampler.sample()
                rec["cpu_s"] = sampler.cpu_totals()  # when the batch's progress was seen
                result["batches"].append(rec)
                seen.add(p["batchId"])
                new = True
            if new:
                result["batches"].sort(key=lambda b: b["batchId"])
                save()
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
        if share > CONTENDED_SHARE:
            result["notes"].append(f"other processes used {share:.0%} of the CPUs during the {phase} "
                                   "phase: timings are contended")
        try:
            query.stop()
        except Exception as exc:  # noqa: BLE001 - recorded, not fatal
            result.setdefault("notes", []).append(f"query.stop() failed: {exc}")


def _remote(checkpoint: Path | str) -> bool:
    return isinstance(checkpoint, str) and "://" in checkpoint


def _listed_state(spark, checkpoint: Path | str) -> tuple[list[tuple[float, int, str]] | None, dict | None]:
    """The files of the checkpoint's state dir, (mtime, size, relative path), and the load plan
    they give; (None, None) without a state dir. A remote one is listed through the session."""
    if not _remote(checkpoint):
        state_dir = checkpoint / "state"
        return (_state_files(state_dir), checkpoint_versions(state_dir)) if state_dir.exists() else (None, None)
    if spark is None:
        return None, None
    from .storage import remote_files
    files = remote_files(spark, f"{checkpoint}/state")
    plan = checkpoint_versions_of((os.path.dirname(rel), os.path.basename(rel)) for _, _, rel in files)
    return files or None, plan


def _attribute_checkpoint_bytes(result: dict, files: list[tuple[float, int, str]] | None,
                                versions: dict | None) -> None:
    batches = result["batches"]
    if not batches or files is None:
        return
    # Window of batch i: [start_i, start_i+1), the last one up to its end. A file renamed into
    # place while batch i commits has mtime <= its end; the progress timestamp has ms resolution,
    # so every boundary moves 1 ms earlier.
    bounds = [b["start_epoch"] - 0.001 for b in batches]
    bounds.append(batches[-1]["start_epoch"] + (batches[-1]["batch_ms"] or 0) / 1000 + 0.05)
    for i, b in enumerate(batches):
        lo, hi = bounds[i], bounds[i + 1]
        inside = [(size, rel) for mtime, size, rel in files if lo <= mtime < hi]
        b["ckpt_bytes_written"] = sum(size for size, _ in inside)
        b["ckpt_snapshot_versions"] = sorted(v for _, rel in inside if (v := snapshot_version(rel)) is not None)
    result["state_dir_bytes_final"] = sum(size for _, size, _ in files)
    result["checkpoint_versions"] = versions


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
        "ckpt_bytes_per_batch_mean": statistics.fmean(ckpt) if ckpt else None,
        "ckpt_bytes_measured_total": sum(ckpt) if ckpt else None,
        # snapshot files (one per store partition) uploaded during the measured batches
        "ckpt_snapshot_versions": sorted({v for b in measured for v in b.get("ckpt_snapshot_versions") or []}),
        "ckpt_snapshot_files": sum(len(b.get("ckpt_snapshot_versions") or []) for b in measured),
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
    checkpoint = spec.checkpoint_in(run_dir)
    result["storage"] = spec.storage
    if _remote(checkpoint):
        result["checkpoint"] = checkpoint

    def save() -> None:
        _write_json(out, result)

    try:
        confs = session_confs(spec, params, notes)
        result["confs"] = confs
        if spec.provider in PROVIDER_PYTHON:
            result["python"] = sys.executable
        save()
        spark = build_session(spec, confs, run_dir)
        result["env"]["java"] = spark.sparkContext._jvm.System.getProperty("java.version")
        result["session_start_s"] = round(time.monotonic() - started, 2)
        if is_keyedstate(spec.provider):
            result["keyedstate_build"] = keyedstate_build()
        first_measured = spec.resolved_warmup()
        if wl.seed_rows is not None:
            seed_rows = wl.seed_rows(params)
            result["seed_rows"] = seed_rows
            _drive(spark, spec, params, seed_rows, checkpoint, None, 0, deadline, result, save,
                   sampler, "seed")
            first_measured = 1 + spec.resolved_warmup()
        if result["status"] == "running":
            _drive(spark, spec, params, rows, checkpoint, first_measured,
                   first_measured + spec.resolved_batches() - 1, deadline, result, save, sampler, "measure")
        if result["status"] == "running":
            result["status"] = "ok"
    except BaseException as exc:  # noqa: BLE001 - everything goes into the result
        result["status"] = "failed"
        result["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        result["traceback"] = traceback.format_exc()[-8000:]
    finally:
        try:
            _attribute_checkpoint_bytes(result, *_listed_state(spark, checkpoint))
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


def keyedstate_build() -> dict[str, Any]:
    """Which keyedstate this interpreter runs: its source directory, that checkout's commit and
    the jar ``keyedstate.jar_path()`` built from it (cached, so cheap once the session is up)."""
    import keyedstate
    src = Path(keyedstate.__file__).resolve().parent
    out: dict[str, Any] = {"source": str(src), "commit": _git(src, "rev-parse", "--short", "HEAD")}
    # the jar is built from jvm_bridge/, the state server runs provider/
    if out["commit"] and _git(src, "status", "--porcelain", "--untracked-files=no", "--",
                              ":(top)provider", ":(top)jvm_bridge"):
        out["dirty"] = True
    try:
        out["jar"] = Path(keyedstate.jar_path()).name
    except Exception as exc:  # noqa: BLE001 - informational
        out["jar"] = f"? ({type(exc).__name__})"
    return out


def _git(path: Path, *cmd: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(path), *cmd], capture_output=True, text=True,
                              timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run_restart(spec: RunSpec, out: Path, run_dir: Path) -> dict:
    """Recovery as a user waits for it: a fresh JVM restarts the stopped query on the checkpoint
    the measured batches left; records the first batch (its ``triggerExecution`` includes the
    state load) and the time from ``start()`` to that batch's end. Adds ``restart`` to ``out``."""
    started = time.monotonic()
    deadline = started + spec.timeout
    result = json.loads(out.read_text())
    rec: dict[str, Any] = {"status": "running", "notes": [], "batches": [],
                           "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    result["restart"] = rec
    checkpoint = spec.checkpoint_in(run_dir)
    sampler = RssSampler()
    spark = None

    def save() -> None:
        _write_json(out, result)

    try:
        if _remote(checkpoint):  # listed through the session's Hadoop FileSystem
            spark = build_session(spec, result["confs"], run_dir)
            rec["session_start_s"] = round(time.monotonic() - started, 2)
            from .storage import remote_names
            names = remote_names(spark, f"{checkpoint}/commits")
            rec["load_plan"] = _listed_state(spark, checkpoint)[1]
        else:
            names = [p.name for p in (checkpoint / "commits").iterdir()]
            rec["load_plan"] = checkpoint_versions(checkpoint / "state")
        # the first batch after a restart is the one after the last committed batch (re-running
        # the one the stop interrupted, if its offsets were logged)
        first = max(int(n) for n in names if n.isdigit()) + 1
        save()
        if spark is None:
            spark = build_session(spec, result["confs"], run_dir)
            rec["session_start_s"] = round(time.monotonic() - started, 2)
        params = Params(rows=result["rows_per_batch"], keys=result["keys"])
        _drive(spark, spec, params, params.rows, checkpoint, None, first, deadline, rec, save,
               sampler, "restart")
        batch = next((b for b in rec["batches"] if b["batchId"] == first), None)
        if batch is not None:
            rec["first_batch_ms"] = batch["batch_ms"]
            # progress timestamps are the JVM's wall clock, like time.time() here
            rec["start_to_first_batch_s"] = round(
                batch["start_epoch"] + batch["batch_ms"] / 1000 - rec["query_start_epoch"]["restart"], 3)
        if rec["status"] == "running":
            rec["status"] = "ok" if batch is not None else "failed"
    except BaseException as exc:  # noqa: BLE001 - everything goes into the result
        rec["status"] = "failed"
        rec["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        rec["traceback"] = traceback.format_exc()[-8000:]
    finally:
        rec["wall_s"] = round(time.monotonic() - started, 2)
        save()
        if spark is not None:
            try:
                spark.stop()
            except Exception:  # noqa: BLE001
                pass
    return result


# ---------------------------------------------------------------------------------------------
# Subprocess runner (the parent)
# ---------------------------------------------------------------------------------------------
def wait_until_idle(seconds: float) -> float:
    """Share of the CPUs busy just before a run; first waits up to ``seconds`` for it to drop
    below the contention threshold."""
    busy = idle_check()
    until = time.monotonic() + seconds
    while busy > CONTENDED_SHARE and time.monotonic() < until:
        time.sleep(4)
        busy = idle_check(2.0)
    return busy


def child_env(python: str, run_dir: Path) -> dict[str, str]:
    """Environment of a benchmark child: ``python`` for the driver, the PySpark workers and
    keyedstate's state servers; this checkout's ``benchmarks`` on the path; scratch in ``run_dir``."""
    (run_dir / "tmp").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python, TMPDIR=str(run_dir / "tmp"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_DIR), env.get("PYTHONPATH")]))
    return env


def run_subprocess(cmd: list[str], env: dict[str, str], log_path: Path, timeout: float,
              append: bool = False) -> tuple[int, bool]:
    """Run ``cmd`` in its own process group with its output in ``log_path``; afterwards, or after
    ``timeout`` s, kill the whole group (JVM, state servers, Python workers).

    After a normal end the rest of the group (the JVM exits once the driver's Python is gone,
    running its shutdown hooks, e.g. keyedstate finishing staged snapshot uploads) gets up to
    ``LINGER_S`` to exit by itself, as it would for a user; how long it took is logged.
    Returns (exit code, whether it was killed at the timeout)."""
    killed = False
    with open(log_path, "a" if append else "w") as log:
        log.write(shlex.join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=REPO_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
            ended = time.monotonic()
            while _group_alive(proc.pid) and time.monotonic() - ended < LINGER_S:
                time.sleep(0.1)
            log.write(f"[harness] the process group exited {time.monotonic() - ended:.1f} s after the driver "
                      f"({'killed after ' + str(LINGER_S) + ' s' if _group_alive(proc.pid) else 'by itself'})\n")
        except subprocess.TimeoutExpired:
            killed = True
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return proc.returncode, killed


LINGER_S = 40


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def run_pair(spec: RunSpec, work_dir: Path = WORK_DIR, storage=None) -> dict:
    """Run one (workload, provider) pair in a fresh subprocess and JVM (then, if the workload
    restarts, its restart in another); return its metrics. With ``storage`` (a
    :class:`benchmarks.storage.BenchStorage`) the checkpoint is a fresh directory there and each
    batch gets that storage's request counts."""
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
    if storage is not None:
        spec = replace(spec, storage=storage.kind, checkpoint=storage.checkpoint_for(spec.slug()),
                       confs=[f"all:{k}={v}" for k, v in storage.confs().items()] + list(spec.confs))
    out = runs / f"{spec.slug()}.json"
    out.unlink(missing_ok=True)
    log_path = logs / f"{spec.slug()}.log"
    python = spec.python()
    cmd = [python, "-m", "benchmarks.run_one", "--workload", spec.workload,
           "--provider", spec.provider, "--batches", str(spec.resolved_batches()),
           "--near-cache", spec.near_cache, "--timeout", str(spec.timeout),
           "--out", str(out), "--run-dir", str(run_dir)]
    if spec.rows:
        cmd += ["--rows", str(spec.rows)]
    if spec.warmup is not None:
        cmd += ["--warmup", str(spec.warmup)]
    if spec.checkpoint:
        cmd += ["--storage", spec.storage, "--checkpoint", spec.checkpoint]
    for item in spec.confs:
        cmd += ["--conf", item]
    for item in spec.provider_python:
        cmd += ["--provider-python", item]
    env = child_env(python, run_dir)
    busy_before = wait_until_idle(spec.wait_idle)
    code, killed = run_subprocess(cmd, env, log_path, spec.timeout + 60)  # the child stops itself at spec.timeout
    try:
        result = json.loads(out.read_text())
    except (OSError, ValueError):
        result = {"workload": spec.workload, "provider": spec.provider, "batches": [],
                  "status": "failed", "error": f"no result written (exit code {code})",
                  "rows_per_batch": spec.resolved_rows(), "notes": []}
        result["summary"] = summarize(result)
    if killed or result.get("status") == "running":
        result["status"] = "timeout" if killed else "failed"
        result.setdefault("error", f"child exited with {code} before finishing; see {log_path}")
        result["summary"] = summarize(result)
    result["exit_code"] = code
    result["invocation"] = spec.invocation
    result["busy_cpu_share_before"] = round(busy_before, 3)
    if busy_before > CONTENDED_SHARE:
        result.setdefault("notes", []).append(
            f"machine was {busy_before:.0%} busy just before the run started")
    result["run_dir"] = str(run_dir)
    result["log"] = str(log_path.relative_to(REPO_DIR)) if log_path.is_relative_to(REPO_DIR) else str(log_path)
    _write_json(out, result)
    if spec.resolved_restart():
        if result["status"] == "ok":
            result = _restart_pair(spec, cmd, env, out, log_path, result)
        else:
            result["restart"] = {"status": "skipped", "notes": [f"the run ended {result['status']}"]}
            _write_json(out, result)
    if storage is not None:
        storage.attribute(result)
        _write_json(out, result)
    if not spec.keep_checkpoint:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def _restart_pair(spec: RunSpec, cmd: list[str], env: dict[str, str], out: Path, log_path: Path,
                  result: dict) -> dict:
    busy_before = wait_until_idle(spec.wait_idle)
    code, killed = run_subprocess(cmd + ["--restart"], env, log_path, spec.timeout + 60, append=True)
    try:
        result = json.loads(out.read_text())
    except (OSError, ValueError):
        pass
    rec = result.setdefault("restart", {"notes": []})
    if killed or rec.get("status") in (None, "running"):
        rec["status"] = "timeout" if killed else "failed"
        rec.setdefault("error", f"restart child exited with {code} before finishing; see {log_path}")
    rec["exit_code"] = code
    rec["busy_cpu_share_before"] = round(busy_before, 3)
    if busy_before > CONTENDED_SHARE:
        rec.setdefault("notes", []).append(f"machine was {busy_before:.0%} busy just before the restart")
    _write_json(out, result)
    return result
