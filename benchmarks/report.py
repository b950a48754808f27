"""Render benchmark results into ``benchmarks/RESULTS.md`` and ``benchmarks/plots/*.png``.

    python3 -m benchmarks.report [RESULTS ...] [--command "..."] [--out benchmarks/RESULTS.md]

Each RESULTS is a pytest-benchmark ``--benchmark-json`` file, a single run's JSON (as written to
``benchmarks/.work/runs/``) or a directory of those; default ``benchmarks/.work/results.json``.
When several results cover the same workload x provider, the one listed last wins. The rescale
comparison (``benchmarks/.work/rescale.json``) and extra measurement tables
(``benchmarks/.work/extra/*.json``, see ``benchmarks/extra.py``) are added when present.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from . import extra, rescale
from .fmt import (contended, fmt_bytes, fmt_load_plan, fmt_ms, fmt_rows, fmt_s, ratio, ratio_value, table,
                  target_text, verdict)
from .storage import OPS
from .workloads import (BASE_CONFS, BENCH_DIR, BUILTIN_PROVIDERS, PROVIDERS, WORK_DIR, WORKLOADS, _git,
                        base_provider)

COLORS = {"hdfs": "#4c72b0", "rocksdb": "#dd8452", "rocksdb_changelog": "#c44e52", "keyedstate": "#55a868",
          "keyedstate_ttl": "#8172b2"}
EXTRA_COLORS = ["#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd"]
BASELINE = "rocksdb_changelog"
"""Issue 14's reference: Spark's RocksDB provider with changelog checkpointing."""


def provider_order(names) -> list[str]:
    """Built-in providers in their usual order, each alias (``--provider-python``) after its base."""
    names = set(names)
    out = []
    for p in BUILTIN_PROVIDERS:
        if p in names:
            out.append(p)
        out += sorted(n for n in names if n not in BUILTIN_PROVIDERS and base_provider(n) == p)
    return out + sorted(names - set(out))


def color(provider: str) -> str:
    if provider in COLORS:
        return COLORS[provider]
    aliases = sorted(p for p in PROVIDERS if p not in COLORS)
    return EXTRA_COLORS[aliases.index(provider) % len(EXTRA_COLORS)] if provider in aliases else "grey"


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------
def _from_json(data, origin: str) -> list[dict]:
    if isinstance(data, dict) and "benchmarks" in data:  # pytest-benchmark
        out = []
        for bench in data["benchmarks"]:
            result = (bench.get("extra_info") or {}).get("result")
            if result:
                result = dict(result)
                result.setdefault("command", bench["extra_info"].get("command"))
                result["bench_wall_s"] = (bench.get("stats") or {}).get("max")
                out.append(result)
        return out
    if isinstance(data, dict) and "workload" in data and "provider" in data:
        return [data]
    if isinstance(data, list):
        return [r for item in data for r in _from_json(item, origin)]
    print(f"report: ignoring {origin}: not a benchmark result", file=sys.stderr)
    return []


def load(paths: list[str]) -> dict[tuple[str, str], dict]:
    results: dict[tuple[str, str], dict] = {}
    for raw in paths:
        path = Path(raw)
        files = sorted(path.rglob("*.json")) if path.is_dir() else [path]
        for file in files:
            try:
                data = json.loads(file.read_text())
            except (OSError, ValueError) as exc:
                print(f"report: cannot read {file}: {exc}", file=sys.stderr)
                continue
            for result in _from_json(data, str(file)):
                results[(result["workload"], result["provider"])] = result
    return results


# ---------------------------------------------------------------------------------------------
# Metrics of one run (None when not measured)
# ---------------------------------------------------------------------------------------------
def _summary(result) -> dict:
    return (result or {}).get("summary") or {}


def _median(result):
    return _summary(result).get("median_batch_ms")


def _commit_p50(result):
    return _summary(result).get("commit_p50_ms")


def _commit_p99(result):
    return _summary(result).get("commit_p99_ms")


def _ckpt_mean(result):
    """State bytes written per measured batch, mean (snapshot uploads included)."""
    s = _summary(result)
    if s.get("ckpt_bytes_per_batch_mean") is not None:
        return s["ckpt_bytes_per_batch_mean"]
    total, n = s.get("ckpt_bytes_measured_total"), s.get("measured_batches")  # older run JSONs
    return total / n if total is not None and n else None


def _rss_total(result):
    """Peak RSS of the JVM plus keyedstate's state servers (0 for Spark's providers)."""
    jvm = (result or {}).get("rss_jvm_peak_bytes")
    return None if jvm is None else jvm + ((result or {}).get("rss_state_servers_peak_bytes") or 0)


def _restart(result) -> dict:
    r = (result or {}).get("restart") or {}
    return r if r.get("status") == "ok" else {}


def _restart_wait(result):
    return _restart(result).get("start_to_first_batch_s")


def _restart_first_ms(result):
    return _restart(result).get("first_batch_ms")


def _status(result) -> str:
    s = _summary(result)
    status = result.get("status", "?")
    warn = " ⚠" if contended(result) else ""
    if status == "ok":
        return "ok" + warn
    return f"**{status}** ({s.get('measured_batches', 0)}/{result.get('batches_requested', '?')}){warn}"


def _flag(*results) -> str:
    """' ⚠' when any of the runs was contended or did not finish; ' (‡ merged)' when they come
    from different invocations (``--merge``), so the comparison is not from one run."""
    bad = any(r is not None and (contended(r) or r.get("status") not in (None, "ok")) for r in results)
    runs = {r.get("invocation") for r in results if r is not None and r.get("invocation")}
    return (" ⚠" if bad else "") + (" ‡" if len(runs) > 1 else "")


def commit_of(path: Path) -> str:
    """Short HEAD of the repository at ``path``, marked when the working tree has changes."""
    head = _git(path, "rev-parse", "--short", "HEAD") or "?"
    dirty = _git(path, "status", "--porcelain", "--untracked-files=no")
    return head + (" (working tree has uncommitted changes)" if dirty else "")


# ---------------------------------------------------------------------------------------------
# Header
# ---------------------------------------------------------------------------------------------
def _builds(results: dict) -> list[str]:
    """Which keyedstate each keyedstate provider ran (its checkout's commit, interpreter, jar)."""
    seen: dict[str, dict] = {}
    for (_, provider), r in sorted(results.items()):
        if r.get("keyedstate_build") and provider not in seen:
            seen[provider] = dict(r["keyedstate_build"], python=r.get("python"))
    out = []
    for provider in provider_order(seen):
        b = seen[provider]
        out.append(f"`{provider}` = commit `{b.get('commit') or '?'}`{' (uncommitted changes)' if b.get('dirty') else ''}"
                   f" (`{b.get('source')}`, {b.get('jar')})" + (f", Python `{b['python']}`" if b.get("python") else ""))
    return ["- keyedstate builds: " + "; ".join(out)] if out else []


def _header(results: dict, command: str | None, duration: str | None, commit: str | None = None) -> list[str]:
    envs = [r.get("env") or {} for r in results.values()]
    env = next((e for e in envs if e.get("java")), envs[0] if envs else {})
    starts = sorted(r["started_at"] for r in results.values() if r.get("started_at"))
    commands = sorted({r.get("command") for r in results.values() if r.get("command")})
    command = command or (commands[-1] if commands else None)
    mem = env.get("mem_total_bytes")
    lines = [
        "# keyedstate benchmark results", "",
        f"- Generated: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; runs from "
        f"{starts[0] if starts else '?'} to {starts[-1] if starts else '?'}"
        + (f"; this invocation took {float(duration) / 60:.1f} min" if duration else ""),
        f"- Machine: {env.get('nproc', '?')} CPUs ({env.get('cpu_model') or '?'}), "
        f"{fmt_bytes(mem)} RAM; {env.get('platform', '?')}",
        f"- Versions: Python {env.get('python', '?')}, Java {env.get('java', '?')}, "
        f"pyspark {env.get('pyspark', '?')}",
        f"- Commit: `{commit or commit_of(BENCH_DIR)}`",
        *_builds(results),
        f"- Command: `{command or '?'}`",
    ]
    busy = sorted(f"{r['workload']}/{r['provider']}" for r in results.values() if contended(r))
    busy += sorted(f"{r['workload']}/{r['provider']} restart" for r in results.values()
                   if r.get("restart") and contended(r["restart"]))
    if busy:
        lines.append(f"- ⚠ **Contended runs** (other processes used >10% of the CPUs during or just "
                     f"before the run; timings are not trustworthy): {', '.join(busy)}")
    if len(commands) > 1:
        lines.append("- Merged from several invocations: " + "; ".join(f"`{c}`" for c in commands))
    maintenance = BASE_CONFS.get("spark.sql.streaming.stateStore.maintenanceInterval")
    lines += [
        "- Session (every run, fresh JVM each): `local[2]`, `spark.sql.shuffle.partitions=4`, "
        "`spark.driver.memory=6g`, UI off, `stateStore.maintenanceInterval="
        f"{maintenance}` (snapshot uploads happen in maintenance; Spark's default of 60 s is longer than "
        "most runs); `noDataMicroBatches.enabled=false` for W1/W2/W5. "
        "Source `rate-micro-batch` (2 partitions, 1 s event time per batch), sink `noop`, "
        "default trigger.",
        "",
        "Definitions: **batch** = `triggerExecution` of the batch's progress, median over the "
        "measured batches (warm-up and seed batches excluded; 10 for W1/W2, 5 for the others by default). "
        "**commit** = sum of `stateOperators[].commitTimeMs` per batch, p50/p99 over measured batches "
        "(linear interpolation; with 5-10 batches p99 ≈ max). **peak RSS** = peak `VmHWM` of the JVM "
        "plus the sum over keyedstate's state-server processes (Python; 0 for Spark's providers, whose "
        "RocksDB lives in the JVM). **ckpt/batch** = state bytes written per batch: every file under "
        "`<checkpoint>/state/` (each inode once) whose mtime falls within the batch, i.e. changelogs / "
        "deltas as stored, snapshot files and SSTs uploaded by maintenance, `.crc` files; mean (median) "
        "over the measured batches. Every provider but `rocksdb` snapshots every 10 versions, so a 10-batch "
        "window holds one snapshot and a 5-batch window usually none: the **snapshots** column lists the "
        "snapshot versions uploaded inside the window. **state rows** = `numRowsTotal` after the last "
        "batch. Ratios are the row's median batch time over the column's provider (>1 = slower). "
        "**restart** (W1, W5 by default): after the measured batches the query is stopped and started "
        "again on its checkpoint in a fresh JVM; *first batch* = its `triggerExecution` (includes the "
        "state load), *start() → done* = from `start()` to that batch's end.",
        "",
    ]
    return lines


# ---------------------------------------------------------------------------------------------
# Scorecard: keyedstate against issue 14's targets
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    label: str
    get: Callable[[dict], float | None]
    fmt: Callable[[object], str]
    targets: dict[str, float]  # workload -> bound on keyedstate ÷ baseline (lower is better)
    hdfs_targets: dict[str, float] | None = None  # W1/W2 vs hdfs (the stretch goal)
    restart: bool = False  # measured by the restart, whose own contention decides the ⚠


METRICS = (
    Metric("state bytes written per batch (mean)", _ckpt_mean, fmt_bytes, {"W1": 1.0, "W2": 1.0, "W3": 1.0, "W5": 1.0}),
    Metric("commit p99 (ms)", _commit_p99, fmt_ms, {"W1": 1.0, "W2": 1.0}),
    Metric("peak RSS, JVM + state servers", _rss_total, fmt_bytes, {"W1": 1.0, "W2": 1.0, "W5": 1.0}),
    Metric("median batch (ms)", _median, fmt_ms, {"W1": 1.0, "W2": 1.0, "W3": 1.0, "W4": 1.0, "W5": 1.1},
           hdfs_targets={"W1": 1.0, "W2": 1.0}),
    Metric("restart: start() → first batch done (s)", _restart_wait, fmt_s, {"W5": 1.0}, restart=True),
    Metric("restart: first batch (ms)", _restart_first_ms, fmt_ms, {"W5": 1.0}, restart=True),
)
HDFS_WORKLOADS = ("W1", "W2")


def _score_rows(by_wl: dict[str, dict[str, dict]], baseline: str, workloads, hdfs: bool) -> list[list[str]]:
    rows = []
    for m in METRICS:
        targets = (m.hdfs_targets or {}) if hdfs else m.targets
        for wl in workloads:
            runs = by_wl.get(wl) or {}
            ks, base = runs.get("keyedstate"), runs.get(baseline)
            if ks is None and base is None:
                continue
            a, b = m.get(ks), m.get(base)
            bound = targets.get(wl)
            if a is None and b is None and bound is None:
                continue
            r = ratio_value(a, b)
            flag = _flag(*(dict(x.get("restart") or {}, invocation=x.get("invocation")) if m.restart and x else x
                           for x in (ks, base)))
            rows.append([m.label, wl, m.fmt(a), m.fmt(b), "–" if r is None else f"{r:.2f}×",
                         target_text(bound), (verdict(r, bound) or "–") + flag])
    return rows


def _scorecard(by_wl: dict[str, dict[str, dict]], rescale_data: dict | None) -> list[str]:
    if not any("keyedstate" in runs for runs in by_wl.values()):
        return []
    out = ["## Scorecard: keyedstate against issue 14's targets", "",
           f"Ratios keyedstate ÷ `{BASELINE}` (Spark's RocksDB provider with changelog checkpointing), "
           "each from one run of this report; peak RSS compares keyedstate's JVM + state servers with "
           "Spark's JVM. *target* is the issue's bound (– = no target for that workload, shown for "
           "context); ⚠ = a run involved was contended or did not finish, so its verdict is not "
           "trustworthy; ‡ = the two runs come from different invocations (`--merge`).", ""]
    cols = ["metric", "workload", "keyedstate", BASELINE, "ratio", "target", "result"]
    rows = _score_rows(by_wl, BASELINE, [w for w in by_wl], hdfs=False)
    rows += rescale.scorecard_rows(rescale_data) if rescale_data else []
    out += table(cols, rows, ["l", "l", "r", "r", "r", "r", "l"]) + [""]
    hdfs_wls = [w for w in HDFS_WORKLOADS if w in by_wl and "hdfs" in by_wl[w]]
    if hdfs_wls:
        out += [f"Against `hdfs` (Spark's default, in-memory provider), {', '.join(hdfs_wls)}; the "
                "stretch goal is the median batch:", ""]
        out += table(["metric", "workload", "keyedstate", "hdfs", "ratio", "target", "result"],
                     _score_rows(by_wl, "hdfs", hdfs_wls, hdfs=True), ["l", "l", "r", "r", "r", "r", "l"]) + [""]
    return out


# ---------------------------------------------------------------------------------------------
# Recovery and before/after
# ---------------------------------------------------------------------------------------------
def _recovery(by_wl: dict[str, dict[str, dict]]) -> list[str]:
    rows = []
    for wl, runs in by_wl.items():
        base = runs.get(BASELINE)
        for provider in provider_order(runs):
            r = runs[provider]
            rec = r.get("restart")
            if not rec:
                continue
            ok = rec.get("status") == "ok"
            status = ("ok" if ok else f"**{rec.get('status')}**") + (" ⚠" if contended(rec) else "")
            if rec.get("status") == "skipped":
                status += " (" + "; ".join(rec.get("notes") or []) + ")"
            elif not ok and rec.get("error"):
                status += f": `{rec['error'].splitlines()[0][:160]}`"
            servers = rec.get("rss_state_servers_peak_bytes")
            rows.append([wl, f"**{provider}**" if provider == "keyedstate" else provider, status,
                         fmt_s(rec.get("session_start_s")), fmt_s(rec.get("start_to_first_batch_s"), 2),
                         fmt_ms(rec.get("first_batch_ms")), fmt_load_plan(rec.get("load_plan")),
                         fmt_bytes(_rss_total(rec)) + (f" (servers {fmt_bytes(servers)})" if servers else ""),
                         f"{ratio(_restart_wait(r), _restart_wait(base))} / {ratio(_restart_first_ms(r), _restart_first_ms(base))}"])
    if not rows:
        return []
    return ["## Recovery: restart in a fresh JVM", "",
            "After the measured batches the query is stopped and the JVM exits; a new process and JVM "
            "start the same query on the checkpoint. *JVM + session* = until the SparkSession is up "
            "(not part of the ratios); *start() → done* = from `query.start()` to the end of the first "
            "batch; *first batch* = its `triggerExecution`, which includes loading the state; *load plan* "
            "= newest version, the snapshot a load starts from and the changelogs/deltas it replays "
            "(over the store partitions). Peak RSS is over the restart process.", ""] + table(
        ["workload", "provider", "status", "JVM + session s", "start() → done s", "first batch ms",
         "load plan", "peak RSS JVM + servers", f"÷ {BASELINE} (wait / batch)"],
        rows, ["l", "l", "l", "r", "r", "r", "l", "r", "r"]) + [""]


def _before_after(by_wl: dict[str, dict[str, dict]]) -> list[str]:
    """Every ``--provider-python`` alias against its base provider, same run."""
    names = {p for runs in by_wl.values() for p in runs}
    out = []
    for alias in provider_order(names):
        base = base_provider(alias)
        if alias in BUILTIN_PROVIDERS or base is None:
            continue
        pairs = [(wl, runs[alias], runs[base]) for wl, runs in by_wl.items() if alias in runs and base in runs]
        if not pairs:
            continue

        def build(r):
            b = r.get("keyedstate_build") or {}
            return f"commit `{b.get('commit') or '?'}`" if b else f"Python `{r.get('python') or '?'}`"

        def cell(get, fmt, before, after):
            a, b = get(before), get(after)
            return f"{fmt(a)} → {fmt(b)} ({ratio(b, a)})"
        rows = [[wl + _flag(before, after), cell(_median, fmt_ms, before, after),
                 cell(_commit_p50, fmt_ms, before, after), cell(_commit_p99, fmt_ms, before, after),
                 cell(_ckpt_mean, fmt_bytes, before, after), cell(_rss_total, fmt_bytes, before, after),
                 cell(_restart_wait, fmt_s, before, after)]
                for wl, before, after in pairs]
        out += [f"## Before/after: `{alias}` ({build(pairs[0][1])}) → `{base}` ({build(pairs[0][2])})", "",
                f"Same run, same session and confs; `{alias}` runs the `{base}` provider with another "
                f"interpreter (`--provider-python`), whose keyedstate sources build its jar. Cells: "
                f"`{alias}` → `{base}` (`{base}` ÷ `{alias}`; < 1 = the current build is faster / smaller).", ""]
        out += table(["workload", "median batch ms", "commit p50 ms", "commit p99 ms", "ckpt/batch (mean)",
                      "peak RSS JVM + servers", "restart start() → done s"], rows) + [""]
    return out


# ---------------------------------------------------------------------------------------------
# Per workload
# ---------------------------------------------------------------------------------------------
def _rss_cell(r) -> str:
    servers = r.get("rss_state_servers_peak_bytes")
    if not servers:
        return fmt_bytes(r.get("rss_jvm_peak_bytes"))
    return f"{fmt_bytes(r.get('rss_jvm_peak_bytes'))} + {fmt_bytes(servers)} = {fmt_bytes(_rss_total(r))}"


def _snapshots_cell(s: dict) -> str:
    if "ckpt_snapshot_versions" not in s:
        return "?"
    versions = s["ckpt_snapshot_versions"]
    return "none" if not versions else ", ".join(f"v{v}" for v in versions) + f" ({s.get('ckpt_snapshot_files')} files)"


def _workload_table(wl: str, rows: dict[str, dict]) -> list[str]:
    refs = {p: _median(rows.get(p)) for p in ("rocksdb", BASELINE, "hdfs")}
    out = []
    for provider in provider_order(rows):
        r = rows[provider]
        s = _summary(r)
        med = s.get("median_batch_ms")
        out.append([f"**{provider}**" if provider == "keyedstate" else provider, _status(r),
                    f"{fmt_ms(med)} ({fmt_ms(s.get('min_batch_ms'))}–{fmt_ms(s.get('max_batch_ms'))})",
                    f"{fmt_ms(s.get('commit_p50_ms'))} / {fmt_ms(s.get('commit_p99_ms'))}", _rss_cell(r),
                    f"{fmt_bytes(_ckpt_mean(r))} ({fmt_bytes(s.get('ckpt_bytes_per_batch_median'))})",
                    _snapshots_cell(s), fmt_rows(s.get("num_rows_total_final")),
                    *(ratio(med, refs[p]) for p in refs)])
    return table(["provider", "status", "batch ms median (min–max)", "commit p50 / p99 ms",
                  "peak RSS JVM + servers", "ckpt/batch mean (median)", "snapshots in window", "state rows",
                  *(f"÷ {p}" for p in refs)],
                 out, ["l", "l"])


def _notes(wl: str, rows: dict[str, dict]) -> list[str]:
    out = []
    for provider in provider_order(rows):
        r = rows[provider]
        s = _summary(r)
        bits = []
        if s.get("seed_batch_ms") is not None:
            bits.append(f"seed batch ({fmt_rows(r.get('seed_rows'))} rows) {fmt_ms(s['seed_batch_ms'])} ms")
        if s.get("warmup_batch_ms"):
            bits.append("warm-up " + ", ".join(fmt_ms(v) for v in s["warmup_batch_ms"]) + " ms")
        bits += r.get("notes") or []
        bits += [f"restart: {n}" for n in (r.get("restart") or {}).get("notes") or []
                 if (r.get("restart") or {}).get("status") != "skipped"]
        if r.get("error"):
            bits.append(f"error: `{r['error'].splitlines()[0][:300]}`")
        usual = dict(BASE_CONFS, **PROVIDERS.get(base_provider(provider) or provider, {}))
        extra_confs = {k: v for k, v in r.get("confs", {}).items()
                       if usual.get(k) != v and k != "spark.sql.streaming.noDataMicroBatches.enabled"}
        if extra_confs:
            bits.append("extra confs: " + ", ".join(f"`{k}={v}`" for k, v in extra_confs.items()))
        if bits:
            out.append(f"- {provider}: " + "; ".join(bits))
    return out


def _custom_metrics(rows: dict[str, dict]) -> list[str]:
    """Median per measured batch of every custom metric (summed over operators)."""
    out = []
    for provider in provider_order(rows):
        r = rows[provider]
        per_metric: dict[str, list[float]] = {}
        for b in r.get("batches", []):
            if b.get("phase") != "measured":
                continue
            sums: dict[str, float] = {}
            for op in b.get("stateOperators") or []:
                for k, v in (op.get("customMetrics") or {}).items():
                    sums[k] = sums.get(k, 0) + (v or 0)
            for k, v in sums.items():
                per_metric.setdefault(k, []).append(v)
        if per_metric:
            items = ", ".join(f"{k}={statistics.median(v):,.0f}" for k, v in sorted(per_metric.items()))
            out.append(f"- {provider}: {items}")
    return out


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------
def plot(by_wl: dict[str, dict[str, dict]], plots_dir: Path) -> dict[str, list[str]]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir.mkdir(parents=True, exist_ok=True)
    for old in plots_dir.glob("*.png"):
        old.unlink()
    made: dict[str, list[str]] = {}
    for wl, rows in by_wl.items():
        providers = provider_order(rows)
        title = f"{wl} {WORKLOADS[wl].title if wl in WORKLOADS else ''}".strip()
        # median batch time
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        meds = [(_median(rows[p]) or 0) / 1000 for p in providers]
        bars = ax.bar(providers, meds, color=[color(p) for p in providers])
        for bar, p, v in zip(bars, providers, meds):
            label = f"{v:.2f} s" + ("" if rows[p].get("status") == "ok" else f"\n({rows[p].get('status')})")
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("median batch time (s)")
        ax.set_title(f"{title}: median batch time")
        ax.margins(y=0.18)
        fig.tight_layout()
        name = f"{wl}_median_batch.png"
        fig.savefig(plots_dir / name, dpi=110)
        plt.close(fig)
        made.setdefault(wl, []).append(name)
        # per-batch time series
        fig, ax = plt.subplots(figsize=(7.2, 3.8))
        for p in providers:
            batches = [b for b in rows[p].get("batches", []) if b.get("batch_ms") is not None]
            if not batches:
                continue
            xs = [b["batchId"] for b in batches]
            ys = [b["batch_ms"] / 1000 for b in batches]
            ax.plot(xs, ys, "-", color=color(p), label=p, alpha=0.8)
            mx = [b["batchId"] for b in batches if b.get("phase") == "measured"]
            my = [b["batch_ms"] / 1000 for b in batches if b.get("phase") == "measured"]
            ox = [b["batchId"] for b in batches if b.get("phase") != "measured"]
            oy = [b["batch_ms"] / 1000 for b in batches if b.get("phase") != "measured"]
            ax.plot(mx, my, "o", color=color(p), ms=4)
            ax.plot(ox, oy, "x", color=color(p), ms=5)
        ys_all = [b["batch_ms"] for p in providers for b in rows[p].get("batches", []) if b.get("batch_ms")]
        if ys_all and max(ys_all) / max(1, min(ys_all)) > 30:
            ax.set_yscale("log")
        from matplotlib.ticker import MaxNLocator
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("batch id (x = seed / warm-up, o = measured)")
        ax.set_ylabel("batch time (s)")
        ax.set_title(f"{title}: time per batch")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        name = f"{wl}_batches.png"
        fig.savefig(plots_dir / name, dpi=110)
        plt.close(fig)
        made[wl].append(name)
    return made


def _ttl_overhead(by_wl: dict[str, dict[str, dict]]) -> list[str]:
    """keyedstate with state TTL on (24h) vs off, same run: the TTL issue's <= 1.10x target."""
    rows = [(wl, r) for wl, r in by_wl.items() if "keyedstate_ttl" in r and "keyedstate" in r]
    if not rows:
        return []
    out = ["## TTL overhead: keyedstate with `ttl=24h` vs without", "",
           "Same workloads and session, TTL on: every value carries its write time (8 bytes), "
           "every read checks it, every commit asks for cleanup candidates, and every 10 versions "
           "(the default `ttl.cleanupInterval`, aligned with `snapshotInterval`; W1/W2 measure 10 "
           "batches so that one scan and one snapshot fall inside them for both) the state server "
           "scans up to 1M entries per partition in the background. "
           "Target: <= 1.10x.", "",
           "| workload | keyedstate ms | keyedstate_ttl ms | ttl ÷ no ttl | target | TTL cleanup ms/batch (median) | commit p50 ms (no ttl / ttl) |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for wl, r in rows:
        off, on = r["keyedstate"], r["keyedstate_ttl"]
        cleanup = (_custom_median(on, "keyedstateTtlCleanupMs"))
        r_ = ratio_value(_median(on), _median(off))
        out.append(f"| {wl}{_flag(off, on)} | {fmt_ms(_median(off))} | {fmt_ms(_median(on))} | {ratio(_median(on), _median(off))} "
                   f"| ≤ 1.1× {verdict(r_, 1.10)} "
                   f"| {'–' if cleanup is None else fmt_ms(cleanup)} "
                   f"| {fmt_ms((off.get('summary') or {}).get('commit_p50_ms'))} / "
                   f"{fmt_ms((on.get('summary') or {}).get('commit_p50_ms'))} |")
    return out + [""]


def _custom_median(result: dict, name: str):
    """Median over measured batches of a custom metric summed over operators."""
    values = [sum((op.get("customMetrics") or {}).get(name, 0) or 0 for op in b.get("stateOperators") or [])
              for b in result.get("batches", []) if b.get("phase") == "measured"]
    return statistics.median(values) if values else None


# ---------------------------------------------------------------------------------------------
def _summary_table(by_wl: dict[str, dict[str, dict]]) -> list[str]:
    providers = provider_order({p for runs in by_wl.values() for p in runs})
    rows = []
    for wl, runs in by_wl.items():
        cells = []
        for p in providers:
            r = runs.get(p)
            cells.append("–" if r is None else fmt_ms(_median(r))
                         + ("" if r.get("status") == "ok" else f" ({r.get('status')})")
                         + (" ⚠" if contended(r) else ""))
        ks = _median(runs.get("keyedstate"))
        rows.append([f"{wl} {WORKLOADS[wl].title if wl in WORKLOADS else ''}", *cells,
                     *(ratio(ks, _median(runs.get(p))) for p in ("rocksdb", BASELINE, "hdfs"))])
    return ["## Summary: median batch time (ms)", ""] + table(
        ["workload", *providers, "keyedstate ÷ rocksdb", f"keyedstate ÷ {BASELINE}", "keyedstate ÷ hdfs"],
        rows) + [""]


# ---------------------------------------------------------------------------------------------
# Real checkpoint storage (issue 48): hdfs:// and s3a://
# ---------------------------------------------------------------------------------------------
STORAGE_TARGETS = {"median batch (ms)": 1.0, "commit p99 (ms)": 1.0}
"""Issue 48's bounds on keyedstate ÷ rocksdb_changelog on real storage (W1, W2); every request
kind per batch is bounded by 1.0× too."""
STORAGE_WORKLOADS = ("W1", "W2")


def _storage(result) -> str:
    return (result or {}).get("storage") or "local"


def _requests(result, op: str):
    return (_summary(result).get("requests_per_batch_median") or {}).get(op)


def _request_kinds(runs) -> tuple[str, ...]:
    """The request kinds the runs counted, in their storage's order (s3a's OPS, hdfs's
    HDFS_KINDS), without "all"."""
    kinds: dict[str, None] = {}
    for r in runs:
        kinds.update(dict.fromkeys(k for k in (_summary(r).get("requests_per_batch_median") or {}) if k != "all"))
    return tuple(kinds)


def _storage_metrics(kinds: tuple[str, ...] = OPS) -> list[tuple[str, Callable[[dict], float | None],
                                                               Callable[[object], str]]]:
    return [("median batch (ms)", _median, fmt_ms), ("commit p50 (ms)", _commit_p50, fmt_ms),
            ("commit p99 (ms)", _commit_p99, fmt_ms),
            ("state bytes per batch (median)", lambda r: _summary(r).get("ckpt_bytes_per_batch_median"), fmt_bytes),
            *((f"{op} per batch (median)", lambda r, op=op: _requests(r, op), _fmt_count) for op in (*kinds, "all"))]


def _requests_cell(result, op: str) -> str:
    median = _requests(result, op)
    if median is None:
        return "–"
    mean = (_summary(result).get("requests_per_batch_mean") or {}).get(op)
    if mean is None and op == "all":
        mean = sum((_summary(result).get("requests_per_batch_mean") or {}).values()) or None
    return f"{median:g}" + (f" ({mean:.1f})" if mean is not None else "")


def _fmt_count(v) -> str:
    return "–" if v is None else f"{v:g}"


def storage_section(by_wl: dict[str, dict[str, dict]], level: str = "##") -> list[str]:
    """Per workload run on hdfs:// or s3a://: each provider's median batch, commit p50/p99, state
    bytes and requests per batch by kind (s3a: S3 operations; hdfs: NameNode client RPCs);
    keyedstate ÷ rocksdb_changelog (issue 48's targets) and keyedstate ÷ hdfs."""
    out = []
    for wl, runs in by_wl.items():
        remote = {p: r for p, r in runs.items() if _storage(r) != "local"}
        if not remote:
            continue
        where = sorted({_storage(r) for r in remote.values()})
        any_r = next(iter(remote.values()))
        has_requests = any(_summary(r).get("requests_per_batch_median") for r in remote.values())
        out += [f"{level} {wl} on {', '.join(f'{w}://' for w in where)}", "",
                f"{fmt_rows(any_r.get('rows_per_batch'))} rows per batch, key space {fmt_rows(any_r.get('keys'))}; "
                f"{any_r.get('batches_requested', '?')} measured batches after {any_r.get('warmup_batches', '?')} "
                f"warm-up. Storage: {any_r.get('storage_detail', '?')}. State bytes: {any_r.get('ckpt_bytes_source', '?')}.",
                ""]
        kinds = _request_kinds(remote.values())
        ops = (*kinds, "all") if has_requests else ()
        rows = []
        for provider in provider_order(remote):
            r = remote[provider]
            s = _summary(r)
            rows.append([f"**{provider}**" if provider == "keyedstate" else provider, _storage(r), _status(r),
                         f"{fmt_ms(s.get('median_batch_ms'))} ({fmt_ms(s.get('min_batch_ms'))}–{fmt_ms(s.get('max_batch_ms'))})",
                         f"{fmt_ms(s.get('commit_p50_ms'))} / {fmt_ms(s.get('commit_p99_ms'))}",
                         f"{fmt_bytes(s.get('ckpt_bytes_per_batch_median'))} ({fmt_bytes(_ckpt_mean(r))})",
                         *(_requests_cell(r, op) for op in ops)])
        out += table(["provider", "storage", "status", "batch ms median (min–max)", "commit p50 / p99 ms",
                      "state bytes/batch median (mean)", *(f"{op}/batch median (mean)" for op in ops)],
                     rows, ["l", "l", "l"]) + [""]
        ks = remote.get("keyedstate")
        ratio_rows = []
        for label, get, fmt in _storage_metrics(kinds):
            if get(ks) is None and not any(get(remote.get(b)) is not None for b in (BASELINE, "hdfs")):
                continue
            request_kind = label.split(" ", 1)[0] in kinds and label.endswith(" per batch (median)")
            bound = STORAGE_TARGETS.get(label, 1.0 if request_kind else None)
            bound = bound if wl in STORAGE_WORKLOADS else None
            cells = [label, fmt(get(ks))]
            for base in (BASELINE, "hdfs"):
                b = remote.get(base)
                a_v, b_v = get(ks), get(b)
                if a_v == 0 and b_v == 0:
                    cells += [fmt(b_v), "0 = 0"]
                elif b_v == 0 and a_v:
                    cells += [fmt(b_v), f"{a_v:g} vs 0"]
                else:
                    cells += [fmt(b_v), ratio(a_v, b_v)]
            r = ratio_value(get(ks), get(remote.get(BASELINE)))
            if bound is not None and get(ks) == 0 and get(remote.get(BASELINE)) == 0:
                result = "met"
            elif bound is not None and get(ks) and get(remote.get(BASELINE)) == 0:
                result = "**missed** (baseline 0)"
            else:
                result = verdict(r, bound) or "–"
            ratio_rows.append(cells + [target_text(bound), result + _flag(ks, remote.get(BASELINE))])
        if ratio_rows:
            out += [f"keyedstate against `{BASELINE}` (issue 48's targets, W1/W2: ≤ 1.0× for median batch, "
                    "commit p99 and every request kind) and against `hdfs`:", ""]
            out += table(["metric", "keyedstate", BASELINE, f"÷ {BASELINE}", "hdfs", "÷ hdfs", "target", "result"],
                         ratio_rows, ["l"]) + [""]
        if has_requests:
            out += ["Where the requests go (mean per measured batch, by operation and file"
                    + ("; hdfs: audited commands by file, and client RPCs without a path" if "hdfs" in where else "")
                    + "):", ""]
            for provider in provider_order(remote):
                top = _summary(remote[provider]).get("requests_by_file_mean") or {}
                out.append(f"- {provider}: " + ", ".join(f"{k} {v:.1f}" for k, v in list(top.items())[:12]))
            out.append("")
        restarts = [(p, r) for p, r in remote.items() if r.get("restart")]
        if restarts:
            out += ["Restart on this storage (fresh JVM, same checkpoint):", ""]
            rrows = []
            for provider, r in sorted(restarts, key=lambda x: provider_order(remote).index(x[0])):
                rec = r["restart"]
                first = next((b for b in rec.get("batches") or [] if b.get("batchId") is not None), {})
                req = first.get("requests") or {}
                rrows.append([provider, rec.get("status", "?") + (" ⚠" if contended(rec) else ""),
                              fmt_s(rec.get("start_to_first_batch_s")), fmt_ms(rec.get("first_batch_ms")),
                              fmt_s(rec.get("session_start_s")), fmt_load_plan(rec.get("load_plan")),
                              " ".join(f"{op} {n}" for op, n in req.items() if n) or "–"])
            out += table(["provider", "status", "start() → first batch done (s)", "first batch (ms)",
                          "session start (s)", "load plan", "requests of the first batch"], rrows, ["l", "l"]) + [""]
    return out


def _load_rescale(path: Path | list[Path] | None) -> dict | None:
    """A rescale JSON; given several, the first with the others' runs as its other_runs."""
    paths = [p for p in ([path] if isinstance(path, Path) else path or []) if p.exists()]
    if not paths:
        return None
    try:
        return rescale.load_json(paths[0], paths[1:])
    except (OSError, ValueError) as exc:
        print(f"report: cannot read {', '.join(map(str, paths))}: {exc}", file=sys.stderr)
        return None


def render(results: dict[tuple[str, str], dict], out: Path, plots_dir: Path,
           command: str | None = None, duration: str | None = None, plots: bool = True,
           rescale_json: Path | list[Path] | None = WORK_DIR / "rescale.json", commit: str | None = None,
           extra_source: Path | None = extra.EXTRA_DIR) -> str:
    by_wl: dict[str, dict[str, dict]] = {}
    for (wl, provider), r in sorted(results.items()):
        by_wl.setdefault(wl, {})[provider] = r
    by_wl = {wl: by_wl[wl] for wl in sorted(by_wl, key=lambda w: (w not in WORKLOADS, w))}
    made = plot(by_wl, plots_dir) if plots else {}
    rescale_data = _load_rescale(rescale_json)
    rescale_plot = rescale.plot_scaling(rescale_data, plots_dir) if plots and rescale_data else None

    lines = _header(results, command, duration, commit)
    lines += _summary_table(by_wl)
    lines += storage_section(by_wl)
    lines += _scorecard(by_wl, rescale_data)
    lines += _recovery(by_wl)
    lines += _before_after(by_wl)
    lines += _ttl_overhead(by_wl)
    for wl, rows in by_wl.items():
        w = WORKLOADS.get(wl)
        any_r = next(iter(rows.values()))
        lines += [f"## {wl}: {w.title if w else ''}", "",
                  f"{w.shape if w else any_r.get('workload_shape', '')}. {fmt_rows(any_r.get('rows_per_batch'))} "
                  f"rows per batch, key space {fmt_rows(any_r.get('keys'))}; {any_r.get('batches_requested', '?')} "
                  f"measured batches after {any_r.get('warmup_batches', '?')} warm-up"
                  + (f" (and 1 seed batch of {fmt_rows(any_r.get('seed_rows'))} rows)" if any_r.get("seed_rows") else "")
                  + ".", ""]
        lines += _workload_table(wl, rows) + [""]
        notes = _notes(wl, rows)
        if notes:
            lines += ["Notes:", ""] + notes + [""]
        custom = _custom_metrics(rows)
        if custom:
            lines += ["<details><summary>State-operator custom metrics (median per measured batch, "
                      "summed over operators)</summary>", ""] + custom + ["", "</details>", ""]
        for name in made.get(wl, []):
            lines.append(f"![{wl} {name}](plots/{name})")
        lines.append("")
    if rescale_data:
        lines += rescale.section(rescale_data, rescale_plot)
    lines += extra.section(extra_source)
    # The hand-written reading of RESULTS.md's numbers (targets, where the time goes, what would
    # close a gap) lives beside the generator, so re-rendering keeps it; other reports (--out)
    # come from other runs, which it does not describe.
    analysis = BENCH_DIR / "ANALYSIS.md"
    if analysis.exists() and out.resolve() == (BENCH_DIR / "RESULTS.md").resolve():
        lines += [analysis.read_text().rstrip(), ""]
    text = "\n".join(lines).rstrip() + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


def render_storage(sources: list[str], out: Path) -> str:
    """One report of several ``python3 -m benchmarks --storage hdfs|s3a`` invocations (issue 48):
    per invocation its command, date, duration, commit and machine load, then the storage section
    of its runs. Each source is an invocation's results JSON, with the ``.meta.json`` beside it."""
    lines = ["# keyedstate on real checkpoint storage: W1, W2 (and W5's restart) on hdfs:// and s3a://", "",
             f"- Generated: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} by "
             f"`python3 -m benchmarks.report --storage-report` from {len(sources)} invocation(s) below.",
             "- Storage (benchmarks/storage.py, tests/support/storage.py): a MiniDFSCluster (NameNode + 2 "
             "DataNodes, replication 2) in a JVM of its own, which logs every request its NameNode answers "
             "(tests/storage/src/MiniHdfs.java: HDFS's audit log and an RPC scheduler hook), or moto's S3 "
             "server behind the proxy of tests/support/s3proxy.py, which counts every request of the s3a "
             "client (hadoop-aws 3.5) by S3 operation; started once per invocation, a fresh checkpoint dir "
             "per run. All on the same loopback and disk as Spark: the figures compare providers, they are "
             "not a network's.",
             "- Requests per batch: every request in the batch's window [its start, the next batch's start) "
             "(offset/commit logs, state files, maintenance meanwhile), median over the measured batches. "
             "s3a: by S3 operation (PUT, GET, LIST, HEAD, DELETE, COPY). hdfs: NameNode client RPCs by "
             "method (`open` = getBlockLocations, `fsync` = a client's hsync/hflush, `other` = renewLease, "
             "getServerDefaults, ...); the DataNodes' heartbeats and block reports are not a client's "
             "requests and are left out, block data to the DataNodes is not counted. "
             "State bytes per batch: s3a = PUT bodies under `state/` the proxy forwarded (a COPY, s3a's "
             "rename, moves no bytes); hdfs = sizes of the files under `state/` whose mtime is in the "
             "window (listed after the run; replication not counted).",
             "- Session as in RESULTS.md (`local[2]`, 4 shuffle partitions, `maintenanceInterval=1s`).", ""]
    blocks = []
    for number, source in enumerate(sources, 1):
        results = load([source])
        meta_path = Path(source).with_suffix(".meta.json")
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        if not results:
            print(f"report: no results in {source}", file=sys.stderr)
            continue
        by_wl: dict[str, dict[str, dict]] = {}
        for (wl, provider), r in sorted(results.items()):
            by_wl.setdefault(wl, {})[provider] = r
        env = next((r.get("env") for r in results.values() if (r.get("env") or {}).get("java")), {}) or {}
        busy = sorted(f"{r['workload']}/{r['provider']}" for r in results.values() if contended(r))
        share = [max((r.get("other_cpu_share") or {}).values(), default=0) for r in results.values()]
        load_avg = meta.get("loadavg_start"), meta.get("loadavg_end")
        lines += [f"- Run {number}: `{meta.get('command', '?')}`: started {meta.get('started_at', '?')}, "
                  f"{float(meta.get('duration_s') or 0) / 60:.1f} min, commit `{meta.get('commit', '?')}`, "
                  f"{env.get('nproc', '?')} CPUs, Java {env.get('java', '?')}, pyspark {env.get('pyspark', '?')}; "
                  f"load average (1 min) {load_avg[0] if load_avg[0] is not None else '?'} at the start, "
                  f"{load_avg[1] if load_avg[1] is not None else '?'} at the end; other processes used "
                  f"{min(share, default=0):.0%}–{max(share, default=0):.0%} of the CPUs during the runs"
                  + (f" (⚠ contended: {', '.join(busy)})" if busy else "")]
        storages = sorted({_storage(r) for r in results.values()})
        blocks.append([f"## Run {number}: {', '.join(storages)}, {', '.join(by_wl)} (started {meta.get('started_at', '?')})",
                       ""] + storage_section(by_wl, level="###"))
    lines.append("")
    for block in blocks:
        lines += block
    text = "\n".join(lines).rstrip() + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.report")
    ap.add_argument("results", nargs="*", default=[str(WORK_DIR / "results.json")])
    ap.add_argument("--out", type=Path, default=BENCH_DIR / "RESULTS.md")
    ap.add_argument("--plots", type=Path, default=BENCH_DIR / "plots")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--command", help="command line to show in the header")
    ap.add_argument("--duration", help="seconds the run took (header)")
    ap.add_argument("--commit", help="commit the runs used (header; default: HEAD now)")
    ap.add_argument("--rescale", type=Path, nargs="+", default=[WORK_DIR / "rescale.json"],
                    help="rescale comparison to include if present (python3 -m benchmarks.rescale); "
                         "further files add their runs to the plot of rescale time against keys")
    ap.add_argument("--extra", type=Path, default=extra.EXTRA_DIR,
                    help="extra measurement tables to include if present: a directory of JSON files or "
                         "one file (see benchmarks/extra.py)")
    ap.add_argument("--storage-report", action="store_true",
                    help="render the hdfs/s3a sections of each RESULTS (one per `--storage` invocation, "
                         "its .meta.json beside it) into --out, one block per invocation")
    args = ap.parse_args(argv)
    if args.storage_report:
        render_storage(args.results, args.out)
        print(f"wrote {args.out}")
        return 0
    results = load(args.results)
    if not results:
        print(f"report: no results in {', '.join(args.results)}", file=sys.stderr)
        return 1
    render(results, args.out, args.plots, args.command, args.duration or None, plots=not args.no_plots,
           rescale_json=args.rescale, commit=args.commit, extra_source=args.extra)
    print(f"wrote {args.out} ({len(results)} runs) and plots in {args.plots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
