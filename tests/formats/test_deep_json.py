"""JSON read from a checkpoint file nested deeper than Python's recursion limit is refused as
that file's corruption, naming it, like any other malformed JSON (``json`` raises
RecursionError, which the readers' ``except ValueError`` did not catch)."""
from __future__ import annotations

import struct
import zlib

import pytest

from keyedstate.formats import changelog, layout, manifest
from keyedstate.offline.storage import LocalStorage
from keyedstate.checkpoint import Checkpoint, CheckpointProblem

DEEP = "[" * 200_000 + "]" * 200_000


def test_a_manifest_nested_too_deeply_is_corrupt_naming_it():
    data = ('{"format":1,"version":3,"files":' + DEEP + "}").encode()
    with pytest.raises(manifest.CorruptManifestError, match=r"3\.ks-snapshot.*nested too deeply"):
        manifest.decode(data, "/ck/state/0/0/3.ks-snapshot")


def test_a_changelog_whose_metadata_is_nested_too_deeply_is_corrupt_naming_it():
    meta = ('{"version":3,"keyGroups":1,"x":' + DEEP + "}").encode()
    header = changelog.HEADER_V2.pack(changelog.MAGIC_V2, changelog.FORMAT_VERSION_V2, changelog.CODEC_NONE,
                                      len(meta)) + meta
    data = header + struct.pack(">I", zlib.crc32(header)) + changelog.encode(3, 1, [])
    with pytest.raises(changelog.CorruptChangelogError, match=r"3\.ks-changelog has unreadable metadata"):
        changelog.decode(data, "/ck/state/0/0/3.ks-changelog")


@pytest.mark.parametrize("entry", ["offsets", "commits", "metadata"])
def test_spark_logs_nested_too_deeply_are_corrupt_naming_them(tmp_path, entry):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    (tmp_path / "state/0/_metadata").mkdir(parents=True)
    (tmp_path / "offsets/0").write_text("v1\n" + DEEP + "\n0")
    (tmp_path / "commits/0").write_text("v1\n" + DEEP)
    (tmp_path / "state/0/_metadata/metadata").write_text("v1\n" + DEEP)
    ck = Checkpoint(LocalStorage(tmp_path))
    read = {"offsets": lambda: ck.offset_entry(0), "commits": lambda: ck.commit_entry(0),
            "metadata": lambda: ck.operator_metadata(ck.path("state", "0"))}[entry]
    with pytest.raises(CheckpointProblem, match="truncated or corrupt .*nested too deeply"):
        read()


def test_json_of_reads_what_json_reads():
    assert layout.json_of('{"a":[1,{"b":null}]}') == {"a": [1, {"b": None}]}
    with pytest.raises(ValueError):
        layout.json_of("{")
