"""The ways to rebuild a version (FORMATS.md, "Loading a version") answer the golden cases in
tests/golden/plans.json, and a header is read only when no better plan is left."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from keyedstate.checkpoint import CheckpointError
from keyedstate.checkpoint.listing import version_of, versioned_name
from keyedstate.checkpoint.plans import NoPlan, plans
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
