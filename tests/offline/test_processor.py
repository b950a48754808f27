"""The state processor with real Spark (issue 15, point 3): read any store at any batch; a
transform into a new value schema and a bootstrap from a DataFrame, each followed by batches
whose output equals a query that had that state from the start.
"""
from __future__ import annotations

import hashlib
import logging

import pandas as pd
import pytest
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

import keyedstate
from support.constants import HDFS_PROVIDER, KS
from support.driver import assert_same_output, normalise, run_query
from support.scenarios import DEDUP_STEPS, IV, KV, KV_STEPS, drop_duplicates, pandas_no_timeout

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def pandas_with_mean(df):
    """The new version of the query in scenarios.pandas_no_timeout: its state gains a field."""
    def running_totals(key, frames, state):
        count, total, _ = state.get if state.exists else (0, 0, 0.0)
        for frame in frames:
            count += len(frame)
            total += int(frame["v"].sum())
        state.update((count, total, total / count))
        yield pd.DataFrame({"k": [key[0]], "n": [count], "total": [total], "mean": [total / count]})

    return df.groupBy("k").applyInPandasWithState(
        running_totals, "k string, n long, total long, mean double", "n long, total long, mean double", "update",
        GroupStateTimeout.NoTimeout)


def test_transform_into_the_new_value_schema(spark, tmp_path, caplog):
    reference = run_query(spark, KS, pandas_with_mean, KV, KV_STEPS, tmp_path / "ref" / "checkpoint",
                          tmp_path / "ref" / "input", "update")
    checkpoint = tmp_path / "old" / "checkpoint"
    run_query(spark, KS, pandas_no_timeout, KV, KV_STEPS[:2], checkpoint, tmp_path / "old" / "input", "update")
    processor = keyedstate.state(spark, checkpoint)
    before = normalise(processor.read(0).collect())
    # the new query's state schema, as its own checkpoint records it
    new_schema = keyedstate.state(spark, tmp_path / "ref" / "checkpoint").operators()[0]["stores"]["default"]["value"]

    def add_mean(key, value):
        state = value["groupState"]
        return {**value, "groupState": {**state, "mean": state["total"] / state["n"]}}

    with caplog.at_level(logging.INFO, logger="keyedstate.offline"):
        result = processor.transform(0, add_mean, value_schema=new_schema)
    assert result["batch"] == 2 and result["written"][0]["rows"] == len(before)
    for step in ("checking", "writing"):  # its progress, as a rescale's
        assert "operator 0 store default: %s 2/2 partitions done" % step in caplog.messages, caplog.messages
    after = keyedstate.state(spark, checkpoint).read(0).collect()
    assert sorted(r.value.groupState.mean for r in after) == sorted(
        r[1][0][1] / r[1][0][0] for r in before)
    assert keyedstate.state(spark, checkpoint).read(0, batch=1).count() == len(before)  # old batch kept
    assert (checkpoint / "state/0/0/_metadata/schema.before-batch-2").is_file()  # and its schema
    rest = run_query(spark, KS, pandas_with_mean, KV, KV_STEPS[2:], checkpoint, tmp_path / "old" / "input", "update")
    assert_same_output(reference[2:], [(b - 1, rows) for b, rows in rest],
                       labels=("new query from the start", "old state transformed"))


def test_bootstrap_dedup_from_a_batch_dataframe(spark, tmp_path):
    history = DEDUP_STEPS[0]  # what the old system already saw
    reference = run_query(spark, HDFS_PROVIDER, drop_duplicates, IV, DEDUP_STEPS, tmp_path / "ref" / "checkpoint",
                          tmp_path / "ref" / "input", "append")
    checkpoint = tmp_path / "new" / "checkpoint"
    # the new query's first batch is an empty file: the checkpoint then knows its operators
    first = run_query(spark, HDFS_PROVIDER, drop_duplicates, IV, [[]], checkpoint, tmp_path / "new" / "input",
                      "append")
    seen = spark.createDataFrame([(i,) for i, _ in history], "id long").distinct()
    result = keyedstate.state(spark, checkpoint).bootstrap(0, seen.select(F.struct("id").alias("key")))
    assert result["written"][0]["rows"] == len({i for i, _ in history})
    rest = run_query(spark, HDFS_PROVIDER, drop_duplicates, IV, DEDUP_STEPS[1:], checkpoint,
                     tmp_path / "new" / "input", "append")
    assert first == [(0, [])]
    assert_same_output(reference[1:], [(b - 1, rows) for b, rows in rest],
                       labels=("query that saw the history", "bootstrapped query"))


