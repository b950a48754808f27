"""Helpers for the durability tests (tests/durability/): checkpoints on the shared session's
objtest:// filesystem (support/testjar.py), and Spark internals reached through py4j."""
from __future__ import annotations

import uuid
from pathlib import Path

OBJTEST_ROOT_CONF = "spark.hadoop.fs.objtest.root"


def objtest_root(spark) -> Path:
    """The local directory behind objtest:// in the shared session (conftest's objtest conf)."""
    root = spark.sparkContext.getConf().get(OBJTEST_ROOT_CONF, None)
    if not root:
        raise RuntimeError("the session has no objtest:// filesystem (conftest's spark fixture sets it up)")
    return Path(root)


def objtest_location(spark, bucket: str = "ckpt") -> tuple[str, Path]:
    """A fresh objtest:// checkpoint location and the local directory its objects live in
    (``objtest://bucket/key`` is the file ``<root>/bucket/key``)."""
    key = uuid.uuid4().hex
    return f"objtest://{bucket}/{key}", objtest_root(spark) / bucket / key


OBJECT_STORE_RULES = {"dirMarkers": "true"}
"""What every durability test runs objtest:// with: mkdirs leaves a marker object, as s3a does
(Spark's own file source log lists its directory before writing to it, which fails on a store
without markers)."""


def arm(spark, rules: dict | None = None, **ops) -> Path:
    """testjar.arm on the shared session's objtest root with :data:`OBJECT_STORE_RULES` kept, so
    that arming faults never changes the store's semantics; returns the root."""
    from support import testjar

    root = objtest_root(spark)
    testjar.arm(root, {**OBJECT_STORE_RULES, **(rules or {})}, **ops)
    return root


def disarm(spark) -> Path:
    """No faults; the object-store semantics stay."""
    return arm(spark)


# ---------------------------------------------------------------------------------------------
# Spark's state store coordinator and loaded providers, through py4j
# ---------------------------------------------------------------------------------------------

RUN_ID_KEY = "sql.streaming.runId"
"""The Hadoop conf key Spark's StateStore sets to the query run id before creating a provider."""


def _stores(spark):
    return spark._jvm.io.keyedstate.testing.StateStores  # tests/jvm/src (the test jar)


def report_active(spark, layer, run_id: str) -> None:
    """Tell the coordinator that ``layer``'s store of run ``run_id`` is active on this executor,
    as StateStore.get does when a task of that run opens it."""
    _stores(spark).reportActive(layer.store_id, run_id)


def deactivate(spark, run_id: str) -> None:
    """What Spark does when a query run stops: the coordinator forgets its instances."""
    _stores(spark).deactivate(run_id)


def stop_maintenance(spark) -> None:
    """Stop Spark's state store maintenance task; the next StateStore.get starts it again with
    that query's maintenanceInterval (the interval is fixed when the task starts)."""
    _stores(spark).stopMaintenance()
