"""Providers that outlive their run, overlap, or never see maintenance, must not destroy state.

* Overlap (issue 12's finding): Spark closes a stopped run's provider only at a later maintenance
  tick, after giving it one more snapshot or cleanup call, while the restarted run's provider of
  the same partition already commits, uploads and cleans up. Spark's two maintenance pools
  (snapshot, cleanup) allow any interleaving of those calls; the tests drive the providers
  through Spark's contract in such orders and then check that every retained version loads,
  exactly, in a fresh provider (a later restart).
* A maintenance call that fails is retried later, never thrown: Spark unloads and closes a
  provider whose maintenance threw, even while one of its stores is in use.
* OpenStores, keyed by run: a state data source reader of a running join's store must not stop
  that join's TTL cleanup (which consults the sibling store of the same run); tested with the
  join's TTL in tests/queries/test_ttl.py.
* Short runs: availableNow runs shorter than the maintenance interval still get snapshots (as
  soon as they are staged, and from the commit when none came for two intervals) and cleanup
  (once at each run's first load), so changelogs stay bounded.
"""
from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

import keyedstate
from keyedstate import checkpoint as ckpt
from keyedstate.offline.storage import LocalStorage
from keyedstate.checkpoint import Checkpoint
from support import testjar
from support.constants import PFX, STATE_PREFIX
from support.durability import (OBJECT_STORE_RULES, RUN_ID_KEY, deactivate, disarm, arm, objtest_location,
                                objtest_root, report_active)
from support.driver import wait_for
from support.jvm import LayerStore, scala_iter

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fault_root")]

KEYS = 30
RETAIN = 2
CONFS = {PFX + "snapshotInterval": "1", "spark.sql.streaming.minBatchesToRetain": str(RETAIN)}


class Run:
    """One query run's provider of a store partition, driven through Spark's provider contract,
    with a model of every version it committed."""

    def __init__(self, spark, location: str, format_version: str, history: dict, ids: dict,
                 confs: dict | None = None) -> None:
        self.run_id = str(uuid.uuid4())
        self.spark = spark
        self.layer = LayerStore(spark, location, confs={**CONFS, **(confs or {}),
                                                        STATE_PREFIX + "checkpointFormatVersion": format_version},
                                hadoop_conf={RUN_ID_KEY: self.run_id})
        self.history, self.ids = history, ids  # version -> {key: value}, version -> unique id
        report_active(spark, self.layer, self.run_id)

    def commit(self, version: int, after_load: Callable[[], None] | None = None) -> None:
        """Load ``version`` and commit ``version + 1`` with writes that depend on the version
        (``after_load`` runs between the load and the writes)."""
        store = self.layer.store(version, self.ids.get(version))
        if after_load is not None:
            after_load()
        state = dict(self.history[version])
        for i in range(6):
            key = (version * 7 + i * 5) % KEYS
            if i == 5 and key in state:
                store.remove(self.layer.key(key), "default")
                del state[key]
            else:
                self.layer.put(store, (key,), (version * 1000 + i,))
                state[key] = version * 1000 + i
        assert store.commit() == version + 1
        info = store.getStateStoreCheckpointInfo()
        if info.stateStoreCkptId().isDefined():
            self.ids[version + 1] = info.stateStoreCkptId().get()
        self.history[version + 1] = state

    def snapshot(self) -> None:
        self.layer.provider.doSnapshotMaintenance()

    def cleanup(self) -> None:
        self.layer.provider.doCleanupMaintenance()


def contents(layer: LayerStore, version: int, unique_id: str | None) -> dict:
    store = layer.store(version, unique_id)
    try:
        return {pair.key().getInt(0): pair.value().getLong(0) for pair in scala_iter(store.iterator("default"))}
    finally:
        store.abort()


@contextmanager
def restarted(spark, location: str, confs: dict | None = None) -> Iterator[LayerStore]:
    """A later restart: a fresh provider of ``location`` that no run owns."""
    fresh = LayerStore(spark, location, confs={**CONFS, **(confs or {})})
    try:
        yield fresh
    finally:
        fresh.close()


def close_runs(spark, *runs: Run | None) -> None:
    """What Spark does at last: closes each run's provider, and no run is active any more."""
    for run in runs:
        if run is not None:
            run.layer.close()
            deactivate(spark, run.run_id)


def assert_every_retained_version_loads(spark, location: str, format_version: str, history: dict, ids: dict) -> None:
    """A later restart loads each retained version exactly."""
    latest = max(history)
    with restarted(spark, location, {STATE_PREFIX + "checkpointFormatVersion": format_version}) as fresh:
        for version in range(max(1, latest - RETAIN + 1), latest + 1):
            assert contents(fresh, version, ids.get(version)) == history[version], f"version {version}"