def test_read_any_store_at_any_batch_and_errors(spark, tmp_path):
    checkpoint = tmp_path / "checkpoint"
    run_query(spark, KS, drop_duplicates, IV, DEDUP_STEPS[:2], checkpoint, tmp_path / "input", "append")
    p = keyedstate.state(spark, checkpoint)
    assert [o["name"] for o in p.operators()] == ["dedupe"]
    assert p.read(0, batch=0).count() < p.read(0).count()
    with pytest.raises(keyedstate.MigrateError, match="no stateful operator 3"):
        p.transform(3, lambda k, v: v)


def test_processor_on_the_object_store_scheme(spark, tmp_path):
    """read and transform on an objtest:// checkpoint (object-store semantics); the query then
    restarts there from the transformed version, like a run that was never touched."""
    from support.offline import objtest_local, to_objtest
    from support.scenarios import agg_update

    reference = run_query(spark, KS, agg_update, KV, KV_STEPS, tmp_path / "ref" / "checkpoint",
                          tmp_path / "ref" / "input", "update")
    local = tmp_path / "old" / "checkpoint"
    run_query(spark, KS, agg_update, KV, KV_STEPS[:2], local, tmp_path / "old" / "input", "update")
    uri = to_objtest(spark, local, bucket="processor")
    processor = keyedstate.state(spark, uri)
    assert [o["name"] for o in processor.operators()] == [o["name"] for o in keyedstate.state(spark, local).operators()]
    before = sorted(map(str, processor.read(0).collect()))
    assert before == sorted(map(str, keyedstate.state(spark, local).read(0).collect()))
    result = processor.transform(0, lambda key, value: value)  # a new state batch, same rows
    assert result["batch"] == 2 and result["written"][0]["rows"] == len(before)
    assert sorted(map(str, keyedstate.state(spark, uri).read(0).collect())) == before
    rest = run_query(spark, KS, agg_update, KV, KV_STEPS[2:], objtest_local(spark, uri), tmp_path / "old" / "input",
                     "update", location=uri)
    assert_same_output(reference[2:], [(b - 1, rows) for b, rows in rest],
                       labels=("uninterrupted", "transformed on objtest://"))


def test_read_a_checkpoint_format_2_query_and_refuse_to_change_it(spark, tmp_path):
    """A query run under checkpointFormatVersion=2 is read from a session that does not set it
    (Spark records the format only in the commit log, whose unique ids its state reader passes
    on): the processor's reads and Spark's change feed give what the same query under format 1
    gives. A change is refused, naming the commit: its state batch would have to pin new ids."""
    from support.driver import session_confs
    from support.scenarios import agg_update

    v1 = tmp_path / "v1" / "checkpoint"
    run_query(spark, KS, agg_update, KV, KV_STEPS[:2], v1, tmp_path / "v1" / "input", "update")
    v2 = tmp_path / "v2" / "checkpoint"
    with session_confs(spark, {"spark.sql.streaming.stateStore.checkpointFormatVersion": "2"}):
        run_query(spark, KS, agg_update, KV, KV_STEPS[:2], v2, tmp_path / "v2" / "input", "update")
    assert "stateUniqueIds" in (v2 / "commits" / "1").read_text()  # the query really ran under format 2
    p = keyedstate.state(spark, v2)
    assert p.operators() == keyedstate.state(spark, v1).operators()
    for batch in (0, 1):
        assert sorted(map(str, p.read(0, batch=batch).collect())) == \
            sorted(map(str, keyedstate.state(spark, v1).read(0, batch=batch).collect()))
    feed = lambda c: sorted(map(str, spark.read.format("statestore").option("readChangeFeed", True)  # noqa: E731
                                .option("changeStartBatchId", 0).load(str(c)).collect()))
    assert feed(v2) == feed(v1) != []
    with pytest.raises(keyedstate.MigrateError, match=r"commits.1: checkpoint format version 2 .*not supported by "):
        p.transform(0, lambda key, value: value)


