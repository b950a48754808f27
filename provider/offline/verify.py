"""``keyedstate verify``: check every retained version of a keyedstate checkpoint.

What is checked, per operator, store and partition (through :mod:`.storage`, any scheme):

* **files**: every changelog decodes (magic, format, header and trailer CRC-32, zstd frame,
  every record's lengths, the record count), names its own version (and, under checkpoint
  format 2, its own unique id) and the store's key-group count; every snapshot manifest decodes
  (names and paths by the path rule) and every file it lists is present with its size; under
  checkpoint format 1 a manifest of another run's attempt of its version (its runId is not its
  version's changelog's) is never loaded, so it is a warning and nothing else of it is checked;
* **versions**: every version from the oldest loadable one to the newest is rebuilt (one pass:
  the oldest snapshot, then each changelog in turn); at each snapshot the snapshot's own files
  are opened and their exact key count compared with the manifest's ``numKeys`` and with the
  count the changelogs produced; the committed batch's version must be loadable;
* **keys**: every key of every rebuilt snapshot and every changelog record carries the key
  group Spark's hash gives its key (recomputed from the row with the state schema, when the
  key types allow) and belongs to its partition's key groups for the partition count of that
  batch (from the offset log, while Spark keeps the batch's entry there);
* **TTL**: every value is of a known value format (plain or timed, with its 8-byte write
  time), and each manifest's TTL settings are readable.

A report lists problems (path, what is wrong, what to do) and what was checked; ``ok`` is
True when there is no problem. Orphan files a cleanup left behind, and snapshots of another run's
attempt, are warnings, not problems.
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..formats import changelog, key_group_counts, keygroups
from ..formats.keygroups import key_group_of_stored_key
from ..formats.stored import PLAIN_VALUE, TIMED_VALUE, KeyLayout
from .progress import Steps
from .storage import open_storage
from ..checkpoint import Checkpoint, CheckpointProblem, StorePartition, partition_key_layout
from ..checkpoint.rebuilder import of_another_run

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

MAX_KEY_PROBLEMS = 5  # per store partition: the first few keys that are wrong, then a count


@dataclass
class Report:
    checkpoint: str
    problems: list[dict[str, str]] = field(default_factory=list)
    warnings: list[dict[str, str]] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=lambda: {
        "operators": 0, "storePartitions": 0, "changelogs": 0, "snapshots": 0, "versions": 0,
        "keysChecked": 0, "snapshotFiles": 0})

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, path: str, what: str, fix: str) -> None:
        self.problems.append({"path": path, "problem": what, "fix": fix})

    def warn(self, path: str, what: str) -> None:
        self.warnings.append({"path": path, "warning": what})

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "ok": self.ok, "problems": self.problems,
                "warnings": self.warnings, "checked": self.checked}


RESTORE = ("restore the file from a backup or copy of the checkpoint; otherwise restart the query from an "
           "older batch's state (the versions before this one) or a new checkpoint")


def verify(checkpoint: str | os.PathLike, spark: "SparkSession | None" = None) -> dict[str, Any]:
    """Check a checkpoint (see the module doc); returns the report as a dict."""
    storage = open_storage(checkpoint, spark)
    ck = Checkpoint(storage)
    ck.refuse_foreign("verify")
    report = Report(ck.root)
    committed = ck.latest_committed()
    operators = ck.operators().values()
    steps = Steps("verify", sum(len(parts) for op in operators for parts in op.stores.values()), log,
                  "store partitions")
    for op in operators:
        report.checked["operators"] += 1
        for store, parts in op.stores.items():
            try:
                key_schema, _ = ck.schema(op.id, store)
            except CheckpointProblem as exc:
                report.problem(ck.path("state", str(op.id)), str(exc), "the schema file is written by Spark at the "
                               "query's first batch; restore it from a copy of the checkpoint")
                key_schema = None
            layout = None
            with contextlib.suppress(CheckpointProblem):
                layout = ck.key_layout(parts)
            if key_schema is not None:
                layout = partition_key_layout(op, store, len(key_schema["fields"]), layout)
            for sp in parts:
                report.checked["storePartitions"] += 1
                _verify_store_partition(ck, op, sp, key_schema, layout, committed, report)
                steps.step()
    return report.to_dict()


class _KeyCheck:
    """Checks that stored keys are in their partition's key groups (and hash to their group)."""

    def __init__(self, ck: Checkpoint, op, sp: StorePartition, key_schema, layout: KeyLayout | None,
                 report: Report) -> None:
        self.ck, self.op, self.sp, self.report = ck, op, sp, report
        self.layout = layout
        self.hasher = None
        if key_schema is not None and layout is not None and layout.partition_key_columns > 0:
            from .sparkhash import RowHasher, UnsupportedKeyType

            with contextlib.suppress(UnsupportedKeyType, ValueError):
                self.hasher = RowHasher(key_schema, layout.partition_key_columns)
        self.bad = 0
        self.checked = 0

    def check(self, key: bytes, value: bytes | None, key_groups: int, partitions: int | None, where: str) -> None:
        self.checked += 1
        problem = None
        group = key_group_of_stored_key(key)
        if group >= key_groups:
            problem = f"a key carries key group {group}, but the store has {key_groups}"
        elif self.hasher is not None:
            try:
                h = self.hasher.hash(key, self.layout.row_offset(key))
            except ValueError as exc:
                h, problem = None, f"a key is not a readable row of the key schema ({exc})"
            if h is not None:
                if h % key_groups != group:
                    problem = f"a key carries key group {group}, but its hash gives {h % key_groups}"
                elif partitions is not None and h % partitions != self.sp.partition:
                    problem = (f"a key belongs to partition {h % partitions} of {partitions}, not to partition "
                               f"{self.sp.partition}")
        elif partitions is not None and key_groups % partitions == 0 and group % partitions != self.sp.partition:
            problem = f"a key of key group {group} is outside partition {self.sp.partition}'s key groups"
        if problem is None and value is not None:
            if not value or value[0] not in (PLAIN_VALUE, TIMED_VALUE):
                problem = f"a value has the unknown value format {value[:1].hex() or '(empty)'}"
            elif value[0] == TIMED_VALUE and len(value) < 9:
                problem = "a TTL-stamped value is shorter than its 8-byte write time"
        if problem is not None:
            self.bad += 1
            if self.bad <= MAX_KEY_PROBLEMS:
                self.report.problem(where, f"{problem} (key {key[:48].hex()}{'...' if len(key) > 48 else ''})",
                                    "the file was altered or written by another tool; " + RESTORE)


