"""One pytest-benchmark entry per workload x provider; each runs in its own subprocess + JVM.

Not part of the test suite (``python3 -m pytest tests``). Run through ``python3 -m benchmarks``
or directly::

    python3 -m pytest benchmarks -n 0 --benchmark-json=benchmarks/.work/results.json \\
        --bench-only W1 --bench-providers hdfs,keyedstate --bench-rows 100000
"""
from __future__ import annotations

import pytest

from .conftest import INVOCATION, bench_command, restart_for
from .workloads import RunSpec, run_pair


@pytest.mark.keyedstate_bench
def test_provider(benchmark, pair, request, bench_storage):
    workload, provider = pair
    opt = request.config.getoption
    spec = RunSpec(workload=workload, provider=provider, rows=opt("--bench-rows"),
                   batches=opt("--bench-batches"), warmup=opt("--bench-warmup"),
                   confs=list(opt("--bench-conf")), near_cache=opt("--bench-near-cache"),
                   timeout=opt("--bench-timeout"), keep_checkpoint=opt("--bench-keep-checkpoints"),
                   wait_idle=opt("--bench-wait-idle"),
                   restart=restart_for(opt("--bench-restart"), workload),
                   provider_python=list(opt("--bench-provider-python")), invocation=INVOCATION)
    benchmark.group = workload
    result = benchmark.pedantic(run_pair, args=(spec,), kwargs={"storage": bench_storage}, rounds=1, iterations=1)
    benchmark.extra_info.update({
        "workload": workload, "provider": provider, "status": result.get("status"),
        "command": bench_command(), "summary": result.get("summary"), "result": result,
    })
    s = result.get("summary") or {}
    r = result.get("restart") or {}
    print(f"\n{workload} {provider}: {result.get('status')} median batch {s.get('median_batch_ms')} ms "
          f"over {s.get('measured_batches')} batches, commit p50 {s.get('commit_p50_ms')} ms"
          + (f"; restart {r.get('status')}: first batch {r.get('first_batch_ms')} ms, "
             f"start() -> done {r.get('start_to_first_batch_s')} s" if r else ""))
    if result.get("status") != "ok":
        pytest.fail(f"{workload}/{provider}: {result.get('status')}: {result.get('error')} "
                    f"(log: {result.get('log')})", pytrace=False)
    if r and r.get("status") not in ("ok", "skipped"):
        pytest.fail(f"{workload}/{provider} restart: {r.get('status')}: {r.get('error')} "
                    f"(log: {result.get('log')})", pytrace=False)
