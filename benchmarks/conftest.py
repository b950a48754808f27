"""pytest options for the benchmarks (only loaded when pytest is pointed at benchmarks/)."""
from __future__ import annotations

import os
import shlex
import sys
from datetime import datetime, timezone

import pytest

from .workloads import (ON_REQUEST_PROVIDERS, PROVIDER_PYTHON, PROVIDERS, TTL_WORKLOADS, WORKLOADS,
                        register_provider_python)


def _csv(value: str | None, known, what: str) -> list[str]:
    if not value:
        return list(known)
    items = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in items if v not in known]
    if unknown:
        raise ValueError(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return items


def pytest_addoption(parser):
    g = parser.getgroup("keyedstate benchmarks")
    g.addoption("--bench-only", help=f"comma-separated workloads ({','.join(WORKLOADS)}); default all")
    g.addoption("--bench-providers", help=f"comma-separated providers ({','.join(PROVIDERS)}); default all")
    g.addoption("--bench-rows", type=int, help="rows per batch for every workload (default: per workload)")
    g.addoption("--bench-batches", type=int, help="measured batches per run (default: per workload)")
    g.addoption("--bench-warmup", type=int, help="warm-up batches (default: per workload)")
    g.addoption("--bench-conf", action="append", default=[],
                help="extra conf, [provider:]key=value; repeatable")
    g.addoption("--bench-near-cache", default="auto",
                help="keyedstate nearCacheBytes for W5: auto (10%% of state), off, or a size")
    g.addoption("--bench-timeout", type=float, default=300.0, help="seconds per run (default 300)")
    g.addoption("--bench-keep-checkpoints", action="store_true")
    g.addoption("--bench-wait-idle", type=float, default=0.0,
                help="before each run, wait up to this many seconds for the CPUs to be idle")
    g.addoption("--bench-restart", default="default",
                help="workloads that restart in a fresh JVM after their measured batches: default "
                     "(W1,W5), all, none, or a comma-separated list")
    g.addoption("--bench-storage", default="local", choices=("local", "hdfs", "s3a"),
                help="checkpoint storage: local disk, or a MiniDFSCluster / moto S3 behind the counting "
                     "proxy started once for the session (benchmarks/storage.py)")
    g.addoption("--bench-provider-python", action="append", default=[], metavar="NAME=PYTHON",
                help="run provider NAME (a built-in or <built-in>_<suffix>, e.g. keyedstate_before) "
                     "with another interpreter; repeatable; such providers are always run")


def pytest_configure(config):
    config.addinivalue_line("markers", "keyedstate_bench: a workload x provider benchmark run")
    for item in config.getoption("--bench-provider-python", default=[]) or []:
        register_provider_python(item)


def restart_for(option: str, workload: str) -> bool | None:
    """--bench-restart -> RunSpec.restart (None: the workload's default)."""
    if option in ("", "default"):
        return None
    if option == "all":
        return True
    if option == "none":
        return False
    return workload in _csv(option, WORKLOADS, "workloads")


def pytest_generate_tests(metafunc):
    if "pair" not in metafunc.fixturenames:
        return
    opt = metafunc.config.getoption
    workloads = _csv(opt("--bench-only"), WORKLOADS, "workloads")
    providers = _csv(opt("--bench-providers"), PROVIDERS, "providers")
    if not opt("--bench-providers"):
        providers = [p for p in providers if p not in ON_REQUEST_PROVIDERS]
    providers += [p for p in PROVIDER_PYTHON if p not in providers]  # asked for by --provider-python
    pairs = [(w, p) for w in workloads for p in providers
             # keyedstate_ttl runs on W1/W2 unless named explicitly
             if p != "keyedstate_ttl" or w in TTL_WORKLOADS or opt("--bench-providers")
             or p in PROVIDER_PYTHON]
    metafunc.parametrize("pair", pairs, ids=[f"{w}-{p}" for w, p in pairs])


@pytest.fixture(scope="session")
def bench_storage(request):
    """The session's hdfs/s3a storage (benchmarks/storage.py), or None for local disk."""
    kind = request.config.getoption("--bench-storage")
    if kind == "local":
        yield None
        return
    from .storage import BenchStorage

    storage = BenchStorage(kind)
    try:
        yield storage
    finally:
        storage.stop()


INVOCATION = os.environ.get("KEYEDSTATE_BENCH_INVOCATION") or datetime.now(timezone.utc).isoformat(timespec="seconds")
"""Identifies the runs of one invocation, so that the report can tell a merged comparison."""


def bench_command() -> str:
    return os.environ.get("KEYEDSTATE_BENCH_COMMAND") or shlex.join([os.path.basename(sys.executable), "-m", "pytest", *sys.argv[1:]])
