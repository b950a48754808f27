"""Issue 11, checkpoint files: every path that comes from a checkpoint file is validated, and a
reader does not trust what it reads.

* A snapshot manifest's ``files[].name`` / ``files[].path`` and its ``replay`` entry must never
  make keyedstate write, copy, read or delete anything outside the checkpoint and its own work
  directories -- not on a restart of the query, not in ``keyedstate inspect``, not in
  ``keyedstate rescale``. A bad manifest is either skipped (an older snapshot plus changelogs
  rebuild the same state, with a warning naming it) or the load fails naming the manifest.
* A manifest whose recorded sizes disagree with the files is not loaded silently.
* Record lengths inside a CRC-valid changelog are checked against the payload and the record
  count; the error names the file (no silent truncation, no bare ``struct.error``).
* A full local disk is not reported as a missing/truncated/corrupt checkpoint file.

Speed: the queries run once per module (a checkpoint with a snapshot of every version, one with
changelogs only); each test tampers with a copy of the checkpoint and restarts the query on it,
over the shared input directory (so a restart also reads the files earlier tests added: the
expected counts are those of every input file).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import subprocess
import sys
import uuid
import zlib
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

import keyedstate
from keyedstate.formats import changelog
from support.constants import KS, PFX, PROVIDER_CONF
from support.driver import FileStream, collect_into, count_by_key, session_confs, wait_for
from support.files import describe_changes, tree
from support.sessions import SessionProcess

pytestmark = pytest.mark.timeout(300)

SNAPSHOT_EVERY_VERSION = {PFX + "snapshotInterval": "1"}
CHANGELOGS_ONLY = {PFX + "snapshotInterval": "100"}


# -- helpers -------------------------------------------------------------------------------------------

def batch_keys(b: int) -> list[str]:
    return [f"key-{(b * 7 + i) % 40}" for i in range(30)]


def all_input_counts(stream: FileStream) -> Counter:
    """What a count per key over every file of the input directory is."""
    counts = Counter()
    for f in stream.input.iterdir():
        if f.name.endswith(".json") and not f.name.startswith("."):
            counts.update(json.loads(line)["k"] for line in f.read_text().splitlines() if line.strip())
    return counts


def run_base(spark, root: Path, confs: dict) -> SimpleNamespace:
    """Three batches of a count per key; the stopped query's input, checkpoint and output."""
    stream = FileStream(spark, root, "k STRING")
    out: dict = {}
    with session_confs(spark, {PROVIDER_CONF: KS, **confs}):
        query = stream.start(count_by_key, collect_into(out))
        try:
            for b in range(3):
                stream.step(query, [{"k": k} for k in batch_keys(b)])
        finally:
            query.stop()
    return SimpleNamespace(root=root, checkpoint=Path(stream.checkpoint), out=out, confs=confs)


def copy_of(spark, base: SimpleNamespace, dest: Path) -> tuple[FileStream, dict, Path]:
    """A copy of the base query's checkpoint, reading the base's input directory."""
    checkpoint = dest / "checkpoint"
    copy_checkpoint(base.checkpoint, checkpoint)
    return FileStream(spark, base.root, "k STRING", checkpoint=checkpoint), dict(base.out), checkpoint


def restart(spark, stream: FileStream, out: dict, keys: list[str], confs: dict) -> str | None:
    """Restart the query on its checkpoint with one more input file; the error text, or None."""
    stream.add([{"k": k} for k in keys])
    with session_confs(spark, {PROVIDER_CONF: KS, **confs}):
        query = stream.start(count_by_key, collect_into(out))
        try:
            stream.settle(query)
            return None
        except Exception as exc:  # StreamingQueryException
            return str(exc)
        finally:
            query.stop()


def read_manifest(path: Path) -> dict:
    return json.loads(path.read_text())