def _verify_store_partition(ck: Checkpoint, op, sp: StorePartition, key_schema, layout, committed: int | None,
                            report: Report) -> None:
    storage = ck.storage
    if sp.foreign:
        report.problem(sp.path, f"holds files of another state store provider ({', '.join(sp.foreign[:5])})",
                       "this store partition was not written by keyedstate; run the query with the provider "
                       "that wrote it, or `keyedstate migrate` it")
        return
    keys = _KeyCheck(ck, op, sp, key_schema, layout, report)
    key_groups: int | None = None
    logs: dict[tuple[int, str | None], changelog.Changelog] = {}
    # 1. every changelog on its own
    for (v, uid), size in sorted(sp.changelogs.items(), key=lambda x: (x[0][0], x[0][1] or "")):
        path = sp.changelog_path(storage, v, uid)
        report.checked["changelogs"] += 1
        try:
            log_ = ck.read_changelog(sp, v, uid, key_groups)
            if uid is not None and log_.meta.get("uniqueId") not in (None, uid):
                raise CheckpointProblem(f"{path} records the unique id {log_.meta.get('uniqueId')}, its name {uid}: "
                                        "renamed or corrupt")
            for _ in log_.records():  # every record's lengths and the count hold before any key is checked
                pass
        except (CheckpointProblem, changelog.CorruptChangelogError) as exc:  # the latter: CRCs right, lengths not
            report.problem(path, str(exc), RESTORE)
            continue
        key_groups = log_.key_groups
        logs[(v, uid)] = log_
        partitions = ck.recorded_partitions(v - 1)
        for _, key, value in log_.records():
            keys.check(key, value, key_groups, partitions, path)
    # 2. every manifest and its files
    manifests = {}
    for (v, uid) in sorted(sp.snapshots, key=lambda x: (x[0], x[1] or "")):
        path = sp.manifest_path(storage, v, uid)
        report.checked["snapshots"] += 1
        try:
            m = ck.read_manifest(sp, v, uid)
        except CheckpointProblem as exc:
            report.problem(path, str(exc), RESTORE)
            continue
        why = of_another_run(storage, sp, v, m) if uid is None else None
        if why is not None:  # loads pass it over: its files and counts are of no version
            report.warn(path, f"never loaded: {why}; loads rebuild version {v} from an older snapshot and the "
                              "changelogs, and the running query's cleanup deletes this manifest once a newer "
                              "snapshot is the base of the versions it keeps")
            continue
        if key_groups is not None and m.key_groups != key_groups:
            report.problem(path, f"written with {m.key_groups} key groups, the changelogs with {key_groups}",
                           RESTORE)
            continue
        key_groups = m.key_groups
        if m.ttl is not None and not isinstance(m.ttl.get("ttlMs", 0), int):
            report.problem(path, f"its TTL settings are unreadable ({m.ttl})", RESTORE)
        broken = False
        for f in list(m.files) + ([m.replay] if m.replay else []):
            fpath = sp.file_path(storage, f.path)
            report.checked["snapshotFiles"] += 1
            size = sp.snapshot_files.get(f.path)
            if size is None:
                size = storage.size(fpath)
            if size is None:
                report.problem(fpath, f"listed by snapshot manifest {path} but missing", RESTORE)
                broken = True
            elif size != f.size:
                report.problem(fpath, f"has {size} bytes but snapshot manifest {path} says {f.size}: truncated or "
                                      "corrupt", RESTORE)
                broken = True
        if not broken:
            manifests[(v, uid)] = m
    # 3. rebuild: each snapshot's exact key count, its keys; every version's chain
    for (v, uid), m in sorted(manifests.items(), key=lambda x: x[0][0]):
        path = sp.manifest_path(storage, v, uid)
        try:
            with ck.rebuild(sp, v, uid, skip_unusable=False, count_key_groups=True) as rebuilt:  # this snapshot
                if rebuilt.chain[-1] != (v, uid):  # passed over as another run's since step 2 (a query running)
                    report.warn(path, f"never loaded: {'; '.join(rebuilt.skipped)}")
                    continue
                partitions = ck.recorded_partitions(v - 1)
                n = 0
                by_group: Counter = Counter()
                it = rebuilt.db.iter()
                it.seek_to_first()
                while it.valid():
                    key = it.key()
                    keys.check(key, it.value(), m.key_groups, partitions, path)
                    by_group[key_group_of_stored_key(key) if len(key) >= keygroups.PREFIX_BYTES else -1] += 1
                    n += 1
                    it.next()
                it.status()  # a corrupt block stops the iterator: reported below, not counted as the end
                del it
            if n != m.num_keys:
                report.problem(path, f"says the snapshot holds {m.num_keys} keys, its files hold {n}", RESTORE)
            _check_key_group_counts(report, path, m, rebuilt.key_group_counts, by_group)
        except Exception as exc:  # RocksDB refusing the files is a problem to report, not a crash
            report.problem(path, f"the snapshot cannot be opened ({exc})", RESTORE)
            manifests.pop((v, uid), None)
    # 4. every version that should be loadable is
    versions = sorted({v for v, _ in sp.changelogs} | {v for v, _ in sp.snapshots})
    for v in versions:
        uids = {i for vv, i in list(sp.changelogs) + list(sp.snapshots) if vv == v}
        for uid in uids:
            try:
                chain = ck.chain(sp, v, uid)
            except CheckpointProblem as exc:
                report.warn(sp.changelog_path(storage, v, uid), f"not loadable: {exc}")
                continue
            base = chain[-1]
            broken = [x for x in chain[:-1] if x not in logs]
            if base[0] > 0 and base not in manifests:
                broken.append(base)
            if broken:
                report.problem(sp.changelog_path(storage, v, uid),
                               f"version {v} depends on {', '.join(str(b[0]) for b in broken)}, which failed the "
                               "checks above", RESTORE)
            report.checked["versions"] += 1
    if committed is not None and sp.partition < (ck.partitions_at(committed, op) or 0):
        uid = ck.unique_id(committed, op.id, sp.partition, sp.store)
        try:
            ck.chain(sp, committed + 1, uid)
        except CheckpointProblem as exc:
            report.problem(sp.path, f"the last committed batch {committed} needs version {committed + 1}: {exc}",
                           RESTORE)
    if keys.bad > MAX_KEY_PROBLEMS:
        report.problem(sp.path, f"{keys.bad - MAX_KEY_PROBLEMS} more keys outside their key groups or partition",
                       RESTORE)
    report.checked["keysChecked"] += keys.checked