# Interleavings of the stopped run's (A) calls with the restarted run's (B) commits and
# maintenance, as Spark's snapshot and cleanup pools allow them: "<A until it stops> | <then>".
# c = commit, s = snapshot maintenance, k = cleanup maintenance. Every commit stages a snapshot
# (snapshotInterval=1). On 932aed2 only maintenance uploaded staged snapshots, so "A.s" after the
# stop was A's late upload; since then each commit also starts its upload at once, so on main A
# usually has nothing left to upload then, and the upload side of the finding is tested directly by
# test_a_snapshot_never_lists_a_file_deleted_after_its_load below.
ORDERS = {
    "stale-upload-after-new-cleanup": "A.c A.c A.c | c s k c s k A.s A.k c s k",
    "old-cleanup-between-new-snapshot-and-cleanup": "A.c A.c A.c | c A.s s A.k k c s k c s k",
    "old-run-first": "A.c A.c A.c | A.k A.s c s k c s k c s k",
    "no-new-maintenance-until-the-end": "A.c A.c A.c | c c A.s c A.k s k",
    # Issue 12's finding, as it happened on 932aed2 (format 1; 4 of 4 runs failed there): B loads
    # version 9 from A's snapshot 5. RocksDB compacts L0 at four files, so A's snapshot 9
    # (uploaded late) no longer lists snapshot 5's SSTs, and B's cleanup deletes them; B's database
    # still holds one, and B's next snapshot listed its deleted path (every later load failed:
    # "cannot read .../ks-files/<uuid>-000012.sst: it is missing").
    "new-snapshot-reuses-a-file-cleanup-deleted":
        "A.c A.c A.c A.c A.c A.s A.c A.c A.c A.c | c A.s k s k c s k",
}


@pytest.mark.parametrize("format_version", ["1", "2"])
@pytest.mark.parametrize("order", list(ORDERS), ids=list(ORDERS))
def test_an_overlapping_stopped_run_never_breaks_a_later_restart(spark, format_version, order):
    location = objtest_location(spark, "overlap")[0] + "/state"
    history, ids = {0: {}}, {}
    old = Run(spark, location, format_version, history, ids)
    new = None
    until_stop, after_stop = ORDERS[order].split(" | ")
    try:
        for step in until_stop.split():
            {"A.c": lambda: old.commit(max(history)), "A.s": old.snapshot, "A.k": old.cleanup}[step]()
        deactivate(spark, old.run_id)  # the run stops; Spark has not closed its provider yet
        new = Run(spark, location, format_version, history, ids)
        for step in after_stop.split():
            {"c": lambda: new.commit(max(history)), "s": new.snapshot, "k": new.cleanup,
             "A.s": old.snapshot, "A.k": old.cleanup}[step]()
            if step.startswith("A.") or step == "s":  # right after a snapshot upload or A's cleanup
                assert_every_retained_version_loads(spark, location, format_version, history, ids)
        assert_every_retained_version_loads(spark, location, format_version, history, ids)
    finally:
        close_runs(spark, old, new)
    # maintenance bounded what a load replays and removed what no retained version needs
    local = objtest_root(spark) / location.removeprefix("objtest://")
    changelogs = sorted(p.name for p in local.rglob("*.ks-changelog"))
    assert len(changelogs) <= RETAIN + 2, changelogs


def test_a_snapshot_never_lists_a_file_deleted_after_its_load(spark):
    """Issue 12.4, the upload side on its own: a run remembers the files of the snapshot it loaded,
    to list them again instead of copying them. One of them deleted since (by a cleanup that a
    newer manifest allowed, e.g. after an overlapping run's late upload) must be uploaded again,
    not listed: on 932aed2 the next snapshot listed the deleted path. Deterministic: the file is
    deleted between the load and the commit whose snapshot would reuse it."""
    location, local = objtest_location(spark, "reuse")
    history, ids = {0: {}}, {}
    old = Run(spark, location + "/state", "1", history, ids)
    new = None

    def manifest_of(version: int):
        found = next(local.rglob(f"{version}.ks-snapshot"), None)
        return None if found is None else (ckpt.read_manifest(found, version), found.parent)

    try:
        for version in range(2):  # two flushes: no compaction yet, so the next run keeps both SSTs
            old.commit(version)
        wait_for(lambda: old.snapshot() or manifest_of(2) is not None, timeout=30, what="the snapshot of version 2")
        wait_until_unchanged(local)
        deactivate(spark, old.run_id)
        loaded, partition = manifest_of(2)
        ssts = [f for f in loaded.files if f.name.endswith(".sst")]
        assert len(ssts) == 2, loaded.files
        victim = ssts[0]

        def delete_victim() -> None:  # what a cleanup does, right after the new run's load
            (partition / victim.path).unlink()

        new = Run(spark, location + "/state", "1", history, ids)
        new.commit(2, after_load=delete_victim)  # version 3: its snapshot holds the victim's SST
        wait_for(lambda: new.snapshot() or manifest_of(3) is not None, timeout=30, what="the snapshot of version 3")
        uploaded, _ = manifest_of(3)
        assert victim.name in {f.name for f in uploaded.files}, "the new snapshot no longer holds the SST"
        for f in uploaded.files:
            assert (partition / f.path).is_file() and (partition / f.path).stat().st_size == f.size, f
        assert victim.path not in {f.path for f in uploaded.files}
        with restarted(spark, location + "/state") as fresh:
            assert contents(fresh, 3, None) == history[3]
    finally:
        close_runs(spark, old, new)


def test_a_later_run_replaces_an_uncommitted_version_and_a_stopped_run_does_not(spark):
    """A run stops after its task committed version 3 (and uploaded its snapshot) but before
    Spark's commit log: the restarted run executes the batch again over other input, and its
    attempt is version 3, as with Spark's own providers (the first attempt's file was kept, and
    a load took the first attempt's snapshot). A task of the stopped run that commits version 3
    once more (a zombie) replaces nothing: it fails."""
    location, local = objtest_location(spark, "rerun")
    history, ids = {0: {}}, {}
    old = Run(spark, location + "/state", "1", history, ids)
    new = None
    try:
        for version in range(3):
            old.commit(version)
        wait_for(lambda: old.snapshot() or any(local.rglob("3.ks-snapshot")), timeout=30, what="the snapshot of version 3")
        deactivate(spark, old.run_id)
        new = Run(spark, location + "/state", "1", history, ids)
        store = new.layer.store(2, None)
        new.layer.put(store, (KEYS + 1,), (-1,))
        assert store.commit() == 3
        history[3] = {**history[2], KEYS + 1: -1}
        zombie = old.layer.store(2, None)
        old.layer.put(zombie, (KEYS + 2,), (-2,))
        with pytest.raises(Exception, match="not the store's active instance: it does not replace the file"):
            zombie.commit()
        with restarted(spark, location + "/state") as fresh:
            assert contents(fresh, 3, None) == history[3]
    finally:
        close_runs(spark, old, new)


