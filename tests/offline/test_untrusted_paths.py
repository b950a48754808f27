"""Paths the offline tools take from a checkpoint stay inside it (a checkpoint is data, and may be
tampered with): a store name in Spark's operator metadata, a unique id in a changelog header's
lineage, and a symbolic link planted among the checkpoint's directories must never make
``migrate``, ``rescale`` (its rollback and publish), ``inspect``, ``verify`` or the state
processor read, write or delete files elsewhere. Each is refused with an error naming the file.

The checkpoints are written by hand, file by file (as the tools read them), next to a directory
of "another query" whose files must stay as they are.
"""
from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path

import pytest

import keyedstate
from keyedstate.formats import changelog, layout
from keyedstate.offline import migration
from keyedstate.offline.processor import _chunks, _utf
from keyedstate.offline.storage import HadoopStorage, LocalStorage, StorageError
from keyedstate.checkpoint import Checkpoint, CheckpointProblem, versioned_name

pytestmark = pytest.mark.timeout(300)

KEY_GROUPS = 16
SCHEMA = {"type": "struct", "fields": [{"name": "k", "type": "string", "nullable": True, "metadata": {}}]}


def _logs(ck: Path, partitions: list[int]) -> None:
    """offsets/<b> for each batch's partition count, commits/0, as Spark writes them (v1)."""
    for d in ("offsets", "commits", "state"):
        (ck / d).mkdir(parents=True, exist_ok=True)
    for batch, n in enumerate(partitions):
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 0,
                "conf": {"spark.sql.shuffle.partitions": str(n), migration.PROVIDER_KEY: keyedstate.PROVIDER_CLASS}}
        (ck / "offsets" / str(batch)).write_text("v1\n" + json.dumps(meta) + "\n-")
    (ck / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')


def _another_query(root: Path) -> tuple[Path, dict[str, str]]:
    """A partition directory of another query (HDFS provider files, a day old), and its files."""
    other = root / "other-query" / "state" / "0" / "0"
    (other / "_metadata").mkdir(parents=True)
    (other / "_metadata" / "schema").write_bytes(_utf("v2") + _chunks(json.dumps(SCHEMA)) * 2)
    for name in ("1.delta", "2.delta", "2.snapshot", ".2.delta.crc", "precious.txt"):
        (other / name).write_text(f"another query's {name}\n")
        os.utime(other / name, (time.time() - 86400, time.time() - 86400))
    return other, _contents(other)


def _home(root: Path) -> tuple[Path, dict[str, str]]:
    """A user's directory (nothing a state store provider wrote), and its files."""
    home = root / "home"
    home.mkdir()
    for name in ("precious.txt", "notes.md", "id_ed25519"):
        (home / name).write_text(f"the user's own {name}\n")
        os.utime(home / name, (time.time() - 86400, time.time() - 86400))
    return home, _contents(home)


def _contents(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): p.read_text(errors="replace") if p.is_file() else "<dir>"
            for p in sorted(directory.rglob("*"))}


