"""keyedstate rescale with real Spark: a query stopped at N1 partitions, rescaled to N2 and
restarted gives, batch for batch, the output of an uninterrupted run (stateful results do not
depend on the partition count); interrupted rescales can be rerun or rolled back; bad
checkpoints are refused with a message that says what and where.

The rescale writes one repartition batch (as Spark's own repartition does), so the restarted
query's batch ids are one higher than the uninterrupted run's after that point.
"""
from __future__ import annotations

import json
import re
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

import keyedstate
from keyedstate import checkpoint as ckpt
from keyedstate.formats import key_group_counts, keygroups, layout
from keyedstate.offline import remote, rescaling
from keyedstate.offline.rescale.routing import write_skipping
from keyedstate.offline.storage import HadoopStorage, LocalStorage
from keyedstate.checkpoint import Checkpoint
from support.constants import HDFS_PROVIDER, PROVIDER_CONF
from support.driver import FileStream, assert_same_output, collect_into, run_query, session_confs
from support.offline import kill_rescale_after, rescale_cli, to_objtest
from support.rescale_query import (
    await_every_file_listed as _await_every_file_listed, await_snapshots as _await_snapshots,
    batch_rows as _batch_rows, count_by_key as _agg, expected as _expected, files_of_partitions as _files_of,
    marker_files as _markers, partition_listings, run as _run, snapshotted_query as _snapshotted_query)
from support.scenarios import SCENARIOS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

KEY_GROUPS = 201600  # the default: divisible by 1..10, 12, 16, 20, 32, ...; not by 11 or 13
RESTART_AFTER = 2


@dataclass(frozen=True)
class Case:
    scenario: str
    before: int
    after: int

    @property
    def id(self) -> str:
        how = "whole-key-groups" if KEY_GROUPS % self.after == 0 else "rehash"
        return f"{self.scenario}-{self.before}to{self.after}-{how}"


CASES = [
    Case("aggregation-update", 2, 4),  # up
    Case("drop-duplicates", 4, 2),  # down
    Case("drop-duplicates-within-watermark", 3, 11),  # up, 11 does not divide the key groups
    Case("stream-stream-inner-join", 2, 5),  # four stores per partition
    Case("stream-stream-left-outer-join", 4, 3),  # down, neither count a multiple of the other
    Case("session-window-append", 2, 11),  # prefix-scan keys, rehashed
    Case("window-aggregation-append", 11, 2),  # from a count that does not divide, down
    Case("pandas-with-state-event-time-timeout", 4, 1),  # down to one partition
]


def _scenario(name: str):
    return next(s for s in SCENARIOS if s.name == name)


def _shift_after(output, batch: int):
    """The candidate's batch ids without the repartition batch ``batch`` (ids above it - 1)."""
    return [(b - 1 if b > batch else b, rows) for b, rows in output]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_rescaled_query_gives_the_uninterrupted_output(spark, tmp_path, case, reference_output):
    scenario = _scenario(case.scenario)
    reference = reference_output(scenario)
    results = []

    def rescale(checkpoint: Path) -> None:
        results.append(keyedstate.rescale(checkpoint, case.after, spark=spark))

    with session_confs(spark, {"spark.sql.shuffle.partitions": str(case.before)}):
        candidate = run_query(spark, keyedstate.PROVIDER_CLASS, scenario.build, scenario.schema, scenario.steps,
                              tmp_path / "candidate" / "checkpoint", scenario.inputs(tmp_path / "candidate"),
                              scenario.mode, restart_after=RESTART_AFTER, on_restart=rescale)
    (result,) = results
    assert (result.from_partitions, result.to_partitions) == (case.before, case.after)
    assert result.whole_key_groups == (KEY_GROUPS % case.after == 0)
    assert result.stores == (4 if scenario.multi else 1)
    assert any(rows for b, rows in candidate if b > result.batch), "no output after the rescale"
    assert_same_output(reference, _shift_after(candidate, result.batch))

    report = keyedstate.inspect(tmp_path / "candidate" / "checkpoint")
    op = report["operators"][0]
    assert op["numPartitions"] == case.after
    for store in op["stores"]:
        assert len(store["partitions"]) == case.after
        if KEY_GROUPS % case.after == 0:
            assert store["distribution"]["misplacedKeys"] == 0


@pytest.mark.parametrize("snapshots", [False, True], ids=["changelogs-only", "from-snapshots"])
def test_scale_up_by_a_multiple_moves_whole_key_groups(spark, tmp_path, snapshots):
    """4 -> 8 takes each new partition from one old one: changelogs are routed by key group
    straight into the new partitions; a snapshot is scanned once into each heir's SST files."""
    stream = FileStream(spark, tmp_path, "k LONG")
    out: dict = {}
    interval = {"spark.sql.streaming.stateStore.keyedstate.snapshotInterval": "1" if snapshots else "100"}
    with session_confs(spark, interval):
        _run(spark, stream, range(3), out)
    stores = ckpt.discover_stores(Path(stream.checkpoint) / "state" / "0")["default"]
    if snapshots:  # maintenance (every second in the tests) uploads them
        deadline = time.monotonic() + 60
        while not all(s.snapshots for s in stores):
            assert time.monotonic() < deadline, "no snapshot uploaded"
            time.sleep(0.5)
            stores = ckpt.discover_stores(Path(stream.checkpoint) / "state" / "0")["default"]
    else:
        assert not any(s.snapshots for s in stores)
    result = keyedstate.rescale(stream.checkpoint, 8, spark=spark)
    assert result.whole_key_groups and result.keys == len(_expected(3))
    # splits by files run in the driver's worker processes; changelog routing runs as Spark tasks
    assert result.splits_in_driver == snapshots, result
    report = keyedstate.inspect(stream.checkpoint)
    store = report["operators"][0]["stores"][0]
    assert len(store["partitions"]) == 8 and store["distribution"]["misplacedKeys"] == 0
    assert sum(p["keys"] for p in store["partitions"]) == len(_expected(3))
    for p in store["partitions"]:  # the snapshot's recorded count is the exact one Spark reports
        files = ckpt.list_store(Path(p["path"]), p["partitionId"])
        version = result.batch + 1
        assert ckpt.read_manifest(files.manifest_path(version), version).num_keys == p["keys"] > 0
    _run(spark, stream, range(3, 5), out)
    assert out == _expected(5)


def test_a_rescaled_checkpoint_rescales_again(spark, tmp_path):
    """The snapshots a changelog-only scale-up publishes (changelogs to replay) are read back by
    the next rescale, here a rehash to a count that does not divide the key groups."""
    stream = FileStream(spark, tmp_path, "k LONG")
    out: dict = {}
    with session_confs(spark, {"spark.sql.streaming.stateStore.keyedstate.snapshotInterval": "100"}):
        _run(spark, stream, range(3), out)
    first = keyedstate.rescale(stream.checkpoint, 8, spark=spark)
    second = keyedstate.rescale(stream.checkpoint, 11, spark=spark)
    assert (first.to_partitions, second.from_partitions, second.to_partitions) == (8, 8, 11)
    assert first.keys == second.keys == len(_expected(3)) and not second.whole_key_groups
    _run(spark, stream, range(3, 5), out)
    assert out == _expected(5)
    assert keyedstate.inspect(stream.checkpoint)["operators"][0]["numPartitions"] == 11


