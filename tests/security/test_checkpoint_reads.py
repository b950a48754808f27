"""Issue 46, reading checkpoint files: every read in the JVM goes through one
``CheckpointReads.open`` (no link followed, a regular file only) and is bounded by the size a
file of its kind may have (FORMATS.md, "File sizes"); the offline tools apply the same bounds.

* Spark's own metadata (offsets, operator metadata) read by the engine refuses a link like
  keyedstate's files do.
* A manifest or changelog that is huge (a sparse file costs the attacker nothing) is refused,
  naming it and the bound, before its bytes are allocated, in both languages.
* On a local disk a file is opened without following a link: a link swapped in between the
  check and the open is refused by the open itself, never read.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from keyedstate.formats import changelog, layout
from keyedstate import checkpoint as ckpt
from keyedstate.offline.storage import LocalStorage
from keyedstate.checkpoint import Checkpoint, StorePartition

from support import golden

OPERATOR_METADATA = ('v1\n{"operatorInfo":{"operatorId":0,"operatorName":"stateStoreSave"},'
                     '"stateStoreInfo":[{"storeName":"default","numColsPrefixKey":0,"numPartitions":2}]}')
OFFSETS = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{}}\n{"logOffset":3}'


def _files(spark, directory: Path):
    jvm = spark._jvm
    return jvm.io.keyedstate.checkpoint.CheckpointFiles(jvm.org.apache.hadoop.fs.Path(str(directory)),
                                                        spark._jsc.hadoopConfiguration())


def _none(spark):
    return spark._jvm.scala.Option.empty()


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


# -- Spark's metadata through the link check ---------------------------------------------------

def test_sparks_metadata_read_through_a_link_is_refused_naming_it(spark, tmp_path):
    """The engine read Spark's operator metadata and offsets (TTL's batch clock, TTL override
    checks) with Hadoop's open, following a link planted in their place to any file."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "metadata").write_text(OPERATOR_METADATA)
    (elsewhere / "0").write_text(OFFSETS)
    query = tmp_path / "query"
    (query / "state" / "0" / "_metadata").mkdir(parents=True)
    (query / "offsets").mkdir()
    meta = query / "state" / "0" / "_metadata" / "metadata"
    meta.symlink_to(elsewhere / "metadata")
    offsets = query / "offsets" / "0"
    offsets.symlink_to(elsewhere / "0")
    SparkMetadata = jvm.io.keyedstate.engine.SparkMetadata
    hpath = jvm.org.apache.hadoop.fs.Path
    with pytest.raises(Exception, match="symbolic link") as err:
        SparkMetadata.operators(hpath(str(query / "state")), conf)
    assert str(meta) in str(err.value)
    with pytest.raises(Exception, match="symbolic link") as err:
        SparkMetadata.batchTimestamp(hpath(str(query)), 0, conf)
    assert str(offsets) in str(err.value)
    # the files themselves read as before
    meta.unlink()
    meta.write_text(OPERATOR_METADATA)
    offsets.unlink()
    offsets.write_text(OFFSETS)
    assert SparkMetadata.operators(hpath(str(query / "state")), conf).size() == 1
    assert SparkMetadata.batchTimestamp(hpath(str(query)), 0, conf).get() == 1700000000000


# -- sizes -------------------------------------------------------------------------------------

def test_a_huge_manifest_is_refused_unread_in_both_languages(spark, tmp_path):
    """A manifest is small (a line per snapshot file): one of 17 MiB was read whole, then parsed."""
    part = tmp_path / "state" / "0" / "0"
    part.mkdir(parents=True)
    victim = _sparse(part / "5.ks-snapshot", layout.MAX_MANIFEST_BYTES + 1)
    bound = f"more than a snapshot manifest may have ({layout.MAX_MANIFEST_BYTES})"
    with pytest.raises(Exception, match=r"more than a snapshot manifest may have \(16777216\)") as err:
        _files(spark, part).readManifest(5, _none(spark))
    assert str(victim) in str(err.value)
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.read_manifest(victim, 5)
    assert str(victim) in str(err.value) and bound in str(err.value)
    sp = StorePartition(0, 0, "default", str(part))
    with pytest.raises(Exception) as err:
        Checkpoint(LocalStorage(tmp_path)).read_manifest(sp, 5)
    assert str(victim) in str(err.value) and bound in str(err.value)


