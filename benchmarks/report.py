"""Render benchmark results into ``benchmarks/RESULTS.md`` and ``benchmarks/plots/*.png``.

    python3 -m benchmarks.report [RESULTS ...] [--command "..."] [--out benchmarks/RESULTS.md]

Each RESULTS is a pytest-benchmark ``--benchmark-json`` file, a single run's JSON (as written to
``benchmarks/.work/runs/``) or a directory of those; default ``benchmarks/.work/results.json``.
When several results cover the same workload x provider, the one listed last wins.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from . import rescale
from .fmt import contended, fmt_bytes, fmt_ms, fmt_rows, ratio
from .workloads import BENCH_DIR, PROVIDERS, WORK_DIR, WORKLOADS

PROVIDER_ORDER = list(PROVIDERS)
COLORS = {"hdfs": "#4c72b0", "rocksdb": "#dd8452", "rocksdb_changelog": "#c44e52", "keyedstate": "#55a868",
          "keyedstate_ttl": "#8172b2"}


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
# Formatting
# ---------------------------------------------------------------------------------------------
def _median(result):
    return (result.get("summary") or {}).get("median_batch_ms")


def _status(result) -> str:
    s = result.get("summary") or {}
    status = result.get("status", "?")
    warn = " ⚠" if contended(result) else ""
    if status == "ok":
        return "ok" + warn
    return f"**{status}** ({s.get('measured_batches', 0)}/{result.get('batches_requested', '?')}){warn}"


def _sh(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def commit_of(path: Path) -> str:
    """Short HEAD of the repository at ``path``, marked when the working tree has changes."""
    head = _sh(['git', '-C', str(path), 'rev-parse', '--short', 'HEAD']) or '?'
    dirty = _sh(['git', '-C', str(path), 'status', '--porcelain', '--untracked-files=no'])
    return head + (" (working tree has uncommitted changes)" if dirty else "")


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
        f"- Command: `{command or '?'}`",
    ]
    busy = sorted(f"{r['workload']}/{r['provider']}" for r in results.values() if contended(r))
    if busy:
        lines.append(f"- ⚠ **Contended runs** (other processes used >10% of the CPUs during or just "
                     f"before the run; timings are not trustworthy): {', '.join(busy)}")
    if len(commands) > 1:
        lines.append("- Merged from several invocations: " + "; ".join(f"`{c}`" for c in commands))
    lines += [
        "- Session (every run, fresh JVM each): `local[2]`, `spark.sql.shuffle.partitions=4`, "
        "`spark.driver.memory=6g`, UI off; `noDataMicroBatches.enabled=false` for W1/W2/W5. "
        "Source `rate-micro-batch` (2 partitions, 1 s event time per batch), sink `noop`, "
        "default trigger.",
        "",
        "Definitions: **batch** = `triggerExecution` of the batch's progress, median over the "
        "measured batches (warm-up and seed batches excluded; 10 for W1/W2, 5 for the others). **commit** = sum of "
        "`stateOperators[].commitTimeMs` per batch, p50/p99 over measured batches (linear "
        "interpolation; with 5 batches p99 ≈ max). **RSS** = peak `VmHWM` of the JVM, and the sum "
        "over keyedstate state-server processes (Python). **ckpt/batch** = bytes of files under "
        "`<checkpoint>/state/` whose mtime falls within the batch, median (mean) over measured "
        "batches; the mean includes occasional compactions / full snapshots (see "
        "`benchmarks/README.md`). **state rows** = `numRowsTotal` after the last batch. "
        "Ratios are median batch time of the row's provider over rocksdb / hdfs (>1 = slower).",
        "",
    ]
    return lines


def _mean_ckpt(summary):
    total, n = summary.get("ckpt_bytes_measured_total"), summary.get("measured_batches")
    return total / n if total is not None and n else None


def _workload_table(wl: str, rows: dict[str, dict]) -> list[str]:
    rocks, hdfs = _median(rows.get("rocksdb", {})), _median(rows.get("hdfs", {}))
    out = ["| provider | status | rows/batch | batch ms (median) | min–max ms | commit p50 / p99 ms "
           "| RSS JVM | RSS state servers | ckpt/batch median (mean) | state rows | ÷ rocksdb | ÷ hdfs |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for provider in PROVIDER_ORDER:
        r = rows.get(provider)
        if r is None:
            continue
        s = r.get("summary") or {}
        med = s.get("median_batch_ms")
        name = f"**{provider}**" if provider == "keyedstate" else provider
        out.append(
            f"| {name} | {_status(r)} | {fmt_rows(r.get('rows_per_batch'))} | {fmt_ms(med)} "
            f"| {fmt_ms(s.get('min_batch_ms'))}–{fmt_ms(s.get('max_batch_ms'))} "
            f"| {fmt_ms(s.get('commit_p50_ms'))} / {fmt_ms(s.get('commit_p99_ms'))} "
            f"| {fmt_bytes(r.get('rss_jvm_peak_bytes'))} | {fmt_bytes(r.get('rss_state_servers_peak_bytes'))} "
            f"| {fmt_bytes(s.get('ckpt_bytes_per_batch_median'))} ({fmt_bytes(_mean_ckpt(s))}) "
            f"| {fmt_rows(s.get('num_rows_total_final'))} "
            f"| {ratio(med, rocks)} | {ratio(med, hdfs)} |")
    return out


def _notes(wl: str, rows: dict[str, dict]) -> list[str]:
    out = []
    for provider in PROVIDER_ORDER:
        r = rows.get(provider)
        if r is None:
            continue
        s = r.get("summary") or {}
        bits = []
        if s.get("seed_batch_ms") is not None:
            bits.append(f"seed batch ({fmt_rows(r.get('seed_rows'))} rows) {fmt_ms(s['seed_batch_ms'])} ms")
        if s.get("warmup_batch_ms"):
            bits.append("warm-up " + ", ".join(fmt_ms(v) for v in s["warmup_batch_ms"]) + " ms")
        bits += r.get("notes") or []
        if r.get("error"):
            bits.append(f"error: `{r['error'].splitlines()[0][:300]}`")
        extra = {k: v for k, v in r.get("confs", {}).items()
                 if k not in ("spark.master", "spark.sql.shuffle.partitions", "spark.ui.enabled",
                              "spark.driver.memory", "spark.ui.showConsoleProgress",
                              "spark.sql.streaming.noDataMicroBatches.enabled",
                              "spark.sql.streaming.stateStore.providerClass",
                              "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled")}
        if extra:
            bits.append("extra confs: " + ", ".join(f"`{k}={v}`" for k, v in extra.items()))
        if bits:
            out.append(f"- {provider}: " + "; ".join(bits))
    return out


def _custom_metrics(rows: dict[str, dict]) -> list[str]:
    """Median per measured batch of every custom metric (summed over operators)."""
    out = []
    for provider in PROVIDER_ORDER:
        r = rows.get(provider)
        if r is None:
            continue
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
        providers = [p for p in PROVIDER_ORDER if p in rows]
        title = f"{wl} {WORKLOADS[wl].title if wl in WORKLOADS else ''}".strip()
        # median batch time
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        meds = [(_median(rows[p]) or 0) / 1000 for p in providers]
        bars = ax.bar(providers, meds, color=[COLORS.get(p, "grey") for p in providers])
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
            ax.plot(xs, ys, "-", color=COLORS.get(p, "grey"), label=p, alpha=0.8)
            mx = [b["batchId"] for b in batches if b.get("phase") == "measured"]
            my = [b["batch_ms"] / 1000 for b in batches if b.get("phase") == "measured"]
            ox = [b["batchId"] for b in batches if b.get("phase") != "measured"]
            oy = [b["batch_ms"] / 1000 for b in batches if b.get("phase") != "measured"]
            ax.plot(mx, my, "o", color=COLORS.get(p, "grey"), ms=4)
            ax.plot(ox, oy, "x", color=COLORS.get(p, "grey"), ms=5)
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
           "| workload | keyedstate ms | keyedstate_ttl ms | ttl ÷ no ttl | TTL cleanup ms/batch (median) | commit p50 ms (no ttl / ttl) |",
           "|---|---:|---:|---:|---:|---:|"]
    for wl, r in rows:
        off, on = r["keyedstate"], r["keyedstate_ttl"]
        cleanup = (_custom_median(on, "keyedstateTtlCleanupMs"))
        out.append(f"| {wl} | {fmt_ms(_median(off))} | {fmt_ms(_median(on))} | {ratio(_median(on), _median(off))} "
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
def _rescale_section(path: Path | None) -> list[str]:
    """The offline rescale comparison (``python3 -m benchmarks.rescale``), if it was run."""
    if path is None or not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"report: cannot read {path}: {exc}", file=sys.stderr)
        return []
    runs = data.get("runs") or {}
    env = data.get("env") or {}
    s = data.get("summary") or {}
    verdict = ""
    if s.get("speedup_spark_over_keyedstate"):
        verdict = (f" Result: keyedstate is **{s['speedup_spark_over_keyedstate']:.2f}× as fast** as Spark "
                   f"(target ≥ {s.get('target_speedup', rescale.TARGET_SPEEDUP):g}×: "
                   f"{'met' if s.get('meets_target') else '**not met**'}).")
    out = ["## Rescale: keyedstate.rescale vs Spark's RocksDB repartition", "",
           f"Offline redistribution of a stopped query's state from {data.get('from_partitions', '?')} to "
           f"{data.get('to_partitions', '?')} partitions: W5's seed shape (`groupBy(value % keys).count()`, one "
           f"seed batch of {fmt_rows(data.get('keys'))} rows = keys), then `keyedstate.rescale(checkpoint, n)` on "
           "keyedstate (default confs) vs `spark._streamingCheckpointManager.repartition(checkpoint, n)` on "
           "RocksDBStateStoreProvider. **rescale s** = wall clock around that one call, in a session that "
           "is already up (JVM start excluded for both; PySpark worker start, which keyedstate's tasks "
           "need, " + ("excluded too: `--warm-workers`" if data.get("warm_workers") else "included") + "). Fresh JVM per provider; afterwards an untimed batch restarts the query on "
           "the rescaled checkpoint and must run with the new partition count and keep every key's "
           "count (**verified**). Peak RSS is over the call only (JVM VmHWM reset before it; Python "
           "workers summed, over-counting shared pages)." + verdict, "",
           f"- Command: `{data.get('command', '?')}`; started {data.get('started_at', '?')}, took "
           f"{(data.get('duration_s') or 0) / 60:.1f} min; commit `{data.get('commit') or '?'}`"
           + (" (uncommitted changes)" if data.get("dirty") else "")
           + f"; {env.get('nproc', '?')} CPUs, pyspark {env.get('pyspark', '?')}, Java {env.get('java', '?')}", ""]
    busy = [p for p, r in runs.items() if contended(r)]
    if busy:
        out += [f"- ⚠ **Contended** ({', '.join(busy)}): other processes used >10% of the CPUs during or just "
                "before the run; timings are not trustworthy.", ""]
    out += rescale.table(data) + [""]
    where = rescale.breakdown(data)
    if where:
        out += ["Where the time went (Spark jobs submitted during the call, from the driver's status store):", ""]
        out += where + [""]
    return out


def render(results: dict[tuple[str, str], dict], out: Path, plots_dir: Path,
           command: str | None = None, duration: str | None = None, plots: bool = True,
           rescale_json: Path | None = WORK_DIR / "rescale.json", commit: str | None = None) -> str:
    by_wl: dict[str, dict[str, dict]] = {}
    for (wl, provider), r in sorted(results.items()):
        by_wl.setdefault(wl, {})[provider] = r
    by_wl = {wl: by_wl[wl] for wl in sorted(by_wl, key=lambda w: (w not in WORKLOADS, w))}
    made = plot(by_wl, plots_dir) if plots else {}

    lines = _header(results, command, duration, commit)
    # summary
    lines += ["## Summary: median batch time (ms)", "",
              "| workload | " + " | ".join(PROVIDER_ORDER) + " | keyedstate ÷ rocksdb | keyedstate ÷ hdfs |",
              "|---|" + "---:|" * (len(PROVIDER_ORDER) + 2)]
    for wl, rows in by_wl.items():
        cells = []
        for p in PROVIDER_ORDER:
            r = rows.get(p)
            cells.append("–" if r is None else fmt_ms(_median(r))
                         + ("" if r.get("status") == "ok" else f" ({r.get('status')})")
                         + (" ⚠" if contended(r) else ""))
        ks = _median(rows.get("keyedstate", {}))
        lines.append(f"| {wl} {WORKLOADS[wl].title if wl in WORKLOADS else ''} | " + " | ".join(cells)
                     + f" | {ratio(ks, _median(rows.get('rocksdb', {})))} | {ratio(ks, _median(rows.get('hdfs', {})))} |")
    lines.append("")
    lines += _ttl_overhead(by_wl)
    for wl, rows in by_wl.items():
        w = WORKLOADS.get(wl)
        any_r = next(iter(rows.values()))
        lines += [f"## {wl}: {w.title if w else ''}", "",
                  f"{w.shape if w else any_r.get('workload_shape', '')}. Key space "
                  f"{fmt_rows(any_r.get('keys'))}; {any_r.get('batches_requested', '?')} measured "
                  f"batches after {any_r.get('warmup_batches', '?')} warm-up"
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
    lines += _rescale_section(rescale_json)
    # The hand-written reading of the numbers (targets, where the time goes, what would close a
    # gap) lives beside the generator, so re-rendering keeps it.
    analysis = BENCH_DIR / "ANALYSIS.md"
    if analysis.exists():
        lines += [analysis.read_text().rstrip(), ""]
    text = "\n".join(lines).rstrip() + "\n"
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
    ap.add_argument("--rescale", type=Path, default=WORK_DIR / "rescale.json",
                    help="rescale comparison to include if present (python3 -m benchmarks.rescale)")
    args = ap.parse_args(argv)
    results = load(args.results)
    if not results:
        print(f"report: no results in {', '.join(args.results)}", file=sys.stderr)
        return 1
    render(results, args.out, args.plots, args.command, args.duration or None, plots=not args.no_plots,
           rescale_json=args.rescale, commit=args.commit)
    print(f"wrote {args.out} ({len(results)} runs) and plots in {args.plots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
