"""keyedstate verify, get and the change feed, on real checkpoints of real queries, locally and on
the object-store test scheme objtest:// (issue 15, points 1, 4, 5, 6).

One module-scoped set of checkpoints (two scenarios, each run with keyedstate and with Spark's
RocksDB provider, changelog checkpointing on) serves every test; tests that corrupt files work
on copies.
"""
from __future__ import annotations

import importlib
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import keyedstate
from keyedstate.formats import changelog
from keyedstate.offline.lookup import get
from keyedstate.offline.verify import verify
from support.constants import KS, PFX, ROCKSDB_PROVIDER
from support.driver import normalise, run_query, session_confs
from support.offline import copy_checkpoint, objtest_local, to_objtest
from support.scenarios import SCENARIOS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

JOIN_STORES = ["left-keyToNumValues", "left-keyWithIndexToValue", "right-keyToNumValues", "right-keyWithIndexToValue"]
CASES = {"aggregation-update": 3, "drop-duplicates-within-watermark": 4}  # scenario -> steps run


def _scenario(name):
    return next(s for s in SCENARIOS if s.name == name)


@pytest.fixture(scope="module")
def checkpoints(spark, tmp_path_factory):
    """{(scenario, provider): checkpoint dir}; keyedstate snapshots every 2 versions."""
    root = tmp_path_factory.mktemp("offline-tools")
    out = {}
    confs = {PFX + "snapshotInterval": "2",
             "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true"}
    with session_confs(spark, confs):
        for name, steps in CASES.items():
            sc = _scenario(name)
            for provider in (KS, ROCKSDB_PROVIDER):
                d = root / name / provider.rsplit(".", 1)[1]
                run_query(spark, provider, sc.build, sc.schema, sc.steps[:steps], d / "checkpoint", d / "input",
                          sc.mode)
                out[(name, provider)] = d / "checkpoint"
    return out


def _last_batch(checkpoint: Path) -> int:
    return max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


def _state_rows(spark, checkpoint, batch=None, **options):
    reader = spark.read.format("statestore")
    if batch is not None:
        reader = reader.option("batchId", batch)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(str(checkpoint)).collect()


# -- verify ------------------------------------------------------------------------------------

def _corrupt_changelog_byte(ck: Path) -> Path:
    path = sorted((ck / "state/0/0").glob("*.ks-changelog"))[-1]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def _truncate_snapshot_file(ck: Path) -> Path:
    manifest = sorted((ck / "state/0/0").glob("*.ks-snapshot"))[-1]
    sst = next(f for f in json.loads(manifest.read_text())["files"] if f["name"].endswith(".sst"))
    path = ck / "state/0/0" / sst["path"]
    path.write_bytes(path.read_bytes()[:-10])
    return path


def _delete_snapshot_file(ck: Path) -> Path:
    manifest = sorted((ck / "state/0/1").glob("*.ks-snapshot"))[-1]
    path = ck / "state/0/1" / json.loads(manifest.read_text())["files"][0]["path"]
    path.unlink()
    return path


def _wrong_key_count(ck: Path) -> Path:
    path = sorted((ck / "state/0/0").glob("*.ks-snapshot"))[-1]
    node = json.loads(path.read_text())
    node["numKeys"] += 1
    path.write_text(json.dumps(node, separators=(",", ":")))
    return path


def _rewrite_changelog(path: Path, edit) -> None:
    log_ = changelog.decode(path.read_bytes(), str(path))
    records = edit([(op, k, v) for op, k, v in log_.records()])
    inner = changelog.encode(log_.version, log_.key_groups, records)
    path.write_bytes(changelog.compress(inner, {k: v for k, v in log_.meta.items() if k not in ("version", "keyGroups")}))


def _key_in_wrong_partition(ck: Path) -> Path:
    """A valid changelog (CRCs right) holding a key of partition 1 in partition 0."""
    other = changelog.decode((ck / "state/0/1/1.ks-changelog").read_bytes(), "p1")
    foreign = next(r for r in other.records() if r.value is not None)
    path = sorted((ck / "state/0/0").glob("*.ks-changelog"))[-1]
    _rewrite_changelog(path, lambda rs: rs + [(changelog.OP_PUT, foreign.key, foreign.value)])
    return path