def test_a_rerun_replaces_the_changelog_without_an_hsync_when_changelog_sync_is_off(spark):
    """A later run's replace of an uncommitted version writes its changelog as every commit
    does under changelogSync (false by default: a close, no hsync). Before, the replace always
    hsynced: here every hsync of a changelog fails, and that replace failed."""
    location, _ = objtest_location(spark, "rerun-nosync")
    history, ids = {0: {}}, {}
    arm(spark, {"hsync": "true"})  # objtest's streams offer hsync, as HDFS's do
    old = Run(spark, location + "/state", "1", history, ids)
    new = None
    try:
        for version in range(3):
            old.commit(version)
        deactivate(spark, old.run_id)
        root = arm(spark, {"hsync": "true"}, hsync={"nth": 1, "times": 1000, "path": "ks-changelog"})
        new = Run(spark, location + "/state", "1", history, ids)
        store = new.layer.store(2, None)
        new.layer.put(store, (KEYS + 1,), (-1,))
        assert store.commit() == 3
        history[3] = {**history[2], KEYS + 1: -1}
        assert [f for f in testjar.injected_faults(root) if f["op"] == "hsync"] == []
        with restarted(spark, location + "/state") as fresh:
            assert contents(fresh, 3, None) == history[3]
    finally:
        disarm(spark)
        close_runs(spark, old, new)


def test_a_stopped_runs_snapshot_beside_the_rerun_changelog_is_never_loaded(spark):
    """A stopped run's snapshot upload of version 3 is killed between its manifest write and its
    re-check while a later run replaces version 3: the stopped run's manifest stays beside the
    later run's changelog of the same version. The JVM's load and both offline rebuilders see
    that the manifest names another run than the changelog and rebuild version 3 from the older
    snapshot and changelogs; before, all three loaded the stale snapshot (the rerun's key lost).
    ``keyedstate verify`` warns of that manifest, naming both runs and the changelog; before, it
    held the manifest's numKeys to the rerun's version 3 and reported a corrupt snapshot."""
    location, local = objtest_location(spark, "stale")
    history, ids = {0: {}}, {}
    old = Run(spark, location + "/state", "1", history, ids)
    new = None
    try:
        for version in range(3):
            old.commit(version)
        wait_for(lambda: old.snapshot() or any(local.rglob("3.ks-snapshot")), timeout=30, what="the snapshot of version 3")
        wait_until_unchanged(local)
        manifest_path = next(local.rglob("3.ks-snapshot"))
        stale = manifest_path.read_bytes()
        deactivate(spark, old.run_id)
        new = Run(spark, location + "/state", "1", history, ids)
        store = new.layer.store(2, None)
        new.layer.put(store, (KEYS + 1,), (-1,))
        assert store.commit() == 3
        history[3] = {**history[2], KEYS + 1: -1}
        wait_until_unchanged(local)
        manifest_path.write_bytes(stale)  # the stopped run's manifest, published after the replace
        with restarted(spark, location + "/state") as fresh:
            assert contents(fresh, 3, None) == history[3]
        with ckpt.rebuild(ckpt.list_store(manifest_path.parent, 0), 3) as rebuilt:
            assert rebuilt.base_snapshot != 3 and _offline_contents(rebuilt.db) == history[3]
        checkpoint = Checkpoint(LocalStorage(local))
        part = checkpoint.operator(0).stores["default"][0]
        with checkpoint.rebuild(part, 3) as rebuilt:
            assert rebuilt.chain[-1] != (3, None) and _offline_contents(rebuilt.db) == history[3]
        _as_query_checkpoint(local, committed=2)
        report = keyedstate.verify(location, spark=spark)
        assert report["ok"], report
        assert report["checked"]["snapshots"] == 3 and report["checked"]["keysChecked"] > 0, report
        stale_path = location + "/state/0/0/3.ks-snapshot"
        said = [w["warning"] for w in report["warnings"] if w["path"] == stale_path]
        assert len(said) == 1 and "never loaded" in said[0], report
        changelog_path = location + "/state/0/0/3.ks-changelog"
        assert old.run_id in said[0] and new.run_id in said[0] and changelog_path in said[0], said
    finally:
        close_runs(spark, old, new)


