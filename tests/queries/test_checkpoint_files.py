"""What keyedstate leaves in the checkpoint: changelogs, incremental snapshots, cleanup,
key-group prefixes that match Spark's own hash, and clear errors for corrupt or foreign files."""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import functions as F

import keyedstate
from keyedstate.formats import changelog, keygroups

from support.constants import HDFS_PROVIDER, KS, PFX, PROVIDER_CONF
from support.driver import FileStream, collect_into, count_by_key, error_conditions, session_confs, wait_for


def versions(directory: Path, suffix: str) -> list[int]:
    return sorted(int(p.name[: -len(suffix)]) for p in directory.glob(f"*{suffix}"))


def manifest(directory: Path, version: int) -> dict:
    return json.loads((directory / f"{version}.ks-snapshot").read_text())


def test_snapshots_are_incremental_and_cleanup_keeps_only_retained_versions(spark, tmp_path):
    stream = FileStream(spark, tmp_path, "k STRING")
    out: dict = {}
    expected = Counter()
    with session_confs(spark, {PROVIDER_CONF: KS, PFX + "snapshotInterval": "2",
                               "spark.sql.streaming.minBatchesToRetain": "3"}):
        query = stream.start(count_by_key, collect_into(out))
        try:
            for batch in range(12):
                rows = [{"k": f"key-{(batch * 37 + i) % 300}"} for i in range(120)]
                expected.update(r["k"] for r in rows)
                stream.step(query, rows)
            part = stream.partition_dir()

            def cleaned() -> bool:
                logs, snaps = versions(part, ".ks-changelog"), versions(part, ".ks-snapshot")
                if not snaps or not logs or logs[0] <= 1:
                    return False
                referenced = {f["path"] for v in snaps for f in manifest(part, v)["files"]}
                stored = {f"ks-files/{p.name}" for p in (part / "ks-files").iterdir()
                          if not p.name.endswith(".crc")}
                return stored == referenced

            wait_for(cleaned, what="maintenance to upload snapshots and clean up")
            metrics = Counter()
            for progress in query.recentProgress:
                for op in progress["stateOperators"]:
                    metrics.update(op["customMetrics"])
        finally:
            query.stop()

        logs, snaps = versions(part, ".ks-changelog"), versions(part, ".ks-snapshot")
        latest = logs[-1]
        assert latest == 12
        base = snaps[0]
        # The oldest retained version (latest - 3 + 1) is loadable: a snapshot at or below it,
        # every changelog after that snapshot, and nothing older.
        assert base <= latest - 3 + 1
        assert logs == list(range(base + 1, latest + 1))
        # Snapshots share immutable SST files: an SST that a later snapshot still uses is not
        # uploaded again (same checkpoint path in both manifests); RocksDB compactions replace
        # SSTs, so which ones survive varies, but every survivor must be shared.
        ssts = [{f["name"]: f["path"] for f in manifest(part, v)["files"] if f["name"].endswith(".sst")}
                for v in snaps]
        assert len(snaps) >= 2
        for older, newer in zip(ssts, ssts[1:]):
            assert all(older[name] == newer[name] for name in older.keys() & newer.keys())
        assert metrics["keyedstateSnapshotFilesReused"] > 0
        assert metrics["keyedstateSnapshotFilesUploaded"] > 0

        # Restart: loads from the snapshot + changelogs and carries on exactly.
        stream.add([{"k": "key-0"}, {"k": "brand-new"}])
        expected.update(["key-0", "brand-new"])
        query = stream.start(count_by_key, collect_into(out))
        try:
            stream.settle(query)
        finally:
            query.stop()
    assert {k: v[1] for k, v in out.items()} == dict(expected)


def test_stored_key_groups_match_sparks_partitioning_hash(spark, tmp_path):
    stream = FileStream(spark, tmp_path, "k STRING")
    keys = [f"user-{i}" for i in range(200)] + ["", "ünïcødé", "a" * 50]
    with session_confs(spark, {PROVIDER_CONF: KS}):
        query = stream.start(count_by_key, collect_into({}))
        try:
            stream.step(query, [{"k": k} for k in keys])
        finally:
            query.stop()
    groups = keyedstate.conf.parse({})["keyGroups"]
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    expected = Counter(
        (r.g % partitions, r.g) for r in spark.createDataFrame([(k,) for k in keys], "k STRING")
        .select(F.expr(f"pmod(hash(k), {groups})").alias("g")).collect())
    found = Counter()
    for p in range(partitions):
        log = changelog.read_file(str(stream.partition_dir(partition=p) / "1.ks-changelog"))
        assert log.key_groups == groups
        for op, key, _ in log.records():
            group = keygroups.key_group_of_stored_key(key)
            found[(p, group)] += 1
    assert found == expected
    assert all(p == g % partitions for p, g in found)


def _three_batches(spark, stream, confs, provider=KS):
    with session_confs(spark, {PROVIDER_CONF: provider, **confs}):
        query = stream.start(count_by_key, collect_into({}))
        try:
            for batch in range(3):
                stream.step(query, [{"k": f"k{i}"} for i in range(batch, batch + 20)])
        finally:
            query.stop()


