"""CheckpointCleanup's outcome through py4j: whether a cleanup left work for a later one (the
engine skips the next cleanup of unchanged state only when it did not)."""
from __future__ import annotations

import os
from pathlib import Path

from support.durability import arm, disarm, objtest_location

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


V = 2**32  # versions past 2^32 reach the JVM as Longs (see HEAD)


def _operator_with_a_lender(tmp_path: Path, borrower_lists: list[str]) -> tuple[Path, Path]:
    """Partition 0 with snapshots V + 3 and V + 5 (its files A listed by 3, B by 5, C by none) and partition
    4, a rescale's heir of 0 whose manifest lists ``borrower_lists``; 0 holds 4's borrower marker."""
    from keyedstate.formats import manifest as mf

    lender, borrower = tmp_path / "state" / "0" / "0", tmp_path / "state" / "0" / "4"
    for d in (lender / "ks-files", borrower / "ks-files"):
        d.mkdir(parents=True)
    for name in "ABC":
        (lender / "ks-files" / f"x-{name}.sst").write_bytes(name.encode() * 10)
    for version, name in ((V + 3, "A"), (V + 5, "B")):
        listed = (mf.SnapshotFile("000009.sst", f"ks-files/x-{name}.sst", 10),)
        (lender / f"{version}.ks-snapshot").write_bytes(mf.encode(mf.Manifest(version, 8, 1, listed)))
    shared = tuple(mf.SnapshotFile(f"00001{i}.sst", path, 10) for i, path in enumerate(borrower_lists))
    (borrower / f"{V + 6}.ks-snapshot").write_bytes(mf.encode(mf.Manifest(V + 6, 8, 1, shared)))
    (lender / "ks-borrower-4").write_bytes(b"")
    old = 1_000_000_000  # the files predate the manifests: not an upload in progress
    for f in (lender / "ks-files").iterdir():
        os.utime(f, (old, old))
    return lender, borrower


def _cleanup_at(spark, store: Path, head: int, retain: int, uri: str | None = None):
    jvm = spark._jvm
    files = jvm.io.keyedstate.checkpoint.CheckpointFiles(jvm.org.apache.hadoop.fs.Path(uri or store.as_uri()),
                                                         spark._jsc.hadoopConfiguration())
    return jvm.io.keyedstate.checkpoint.CheckpointCleanup.run(files, retain, jvm.scala.Tuple2(V + head, jvm.scala.Option.empty()), False)


def test_cleanup_keeps_a_file_that_a_rescale_heir_still_lists(spark, tmp_path):
    """A rescale's heir lists files in its parent's ks-files/: the parent's cleanup keeps those
    while any manifest of the heir lists them, though no kept manifest of its own does."""
    lender, _ = _operator_with_a_lender(tmp_path, ["../0/ks-files/x-A.sst"])
    _cleanup_at(spark, lender, 7, 1)  # base V + 5: manifest V + 3 goes, and with it 0's own listing of A
    assert not (lender / f"{V + 3}.ks-snapshot").exists()
    assert sorted(p.name for p in (lender / "ks-files").iterdir()) == ["x-A.sst", "x-B.sst"]
    assert (lender / "ks-borrower-4").exists()


def test_cleanup_drops_a_borrower_marker_once_the_heir_lists_nothing_of_its(spark, tmp_path):
    """Once no manifest of the heir lists a file of the parent, the marker goes, and so do the
    files no one lists."""
    lender, borrower = _operator_with_a_lender(tmp_path, ["ks-files/own.sst"])
    (borrower / "ks-files" / "own.sst").write_bytes(b"o" * 10)
    _cleanup_at(spark, lender, 7, 1)
    assert sorted(p.name for p in (lender / "ks-files").iterdir()) == ["x-B.sst"]
    assert not (lender / "ks-borrower-4").exists()


def _store_cleanup(spark, store: Path, uri: str | None = None):
    jvm = spark._jvm
    files = jvm.io.keyedstate.checkpoint.CheckpointFiles(jvm.org.apache.hadoop.fs.Path(uri or store.as_uri()),
                                                         spark._jsc.hadoopConfiguration())
    cleanup = jvm.io.keyedstate.checkpoint.StoreCleanup(files)
    return lambda head, newest_snapshot: cleanup.run(1, V + head, jvm.scala.Option.empty(), V + newest_snapshot, False)