def test_a_changelog_above_what_an_array_holds_is_refused_unread_in_both_languages(spark, tmp_path):
    """A 3 GiB (sparse) changelog: the JVM's read of it could only end in an OutOfMemoryError."""
    part = tmp_path / "state" / "0" / "0"
    part.mkdir(parents=True)
    victim = _sparse(part / "5.ks-changelog", 3 << 30)
    bound = f"more than a changelog may have ({layout.MAX_CHANGELOG_BYTES})"
    with pytest.raises(Exception) as err:
        _files(spark, part).downloadChangelog(5, _none(spark), spark._jvm.java.io.File(
            str(tmp_path / "local.ks-changelog")).toPath())
    assert str(victim) in str(err.value) and bound in str(err.value)
    assert not (tmp_path / "local.ks-changelog").exists()
    with pytest.raises(changelog.CorruptChangelogError) as err:
        changelog.read_file(str(victim))
    assert str(victim) in str(err.value) and bound in str(err.value)
    sp = StorePartition(0, 0, "default", str(part), changelogs={(5, None): 3 << 30})
    with pytest.raises(Exception) as err:
        Checkpoint(LocalStorage(tmp_path)).read_changelog(sp, 5)
    assert str(victim) in str(err.value) and bound in str(err.value)


# -- a link swapped in after the check ---------------------------------------------------------

def test_a_link_swapped_in_between_the_check_and_the_open_is_never_read(spark, tmp_path):
    """The JVM checked for a link, then let Hadoop open the name: a link renamed into place in
    between was followed. Here a thread swaps a link to another manifest and the real file in and
    out of place while the JVM reads the name again and again: every read gets the real file or
    refuses the link, never the other manifest."""
    part = tmp_path / "state" / "0" / "0"
    part.mkdir(parents=True)
    real = json.loads((golden.GOLDEN / "manifest-v1.json").read_text())
    foreign = dict(real, numKeys=999999)
    pristine = part / ".pristine"
    pristine.write_text(json.dumps(real, separators=(",", ":")))
    outside = tmp_path / "outside.ks-snapshot"
    outside.write_text(json.dumps(foreign, separators=(",", ":")))
    target = part / "12.ks-snapshot"
    os.link(pristine, target)
    stop = threading.Event()

    def swap() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            temp = part / f".swap-{n}"
            if n % 2:
                temp.symlink_to(outside)
            else:
                os.link(pristine, temp)
            os.replace(temp, target)

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    files = _files(spark, part)
    outcomes = {"real": 0, "refused": 0}
    foreign_reads = 0
    others: list[str] = []
    deadline = time.monotonic() + 8
    try:
        while time.monotonic() < deadline:
            try:
                num_keys = files.readManifest(12, _none(spark)).numKeys()
            except Exception as exc:  # noqa: BLE001 -- judged by its message
                message = str(exc).split("\n\tat ")[0]
                if "is a symbolic link" in message and str(target) in message:
                    outcomes["refused"] += 1
                else:
                    others.append(message)
                continue
            if num_keys == foreign["numKeys"]:
                foreign_reads += 1
            else:
                assert num_keys == real["numKeys"]
                outcomes["real"] += 1
    finally:
        stop.set()
        swapper.join()
    assert foreign_reads == 0, f"{foreign_reads} reads followed the link ({outcomes}, {len(others)} other errors)"
    assert not others, others[:3]
    assert outcomes["real"] > 0 and outcomes["refused"] > 0, outcomes


# -- a rescale heir's shared files, in another partition's directory ---------------------------

def test_a_shared_file_read_through_a_linked_partition_directory_is_refused_in_both_languages(spark, tmp_path):
    """A heir's manifest names ``../0/ks-files/<name>``; with partition 0's directory replaced by
    a link to elsewhere, the JVM followed it (only this partition's own directories were checked)
    and read the foreign file. Both languages refuse it, naming the link."""
    op_dir = tmp_path / "state" / "0"
    heir = op_dir / "4"
    (heir / "ks-files").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "ks-files").mkdir(parents=True)
    (elsewhere / "ks-files" / "x.sst").write_bytes(b"foreign" * 4)
    (op_dir / "0").symlink_to(elsewhere)
    rel = "../0/ks-files/x.sst"

    files = _files(spark, heir)
    local = tmp_path / "local.sst"
    local_path = spark._jvm.java.io.File(str(local)).toPath()
    with pytest.raises(Exception, match="symbolic link") as err:
        files.download(files.resolve(rel), local_path)
    assert str(op_dir / "0") in str(err.value)
    assert not local.exists()
    assert not files.holds(spark._jvm.io.keyedstate.format.SnapshotFile("000009.sst", rel, 28))

    storage = LocalStorage(op_dir)
    with pytest.raises(Exception, match="symbolic link"):
        storage.read_bytes(ckpt.listing.file_path(storage, str(heir), layout.DEFAULT_STORE, 4, rel), 1 << 20, "file")