def test_cleanup_never_takes_a_stopped_runs_snapshot_as_its_base(spark):
    """The stopped run's manifest of version 3 lands beside the rerun's changelog of version 3 (as
    above), and the rerun goes on to version 5: its cleanup must not take that snapshot as the base
    of the retained versions (3..5), which would delete the changelog that shows it is another
    run's and let every later load take it as found. Before, the cleanup chose it (its files are
    all there) and deleted changelog 3: version 3 then loaded without the rerun's key."""
    location, local = objtest_location(spark, "stalebase")
    history, ids = {0: {}}, {}
    old = Run(spark, location + "/state", "1", history, ids)
    new = None
    try:
        for version in range(3):
            old.commit(version)
        wait_for(lambda: old.snapshot() or any(local.rglob("3.ks-snapshot")), timeout=30, what="the snapshot of version 3")
        wait_until_unchanged(local)
        manifest_path = next(local.rglob("3.ks-snapshot"))
        stale = manifest_path.read_bytes()
        deactivate(spark, old.run_id)
        new = Run(spark, location + "/state", "1", history, ids)
        store = new.layer.store(2, None)
        new.layer.put(store, (KEYS + 1,), (-1,))
        assert store.commit() == 3
        history[3] = {**history[2], KEYS + 1: -1}
        wait_until_unchanged(local)
        manifest_path.write_bytes(stale)  # the stopped run's manifest, published after the replace
        new.commit(3)
        new.commit(4)
        wait_until_unchanged(local)
        new.cleanup()
        with restarted(spark, location + "/state") as fresh:
            for version in (3, 4, 5):
                assert contents(fresh, version, None) == history[version], f"version {version}"
        assert (manifest_path.parent / "3.ks-changelog").exists()
    finally:
        close_runs(spark, old, new)


def test_a_rerun_replaces_a_stopped_runs_manifest_it_finds_at_its_upload(spark):
    """The stopped run's manifest of version 3 is published after the rerun's commit of version 3
    and before the rerun's snapshot upload of it (objtest's renames are slowed so that the upload
    is still under way): the upload replaces that manifest with its own. Before, it kept it ("already
    has a snapshot") and counted it as its own newest snapshot."""
    location, local = objtest_location(spark, "staleupload")
    history, ids = {0: {}}, {}
    old = Run(spark, location + "/state", "1", history, ids)
    new = None
    try:
        for version in range(3):
            old.commit(version)
        wait_for(lambda: old.snapshot() or any(local.rglob("3.ks-snapshot")), timeout=30, what="the snapshot of version 3")
        wait_until_unchanged(local)
        manifest_path = next(local.rglob("3.ks-snapshot"))
        stale = manifest_path.read_bytes()
        deactivate(spark, old.run_id)
        new = Run(spark, location + "/state", "1", history, ids)
        store = new.layer.store(2, None)
        new.layer.put(store, (KEYS + 1,), (-1,))
        arm(spark, {"rename.delayMs": 1500})
        assert store.commit() == 3
        history[3] = {**history[2], KEYS + 1: -1}
        assert not manifest_path.exists(), "the upload was not slowed enough for the test"
        manifest_path.write_bytes(stale)  # the stopped run's manifest, published before the rerun's
        wait_for(lambda: manifest_path.read_bytes() != stale, timeout=60, what="the rerun's manifest of version 3")
        disarm(spark)
        wait_until_unchanged(local)
        assert ckpt.read_manifest(manifest_path, 3).run_id == new.run_id
    finally:
        disarm(spark)
        close_runs(spark, old, new)


def test_the_offline_rebuilders_check_a_snapshot_against_its_changelogs_header_alone(spark):
    """Both offline rebuilders check the snapshot of version 3 against the run of changelog 3, from
    that changelog's header (its own CRC-32), as the JVM does: a corrupt body of changelog 3, which
    a rebuild from snapshot 3 never replays, fails neither. Before, both read and decompressed the
    whole changelog: one skipped snapshot 3 and then failed replaying changelog 3, the other failed."""
    location, local = objtest_location(spark, "headeronly")
    history, ids = {0: {}}, {}
    run = Run(spark, location + "/state", "1", history, ids)
    try:
        for version in range(3):
            run.commit(version)
        wait_for(lambda: run.snapshot() or any(local.rglob("3.ks-snapshot")), timeout=30, what="the snapshot of version 3")
        wait_until_unchanged(local)
    finally:
        close_runs(spark, run)
    manifest_path = next(local.rglob("3.ks-snapshot"))
    changelog_3 = manifest_path.parent / "3.ks-changelog"
    data = bytearray(changelog_3.read_bytes())
    data[-1] ^= 0xFF  # the body's last byte; the header stays intact
    changelog_3.write_bytes(bytes(data))
    with ckpt.rebuild(ckpt.list_store(manifest_path.parent, 0), 3) as rebuilt:
        assert rebuilt.base_snapshot == 3 and _offline_contents(rebuilt.db) == history[3]
    checkpoint = Checkpoint(LocalStorage(local))
    part = checkpoint.operator(0).stores["default"][0]
    with checkpoint.rebuild(part, 3) as rebuilt:
        assert rebuilt.chain[-1] == (3, None) and _offline_contents(rebuilt.db) == history[3]


def test_a_stopped_runs_task_that_wins_the_gap_inside_replace_fails_the_rerun(spark):
    """A later run replaces version 3 (an earlier run's attempt Spark never committed): it deletes
    the file, then writes its own. A task of the stopped run that commits version 3 in between
    finds no file and writes its own; the rerun's write then finds that file and kept it as the
    version, so the stopped run's attempt became the state (here a window of 4 s after the
    delete, objtest's delete.delayMs). Now the rerun's task fails naming the file and the run
    that wrote it; its retry replaces that file, and version 3 is the rerun's."""
    location, local = objtest_location(spark, "gap")
    history, ids = {0: {}}, {}
    old = Run(spark, location + "/state", "1", history, ids)
    new = None
    try:
        for version in range(3):
            old.commit(version)
        wait_until_unchanged(local)
        deactivate(spark, old.run_id)
        new = Run(spark, location + "/state", "1", history, ids)
        zombie = old.layer.store(2, None)  # both loaded before the race
        old.layer.put(zombie, (KEYS + 2,), (-2,))
        store = new.layer.store(2, None)
        new.layer.put(store, (KEYS + 1,), (-1,))
        changelog_3 = next(local.rglob("3.ks-changelog"))
        arm(spark, {"delete.delayMs": 4000, "delete.delayPath": "/3.ks-changelog"})
        outcome: dict = {}

        def rerun() -> None:
            try:
                outcome["version"] = store.commit()
            except Exception as exc:  # noqa: BLE001 -- judged below
                outcome["error"] = str(exc)

        committing = threading.Thread(target=rerun)
        committing.start()
        wait_for(lambda: not changelog_3.exists(), timeout=30, what="the rerun's delete of version 3's changelog")
        assert zombie.commit() == 3  # the stopped run's task wins the gap
        committing.join(60)
        disarm(spark)
        assert "error" in outcome, f"the rerun took the stopped run's file as its version: {outcome}"
        assert str(changelog_3.name) in outcome["error"] and f"run {old.run_id} wrote its own file" in outcome["error"]
        retry = new.layer.store(2, None)  # Spark's retry of the task
        new.layer.put(retry, (KEYS + 1,), (-1,))
        assert retry.commit() == 3
        history[3] = {**history[2], KEYS + 1: -1}
        with restarted(spark, location + "/state") as fresh:
            assert contents(fresh, 3, None) == history[3]
    finally:
        disarm(spark)
        close_runs(spark, old, new)