def _heir_moves_on(borrower: Path) -> None:
    """The heir's next snapshot (V + 8) lists only a file of its own, as after a compaction."""
    from keyedstate.formats import manifest as mf

    (borrower / "ks-files" / "own.sst").write_bytes(b"o" * 10)
    own = (mf.SnapshotFile("000020.sst", "ks-files/own.sst", 10),)
    (borrower / f"{V + 8}.ks-snapshot").write_bytes(mf.encode(mf.Manifest(V + 8, 8, 1, own)))


def test_the_heir_that_drops_the_last_listing_of_a_parents_file_deletes_it(spark, tmp_path):
    """The parent's cleanup ran while the heir listed its file A; the heir's cleanup that deletes
    its last manifest listing A deletes A and its marker in the parent, with no later cleanup
    of the parent (which a stopped query never runs)."""
    lender, borrower = _operator_with_a_lender(tmp_path, ["../0/ks-files/x-A.sst"])
    _cleanup_at(spark, lender, 7, 1)
    heir_cleanup = _store_cleanup(spark, borrower)
    heir_cleanup(7, 6)
    assert sorted(p.name for p in (lender / "ks-files").iterdir()) == ["x-A.sst", "x-B.sst"]
    _heir_moves_on(borrower)
    heir_cleanup(9, 8)
    assert not (borrower / f"{V + 6}.ks-snapshot").exists()
    assert sorted(p.name for p in (lender / "ks-files").iterdir()) == ["x-B.sst"]
    assert not (lender / "ks-borrower-4").exists()


def test_a_new_heir_engine_releases_what_the_manifests_it_deletes_listed(spark, tmp_path):
    """An engine whose earlier cleanups had no base (a young run, or a restart) does not know what
    its kept manifests listed before: its first cleanup that deletes manifests reads them, and
    deletes the parent's file A that only they listed."""
    lender, borrower = _operator_with_a_lender(tmp_path, ["../0/ks-files/x-A.sst"])
    _cleanup_at(spark, lender, 7, 1)
    _heir_moves_on(borrower)
    heir_cleanup = _store_cleanup(spark, borrower)
    heir_cleanup(6, 6)  # no snapshot at or below V + 5: no base, nothing deleted
    assert (borrower / f"{V + 6}.ks-snapshot").exists()
    heir_cleanup(9, 8)
    assert not (borrower / f"{V + 6}.ks-snapshot").exists()
    assert sorted(p.name for p in (lender / "ks-files").iterdir()) == ["x-B.sst"]
    assert not (lender / "ks-borrower-4").exists()

def test_a_heir_keeps_a_parents_file_that_the_parent_or_another_heir_lists(spark, tmp_path):
    """The heir dropping its listing of A and B deletes neither while another heir (5) lists A
    and the parent lists B; its marker goes all the same."""
    from keyedstate.formats import manifest as mf

    lender, borrower = _operator_with_a_lender(tmp_path, ["../0/ks-files/x-A.sst", "../0/ks-files/x-B.sst"])
    other = lender.parent / "5"
    (other / "ks-files").mkdir(parents=True)
    shared = (mf.SnapshotFile("000011.sst", "../0/ks-files/x-A.sst", 10),)
    (other / f"{V + 6}.ks-snapshot").write_bytes(mf.encode(mf.Manifest(V + 6, 8, 1, shared)))
    (lender / "ks-borrower-5").write_bytes(b"")
    heir_cleanup = _store_cleanup(spark, borrower)
    heir_cleanup(7, 6)
    _heir_moves_on(borrower)
    heir_cleanup(9, 8)
    assert sorted(p.name for p in (lender / "ks-files").iterdir()) == ["x-A.sst", "x-B.sst", "x-C.sst"]
    assert not (lender / "ks-borrower-4").exists() and (lender / "ks-borrower-5").exists()


def test_a_heir_that_cannot_list_its_parent_keeps_the_parents_file_for_a_later_cleanup(spark):
    """The heir's cleanup that drops its last listing of the parent's file A meets a storage error
    listing the parent: its own cleanup still ends (its old manifest goes), A and the marker stay,
    and its next cleanup, once the parent lists again, deletes both."""
    location, local = objtest_location(spark, "unlisted-lender")
    lender, borrower = _operator_with_a_lender(local, ["../0/ks-files/x-A.sst"])
    _cleanup_at(spark, lender, 7, 1)
    heir_cleanup = _store_cleanup(spark, borrower, f"{location}/state/0/4")
    heir_cleanup(7, 6)
    _heir_moves_on(borrower)
    arm(spark, listStatus={"path": "/state/0/0", "nth": 1, "times": 1000})
    try:
        heir_cleanup(9, 8)
    finally:
        disarm(spark)
    assert not (borrower / f"{V + 6}.ks-snapshot").exists()
    assert sorted(p.name for p in (lender / "ks-files").iterdir()) == ["x-A.sst", "x-B.sst"]
    assert (lender / "ks-borrower-4").exists()
    heir_cleanup(9, 8)
    assert sorted(p.name for p in (lender / "ks-files").iterdir()) == ["x-B.sst"]
    assert not (lender / "ks-borrower-4").exists()


