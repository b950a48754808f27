"""Every keyedstate knob, parsed and validated in one place.

All knobs are Spark SQL confs under ``spark.sql.streaming.stateStore.keyedstate.`` so that Spark
ships them to executors inside ``StateStoreConf.sqlConfs``. The JVM shim checks them on the driver
when a stateful query plans its first batch (:func:`check_main`, one Python process per distinct
set of confs), so a wrong value fails the query before any task runs with a message naming the key
and the allowed values; the state server validates them here again when a store is opened.
``conf/REFERENCE.md`` is generated from :data:`KNOBS` (``keyedstate conf-reference``) and a
test checks that the two cannot drift.
"""
from __future__ import annotations

import difflib
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .version import __version__

PREFIX = "spark.sql.streaming.stateStore.keyedstate."


class ConfError(ValueError):
    """A keyedstate conf has a value we cannot accept. ``key`` and ``value`` name the conf when the
    value alone is at fault (the driver then raises Spark's ``INVALID_CONF_VALUE``)."""

    def __init__(self, message: str, key: str | None = None, value: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.value = value


def _parse_int(lo: int, hi: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(f"an integer in [{lo}, {hi}]") from None
        if not lo <= value <= hi:
            raise ValueError(f"an integer in [{lo}, {hi}]")
        return value

    parse.allowed = f"an integer in [{lo}, {hi}]"  # type: ignore[attr-defined]
    return parse


_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
               "g": 1 << 30, "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40}


def parse_bytes(raw: str) -> int:
    """Parse a byte size the way Spark writes them: ``512m``, ``2g``, ``1048576``."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", raw)
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError("a byte size such as 64m, 1g or 1048576")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]


parse_bytes.allowed = "a byte size such as 64m, 1g or 1048576"  # type: ignore[attr-defined]


def _parse_bytes_within(lo: str, hi: str) -> Callable[[str], int]:
    """A byte size in [lo, hi], for a size the JVM holds as an ``Int`` (below 2g)."""
    allowed = f"a byte size from {lo} to {hi}, such as 4m"
    low, high = parse_bytes(lo), parse_bytes(hi)

    def parse(raw: str) -> int:
        try:
            value = parse_bytes(raw)
        except ValueError:
            raise ValueError(allowed) from None
        if not low <= value <= high:
            raise ValueError(allowed)
        return value

    parse.allowed = allowed  # type: ignore[attr-defined]
    return parse

_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_duration(raw: str) -> float:
    """A duration in seconds, in Spark's time-string format with a unit: ``500ms``, ``30s``,
    ``15m``, ``24h``, ``7d`` (the JVM reads the bridge's durations with Spark's own parser,
    ``JavaUtils.timeStringAsMs``; a test holds the two to the same values)."""
    match = re.fullmatch(r"\s*(\d+)\s*(us|ms|s|m|min|h|d)\s*", raw.lower())
    if not match:
        raise ValueError("a duration such as 500ms, 30s, 15m, 24h or 7d")
    return int(match.group(1)) * _DURATION_UNITS[match.group(2)]


parse_duration.allowed = "a duration such as 500ms, 30s, 15m, 24h or 7d"  # type: ignore[attr-defined]


def _parse_positive_duration(raw: str) -> float:
    """A duration of at least 1 ms (the JVM reads it in whole ms and needs it positive)."""
    try:
        value = parse_duration(raw)
    except ValueError:
        value = 0
    if value < 1e-3:
        raise ValueError(_parse_positive_duration.allowed)  # type: ignore[attr-defined]
    return value


_parse_positive_duration.allowed = "a duration of at least 1ms such as 500ms, 30s or 15m"  # type: ignore[attr-defined]


def parse_cache_bytes(raw: str) -> int:
    """``auto`` (-1: 30% of the JVM's max heap) or a byte size."""
    if raw.strip().lower() == "auto":
        return -1
    try:
        return parse_bytes(raw)
    except ValueError:
        raise ValueError("'auto' or a byte size such as 512m or 2g") from None


parse_cache_bytes.allowed = "'auto' or a byte size such as 512m or 2g"  # type: ignore[attr-defined]


def parse_budget(raw: str) -> int:
    """``off`` (0: no executor-wide bound) or a byte size of at least 16m."""
    if raw.strip().lower() == "off":
        return 0
    try:
        value = parse_bytes(raw)
    except ValueError:
        raise ValueError(parse_budget.allowed) from None
    if value < 16 << 20:
        raise ValueError(parse_budget.allowed)
    return value


parse_budget.allowed = "'off' or a byte size of at least 16m, such as 512m or 2g"  # type: ignore[attr-defined]

BUDGET_SHARES = {"nearCacheBytes": 0.5, "nativeBlockCacheBytes": 0.1}
"""With a memoryBudget: the JVM near cache (with its Bloom filters) and the native block cache
get these shares unless set explicitly; the state servers' RocksDB gets the rest."""


def parse_ttl(raw: str) -> float:
    """A time to live in seconds; 0 turns TTL off."""
    if raw.strip() == "0":
        return 0.0
    try:
        return parse_duration(raw)
    except ValueError:
        raise ValueError(parse_ttl.allowed) from None


parse_ttl.allowed = "0 (off) or a positive duration such as 30s, 15m, 24h or 7d"  # type: ignore[attr-defined]


def _parse_choice(*choices: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip()
        if value not in choices:
            raise ValueError(parse.allowed)  # type: ignore[attr-defined]
        return value

    parse.allowed = " or ".join(choices)  # type: ignore[attr-defined]
    return parse


def parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ValueError("true or false")
    return value == "true"


parse_bool.allowed = "true or false"  # type: ignore[attr-defined]


def parse_fraction(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("a number in (0, 0.5]") from None
    if not 0 < value <= 0.5:
        raise ValueError("a number in (0, 0.5]")
    return value


parse_fraction.allowed = "a number in (0, 0.5]"  # type: ignore[attr-defined]


def _parse_str(raw: str) -> str:
    if not raw.strip():
        raise ValueError("a non-empty string")
    return raw.strip()


_parse_str.allowed = "a non-empty string"  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Knob:
    """One documented conf: its key suffix, default, parser and why it exists."""

    name: str
    default: str | None
    parse: Callable[[str], Any]
    doc: str
    jvm: bool = field(default=False)  # also read by the JVM shim before Python starts

    @property
    def key(self) -> str:
        return PREFIX + self.name

    @property
    def allowed(self) -> str:
        return getattr(self.parse, "allowed", "see the documentation")


KNOBS: tuple[Knob, ...] = (
    Knob("keyGroups", "201600", _parse_int(1, 1 << 30),
         "Number of key groups (Flink's max parallelism). Every stored key is prefixed with its "
         "key group, pmod(Spark's Murmur3 partition hash, keyGroups); state can later be "
         "redistributed to any partition count, and by whole key groups when the count divides "
         "this number. The default 201600 = 2^7*3^2*5^2*7 is divisible by every common "
         "partition count (1-10, 12, 16, 20, 32, 64, 100, 128, 200, ...). Fixed for the life "
         "of a checkpoint."),
    Knob("snapshotInterval", "10", _parse_int(1, 1_000_000),
         "Create an incremental RocksDB snapshot every this many committed versions. Loading a "
         "version replays at most this many changelogs on top of the nearest snapshot."),
    Knob("snapshotBulkKeys", "1000000", _parse_int(0, 1 << 62),
         "A version that adds at least this many keys (net), at least as many as the state held "
         "before it (a first batch over a backlog, a catch-up that brings new keys), is "
         "snapshotted and uploaded at once instead of at the next snapshotInterval, so that a "
         "restart does not replay it. 0 = only every snapshotInterval."),
    Knob("scanChunkBytes", "4m", _parse_bytes_within("4k", "256m"),
         "Bytes of entries shipped from the Python state server per iterator/prefix-scan chunk."),
    Knob("nearCacheBytes", "auto", parse_cache_bytes,
         "Memory of the JVM near cache, shared by every store of an executor: committed values "
         "of recently used keys, so that per-row reads do not cross to Python. While a "
         "partition's whole state fits, every read is local. A store whose reads find almost "
         "nothing (under 1% of them, as in a dedup) stops caching the keys it writes until "
         "reads find keys again (5%). 'auto' = 30% of the JVM's max "
         "heap. The stores of one query share one value; the last store opened sets it."),
    Knob("nearCacheWarmKeys", "262144", _parse_int(0, 1 << 62),
         "A version loaded with at most this many keys (per partition) is scanned into the near "
         "cache at once (~1.2 us a key: 0.3 s at the default), so that the next batch reads "
         "locally. A larger one starts cold: a miss is a point read (5-20 us), and the version "
         "is scanned in once its misses have cost about what the scan would (timed, against the "
         "scan's cost a key as last measured), or at the next batch's first miss once one "
         "batch's misses cost a tenth of what is left of the scan (ten more such batches would "
         "cost more than the scan). So a batch that touches a few keys of a large state, as "
         "after a restart or a rescale, never pays for all of it, and a query that keeps "
         "reading widely is scanned in at its second or third batch."),
    Knob("bloomFpp", "0.01", parse_fraction,
         "False-positive rate of the per-store Bloom filter that answers 'absent' without a "
         "round trip once a store's state no longer fits the near cache (or it caches no "
         "writes). A filter that outgrows its size adds a stage twice as large at half the "
         "rate, so all its stages together stay under twice this rate; keys enter by their "
         "32-bit hash, which adds n / 2^32 for n keys in a store (0.02% at 1M)."),
    Knob("writeBehind", "true", parse_bool,
         "Return from commit once the changelog is durable in the checkpoint and queued for "
         "RocksDB, instead of waiting for RocksDB to apply it; the changelog is shipped while its "
         "file is written and applied once the file is durable. Later reads wait for it."),
    Knob("changelogSync", "false", parse_bool,
         "'true': a commit hsyncs its changelog before it reports the version, so on HDFS the "
         "bytes are on every DataNode's disk (a power loss of every replica at once cannot lose "
         "it), at one more NameNode request (fsync) per changelog. 'false': the file is closed "
         "as Spark writes its own checkpoint files (its offset and commit logs, its providers' "
         "state): on every DataNode of the pipeline, on disk once their writes reach it. No "
         "effect on object stores, which have no hsync, nor on Hadoop's local file system."),
    Knob("nativeReads", "true", parse_bool,
         "Serve near-cache misses and scans in the JVM by reading the Python server's RocksDB "
         "files as a RocksDB secondary instance (Spark's bundled rocksdbjni), instead of a round "
         "trip per read. Python remains the only writer. Falls back to round trips, with a "
         "warning, if the files cannot be opened."),
    Knob("nativeBlockCacheBytes", "64m", parse_bytes,
         "Block cache (off-heap, shared by every store of an executor) of the native reads: "
         "decompressed RocksDB blocks the JVM read from the state server's files."),
    Knob("nativeOverlayBytes", "16m", parse_bytes,
         "Writes committed since the native reader last caught up with the state server, kept "
         "in the JVM per store (counted in the near cache's memory) so that near-cache misses "
         "read them there: the reader then catches up, and the server flushes its memtable for "
         "it, only once they outgrow this size or a scan needs it, instead of once per version "
         "(each flush adds a RocksDB file, and every few files a compaction). 0 = catch up at "
         "every version read natively."),
    Knob("memoryBudget", "off", parse_budget,
         "Memory of keyedstate per executor, all included: the near cache with its per-entry "
         "overhead and its Bloom filters (50% unless nearCacheBytes is set), the native block "
         "cache (10% unless nativeBlockCacheBytes is set) and the state servers' RocksDB -- "
         "block cache, index and filter blocks, memtables -- in one shared cache per server "
         "process (the rest, split evenly over the processes). Like Spark's "
         "boundedMemoryUsage/maxMemoryUsageMB for its RocksDB provider. Reported as the "
         "keyedstateMemoryBytes metric. 'off': each part is sized by its own conf."),
    Knob("serverProcesses", "0", _parse_int(0, 256),
         "Python state server processes per executor JVM (partitions are spread over them; "
         "Python's GIL serialises one process). 0 = spark.executor.cores, or the number of "
         "cores in local mode.", jvm=True),
    Knob("pythonExec", None, _parse_str,
         "Python executable that runs the state server when neither spark.pyspark.python nor "
         "PYSPARK_PYTHON is set (those come first, so the server runs on the same Python as "
         "the query's workers). keyedstate.configure() sets it to the driver's interpreter; "
         "last resort: python3.", jvm=True),
    Knob("localDir", None, _parse_str,
         "Local working directory of the state server (RocksDB instances, staged snapshot "
         "files). Default: a fresh directory under java.io.tmpdir, removed at JVM exit.",
         jvm=True),
    Knob("serverStartupTimeout", "60s", parse_duration,
         "How long the JVM waits for the Python state server to start and say it is ready.", jvm=True),
    Knob("bridgeTimeout", "10m", parse_duration,
         "Longest a single call to the Python state server may take before the task fails.",
         jvm=True),
    Knob("bridgeIdleTimeout", "30s", _parse_positive_duration,
         "A control connection from the JVM to a state server that stays unused for this long "
         "is closed (after one to two times this; the next call opens a new one).", jvm=True),
    Knob("ttl", "0", parse_ttl,
         "Time to live of every state entry of every stateful operator of the query (Flink's "
         "StateTtlConfig): an entry not written (see ttl.updateType) for this long expires. "
         "Time is processing time: the micro-batch's timestamp from the offset log, so a "
         "re-executed batch sees the same time. 0 = off. Per-operator overrides: "
         f"`{PREFIX}ttl.<operatorId>` and `{PREFIX}ttl.<operatorId>.<storeName>` (operator ids "
         "and store names as in the state-metadata source; 0 turns TTL off for that operator). "
         "Entries written while TTL was off never expire until written again."),
    Knob("ttl.updateType", "OnCreateAndWrite", _parse_choice("OnCreateAndWrite", "OnReadAndWrite"),
         "What refreshes an entry's TTL: writes only, or also point reads (get). Iterators and "
         "scans never refresh it (Spark's operators scan all state for watermarks and timeouts)."),
    Knob("ttl.visibility", "NeverReturnExpired",
         _parse_choice("NeverReturnExpired", "ReturnExpiredIfNotCleanedUp"),
         "Whether an expired entry that cleanup has not removed yet is still returned."),
    Knob("ttl.cleanupInterval", "10", _parse_int(0, 1_000_000),
         "Incremental cleanup: every this many versions, after applying the version in the "
         "background, the state server walks the next ttl.cleanupKeysPerScan entries and the "
         "next commit deletes the expired ones through its changelog (so numRowsTotal and the "
         "checkpoint shrink). Aligned with snapshotInterval, the scan shares the snapshot's "
         "memtable flush. 0 = no cleanup (expired entries stay invisible)."),
    Knob("ttl.cleanupKeysPerScan", "1000000", _parse_int(1, 1 << 30),
         "Entries one cleanup scan examines (a cursor walks the whole store over successive "
         "scans; ~1 us per entry, off the task's critical path)."),
)

TTL_OVERRIDE = re.compile(r"ttl\.(\d+)(?:\.([A-Za-z0-9_-]+))?")
"""``ttl.<operatorId>`` or ``ttl.<operatorId>.<storeName>``: a per-operator TTL."""

BY_NAME: dict[str, Knob] = {knob.name: knob for knob in KNOBS}


def parse(confs: Mapping[str, str]) -> dict[str, Any]:
    """Validate keyedstate confs (full keys) and return every knob's typed value by name, plus
    ``ttlOverrides``: ``{"<operatorId>[.<storeName>]": seconds}``.

    Unknown keys under the prefix are errors, so a typo cannot silently fall back to a default.
    """
    values: dict[str, Any] = {}
    overrides: dict[str, float] = {}
    for key, raw in confs.items():
        if not key.startswith(PREFIX):
            continue
        name = key[len(PREFIX):]
        knob = BY_NAME.get(name)
        if knob is None and TTL_OVERRIDE.fullmatch(name):
            try:
                overrides[name[len("ttl."):]] = parse_ttl(str(raw))
            except ValueError as exc:
                raise ConfError(f"Invalid value '{raw}' for conf '{key}': expected {exc}", key, str(raw)) from None
            continue
        if knob is None:
            raise ConfError(f"Unknown keyedstate conf '{key}'{_nearest(name)}")
        try:
            values[name] = knob.parse(str(raw))
        except ValueError as exc:
            raise ConfError(f"Invalid value '{raw}' for conf '{key}': expected {exc}", key, str(raw)) from None
    explicit = set(values)
    for knob in KNOBS:
        if knob.name not in values:
            values[knob.name] = None if knob.default is None else knob.parse(knob.default)
    values["ttlOverrides"] = overrides
    values["serverMemoryBytes"] = _split_budget(values, explicit)
    return values


def check_main() -> None:
    """The driver's check (``KeyedStateProvider.supportedCustomMetrics``): reads the query's
    keyedstate confs as a JSON object on stdin and prints ``{"error": <message or null>,
    "version": <keyedstate's>, "conf": <key>, "value": <value>}``, the last two when one conf's
    value alone is refused (the JVM uses no answer of another version than its jar's)."""
    confs = json.load(sys.stdin)
    answer: dict[str, Any] = {"error": None, "version": __version__}
    try:
        parse(confs)
    except ConfError as exc:
        answer["error"] = str(exc)
        if exc.key is not None:
            answer.update(conf=exc.key, value=exc.value)
    print(json.dumps(answer), flush=True)


def _nearest(name: str) -> str:
    """What to say after an unknown knob's name: the nearest knob (``did you mean``), and for a
    ``ttl.`` key the per-operator form; else where the knobs are listed."""
    per_operator = f"{PREFIX}ttl.<operatorId> or {PREFIX}ttl.<operatorId>.<storeName>"
    names = [knob.name for knob in KNOBS if not name.startswith("ttl.") or knob.name.startswith("ttl.")]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f"; did you mean '{PREFIX}{close[0]}'?" if close else ""
    if name.startswith("ttl."):
        return hint + f" (per-operator TTL: {per_operator})"
    return hint or f"; the knobs are listed in conf/REFERENCE.md (per-operator TTL: {per_operator})"


def _split_budget(values: dict[str, Any], explicit: set[str]) -> int:
    """Derive the parts of ``memoryBudget`` not set explicitly (in place); returns the state
    servers' share (0: unbounded)."""
    budget = values["memoryBudget"]
    if not budget:
        return 0
    for name, share in BUDGET_SHARES.items():
        if name not in explicit or values[name] < 0:  # 'auto' means: by the budget
            values[name] = int(budget * share)
    rest = budget - values["nearCacheBytes"] - values["nativeBlockCacheBytes"]
    if rest < budget // 10:
        raise ConfError(f"{PREFIX}nearCacheBytes ({values['nearCacheBytes']}) and {PREFIX}nativeBlockCacheBytes "
                        f"({values['nativeBlockCacheBytes']}) leave less than 10% of {PREFIX}memoryBudget "
                        f"({budget}) to the state servers")
    return rest


def reference_markdown() -> str:
    """The conf reference shipped as ``conf/REFERENCE.md``."""
    lines = [
        "# keyedstate configuration reference",
        "",
        "<!-- Generated by `keyedstate conf-reference` from provider/conf.py; do not edit. -->",
        "",
        "Set these like any Spark SQL conf: `--conf key=value` on spark-submit, "
        "`SparkSession.builder.config(key, value)`, or `spark-defaults.conf`. They reach every "
        "executor through Spark's StateStoreConf. An unknown key under the prefix or a "
        "malformed value fails the query at its start, before any task runs, with a message "
        "naming the key.",
        "",
        "| conf | default | allowed values | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for knob in KNOBS:
        default = "(unset)" if knob.default is None else f"`{knob.default}`"
        lines.append(f"| `{knob.key}` | {default} | {knob.allowed} | {knob.doc} |")
    lines.append(f"| `{PREFIX}ttl.<operatorId>[.<storeName>]` | (unset) | {parse_ttl.allowed} | "
                 "TTL of one stateful operator (or one of its stores), overriding `ttl`. An "
                 "operator id the query does not have fails the query at start. |")
    lines += [
        "",
        "Spark's own confs that keyedstate honours: `spark.sql.streaming.minBatchesToRetain` "
        "(versions kept by cleanup), `spark.sql.streaming.stateStore.maintenanceInterval` "
        "(how often snapshots are uploaded and old files deleted), "
        "`spark.sql.streaming.stateStore.providerClass` (enables keyedstate).",
        "",
    ]
    return "\n".join(lines)
