"""Table files (FORMATS.md, "Table files"): both languages take exactly the names of
tests/golden/table-files.json for immutable RocksDB table files, the only snapshot files a
restore or upload may hard-link and manifests may share."""
from __future__ import annotations

import json
from pathlib import Path

from keyedstate.formats import layout

CASES = json.loads((Path(__file__).parent.parent / "golden" / "table-files.json").read_text())["cases"]


def test_python_knows_the_table_files():
    assert {c["name"]: layout.is_table_file(c["name"]) for c in CASES} == {c["name"]: c["table"] for c in CASES}


def test_the_jvm_knows_the_table_files(spark):
    rule = spark._jvm.io.keyedstate.format.CheckpointLayout
    assert {c["name"]: rule.isTableFile(c["name"]) for c in CASES} == {c["name"]: c["table"] for c in CASES}