def write_manifest(path: Path, manifest: dict) -> None:
    path.write_text(json.dumps(manifest, indent=2))
    (path.parent / f".{path.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum of the old content


def pick(manifest: dict, sst: bool) -> dict:
    """A files[] entry: an SST file, or one of RocksDB's small files (copied, never hard-linked),
    preferring a non-empty one (MANIFEST, OPTIONS, CURRENT)."""
    entries = [e for e in manifest["files"] if e["name"].endswith(".sst") == sst]
    assert entries, f"no {'SST' if sst else 'non-SST'} file in {manifest['files']}"
    return max(entries, key=lambda e: (int(e["size"]) > 0, e["name"].startswith(("MANIFEST", "OPTIONS", "CURRENT"))))


class ReadDetector:
    """Tells whether a file was read, from its access time: armed with an atime older than its
    mtime, the first read updates it (relatime and strictatime mounts both do)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        st = path.stat()
        os.utime(path, ns=(st.st_mtime_ns - 1000 * 10**9, st.st_mtime_ns))
        self.armed = path.stat().st_atime_ns

    def was_read(self) -> bool:
        return self.path.stat().st_atime_ns != self.armed

    @staticmethod
    def require_support(directory: Path) -> None:
        probe = directory / f".atime-probe-{uuid.uuid4()}"
        probe.write_bytes(b"probe")
        detector = ReadDetector(probe)
        probe.read_bytes()
        supported = detector.was_read()
        probe.unlink()
        if not supported:
            pytest.skip(f"the file system of {directory} does not update access times (noatime)")


def copy_checkpoint(source: Path, dest: Path) -> None:
    """A copy of a shared checkpoint; files of an upload still in flight there (temporary names,
    published by a rename) are not part of it."""
    shutil.copytree(source, dest, symlinks=True, ignore=shutil.ignore_patterns(".*.tmp", ".*.tmp.crc"))


def dotdot_to(target: Path) -> str:
    """A relative name that climbs out of any directory and lands on ``target``."""
    return "../" * 40 + str(target).lstrip("/")


def outside_dir(root: Path) -> Path:
    outside = root / "outside"
    outside.mkdir(parents=True, exist_ok=True)
    (outside / "victim.txt").write_bytes(b"precious data, not keyedstate's\n")
    return outside


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "keyedstate.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


# -- changelog framing (FORMATS.md, "Changelog": format 1 written out again here; a checkpoint's
# files are format 2, unwrapped with keyedstate's codec and wrapped again uncompressed) -----------------

HEADER = struct.Struct(">8sHQI")   # magic, format version, version, key groups
TRAILER = struct.Struct(">BQI")    # 0xFF, record count, CRC-32 of header and records


def split_changelog(data: bytes) -> tuple[bytes, bytes, int, dict]:
    """(format-1 header, records, record count, format-2 metadata) of a valid changelog file."""
    log = changelog.decode(data, "the changelog to start from")
    header = HEADER.pack(changelog.MAGIC, changelog.FORMAT_VERSION, log.version, log.key_groups)
    return header, log.payload, log.record_count, log.meta


def frame_changelog(header: bytes, payload: bytes, count: int, meta: dict) -> bytes:
    """A CRC-valid format-2 file (codec 0, so that the records are read exactly as written)."""
    body = header + payload
    inner = body + TRAILER.pack(0xFF, count, zlib.crc32(body))
    return changelog.compress(inner, {k: v for k, v in meta.items() if k not in ("version", "keyGroups")},
                              changelog.CODEC_NONE)


def tamper_changelog(path: Path, how: str) -> None:
    """Rewrite a real changelog into a CRC-valid one whose records lie about their lengths/count."""
    header, payload, count, meta = split_changelog(path.read_bytes())
    assert count > 0
    if how == "key-length-overruns-payload":  # a delete whose key length runs past the end
        payload += bytes([2]) + struct.pack(">I", 1000) + b"0123456789"
        count += 1
    elif how == "value-length-field-cut-short":  # a put whose value length field is cut short
        payload += bytes([1]) + struct.pack(">I", 3) + b"abc" + b"\x00\x01"
        count += 1
    elif how == "record-count-mismatch":  # records intact, trailer claims more
        count += 5
    else:
        raise ValueError(how)
    path.write_bytes(frame_changelog(header, payload, count, meta))
    (path.parent / f".{path.name}.crc").unlink(missing_ok=True)


CHANGELOG_TAMPERINGS = ["key-length-overruns-payload", "value-length-field-cut-short", "record-count-mismatch"]


# -- the checkpoints every test starts from ------------------------------------------------------------

@pytest.fixture(scope="module")
def snapshot_base(spark, tmp_path_factory) -> SimpleNamespace:
    """Three batches with a snapshot of every version; returns once partition 0's snapshot of
    version 3 is in the checkpoint."""
    base = run_base(spark, tmp_path_factory.mktemp("snapshot-base"), SNAPSHOT_EVERY_VERSION)
    part = base.checkpoint / "state" / "0" / "0"
    wait_for(lambda: (part / "3.ks-snapshot").exists(), what="snapshot of version 3 of partition 0")
    return base


@pytest.fixture(scope="module")
def changelog_base(spark, tmp_path_factory) -> SimpleNamespace:
    """Three batches, changelogs only (every load replays them)."""
    return run_base(spark, tmp_path_factory.mktemp("changelog-base"), CHANGELOGS_ONLY)


# -- the query restarts from a tampered manifest -------------------------------------------------------

@pytest.mark.parametrize("variant", ["name-absolute", "name-dotdot", "path-absolute", "path-dotdot"])
def test_restart_from_manifest_pointing_outside_touches_nothing_outside(spark, snapshot_base, tmp_path, variant):
    stream, out, checkpoint = copy_of(spark, snapshot_base, tmp_path)
    part = checkpoint / "state" / "0" / "0"
    outside = outside_dir(tmp_path)
    manifest_path = part / "3.ks-snapshot"
    manifest = read_manifest(manifest_path)
    detector = None
    if variant.startswith("name"):
        entry = pick(manifest, sst=True)
        entry["name"] = str(outside / "victim.txt") if variant == "name-absolute" else dotdot_to(outside / "planted")
    else:
        ReadDetector.require_support(outside)
        entry = pick(manifest, sst=False)
        copy = outside / f"copy-of-{entry['name']}"
        shutil.copyfile(part / entry["path"], copy)  # the same bytes: only where it is read from is wrong
        entry["path"] = str(copy) if variant == "path-absolute" else os.path.relpath(copy, part)
        detector = copy
    write_manifest(manifest_path, manifest)
    before = tree(outside)  # (reads every file: detectors are armed after it)
    detector = detector and ReadDetector(detector)

    error = restart(spark, stream, out, ["key-0", f"brand-new-{variant}"], SNAPSHOT_EVERY_VERSION)

    was_read = detector is not None and detector.was_read()  # before the tree below reads it
    assert not was_read, \
        f"a manifest entry ({variant}) made keyedstate read {detector.path}, outside the checkpoint"
    changes = describe_changes(before, tree(outside))
    assert not changes, f"a manifest entry ({variant}) made keyedstate change files outside the checkpoint: {changes}"
    if error is None:  # skipped in favour of an older snapshot + changelogs: the state must be exact
        assert {k: v[1] for k, v in out.items()} == dict(all_input_counts(stream))
    else:
        assert str(manifest_path) in error, f"the error does not name the bad manifest {manifest_path}:\n{error[:2000]}"


def replay_manifest(part: Path) -> dict:
    """A snapshot manifest of version 1 that holds the version as a changelog to replay (the
    layout a rescale publishes), its file a copy of the partition's changelog 1."""
    key_groups = changelog.decode((part / "1.ks-changelog").read_bytes(), "changelog 1").key_groups
    rel = f"ks-files/{uuid.uuid4()}-replay-1.ks-changelog"
    (part / "ks-files").mkdir(exist_ok=True)
    shutil.copyfile(part / "1.ks-changelog", part / rel)
    return {"format": "keyedstate-snapshot", "formatVersion": 1, "version": 1, "keyGroups": key_groups,
            "numKeys": 0, "files": [],
            "replay": {"name": "replay-1.ks-changelog", "path": rel, "size": (part / rel).stat().st_size}}


@pytest.mark.parametrize("variant", ["replay-name-absolute", "replay-path-dotdot"])
def test_restart_from_manifest_with_replay_entry_pointing_outside_touches_nothing_outside(
        spark, changelog_base, tmp_path, variant):
    stream, out, checkpoint = copy_of(spark, changelog_base, tmp_path)
    part = checkpoint / "state" / "0" / "0"
    manifest = replay_manifest(part)
    outside = outside_dir(tmp_path)
    detector = None
    if variant == "replay-name-absolute":  # the local copy would be written there, then deleted
        manifest["replay"]["name"] = str(outside / "victim.txt")
    else:
        ReadDetector.require_support(outside)
        copy = outside / "replay.ks-changelog"
        shutil.copyfile(part / manifest["replay"]["path"], copy)
        manifest["replay"]["path"] = os.path.relpath(copy, part)
        detector = copy
    manifest_path = part / "1.ks-snapshot"
    write_manifest(manifest_path, manifest)
    before = tree(outside)  # (reads every file: detectors are armed after it)
    detector = detector and ReadDetector(detector)

    error = restart(spark, stream, out, ["key-1", f"another-new-key-{variant}"], CHANGELOGS_ONLY)

    was_read = detector is not None and detector.was_read()  # before the tree below reads it
    assert not was_read, \
        f"a manifest's replay entry ({variant}) made keyedstate read {detector.path}, outside the checkpoint"
    changes = describe_changes(before, tree(outside))
    assert not changes, f"a manifest's replay entry ({variant}) made keyedstate change files outside the checkpoint: {changes}"
    if error is None:
        assert {k: v[1] for k, v in out.items()} == dict(all_input_counts(stream))
    else:
        assert str(manifest_path) in error, f"the error does not name the bad manifest {manifest_path}:\n{error[:2000]}"


def test_manifest_sizes_that_disagree_with_the_files_are_not_loaded_silently(spark, snapshot_base, tmp_path):
    """The only loadable base is snapshot 3 (older snapshots and changelogs cleaned up, as
    cleanup leaves them), and its manifest records wrong sizes: nothing consistent can be
    rebuilt, so the load must fail naming the manifest or the file."""
    stream, out, checkpoint = copy_of(spark, snapshot_base, tmp_path)
    part = checkpoint / "state" / "0" / "0"
    manifest_path = part / "3.ks-snapshot"
    for p in part.iterdir():  # what cleanup would have removed had more versions passed
        if p.name.endswith((".ks-changelog", ".ks-snapshot", ".crc")) and p.name != "3.ks-snapshot":
            p.unlink()
    manifest = read_manifest(manifest_path)
    entry = pick(manifest, sst=True)
    entry["size"] = int(entry["size"]) + 4096
    write_manifest(manifest_path, manifest)

    error = restart(spark, stream, out, ["key-2"], SNAPSHOT_EVERY_VERSION)
    assert error is not None, (f"the query loaded snapshot 3 although {manifest_path} records {entry['size']} "
                               f"bytes for {entry['path']}, which has {(part / entry['path']).stat().st_size}")
    assert str(manifest_path) in error or entry["path"] in error, error[:2000]


# -- offline tools: inspect and rescale -----------------------------------------------------------------

@pytest.fixture(scope="module")
def good_inspect(snapshot_base, tmp_path_factory) -> SimpleNamespace:
    """The snapshot checkpoint as it is now, and inspect's report of it."""
    checkpoint = tmp_path_factory.mktemp("inspected") / "checkpoint"
    copy_checkpoint(snapshot_base.checkpoint, checkpoint)
    good = cli("inspect", "--checkpoint", str(checkpoint), "--json")
    assert good.returncode == 0, good.stderr
    return SimpleNamespace(checkpoint=checkpoint, report=json.loads(good.stdout))


def key_counts(report: dict) -> list:
    """The state a report describes: keys per key group of every store partition."""
    return [(op["operatorId"], store["storeName"], part["partitionId"], part["keys"], part["keysPerKeyGroup"])
            for op in report["operators"] for store in op["stores"] for part in store["partitions"]]


@pytest.mark.parametrize("variant", ["name-absolute", "name-dotdot", "path-absolute", "path-dotdot", "replay-path-dotdot"])
def test_inspect_of_manifest_pointing_outside_touches_nothing_outside(good_inspect, tmp_path, variant):
    checkpoint = tmp_path / "checkpoint"
    copy_checkpoint(good_inspect.checkpoint, checkpoint)
    part = checkpoint / "state" / "0" / "0"
    manifest_path = part / "3.ks-snapshot"
    manifest = read_manifest(manifest_path)
    outside = outside_dir(tmp_path)
    detector = None
    if variant.startswith("name"):
        entry = pick(manifest, sst=False)
        entry["name"] = str(outside / "victim.txt") if variant == "name-absolute" else dotdot_to(outside / "planted")
    elif variant.startswith("path"):
        ReadDetector.require_support(outside)
        entry = pick(manifest, sst=False)
        copy = outside / f"copy-of-{entry['name']}"
        shutil.copyfile(part / entry["path"], copy)
        entry["path"] = str(copy) if variant == "path-absolute" else os.path.relpath(copy, part)
        detector = copy
    else:  # version 3 as its version-2 files plus a changelog to replay, read from outside
        ReadDetector.require_support(outside)
        manifest = read_manifest(part / "2.ks-snapshot")
        manifest["version"] = 3
        copy = outside / "3.ks-changelog"
        shutil.copyfile(part / "3.ks-changelog", copy)
        manifest["replay"] = {"name": "replay-3.ks-changelog", "path": os.path.relpath(copy, part),
                              "size": copy.stat().st_size}
        detector = copy
    write_manifest(manifest_path, manifest)
    before = tree(outside)  # (reads every file: detectors are armed after it)
    detector = detector and ReadDetector(detector)

    result = cli("inspect", "--checkpoint", str(checkpoint), "--json")

    was_read = detector is not None and detector.was_read()  # before the tree below reads it
    assert not was_read, \
        f"inspect of a manifest entry ({variant}) read {detector.path}, outside the checkpoint"
    changes = describe_changes(before, tree(outside))
    assert not changes, f"inspect of a manifest entry ({variant}) changed files outside the checkpoint: {changes}"
    if result.returncode == 0:  # skipped in favour of an older snapshot: same counts, and a warning naming it
        assert key_counts(json.loads(result.stdout)) == key_counts(good_inspect.report)
        assert str(manifest_path) in result.stderr, "the skipped manifest is not named in a warning"
    else:
        assert result.returncode == 1 and str(manifest_path) in result.stderr and "Traceback" not in result.stderr, \
            f"exit {result.returncode}; stderr:\n{result.stderr[-2000:]}"


def test_rescale_of_manifest_pointing_outside_touches_nothing_outside(spark, snapshot_base, tmp_path):
    checkpoint = tmp_path / "checkpoint"
    copy_checkpoint(snapshot_base.checkpoint, checkpoint)
    part = checkpoint / "state" / "0" / "0"
    manifest_path = part / "3.ks-snapshot"
    manifest = read_manifest(manifest_path)
    outside = outside_dir(tmp_path)
    pick(manifest, sst=False)["name"] = str(outside / "victim.txt")
    write_manifest(manifest_path, manifest)
    before = tree(outside)

    error = None
    try:
        keyedstate.rescale(checkpoint, 4, spark=spark)
    except Exception as exc:
        error = str(exc)

    changes = describe_changes(before, tree(outside))
    assert not changes, f"rescale of a tampered manifest changed files outside the checkpoint: {changes}"
    if error is not None:
        assert str(manifest_path) in error, error[:2000]


# -- changelog records that lie about their lengths -------------------------------------------------------

@pytest.mark.parametrize("how", CHANGELOG_TAMPERINGS)
def test_state_load_of_changelog_with_lying_record_lengths_fails_naming_the_file(spark, changelog_base,
                                                                                 tmp_path, how):
    checkpoint = tmp_path / "checkpoint"
    copy_checkpoint(changelog_base.checkpoint, checkpoint)
    victim = checkpoint / "state" / "0" / "0" / "2.ks-changelog"
    tamper_changelog(victim, how)
    with session_confs(spark, {PROVIDER_CONF: KS}):
        try:
            rows = spark.read.format("statestore").load(str(checkpoint)).collect()
            error = None
        except Exception as exc:
            error = str(exc)
    assert error is not None, f"a CRC-valid changelog whose records lie ({how}) loaded silently ({len(rows)} rows)"
    assert str(victim) in error, f"the error does not name {victim}:\n{error[-1500:]}"
    assert "struct.error" not in error, f"a bare struct.error escaped:\n{error[-1500:]}"


@pytest.mark.parametrize("how", CHANGELOG_TAMPERINGS)
def test_inspect_of_changelog_with_lying_record_lengths_fails_naming_the_file(changelog_base, tmp_path, how):
    checkpoint = tmp_path / "checkpoint"
    copy_checkpoint(changelog_base.checkpoint, checkpoint)
    victim = checkpoint / "state" / "0" / "0" / "2.ks-changelog"
    tamper_changelog(victim, how)
    result = cli("inspect", "--checkpoint", str(checkpoint))
    assert result.returncode == 1, f"inspect accepted a changelog whose records lie ({how}); exit {result.returncode}"
    assert str(victim) in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]


