"""Names every test uses."""
from __future__ import annotations

import keyedstate

PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
KS = keyedstate.PROVIDER_CLASS
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
REFERENCE_PROVIDER = HDFS_PROVIDER
"""Spark's default provider: the reference every keyedstate output is compared with."""
PFX = keyedstate.conf.PREFIX
"""The prefix of keyedstate's confs."""
STATE_PREFIX = "spark.sql.streaming.stateStore."
