"""CheckpointCleanup's outcome through py4j: whether a cleanup left work for a later one (the
engine skips the next cleanup of unchanged state only when it did not)."""
from __future__ import annotations

from pathlib import Path

# Versions past 2^32 reach the JVM as Longs through py4j (Scala's tuple holds boxed Longs).
HEAD = 2**32 + 5
UNIQUE_ID = "0b5a2c1e-7d3f-4e8a-9c6b-2f1d0e9a8b7c"


def _cleanup(spark, store: Path, head_id: str | None, by_lineage: bool):
    jvm = spark._jvm
    files = jvm.io.keyedstate.checkpoint.CheckpointFiles(jvm.org.apache.hadoop.fs.Path(store.as_uri()),
                                                         spark._jsc.hadoopConfiguration())
    head = jvm.scala.Tuple2(HEAD, jvm.scala.Option.apply(head_id))
    return jvm.io.keyedstate.checkpoint.CheckpointCleanup.run(files, 100, head, by_lineage)


def test_a_young_temp_file_leaves_a_cleanup_without_a_base_unsettled(spark, tmp_path):
    """A write in progress (or one killed less than the grace period ago) keeps its temp file;
    the next cleanup must run again to delete it once it is old: not settled."""
    store = tmp_path / "store"
    store.mkdir()
    (store / ".3.ks-changelog.abc.tmp").write_bytes(b"x")
    outcome = _cleanup(spark, store, None, False)
    assert (outcome.deleted(), outcome.settled()) == (0, False)
    assert (store / ".3.ks-changelog.abc.tmp").exists()


def test_an_unreadable_changelog_header_leaves_a_lineage_cleanup_unsettled(spark, tmp_path):
    """Under checkpoint format 2 the committed chain is walked through changelog headers; one
    that cannot be read now (a transient storage error, a corrupt file) stops the chain short,
    so this cleanup chose no base: a later one must try again."""
    store = tmp_path / "store"
    store.mkdir()
    header = b"KSCHLOG2\x00\x02\x00" + b"\x00\x00\x00\x02{}" + b"\x00\x00\x00\x00"  # its CRC-32 is wrong
    (store / f"{HEAD}_{UNIQUE_ID}.ks-changelog").write_bytes(header)
    outcome = _cleanup(spark, store, UNIQUE_ID, True)
    assert (outcome.deleted(), outcome.settled()) == (0, False)