def test_a_replace_deletes_no_file_another_run_wrote_after_it_decided(spark):
    """A task of run B decides to replace version 3 (run A's attempt, never committed) and is
    held in its delete of the version's manifest (objtest's delete.delayMs); B stops, run C
    starts, replaces A's file with its own and commits version 3. B's task then must not delete
    C's file: it re-reads the run id in the header before deleting the changelog, fails naming
    the file and run C, and version 3 stays C's."""
    location, local = objtest_location(spark, "recheck")
    history, ids = {0: {}}, {}
    first = Run(spark, location + "/state", "1", history, ids)
    stopped = latest = None
    try:
        for version in range(3):
            first.commit(version)
        wait_for(lambda: first.snapshot() or any(local.rglob("3.ks-snapshot")), timeout=30,
                 what="the snapshot of version 3")
        wait_until_unchanged(local)
        deactivate(spark, first.run_id)
        stopped = Run(spark, location + "/state", "1", history, ids)
        slow = stopped.layer.store(2, None)
        stopped.layer.put(slow, (KEYS + 2,), (-2,))
        manifest_3 = next(local.rglob("3.ks-snapshot"))
        arm(spark, {"delete.delayMs": 6000, "delete.delayPath": "/3.ks-snapshot"})
        outcome: dict = {}

        def replace() -> None:
            try:
                outcome["version"] = slow.commit()
            except Exception as exc:  # noqa: BLE001 -- judged below
                outcome["error"] = str(exc)

        committing = threading.Thread(target=replace)
        committing.start()
        wait_for(lambda: not manifest_3.exists(), timeout=30, what="run B's delete of version 3's manifest")
        deactivate(spark, stopped.run_id)
        latest = Run(spark, location + "/state", "1", history, ids)
        store = latest.layer.store(2, None)
        latest.layer.put(store, (KEYS + 1,), (-1,))
        assert store.commit() == 3  # run C replaces run A's file while B's task waits
        history[3] = {**history[2], KEYS + 1: -1}
        committing.join(60)
        disarm(spark)
        assert "error" in outcome, f"run B deleted run C's committed version 3: {outcome}"
        assert "3.ks-changelog" in outcome["error"] and f"run {latest.run_id}" in outcome["error"], outcome
        with restarted(spark, location + "/state") as fresh:
            assert contents(fresh, 3, None) == history[3]
    finally:
        disarm(spark)
        close_runs(spark, first, stopped, latest)


