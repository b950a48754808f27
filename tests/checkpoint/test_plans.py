"""The ways to rebuild a version (FORMATS.md, "Loading a version"): Python's ``plans`` and the
JVM's ``VersionLoader.plans`` answer the golden cases in tests/golden/plans.json, and a header
is read only when no better plan is left."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from keyedstate.checkpoint import CheckpointError
from keyedstate.checkpoint.listing import version_of, versioned_name
from keyedstate.checkpoint.plans import NoPlan, plans
from keyedstate.formats import changelog
from keyedstate.formats.layout import CHANGELOG_SUFFIX, MANIFEST_SUFFIX

CASES = json.loads((Path(__file__).resolve().parent.parent / "golden" / "plans.json").read_text())["cases"]


def _answer(case: dict, reads: list | None = None) -> list:
    changelogs = {vid for name in case["files"] if (vid := version_of(name, CHANGELOG_SUFFIX)) is not None}
    snapshots = {vid for name in case["files"] if (vid := version_of(name, MANIFEST_SUFFIX)) is not None}

    def name(v: int, i: str | None) -> str:
        return versioned_name(v, i, CHANGELOG_SUFFIX)

    def read_meta(v: int, i: str | None) -> dict:
        if reads is not None:
            reads.append((v, i))
        return case["headers"].get(name(v, i), {})

    return [{"none": p.reason} if isinstance(p, NoPlan) else [list(vid) for vid in p]
            for p in plans(changelogs, snapshots, case["version"], case["id"], read_meta, name)]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_plans_answer_the_golden_cases(case):
    assert _answer(case) == case["plans"]


def test_format_1_reads_no_header_while_a_snapshot_plan_is_left():
    case = next(c for c in CASES if c["name"].startswith("format 1: from empty comes after"))
    reads: list = []
    it = iter(plans({(v, None) for v in range(1, 6)}, {(2, None)}, 5, None,
                    lambda v, i: reads.append((v, i)) or case["headers"].get(f"{v}.ks-changelog", {}), lambda v, i: str(v)))
    assert next(it) == ((5, None), (4, None), (3, None), (2, None)) and reads == []
    next(it)
    assert reads == []
    next(it)
    assert reads == [(5, None), (4, None)]


def test_an_unreadable_header_is_no_plan_naming_it():
    def unreadable(v: int, i: str | None) -> dict:
        raise CheckpointError(f"{v}.ks-changelog is truncated")

    assert list(plans({(4, None), (5, None)}, set(), 5, None, unreadable, lambda v, i: str(v)))[-2:] == \
        [NoPlan("5.ks-changelog is truncated"), NoPlan("missing 1, 2, 3")]


# -- the JVM's VersionLoader.plans, through py4j ---------------------------------------------------

def _store_partition(root: Path, case: dict) -> Path:
    """A real store partition directory holding the case's files (changelog headers as given)."""
    part = root / "state" / "0" / "0"
    part.mkdir(parents=True)
    for name in case["files"]:
        vid = version_of(name, CHANGELOG_SUFFIX)
        if vid is None:
            (part / name).write_bytes(b"{}")  # a manifest: the plans go by its name alone
            continue
        meta = dict(case["headers"].get(name, {}))
        if vid[1] is not None:
            meta.setdefault("uniqueId", vid[1])
        (part / name).write_bytes(changelog.compress(changelog.encode(vid[0], 4, []), meta,
                                                     changelog.CODEC_NONE))
    return part


def _jvm_plans(spark, part: Path, case: dict) -> list:
    jvm, gateway = spark._jvm, spark.sparkContext._gateway
    files = jvm.io.keyedstate.checkpoint.CheckpointFiles(jvm.org.apache.hadoop.fs.Path(str(part)),
                                                         spark._jsc.hadoopConfiguration())
    loader = jvm.io.keyedstate.engine.VersionLoader(files, None, "golden")
    method = next(m for m in loader.getClass().getDeclaredMethods() if m.getName() == "plans")
    method.setAccessible(True)  # private: the loader's own rule, asked directly
    args = gateway.new_array(jvm.java.lang.Object, 3)
    args[0] = files.listing()
    args[1] = jvm.java.lang.Long.valueOf(str(case["version"]))
    args[2] = jvm.scala.Option.apply(case["id"])
    answer, it = [], method.invoke(loader, args)
    while it.hasNext():
        either = it.next()
        if either.isLeft():
            reason = either.swap().toOption().get()
            answer.append({"none": re.sub(r"(file:)?" + re.escape(str(part)) + "/", "", reason)})
        else:
            chain = either.toOption().get()
            answer.append([[int(chain.apply(i)._1()), None if chain.apply(i)._2().isEmpty() else
                            chain.apply(i)._2().get()] for i in range(chain.size())])
    return answer


def _same_way(expected: list, answer: list) -> bool:
    """The same plans; a reason the same from its first two words (the JVM words its own)."""
    if len(expected) != len(answer):
        return False
    for e, a in zip(expected, answer):
        if isinstance(e, dict) != isinstance(a, dict):
            return False
        if isinstance(e, dict) and a["none"].split()[:2] != e["none"].split()[:2]:
            return False
        if not isinstance(e, dict) and e != a:
            return False
    return True


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_jvm_answers_the_golden_cases(spark, tmp_path, case):
    answer = _jvm_plans(spark, _store_partition(tmp_path, case), case)
    assert _same_way(case["plans"], answer), answer
