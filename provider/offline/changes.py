"""The state processor's change records and undo (see :mod:`.processor`'s module doc): what
a change records before it writes (``_keyedstate_changes/<batch>.json``), how a record read back
is checked, and taking a change back, after a failure or by ``keyedstate undo``."""
from __future__ import annotations

import base64
import json
import logging
import re
import time
from typing import Any

from ..formats import layout
from .migration import MigrateError, Plan, StorePlan
from ..checkpoint import Checkpoint
from ..checkpoint.spark import read_spark_file

log = logging.getLogger("keyedstate.offline.processor")

CHANGES_DIR = "_keyedstate_changes"  # at the checkpoint's root: one record per change, <batch>.json


class StateProcessorError(MigrateError):
    """A state change cannot be made as asked; the message says why and what to do."""


def short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())  # the message stays one line
    return text if len(text) <= limit else text[:limit] + "..."


def schema_path(ck: Checkpoint, s: StorePlan) -> str:
    base = ck.path("state", str(s.operator), "0")
    return ck.storage.join(base, "_metadata", "schema") if s.store == "default" else \
        ck.storage.join(base, s.store, "_metadata", "schema")


def names_under(ck: Checkpoint) -> list[str]:
    """Every file and directory under the checkpoint (but the change records), relative to it."""
    out: list[str] = []

    def walk(path: str, rel: str) -> None:
        for e in ck.storage.list(path):
            child = f"{rel}/{e.name}" if rel else e.name
            if child == CHANGES_DIR:
                continue
            out.append(child)
            if e.is_dir:
                walk(ck.storage.join(path, e.name), child)

    walk(ck.root, "")
    return out


def record_path(ck: Checkpoint, batch: int) -> str:
    return ck.path(CHANGES_DIR, f"{batch}.json")


def record_batches(ck: Checkpoint) -> list[int]:
    return sorted(n for e in ck.storage.list(ck.path(CHANGES_DIR))
                  if not e.is_dir and e.name.endswith(".json") and (n := layout.number_of(e.name[:-5])) is not None)


def read_record(ck: Checkpoint, batch: int) -> dict[str, Any]:
    """The record of the change of ``batch``. It is read from the checkpoint, so it is checked
    like any file there: the one schema it may restore is the changed store's own schema file
    (:func:`schema_path` of its operator and plain store name), never a path it names itself
    (``../other-query/...`` resolves outside the checkpoint on Hadoop file systems, ``offsets/0``
    is Spark's)."""
    path = record_path(ck, batch)
    try:
        record = json.loads(read_spark_file(ck.storage, path))
        if record["batch"] != batch or not isinstance(record["names"], list):
            raise ValueError("it names another batch")
        if not all(isinstance(n, str) for n in record["names"]):
            raise ValueError("a name is not a string")
        operator, store, schemas = record["operator"], record["store"], record["schemas"]
        if not isinstance(operator, int) or operator < 0 or not isinstance(store, str) or \
                not isinstance(schemas, dict):
            raise ValueError("its operator, store or schemas are not what a change records")
        if schemas:
            if "/" in store or store in ("", ".", ".."):
                raise ValueError(f"the store {store!r} is not a plain name")
            own = schema_path(ck, _Named(operator, store))  # type: ignore[arg-type]
            own = own[len(ck.root) + 1:]
            if set(schemas) != {own}:
                raise ValueError(f"it restores {sorted(schemas)[:3]}, not the changed store's schema {own}")
            for data in schemas.values():
                base64.b64decode(data, validate=True)
        return record
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise StateProcessorError(f"{path}: the record of the state processor's change of batch {batch} is "
                                  f"unreadable ({short(str(exc))}); the change cannot be taken back by "
                                  "keyedstate") from None


class _Named:
    """The (operator, store) a record names, for :func:`schema_path`."""

    def __init__(self, operator: int, store: str) -> None:
        self.operator, self.store = operator, store