def _as_query_checkpoint(local, committed: int) -> None:
    """What a query adds around the layer store's files, as Spark 4.3 writes them: the offset and
    commit logs of batches 0..``committed`` (one partition, keyedstate's provider) and the state
    schema file (key k INT, value n LONG), so that ``keyedstate verify`` takes it as a checkpoint."""
    from keyedstate.offline.processor import _chunks, _utf

    for name in ("offsets", "commits"):
        (local / name).mkdir(exist_ok=True)
    conf = {"spark.sql.shuffle.partitions": "1",
            "spark.sql.streaming.stateStore.providerClass": keyedstate.PROVIDER_CLASS}
    for batch in range(committed + 1):
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": conf}
        (local / "offsets" / str(batch)).write_text("v1\n" + json.dumps(meta) + "\n-")
        (local / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    schema = local / "state" / "0" / "0" / "_metadata"
    schema.mkdir(exist_ok=True)
    field = lambda name, kind: {"type": "struct", "fields": [  # noqa: E731
        {"name": name, "type": kind, "nullable": True, "metadata": {}}]}
    (schema / "schema").write_bytes(_utf("v2") + _chunks(json.dumps(field("k", "integer")))
                                    + _chunks(json.dumps(field("n", "long"))))


def _offline_contents(db) -> dict:
    """An INT key -> LONG value store as read offline: u32 key group | UnsafeRow key, u8 value
    format | UnsafeRow value (FORMATS.md, "Stored keys and values")."""
    return {int.from_bytes(k[12:16], "little", signed=True): int.from_bytes(v[9:17], "little", signed=True)
            for k, v in db.items()}


def wait_until_unchanged(directory, quiet_s: float = 2.0, limit_s: float = 30.0) -> None:
    """Until the files under ``directory`` stay the same for ``quiet_s`` (background work done)."""
    def names():
        return sorted(str(p) for p in directory.rglob("*"))

    deadline, last, since = time.monotonic() + limit_s, names(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "files kept changing"
        time.sleep(0.2)
        now = names()
        if now != last:
            last, since = now, time.monotonic()


@pytest.mark.parametrize("format_version", ["1", "2"])
def test_the_first_loads_cleanup_keeps_what_rebuilds_the_loaded_version(spark, format_version):
    """A run stopped between a task's commit of version 7 (its snapshot uploaded too) and Spark's
    commit log: the restarted run loads version 6 while 7 lies in the checkpoint, uncommitted.
    The cleanup of that first load counts what it retains from the version loaded: counted from
    the newest file with minBatchesToRetain=1, it deleted every file of version 6 (found by a
    review of the cleanup at first load), so a retry of the rerun batch, or any restart before
    it committed, could never load the query's state again."""
    location, local = objtest_location(spark, "orphan")
    history, ids = {0: {}}, {}
    confs = {"spark.sql.streaming.minBatchesToRetain": "1"}
    old = Run(spark, location + "/state", format_version, history, ids, confs)
    new = None
    try:
        for version in range(7):  # versions 1..7, each snapshot uploaded before the next commit
            old.commit(version)

            def uploaded(version=version + 1) -> bool:
                old.snapshot()
                return any(re.fullmatch(rf"{version}(_.*)?\.ks-snapshot", p.name) for p in local.rglob("*"))

            wait_for(uploaded, timeout=30, what=f"the snapshot of version {version + 1}")
        wait_until_unchanged(local)
        deactivate(spark, old.run_id)  # Spark's commit log ends at version 6
        new = Run(spark, location + "/state", format_version, history, ids, confs)
        new.layer.store(6, ids.get(6)).abort()  # the rerun batch's first load
        wait_until_unchanged(local)  # its cleanup, in the background
        with restarted(spark, location + "/state", {**confs, STATE_PREFIX + "checkpointFormatVersion": format_version}) as fresh:
            assert contents(fresh, 6, ids.get(6)) == history[6]
    finally:
        close_runs(spark, old, new)


@pytest.mark.parametrize("format_version", ["1", "2"])
def test_cleanup_after_a_tasks_commit_keeps_the_version_spark_committed_last(spark, format_version):
    """A task commits version 5 (its snapshot uploaded) and maintenance cleans up before Spark's
    commit log records the batch: with minBatchesToRetain=1, counting from 5 kept only 5, so a
    failed batch's restart could not load version 4 (audit finding). Spark's HDFS provider keeps
    minBatchesToRetain versions before the newest; so does keyedstate now."""
    location, local = objtest_location(spark, "retain")
    history, ids = {0: {}}, {}
    confs = {"spark.sql.streaming.minBatchesToRetain": "1"}
    run = Run(spark, location + "/state", format_version, history, ids, confs)
    try:
        for version in range(5):
            run.commit(version)

            def uploaded(version=version + 1) -> bool:
                run.snapshot()
                return any(re.fullmatch(rf"{version}(_.*)?\.ks-snapshot", p.name) for p in local.rglob("*"))

            wait_for(uploaded, timeout=30, what=f"the snapshot of version {version + 1}")
        run.cleanup()
        wait_until_unchanged(local)
        deactivate(spark, run.run_id)  # the batch of version 5 never reaches the commit log
        with restarted(spark, location + "/state", {**confs, STATE_PREFIX + "checkpointFormatVersion": format_version}) as fresh:
            assert contents(fresh, 4, ids.get(4)) == history[4]
    finally:
        close_runs(spark, run)


def test_a_cleanup_while_the_engine_holds_no_version_counts_from_the_last_one_it_held(spark, tmp_path):
    """Spark's cleanup pool calls in at any moment, also while a commit or a load is in flight or
    after a failed one, when the engine holds no version: such a round returned without doing
    anything, and on short batches most of a partition's rounds could fall there. It counts
    back from the newest version loaded or committed instead, and deletes what that retains no more."""
    location = str(tmp_path / "checkpoint" / "state")
    store_dir = tmp_path / "checkpoint" / "state" / "0" / "0"
    history, ids = {0: {}}, {}
    run = Run(spark, location, "1", history, ids)
    try:
        for version in range(6):  # versions 1..6, each snapshot uploaded; nothing cleaned up yet
            run.commit(version)
            run.snapshot()
        assert (store_dir / "1.ks-changelog").is_file() and (store_dir / "1.ks-snapshot").is_file()
        with pytest.raises(Exception, match="99"):
            run.layer.store(99)  # a failed load: the engine holds no version now
        run.cleanup()
        names = {p.name for p in store_dir.iterdir()}
        base = 6 - RETAIN  # the newest snapshot at or below the oldest version retained
        assert not {f"{v}.ks-changelog" for v in range(1, base + 1)} & names, sorted(names)
        assert not {f"{v}.ks-snapshot" for v in range(1, base)} & names, sorted(names)
        assert {f"{base}.ks-snapshot", *(f"{v}.ks-changelog" for v in range(base + 1, 7))} <= names, sorted(names)
        assert contents(run.layer, 6, None) == history[6]  # and the engine loads again
    finally:
        close_runs(spark, run)
    assert_every_retained_version_loads(spark, location, "1", history, ids)


def test_a_symbolic_link_in_the_checkpoint_is_never_listed_read_or_deleted_through(spark, tmp_path):
    """A local peer who can write the checkpoint replaces a partition's ks-files/ with a link to
    a directory of theirs or another user's: a running query's cleanup deleted every file there
    older than its base snapshot (audit finding). Now cleanup, and a load, refuse the link and
    name it; nothing outside the checkpoint is touched."""
    import os

    victim = tmp_path / "victim"
    victim.mkdir()
    for name in ("precious.txt", "thesis.tex"):
        (victim / name).write_text(name)
        os.utime(victim / name, (time.time() - 86400, time.time() - 86400))
    location = str(tmp_path / "checkpoint" / "state")
    history, ids = {0: {}}, {}
    run = Run(spark, location, "1", history, ids, {"spark.sql.streaming.minBatchesToRetain": "1"})
    try:
        for version in range(3):
            run.commit(version)
            run.snapshot()
        files = tmp_path / "checkpoint" / "state" / "0" / "0" / "ks-files"
        for f in files.iterdir():
            f.rename(victim / f.name)  # the snapshots' files, now behind the link
        files.rmdir()
        files.symlink_to(victim)
        behind = {f.name for f in victim.iterdir()}
        run.commit(3)
        run.snapshot()
        run.cleanup()  # maintenance never throws; it logs and retries later
        assert {f.name for f in victim.iterdir()} == behind  # nothing deleted there, nothing uploaded there
        with restarted(spark, location) as fresh:
            with pytest.raises(Exception, match=r"ks-files in the checkpoint is a symbolic link \(to .*victim\)"):
                fresh.store(4)
    finally:
        close_runs(spark, run)


def test_a_failing_maintenance_call_is_retried_later_not_thrown(spark):
    """Spark closes a provider whose maintenance throws, even while a task uses one of its
    stores: a transient checkpoint error in cleanup or upload must not do that."""
    location = objtest_location(spark, "maintenance")[0] + "/state"
    history, ids = {0: {}}, {}
    run = Run(spark, location, "1", history, ids)
    try:
        for version in range(2):
            run.commit(version)
        arm(spark, listStatus={"nth": 1, "times": 100, "path": "/state/"},
            create={"nth": 1, "times": 100, "path": "ks-files"})
        run.commit(2)  # stages version 3
        store = run.layer.store(3)  # a task's store, open while maintenance runs
        run.snapshot()
        run.cleanup()
        assert {f["op"] for f in testjar.injected_faults(objtest_root(spark))} >= {"listStatus", "create"}
        disarm(spark)
        key, value = next(iter(history[3].items()))
        assert run.layer.get(store, key) == value  # the task's store is still usable
        store.abort()
        run.commit(3)
        run.snapshot()
        run.cleanup()
        assert_every_retained_version_loads(spark, location, "1", history, ids)
    finally:
        close_runs(spark, run)


def test_a_store_used_after_spark_closed_its_provider_fails_clearly(spark, tmp_path):
    layer = LayerStore(spark, tmp_path / "state")
    v0 = layer.store(0)
    layer.put(v0, (1,), (10,))
    v0.commit()
    v1 = layer.store(1)
    layer.close()  # what Spark's maintenance does to an unloaded provider, in use or not
    with pytest.raises(Exception, match="was closed"):
        layer.get(v1, 2)  # not in the near cache: a read from the state server


@pytest.fixture(scope="module")
def unmaintained(tmp_path_factory):
    """A session whose maintenance never comes (its interval is longer than these tests)."""
    from support.sessions import SessionProcess

    session = SessionProcess(tmp_path_factory.mktemp("unmaintained"), confs={f"{STATE_PREFIX}maintenanceInterval": "600s"})
    try:
        yield session
        session.exit()
    finally:
        session.kill()


def test_a_due_snapshot_is_uploaded_without_waiting_for_maintenance(tmp_path, unmaintained):
    """Version 2's snapshot is due (snapshotInterval=2) and maintenance does not run (its interval
    is longer than the query): the snapshot still reaches the checkpoint while the query runs,
    so a stop at any later point restarts from it instead of replaying every changelog since the
    beginning (measured before: 2-3 of W1's 4 partitions replayed 11 changelogs at a restart)."""
    checkpoint, source = tmp_path / "checkpoint", tmp_path / "input"
    session = unmaintained
    session.start_query("due", checkpoint, source, confs={PFX + "snapshotInterval": "2"})
    try:
        for b in range(3):
            assert session.feed("due", [f"k{i}" for i in range(b * 50, b * 50 + 200)])["ok"]
        partitions = sorted((checkpoint / "state" / "0").glob("[0-9]*"))
        assert len(partitions) == 2
        deadline = time.monotonic() + 60
        while not all((p / "2.ks-snapshot").is_file() for p in partitions):
            assert time.monotonic() < deadline, [sorted(f.name for f in p.iterdir()) for p in partitions]
            time.sleep(0.2)
        assert all((p / "3.ks-changelog").is_file() for p in partitions)
    finally:
        assert session.call({"op": "stop", "name": "due"})["ok"]


def test_a_snapshot_due_just_before_the_application_stops_reaches_the_checkpoint(tmp_path):
    """The application stops right after a snapshot version, on a checkpoint whose renames are
    slow (an object store copies): the JVM's exit waits (bounded) for the uploads already asked
    for, so a restart loads the snapshot instead of replaying every changelog. Before, the JVM
    exited with them in flight (W1's restart loaded 2 of 4 partitions without their snapshot)."""
    from support.sessions import SessionProcess

    root = tmp_path / "objects"
    confs = {**testjar.objtest_conf(root), f"{STATE_PREFIX}maintenanceInterval": "600s"}
    testjar.arm(root, OBJECT_STORE_RULES)
    session = SessionProcess(tmp_path / "session", confs=confs)
    try:
        session.start_query("q", "objtest://ckpt/q", tmp_path / "input", confs={PFX + "snapshotInterval": "2"})
        assert session.feed("q", [f"k{i}" for i in range(200)])["ok"]  # version 1
        testjar.arm(root, {**OBJECT_STORE_RULES, "rename.delayMs": 1500})  # from here on a file takes 1.5 s to publish
        assert session.feed("q", [f"k{i}" for i in range(100, 300)])["ok"]  # version 2: a snapshot is due
        assert session.call({"op": "stop", "name": "q"})["ok"]
        session.exit(timeout=120)
    finally:
        session.kill()
    partitions = sorted((root / "ckpt" / "q" / "state" / "0").glob("[0-9]*"))
    assert len(partitions) == 2
    assert all((p / "2.ks-snapshot").is_file() for p in partitions), \
        [sorted(f.name for f in p.iterdir()) for p in partitions]


def test_a_provider_closed_right_after_a_snapshot_version_uploads_it_first(spark):
    """Spark closes a stopped query's providers soon after the stop, and uploads (its
    doMaintenance) only what is staged by then; a snapshot version's apply may still run behind,
    and its upload take a while (here an object store's slow publish). The close finishes the
    upload that version's commit asked for before it closes the store, so the next run loads the
    snapshot. Before, the close dropped the staged snapshot under the upload and the next run
    replayed every changelog (W5, restarted right after its seed: 2.5M records a partition)."""
    location, local = objtest_location(spark, "close")
    layer = LayerStore(spark, location + "/state/0", confs={PFX + "snapshotInterval": "2"})
    try:
        store = layer.store(0)
        for k in range(100):
            layer.put(store, (k,), (0,))
        assert store.commit() == 1
        arm(spark, {"rename.delayMs": 1000})  # publishing a file now takes 1 s, as an object store's copy
        store = layer.store(1)
        for k in range(50, 150):
            layer.put(store, (k,), (1,))
        assert store.commit() == 2  # a snapshot is due: its upload starts in the background
    finally:
        layer.close()  # at once, while that upload is under way
        disarm(spark)
    snapshots = sorted(p.name for p in local.rglob("*.ks-snapshot"))
    assert snapshots == ["2.ks-snapshot"], sorted(str(p.relative_to(local)) for p in local.rglob("*"))


def test_a_new_runs_first_load_waits_for_the_snapshot_the_last_run_is_uploading(spark):
    """A query restarted in the same application loads each partition this executor served a
    moment ago while the last run's snapshot upload is still in flight (it waits for its
    version's apply behind; here an object store's slow publish): the load waits for that upload
    and starts from its snapshot. The changelogs are gone by then, so a load that did not wait
    could not replay them and fails (the snapshot's manifest appears ~6 s after the commit, the
    new run loads within about one). Before, W5's restarted query replayed its 2.5M-record seed
    changelog on every partition."""
    location, local = objtest_location(spark, "handover")
    history, ids = {0: {}}, {}
    old = Run(spark, location + "/state", "1", history, ids)  # snapshotInterval 1: every commit uploads
    new = None
    try:
        old.commit(0)
        wait_for(lambda: old.snapshot() or next(local.rglob("1.ks-snapshot"), None) is not None, timeout=30,
                 what="the snapshot of version 1")
        # publishing a file now takes 1.5 s, as an object store's copy, and version 2's snapshot
        # manifest is created 6 s late: its upload is still under way when the new run loads
        arm(spark, {"rename.delayMs": 1500, "create.delayMs": 6000, "create.delayPath": "/.2.ks-snapshot."})
        old.commit(1)  # version 2: its snapshot's upload starts in the background
        for changelog in local.rglob("*.ks-changelog"):
            changelog.unlink()
        assert next(local.rglob("2.ks-snapshot"), None) is None  # still being uploaded
        new = Run(spark, location + "/state", "1", history, ids)
        assert contents(new.layer, 2, None) == history[2]
        assert next(local.rglob("2.ks-snapshot"), None) is not None
    finally:
        disarm(spark)
        close_runs(spark, old, new)


def test_short_runs_without_maintenance_get_snapshots_and_cleanup(tmp_path, unmaintained):
    """Issue 12's finding: runs shorter than the maintenance interval (scheduled availableNow
    jobs) left every changelog and no snapshot, so the checkpoint grew without bound and every
    load replayed from version 1. Eight one-batch runs, maintenance never due: the snapshots are
    there, and what no retained version needs is gone."""
    checkpoint, source = tmp_path / "checkpoint", tmp_path / "input"
    runs, interval, retain = 8, 2, 2
    confs = {PFX + "snapshotInterval": str(interval), "spark.sql.streaming.minBatchesToRetain": str(retain)}
    for run in range(runs):
        reply = unmaintained.run(checkpoint, source, [f"k{i}" for i in range(run * 50, run * 50 + 200)], confs=confs)
        assert reply["ok"], reply
    assert reply["counts"]["k399"] == 4 and reply["counts"]["k549"] == 1  # exact, through every load
    wait_until_unchanged(checkpoint / "state")  # the last run's uploads and cleanup, in the background
    partitions = sorted((checkpoint / "state" / "0").glob("[0-9]*"))
    assert len(partitions) == 2
    for p in partitions:
        names = sorted(f.name for f in p.iterdir() if not f.name.startswith("."))
        changelogs = [n for n in names if n.endswith(".ks-changelog")]
        snapshots = [n for n in names if n.endswith(".ks-snapshot")]
        assert snapshots, names
        # the load of the last run (version 7) kept at most what rebuilds versions 6..7: the
        # snapshot at or below 6 and the changelogs after it; the eighth run added one more
        assert len(changelogs) <= interval + retain, names
        assert "1.ks-changelog" not in changelogs, names