def test_a_parent_that_cannot_list_its_heir_keeps_every_file_until_it_can(spark):
    """The parent's cleanup meets a storage error listing its heir (whose manifest lists A): the
    cleanup ends unsettled, deleting no snapshot file; once the heir lists again, the next
    cleanup deletes C, which no one lists, and keeps A."""
    location, local = objtest_location(spark, "unlisted-borrower")
    lender, _ = _operator_with_a_lender(local, ["../0/ks-files/x-A.sst"])
    arm(spark, listStatus={"path": "/state/0/4", "nth": 1, "times": 1000})
    try:
        outcome = _cleanup_at(spark, lender, 7, 1, f"{location}/state/0/0")
    finally:
        disarm(spark)
    assert not outcome.settled()
    assert not (lender / f"{V + 3}.ks-snapshot").exists()
    assert sorted(p.name for p in (lender / "ks-files").iterdir()) == ["x-A.sst", "x-B.sst", "x-C.sst"]
    _cleanup_at(spark, lender, 7, 1, f"{location}/state/0/0")
    assert sorted(p.name for p in (lender / "ks-files").iterdir()) == ["x-A.sst", "x-B.sst"]


def test_a_heir_whose_old_manifest_failed_to_go_keeps_its_marker(spark, tmp_path):
    """The heir's cleanup cannot delete its old manifest, which lists the parent's file C (a local
    file system's delete fails without an error): the marker stays while that manifest lists C,
    so the parent's cleanup keeps C."""
    import subprocess

    lender, borrower = _operator_with_a_lender(tmp_path, ["../0/ks-files/x-C.sst"])
    heir_cleanup = _store_cleanup(spark, borrower)
    heir_cleanup(7, 6)
    _heir_moves_on(borrower)
    old = borrower / f"{V + 6}.ks-snapshot"
    # Undeletable: immutable for root (who may delete any file), a read-only directory otherwise.
    pin, unpin = ((["chattr", "+i", str(old)], ["chattr", "-i", str(old)]) if os.geteuid() == 0
                  else (["chmod", "a-w", str(borrower)], ["chmod", "u+w", str(borrower)]))
    if subprocess.run(pin, capture_output=True).returncode != 0:
        import pytest
        pytest.skip(f"{pin[0]} cannot make {old} undeletable here")
    try:
        heir_cleanup(9, 8)
        assert old.exists()
        assert (lender / "ks-borrower-4").exists()
        _cleanup_at(spark, lender, 7, 1)
        assert "x-C.sst" in {p.name for p in (lender / "ks-files").iterdir()}
    finally:
        subprocess.run(unpin, check=True)


def test_an_engine_lists_again_only_once_retention_reaches_a_newer_snapshot(spark, tmp_path):
    """After a cleanup that settled with base V + 2, retention reaching V + 5 and V + 6 still finds
    base V + 2 (the next snapshot is V + 7): those cleanups are skipped, without a listing, so a
    file dropped in meanwhile stays; the one at V + 8 takes base V + 7 and deletes it."""
    from keyedstate.formats import manifest as mf

    store = tmp_path / "state" / "0" / "0"
    (store / "ks-files").mkdir(parents=True)
    for version in (V + 2, V + 7):
        (store / "ks-files" / f"{version}.sst").write_bytes(b"s" * 10)
        listed = (mf.SnapshotFile("000009.sst", f"ks-files/{version}.sst", 10),)
        (store / f"{version}.ks-snapshot").write_bytes(mf.encode(mf.Manifest(version, 8, 1, listed)))
    old = 1_000_000_000
    for f in (store / "ks-files").iterdir():
        os.utime(f, (old, old))
    cleanup = _store_cleanup(spark, store)  # retains 1 version before the head
    cleanup(4, 7)
    assert (store / f"{V + 2}.ks-snapshot").exists()
    orphan = store / "ks-files" / "orphan.sst"  # as a killed upload leaves one
    orphan.write_bytes(b"o")
    os.utime(orphan, (old, old))
    assert cleanup(6, 7) == 0 and cleanup(7, 7) == 0
    assert orphan.exists() and (store / f"{V + 2}.ks-snapshot").exists()
    assert cleanup(8, 7) == 3  # manifest V + 2, its file and the orphan
    assert sorted(p.name for p in (store / "ks-files").iterdir()) == [f"{V + 7}.sst"]