def _unknown_value_format(ck: Path) -> Path:
    path = sorted((ck / "state/0/1").glob("*.ks-changelog"))[-1]

    def edit(rs):
        op, k, v = next(r for r in rs if r[2] is not None)
        return [(op, k, b"\x07" + v[1:]) if kk == k else (o, kk, vv) for o, kk, vv in rs]
    _rewrite_changelog(path, edit)
    return path


def _unopenable_snapshot_file(ck: Path) -> Path:
    """An SST file of the right size whose footer RocksDB refuses: the snapshot cannot be opened
    (a load takes an older one; verify must report this one, not check an older one instead)."""
    manifest = sorted((ck / "state/0/0").glob("*.ks-snapshot"))[-1]
    sst = next(f for f in json.loads(manifest.read_text())["files"] if f["name"].endswith(".sst"))
    path = ck / "state/0/0" / sst["path"]
    data = bytearray(path.read_bytes())
    data[-8:] = b"\0" * 8  # the table's magic number
    path.write_bytes(bytes(data))
    return manifest


CORRUPTIONS = [_corrupt_changelog_byte, _truncate_snapshot_file, _delete_snapshot_file, _wrong_key_count,
               _key_in_wrong_partition, _unknown_value_format, _unopenable_snapshot_file]


def test_verify_passes_clean_checkpoints(checkpoints):
    for name in CASES:
        report = verify(checkpoints[(name, KS)])
        assert report["ok"], report
        assert report["checked"]["snapshots"] > 0 and report["checked"]["keysChecked"] > 0, report


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__.strip("_"))
def test_verify_detects_each_corruption(checkpoints, tmp_path, corrupt):
    ck = copy_checkpoint(checkpoints[("aggregation-update", KS)], tmp_path / "ck")
    damaged = corrupt(ck)
    report = verify(ck)
    assert not report["ok"], report
    assert any(str(damaged) in p["path"] or str(damaged) in p["problem"] for p in report["problems"]), report
    assert all(p["fix"] for p in report["problems"])


def test_verify_warns_of_a_snapshot_of_another_runs_attempt(checkpoints, tmp_path, monkeypatch):
    """Checkpoint format 1: a snapshot manifest whose runId is not the runId of its version's
    changelog is of another run's attempt (a stopped run's late upload; built for real in
    tests/durability/test_provider_lifetime.py) and never loaded. verify warns of it, naming the
    changelog, and checks no version against it; also when the rebuild is the first to see it
    (the changelog replaced after verify read the manifest). Before, it said nothing here (the
    rebuild passed the snapshot over and found the same keys elsewhere)."""
    ck = copy_checkpoint(checkpoints[("aggregation-update", KS)], tmp_path / "ck")
    part = ck / "state/0/0"
    manifest = max(part.glob("*.ks-snapshot"), key=lambda p: int(p.name.split(".")[0]))
    version = int(manifest.name.split(".")[0])
    entry = json.loads(manifest.read_text())
    committer = changelog.read_file_meta(part / f"{version}.ks-changelog").get(changelog.RUN_ID)
    assert entry.get("runId") and entry["runId"] == committer, (entry, committer)  # the case under test
    entry["runId"] = "00000000-0000-4000-8000-000000000000"
    manifest.write_text(json.dumps(entry, separators=(",", ":")))

    def warned(report):
        said = [w["warning"] for w in report["warnings"] if w["path"] == str(manifest)]
        return len(said) == 1 and all(s in said[0] for s in ("never loaded", entry["runId"], committer,
                                                             str(part / f"{version}.ks-changelog")))

    report = verify(ck)
    assert report["ok"] and warned(report), report
    verify_module = importlib.import_module("keyedstate.offline.verify")
    monkeypatch.setattr(verify_module, "of_another_run", lambda *args: None)
    report = verify(ck)
    assert report["ok"] and warned(report), report


