"""``python3 -m benchmarks``: run the selected workload x provider pairs, then write the report.

    python3 -m benchmarks                                   # everything, full scale
    python3 -m benchmarks --only W1,W2 --providers keyedstate,rocksdb --rows 200000 --batches 3
    python3 -m benchmarks --only W5 --providers keyedstate --merge \\
        --conf keyedstate:spark.sql.streaming.stateStore.keyedstate.nearCacheBytes=512m
    python3 -m benchmarks --report-only                     # re-render RESULTS.md and plots/
    python3 -m benchmarks --provider-python keyedstate_before=/path/to/old-venv/bin/python
                                                            # an older keyedstate build side by side
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from . import report
from .workloads import BENCH_DIR, PROVIDERS, REPO_DIR, WORK_DIR, WORKLOADS, register_provider_python

RESULTS_JSON = WORK_DIR / "results.json"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help=f"workloads, comma-separated ({','.join(WORKLOADS)}); default all")
    ap.add_argument("--providers", help=f"providers, comma-separated ({','.join(PROVIDERS)}); default all")
    ap.add_argument("--rows", type=int, help="rows per batch for every selected workload (W3: per side); "
                    "default per workload (W1/W2/W5 1M, W3/W4 200k)")
    ap.add_argument("--batches", type=int, help="measured batches per run (default per workload: W1/W2 10, else 5)")
    ap.add_argument("--warmup", type=int, help="warm-up batches (default per workload: 1, W3 4)")
    ap.add_argument("--conf", action="append", default=[], metavar="[PROVIDER:]KEY=VALUE",
                    help="extra Spark conf for one provider (or all); repeatable")
    ap.add_argument("--near-cache", default="auto",
                    help="keyedstate nearCacheBytes for W5: auto (10%% of the state, set only if "
                         "keyedstate knows the knob), off, or a size such as 512m")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds per run, JVM start included (default 300); the run is stopped "
                         "and reported as a timeout with the batches it finished")
    ap.add_argument("--keep-checkpoints", action="store_true",
                    help="keep each run's scratch dir ($TMPDIR/ksb-<workload>-<provider>-*: checkpoint, tmp)")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="S",
                    help="before each run, wait up to S seconds until other processes use <10%% "
                         "of the CPUs (runs that start or run contended are flagged either way)")
    ap.add_argument("--restart", default="default", metavar="W1,W5|all|none",
                    help="workloads that, after their measured batches, restart the query in a fresh "
                         "JVM and time its first batch (default: W1,W5)")
    ap.add_argument("--storage", default="local", choices=("local", "hdfs", "s3a"),
                    help="checkpoint storage (default local disk): hdfs = a MiniDFSCluster (2 DataNodes, "
                         "replication 2), s3a = moto's S3 server behind a proxy that counts every request; "
                         "started once for the invocation (benchmarks/storage.py)")
    ap.add_argument("--provider-python", action="append", default=[], metavar="NAME=PYTHON",
                    help="run provider NAME with interpreter PYTHON (repeatable). NAME is a provider or "
                         "<provider>_<suffix>, e.g. keyedstate_before=/venvs/ks-14b501e/bin/python: the "
                         "keyedstate provider with that interpreter's keyedstate (jar built from its "
                         "sources), reported side by side with keyedstate. Always run, on every workload")
    ap.add_argument("--json", help=f"pytest-benchmark JSON output (default {RESULTS_JSON}); with "
                    "--report-only, the results to render (default: the last invocation's)")
    ap.add_argument("--out", type=Path, default=BENCH_DIR / "RESULTS.md",
                    help="report file (default benchmarks/RESULTS.md); plots go to plots/ beside it")
    ap.add_argument("--merge", action="store_true",
                    help="report these runs together with earlier ones from benchmarks/.work/runs/ "
                         "(the newest run of each workload x provider wins)")
    ap.add_argument("--report-only", action="store_true", help="do not run, only re-render the report")
    ap.add_argument("--rescale", nargs="+", metavar="JSON",
                    help="rescale results for the report (default benchmarks/.work/rescale.json); "
                         "several: the first's section, all of them in the plot against keys")
    ap.add_argument("--no-report", action="store_true")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args(argv)
    try:
        for item in args.provider_python:
            register_provider_python(item)
    except ValueError as exc:
        ap.error(str(exc))
    command = shlex.join(["python3", "-m", "benchmarks", *argv])
    meta_path = WORK_DIR / "meta.json"
    WORK_DIR.mkdir(parents=True, exist_ok=True)

    json_out = args.json or str(RESULTS_JSON)
    rc = 0
    if not args.report_only:
        import pytest
        # -n 0: not on pyproject.toml's 2 xdist workers (pytest-benchmark turns itself off under xdist)
        pytest_args = [str(BENCH_DIR / "test_providers.py"), "-p", "no:cacheprovider", "-q", "-s", "-n", "0",
                       f"--benchmark-json={json_out}", "--benchmark-columns=min,rounds",
                       f"--bench-timeout={args.timeout}", f"--bench-near-cache={args.near_cache}"]
        if args.batches:
            pytest_args.append(f"--bench-batches={args.batches}")
        if args.only:
            pytest_args.append(f"--bench-only={args.only}")
        if args.providers:
            pytest_args.append(f"--bench-providers={args.providers}")
        if args.rows:
            pytest_args.append(f"--bench-rows={args.rows}")
        if args.warmup is not None:
            pytest_args.append(f"--bench-warmup={args.warmup}")
        if args.wait_idle:
            pytest_args.append(f"--bench-wait-idle={args.wait_idle}")
        if args.keep_checkpoints:
            pytest_args.append("--bench-keep-checkpoints")
        if args.storage != "local":
            pytest_args.append(f"--bench-storage={args.storage}")
        if args.restart != "default":
            pytest_args.append(f"--bench-restart={args.restart}")
        pytest_args += [f"--bench-provider-python={p}" for p in args.provider_python]
        pytest_args += [f"--bench-conf={c}" for c in args.conf] + args.pytest_args
        os.environ["KEYEDSTATE_BENCH_COMMAND"] = command
        started = time.time()
        load_start = round(os.getloadavg()[0], 1)
        os.environ["KEYEDSTATE_BENCH_INVOCATION"] = datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds")
        commit = report.commit_of(REPO_DIR)  # what ran, not what HEAD is when the report is re-rendered
        os.chdir(REPO_DIR)
        rc = int(pytest.main(pytest_args))
        run_meta = json.dumps({
            "command": command, "results": json_out, "merge": args.merge,
            "started_at": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
            "duration_s": round(time.time() - started, 1), "pytest_exit_code": rc, "commit": commit,
            "storage": args.storage, "loadavg_start": load_start, "loadavg_end": round(os.getloadavg()[0], 1)},
            indent=1)
        meta_path.write_text(run_meta)
        _meta_of(json_out).write_text(run_meta)
    if args.no_report:
        return rc
    last = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    results = args.json or last.get("results", str(RESULTS_JSON))
    # The header (command, duration, commit) is that of the invocation that wrote `results`: a
    # later invocation (a profile with --no-report) must not relabel an earlier report.
    own = _meta_of(results)
    meta = json.loads(own.read_text()) if own.exists() else (last if last.get("results") == results else {})
    sources = [str(WORK_DIR / "runs")] if (meta.get("merge") or args.merge) else []
    if os.path.exists(results):
        sources.append(results)
    if not sources:
        print(f"no results found ({results})", file=sys.stderr)
        return rc or 1
    report.main([*sources, "--command", meta.get("command", command),
                 "--duration", str(meta.get("duration_s", "")),
                 "--out", str(args.out), "--plots", str(args.out.parent / "plots")]
                + (["--no-plots"] if meta.get("storage", "local") != "local" else [])
                + (["--commit", meta["commit"]] if meta.get("commit") else [])
                + (["--rescale", *args.rescale] if args.rescale else []))
    return rc


def _meta_of(results: str) -> Path:
    """Where an invocation's command, duration and commit are kept beside its results."""
    return Path(results).with_suffix(".meta.json")


if __name__ == "__main__":
    sys.exit(main())