def _restart_error(spark, stream: FileStream) -> str:
    with session_confs(spark, {PROVIDER_CONF: keyedstate.PROVIDER_CLASS}):
        query = stream.start(_agg, lambda df, _: df.write.format("noop").mode("overwrite").save())
        try:
            query.processAllAvailable()
        except Exception as exc:  # StreamingQueryException
            return str(exc)
        finally:
            query.stop()
    return ""


def _feed(spark, checkpoint: str, start: int, end: int | None = None) -> set:
    reader = (spark.read.format("statestore").option("readChangeFeed", True)
              .option("changeStartBatchId", start))
    if end is not None:
        reader = reader.option("changeEndBatchId", end)
    return {(r.batch_id, r.change_type, r.key.k, r.value[0]) for r in reader.load(checkpoint).collect()}


def _expected_feed(inputs: range, batch_of) -> set:
    """The change feed of the W1-shaped aggregation: each key of input ``i`` updated to its
    count so far, in batch ``batch_of(i)``."""
    counts: dict[int, int] = {}
    rows = set()
    for i in range(inputs.stop):
        for row in _batch_rows(i):
            counts[row["k"]] = counts.get(row["k"], 0) + 1
            if i in inputs:
                rows.add((batch_of(i), "update", row["k"], counts[row["k"]]))
    return rows


def _state(spark, checkpoint: str, **options) -> set:
    reader = spark.read.format("statestore")
    for key, value in options.items():
        reader = reader.option(key, value)
    return {(r.key.k, r.value[0], r.partition_id) for r in reader.load(checkpoint).collect()}


def test_state_reads_and_metadata_across_a_rescale(spark, tmp_path):
    """After a 4 -> 2 rescale (batch 3) the state data source reads from the rescale batch on:
    its change feed (no rows for the rescale batch itself, which changes no value) and snapshot
    replays; one that starts before it is refused in one line naming the batch that works
    (Spark opens only the end batch's partitions: a feed through a scale-down would lose the
    retired partitions' changes). State-metadata shows the new count before the restart. The
    command prints its result once, with progress lines on stderr and no console progress bar."""
    stream = FileStream(spark, tmp_path, "k LONG")
    out: dict = {}
    _run(spark, stream, range(3), out)
    ck = stream.checkpoint

    proc = rescale_cli("--checkpoint", ck, "--partitions", "2")
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert len(stdout.splitlines()) == 1, stdout
    result = json.loads(stdout)
    assert (result["batch"], result["to_partitions"]) == (3, 2)
    assert "RescaleResult" not in stderr and "to_partitions" not in stderr, stderr  # printed once
    assert "[Stage " not in stdout + stderr, stderr  # Spark's console progress bar
    for phase, total in (("split", 4), ("merge", 2)):
        assert f"keyedstate.offline.rescaling: {phase} {total}/{total} store partitions done" in stderr, stderr

    metadata = spark.read.format("state-metadata").load(ck).collect()
    assert [r.numPartitions for r in metadata] == [2]

    _run(spark, stream, range(3, 5), out, partitions=2)  # batches 4 and 5
    assert out == _expected(5)
    after = lambda i: i + 1 if i >= 3 else i  # noqa: E731 (input 3 runs as batch 4)
    assert _feed(spark, ck, 3) == _expected_feed(range(3, 5), after)
    assert _feed(spark, ck, 5) == _expected_feed(range(4, 5), after)
    assert _feed(spark, ck, 3, 3) == set()
    assert _feed(spark, ck, 0, 2) == _expected_feed(range(0, 3), after)  # before it: the old partitions
    with pytest.raises(Exception) as refused:
        _feed(spark, ck, 1)
    assert re.search(r"keyedstate: changeStartBatchId 1 is before batch 3, which rescaled the operator to 2 "
                     r"partitions \(from 4\): [^\n]*start at changeStartBatchId 3 or later", str(refused.value))

    latest = _state(spark, ck)
    assert {k for k, _, _ in latest} == set(_expected(5))
    for partition in (0, 1):  # the rescale's snapshot (batch 3) replayed to the last batch
        replayed = _state(spark, ck, snapshotStartBatchId=3, snapshotPartitionId=partition)
        assert replayed == {row for row in latest if row[2] == partition} and replayed
    with pytest.raises(Exception) as refused:
        _state(spark, ck, snapshotStartBatchId=1, snapshotPartitionId=0)
    assert re.search(r"keyedstate: snapshotStartBatchId 1 is before batch 3, which rescaled the operator to 2 "
                     r"partitions \(from 4\): [^\n]*start at snapshotStartBatchId 3 or later", str(refused.value))


@pytest.mark.parametrize("kill_after", ["offsets/", "split:"])
def test_rescale_killed_midway_and_rerun_gives_the_same_result(spark, tmp_path, kill_after):
    stream = FileStream(spark, tmp_path, "k LONG")
    out: dict = {}
    _run(spark, stream, range(3), out)

    proc = rescale_cli("--checkpoint", stream.checkpoint, "--partitions", "8")
    seen = kill_rescale_after(proc, kill_after)
    assert proc.returncode == -signal.SIGKILL, seen

    # Spark refuses to run the half-done repartition batch ...
    assert "STREAMING_UNFINISHED_REPARTITION_DETECTED" in _restart_error(spark, stream)
    # ... a rescale to another count is refused, naming what to do ...
    with pytest.raises(keyedstate.RescaleError, match="unfinished repartition to 8 partitions.*--partitions 8"):
        keyedstate.rescale(stream.checkpoint, 2, spark=spark)
    # ... and rerunning it finishes it.
    result = keyedstate.rescale(stream.checkpoint, 8, spark=spark)
    assert result.resumed and result.to_partitions == 8 and result.keys == len(_expected(3))
    assert not (Path(stream.checkpoint) / "_keyedstate_rescale").exists()

    _run(spark, stream, range(3, 5), out, partitions=2)  # the session's count no longer matters
    assert out == _expected(5)
    report = keyedstate.inspect(stream.checkpoint)
    assert report["operators"][0]["numPartitions"] == 8
    assert report["operators"][0]["stores"][0]["totalKeys"] == len(_expected(5))


def test_orphan_of_sparks_own_repartition_is_detected_and_rolled_back(spark, tmp_path):
    stream = FileStream(spark, tmp_path, "k LONG")
    out: dict = {}
    _run(spark, stream, range(2), out)
    # Spark's own repartition refuses a custom provider, after writing offsets/2.
    with pytest.raises(Exception, match="UNSUPPORTED_PROVIDER"):
        spark._streamingCheckpointManager.repartition(stream.checkpoint, 3)
    assert (Path(stream.checkpoint) / "offsets" / "2").is_file()
    assert "STREAMING_UNFINISHED_REPARTITION_DETECTED" in _restart_error(spark, stream)

    with pytest.raises(keyedstate.RescaleError) as err:
        keyedstate.rescale(stream.checkpoint, 8, spark=spark)
    assert "Spark's own repartition" in str(err.value) and "--rollback" in str(err.value)

    rollback = rescale_cli("--checkpoint", stream.checkpoint, "--rollback")
    stdout, stderr = rollback.communicate(timeout=180)
    assert rollback.returncode == 0, stderr
    assert json.loads(stdout) == {"rolledBack": True}
    assert not (Path(stream.checkpoint) / "offsets" / "2").exists()
    assert not (Path(stream.checkpoint) / "offsets" / ".2.crc").exists()

    _run(spark, stream, range(2, 4), out)  # the old count (4) again, nothing lost
    assert out == _expected(4)