def test_a_lineage_engine_lists_again_for_another_attempt_an_older_head_or_a_newer_base(spark, tmp_path):
    """Under checkpoint format 2 a settled cleanup covers only heads of newer versions (whatever
    their id) while retention stays below the next snapshot: another attempt of the head's version
    or an older head runs in full (an orphan file goes); a newer head of another attempt is
    skipped with every retained version's files kept, until retention reaches that snapshot."""
    from keyedstate.formats import changelog as cl
    from keyedstate.formats import manifest as mf

    store = tmp_path / "store"
    (store / "ks-files").mkdir(parents=True)

    def uid(attempt: str, version: int) -> str:
        return f"{attempt}0000000-0000-4000-8000-{version:012d}"

    def write_changelog(version: int, attempt: str, lineage: list[tuple[int, str]]) -> None:
        meta = {"uniqueId": uid(attempt, version), "lineage": [[V + v, uid(a, v)] for v, a in lineage]}
        name = f"{V + version}_{uid(attempt, version)}.ks-changelog"
        (store / name).write_bytes(cl.compress(cl.encode(V + version, 8, []), meta))

    old = 1_000_000_000

    def orphan(name: str) -> Path:
        path = store / "ks-files" / name  # as a killed upload leaves one
        path.write_bytes(b"o")
        os.utime(path, (old, old))
        return path

    for version in range(1, 9):
        write_changelog(version, "a", [(v, "a") for v in range(version - 1, 0, -1)])
    for version in (2, 7):
        (store / "ks-files" / f"{version}.sst").write_bytes(b"s" * 10)
        os.utime(store / "ks-files" / f"{version}.sst", (old, old))
        listed = (mf.SnapshotFile("000009.sst", f"ks-files/{version}.sst", 10),)
        name = f"{V + version}_{uid('a', version)}.ks-snapshot"
        (store / name).write_bytes(mf.encode(mf.Manifest(V + version, 8, 1, listed)))
    jvm = spark._jvm
    files = jvm.io.keyedstate.checkpoint.CheckpointFiles(jvm.org.apache.hadoop.fs.Path(store.as_uri()),
                                                         spark._jsc.hadoopConfiguration())
    engine = jvm.io.keyedstate.checkpoint.StoreCleanup(files)

    def cleanup(version: int, attempt: str) -> int:  # retains 2 versions before the head
        return engine.run(2, V + version, jvm.scala.Option.apply(uid(attempt, version)), V + 7, True)

    assert cleanup(8, "a") == 2  # base V + 2: changelogs V + 1, V + 2
    write_changelog(8, "e", [(v, "a") for v in range(7, 0, -1)])
    first = orphan("o1.sst")
    assert cleanup(8, "e") == 1 and not first.exists()  # another attempt of the head's version
    second = orphan("o2.sst")
    assert cleanup(7, "a") == 1 and not second.exists()  # an older head (a reload)
    write_changelog(8, "c", [(v, "a") for v in range(7, 0, -1)])
    third = orphan("o3.sst")
    assert cleanup(8, "c") == 0 and third.exists()  # retention V + 6 is below snapshot V + 7
    kept = sorted(p.name for p in store.iterdir())
    assert kept == sorted([f"{V + v}_{uid('a', v)}.ks-changelog" for v in range(3, 9)]
                          + [f"{V + 8}_{uid(a, 8)}.ks-changelog" for a in "ce"]
                          + [f"{V + v}_{uid('a', v)}.ks-snapshot" for v in (2, 7)] + ["ks-files"])
    write_changelog(9, "c", [(8, "c")] + [(v, "a") for v in range(7, 0, -1)])
    # retention V + 7 reaches the snapshot: changelogs V + 3 to V + 7, manifest V + 2, its file, the orphan
    assert cleanup(9, "c") == 8
    assert sorted(p.name for p in (store / "ks-files").iterdir()) == ["7.sst"]
    assert sorted(p.name for p in store.glob("*.ks-*")) == sorted(
        [f"{V + 8}_{uid(a, 8)}.ks-changelog" for a in "ace"] + [f"{V + 9}_{uid('c', 9)}.ks-changelog",
                                                             f"{V + 7}_{uid('a', 7)}.ks-snapshot"])


