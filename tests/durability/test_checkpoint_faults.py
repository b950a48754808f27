"""Checkpoint I/O that fails (objtest:// fault injection, support/testjar.py): IOExceptions on
create, rename (before and after its copy), open, list and delete of state files, short reads.
Either Spark's task retry absorbs a fault and the output equals the HDFS provider's, or the query
fails with a message naming the file, and a restart continues exactly."""
from __future__ import annotations

import pytest

from support import testjar
from support.constants import KS, PFX, REFERENCE_PROVIDER, STATE_PREFIX
from support.driver import run_query, session_confs
from support.durability import arm, disarm, objtest_location
from support.faults import judge, run_through_failures
from support.scenarios import KV, KV_STEPS, agg_update

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.usefixtures("fault_root")]

# Snapshots every 2 versions and cleanup keeping 2, so uploads, listings and deletes happen too.
CONFS = {PFX + "snapshotInterval": "2", "spark.sql.streaming.minBatchesToRetain": "2"}
# Each step re-arms these: every step's first matching call of each kind fails (in this JVM,
# which in local mode is the driver and the executor).
EVERY_OPERATION = dict(
    create={"nth": 1, "path": ".ks-changelog"},
    rename={"nth": 2, "path": "ks-", "at": "afterCopy"},  # keyedstate's files: Spark's own operator
    open={"nth": 1, "path": "ks-"},                       # metadata is written and read by the driver
    listStatus={"nth": 3, "path": "/state/"},
    delete={"nth": 1, "path": "/state/"},
)


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    return run_query(spark, REFERENCE_PROVIDER, agg_update, KV, KV_STEPS, root / "checkpoint", root / "input", "update")


@pytest.mark.parametrize("format_version", ["1", "2"])
def test_faults_in_every_checkpoint_operation_are_retried_to_the_same_output(spark, tmp_path, reference,
                                                                             fault_root, format_version):
    location, checkpoint = objtest_location(spark, "faults")

    def rearm(step, query):
        arm(spark, {"shortReads": "true", "rename.existing": "fail"}, **EVERY_OPERATION)

    rearm(-1, None)
    with session_confs(spark, {**CONFS, STATE_PREFIX + "checkpointFormatVersion": format_version}):
        run = run_through_failures(spark, KS, agg_update, KV, KV_STEPS, checkpoint, tmp_path / "input", "update",
                                   location=location, after_step=rearm, restart_after=2)
    disarm(spark)
    verdict = judge(reference, run.outputs)
    assert verdict.exact, "\n".join(verdict.detail)
    kinds = {(f["op"], f["kind"]) for f in testjar.injected_faults(fault_root)}
    # every kind of fault happened at least once, and the task retries absorbed all of them
    assert {("create", "start"), ("rename", "afterCopy"), ("open", "start"), ("listStatus", "start"),
            ("open", "shortRead")} <= kinds, kinds
    assert run.failures == [], run.failures[0][:2000]


def test_a_query_failed_by_faults_says_which_file_and_a_restart_continues_exactly(spark, tmp_path, reference,
                                                                                   fault_root):
    """More failures than Spark retries a task: the query stops, naming the changelog it could
    not write; restarted, it continues exactly (nothing of the failed batch was half committed)."""
    location, checkpoint = objtest_location(spark, "faults")
    failures = []

    def after(step, query):
        if step == 1:  # every attempt of the next commit of partition 0 fails (at the temporary
            # file CheckpointFileManager.createAtomic writes first)
            arm(spark, create={"nth": 1, "times": 8, "path": "/state/0/0/.3.ks-changelog"})

    def on_failure(message):
        failures.append(message)
        disarm(spark)

    with session_confs(spark, CONFS):
        run = run_through_failures(spark, KS, agg_update, KV, KV_STEPS, checkpoint, tmp_path / "input", "update",
                                   location=location, after_step=after, on_failure=on_failure)
    assert len(failures) == 1
    assert "cannot write objtest://" in failures[0] and "/state/0/0/3.ks-changelog" in failures[0], failures[0]
    assert "injected create fault" in failures[0]
    verdict = judge(reference, run.outputs)
    assert verdict.exact, "\n".join(verdict.detail)


def test_an_offset_log_the_ttl_clock_cannot_read_fails_the_query_naming_it(spark, tmp_path, fault_root):
    """TTL's "now" is the batch timestamp in the offset log, so that a re-execution of a batch
    sees the same time. A task that cannot read it fails, naming the file, instead of quietly
    taking the wall clock (which, after downtime longer than the TTL, expires what the first
    attempt kept)."""
    location, checkpoint = objtest_location(spark, "ttl-clock")
    arm(spark, open={"nth": 1, "times": 1000, "path": "/offsets/1"})
    with session_confs(spark, {PFX + "ttl": "1h"}):
        with pytest.raises(Exception, match=r"cannot read the batch timestamp of batch 1 .*offsets/1"):
            run_query(spark, KS, agg_update, KV, KV_STEPS[:2], checkpoint, tmp_path / "input", "update",
                      location=location)
    assert testjar.injected_faults(fault_root)