def test_failed_last_batch_is_refused_unless_skipped(spark, tmp_path):
    stream = FileStream(spark, tmp_path, "k LONG")
    out: dict = {}
    _run(spark, stream, range(3), out)
    root = Path(stream.checkpoint)
    # Batch 2 ran (its state version 3 is on disk) but never committed: a failure before the commit.
    (root / "commits" / "2").unlink()
    (root / "commits" / ".2.crc").unlink(missing_ok=True)

    with pytest.raises(keyedstate.RescaleError, match=r"started \d+ s ago and has not committed: the query looks running"):
        keyedstate.rescale(root, 8, spark=spark)
    with pytest.raises(keyedstate.RescaleError, match="last batch 2 .* did not commit.*--skip-failed-batch"):
        keyedstate.rescale(root, 8, spark=spark, idle_seconds=0)
    result = keyedstate.rescale(root, 8, spark=spark, idle_seconds=0, skip_failed_batch=True)
    assert result.batch == 3 and result.keys == len(_expected(2))  # the state of batch 1

    # Batch 2 is dropped: its input never reaches the state, later batches count on top of batch 1.
    _run(spark, stream, range(3, 5), out)
    kept = [0, 1, 3, 4]
    expected: dict[int, int] = {}
    for b in kept:
        for row in _batch_rows(b):
            expected[row["k"]] = expected.get(row["k"], 0) + 1
    updated = {row["k"] for b in (3, 4) for row in _batch_rows(b)}
    assert {k: out[k] for k in updated} == {k: expected[k] for k in updated}
    assert keyedstate.inspect(root)["operators"][0]["stores"][0]["totalKeys"] == len(expected)


def test_rescale_after_skipping_a_failed_batch_resumes_from_the_committed_state(spark, tmp_path):
    stream = FileStream(spark, tmp_path, "k LONG")
    out: dict = {}
    _run(spark, stream, range(3), out)
    root = Path(stream.checkpoint)
    (root / "commits" / "2").unlink()  # batch 2 ran, its state version 3 is on disk, never committed
    (root / "commits" / ".2.crc").unlink(missing_ok=True)

    proc = rescale_cli("--checkpoint", stream.checkpoint, "--partitions", "8", "--skip-failed-batch",
                       "--idle-seconds", "0")
    seen = kill_rescale_after(proc, "split:")
    assert proc.returncode == -signal.SIGKILL, seen
    # The skip is in the rescale's journal; it is committed only together with the new batch.
    assert not (root / "commits" / "2").exists()
    assert json.loads((root / "_keyedstate_rescale" / "batch-3" / "journal.json").read_text())["skipped"] == [2]

    # The rerun must read batch 1's state (version 2), not the skipped batch's version 3.
    result = keyedstate.rescale(root, 8, spark=spark)
    assert result.resumed and result.batch == 3 and result.keys == len(_expected(2))
    assert (root / "commits" / "2").is_file() and (root / "commits" / "3").is_file()


def test_failed_rescale_leaves_a_skipped_batch_as_it_was(spark, tmp_path):
    """A batch that committed its state in some partitions only, then a rescale with
    --skip-failed-batch that fails: the rollback leaves the batch uncommitted (not half
    skipped), so the restarted query reruns it and continues exactly."""
    stream = FileStream(spark, tmp_path, "k LONG")
    out: dict = {}
    with session_confs(spark, {"spark.sql.streaming.stateStore.keyedstate.snapshotInterval": "100"}):
        _run(spark, stream, range(3), out)
    root = Path(stream.checkpoint)
    # Batch 2 committed its state version 3 in partitions 0 and 1 only, then the query died.
    (root / "commits" / "2").unlink()
    (root / "commits" / ".2.crc").unlink(missing_ok=True)
    op = root / "state" / "0"
    for p in (2, 3):
        (ckpt.store_dir(op, p, "default") / "3.ks-changelog").unlink()
    # The rescale fails on an unreadable file (a transient read error, restored below).
    victim = ckpt.store_dir(op, 1, "default") / "2.ks-changelog"
    good = victim.read_bytes()
    victim.write_bytes(good[:-5])
    with pytest.raises(Exception, match=str(victim)):
        keyedstate.rescale(root, 8, spark=spark, idle_seconds=0, skip_failed_batch=True)
    victim.write_bytes(good)
    assert not (root / "commits" / "2").exists() and not (root / "offsets" / "3").exists()
    assert not (root / "_keyedstate_rescale").exists()

    # The restart reruns batch 2 with the old partition count, then goes on.
    _run(spark, stream, range(3, 5), out)
    assert out == _expected(5)


def test_foreign_or_unready_checkpoints_are_refused(spark, tmp_path):
    hdfs = FileStream(spark, tmp_path / "hdfs", "k LONG")
    with session_confs(spark, {PROVIDER_CONF: HDFS_PROVIDER}):
        query = hdfs.start(_agg, collect_into({}))
        try:
            hdfs.step(query, _batch_rows(0))
        finally:
            query.stop()
    with pytest.raises(keyedstate.RescaleError, match="HDFSBackedStateStoreProvider, not keyedstate"):
        keyedstate.rescale(hdfs.checkpoint, 4, spark=spark)

    stream = FileStream(spark, tmp_path / "ks", "k LONG")
    _run(spark, stream, range(1), {}, partitions=4)
    with pytest.raises(keyedstate.RescaleError, match="already runs with 4 partitions"):
        keyedstate.rescale(stream.checkpoint, 4, spark=spark)
    with pytest.raises(keyedstate.RescaleError, match="partitions must be an integer >= 1"):
        keyedstate.rescale(stream.checkpoint, 0, spark=spark)
    with pytest.raises(keyedstate.RescaleError, match="no unfinished repartition to roll back"):
        keyedstate.rescale(stream.checkpoint, 4, spark=spark, rollback=True)
    missing = tmp_path / "nowhere"
    with pytest.raises(keyedstate.RescaleError, match=f"{missing} has no offsets/ directory"):
        keyedstate.rescale(missing, 4, spark=spark)

    # A corrupt changelog fails the split task with the file's name; nothing is committed.
    victim = ckpt.store_dir(Path(stream.checkpoint) / "state" / "0", 1, "default") / "1.ks-changelog"
    victim.write_bytes(victim.read_bytes()[:-5])
    with pytest.raises(Exception, match=str(victim)):
        keyedstate.rescale(stream.checkpoint, 2, spark=spark)
    # ... and the repartition batch it had started is rolled back: the query can restart as it was.
    assert not (Path(stream.checkpoint) / "commits" / "1").exists()
    assert not (Path(stream.checkpoint) / "offsets" / "1").exists()


