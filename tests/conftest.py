"""Shared fixtures: one local SparkSession for the whole run, and the provider under test."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

CANDIDATE_ENV = "KEYEDSTATE_TEST_PROVIDER"
# TTL tests set "now" through this file (see TtlClock in the shim): a JVM system property,
# given to the test JVM only, so no Spark conf can enable it in production. Empty = real time.
TEST_CLOCK_FILE = Path(tempfile.gettempdir()) / f"keyedstate-test-clock-{os.getpid()}"


def pytest_configure(config):
    # Python UDF workers cannot import the tests' helper modules: ship them by value.
    from pyspark import cloudpickle

    import harness
    import stream_utils

    for module in (harness, stream_utils):
        cloudpickle.register_pickle_by_value(module)


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    import keyedstate

    builder = (SparkSession.builder.master("local[2,4]")  # 2 cores, a failed task is tried 4 times
               .appName("keyedstate-tests")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               # snapshot upload and cleanup tests wait for maintenance; don't make them wait 60 s
               .config("spark.sql.streaming.stateStore.maintenanceInterval", "1s")
               .config("spark.driver.extraJavaOptions",
                       f"-Dkeyedstate.testing.clockFile={TEST_CLOCK_FILE}"))
    # The suite is about keyedstate: if the shim does not build, every test must fail loudly.
    session = keyedstate.configure(builder).getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()
    TEST_CLOCK_FILE.unlink(missing_ok=True)


class TestClock:
    """The processing time keyedstate's TTL sees, in epoch ms, set by the test."""

    def __init__(self, path: Path, start_ms: int) -> None:
        self.path, self.now_ms = path, start_ms
        self.set(start_ms)

    def set(self, now_ms: int) -> None:
        self.now_ms = now_ms
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(str(now_ms))
        tmp.replace(self.path)

    def advance(self, seconds: float) -> None:
        self.set(self.now_ms + int(seconds * 1000))


@pytest.fixture
def ttl_clock(spark):
    clock = TestClock(TEST_CLOCK_FILE, 1_700_000_000_000)
    yield clock
    TEST_CLOCK_FILE.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def candidate_provider() -> str:
    """The state store provider under test: keyedstate's, unless $KEYEDSTATE_TEST_PROVIDER names
    another (e.g. Spark's RocksDB provider, to check the harness itself against a known-good one)."""
    import keyedstate

    return os.environ.get(CANDIDATE_ENV) or keyedstate.PROVIDER_CLASS