# -- a full local disk -----------------------------------------------------------------------------------

@pytest.fixture
def small_tmpfs(tmp_path):
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to simulate a full local disk: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def fill(directory: Path) -> None:
    """Fill the file system of ``directory`` to the last byte (it may be full already: RocksDB
    preallocates its files)."""
    try:
        fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
        return
    try:
        for size in (1 << 20, 4096, 1):
            chunk = b"\0" * size
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    finally:
        os.close(fd)


def _sst_files(root: Path) -> list[Path] | None:
    """RocksDB files under ``root``; None while a directory vanishes under the walk (look again)."""
    try:
        return list(root.rglob("*.sst"))
    except FileNotFoundError:
        return None


def test_full_local_disk_is_not_reported_as_a_corrupt_checkpoint(small_tmpfs, tmp_path):
    """localDir on a small file system that is full when a restart downloads the snapshot; once
    space is back, the query continues with nothing lost or counted twice."""
    local = small_tmpfs / "keyedstate"
    checkpoint = tmp_path / "checkpoint"
    with SessionProcess(tmp_path / "session", confs={PFX + "localDir": str(local), PFX + "serverProcesses": "1",
                                                     PFX + "snapshotInterval": "1"}) as session:
        first = session.run(checkpoint, tmp_path / "input", [f"k{i}" for i in range(50)])
        assert first["ok"], first
        wait_for(lambda: all((checkpoint / "state" / "0" / str(p) / "1.ks-snapshot").exists() for p in (0, 1)),
                 what="snapshots of version 1")
        try:  # the stopped query's stores are closed (their RocksDB files deleted) by maintenance
            wait_for(lambda: _sst_files(local) == [], timeout=30, what="stores of the stopped query to close")
        except AssertionError:
            pass
        fill(small_tmpfs)
        second = session.run(checkpoint, tmp_path / "input", ["k1", "k2"])
        (small_tmpfs / "filler").unlink(missing_ok=True)  # space is back: the query continues exactly
        third = session.run(checkpoint, tmp_path / "input", ["k3"])
    assert third["ok"], third
    assert {k: third["counts"].get(k) for k in ("k1", "k2", "k3")} == {"k1": 2, "k2": 2, "k3": 2}, third
    assert not second["ok"], "expected the restart to fail: its local disk is full"
    error = second["error"]
    assert "missing, truncated or corrupt" not in error, (
        "a full local disk is reported as a damaged checkpoint file, which invites deleting a healthy "
        f"checkpoint:\n{error[error.find('keyedstate:'):].splitlines()[0][:600]}")
    assert any(s in error.lower() for s in ("no space left", "enospc", "disk full", "disk space")), \
        f"the error does not say that the local disk is full: {error[:1500]}"