def test_checkpoint_format_2_is_refused_by_rescale_migrate_and_inspect(spark, tmp_path, monkeypatch):
    """Queries run under checkpointFormatVersion=2 (test_operators), but rescale and migrate
    rewrite the offset and commit logs, whose format-2 entries pin every file by its unique id,
    and inspect reads files by version alone: each refuses it, naming the commit, and leaves the
    checkpoint as it was."""
    stream = FileStream(spark, tmp_path / "ks", "k LONG")
    with session_confs(spark, {PROVIDER_CONF: keyedstate.PROVIDER_CLASS, "spark.sql.shuffle.partitions": "4",
                               "spark.sql.streaming.stateStore.checkpointFormatVersion": "2"}):
        query = stream.start(_agg, collect_into({}))
        try:
            stream.step(query, _batch_rows(0))
        finally:
            query.stop()
    root = Path(stream.checkpoint)
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    with pytest.raises(keyedstate.RescaleError, match=r"commits.0: the query runs with .*checkpointFormatVersion=2 .*format 1 only"):
        keyedstate.rescale(stream.checkpoint, 2, spark=spark)
    with pytest.raises(keyedstate.MigrateError, match=r"commits.0: checkpoint format version 2 .* not supported by migrate"):
        keyedstate.migrate(stream.checkpoint, "rocksdb", spark=spark)
    with pytest.raises(keyedstate.InspectError, match=r"commits.0: checkpoint format version 2 .*inspect reads format 1 only"):
        keyedstate.inspect(stream.checkpoint)
    # A rollback is not refused (Spark's own repartition leaves its orphan under format 2 too).
    with pytest.raises(keyedstate.RescaleError, match="no unfinished repartition to roll back"):
        keyedstate.rescale(stream.checkpoint, 4, spark=spark, rollback=True)
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before
    # On an object store the tools run on a local copy; the refusal names the checkpoint's own
    # path and comes before the state is downloaded for nothing.
    uri = to_objtest(spark, root)
    fetched = []
    fetch = HadoopStorage.fetch
    monkeypatch.setattr(HadoopStorage, "fetch", lambda self, path, *a, **k: (fetched.append(path),
                                                                            fetch(self, path, *a, **k)))
    with pytest.raises(keyedstate.RescaleError, match=re.escape(f"{uri}/commits/0: the query runs with")):
        remote.rescale_anywhere(uri, 2, spark=spark)
    with pytest.raises(keyedstate.InspectError, match=re.escape(f"{uri}/commits/0: checkpoint format version 2")):
        remote.inspect_anywhere(uri, spark=spark)
    assert [p for p in fetched if "/state/" in p] == []


@pytest.mark.parametrize("entry,expected", [
    (None, 1),
    ('v1\n{"nextBatchWatermarkMs":0}', 1),
    ('v2\n{"nextBatchWatermarkMs":0}', 2),  # a v2 entry is format 2 even without ids
    ('v3\n{"nextBatchWatermarkMs":0,"stateUniqueIds":{}}', 2),
    ('v3\n{"nextBatchWatermarkMs":0}', 1),
], ids=["missing", "v1", "v2-without-ids", "v3-with-ids", "v3-without-ids"])
def test_the_checkpoint_format_is_read_from_the_commit_log_as_spark_reads_it(tmp_path, entry, expected):
    """Spark's rule on restart (CheckpointVersionManager), which rescale and migrate share."""
    (tmp_path / "commits").mkdir()
    if entry is not None:
        (tmp_path / "commits" / "0").write_text(entry)
    assert Checkpoint(LocalStorage(tmp_path)).checkpoint_format(0) == expected


def test_a_failed_rescale_of_large_partitions_leaves_nothing_behind(spark, tmp_path):
    """One split task fails (a corrupt changelog) while the others rehash large partitions;
    the rollback waits until no task runs (a failed job's other tasks are not interrupted),
    then removes what the run wrote: no file of the repartition batch, no new partition or
    staging directory is left, and the query restarts as it was. (A task that runs on after
    the rollback: see the next test.)"""
    stream = FileStream(spark, tmp_path, "k LONG")
    big = [{"k": k} for k in range(300_000)]
    with session_confs(spark, {PROVIDER_CONF: keyedstate.PROVIDER_CLASS, "spark.sql.shuffle.partitions": "4"}):
        query = stream.start(_agg, lambda df, _: df.write.format("noop").mode("overwrite").save())
        try:
            stream.step(query, big)
        finally:
            query.stop()
    root = Path(stream.checkpoint)
    op = root / "state" / "0"
    time.sleep(3)  # the stopped query's last snapshot uploads are done
    before = sorted(str(p.relative_to(root)) for p in op.rglob("*"))
    victim = ckpt.store_dir(op, 1, "default") / "1.ks-changelog"
    good = victim.read_bytes()
    victim.write_bytes(good[:-5])
    started = time.monotonic()
    with pytest.raises(Exception, match=str(victim)):
        keyedstate.rescale(root, 5, spark=spark)  # 5 does not divide the key groups: every key rehashed
    victim.write_bytes(good)
    rescale_s = time.monotonic() - started

    time.sleep(3)  # a zombie that were still running would publish meanwhile
    after = sorted(str(p.relative_to(root)) for p in op.rglob("*"))
    assert after == before, sorted(set(after) ^ set(before))  # nothing of the repartition batch is left
    assert not (root / "_keyedstate_rescale").exists() and not (root / "offsets" / "1").exists()
    print(f"rescale failed and rolled back in {rescale_s:.1f} s")

    out: dict = {}
    _run(spark, stream, range(1, 2), out)  # batch 1 on the old 4 partitions, on top of the big batch
    assert out == {row["k"]: 1 + (row["k"] < 300_000) for row in _batch_rows(1)}