def test_a_change_replaces_files_of_its_version_that_never_committed(spark, tmp_path):
    """Files of the version a change writes (here a query's attempt at it that never reached the
    commit log) are no part of the checkpoint's state: the change deletes them and writes its
    own, instead of failing on them or keeping them as the version."""
    from support.scenarios import agg_update

    checkpoint = tmp_path / "checkpoint"
    run_query(spark, KS, agg_update, KV, KV_STEPS[:2], checkpoint, tmp_path / "input", "update")
    p = keyedstate.state(spark, checkpoint)
    before = sorted(map(str, p.read(0).collect()))
    part = checkpoint / "state" / "0" / "0"
    (part / "3.ks-changelog").write_bytes((part / "2.ks-changelog").read_bytes()[:-1])  # a torn attempt
    result = p.transform(0, lambda key, value: value)
    assert result["version"] == 3
    assert sorted(map(str, keyedstate.state(spark, checkpoint).read(0).collect())) == before


def test_a_change_killed_while_it_deletes_a_leftover_leaves_no_snapshot_without_its_changelog(
        spark, tmp_path, monkeypatch):
    """A leftover of the version a change writes (changelog and snapshot of an attempt that never
    committed) is deleted snapshot first: a kill between the two deletes must leave the
    changelog, which a query's commit refuses to adopt, not a snapshot that a load would take as
    the version."""
    from support.driver import session_confs
    from support.constants import PFX
    from support.scenarios import agg_update
    from keyedstate.offline.storage import LocalStorage

    checkpoint = tmp_path / "checkpoint"
    with session_confs(spark, {PFX + "snapshotInterval": "1"}):
        run_query(spark, KS, agg_update, KV, KV_STEPS[:2], checkpoint, tmp_path / "input", "update")
    before = sorted(map(str, keyedstate.state(spark, checkpoint).read(0).collect()))
    part = checkpoint / "state" / "0" / "0"
    assert (part / "2.ks-snapshot").exists()
    for name in ("ks-changelog", "ks-snapshot"):  # an attempt at version 3 that never committed
        (part / f"3.{name}").write_bytes((part / f"2.{name}").read_bytes())

    real_delete, deleted = LocalStorage.delete, []

    def killed_after_one(self, path):
        if deleted:
            raise OSError("killed between two deletes")
        deleted.append(path)
        real_delete(self, path)

    monkeypatch.setattr(LocalStorage, "delete", killed_after_one)
    with pytest.raises(OSError, match="killed between two deletes"):
        keyedstate.state(spark, checkpoint).transform(0, lambda key, value: value)
    assert [p.rsplit("/", 1)[-1] for p in deleted] == ["3.ks-snapshot"]
    assert (part / "3.ks-changelog").exists() and not (part / "3.ks-snapshot").exists()
    monkeypatch.setattr(LocalStorage, "delete", real_delete)
    # The committed state is untouched, and the next change recognises the cut-short one by its
    # record, removes it, and replaces the leftover changelog with its own version.
    assert sorted(map(str, keyedstate.state(spark, checkpoint).read(0, batch=1).collect())) == before
    assert (checkpoint / "offsets" / "2").exists() and (checkpoint / "_keyedstate_changes" / "2.json").exists()
    result = keyedstate.state(spark, checkpoint).transform(0, lambda key, value: value)
    assert result["version"] == 3
    assert sorted(map(str, keyedstate.state(spark, checkpoint).read(0).collect())) == before


