"""The state processor with real Spark (issue 15, point 3): read any store at any batch; a
transform into a new value schema and a bootstrap from a DataFrame, each followed by batches
whose output equals a query that had that state from the start.
"""
from __future__ import annotations

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


def test_transform_into_the_new_value_schema(spark, tmp_path):
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

    result = processor.transform(0, add_mean, value_schema=new_schema)
    assert result["batch"] == 2 and result["written"][0]["rows"] == len(before)
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
    # The committed state is untouched, and the next change says what to do first.
    assert sorted(map(str, keyedstate.state(spark, checkpoint).read(0, batch=1).collect())) == before
    with pytest.raises(keyedstate.MigrateError, match=r"offsets.2: batch 2 started but did not commit"):
        keyedstate.state(spark, checkpoint).transform(0, lambda key, value: value)


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
