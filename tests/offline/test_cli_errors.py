"""The offline tools on checkpoints they must not misreport (issues 45.6, 46.6, 46.9): a healthy
checkpoint whose oldest state versions outlive Spark's offset log, store file names with
non-ASCII digits, changelogs whose CRCs hold while their lengths or counts lie, checkpoints of
Spark's own providers, missing paths and directories that are not checkpoints; and the
``keyedstate`` command's help, version and one-line errors.

Every command runs as the real ``keyedstate`` executable in a subprocess."""
from __future__ import annotations

import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest

import keyedstate
from keyedstate.formats import changelog, layout
from keyedstate.offline.verify import verify
from support.constants import HDFS_PROVIDER, KS, PFX, ROCKSDB_PROVIDER
from support.driver import run_query, session_confs
from support.offline import copy_checkpoint
from support.scenarios import KV, agg_update

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = [[(f"k{(b * 3 + i) % 7}", b * 10 + i) for i in range(6)] for b in range(9)]
COMMANDS = ["jar", "demo", "conf-reference", "inspect", "rescale", "verify", "get", "migrate", "undo"]


def keyedstate_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    exe = shutil.which("keyedstate")
    assert exe, "the keyedstate command is not on PATH"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


def last_lines(result: subprocess.CompletedProcess, n: int = 5) -> list[str]:
    return (result.stdout + result.stderr).strip().splitlines()[-n:]


@pytest.fixture(scope="module")
def checkpoints(spark, tmp_path_factory):
    """keyedstate (Spark keeps 3 batches of its logs, keyedstate snapshots every 4 versions, 9
    batches: the oldest retained snapshot is older than the oldest offset-log entry), and Spark's
    RocksDB and HDFS-backed providers (3 batches)."""
    root = tmp_path_factory.mktemp("cli-errors")
    out = {}
    with session_confs(spark, {PFX + "snapshotInterval": "4", "spark.sql.streaming.minBatchesToRetain": "3"}):
        run_query(spark, KS, agg_update, KV, STEPS, root / "ks" / "checkpoint", root / "ks" / "input", "update")
    out["keyedstate"] = root / "ks" / "checkpoint"
    for name, provider in (("rocksdb", ROCKSDB_PROVIDER), ("hdfs", HDFS_PROVIDER)):
        run_query(spark, provider, agg_update, KV, STEPS[:3], root / name / "checkpoint", root / name / "input",
                  "update")
        out[name] = root / name / "checkpoint"
    return out


# -- 46.6: a healthy checkpoint verifies clean ------------------------------------------------

def test_verify_passes_state_versions_older_than_the_offset_log(checkpoints):
    ck = checkpoints["keyedstate"]
    snapshots = sorted(layout.version_of(p.name, layout.MANIFEST_SUFFIX) for p in (ck / "state/0/0").glob("*.ks-snapshot"))
    offsets = sorted(int(p.name) for p in (ck / "offsets").iterdir() if p.name.isascii() and p.name.isdigit())
    assert snapshots and snapshots[0] - 1 < offsets[0], (snapshots, offsets)  # the case under test
    report = verify(ck)
    assert report["ok"] and not report["problems"], report
    result = keyedstate_cli("verify", "--checkpoint", str(ck))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[0].endswith(": OK"), result.stdout


# -- 46.9: one rule for store file names; lying changelogs are problems -------------------------

def test_store_file_names_are_ascii_digits_only():
    assert layout.number_of("12") == 12 and layout.number_of("9223372036854775807") == (1 << 63) - 1
    for name in ("²", "٣", "1²", "", "-1", "+1", " 1", "9223372036854775808", "1" * 20):
        assert layout.number_of(name) is None, name
    assert layout.version_of("7.ks-changelog", layout.CHANGELOG_SUFFIX) == 7
    assert layout.versioned_file("7_" + "0" * 8 + "-0000-0000-0000-" + "0" * 12 + ".ks-snapshot",
                                 layout.MANIFEST_SUFFIX)[0] == 7
    for name in ("².ks-changelog", "٣.ks-changelog", "٣_" + "0" * 8 + "-0000-0000-0000-" + "0" * 12 + ".ks-changelog"):
        assert layout.versioned_file(name, layout.CHANGELOG_SUFFIX) is None, name
    assert not layout.FOREIGN_FILE.fullmatch("٣.delta") and not layout.FILE_NAME.fullmatch("٣.sst")


def test_stray_non_ascii_digit_names_do_not_crash_the_tools(checkpoints, tmp_path):
    ck = copy_checkpoint(checkpoints["keyedstate"], tmp_path / "ck")
    clean = verify(ck)["checked"]
    (ck / "state/0/0/².ks-changelog").write_bytes(b"stray")
    (ck / "state/0/1/٣.ks-snapshot").write_bytes(b"stray")
    (ck / "state/0/²").mkdir()
    (ck / "commits/³").write_text("stray")
    assert verify(ck)["checked"] == clean
    for args in (["inspect"], ["verify"], ["get", "--operator", "0", "--key", '["k1"]']):
        result = keyedstate_cli(*args, "--checkpoint", str(ck))
        assert result.returncode == 0 and "Traceback" not in result.stderr, (args, result.stdout, result.stderr)


