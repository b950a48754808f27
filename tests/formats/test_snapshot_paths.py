"""The path rule (FORMATS.md, "The path rule"): both languages accept, refuse and resolve the
paths of tests/golden/snapshot-paths.json alike, a rescale heir's shared files included."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from keyedstate.checkpoint import listing
from keyedstate.checkpoint.storage import LocalStorage
from keyedstate.formats import layout

CASES = json.loads((Path(__file__).parent.parent / "golden" / "snapshot-paths.json").read_text())["cases"]


def _store_path(op_dir: Path, case: dict) -> Path:
    part = op_dir / str(case["partition"])
    return part if case["store"] == layout.DEFAULT_STORE else part / case["store"]


@pytest.mark.parametrize("case", CASES, ids=[c["path"] for c in CASES])
def test_python_applies_the_path_rule(tmp_path, case):
    if case["resolves"] is None:
        with pytest.raises(layout.UnsafePathError, match="corrupt or was tampered with"):
            layout.checked_relative_path(case["path"], "manifest m")
        return
    assert layout.checked_relative_path(case["path"], "manifest m") == case["path"]
    found = listing.file_path(LocalStorage(tmp_path), str(_store_path(tmp_path, case)), case["store"],
                              case["partition"], case["path"])
    assert found == str(tmp_path / case["resolves"])


def test_the_jvm_applies_the_path_rule(spark, tmp_path):
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    mismatches = []
    for case in CASES:
        try:
            jvm.io.keyedstate.format.CheckpointLayout.checkedRelativePath(case["path"], "manifest m")
            files = jvm.io.keyedstate.checkpoint.CheckpointFiles(
                jvm.org.apache.hadoop.fs.Path(_store_path(tmp_path, case).as_uri()), conf,
                case["store"] == layout.DEFAULT_STORE)
            found = str(files.resolve(case["path"]).toUri().getPath())
            expected = None if case["resolves"] is None else str(tmp_path / case["resolves"])
        except Exception as exc:  # py4j's error for the JVM's UnsafePathException
            found, expected = ("refused" if "corrupt or was tampered with" in str(exc) else str(exc)), (
                "refused" if case["resolves"] is None else str(tmp_path / case["resolves"]))
        if found != expected:
            mismatches.append((case["path"], found, expected))
    assert mismatches == []
