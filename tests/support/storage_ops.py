"""What the storage session (support/storage.py) runs on checkpoints of any scheme, in its child
process: operator scenarios (plain, or with state servers SIGKILLed at commit) and the offline
tools. Every function takes the child's SparkSession first and returns something JSON can carry;
the session's ``tool`` command calls them by name."""
from __future__ import annotations

import hashlib
import logging
import os
import pickle
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

from . import processes
from .driver import run_query
from .faults import judge, run_through_failures
from .scenarios import SCENARIOS

log = logging.getLogger(__name__)


def _scenario(name: str):
    return next(s for s in SCENARIOS if s.name == name)


def scenario(spark, scenario: str, provider: str, checkpoint: str, root: str, output: str, steps: int | None = None,
             restartEveryStep: bool = False, confs: dict | None = None) -> dict:
    """support/driver.py's run of a scenario; its output is pickled to the file ``output``."""
    sc = _scenario(scenario)
    chosen = sc.steps[:steps] if steps else sc.steps
    restarts = range(len(chosen) - 1) if restartEveryStep else None
    with _confs(spark, confs or {}):
        out = run_query(spark, provider, sc.build, sc.schema, chosen, checkpoint, sc.inputs(Path(root)), sc.mode,
                        restart_after=restarts)
    Path(output).write_bytes(pickle.dumps(out))
    return {}


class CommitKiller:
    """SIGKILLs every state server of this process's JVM as soon as the changelog of a version
    of one store partition is in the checkpoint: the JVM's commit of that version has made it
    durable, and the server holds it to apply (write-behind) or is applying it. The checkpoint
    is listed through the session's storage (a LIST a poll on s3a)."""

    def __init__(self, spark, checkpoint: str, partition_dir: str = "state/0/0", poll: float = 0.02) -> None:
        from keyedstate.offline.storage import open_storage

        self.storage = open_storage(checkpoint, spark)
        self.path = self.storage.join(self.storage.root, partition_dir)
        self.jvm_pid = int(spark._jvm.ProcessHandle.current().pid())
        self.poll = poll
        self.kills: list[dict] = []  # {"version", "servers"} of every kill done

    def arm(self, version: int, timeout: float = 300.0) -> None:
        """Kill once ``version``'s changelog appears (in the background; gives up after ``timeout``)."""
        name = re.compile(rf"{version}(?:_[0-9a-fA-F-]{{36}})?\.ks-changelog")

        def watch() -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    names = [e.name for e in self.storage.list(self.path)]
                except Exception:  # the directory before the first commit, or a listing that failed
                    names = []
                if any(name.fullmatch(n) for n in names):
                    servers = [p for p in processes.state_server_pids() if p in processes.descendants(self.jvm_pid)]
                    for pid in servers:
                        processes.signal_quietly(pid, signal.SIGKILL)
                    self.kills.append({"version": version, "servers": len(servers)})
                    return
                time.sleep(self.poll)
            log.warning("no changelog of version %s in %s within %.0f s: nothing killed", version, self.path, timeout)

        threading.Thread(target=watch, name=f"commit-killer-{version}", daemon=True).start()


def killed_at_commit(spark, scenario: str, provider: str, checkpoint: str, root: str, reference: str,
                     kill_versions: list[int], confs: dict | None = None) -> dict:
    """``scenario`` (one input) with every state server SIGKILLed at the commit of each version
    in ``kill_versions`` (CommitKiller), the query restarted after each failure; judged against
    the pickled output in the file ``reference`` (support/faults.py's judge)."""
    sc = _scenario(scenario)
    killer = CommitKiller(spark, checkpoint)

    def after_step(index: int, query) -> None:
        # after step i (batch i) the next batch commits version i + 2
        if index + 2 in kill_versions:
            killer.arm(index + 2)

    with _confs(spark, confs or {}):
        after_step(-1, None)
        run = run_through_failures(spark, provider, sc.build, sc.schema, sc.steps, checkpoint, Path(root) / "input",
                                   sc.mode, after_step=after_step, max_failures=10)
    verdict = judge(pickle.loads(Path(reference).read_bytes()), run.outputs)
    return {"lost": verdict.lost, "duplicated": verdict.duplicated, "replays": verdict.replays,
            "detail": verdict.detail, "failures": run.failures, "kills": killer.kills,
            "final": sorted(run.final().items())}


class _confs:
    def __init__(self, spark, values: dict) -> None:
        self.spark, self.values = spark, values

    def __enter__(self) -> None:
        for key, value in self.values.items():
            self.spark.conf.set(key, value)

    def __exit__(self, *exc) -> None:
        for key in self.values:
            self.spark.conf.unset(key)


# -- offline tools -----------------------------------------------------------------------------

def inspect(spark, checkpoint: str) -> dict:
    from keyedstate.offline.remote import inspect_anywhere

    return inspect_anywhere(checkpoint, spark=spark)


def verify(spark, checkpoint: str) -> dict:
    from keyedstate.offline.verify import verify as run

    return run(checkpoint, spark=spark)


