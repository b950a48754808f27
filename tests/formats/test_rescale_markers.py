"""The rescale's marker files (FORMATS.md, "Checkpoint layout"): Python writes them and the JVM's
cleanup acts on them, so both read the names of tests/golden/rescale-markers.json alike."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from keyedstate.formats import layout

CASES = json.loads((Path(__file__).parent.parent / "golden" / "rescale-markers.json").read_text())["cases"]


def _python(name: str) -> dict | None:
    if (m := layout.BORROWER_MARKER.fullmatch(name)) is not None:
        return {"kind": "borrower", "partition": int(m.group(1))}
    if (m := layout.RETIRED_MARKER.fullmatch(name)) is not None:
        return {"kind": "retired", "partition": int(m.group(1)), "version": int(m.group(2))}
    return None


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_python_reads_the_marker_names(case):
    assert _python(case["name"]) == case["marks"]


def test_the_jvm_reads_the_marker_names(spark, tmp_path):
    jvm = spark._jvm
    paths = jvm.io.keyedstate.checkpoint.PartitionPaths(jvm.org.apache.hadoop.fs.Path((tmp_path / "0").as_uri()), True)
    found = []
    for case in CASES:
        names = jvm.scala.jdk.javaapi.CollectionConverters.asScala(jvm.java.util.List.of(case["name"]))
        borrowers = list(jvm.scala.jdk.javaapi.CollectionConverters.asJava(paths.borrowers(names)))
        retired = [(t._1(), t._2()) for t in jvm.scala.jdk.javaapi.CollectionConverters.asJava(paths.retired(names))]
        marks = ({"kind": "borrower", "partition": borrowers[0]} if borrowers else
                 {"kind": "retired", "partition": retired[0][0], "version": retired[0][1]} if retired else None)
        found.append((case["name"], marks))
    assert found == [(c["name"], c["marks"]) for c in CASES]