def _refusal(call) -> Exception | None:
    """What ``call`` raised (None: nothing), so that a test checks the files outside first."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the test checks which
        return exc
    return None


def _changelog(version: int, records=(), meta: dict | None = None) -> bytes:
    return changelog.compress(changelog.encode(version, KEY_GROUPS, list(records)), meta or {}, changelog.CODEC_NONE)


# -- store names from Spark's operator metadata ---------------------------------------------------

@pytest.mark.parametrize("name", ["default", "left-keyToNumValues", "right-keyWithIndexToValue", "a.b_c-1"])
def test_plain_store_names_pass(name):
    assert layout.checked_store_name(name, "metadata") == name


@pytest.mark.parametrize("name", ["..", ".", "", "a/b", "../../other-query/state/0/0", "a\\b", "/abs", ".hidden",
                                  "_metadata", None, 7])
def test_store_names_that_are_not_one_plain_directory_are_refused(name):
    with pytest.raises(layout.UnsafePathError, match="metadata names the store"):
        layout.checked_store_name(name, "metadata")


def test_a_store_name_leaving_the_partition_directory_is_refused_and_nothing_outside_is_deleted(spark, tmp_path):
    other, before = _another_query(tmp_path)
    ck = tmp_path / "ckpt"
    _logs(ck, [1])
    (ck / "state" / "0" / "0").mkdir(parents=True)
    metadata = ck / "state" / "0" / "_metadata" / "metadata"
    metadata.parent.mkdir()
    metadata.write_text("v1\n" + json.dumps({
        "operatorInfo": {"operatorId": 0, "operatorName": "stateStoreSave"},
        "stateStoreInfo": [{"storeName": "../../../../other-query/state/0/0", "numColsPrefixKey": 0,
                            "numPartitions": 1}]}))
    refused = re.escape(str(metadata)) + " names the store '../../../../other-query/state/0/0'"
    # migrate: already on keyedstate, so straight to retiring other providers' files in the store's directory
    error = _refusal(lambda: keyedstate.migrate(ck, "keyedstate", spark=spark))
    assert _contents(other) == before, "migrate deleted another query's files"
    assert isinstance(error, (migration.MigrateError, CheckpointProblem)) and re.match(refused, str(error)), error
    with pytest.raises(migration.MigrateError, match=refused):  # migrate's own reader of the metadata
        migration._operator_metadata(Checkpoint(LocalStorage(ck)), str(ck / "state" / "0"))
    with pytest.raises(CheckpointProblem, match=refused):  # the state processor writes the store's schema there
        keyedstate.state(spark, ck).operators()
    assert _contents(other) == before


# -- unique ids from changelog headers --------------------------------------------------------------

def test_a_lineage_naming_a_file_outside_the_checkpoint_is_refused_naming_the_changelog(tmp_path):
    other = tmp_path / "other-query" / "state" / "0" / "0"
    other.mkdir(parents=True)
    (other / "2.ks-changelog").write_bytes(_changelog(2, [(changelog.OP_PUT, b"\0\0\0\1SECRET", b"\1secret")]))
    part = tmp_path / "ckpt" / "state" / "0" / "0"
    part.mkdir(parents=True)
    (part / "2_x").mkdir()  # so that the kernel resolves 2_x/../.. (no link needed)
    u1, u2, u3 = (str(uuid.uuid4()) for _ in range(3))
    escape = "x/" + "../" * 5 + "other-query/state/0/0/2"  # 2_<escape>.ks-changelog is other's 2.ks-changelog
    (part / f"1_{u1}.ks-changelog").write_bytes(
        _changelog(1, [(changelog.OP_PUT, b"\0\0\0\1own", b"\1own")], {"uniqueId": u1, "lineage": [[1, u1]]}))
    (part / f"2_{u2}.ks-changelog").write_bytes(_changelog(2, [], {"uniqueId": u2, "lineage": [[2, u2], [1, u1]]}))
    bad = part / f"3_{u3}.ks-changelog"
    bad.write_bytes(_changelog(3, [], {"uniqueId": u3, "lineage": [[3, u3], [2, escape], [1, u1]]}))
    ck = Checkpoint(LocalStorage(tmp_path / "ckpt"))
    sp = ck.operators()[0].stores["default"][0]
    for read in (lambda: ck.chain(sp, 3, u3), lambda: ck.rebuild(sp, 3, u3).__enter__()):
        with pytest.raises(CheckpointProblem, match=re.escape(str(bad)) + " records the lineage"):
            read()
    with pytest.raises(CheckpointProblem, match="not a unique id"):
        versioned_name(2, escape, layout.CHANGELOG_SUFFIX)

    # a well-formed id the directory does not hold is not read either (it names the missing file)
    missing = str(uuid.uuid4())
    bad.write_bytes(_changelog(3, [], {"uniqueId": u3, "lineage": [[3, u3], [2, missing], [1, u1]]}))
    with pytest.raises(CheckpointProblem, match=re.escape(str(bad)) + f" records version 2 with id {missing}"):
        ck.chain(sp, 3, u3)

    # the real lineage still rebuilds
    bad.write_bytes(_changelog(3, [], {"uniqueId": u3, "lineage": [[3, u3], [2, u2], [1, u1]]}))
    assert ck.chain(sp, 3, u3) == [(3, u3), (2, u2), (1, u1), (0, None)]
    with ck.rebuild(sp, 3, u3) as rebuilt:
        assert list(rebuilt.db.keys()) == [b"\0\0\0\1own"]


# -- symbolic links inside a checkpoint -------------------------------------------------------------

def test_rescale_rollback_refuses_a_linked_files_directory_and_deletes_nothing_outside(spark, tmp_path):
    victim, before = _home(tmp_path)
    ck = tmp_path / "ckpt"
    _logs(ck, [1, 2])  # offsets/1: an unfinished repartition batch to 2 partitions
    journal = ck / "_keyedstate_rescale" / "batch-1" / "journal.json"
    journal.parent.mkdir(parents=True)
    journal.write_text(json.dumps({"batch": 1, "readBatch": 0, "fromPartitions": 1, "toPartitions": 2,
                                   "skipped": [], "startedAt": 0}))
    part = ck / "state" / "0" / "0"
    part.mkdir(parents=True)
    (part / "1.ks-changelog").write_bytes(changelog.encode(1, KEY_GROUPS, []))
    os.symlink(victim, part / "ks-files")
    (part / "2.ks-snapshot").write_text(json.dumps({
        "format": "keyedstate-snapshot", "formatVersion": 1, "version": 2, "keyGroups": KEY_GROUPS, "numKeys": 0,
        "rescale": {}, "files": [{"name": "CURRENT", "path": "ks-files/precious.txt", "size": 1}]}))
    error = _refusal(lambda: keyedstate.rescale(ck, 1, spark=spark, rollback=True))
    assert _contents(victim) == before, "the rollback deleted files outside the checkpoint"
    assert isinstance(error, keyedstate.CheckpointError), error
    assert str(error).startswith(f"{part / 'ks-files'} is a symbolic link")
    assert journal.is_file() and (ck / "offsets" / "1").is_file()  # refused before it changed anything


def test_rescale_refuses_a_linked_partition_directory_and_publishes_nothing_outside(spark, tmp_path):
    victim, before = _home(tmp_path)
    ck = tmp_path / "ckpt"
    _logs(ck, [1])
    part = ck / "state" / "0" / "0"
    part.mkdir(parents=True)
    (part / "1.ks-changelog").write_bytes(changelog.encode(1, KEY_GROUPS, [(changelog.OP_PUT, b"\0\0\0\1k", b"\1v")]))
    os.symlink(victim, ck / "state" / "0" / "1")  # where new partition 1's snapshot would be published
    error = _refusal(lambda: keyedstate.rescale(ck, 2, spark=spark))
    assert _contents(victim) == before, "the rescale wrote files outside the checkpoint"
    assert isinstance(error, keyedstate.CheckpointError), error
    assert str(error).startswith(f"{ck / 'state' / '0' / '1'} is a symbolic link")
    assert sorted(p.name for p in (ck / "offsets").iterdir()) == ["0"]


def test_inspect_and_verify_refuse_a_linked_files_directory(tmp_path):
    victim, before = _home(tmp_path)
    ck = tmp_path / "ckpt"
    _logs(ck, [1])
    part = ck / "state" / "0" / "0"
    part.mkdir(parents=True)
    (part / "1.ks-changelog").write_bytes(changelog.encode(1, KEY_GROUPS, []))
    os.symlink(victim, part / "ks-files")
    link = re.escape(str(part / "ks-files")) + " is a symbolic link"
    with pytest.raises(keyedstate.InspectError, match=link):
        keyedstate.inspect(ck)
    with pytest.raises(StorageError, match=link):
        keyedstate.verify(ck)
    assert _contents(victim) == before


def test_migrate_refuses_a_linked_partition_directory_and_deletes_nothing_outside(spark, tmp_path):
    victim, before = _another_query(tmp_path)
    ck = tmp_path / "ckpt"
    _logs(ck, [1])
    (ck / "state" / "0" / "_metadata").mkdir(parents=True)
    (ck / "state" / "0" / "_metadata" / "metadata").write_text("v1\n" + json.dumps({
        "operatorInfo": {"operatorId": 0, "operatorName": "stateStoreSave"},
        "stateStoreInfo": [{"storeName": "default", "numColsPrefixKey": 0, "numPartitions": 1}]}))
    os.symlink(victim, ck / "state" / "0" / "0")  # its HDFS provider files are what migrate retires
    error = _refusal(lambda: keyedstate.migrate(ck, "keyedstate", spark=spark))
    assert _contents(victim) == before, "migrate deleted files outside the checkpoint"
    assert isinstance(error, StorageError), error
    assert str(error).startswith(f"{ck / 'state' / '0' / '0'} is a symbolic link")


def test_local_storage_reads_writes_and_deletes_through_no_link(tmp_path):
    victim, before = _home(tmp_path)
    ck = tmp_path / "ckpt"
    (ck / "state" / "0").mkdir(parents=True)
    os.symlink(victim, ck / "state" / "0" / "0")
    os.symlink(victim / "notes.md", ck / "state" / "1.delta")
    storage = LocalStorage(ck)
    through = str(ck / "state" / "0" / "0" / "precious.txt")
    for name, call in [("list", lambda: storage.list(str(ck / "state" / "0"))),
                       ("list", lambda: storage.list(str(ck / "state" / "0" / "0"))),
                       ("read", lambda: storage.read_bytes(through)),
                       ("read", lambda: storage.read_bytes(str(ck / "state" / "1.delta"))),
                       ("size", lambda: storage.size(through)),
                       ("exists", lambda: storage.exists(through)),
                       ("fetch", lambda: storage.fetch(through, tmp_path / "fetched")),
                       ("write", lambda: storage.write_atomic(str(ck / "state/0/0/new"), b"x")),
                       ("replace", lambda: storage.replace(through, b"x")),
                       ("upload", lambda: storage.upload(ck / "state" / "1.delta", str(ck / "state/0/0/up"))),
                       ("mkdirs", lambda: storage.mkdirs(str(ck / "state/0/0/dir"))),
                       ("delete", lambda: storage.delete(through))]:
        with pytest.raises(StorageError, match="is a symbolic link"):
            call()
            pytest.fail(f"{name} went through a link")
    with pytest.raises(StorageError, match="outside the checkpoint"):
        storage.read_bytes(str(victim / "precious.txt"))
    assert _contents(victim) == before
    assert not (tmp_path / "fetched").exists()


def test_hadoop_storage_creates_writes_and_deletes_nothing_outside_its_root(spark, tmp_path):
    """Hadoop storage (here Hadoop's local file system, file://) takes a path with ``..`` or
    one outside the root as a refusal naming it: Hadoop's Path resolves ``..`` and mkdirs makes
    every missing ancestor, so such a path would create, write or delete elsewhere."""
    ck = tmp_path / "ckpt"
    (ck / "state").mkdir(parents=True)
    victim, before = _home(tmp_path)
    storage = HadoopStorage(f"file://{ck}", spark)
    up = storage.join(storage.root, "state", "..", "..")
    for name, call in [("mkdirs", lambda: storage.mkdirs(storage.join(up, "escaped", "dir"))),
                       ("write", lambda: storage.write_atomic(storage.join(up, "made", "new"), b"x")),
                       ("upload", lambda: storage.upload(victim / "notes.md", storage.join(up, "made2", "up"))),
                       ("replace", lambda: storage.replace(storage.join(up, victim.name, "notes.md"), b"x")),
                       ("delete", lambda: storage.delete(storage.join(up, victim.name, "precious.txt"))),
                       ("read", lambda: storage.read_bytes(storage.join(up, victim.name, "precious.txt"))),
                       ("outside", lambda: storage.mkdirs(f"file://{tmp_path}/beside/dir"))]:
        error = _refusal(call)
        assert isinstance(error, StorageError) and ("not a plain path inside" in str(error)
                                                    or "outside the checkpoint" in str(error)), (name, error)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ckpt", victim.name])
    assert _contents(victim) == before
    # Inside the root, a write into new directories still makes them.
    assert storage.write_atomic(storage.join(storage.root, "state", "0", "1", "x.ks-changelog"), b"x")
    assert (ck / "state" / "0" / "1" / "x.ks-changelog").read_bytes() == b"x"