def get(spark, checkpoint: str, operator: int, key: Any, store: str | None = None, batch: int | None = None) -> dict:
    from keyedstate.offline.lookup import get as run

    return run(checkpoint, operator, key, store=store, batch=batch, spark=spark)


def state_rows(spark, checkpoint: str, **options: Any) -> list[dict]:
    """Every row the statestore data source reads with ``options`` (e.g. readChangeFeed), as
    nested dicts, sorted."""
    reader = spark.read.format("statestore")
    for key, value in options.items():
        reader = reader.option(key, value)
    return sorted((row.asDict(recursive=True) for row in reader.load(checkpoint).collect()), key=repr)


def migrate(spark, checkpoint: str, provider: str) -> dict:
    import keyedstate

    return keyedstate.migrate(checkpoint, provider, spark=spark)


def rescale(spark, checkpoint: str, partitions: int) -> dict:
    from keyedstate.offline.remote import rescale_anywhere

    result = rescale_anywhere(checkpoint, partitions, spark=spark)
    return result.to_dict() if hasattr(result, "to_dict") else result


def multiply_counts(spark, checkpoint: str, operator: int, factor: int) -> dict:
    """The state processor's transform: the aggregation's ``count`` times ``factor``."""
    import keyedstate

    return keyedstate.state(spark, checkpoint).transform(
        operator, lambda key, value: {**value, "count": value["count"] * factor})


def undo(spark, checkpoint: str) -> dict:
    import keyedstate

    return keyedstate.undo(checkpoint, spark=spark)


def file_hashes(spark, checkpoint: str) -> dict[str, str]:
    """{path under the checkpoint: sha256 of its bytes} of every file, hidden ones included."""
    from keyedstate.offline.storage import open_storage

    storage = open_storage(checkpoint, spark)
    out: dict[str, str] = {}

    def walk(path: str, rel: str) -> None:
        for entry in storage.list(path):
            child, child_rel = storage.join(path, entry.name), f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_dir:
                walk(child, child_rel)
            else:
                out[child_rel] = hashlib.sha256(storage.read_bytes(child)).hexdigest()

    walk(storage.root, "")
    return out



def store_cleanups(spark, checkpoint: str, partition_dir: str, min_versions: int,
                   runs: list[list[int]]) -> list[dict]:
    """One store partition's cleanups by a StoreCleanup (what a StoreEngine's maintenance runs), in
    this process's JVM: one per ``[head version, newest snapshot]`` of ``runs`` (checkpoint format
    1); per run its start and end (time.time()) and the files it deleted."""
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(f"{checkpoint.rstrip('/')}/{partition_dir}")
    files = jvm.io.keyedstate.checkpoint.CheckpointFiles(path, spark._jsc.hadoopConfiguration())
    cleanup = jvm.io.keyedstate.checkpoint.StoreCleanup(files)
    out = []
    for head, newest_snapshot in runs:
        start = time.time()
        deleted = cleanup.run(min_versions, head, jvm.scala.Option.apply(None), newest_snapshot, False)
        out.append({"start": start, "end": time.time(), "deleted": deleted})
    return out


def store_files(spark, checkpoint: str, partition_dir: str) -> list[str]:
    """The names of the files of a store partition's directory (not its ks-files/)."""
    from keyedstate.offline.storage import open_storage

    storage = open_storage(checkpoint, spark)
    return sorted(e.name for e in storage.list(storage.join(storage.root, partition_dir)) if not e.is_dir)


def open_bytes(spark, checkpoint: str, partition_dir: str, names: list[str]) -> dict[str, str]:
    """What a reader sees now of each temporary (still open) file among ``names``, in hex."""
    from keyedstate.offline.storage import open_storage

    storage = open_storage(checkpoint, spark)
    return {n: storage.read_bytes(storage.join(storage.root, partition_dir, n)).hex()
            for n in names if n.endswith(".tmp")}


def commit_opened_ahead(spark, checkpoint: str, confs: dict[str, str] | None = None) -> dict:
    """One store partition (operator 0, partition 0) driven through the provider contract in this
    process's JVM: a write store committed after a pause (its changelog opened when the store was
    handed out), one aborted and one left open when the provider closes, with keyedstate
    ``confs``. The partition's file names at each step, what a reader sees of the open changelog
    before the commit; ``commit_start``/``commit_end`` (time.time()) around the commit."""
    from .jvm import LayerStore

    def names() -> list[str]:
        return store_files(spark, checkpoint, "state/0/0")

    def settled(step: str) -> list[str]:  # a cancelled open is dropped off the task's thread
        deadline = time.monotonic() + 30
        now = names()
        while any(n.endswith(".tmp") for n in now) and time.monotonic() < deadline:
            time.sleep(0.1)
            now = names()
        out[step] = now
        return now

    out: dict[str, Any] = {}
    layer = LayerStore(spark, f"{checkpoint.rstrip('/')}/state", confs=confs)
    try:
        s = layer.store(0)
        layer.put(s, (1,), (10,))
        time.sleep(2)  # the task computes; the open ends meanwhile
        out["before_commit"] = names()
        out["before_commit_bytes"] = open_bytes(spark, checkpoint, "state/0/0", out["before_commit"])
        out["commit_start"] = time.time()
        out["committed"] = s.commit()
        out["commit_end"] = time.time()
        s = layer.store(1)
        layer.put(s, (1,), (20,))
        time.sleep(2)
        out["open"] = names()
        s.abort()
        settled("aborted")
        s = layer.store(1)
        layer.put(s, (1,), (30,))
        time.sleep(2)
    finally:
        layer.close()
    settled("closed")
    out["value"] = _value_of_key_1(spark, checkpoint)
    return out