def _restart_error(spark, stream, confs) -> str:
    stream.add([{"k": "after-restart"}])
    return _start_error(spark, stream, confs)


def _start_error(spark, stream, confs) -> str:
    """Start the query on keyedstate with ``confs``; it must fail. Returns the error text."""
    return _start_failure(spark, stream, confs)[0]


def _start_failure(spark, stream, confs, noop: bool = False) -> tuple[str, list[str | None]]:
    """:func:`_start_error`'s text, and Spark's error classes along the exception's cause chain
    (``noop``: into a JVM sink, which passes on a task's error class; a foreachBatch function's
    error reaches the driver through Python, without it)."""
    with session_confs(spark, {PROVIDER_CONF: KS, **confs}):
        if noop:
            query = (count_by_key(stream.df()).writeStream.outputMode("update").format("noop")
                     .option("checkpointLocation", stream.checkpoint).start())
        else:
            query = stream.start(count_by_key, collect_into({}))
        try:
            with pytest.raises(Exception) as err:
                query.processAllAvailable()
        finally:
            query.stop()
    return str(err.value), error_conditions(err.value)


def test_truncated_changelog_fails_the_load_naming_the_file(spark, tmp_path):
    stream = FileStream(spark, tmp_path, "k STRING")
    _three_batches(spark, stream, {PFX + "snapshotInterval": "100"})
    victim = stream.partition_dir(partition=1) / "2.ks-changelog"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    message = _restart_error(spark, stream, {PFX + "snapshotInterval": "100"})
    assert str(victim) in message and "truncated or corrupt" in message


def _truncate(victim: Path) -> None:
    victim.write_text(victim.read_text()[:40])


def _list_a_file_twice(victim: Path) -> None:
    """A manifest that parses but lists one file name twice (two downloads to one local name)."""
    node = json.loads(victim.read_text())
    node["files"].append(node["files"][0])
    victim.write_text(json.dumps(node, separators=(",", ":")))
    (victim.parent / f".{victim.name}.crc").unlink(missing_ok=True)


SNAPSHOT_EVERY_VERSION = {PROVIDER_CONF: KS, PFX + "snapshotInterval": "1"}


def _snapshotted_at_3(spark, tmp_path) -> tuple[FileStream, dict, list[Path]]:
    """Three batches of 20 keys (k0..k21) with a snapshot every version; returns the stream, the
    query's output, and its two partitions once both hold the snapshot of version 3."""
    stream = FileStream(spark, tmp_path, "k STRING")
    out: dict = {}
    with session_confs(spark, SNAPSHOT_EVERY_VERSION):
        query = stream.start(count_by_key, collect_into(out))
        try:
            for batch in range(3):
                stream.step(query, [{"k": f"k{i}"} for i in range(batch, batch + 20)])
        finally:
            query.stop()
    parts = [stream.partition_dir(partition=p) for p in (0, 1)]
    wait_for(lambda: all(3 in versions(part, ".ks-snapshot") for part in parts), what="snapshots of version 3")
    return stream, out, parts


@pytest.mark.parametrize("corrupt", [_truncate, _list_a_file_twice], ids=["truncated", "a-file-listed-twice"])
def test_a_corrupt_snapshot_is_skipped_for_an_older_one_and_changelogs(spark, tmp_path, corrupt):
    """Spark's auto snapshot repair: the load warns, counts it, and rebuilds the version exactly."""
    stream, out, parts = _snapshotted_at_3(spark, tmp_path)
    for part in parts:
        corrupt(part / "3.ks-snapshot")
    with session_confs(spark, SNAPSHOT_EVERY_VERSION):
        query = stream.start(count_by_key, collect_into(out))
        try:
            stream.step(query, [{"k": "k5"}, {"k": "new"}])
            skipped = sum(op["customMetrics"].get("keyedstateSnapshotsSkipped", 0)
                          for p in query.recentProgress for op in p["stateOperators"])
        finally:
            query.stop()
    assert skipped >= 1
    assert out["k5"][1] == 4 and out["new"][1] == 1  # k5 was in all three batches, then once more