_VERSIONED = re.compile(r"([0-9]{1,19})[._]")
_SHARED_DIRS = ("SSTs", "logs", "ks-files")  # immutable files under fresh names, of the store's providers


def _may_have_written(rel: str, is_dir: bool, batch: int) -> bool:
    """Whether the change of ``batch`` can have added ``rel`` (a name undo deletes): its own log
    entries ``offsets/<batch>``, ``commits/<batch>`` (with Hadoop's ``.crc`` and temporary names),
    and under ``state/`` the files of its version ``batch + 1``, new files of the stores' shared
    directories, the kept schema ``schema.before-batch-<batch>``, directories (checked by their
    contents). Anything else was not written by the change: a query that ran or runs since, or a
    record that omits names present before it."""
    parts = rel.split("/")
    name = parts[-1]
    bare = name.lstrip(".")
    if parts[0] in ("offsets", "commits"):
        return len(parts) == 2 and not is_dir and (name == str(batch) or bare.startswith(f"{batch}."))
    if parts[0] != "state" or len(parts) < 2:
        return False
    if is_dir:
        return True
    if bare.removesuffix(".crc") == f"schema.before-batch-{batch}" and parts[-2] == "_metadata":
        return True
    if len(parts) >= 3 and parts[-2] in _SHARED_DIRS:
        return True
    m = _VERSIONED.match(bare)
    return m is not None and int(m.group(1)) == batch + 1


def begin(ck: Checkpoint, p: Plan, changed: StorePlan, value_schema: dict, operation: str) -> dict[str, Any]:
    """Record what a change of batch ``p.batch + 1`` may need to take back; records of changes
    that batches have run on top of are no longer needed and go."""
    batch = p.batch + 1
    for old in record_batches(ck):
        if old < p.batch:
            ck.storage.delete(record_path(ck, old))
    schemas = {}
    if value_schema != changed.value_schema:
        path = schema_path(ck, changed)
        schemas[path[len(ck.root) + 1:]] = base64.b64encode(read_spark_file(ck.storage, path)).decode("ascii")
    record = {"batch": batch, "lastCommitted": p.batch, "operation": operation, "operator": changed.operator,
              "store": changed.store, "startedAt": time.time(), "schemas": schemas, "names": names_under(ck)}
    ck.storage.write_atomic(record_path(ck, batch), json.dumps(record).encode("utf-8"), overwrite=True)
    return record


def unfinished_change(ck: Checkpoint) -> dict[str, Any] | None:
    """The record of a change whose batch started (``offsets``) but never committed: left by a
    call that was cut short before it could take the change back."""
    offsets, committed = ck.offset_batches(), ck.committed_batches()
    if not offsets or (committed and offsets[-1] <= committed[-1]) or offsets[-1] not in record_batches(ck):
        return None
    record = read_record(ck, offsets[-1])
    return record if committed and record["lastCommitted"] == committed[-1] else None