def two_attempts(spark, checkpoint: str) -> dict:
    """Two providers (two executors: a retried or speculative task) each commit version 1 of
    operator 0, partition 0, the first with key 1 = 10, then the second with key 1 = 99: what
    each commit returned, ``second_start`` (time.time()) before the second commit, and key 1's
    value in version 1 as a fresh provider then loads it."""
    from .jvm import LayerStore

    state = f"{checkpoint.rstrip('/')}/state"
    first, second = LayerStore(spark, state), LayerStore(spark, state)
    out: dict[str, Any] = {}
    try:
        a, b = first.store(0), second.store(0)
        first.put(a, (1,), (10,))
        second.put(b, (1,), (99,))
        out["first"] = a.commit()
        out["second_start"] = time.time()
        out["second"] = b.commit()
    finally:
        first.close()
        second.close()
    out["value"] = _value_of_key_1(spark, checkpoint)
    return out


def commit_twice(spark, checkpoint: str) -> dict:
    """One provider commits version 1 (key 1 = 10), then version 2 on top of it (key 2 = 20);
    what each commit returned, ``first_start`` (time.time()) before the first, and keys 1 and 2
    as a fresh provider loads version 2."""
    from .jvm import LayerStore

    state = f"{checkpoint.rstrip('/')}/state"
    layer = LayerStore(spark, state)
    out: dict[str, Any] = {}
    try:
        s = layer.store(0)
        layer.put(s, (1,), (10,))
        out["first_start"] = time.time()
        out["first"] = s.commit()
        s = layer.store(out["first"])
        layer.put(s, (2,), (20,))
        out["second"] = s.commit()
    finally:
        layer.close()
    fresh = LayerStore(spark, state)
    try:
        v2 = fresh.store(2)
        out["values"] = [fresh.get(v2, 1), fresh.get(v2, 2)]
    finally:
        fresh.close()
    return out


def _value_of_key_1(spark, checkpoint: str):
    """Key 1's value in version 1 of operator 0, partition 0, as a fresh provider loads it."""
    from .jvm import LayerStore

    fresh = LayerStore(spark, f"{checkpoint.rstrip('/')}/state")
    try:
        return fresh.get(fresh.store(1), 1)
    finally:
        fresh.close()


def write_and_rename(spark, directory: str) -> dict:
    """Through the session's Hadoop FileSystem: create ``<directory>/file.tmp``, write, hsync and
    close it, rename it to ``<directory>/file``, read that back. The two paths, the bytes read
    and ``start``/``end`` (time.time()) around it all."""
    jvm = spark._jvm
    base = jvm.org.apache.hadoop.fs.Path(directory.rstrip("/"))
    fs = base.getFileSystem(spark._jsc.hadoopConfiguration())
    temp, final = jvm.org.apache.hadoop.fs.Path(base, "file.tmp"), jvm.org.apache.hadoop.fs.Path(base, "file")
    start = time.time()
    out = fs.create(temp, False)
    out.write(bytearray(b"requests"))
    out.hsync()
    out.close()
    if not fs.rename(temp, final):
        raise RuntimeError(f"rename {temp} -> {final} refused")
    stream = fs.open(final)
    try:
        read = stream.read()
    finally:
        stream.close()
    end = time.time()
    return {"temp": fs.makeQualified(temp).toUri().getPath(), "final": fs.makeQualified(final).toUri().getPath(),
            "first_byte": read, "start": start, "end": end}


def commit_one(spark, checkpoint: str, confs: dict[str, str]) -> dict:
    """One store partition (operator 0, partition 0) with keyedstate ``confs``, driven through the
    provider contract in this process's JVM: version 1 committed, then loaded by a fresh provider;
    ``handed_out`` (time.time()) before the write store is asked for, ``commit_start``/``commit_end``
    around the commit."""
    from .jvm import LayerStore

    out: dict[str, Any] = {}
    # Earlier queries' stores, and their maintenance's uploads, go first (restarts with the next query).
    spark._jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()
    layer = LayerStore(spark, f"{checkpoint.rstrip('/')}/state", confs=confs)
    try:
        out["handed_out"] = time.time()
        s = layer.store(0)
        layer.put(s, (1,), (10,))
        time.sleep(1)  # the changelog's open (ahead of the commit) ends meanwhile
        out["commit_start"] = time.time()
        out["committed"] = s.commit()
        out["commit_end"] = time.time()
    finally:
        layer.close()
    out["value"] = _value_of_key_1(spark, checkpoint)
    return out