def test_a_restore_from_a_local_checkpoint_links_the_snapshots_table_files(spark, tmp_path):
    """On a local-disk checkpoint a restore hard-links the snapshot's RocksDB table files (RocksDB
    never writes one) where it copied them: no second copy on the same disk. The checkpoint's
    files keep their mode, and the restored state is exact."""
    local_parent = spark._jvm.java.lang.System.getProperty("java.io.tmpdir")  # the state's, without localDir
    if os.stat(local_parent).st_dev != os.stat(tmp_path).st_dev:
        pytest.skip(f"the checkpoint ({tmp_path}) and the local state ({local_parent}) are on two file systems")
    stream, out, parts = _snapshotted_at_3(spark, tmp_path)
    tables = [part / f["path"] for part in parts for f in manifest(part, 3)["files"] if f["name"].endswith(".sst")]
    assert tables, "the snapshots of version 3 list no table file"
    modes = {t: t.stat().st_mode for t in tables}
    assert {t: t.stat().st_nlink for t in tables} == {t: 1 for t in tables}  # nothing restored yet
    # Links seen while the restart runs: a restored store's first compaction may drop them soon after.
    linked = dict.fromkeys(tables, 1)
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for t in tables:
                linked[t] = max(linked[t], t.stat().st_nlink)
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with session_confs(spark, SNAPSHOT_EVERY_VERSION):
        query = stream.start(count_by_key, collect_into(out))
        try:
            stream.step(query, [{"k": "k5"}, {"k": "new"}])
        finally:
            query.stop()
            done.set()
            watcher.join()
    assert all(n >= 2 for n in linked.values()), f"table files copied, not linked: {linked}"
    assert {t: t.stat().st_mode for t in tables} == modes
    assert out["k5"][1] == 4 and out["new"][1] == 1  # k5 was in all three batches, then once more


def test_a_changelog_linked_to_a_file_outside_the_checkpoint_is_refused_naming_it(spark, tmp_path):
    """A symbolic link in place of a file would load another file's records (say, another
    query's changelog) as this store's: the load refuses it, as it does linked directories."""
    stream = FileStream(spark, tmp_path, "k STRING")
    _three_batches(spark, stream, {PFX + "snapshotInterval": "100"})
    victim = stream.partition_dir(partition=1) / "2.ks-changelog"
    elsewhere = tmp_path / "elsewhere" / "2.ks-changelog"
    elsewhere.parent.mkdir()
    shutil.copyfile(victim, elsewhere)
    victim.unlink()
    victim.symlink_to(elsewhere)
    message = _restart_error(spark, stream, {PFX + "snapshotInterval": "100"})
    assert str(victim) in message and "symbolic link" in message


def test_a_corrupt_snapshot_with_nothing_older_fails_the_load_naming_it(spark, tmp_path):
    stream = FileStream(spark, tmp_path, "k STRING")
    _three_batches(spark, stream, {PFX + "snapshotInterval": "1"})
    part = stream.partition_dir(partition=0)
    wait_for(lambda: 3 in versions(part, ".ks-snapshot"), what="snapshot of version 3")
    victim = part / "3.ks-snapshot"
    victim.write_text(victim.read_text()[:40])
    for older in [*part.glob("[12].ks-*")]:  # nothing else can rebuild version 3
        older.unlink()
    message = _restart_error(spark, stream, {PFX + "snapshotInterval": "1"})
    assert str(victim) in message and "truncated or corrupt" in message


def test_checkpoint_of_another_provider_is_refused(spark, tmp_path):
    ours = FileStream(spark, tmp_path / "ours", "k STRING")
    _three_batches(spark, ours, {})
    theirs = FileStream(spark, tmp_path / "theirs", "k STRING")
    _three_batches(spark, theirs, {}, provider=HDFS_PROVIDER)
    # Swap in the other provider's partition files (as a mis-copied checkpoint would).
    for p in (0, 1):
        shutil.rmtree(ours.partition_dir(partition=p))
        shutil.copytree(theirs.partition_dir(partition=p), ours.partition_dir(partition=p))
    ours.add([{"k": "after-restart"}])
    message, conditions = _start_failure(spark, ours, {}, noop=True)
    assert "another state store provider" in message and ".delta" in message
    # Spark's class for a state store that cannot load, as its own providers raise it
    assert conditions[0] == "STREAM_FAILED" and "CANNOT_LOAD_STATE_STORE.UNCATEGORIZED" in conditions, conditions


@pytest.mark.parametrize("key,value,expect,cls", [
    ("snapshotInterval", "abc", "an integer in [1, 1000000]", True),
    ("snapshotIntervall", "3", "Unknown keyedstate conf", False),
])
def test_bad_conf_fails_at_query_start_naming_the_key(spark, tmp_path, key, value, expect, cls):
    stream = FileStream(spark, tmp_path, "k STRING")
    stream.add([{"k": "a"}])
    message, conditions = _start_failure(spark, stream, {PFX + key: value})
    assert PFX + key in message and expect in message
    # A bad value is Spark's INVALID_CONF_VALUE (the query's cause); an unknown key fits no class.
    assert conditions[:2] == ["STREAM_FAILED", "INVALID_CONF_VALUE.REQUIREMENT" if cls else None], conditions


def test_state_reader_sees_what_the_query_wrote(spark, tmp_path):
    stream = FileStream(spark, tmp_path, "k STRING")
    out: dict = {}
    with session_confs(spark, {PROVIDER_CONF: KS}):
        query = stream.start(count_by_key, collect_into(out))
        try:
            for batch in range(3):
                stream.step(query, [{"k": f"k{i % 7}"} for i in range(batch * 5, batch * 5 + 11)])
        finally:
            query.stop()
        state = spark.read.format("statestore").load(stream.checkpoint)
        rows = {r[0]: r[1] for r in state.select("key.k", "value.*").collect()}
    assert rows == {k: v[1] for k, v in out.items()}
    assert len(rows) == 7