def roll_back(ck: Checkpoint, record: dict[str, Any]) -> int:
    """Take back the change ``record`` describes: commit, schema, added names, offsets entry,
    record, in that order (see the module doc); returns the names removed."""
    storage, batch = ck.storage, record["batch"]
    before = set(record["names"])
    added: list[str] = []
    foreign: list[str] = []

    def walk(path: str, rel: str, new: bool) -> None:
        for e in storage.list(path):
            child = f"{rel}/{e.name}" if rel else e.name
            if child == CHANGES_DIR:
                continue
            fresh = new or child not in before
            if fresh and not new:
                added.append(child)
            if fresh and not _may_have_written(child, e.is_dir, batch):
                foreign.append(child)
            if e.is_dir:
                walk(storage.join(path, e.name), child, fresh)

    # Every name to delete is checked before anything is: undo deletes only what the change can
    # have written, so neither a query's later batch nor a record that leaves names out costs
    # the checkpoint anything the change did not add.
    walk(ck.root, "", False)
    if foreign:
        raise StateProcessorError(
            f"{ck.path(foreign[0])} and {len(foreign) - 1} other name(s) are not in the record of the state "
            f"processor's change of batch {batch} and are not files that change writes (did a query run or does "
            "one run on this checkpoint?): undo would delete them; nothing was undone")
    storage.delete(ck.path("commits", str(batch)))  # from here on the change has not happened
    for rel, data in record["schemas"].items():
        original = base64.b64decode(data)
        if read_spark_file(storage, ck.path(rel)) != original:
            storage.replace(ck.path(rel), original)
    last = f"offsets/{batch}"

    def order(rel: str) -> tuple[bool, bool, str]:
        name = rel.rsplit("/", 1)[-1].removesuffix(".crc")
        return rel in (last, f"offsets/.{batch}.crc"), not name.endswith(("snapshot", ".zip")), rel

    for rel in sorted(added, key=order):
        log.info("%s: removing %s, written by the %s of batch %d", ck.root, rel, record["operation"], batch)
        storage.delete(ck.path(rel))
    storage.delete(record_path(ck, batch))
    if not storage.list(ck.path(CHANGES_DIR)):
        storage.delete(ck.path(CHANGES_DIR))
    return len(added)


def undo_last(ck: Checkpoint) -> dict[str, Any]:
    committed, offsets = ck.committed_batches(), ck.offset_batches()
    latest = max(committed[-1:] + offsets[-1:], default=-1)
    records = record_batches(ck)
    for stale in (b for b in records if b > latest):  # a rollback cut short after its offsets entry went
        ck.storage.delete(record_path(ck, stale))
    records = [b for b in records if b <= latest]
    if not records:
        raise StateProcessorError(f"{ck.root}: nothing to undo: no change of the state processor (transform, "
                                  f"bootstrap) is recorded in {ck.path(CHANGES_DIR)} (last batch {latest})")
    batch = records[-1]
    if batch < latest:
        raise StateProcessorError(
            f"{ck.path('offsets', str(latest))}: the query has run batch(es) {batch + 1}..{latest} on top of the "
            f"state processor's change of batch {batch}; undoing the change would lose them: nothing was undone")
    record = read_record(ck, batch)
    was_committed = batch in committed
    if was_committed:
        refuse_changed_since(ck, record)
    deleted = roll_back(ck, record)
    log.info("%s: undid the %s of batch %d", ck.root, record["operation"], batch)
    return {"checkpoint": ck.root, "batch": batch, "operation": record["operation"], "committed": was_committed,
            "lastCommitted": record["lastCommitted"], "deleted": deleted}


def refuse_changed_since(ck: Checkpoint, record: dict[str, Any]) -> None:
    """Undo restores the checkpoint by removing what the change added: refused when something
    else changed it since (``keyedstate migrate`` rewrites the last offsets entry and retires the
    old provider's files), as the result would be neither the state before nor after."""
    batch = record["batch"]
    if read_spark_file(ck.storage, ck.path("offsets", str(batch))) != \
            read_spark_file(ck.storage, ck.path("offsets", str(record["lastCommitted"]))):
        raise StateProcessorError(f"{ck.path('offsets', str(batch))} was rewritten after the state processor's change "
                                  f"of batch {batch} (by keyedstate migrate?): undo cannot restore the checkpoint; "
                                  "nothing was undone")
    own = (f"{batch + 1}.", f"{batch + 1}_")  # the change's own version: it replaced such leftovers itself
    current = set(names_under(ck))
    gone = [n for n in record["names"] if n not in current
            and not n.rsplit("/", 1)[-1].removeprefix(".").startswith(own)]
    if gone:
        raise StateProcessorError(f"{ck.path(gone[0])} and {len(gone) - 1} other name(s) present before the state "
                                  f"processor's change of batch {batch} are gone: something else changed the "
                                  "checkpoint since, and undo cannot restore them; nothing was undone")
