"""The ways to rebuild a version of a store partition, best first (FORMATS.md, "Loading a
version"): the twin of the JVM's ``VersionLoader.plans``, held to the golden cases
``tests/golden/plans.json``.

A plan is the chain of (version, unique id) from the version down to its base: a snapshot's
(version, id), or ``(0, None)`` for an empty store. The loader tries the plans in order and falls
back to the next when the base snapshot cannot be used; a :class:`NoPlan` says why a way does
not exist (the listing lacks a changelog, a header cannot be read).

* Checkpoint format 1 (no id): every snapshot at or below the version with every changelog after
  it present, newest first, then no snapshot (changelogs from version 1), then the changelogs back
  from the version to one written from empty (headers read only then), then why none of these
  exists.
* Checkpoint format 2: the chain grows back from (version, id) through the lineage each
  changelog's header records; every snapshot met on the way is a plan, newest first, and the
  chain ending at version 1 or at a changelog written from empty is the last.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterator, Union

from ..formats import changelog
from ..formats.layout import UNIQUE_ID
from .errors import CheckpointError

VersionId = tuple  # (version, unique id or None)
Chain = tuple  # of VersionId, newest first, ending at the base


@dataclass(frozen=True)
class NoPlan:
    """Why a way to rebuild the version does not exist."""

    reason: str


Plan = Union[Chain, NoPlan]
ReadMeta = Callable[[int, "str | None"], dict]  # a changelog's header; CheckpointError if unreadable
Name = Callable[[int, "str | None"], str]  # a changelog's path, for messages


def plans(changelogs: Collection[VersionId], snapshots: Collection[VersionId], version: int, uid: str | None,
          read_meta: ReadMeta, name: Name) -> Iterator[Plan]:
    """The plans for ``version`` (format 2: the one written with ``uid``), best first; the
    header of a changelog is read (``read_meta``) only when no better plan is left."""
    if uid is None:
        return _format_1(changelogs, snapshots, version, read_meta, name)
    return _format_2(changelogs, snapshots, version, uid, read_meta, name)


def _format_1(changelogs, snapshots, version, read_meta, name) -> Iterator[Plan]:
    bases = sorted((v for v, i in snapshots if i is None and v <= version), reverse=True) + [0]

    def missing(base: int) -> list[int]:
        return [v for v in range(base + 1, version + 1) if (v, None) not in changelogs]

    for base in bases:
        if not missing(base):
            yield tuple((v, None) for v in range(version, base - 1, -1))
    from_empty_ = from_empty(changelogs, version, read_meta)
    if from_empty_ is not None:
        yield from_empty_
    gap = missing(bases[0])
    yield NoPlan("no usable snapshot" if not gap else
                 f"missing {', '.join(name(v, None) for v in gap[:3])}{' ...' if len(gap) > 3 else ''}")


def from_empty(changelogs: Collection[VersionId], version: int, read_meta: ReadMeta) -> Plan | None:
    """Format 1's last way: the changelogs back from ``version`` to one written from empty (an
    offline writer's), which needs nothing older."""
    v = version
    while v >= 1 and (v, None) in changelogs:
        try:
            meta = read_meta(v, None)
        except CheckpointError as exc:
            return NoPlan(str(exc))
        if meta.get(changelog.FROM_EMPTY) is True:
            return tuple((w, None) for w in range(version, v - 1, -1)) + ((0, None),)
        v -= 1
    return None


def _format_2(changelogs, snapshots, version, uid, read_meta, name) -> Iterator[Plan]:
    chain: list[VersionId] = [(version, uid)]
    checked = 0
    while True:
        while checked < len(chain):
            checked += 1
            if chain[checked - 1] in snapshots:
                yield tuple(chain[:checked])
        oldest, oldest_id = chain[-1]
        if oldest == 0:
            yield tuple(chain)
            return
        if (oldest, oldest_id) not in changelogs:
            yield NoPlan(f"missing {name(oldest, oldest_id)}")
            return
        if oldest == 1:
            chain.append((0, None))
            continue
        try:
            meta = read_meta(oldest, oldest_id)
        except CheckpointError as exc:
            yield NoPlan(str(exc))
            return
        if meta.get(changelog.FROM_EMPTY) is True:  # a base: nothing older is needed
            chain.append((0, None))
            continue
        source = name(oldest, oldest_id)
        older = older_lineage(meta.get("lineage"), oldest, source)
        if isinstance(older, NoPlan):
            yield older
            return
        for v, i in older[:-1]:  # the last one is checked when the chain reaches it
            if (v, i) not in snapshots and (v, i) not in changelogs:
                yield NoPlan(f"{source} records version {v} with id {i} in its lineage, and {name(v, i)} is missing")
                return
        chain.extend(older)


def older_lineage(lineage: Any, version: int, source: str) -> list[VersionId] | NoPlan:
    """The (version, id) pairs below ``version`` in the lineage of changelog ``source``'s header:
    consecutive from ``version - 1`` down, each id a UUID (an id becomes part of a file name)."""
    try:
        older = [(int(a), b) for a, b in lineage if int(a) < version]
    except (TypeError, ValueError):
        older = []
    if (not older or older[0][0] != version - 1 or any(b[0] != a[0] - 1 for a, b in zip(older, older[1:]))
            or not all(isinstance(i, str) and UNIQUE_ID.fullmatch(i) for _, i in older)):
        return NoPlan(f"{source} records the lineage {lineage!r}, which is not the versions before {version} with "
                      "their unique ids: the changelog is corrupt or was tampered with")
    return older
