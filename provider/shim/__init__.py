"""The JVM shim: its class names and its jar (built on first use against the installed pyspark)."""
from __future__ import annotations

PROVIDER_CLASS = "io.keyedstate.spark.KeyedStateProvider"
"""The value of ``spark.sql.streaming.stateStore.providerClass`` that selects keyedstate."""
