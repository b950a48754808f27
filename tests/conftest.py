"""Shared fixtures: one local SparkSession for the whole run, and the provider under test."""
from __future__ import annotations

import os

import pytest

CANDIDATE_ENV = "KEYEDSTATE_TEST_PROVIDER"


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
               .config("spark.sql.streaming.stateStore.maintenanceInterval", "1s"))
    # The suite is about keyedstate: if the shim does not build, every test must fail loudly.
    session = keyedstate.configure(builder).getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def candidate_provider() -> str:
    """The state store provider under test: keyedstate's, unless $KEYEDSTATE_TEST_PROVIDER names
    another (e.g. Spark's RocksDB provider, to check the harness itself against a known-good one)."""
    import keyedstate

    return os.environ.get(CANDIDATE_ENV) or keyedstate.PROVIDER_CLASS
