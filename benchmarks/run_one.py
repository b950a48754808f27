"""Child process: run one (workload, provider) pair and write its JSON result.

Normally started by :func:`benchmarks.workloads.run_pair`; runnable by hand for debugging::

    python3 -m benchmarks.run_one --workload W1 --provider hdfs --rows 100000 --batches 3 \\
        --out /tmp/w1.json --run-dir /tmp/w1
    python3 -m benchmarks.run_one ... --restart    # then restart it in this (fresh) JVM

With ``--restart`` it restarts the query on the checkpoint a previous run left in ``--run-dir``
and adds a ``restart`` entry to that run's ``--out``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .workloads import PROVIDERS, WORKLOADS, RunSpec, register_provider_python, run_in_process, run_restart


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.run_one")
    ap.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--provider", required=True)
    ap.add_argument("--rows", type=int)
    ap.add_argument("--batches", type=int, help="measured batches (default: the workload's)")
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--conf", action="append", default=[])
    ap.add_argument("--provider-python", action="append", default=[], metavar="NAME=PYTHON",
                    help="register a provider run by another interpreter (as the parent did)")
    ap.add_argument("--near-cache", default="auto")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--restart", action="store_true",
                    help="restart the query a previous run left in --run-dir (recovery figure)")
    ap.add_argument("--storage", default="local", choices=("local", "hdfs", "s3a"),
                    help="checkpoint storage (benchmarks/storage.py); hdfs/s3a without --checkpoint: "
                         "started in this process for this run")
    ap.add_argument("--checkpoint", help="the checkpoint URI on hdfs/s3a (given by the parent)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--run-dir", required=True, type=Path)
    args = ap.parse_args(argv)
    for item in args.provider_python:
        register_provider_python(item)
    if args.provider not in PROVIDERS:
        ap.error(f"--provider {args.provider!r}: one of {', '.join(PROVIDERS)}")
    spec = RunSpec(workload=args.workload, provider=args.provider, rows=args.rows,
                   batches=args.batches, warmup=args.warmup, confs=args.conf,
                   near_cache=args.near_cache, timeout=args.timeout,
                   provider_python=args.provider_python, storage=args.storage, checkpoint=args.checkpoint)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    if args.storage != "local" and not args.checkpoint:
        if args.restart:
            ap.error("--restart on hdfs/s3a needs --checkpoint: the storage of the run is gone")
        return _with_own_storage(spec, args.out, args.run_dir)
    if args.restart:
        rec = run_restart(spec, args.out, args.run_dir)["restart"]
        print(json.dumps({k: rec.get(k) for k in ("status", "first_batch_ms", "start_to_first_batch_s", "error")}),
              flush=True)
        return 0 if rec["status"] == "ok" else 1
    result = run_in_process(spec, args.out, args.run_dir)
    s = result.get("summary", {})
    print(json.dumps({"status": result["status"], "median_batch_ms": s.get("median_batch_ms"),
                      "error": result.get("error")}), flush=True)
    return 0 if result["status"] == "ok" else 1


def _with_own_storage(spec: RunSpec, out: Path, run_dir: Path) -> int:
    """A run by hand on hdfs/s3a: the storage lives in this process for the run."""
    from dataclasses import replace

    from .storage import BenchStorage

    storage = BenchStorage(spec.storage, run_dir / "storage")
    try:
        spec = replace(spec, checkpoint=storage.checkpoint_for(spec.slug()),
                       confs=[f"all:{k}={v}" for k, v in storage.confs().items()] + list(spec.confs))
        result = run_in_process(spec, out, run_dir)
        storage.attribute(result)
        out.write_text(json.dumps(result, indent=1, default=str))
    finally:
        storage.stop()
    s = result.get("summary", {})
    print(json.dumps({"status": result["status"], "median_batch_ms": s.get("median_batch_ms"),
                      "requests_per_batch_median": s.get("requests_per_batch_median"),
                      "ckpt_bytes_per_batch_median": s.get("ckpt_bytes_per_batch_median"),
                      "error": result.get("error")}), flush=True)
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