class _RecordingRescale(rescaling._Rescale):
    """keyedstate.rescale that keeps the tasks it gave Spark, to run one again later."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.jobs: list[tuple] = []

    def _run_tasks(self, fn, tasks, phase, **options):
        self.jobs.append((fn, tasks))
        return super()._run_tasks(fn, tasks, phase, **options)


def test_a_task_of_a_failed_rescale_that_runs_late_publishes_nothing(spark, tmp_path):
    """A split task of a failed rescale job that runs after the rollback -- as on an executor
    that lost contact with the driver and never got the kill (in local mode Spark kills a
    failed job's Python tasks within a second, before a rollback starts) -- must not publish
    into the checkpoint. Here the job's own split of partition 0 runs again, for real, after
    the rollback; from a changelogs-only checkpoint scaled 2 -> 4 it would publish partitions
    0 and 2 of the new layout. It fails instead, and leaves no file anywhere."""
    stream = FileStream(spark, tmp_path, "k LONG")
    with session_confs(spark, {"spark.sql.streaming.stateStore.keyedstate.snapshotInterval": "100"}):
        _run(spark, stream, range(2), {}, partitions=2)  # changelogs only: the splits publish
    root = Path(stream.checkpoint)
    time.sleep(2)  # the stopped query's maintenance is done
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*") if "/." not in f"/{p.relative_to(root)}")
    victim = ckpt.store_dir(root / "state" / "0", 1, "default") / "2.ks-changelog"
    good = victim.read_bytes()
    victim.write_bytes(good[:64])
    recorder = _RecordingRescale(spark, root, 4)
    with pytest.raises(Exception, match=str(victim)):
        recorder.run(False, False, 30.0)
    victim.write_bytes(good)

    split, tasks = recorder.jobs[0]
    (late,) = [task for task in tasks if task.partition == 0]
    with pytest.raises(OSError):
        split(late)  # its staging was moved away by the rollback
    after = sorted(str(p.relative_to(root)) for p in root.rglob("*") if "/." not in f"/{p.relative_to(root)}")
    assert after == before, sorted(set(after) ^ set(before))
    assert not (root / "_keyedstate_rescale").exists()

    out: dict = {}
    _run(spark, stream, range(2, 3), out, partitions=2)  # restarts as it was, on 2 partitions
    expected = _expected(3)
    assert out == {row["k"]: expected[row["k"]] for row in _batch_rows(2)}


def _split_task(tmp_path: Path, partition: int, from_partitions: int, partitions: int) -> rescaling._SplitTask:
    direct = partitions % from_partitions == 0
    return rescaling._SplitTask(0, "default", str(tmp_path / "old"), partition, 1, str(tmp_path / "staging"),
                                partitions, KEY_GROUPS, None, direct, from_partitions, 2, str(tmp_path / "new"),
                                {"batch": 1, "fromPartitions": from_partitions, "toPartitions": partitions}, None)


def _old_partition(path: Path, groups) -> dict[bytes, bytes]:
    """A RocksDB holding 40 keys in each of ``groups``, as a rebuilt old partition does."""
    from keyedstate.formats import keygroups, rocksdb

    data = {keygroups.prefix(g) + b"key-%04d" % i: b"value-%d-%d" % (g, i) * 3 for g in groups for i in range(40)}
    db = rocksdb.open_db(path, bulk_load=False)
    for k, v in data.items():
        db[k] = v
    db.flush()
    db.close()
    return data


def test_a_direct_split_writes_each_heir_in_bounded_files_and_refuses_a_foreign_key_group(tmp_path, monkeypatch):
    """Old partition 1 of 2 splits into new partitions 1 and 3 of 4 in one scan: each heir gets
    exactly its key groups' keys, in files that stop at about SST_FILE_BYTES (a later compaction then
    rewrites a file, not the partition), and ingested they read back whole. A key of a key group
    the old partition does not own is refused with a message naming it, not routed or dropped."""
    from keyedstate.formats import keygroups, rocksdb

    monkeypatch.setattr(rocksdb, "SST_FILE_BYTES", 8 << 10)
    groups = range(1, 2000, 2)  # owned by partition 1 of 2
    data = _old_partition(tmp_path / "db", groups)
    task = _split_task(tmp_path, 1, 2, 4)
    (tmp_path / "work").mkdir()
    db = ckpt.open_copy(tmp_path / "db", read_only=True)
    try:
        out = rescaling._HeirFiles(tmp_path / "work", 2)
        counts = rescaling._write_by_key_group(db, task, out)
        files = out.finish()
    finally:
        db.close()
    assert set(files) == {1, 3} and all(len(paths) > 3 for paths in files.values())
    # the same pass with heir 1's key groups passed over (it is built on this partition's
    # files): heir 3's keys alone, and every key group met, skipped or not
    (tmp_path / "work-skip").mkdir()
    db = ckpt.open_copy(tmp_path / "db", read_only=True)
    try:
        skipping = rescaling._HeirFiles(tmp_path / "work-skip", 1)
        written, held = write_skipping(db, task, skipping, skip={1})
        assert set(skipping.finish()) == {3}
    finally:
        db.close()
    assert written == {3: counts[3]} and held == sorted(groups)
    assert all(p.stat().st_size < 2 * (8 << 10) for paths in files.values() for p in paths[:-1])
    for q in (1, 3):
        expected = {k: v for k, v in data.items() if keygroups.key_group_of_stored_key(k) % 4 == q}
        assert counts[q] == len(expected)
        target = ckpt.store_dir(tmp_path / "new", q, "default")
        target.mkdir(parents=True)
        rescaling._stage_ingested(files[q], tmp_path / f"scratch-{q}", target, 2, KEY_GROUPS, counts[q], None,
                                  {}, None, move=True)
        staged = ckpt.list_store(target, q)
        assert ckpt.read_manifest(staged.manifest_path(2), 2).num_keys == len(expected)
        with ckpt.rebuild(staged, 2) as rebuilt:
            assert dict(rebuilt.db.items()) == expected
    # a key of key group 2 (partition 0's) in partition 1's database: refused by a direct
    # split (to 4) and by a merge split (to 3), which would have merged it beside the real one
    foreign = tmp_path / "foreign"
    _old_partition(foreign, [1, 2, 3])
    for n in (4, 3):
        (tmp_path / f"work-{n}").mkdir()
        db = ckpt.open_copy(foreign, read_only=True)
        try:
            for write in _both_passes(db, tmp_path, n):
                with pytest.raises(ckpt.CheckpointError, match=r"partition 1 of .*old holds a key of key group 2 "):
                    write()
        finally:
            db.close()


def _both_passes(db, tmp_path: Path, n: int):
    """A split's two passes over old partition 1 of 2 rescaled to ``n``, each to be called: every
    key (write_by_key_group), and new partition 1's key groups skipped (write_skipping)."""
    task = _split_task(tmp_path, 1, 2, n)
    yield lambda: rescaling._write_by_key_group(db, task, rescaling._HeirFiles(tmp_path / f"work-{n}", 2))
    yield lambda: write_skipping(db, task, rescaling._HeirFiles(tmp_path / f"work-{n}", 2), skip={1})


def test_a_skipping_split_refuses_a_key_naming_no_key_group_and_passes_an_empty_partition(tmp_path):
    """write_skipping reads the first key of every run, skipped or not: a key too short to name
    a key group, or naming one past keyGroups, is refused where it starts a run; an empty
    partition writes nothing and meets no key group."""
    from keyedstate.formats import rocksdb

    task = _split_task(tmp_path, 1, 2, 4)
    cases = {"empty": (None, None), "short": (b"\x00\x01", r"key group -1 \(key prefix 0001\)"),
             "beyond": (keygroups.prefix(KEY_GROUPS + 1) + b"k", rf"key group {KEY_GROUPS + 1} ")}
    for name, (key, refused) in cases.items():
        db = rocksdb.open_db(tmp_path / name)
        try:
            if key is not None:
                db[keygroups.prefix(1) + b"k"] = b"v"  # a run of skipped key group 1 before it
                db[key] = b"v"
            (tmp_path / f"work-{name}").mkdir()
            out = rescaling._HeirFiles(tmp_path / f"work-{name}", 2)
            if refused is None:
                assert write_skipping(db, task, out, skip={1}) == ({}, [])
            else:
                with pytest.raises(ckpt.CheckpointError, match=refused):
                    write_skipping(db, task, out, skip={1})
        finally:
            db.close()