def test_verify_cli_exit_status_and_json(checkpoints, tmp_path):
    """Exit status, JSON and the human report; progress (store partitions verified) on stderr."""
    ck = copy_checkpoint(checkpoints[("aggregation-update", KS)], tmp_path / "ck")
    cli = [sys.executable, "-m", "keyedstate.cli", "verify", "--checkpoint", str(ck), "--json"]
    clean = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["ok"] is True
    partitions = json.loads(clean.stdout)["checked"]["storePartitions"]
    assert f"verify {partitions}/{partitions} store partitions done" in clean.stderr, clean.stderr
    _corrupt_changelog_byte(ck)
    bad = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and json.loads(bad.stdout)["ok"] is False
    human = subprocess.run(cli[:-1], capture_output=True, text=True, timeout=120)
    assert "CORRUPT" in human.stdout and "what to do" in human.stdout


# -- get ---------------------------------------------------------------------------------------

def _as_json(row) -> object:
    from keyedstate.offline.rows import to_json_value

    return to_json_value(row.asDict(recursive=True)) if hasattr(row, "asDict") else to_json_value(row)


@pytest.mark.parametrize("name", list(CASES))
def test_get_equals_the_state_reader_at_every_retained_batch(spark, checkpoints, name):
    ck = checkpoints[(name, KS)]
    last = _last_batch(ck)
    for batch in sorted({last, last - 1, 1}):
        rows = _state_rows(spark, ck, batch)
        assert rows, f"no state at batch {batch}"
        for row in rows:
            result = get(ck, 0, row.key.asDict(recursive=True), batch=batch)
            assert result["found"], (batch, row, result)
            assert result["value"] == _as_json(row.value), (batch, row, result)
            assert result["partition"] == row.partition_id
    missing = get(ck, 0, {"k": "nope"} if name == "aggregation-update" else {"id": 999})
    assert missing["found"] is False and missing["value"] is None