def test_a_change_without_its_snapshot_is_rescaled_as_written(spark, tmp_path):
    """A transform's version whose snapshot never reached the checkpoint (its upload failed): a
    rescale of the young query (changelogs only, split directly by key group) starts from that
    version, written from empty, not from version 1, so the keys the transform dropped stay gone."""
    from support.driver import session_confs
    from support.constants import PFX
    from support.scenarios import agg_update

    keys = lambda: sorted(r.key.k for r in keyedstate.state(spark, checkpoint).read(0).collect())  # noqa: E731
    checkpoint = tmp_path / "checkpoint"
    with session_confs(spark, {PFX + "snapshotInterval": "100"}):
        run_query(spark, KS, agg_update, KV, KV_STEPS[:2], checkpoint, tmp_path / "input", "update")
    assert len(keys()) > 2
    keyedstate.state(spark, checkpoint).transform(0, lambda key, value: value if key["k"] in ("k0", "k1") else None)
    for m in (checkpoint / "state" / "0").glob("*/3.ks-snapshot"):
        m.unlink()
    assert keys() == ["k0", "k1"]
    result = keyedstate.rescale(checkpoint, 4, spark=spark)
    assert result.keys == 2 and keys() == ["k0", "k1"]


def _hashes(root) -> dict[str, str]:
    """Every file and directory under ``root``: relative path -> SHA-256 of its bytes, or "dir"."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


def _counts(spark, checkpoint, batch=None) -> dict[str, tuple]:
    return {r.key.k: (r.value["count"], r.value["sum"])
            for r in keyedstate.state(spark, checkpoint).read(0, batch=batch).collect()}


def test_a_function_whose_values_do_not_fit_the_schema_changes_nothing(spark, tmp_path):
    """Every value the function returns is checked against the value schema before anything is
    written: an unknown, missing or mistyped field, a value that is no struct, or a function
    that raises fails the change with the first such row (key and returned value) in one line,
    and every file of the checkpoint is as it was."""
    from support.scenarios import agg_update

    checkpoint = tmp_path / "checkpoint"
    run_query(spark, KS, agg_update, KV, KV_STEPS[:2], checkpoint, tmp_path / "input", "update")
    before = _hashes(checkpoint)
    p = keyedstate.state(spark, checkpoint)
    keys = len(_counts(spark, checkpoint))
    bad = [
        (lambda key, value: {"nosuchfield": "ten"},
         rf"{keys} of {keys} value\(s\) .* the first: key \{{'k': 'k\d'\}} returned \{{'nosuchfield': 'ten'\}}: "
         r"unknown field nosuchfield; missing field count, sum\. Nothing was written"),
        (lambda key, value: {**value, "sum": "ten"},
         r"returned \{'count': \d+, 'sum': 'ten'\}: sum is str 'ten', not bigint"),
        (lambda key, value: {"count": value["count"]}, r"missing field sum\."),
        (lambda key, value: value["count"], r"returned \d+: the value is int \d+, not struct<count:bigint,sum:bigint>"),
        (lambda key, value: 1 // 0 if key["k"] == "k1" else value,
         r"1 of \d+ value\(s\) .*key \{'k': 'k1'\} raised ZeroDivisionError: integer division or modulo by zero"),
    ]
    for fn, why in bad:
        with pytest.raises(keyedstate.StateProcessorError, match=why) as error:
            p.transform(0, fn)
        assert "\n" not in str(error.value)
        assert _hashes(checkpoint) == before


def test_a_dry_run_writes_nothing_and_prints_a_sample(spark, tmp_path, capsys):
    from support.scenarios import agg_update

    checkpoint = tmp_path / "checkpoint"
    run_query(spark, KS, agg_update, KV, KV_STEPS[:2], checkpoint, tmp_path / "input", "update")
    before = _hashes(checkpoint)
    current = _counts(spark, checkpoint)
    capsys.readouterr()
    result = keyedstate.state(spark, checkpoint).transform(
        0, lambda key, value: None if key["k"] == "k0" else {**value, "count": value["count"] * 10},
        dry_run=True, sample=len(current))
    assert _hashes(checkpoint) == before
    printed = capsys.readouterr().out
    assert "dry run, nothing written" in printed
    assert (result["rows"], result["kept"], result["dropped"]) == (len(current), len(current) - 1, 1)
    assert {row["key"]["k"] for row in result["sample"]} == set(current)
    for row in result["sample"]:
        k = row["key"]["k"]
        assert (row["before"]["count"], row["before"]["sum"]) == current[k]
        assert row["after"] == (None if k == "k0" else {"count": current[k][0] * 10, "sum": current[k][1]})
        assert f"key {row['key']}: {row['before']} -> {row['after'] or '(dropped)'}" in printed


def test_undo_restores_the_checkpoint_exactly_and_the_query_continues_from_it(spark, tmp_path):
    """``keyedstate undo`` takes a change back to the byte (every file's hash); the restarted
    query then continues from the state before the change, batch ids included. A second undo has
    nothing to undo; a change that a batch ran on top of is refused and left as it is."""
    from keyedstate.cli import main
    from support.scenarios import agg_update

    reference = run_query(spark, KS, agg_update, KV, KV_STEPS[:4], tmp_path / "ref" / "checkpoint",
                          tmp_path / "ref" / "input", "update")
    checkpoint = tmp_path / "checkpoint"
    run_query(spark, KS, agg_update, KV, KV_STEPS[:2], checkpoint, tmp_path / "input", "update")
    before, counts = _hashes(checkpoint), _counts(spark, checkpoint)
    keyedstate.state(spark, checkpoint).transform(0, lambda key, value: {**value, "count": value["count"] * 1000})
    assert _counts(spark, checkpoint) == {k: (n * 1000, s) for k, (n, s) in counts.items()}
    assert main(["undo", "--checkpoint", str(checkpoint)]) == 0
    assert _hashes(checkpoint) == before
    with pytest.raises(keyedstate.StateProcessorError, match="nothing to undo"):
        keyedstate.undo(checkpoint)
    assert main(["undo", "--checkpoint", str(checkpoint)]) == 1
    rest = run_query(spark, KS, agg_update, KV, KV_STEPS[2:3], checkpoint, tmp_path / "input", "update")
    assert_same_output(reference[2:3], rest, labels=("uninterrupted", "changed, undone, restarted"))

    keyedstate.state(spark, checkpoint).transform(0, lambda key, value: value)  # batch 3
    rest = run_query(spark, KS, agg_update, KV, KV_STEPS[3:4], checkpoint, tmp_path / "input", "update")
    assert_same_output(reference[3:4], [(b - 1, rows) for b, rows in rest], labels=("uninterrupted", "changed"))
    on_top = _hashes(checkpoint)
    with pytest.raises(keyedstate.StateProcessorError,
                       match=r"offsets.4: the query has run batch\(es\) 4\.\.4 on top of the state processor's "
                             r"change of batch 3; undoing the change would lose them: nothing was undone"):
        keyedstate.state(spark, checkpoint).undo()
    assert _hashes(checkpoint) == on_top


def test_a_failed_change_leaves_nothing_behind_and_a_cut_short_one_is_taken_over(spark, tmp_path, monkeypatch):
    """A change whose write fails (here a directory where a partition's new changelog goes) is
    taken back whole before its error is raised, so the next change is not refused as if a query
    were running. One whose taking back is cut short too (a kill) leaves its record: the next
    change recognises the leftover as its own, removes it and goes ahead, and undo then restores
    the checkpoint exactly."""
    from keyedstate.offline.storage import LocalStorage
    from support.scenarios import agg_update

    checkpoint = tmp_path / "checkpoint"
    run_query(spark, KS, agg_update, KV, KV_STEPS[:2], checkpoint, tmp_path / "input", "update")
    clean, counts = _hashes(checkpoint), _counts(spark, checkpoint)
    obstacle = checkpoint / "state" / "0" / "1" / "3.ks-changelog"
    obstacle.mkdir()
    (obstacle / "in-the-way").write_bytes(b"x")
    obstructed = _hashes(checkpoint)
    double = lambda key, value: {**value, "count": value["count"] * 2}  # noqa: E731
    with pytest.raises(Exception) as failed:
        keyedstate.state(spark, checkpoint).transform(0, double)
    assert not isinstance(failed.value, keyedstate.StateProcessorError), failed.value
    assert _hashes(checkpoint) == obstructed

    real_delete = LocalStorage.delete

    def killed_in_commits(self, path):
        if "/commits/" in path:
            raise OSError("killed while taking the change back")
        real_delete(self, path)

    monkeypatch.setattr(LocalStorage, "delete", killed_in_commits)
    with pytest.raises(Exception):
        keyedstate.state(spark, checkpoint).transform(0, double)
    monkeypatch.setattr(LocalStorage, "delete", real_delete)
    assert (checkpoint / "offsets" / "2").exists() and not (checkpoint / "commits" / "2").exists()
    with pytest.raises(keyedstate.StateProcessorError, match=r"offsets.2: an unfinished transform .*keyedstate undo"):
        keyedstate.state(spark, checkpoint).transform(0, double, dry_run=True)
    for path in sorted(obstacle.rglob("*"), reverse=True):
        path.unlink()
    obstacle.rmdir()
    result = keyedstate.state(spark, checkpoint).transform(0, double)
    assert result["batch"] == 2
    assert _counts(spark, checkpoint) == {k: (n * 2, s) for k, (n, s) in counts.items()}
    keyedstate.undo(checkpoint)
    assert _hashes(checkpoint) == clean


def test_undo_refuses_a_change_that_a_migration_rewrote(spark, tmp_path):
    """``keyedstate migrate`` after a change rewrites its offsets entry and retires the files the
    state before the change lived in: undo cannot restore that state and refuses, touching nothing."""
    from support.scenarios import agg_update

    checkpoint = tmp_path / "checkpoint"
    run_query(spark, KS, agg_update, KV, KV_STEPS[:2], checkpoint, tmp_path / "input", "update")
    keyedstate.state(spark, checkpoint).transform(0, lambda key, value: value)
    keyedstate.migrate(checkpoint, "hdfs", spark)
    migrated = _hashes(checkpoint)
    with pytest.raises(keyedstate.StateProcessorError,
                       match=r"offsets.2 was rewritten after the state processor's change of batch 2 "
                             r".*nothing was undone"):
        keyedstate.undo(checkpoint)
    assert _hashes(checkpoint) == migrated


def test_a_session_without_the_jar_is_refused_before_anything_is_written(request, tmp_path):
    """A change from a session whose JVM lacks keyedstate's jar (here on a query of Spark's own
    provider, which needs none) is refused up front, naming the jar, and writes nothing: the
    next call says the same, instead of taking a leftover offsets entry for a running query."""
    from pyspark.sql import SparkSession

    from support import jvmsession
    from support.scenarios import agg_update

    if not jvmsession.run_here_or_delegate(request, tmp_path):
        return
    builder = (SparkSession.builder.master("local[2]").appName("keyedstate-no-jar")
               .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
               .config("spark.driver.extraJavaOptions", jvmsession.QUICK_JVM_OPTIONS))
    with jvmsession.own_jvm_session(builder) as session:
        checkpoint = tmp_path / "checkpoint"
        run_query(session, HDFS_PROVIDER, agg_update, KV, KV_STEPS[:2], checkpoint, tmp_path / "input", "update")
        before = _hashes(checkpoint)
        for _ in range(2):
            with pytest.raises(keyedstate.StateProcessorError,
                               match=r"no io\.keyedstate\.offline\.StateMigrator \(keyedstate's jar is not on its "
                                     r"classpath\).*nothing was written"):
                keyedstate.state(session, checkpoint).transform(0, lambda key, value: value)
            assert _hashes(checkpoint) == before