def test_a_split_refuses_a_partition_rocksdb_cannot_read_whole(tmp_path):
    """rocksdict's scan ends quietly where RocksDB meets a corrupt block: without a check the
    split published the keys before it as the whole partition (found by the helper attack: a
    bit-flipped snapshot file rescaled to half its keys, exit status 0)."""
    from keyedstate.formats import rocksdb

    _old_partition(tmp_path / "db", range(1, 4000, 2))
    sst = max((tmp_path / "db").glob("*.sst"), key=lambda f: f.stat().st_size)
    data = bytearray(sst.read_bytes())
    for offset in range(len(data) // 4, len(data) // 2, 4096):
        data[offset] ^= 0xFF
    sst.write_bytes(bytes(data))
    db = rocksdb.open_read_only(tmp_path / "db")
    try:
        assert 0 < sum(1 for _ in db.items()) < 80_000  # what the split used to take for the whole
        for n in (4, 3):
            (tmp_path / f"work-{n}").mkdir()
            for write in _both_passes(db, tmp_path, n):
                with pytest.raises(ckpt.CheckpointError, match=r"partition 1 .* cannot be read whole, a corrupt file: .*Corruption"):
                    write()
    finally:
        db.close()


def test_a_merge_takes_finished_splits_only(tmp_path):
    """A split attempt killed midway leaves from-<p>.<id>.tmp with partial files; the merge of a
    rerun took them too (found by the helper attack: every rerun failed on an empty SST)."""
    data = _old_partition(tmp_path / "db", range(0, 300, 3))  # key groups of new partition 0 of 3
    staging = tmp_path / "staging"
    db = ckpt.open_copy(tmp_path / "db", read_only=True)
    try:
        for name in ("from-0", "from-0.0123abcd.tmp"):
            (staging / name).mkdir(parents=True)
            out = rescaling._HeirFiles(staging / name, 1)
            for k, v in db.items():
                out.writer(0)[k] = v
            out.finish()
    finally:
        db.close()
    (staging / "from-0.0123abcd.tmp" / "to-0-00001.sst").write_bytes(b"")  # cut short by the kill
    target = ckpt.store_dir(tmp_path / "new", 0, "default")
    target.mkdir(parents=True)
    task = rescaling._MergeTask(str(staging), 0, str(target), 2, KEY_GROUPS, len(data), None, {}, 3, None)
    assert rescaling._merge(task) == {"partition": 0, "keys": len(data)}
    with ckpt.rebuild(ckpt.list_store(target, 0), 2) as rebuilt:
        assert dict(rebuilt.db.items()) == data


def test_a_split_by_files_shares_the_parents_files_and_every_retained_version_loads(spark, tmp_path):
    """4 -> 8 from snapshots writes no key: each heir lists its parent's SSTs where they are and
    adds one file of range deletes; the parent holds a borrower marker. Then 3 x
    minBatchesToRetain batches, a snapshot each, with maintenance: the oldest retained and the
    newest version of every partition load exactly, and every snapshot file in the checkpoint
    is listed by a manifest (of its own partition or of one it lends files to)."""
    retain = 2
    stream, out, op_dir, confs = _snapshotted_query(spark, tmp_path, retain)

    result = keyedstate.rescale(stream.checkpoint, 8, spark=spark)
    assert "clip" in result.task_seconds, result  # every split took the path by files
    version = result.batch + 1
    for q in range(8):
        p = q % 4
        parent = ckpt.read_manifest(op_dir / str(p) / "3.ks-snapshot", 3)
        heir = ckpt.read_manifest(op_dir / str(q) / f"{version}.ks-snapshot", version)
        where = "ks-files/" if q == p else f"../{p}/ks-files/"
        shared = {(f.name, f.size) for f in heir.files if f.path.startswith(where) and
                  (f.name, f.size, f.path.rsplit("/", 1)[1]) in {(g.name, g.size, g.path.rsplit("/", 1)[1]) for g in parent.files}}
        assert {(f.name, f.size) for f in parent.files if f.name.endswith(".sst")} <= shared, (q, heir.files)
        written = [f for f in heir.files if f.name.endswith(".sst") and (f.name, f.size) not in shared]
        assert len(written) == 1, (q, heir.files)  # the range deletes
        assert (op_dir / str(p) / f"ks-borrower-{q}").is_file() == (q != p)

    batches = 3 * retain
    with session_confs(spark, confs):
        _run(spark, stream, range(3, 3 + batches), out, partitions=8)
    assert out == _expected(3 + batches)
    last = result.batch + batches  # input i >= 3 runs as batch i + 1

    _await_every_file_listed(op_dir)
    stores = ckpt.discover_stores(op_dir)["default"]
    assert len(stores) == 8 and all(s.latest == last + 1 for s in stores)
    oldest = max(min(s.loadable()) for s in stores)
    # Cleanup ran past the rescale's version; it runs in maintenance, which may not have come
    # after the last batches before the query stopped.
    assert oldest > version, [sorted(s.loadable()) for s in stores]
    # Spark's state reader serves the batches its commit log holds: from last - retain once its
    # (asynchronous) purge ran; every one of them loads.
    assert oldest - 1 <= last - retain, [sorted(s.loadable()) for s in stores]
    for batch in (last - retain, last):
        assert {(k, n) for k, n, _ in _state(spark, stream.checkpoint, batchId=batch)} == set(_expected(batch).items())
    assert (verified := keyedstate.verify(stream.checkpoint))["ok"], verified


def test_a_heir_split_by_files_again_marks_every_partition_it_lists_files_of(spark, tmp_path):
    """4 -> 8 -> 16 by files: heir 12 of 4 lists files of 0 through 4's first snapshot (4
    itself shares them from 0); every partition whose files a manifest lists elsewhere holds that
    partition's borrower marker, and after retain x 3 batches with cleanup every version
    loads and no file of the checkpoint is listed by no manifest."""
    retain = 2
    stream, out, op_dir, confs = _snapshotted_query(spark, tmp_path, retain)
    keyedstate.rescale(stream.checkpoint, 8, spark=spark)
    second = keyedstate.rescale(stream.checkpoint, 16, spark=spark)  # reads the heirs' first snapshots
    assert "clip" in second.task_seconds, second
    version = second.batch + 1
    chained = []
    for q in range(16):
        heir = ckpt.read_manifest(op_dir / str(q) / f"{version}.ks-snapshot", version)
        for f in heir.files:
            owner = layout.owner_of(f.path)[0]
            if owner is not None and owner != q:
                assert (op_dir / str(owner) / "ks-files" / f.path.rsplit("/", 1)[1]).is_file()
                assert (op_dir / str(owner) / f"ks-borrower-{q}").is_file(), (q, f.path)
                if owner != q % 8:
                    chained.append((q, owner))
    assert (12, 0) in chained, chained  # through 4's snapshot, which shares 0's files

    batches = 3 * retain
    with session_confs(spark, confs):
        _run(spark, stream, range(3, 3 + batches), out, partitions=16)
    assert out == _expected(3 + batches)

    _await_every_file_listed(op_dir)
    last = second.batch + batches
    assert {(k, n) for k, n, _ in _state(spark, stream.checkpoint, batchId=last)} == set(_expected(3 + batches).items())
    assert (verified := keyedstate.verify(stream.checkpoint))["ok"], verified


def test_migrating_a_checkpoint_split_by_files_away_leaves_no_keyedstate_file(spark, tmp_path):
    """After a 4 -> 8 split by files (heirs list their parents' files; parents hold borrower
    markers), migrating to Spark's RocksDB provider keeps the state and retires every file of
    keyedstate's, the markers included (tests/offline/test_migrate.py runs queries on after a
    migration)."""
    confs = {"spark.sql.streaming.stateStore.keyedstate.snapshotInterval": "1"}
    stream = FileStream(spark, tmp_path, "k LONG")
    out: dict = {}
    state_dir = Path(stream.checkpoint) / "state"
    with session_confs(spark, confs):
        _run(spark, stream, range(3), out)
    _await_snapshots(state_dir / "0", 3)
    result = keyedstate.rescale(stream.checkpoint, 8, spark=spark)
    assert "clip" in result.task_seconds, result
    assert list(state_dir.glob("0/*/ks-borrower-*"))
    before = _state(spark, stream.checkpoint)
    keyedstate.migrate(stream.checkpoint, "rocksdb", spark=spark)
    assert _state(spark, stream.checkpoint) == before
    left = sorted(str(p.relative_to(state_dir)) for p in state_dir.rglob("*") if "ks-" in p.name)
    assert left == [], left


def test_a_scale_down_after_a_split_by_files_leaves_nothing_once_retention_passes_it(spark, tmp_path, monkeypatch):
    """4 -> 8 by files, then 8 -> 4: the live partitions hold markers of the retired 4..7 (a
    scale-down that fails at its commit and rolls back leaves none), and after 3 x
    minBatchesToRetain batches with maintenance the retired partitions hold no file, no marker
    of theirs is left, every file is listed by a manifest and the state is exact."""
    from keyedstate.offline.rescale import driver

    retain = 2
    stream, out, op_dir, confs = _snapshotted_query(spark, tmp_path, retain)
    assert "clip" in keyedstate.rescale(stream.checkpoint, 8, spark=spark).task_seconds
    with session_confs(spark, confs):
        _run(spark, stream, range(3, 5), out, partitions=8)
    with monkeypatch.context() as m:
        m.setattr(driver.Rescale, "_commit", lambda *_: (_ for _ in ()).throw(OSError("commit refused")))
        with pytest.raises(OSError, match="commit refused"):
            keyedstate.rescale(stream.checkpoint, 4, spark=spark)
    assert not list(op_dir.glob("*/ks-retired-*"))
    down = keyedstate.rescale(stream.checkpoint, 4, spark=spark)
    version = down.batch + 1
    assert sorted(p.name for p in op_dir.glob("*/ks-retired-*")) == [f"ks-retired-{q}-{version}" for q in range(4, 8)]
    assert (verified := keyedstate.verify(stream.checkpoint))["ok"], verified

    with session_confs(spark, confs):
        _run(spark, stream, range(5, 5 + 3 * retain), out,
             until=lambda: not _files_of(op_dir, range(4, 8)) and not _markers(op_dir))
    assert out == _expected(5 + 3 * retain)
    _await_every_file_listed(op_dir)
    left = _files_of(op_dir, range(4, 8))
    assert left == [], (left, partition_listings(op_dir))
    assert _markers(op_dir) == [], _markers(op_dir)
    last = down.batch + 3 * retain
    assert {(k, n) for k, n, _ in _state(spark, stream.checkpoint, batchId=last)} == set(_expected(5 + 3 * retain).items())
    assert (verified := keyedstate.verify(stream.checkpoint))["ok"], verified


@pytest.mark.parametrize("to, new_files", [(2, 1), (6, 2), (3, 4)], ids=["4to2", "4to6", "4to3"])
def test_a_merge_by_files_builds_each_heir_on_one_parents_files(spark, tmp_path, to, new_files):
    """4 -> 2, 6, 3 from snapshots: new partition q is old partition q mod 4's files, listed
    where they are, plus new files: one of range deletes unless q owns all their key groups
    (4 -> 2), and one per other old partition holding keys of q, ingested. The query goes on
    exactly, and after 3 x minBatchesToRetain batches with maintenance the oldest retained and
    the newest version load, and every file is listed (none left in a retired partition)."""
    retain = 2
    stream, out, op_dir, confs = _snapshotted_query(spark, tmp_path, retain)
    result = keyedstate.rescale(stream.checkpoint, to, spark=spark)
    assert "clip" in result.task_seconds, result  # every new partition was built on a base
    version = result.batch + 1
    for q in range(to):
        p = q % 4
        base = ckpt.read_manifest(op_dir / str(p) / "3.ks-snapshot", 3)
        heir = ckpt.read_manifest(op_dir / str(q) / f"{version}.ks-snapshot", version)
        where = "ks-files/" if q == p else f"../{p}/ks-files/"
        base_ssts = {(f.name, f.size, where + f.path.rsplit("/", 1)[1]) for f in base.files if f.name.endswith(".sst")}
        heir_ssts = {(f.name, f.size, f.path) for f in heir.files if f.name.endswith(".sst")}
        assert base_ssts and base_ssts <= heir_ssts, (q, heir.files)
        assert len(heir_ssts - base_ssts) == new_files, (q, heir.files)
    assert result.keys == len(_expected(3))

    batches = 3 * retain
    with session_confs(spark, confs):
        _run(spark, stream, range(3, 3 + batches), out, partitions=to,
             until=lambda: not _files_of(op_dir, range(to, 4)) and not _markers(op_dir, "ks-retired-*"))
    assert out == _expected(3 + batches)
    last = result.batch + batches
    _await_every_file_listed(op_dir)
    left = _files_of(op_dir, range(to, 4))
    assert left == [], (left, partition_listings(op_dir))
    live = [s for s in ckpt.discover_stores(op_dir)["default"] if s.partition < to]
    assert len(live) == to and all(s.latest == last + 1 for s in live)
    for batch in (last - retain, last):
        assert {(k, n) for k, n, _ in _state(spark, stream.checkpoint, batchId=batch)} == set(_expected(batch).items())
    assert (verified := keyedstate.verify(stream.checkpoint))["ok"], verified


@pytest.mark.parametrize("to, kill_after, then", [(6, "split:", "rerun"), (2, "merge:", "rollback")])
def test_a_merge_by_files_killed_midway_is_finished_or_rolled_back_exactly(spark, tmp_path, to, kill_after, then):
    """The rescale CLI SIGKILLed after its splits (bases staged, not published) or its merges,
    then rerun or rolled back and run again: the query continues exactly and the checkpoint
    verifies."""
    stream, out, op_dir, confs = _snapshotted_query(spark, tmp_path, 2)
    proc = rescale_cli("--checkpoint", stream.checkpoint, "--partitions", str(to))
    seen = kill_rescale_after(proc, kill_after)
    assert proc.returncode == -signal.SIGKILL, seen
    if then == "rollback":
        keyedstate.rescale(stream.checkpoint, to, spark=spark, rollback=True)
        assert not (Path(stream.checkpoint) / "_keyedstate_rescale").exists()
    result = keyedstate.rescale(stream.checkpoint, to, spark=spark)
    assert result.resumed == (then == "rerun") and "clip" in result.task_seconds, result
    assert result.keys == len(_expected(3))
    with session_confs(spark, confs):
        _run(spark, stream, range(3, 5), out, partitions=to)
    assert out == _expected(5)
    _await_every_file_listed(op_dir)
    assert (verified := keyedstate.verify(stream.checkpoint))["ok"], verified


def test_a_split_by_files_from_a_snapshot_and_changelogs_counts_and_hides_exactly(spark, tmp_path):
    """The parent's version is snapshot 2 plus changelog 3, which updates keys of the snapshot
    and adds others: each heir holds exactly the keys of the key groups it owns, and its
    manifest's numKeys is their count."""
    stream, out, op_dir = _snapshot_and_a_changelog(spark, tmp_path)
    assert not any(3 in s.snapshots for s in ckpt.discover_stores(op_dir)["default"])
    result = keyedstate.rescale(stream.checkpoint, 8, spark=spark)
    assert "clip" in result.task_seconds, result
    assert result.counted_by_keys == 0, result  # the parents' snapshots carry key-group counts
    _assert_heirs_hold_and_count_their_key_groups(op_dir, result.batch + 1, 8, len(_expected(3)))
    _run(spark, stream, range(3, 5), out, partitions=8)
    assert out == _expected(5)


def _snapshot_and_a_changelog(spark, tmp_path: Path) -> tuple[FileStream, dict, Path]:
    """3 batches at 4 partitions: snapshot 2 uploaded by every partition, then changelog 3."""
    stream = FileStream(spark, tmp_path, "k LONG")
    out: dict = {}
    op_dir = Path(stream.checkpoint) / "state" / "0"
    with session_confs(spark, {"spark.sql.streaming.stateStore.keyedstate.snapshotInterval": "2"}):
        _run(spark, stream, range(2), out)
        _await_snapshots(op_dir, 2)
        _run(spark, stream, range(2, 3), out)
    return stream, out, op_dir


def _assert_heirs_hold_and_count_their_key_groups(op_dir: Path, version: int, partitions: int, keys: int,
                                                  recorded: bool = True) -> None:
    """Each heir's version holds only its key groups' keys, its manifest's numKeys is their
    count, and (``recorded``: a split's heirs, not a merge's) its snapshot's key-group counts
    are them, key group by key group."""
    seen = 0
    for q in range(partitions):
        files = ckpt.list_store(op_dir / str(q), q)
        manifest = ckpt.read_manifest(files.manifest_path(version), version)
        with ckpt.rebuild(files, version, count_key_groups=True) as rebuilt:
            groups = [keygroups.key_group_of_stored_key(k) for k in rebuilt.db.keys()]
            counts = rebuilt.key_group_counts
        assert {g % partitions for g in groups} <= {q}, (q, sorted({g % partitions for g in groups}))
        assert manifest.num_keys == len(groups), q
        if recorded:
            assert key_group_counts.NAME in {f.name for f in manifest.files}, q
            assert counts == Counter(groups), q
        seen += len(groups)
    assert seen == keys


@pytest.mark.parametrize("to", [8, 6], ids=["4to8", "4to6"])
def test_a_split_by_files_counts_the_keys_of_parents_without_usable_key_group_counts(spark, tmp_path, to):
    """Parents 0 and 1: snapshots without key-group counts (as an older build wrote them).
    Parents 2 and 3: counts that are well formed, sum to numKeys and name only the parent's key
    groups, but not the key groups its files hold keys of (a key moved to an empty key group of
    another heir), which would make two heirs' numKeys wrong; the split finds them out with a
    seek per key group held (4 -> 8), or in the pass that writes the keys of the heirs a parent
    is not the base of (4 -> 6, a merge by files), which also finds parent 3's counts, moved
    between two key groups it holds, out by the keys it wrote. Each is counted by one pass over
    its keys instead: the heirs' counts are exact, a split's heirs carry counts from then on,
    and the query goes on."""
    stream, out, op_dir = _snapshot_and_a_changelog(spark, tmp_path)
    stores = ckpt.discover_stores(op_dir)["default"]
    for p, files in enumerate(stores):
        path = Path(files.manifest_path(2))
        node = json.loads(path.read_bytes())
        [entry] = [f for f in node["files"] if f["name"] == key_group_counts.NAME]
        if p < 2:
            node["files"].remove(entry)
        else:
            counts_path = path.parent / entry["path"]
            key_groups, counts = key_group_counts.decode(counts_path.read_bytes(), str(counts_path))
            if p == 3 and to % 4:  # held key groups only: the keys written for a heir give it away
                first = min(g for g, c in counts.items() if c > 1)
                moved = next(g for g in sorted(counts) if counts[g] > 0 and g % to != first % to)
            else:
                first = min(counts)
                moved = next(g for g in range(first + len(stores), key_groups, len(stores))
                             if g not in counts and g % to != first % to)
            counts[first] -= 1
            counts[moved] += 1
            data = key_group_counts.encode(counts, key_groups)  # the same total: a load keeps it
            tampered = counts_path.parent / f"tampered-{p}-{key_group_counts.NAME}"
            tampered.write_bytes(data)
            entry["path"], entry["size"] = f"{layout.FILES_DIR}/{tampered.name}", len(data)
        path.write_bytes(json.dumps(node, separators=(",", ":")).encode())
    result = keyedstate.rescale(stream.checkpoint, to, spark=spark)
    assert result.counted_by_keys == len(stores) and "clip" in result.task_seconds, result
    _assert_heirs_hold_and_count_their_key_groups(op_dir, result.batch + 1, to, len(_expected(3)),
                                                  recorded=to % 4 == 0)
    _run(spark, stream, range(3, 5), out, partitions=to)
    assert out == _expected(5)


def test_key_group_counts_are_held_to_the_key_groups_the_files_hold(tmp_path):
    """counts_disagree: one seek per key group held tells counts that name exactly the populated
    key groups (range-deleted ones are empty) from counts that name an empty one, miss one, or
    miss a key too short to name one."""
    from keyedstate.formats import rocksdb
    from keyedstate.offline.rescale.clip import counts_disagree

    db = rocksdb.open_db(tmp_path / "db")
    try:
        for g, n in ((0, 3), (4, 1), (8, 2), (12, 5)):
            for i in range(n):
                db[keygroups.prefix(g) + b"k%d" % i] = b"v"
        db.delete_range(keygroups.prefix(8), keygroups.prefix(9))  # as a clipped parent hides a key group
        exact = {0: 3, 4: 1, 12: 5, 16: 0}
        assert counts_disagree(db, exact) is None
        assert counts_disagree(db, {0: 3, 4: 1, 8: 2, 12: 3}) == "key group 12 holds keys, the counts say 3"
        assert counts_disagree(db, {0: 2, 4: 1, 12: 5, 20: 1}) == "key group 20 holds no key, the counts say 1"
        assert counts_disagree(db, {0: 4, 12: 5}) == "key group 4 holds keys, the counts say 0"
        db[b"\x00\x01"] = b"short"
        assert "too short" in counts_disagree(db, exact)
    finally:
        db.close()


def test_a_split_by_files_failing_at_publish_rolls_back_to_every_file_it_had(spark, tmp_path, monkeypatch):
    """4 -> 8 from snapshots fails after publishing heirs 0..4 (heir 4 lists 0's files, 0
    holds its borrower marker), and the driver rolls it back: every file the checkpoint held before is
    there with its size, nothing the rescale wrote is (markers, heirs' manifests and files,
    new partitions), and the query goes on with 4 partitions."""
    from keyedstate.offline.rescale import driver

    stream = FileStream(spark, tmp_path, "k LONG")
    out: dict = {}
    op_dir = Path(stream.checkpoint) / "state" / "0"
    with session_confs(spark, {"spark.sql.streaming.stateStore.keyedstate.snapshotInterval": "1"}):
        _run(spark, stream, range(3), out)
        _await_snapshots(op_dir, 3)
    time.sleep(1.5)  # the rollback takes files written from a second before the rescale as its own
    files = lambda: {p.relative_to(op_dir): p.stat().st_size for p in op_dir.rglob("*") if p.is_file()}  # noqa: E731
    before = files()

    published: list[int] = []
    marked: list[str] = []

    def publish_five(staged, target, version, root, partition, store):
        if len(published) == 5:
            marked.extend(str(p.relative_to(op_dir)) for p in op_dir.glob("*/ks-borrower-*"))
            raise RuntimeError("injected: the driver stops after publishing five heirs")
        driver_publish(staged, target, version, root, partition, store)
        published.append(partition)

    driver_publish = driver.publish
    monkeypatch.setattr(driver, "publish", publish_five)
    with pytest.raises(RuntimeError, match="injected"):
        keyedstate.rescale(stream.checkpoint, 8, spark=spark)
    monkeypatch.undo()
    assert published == [0, 1, 2, 3, 4] and marked == ["0/ks-borrower-4"], (published, marked)
    # the driver rolled the failed batch back itself
    assert not (Path(stream.checkpoint) / "offsets" / "3").exists()

    after = files()
    assert after == before, (sorted(set(before) - set(after)), sorted(set(after) - set(before)))
    _run(spark, stream, range(3, 5), out)
    assert out == _expected(5)