def test_get_cli_without_spark_and_its_errors(checkpoints):
    ck = checkpoints[("aggregation-update", KS)]
    run = lambda *a: subprocess.run([sys.executable, "-m", "keyedstate.cli", "get", "--checkpoint", str(ck), *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    found = run("--operator", "0", "--key", '{"k": "k1"}')
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["value"]["count"] > 0
    assert run("--operator", "0", "--key", '["nope"]').returncode == 3
    bad_key = run("--operator", "0", "--key", '{"kk": 1}')
    assert bad_key.returncode == 1 and "key schema" in bad_key.stderr and "k: string" in bad_key.stderr
    bad_op = run("--operator", "7", "--key", '["a"]')
    assert bad_op.returncode == 1 and "state/7" in bad_op.stderr
    bad_batch = run("--operator", "0", "--key", '["a"]', "--batch", "99")
    assert bad_batch.returncode == 1 and "batch 99 is not committed" in bad_batch.stderr


# -- change feed -------------------------------------------------------------------------------

def _feed(spark, ck, start, end, **options):
    return normalise(_state_rows(spark, ck, None, readChangeFeed="true", changeStartBatchId=start,
                                 changeEndBatchId=end, **options))


@pytest.mark.parametrize("name", list(CASES))
def test_change_feed_equals_the_rocksdb_providers(spark, checkpoints, name):
    ks, rocks = checkpoints[(name, KS)], checkpoints[(name, ROCKSDB_PROVIDER)]
    last = _last_batch(ks)
    assert last == _last_batch(rocks)
    expected = _feed(spark, rocks, 0, last)
    assert any(r[1] == "delete" for r in expected) or name == "aggregation-update"
    assert _feed(spark, ks, 0, last) == expected
    assert _feed(spark, ks, 1, last - 1) == _feed(spark, rocks, 1, last - 1)


def test_snapshot_start_batch_reads_the_same_state(spark, checkpoints):
    ck = checkpoints[("aggregation-update", KS)]
    last = _last_batch(ck)
    snapshots = sorted(int(p.name.split(".")[0]) for p in (ck / "state/0/0").glob("*.ks-snapshot"))
    assert snapshots, "no snapshot was written"
    start = snapshots[0] - 1
    expected = normalise(r for r in _state_rows(spark, ck, last) if r.partition_id == 0)
    replayed = normalise(_state_rows(spark, ck, last, snapshotStartBatchId=start, snapshotPartitionId=0))
    assert replayed == expected
    without = next(b for b in range(last + 1) if b + 1 not in snapshots)
    with pytest.raises(Exception, match="has no snapshot of version"):
        _state_rows(spark, ck, last, snapshotStartBatchId=without, snapshotPartitionId=0)


# -- every tool on objtest:// ------------------------------------------------------------------

def test_tools_on_the_object_store_scheme(spark, checkpoints):
    local = checkpoints[("aggregation-update", KS)]
    uri = to_objtest(spark, local)
    report = verify(uri, spark=spark)
    assert report["ok"] and report["checked"] == verify(local)["checked"], report
    for row in _state_rows(spark, local):
        remote = get(uri, 0, row.key.asDict(), spark=spark)
        assert remote["value"] == get(local, 0, row.key.asDict())["value"]
        assert remote["from"].startswith("objtest://")
    last = _last_batch(local)
    assert _feed(spark, uri, 0, last) == _feed(spark, local, 0, last)
    from keyedstate.offline.remote import inspect_anywhere

    inspected = inspect_anywhere(uri, spark=spark)
    assert json.dumps(inspected).count("objtest://") > 0
    backing = objtest_local(spark, uri)  # the same objects as local files: the same report
    assert inspected == json.loads(json.dumps(keyedstate.inspect(backing)).replace(str(backing), uri))
    damaged = _truncate_snapshot_file(objtest_local(spark, uri))
    report = verify(uri, spark=spark)
    assert not report["ok"] and any(damaged.name in p["path"] for p in report["problems"]), report
    assert all(p["path"].startswith("objtest://") for p in report["problems"])


def test_public_api():
    assert keyedstate.verify is verify and keyedstate.get is get


def test_a_version_written_from_empty_is_rebuilt_as_a_base_not_a_delta(tmp_path):
    """Migrate's or the state processor's version (written from empty, its changelog marked
    fromEmpty) whose snapshot never reached the checkpoint: both offline rebuilders (the one of
    rescale and inspect, and the one of verify, get and the processor's reads) replay it from
    empty, so the keys it dropped do not come back; with nothing older left (a migration from
    another provider), they rebuild it from that changelog alone."""
    from keyedstate import checkpoint as ckpt
    from keyedstate.offline.storage import LocalStorage
    from keyedstate.checkpoint import Checkpoint

    part = tmp_path / "state" / "0" / "0"
    part.mkdir(parents=True)
    key = lambda k: b"\0\0\0\1" + k  # noqa: E731 (key group 1)
    old = changelog.encode(1, 16, [(changelog.OP_PUT, key(k), b"\1" + k) for k in (b"a", b"b", b"c")])
    (part / "1.ks-changelog").write_bytes(changelog.compress(old, {}))
    new = changelog.encode(2, 16, [(changelog.OP_PUT, key(b"a"), b"\1new")])
    (part / "2.ks-changelog").write_bytes(changelog.compress(new, {changelog.FROM_EMPTY: True}))

    def rebuilt() -> tuple[dict, dict]:
        with ckpt.rebuild(ckpt.list_store(part, 0), 2) as r:
            one = dict(r.db.items())
        ck = Checkpoint(LocalStorage(tmp_path))
        with ck.rebuild(ck.operators()[0].stores["default"][0], 2) as r:
            other = dict(r.db.items())
        return one, other

    assert rebuilt() == ({key(b"a"): b"\1new"},) * 2
    (part / "1.ks-changelog").unlink()
    assert rebuilt() == ({key(b"a"): b"\1new"},) * 2