def _check_key_group_counts(report: Report, path: str, m, recorded: Counter | None, found: Counter) -> None:
    """A snapshot's key-group counts (FORMATS.md, "Key-group counts") are the keys its files hold."""
    if not any(f.name == key_group_counts.NAME for f in m.files):
        return
    if recorded is None:
        report.problem(path, f"lists key-group counts ({key_group_counts.NAME}) that are unreadable or do not add up "
                             "to its numKeys", RESTORE)
        return
    wrong = sorted(g for g in set(recorded) | set(found) if recorded.get(g, 0) != found.get(g, 0))
    if wrong:
        report.problem(path, f"its key-group counts disagree with its files in {len(wrong)} key groups (first: "
                             f"{wrong[0]}: {recorded.get(wrong[0], 0)} counted, {found.get(wrong[0], 0)} held)", RESTORE)


def render(report: dict[str, Any]) -> str:
    """The report for people: a verdict, then each problem with its fix."""
    c = report["checked"]
    lines = [f"{report['checkpoint']}: {'OK' if report['ok'] else 'CORRUPT'}",
             f"  checked {c['operators']} operator(s), {c['storePartitions']} store partition(s), "
             f"{c['changelogs']} changelog(s), {c['snapshots']} snapshot(s) ({c['snapshotFiles']} files), "
             f"{c['versions']} version(s), {c['keysChecked']} key(s)"]
    for p in report["problems"]:
        lines.append(f"  PROBLEM {p['path']}: {p['problem']}\n          what to do: {p['fix']}")
    for w in report["warnings"]:
        lines.append(f"  warning {w['path']}: {w['warning']}")
    return "\n".join(lines) + "\n"