def test_another_writers_snapshot_past_retention_is_taken_once_this_engine_uploads(spark, tmp_path):
    """A cleanup that settled with no snapshot past its retention covers every newer head, so a
    snapshot another writer (a stopped run's last upload) adds meanwhile waits, its versions'
    changelogs kept; this engine's next upload lists again, and the newest base is taken."""
    from keyedstate.formats import manifest as mf

    store = tmp_path / "state" / "0" / "0"
    (store / "ks-files").mkdir(parents=True)
    old = 1_000_000_000

    def snapshot(version: int) -> None:
        (store / "ks-files" / f"{version}.sst").write_bytes(b"s" * 10)
        os.utime(store / "ks-files" / f"{version}.sst", (old, old))
        listed = (mf.SnapshotFile("000009.sst", f"ks-files/{version}.sst", 10),)
        (store / f"{V + version}.ks-snapshot").write_bytes(mf.encode(mf.Manifest(version + V, 8, 1, listed)))

    for version in range(1, 13):
        (store / f"{V + version}.ks-changelog").write_bytes(b"")
    snapshot(2)
    cleanup = _store_cleanup(spark, store)  # retains 1 version before the head
    assert cleanup(4, 2) == 2  # base V + 2: changelogs V + 1, V + 2
    snapshot(5)  # another writer's
    assert cleanup(6, 2) == 0 and cleanup(12, 2) == 0
    assert (store / f"{V + 2}.ks-snapshot").exists() and (store / f"{V + 3}.ks-changelog").exists()
    snapshot(11)  # this engine's upload
    # base V + 11: changelogs V + 3 to V + 11, manifests V + 2 and V + 5 and their files
    assert cleanup(12, 11) == 13
    assert sorted(p.name for p in store.glob("*.ks-*")) == [f"{V + 11}.ks-snapshot", f"{V + 12}.ks-changelog"]
    assert sorted(p.name for p in (store / "ks-files").iterdir()) == ["11.sst"]


def test_a_changelog_opened_ahead_of_its_commit_survives_a_cleanup(spark, tmp_path):
    """A commit opens its changelog's temporary file when its task starts (off a local disk), so
    a cleanup that runs meanwhile finds a temp file younger than an hour but older than its base
    manifest. Above the head it is a commit in progress and stays; at or below the head it is a
    killed write's and goes."""
    import time
    import uuid

    from keyedstate.formats import manifest as mf

    store = tmp_path / "state" / "0" / "0"
    (store / "ks-files").mkdir(parents=True)
    (store / "ks-files" / "base.sst").write_bytes(b"s" * 10)
    listed = (mf.SnapshotFile("000009.sst", "ks-files/base.sst", 10),)
    (store / f"{V + 2}.ks-snapshot").write_bytes(mf.encode(mf.Manifest(V + 2, 8, 1, listed)))
    opened_ahead = store / f".{V + 5}.ks-changelog.{uuid.uuid4()}.tmp"
    killed = store / f".{V + 3}.ks-changelog.{uuid.uuid4()}.tmp"
    ten_minutes_ago = time.time() - 600
    for temp in (opened_ahead, killed):
        temp.write_bytes(b"x")
        os.utime(temp, (ten_minutes_ago, ten_minutes_ago))
    _store_cleanup(spark, store)(4, 2)  # head V + 4, base V + 2
    assert opened_ahead.exists() and not killed.exists()


def test_a_changelog_opened_ahead_stays_however_long_its_task_computes(spark, tmp_path):
    """A changelog opened ahead lives as long as its task computes, which may take over an hour
    (on HDFS its modification time stays the create's until the commit): above the head it is
    never taken for a killed write's, whatever its age, or the task's own maintenance deletes
    it and every retry's commit fails. Once the head passes it, age decides again."""
    import time
    import uuid

    store = tmp_path / "state" / "0" / "0"
    store.mkdir(parents=True)
    opened_ahead = store / f".{V + 5}.ks-changelog.{uuid.uuid4()}.TID7.tmp"
    killed = store / f".{V + 4}.ks-changelog.{uuid.uuid4()}.tmp"
    two_hours_ago = time.time() - 2 * 3600
    for temp in (opened_ahead, killed):
        temp.write_bytes(b"x")
        os.utime(temp, (two_hours_ago, two_hours_ago))
    cleanup = _store_cleanup(spark, store)
    cleanup(4, 0)  # head V + 4
    assert opened_ahead.exists() and not killed.exists()
    _store_cleanup(spark, store)(5, 0)  # the head passed it: a killed write's
    assert not opened_ahead.exists()