def _lying_changelog(path: Path, lie: str) -> None:
    """Rewrite ``path`` as a format-1 changelog of the same records whose CRC is right but whose
    record count (``count``) or last key length (``length``) is not."""
    log_ = changelog.decode(path.read_bytes(), str(path))
    records = [changelog.encode_record(*r) for r in log_.records()]
    count = len(records)
    if lie == "count":
        count += 1
    else:
        last = bytearray(records[-1])
        last[1:5] = struct.pack(">I", 10_000)
        records[-1] = bytes(last)
    path.write_bytes(changelog.frame(log_.version, log_.key_groups, records, count))


@pytest.mark.parametrize("lie", ["count", "length"])
def test_verify_reports_a_changelog_whose_lengths_or_count_lie(checkpoints, tmp_path, lie):
    ck = copy_checkpoint(checkpoints["keyedstate"], tmp_path / "ck")
    path = max((ck / "state/0/0").glob("*.ks-changelog"), key=lambda p: layout.version_of(p.name, ".ks-changelog"))
    _lying_changelog(path, lie)
    report = verify(ck)
    assert not report["ok"] and any(p["path"] == str(path) for p in report["problems"]), report
    result = keyedstate_cli("verify", "--checkpoint", str(ck))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"PROBLEM {path}" in result.stdout, result.stdout


# -- 45.6: another provider's checkpoint, a missing path, not a checkpoint ------------------------

FOREIGN_TOOLS = {
    "inspect": [],
    "verify": [],
    "get": ["--operator", "0", "--key", '["k1"]'],
    "rescale": ["--partitions", "3"],
}


@pytest.mark.parametrize("tool", list(FOREIGN_TOOLS))
@pytest.mark.parametrize("provider", ["rocksdb", "hdfs"])
def test_tools_say_another_providers_checkpoint_is_not_keyedstates(checkpoints, tool, provider):
    ck = checkpoints[provider]
    cls = {"rocksdb": ROCKSDB_PROVIDER, "hdfs": HDFS_PROVIDER}[provider]
    result = keyedstate_cli(tool, "--checkpoint", str(ck), *FOREIGN_TOOLS[tool])
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stdout + result.stderr
    said = [line for line in last_lines(result) if "is not a keyedstate checkpoint" in line]
    assert said and cls in said[0] and "CORRUPT" not in result.stdout, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [said[0]], result.stderr  # no Spark started, no log lines
    if tool == "verify":
        from keyedstate.checkpoint import NotKeyedstateCheckpoint

        with pytest.raises(NotKeyedstateCheckpoint, match=cls):
            verify(ck)


def test_migrate_from_keyedstate_refuses_state_files_that_are_not_keyedstates(checkpoints, tmp_path):
    """The offset log records keyedstate, the state files are the RocksDB provider's."""
    ck = copy_checkpoint(checkpoints["rocksdb"], tmp_path / "ck")
    last = max(int(p.name) for p in (ck / "offsets").iterdir() if p.name.isdigit())
    entry = ck / "offsets" / str(last)
    entry.write_text(entry.read_text().replace(ROCKSDB_PROVIDER, KS))
    for args in (["migrate", "--to", "rocksdb", "--dry-run"], ["verify"], ["get", "--operator", "0", "--key", '["k1"]']):
        result = keyedstate_cli(*args, "--checkpoint", str(ck))
        assert result.returncode != 0 and "Traceback" not in result.stderr, (args, result.stdout + result.stderr)
        said = [line for line in last_lines(result) if "is not a keyedstate checkpoint" in line]
        assert said and str(entry) in said[0] and "1.zip" in said[0], (args, result.stdout + result.stderr)


TOOL_ARGS = {**FOREIGN_TOOLS, "migrate": ["--to", "rocksdb"]}


@pytest.mark.parametrize("tool", list(TOOL_ARGS))
def test_a_missing_path_or_a_non_checkpoint_fails_fast_in_one_line(tmp_path, tool):
    empty = tmp_path / "not-a-checkpoint"
    empty.mkdir()
    (empty / "notes.txt").write_text("hello\n")
    for path in (tmp_path / "missing", empty):
        started = time.monotonic()
        result = keyedstate_cli(tool, "--checkpoint", str(path), *TOOL_ARGS[tool])
        took = time.monotonic() - started
        lines = result.stderr.strip().splitlines()
        assert result.returncode != 0 and len(lines) == 1, (path, result.stderr)  # Spark would log first
        assert lines[0].startswith("keyedstate: error: ") and str(path) in lines[0], lines
        assert took < 15, f"{tool} took {took:.1f} s to refuse {path}"


def test_help_version_and_usage_errors():
    top = keyedstate_cli("--help")
    assert top.returncode == 0, top.stderr
    described = top.stdout.split("positional arguments")[0]
    for command in COMMANDS:
        assert command in described, (command, described)
    helps = [top.stdout] + [keyedstate_cli(c, "--help").stdout for c in COMMANDS]
    assert not [h for h in helps if "`" in h], [h for h in helps if "`" in h]
    version = keyedstate_cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"keyedstate {keyedstate.__version__}"
    for args in (["verify"], ["rescale", "--checkpoint", "x", "--partitions", "two"], ["nope"]):
        result = keyedstate_cli(*args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("keyedstate: error: "), \
            (args, result.stderr)
