"""Shared fixtures: one local SparkSession for the whole run, the provider under test, a TTL
test clock, and hypothesis settings for a loaded 2-core machine."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

CANDIDATE_ENV = "KEYEDSTATE_TEST_PROVIDER"

# No test may depend on the machine's speed: hypothesis examples have no deadline.
settings.register_profile("keyedstate", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("keyedstate")


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent under -p no:xdist
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, tests/storage as one file (support/scheduling.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from support.scheduling import FileOrDirScheduling

    return FileOrDirScheduling(config, log)


def pytest_configure(config):
    # Python UDF workers cannot import the tests' support package: ship it by value.
    from pyspark import cloudpickle

    import support.driver
    import support.scenarios

    for module in (support.driver, support.scenarios):
        cloudpickle.register_pickle_by_value(module)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from pyspark.sql import SparkSession

    import keyedstate
    from support import testjar

    builder = (SparkSession.builder.master("local[2,4]")  # 2 cores, a failed task is tried 4 times
               .appName("keyedstate-tests")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               # snapshot upload and cleanup tests wait for maintenance; don't make them wait 60 s
               .config("spark.sql.streaming.stateStore.maintenanceInterval", "1s"))
    # objtest:// (an object-store-like Hadoop FileSystem, tests/jvm/src) on the shared session, so
    # that checkpoint code runs on a non-file: scheme without a JVM of its own (support/testjar.py)
    # and local files without Hadoop's chmod/readlink child processes (testjar.forkless_local_conf)
    local_files = testjar.forkless_local_conf()
    for key, value in {**testjar.objtest_conf(tmp_path_factory.mktemp("objtest-root")), **local_files}.items():
        builder = builder.config(key, value)
    # The suite is about keyedstate: if the shim does not build, every test must fail loudly.
    session = keyedstate.configure(builder).getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def jvm(spark):
    """The test session's JVM (in local mode also the executor's), for layer tests."""
    return spark._jvm


class TestClock:
    """The processing time keyedstate's TTL sees, in epoch ms, set by the test: a ManualClock
    installed in the JVM (TtlClocks.installForTesting); every store opened while it is installed
    uses it."""

    def __init__(self, jvm, start_ms: int) -> None:
        self._clock = jvm.io.keyedstate.engine.TtlClocks.installForTesting(start_ms)
        self.now_ms = start_ms

    def set(self, now_ms: int) -> None:
        self.now_ms = now_ms
        self._clock.set(now_ms)

    def advance(self, seconds: float) -> None:
        self.set(self.now_ms + int(seconds * 1000))


@pytest.fixture
def ttl_clock(jvm):
    clock = TestClock(jvm, 1_700_000_000_000)
    yield clock
    jvm.io.keyedstate.engine.TtlClocks.uninstallForTesting()


@pytest.fixture(scope="session")
def candidate_provider() -> str:
    """The state store provider under test: keyedstate's, unless $KEYEDSTATE_TEST_PROVIDER names
    another (e.g. Spark's RocksDB provider, to check the harness itself against a known-good one)."""
    from support.constants import KS

    return os.environ.get(CANDIDATE_ENV) or KS


@pytest.fixture(scope="session")
def reference_output(spark, tmp_path_factory):
    """Each scenario's output on Spark's default provider, uninterrupted, computed once per run
    (shared by the operator, rescale and migration tests: it depends on nothing they vary)."""
    from support.constants import REFERENCE_PROVIDER
    from support.driver import run_query

    outputs: dict[str, list] = {}

    def get(scenario) -> list:
        if scenario.name not in outputs:
            root = tmp_path_factory.mktemp("reference")
            output = run_query(spark, REFERENCE_PROVIDER, scenario.build, scenario.schema, scenario.steps,
                               root / "checkpoint", scenario.inputs(root), scenario.mode)
            # the scenario must produce output after the restart point, or it would not test recovery
            assert any(rows for _, rows in output[len(output) // 2:])
            outputs[scenario.name] = output
        return outputs[scenario.name]

    return get