def _scaled_down_operator(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """Partitions 0, 1 and 2 live and 5 retired at version V + 4 by a scale-down (1 holds its
    marker). 5 holds changelogs and a manifest listing its own q.sst and 0's x-A.sst (0 holds its
    borrower marker and lists A in no manifest); 5 lent lent.sst to 2, whose manifest lists it."""
    from keyedstate.formats import manifest as mf

    op = tmp_path / "state" / "0"
    lender, live, borrower, retired = (op / str(p) for p in (0, 1, 2, 5))
    for d in (lender, live, borrower, retired):
        (d / "ks-files").mkdir(parents=True)

    def snapshot(d: Path, version: int, *paths: str) -> None:
        listed = tuple(mf.SnapshotFile(f"00001{i}.sst", path, 1) for i, path in enumerate(paths))
        (d / f"{version}.ks-snapshot").write_bytes(mf.encode(mf.Manifest(version, 8, 1, listed)))

    old = 1_000_000_000
    for d, name in ((lender, "x-A.sst"), (lender, "x-B.sst"), (retired, "q.sst"), (retired, "lent.sst"),
                    (live, "p3.sst"), (live, "p5.sst")):
        (d / "ks-files" / name).write_bytes(b"s")
        os.utime(d / "ks-files" / name, (old, old))
    snapshot(lender, V + 5, "ks-files/x-B.sst")
    (lender / "ks-borrower-5").write_bytes(b"")
    snapshot(retired, V + 2, "ks-files/q.sst", "../0/ks-files/x-A.sst")
    for v in (1, 2, 3):
        (retired / f"{V + v}.ks-changelog").write_bytes(b"c")
    (retired / "ks-borrower-2").write_bytes(b"")
    snapshot(borrower, V + 5, "../5/ks-files/lent.sst")
    snapshot(live, V + 3, "ks-files/p3.sst")
    snapshot(live, V + 5, "ks-files/p5.sst")
    (live / f"ks-retired-5-{V + 4}").write_bytes(b"")
    return lender, live, borrower, retired


def _names(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())


def test_a_partition_deletes_what_a_scale_down_retired_once_its_retention_passes_the_scale_down(spark, tmp_path):
    """1's cleanup leaves the retired 5 alone while it retains a version below V + 4; past it, it
    deletes 5's changelogs, manifests and files, releases 0's file that only 5 listed (and 5's
    marker in 0), and keeps lent.sst while 2 lists it, with its marker; once 2 lists it no more,
    the next cleanup deletes it and the marker of 5 in 1."""
    from keyedstate.formats import manifest as mf

    lender, live, borrower, retired = _scaled_down_operator(tmp_path)
    before = _names(retired)
    outcome = _cleanup_at(spark, live, 5, 1)  # base V + 3: below the scale-down
    assert _names(retired) == before and (live / f"ks-retired-5-{V + 4}").exists()
    outcome = _cleanup_at(spark, live, 7, 1)  # base V + 5
    assert not outcome.settled()
    assert _names(retired) == ["ks-borrower-2", "ks-files/lent.sst"]
    assert _names(lender) == [f"{V + 5}.ks-snapshot", "ks-files/x-B.sst"]
    assert (live / f"ks-retired-5-{V + 4}").exists()
    (borrower / f"{V + 5}.ks-snapshot").unlink()  # 2 moved on: its newer snapshot lists its own file
    (borrower / f"{V + 7}.ks-snapshot").write_bytes(mf.encode(mf.Manifest(V + 7, 8, 1, ())))
    outcome = _cleanup_at(spark, live, 7, 1)
    assert outcome.settled()
    assert _names(retired) == []
    assert _names(live) == [f"{V + 5}.ks-snapshot", "ks-files/p5.sst"]


def test_a_retired_partition_that_holds_a_later_version_is_live_again_and_stays(spark, tmp_path):
    """A marker whose partition holds a version at or past the scale-down's (a rolled-back
    scale-down, or a later scale-up recreated it) goes, and nothing of that partition does."""
    _, live, _, retired = _scaled_down_operator(tmp_path)
    (retired / f"{V + 4}.ks-changelog").write_bytes(b"c")
    before = _names(retired)
    _cleanup_at(spark, live, 7, 1)
    assert _names(retired) == before
    assert not (live / f"ks-retired-5-{V + 4}").exists()


def test_a_partition_retired_before_a_retired_one_goes_with_it(spark, tmp_path):
    """The retired 5 holds the marker of 13, which an earlier scale-down retired: 1's cleanup
    deletes 13's files with 5's. A marker in 5 past 5's own retirement (naming the live 2; no
    scale-down writes one) goes unfollowed."""
    from keyedstate.formats import manifest as mf

    _, live, borrower, retired = _scaled_down_operator(tmp_path)
    earlier = retired.parent / "13"
    (earlier / "ks-files").mkdir(parents=True)
    (earlier / "ks-files" / "e.sst").write_bytes(b"e")
    os.utime(earlier / "ks-files" / "e.sst", (1_000_000_000, 1_000_000_000))
    listed = (mf.SnapshotFile("000011.sst", "ks-files/e.sst", 1),)
    (earlier / f"{V + 1}.ks-snapshot").write_bytes(mf.encode(mf.Manifest(V + 1, 8, 1, listed)))
    (retired / f"ks-retired-13-{V + 2}").write_bytes(b"")
    (retired / f"ks-retired-2-{V + 9}").write_bytes(b"")
    (borrower / f"{V + 5}.ks-snapshot").unlink()  # 2 lists nothing of 5's: 5 can go whole
    (borrower / f"{V + 7}.ks-snapshot").write_bytes(mf.encode(mf.Manifest(V + 7, 8, 1, ())))
    outcome = _cleanup_at(spark, live, 7, 1)
    assert _names(earlier) == []
    assert _names(borrower) == [f"{V + 7}.ks-snapshot"]
    assert _names(retired) == []
    assert not (live / f"ks-retired-5-{V + 4}").exists() and outcome.settled()


def test_a_file_not_of_keyedstates_in_a_retired_partition_neither_throws_nor_keeps_the_marker(spark, tmp_path):
    """A name in the retired 5's ks-files/ that is no snapshot file's (a desktop's .DS_Store, a
    checksum beside a copied file) is not keyedstate's: 1's cleanup deletes the rest of 5, leaves
    those, drops the marker and settles, without an error out of the cleanup."""
    from keyedstate.formats import manifest as mf

    _, live, borrower, retired = _scaled_down_operator(tmp_path)
    (borrower / f"{V + 5}.ks-snapshot").unlink()  # 2 lists nothing of 5's: 5 can go whole
    (borrower / f"{V + 7}.ks-snapshot").write_bytes(mf.encode(mf.Manifest(V + 7, 8, 1, ())))
    for name in (".DS_Store", "notes~"):
        (retired / "ks-files" / name).write_bytes(b"j")
        os.utime(retired / "ks-files" / name, (1_000_000_000, 1_000_000_000))
    outcome = _cleanup_at(spark, live, 7, 1)
    assert _names(retired) == ["ks-files/.DS_Store", "ks-files/notes~"]
    assert not (live / f"ks-retired-5-{V + 4}").exists() and outcome.settled()


def test_a_file_not_of_keyedstates_in_a_live_partition_neither_throws_nor_unsettles(spark, tmp_path):
    """The same in a partition's own ks-files/: left, the rest of the cleanup done, settled."""
    lender, _ = _operator_with_a_lender(tmp_path, ["ks-files/own.sst"])
    (tmp_path / "state" / "0" / "4" / "ks-files" / "own.sst").write_bytes(b"o" * 10)
    (lender / "ks-files" / ".DS_Store").write_bytes(b"j")
    os.utime(lender / "ks-files" / ".DS_Store", (1_000_000_000, 1_000_000_000))
    outcome = _cleanup_at(spark, lender, 7, 1)
    assert sorted(p.name for p in (lender / "ks-files").iterdir()) == [".DS_Store", "x-B.sst"]
    assert outcome.settled()


def test_a_name_hadoop_cannot_parse_in_a_retired_partition_fails_no_cleanup(spark, tmp_path):
    """A temporary file's name Hadoop's Path cannot parse (a ':' reads as a URI scheme) in the
    retired 5 is no write of keyedstate's: 1's cleanup retires the rest of 5, leaves that file,
    drops the marker and settles, with no error out of the cleanup."""
    from keyedstate.formats import manifest as mf

    _, live, borrower, retired = _scaled_down_operator(tmp_path)
    (borrower / f"{V + 5}.ks-snapshot").unlink()
    (borrower / f"{V + 7}.ks-snapshot").write_bytes(mf.encode(mf.Manifest(V + 7, 8, 1, ())))
    (retired / ".a:b.tmp").write_bytes(b"j")
    outcome = _cleanup_at(spark, live, 7, 1)
    assert _names(retired) == [".a:b.tmp"]
    assert not (live / f"ks-retired-5-{V + 4}").exists() and outcome.settled()


def test_a_marker_with_a_leading_zero_goes_once_its_partition_is_retired(spark, tmp_path):
    """`ks-retired-05-<v>` reads as the marker of 5 (FORMATS.md's digits): once 5 is retired it
    goes by its own name, as the canonical one does, instead of costing a listing of 5 on every
    later cleanup."""
    from keyedstate.formats import manifest as mf

    _, live, borrower, retired = _scaled_down_operator(tmp_path)
    (borrower / f"{V + 5}.ks-snapshot").unlink()
    (borrower / f"{V + 7}.ks-snapshot").write_bytes(mf.encode(mf.Manifest(V + 7, 8, 1, ())))
    (live / f"ks-retired-5-{V + 4}").rename(live / f"ks-retired-05-{V + 4}")
    (retired / f"ks-retired-013-0{V + 2}").write_bytes(b"")
    outcome = _cleanup_at(spark, live, 7, 1)
    assert _names(retired) == []
    assert not list(live.glob("ks-retired-*")) and outcome.settled()


def test_an_old_temp_name_hadoop_cannot_parse_fails_no_cleanup(spark, tmp_path):
    """A partition's own file named like a temporary file but with a ':' (which Hadoop's Path
    reads as a URI scheme; no write of keyedstate's names one so) is left: the cleanup deletes
    what it should and settles, with no error out of it."""
    lender, _ = _operator_with_a_lender(tmp_path, ["ks-files/own.sst"])
    (tmp_path / "state" / "0" / "4" / "ks-files" / "own.sst").write_bytes(b"o" * 10)
    (lender / ".a:b.tmp").write_bytes(b"j")
    os.utime(lender / ".a:b.tmp", (1_000_000_000, 1_000_000_000))
    outcome = _cleanup_at(spark, lender, 7, 1)
    assert sorted(p.name for p in (lender / "ks-files").iterdir()) == ["x-B.sst"]
    assert (lender / ".a:b.tmp").exists() and outcome.settled()


def test_a_join_store_retires_the_same_store_of_the_retired_partition_only(spark, tmp_path):
    """A join keeps each store in a subdirectory of the partition: the cleanup of 1's store
    'left' retires 5's 'left' (its manifest, own file, and the file of 1's it borrowed, released
    with its marker) and leaves 5's 'right' and 1's 'right', whose own cleanup does the same."""
    from keyedstate.formats import manifest as mf

    op, old = tmp_path / "state" / "0", 1_000_000_000

    def snapshot(d: Path, version: int, *paths: str) -> None:
        listed = tuple(mf.SnapshotFile(f"00001{i}.sst", path, 1) for i, path in enumerate(paths))
        (d / f"{version}.ks-snapshot").write_bytes(mf.encode(mf.Manifest(version, 8, 1, listed)))

    stores = {(p, s): op / str(p) / s for p in (1, 5) for s in ("left", "right")}
    for d in stores.values():
        (d / "ks-files").mkdir(parents=True)
        for name in ("f.sst", "g.sst"):
            (d / "ks-files" / name).write_bytes(b"s")
            os.utime(d / "ks-files" / name, (old, old))
    for s in ("left", "right"):
        snapshot(stores[(1, s)], V + 3, "ks-files/f.sst", "ks-files/g.sst")
        snapshot(stores[(1, s)], V + 5, "ks-files/f.sst")
        snapshot(stores[(5, s)], V + 2, "ks-files/f.sst", "../1/ks-files/g.sst")
        (stores[(1, s)] / "ks-borrower-5").write_bytes(b"")
        (stores[(1, s)] / f"ks-retired-5-{V + 4}").write_bytes(b"")
    right = {k: _names(d) for k, d in stores.items() if k[1] == "right"}
    jvm = spark._jvm
    files = jvm.io.keyedstate.checkpoint.CheckpointFiles(jvm.org.apache.hadoop.fs.Path(stores[(1, "left")].as_uri()),
                                                         spark._jsc.hadoopConfiguration(), False)
    outcome = jvm.io.keyedstate.checkpoint.CheckpointCleanup.run(
        files, 1, jvm.scala.Tuple2(V + 7, jvm.scala.Option.empty()), False)
    assert _names(stores[(5, "left")]) == []
    assert _names(stores[(1, "left")]) == [f"{V + 5}.ks-snapshot", "ks-files/f.sst"]
    assert {k: _names(d) for k, d in stores.items() if k[1] == "right"} == right
    assert outcome.settled()
