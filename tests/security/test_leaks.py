"""Issue 11, leaks: local state does not outlive what it belongs to.

* what a SIGKILLed executor JVM left (its directory in the temp dir: local copies of every
  partition it held) is cleaned at the next start on that directory;
* a clean stop leaves nothing of keyedstate's under localDir (nor a data socket dir elsewhere);
* a dead state server's local files are cleaned when it is replaced;
* a rescale that fails and rolls back leaves no new partition directories and no staging;
* temp files of a write killed mid-way do not stay in the checkpoint for ever;
* two executors with equal pids (containers) sharing a localDir do not collide;
* a killed state server's data socket directory outside its work dir (removed with it) does not
  stay in the temp dir for ever.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

import keyedstate
from support.constants import KS, PFX, PROVIDER_CONF
from support.driver import FileStream, collect_into, count_by_key, session_confs
from support.files import CreatedNames
from support.processes import (alive, children, cmdline, open_files, started_beside, unix_listening_paths,
                                wait_until)
from support.sessions import SessionProcess

pytestmark = pytest.mark.timeout(300)

KEYS = [f"user-{i}" for i in range(60)]
# As long as a YARN container's local dir: the data socket no longer fits in it (AF_UNIX paths
# have 108 bytes), so the state server puts it in a directory of its own under $TMPDIR.
LONG_NAME = "usercache-appcache-application_1700000000000_0001-container_01_000002-" + "x" * 20


def local_paths(pid: int) -> list[str]:
    """Files and the data socket a process has open (not devices, not Python's own files)."""
    return [p for p in open_files(pid) + unix_listening_paths(pid)
            if p.startswith("/") and not p.startswith(("/dev/", "/proc/", "/sys/", sys.prefix, sys.base_prefix))]


def top_entries(paths, base: Path) -> set[Path]:
    """The entries directly under ``base`` that hold any of ``paths``."""
    out = set()
    for p in paths:
        try:
            rel = Path(p).relative_to(base)
        except ValueError:
            continue
        if rel.parts:
            out.add(base / rel.parts[0])
    return out


@pytest.fixture(scope="module")
def killed_then_restarted(tmp_path_factory):
    """A session runs a batch with its JVM's java.io.tmpdir in a long directory (no localDir) and
    its servers' $TMPDIR elsewhere, and its JVM is SIGKILLed; a second session then runs a batch
    with that directory as its localDir (the next start on that disk). The second stays alive."""
    root = tmp_path_factory.mktemp("killed")
    jtmp, pytmp = root / LONG_NAME, root / "py-tmp"
    jtmp.mkdir()
    pytmp.mkdir()
    checkpoint, inputs = root / "checkpoint", root / "input"
    env = {"TMPDIR": str(pytmp)}
    with SessionProcess(root / "first", confs={PFX + "serverProcesses": "1"}, env=env,
                        java_options=f"-Djava.io.tmpdir={jtmp}") as first:
        assert first.run(checkpoint, inputs, KEYS)["ok"]
        servers = first.servers()
        held = [p for pid in servers for p in local_paths(pid)]
        left = top_entries(held, jtmp) | top_entries(held, pytmp)
        assert left, f"the state server holds nothing under {jtmp} or {pytmp}: {held}"
        os.kill(first.jvm_pid, signal.SIGKILL)
        wait_until(lambda: not any(alive(p) for p in servers), 60, "the killed JVM's state servers to exit")
    before = set(jtmp.iterdir())
    second = SessionProcess(root / "second", confs={PFX + "serverProcesses": "1", PFX + "localDir": str(jtmp)},
                            env=env)
    try:
        result = second.run(checkpoint, inputs, ["after-the-kill"])
        assert result["ok"], result["error"][:1500]
        yield SimpleNamespace(second=second, left=left, before=before, jtmp=jtmp, pytmp=pytmp)
    finally:
        second.kill()


def test_killed_jvm_leftovers_are_removed_at_the_next_start(killed_then_restarted):
    remaining = sorted(str(p) for p in killed_then_restarted.left if os.path.lexists(p))
    assert not remaining, f"what the SIGKILLed executor JVM left is still there after the next start: {remaining}"


def test_local_dir_is_emptied_when_the_session_stops(killed_then_restarted):
    """A clean stop (spark.stop(), interpreter exit) removes everything keyedstate put under
    localDir, and the data socket's directory wherever it was (here: under the servers' $TMPDIR,
    the localDir path being as long as a YARN container's)."""
    session, local = killed_then_restarted.second, killed_then_restarted.jtmp
    servers = session.servers()
    sockets = [s for pid in servers for s in unix_listening_paths(pid)]
    assert sockets, "the state servers listen on no data socket"
    session.exit()
    wait_until(lambda: not any(alive(p) for p in servers), 60, "the state servers to exit")
    # (what the killed JVM of the first session left of its own, e.g. Spark's temp files, is not ours)
    left = sorted(str(p.relative_to(local)) for p in set(local.iterdir()) - killed_then_restarted.before)
    assert not left, f"a clean stop left {len(left)} entries under localDir {local}: {left[:8]}"
    socket_dirs = sorted({str(Path(s).parent) for s in sockets if os.path.lexists(Path(s).parent)
                          and not Path(s).parent.is_relative_to(local)})
    assert not socket_dirs, f"a clean stop left the data socket directories {socket_dirs}"


def session_state_servers(spark) -> list[int]:
    jvm = spark.sparkContext._jvm.ProcessHandle.current().pid()
    return [p for p in children(jvm) if any("keyedstate.server" in c for c in cmdline(p))]


def test_dead_state_server_local_files_are_removed_when_it_is_replaced(spark, tmp_path):
    """The test session's own JVM: SIGKILL its state servers, run a batch (replacement servers
    reload the state); the dead servers' RocksDB copies and data sockets must be gone. (Their
    log may stay: the task error points at it.)"""
    stream = FileStream(spark, tmp_path, "k STRING")
    with session_confs(spark, {PROVIDER_CONF: KS}):
        query = stream.start(count_by_key, collect_into({}))
        try:
            stream.step(query, [{"k": k} for k in KEYS])
            dead = session_state_servers(spark)
            assert dead, "no state server running"
            logs = {os.path.realpath(f"/proc/{pid}/fd/{fd}") for pid in dead for fd in (1, 2)}
            held = sorted({p for pid in dead for p in local_paths(pid)} - logs)
            assert held, "the state servers hold no local files"
            for pid in dead:
                os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not any(alive(p) for p in dead), 30, "the state servers to die")
            stream.step(query, [{"k": k} for k in KEYS[:10]])  # the replacement servers reload
        finally:
            query.stop()
    remaining = [p for p in held if os.path.lexists(p)]
    assert not remaining, (f"{len(remaining)} of {len(held)} local files of the dead state servers remain "
                           f"after their replacement ran a batch: {remaining[:8]}")


def test_rolled_back_rescale_leaves_no_new_partitions_or_staging(spark, tmp_path):
    """4 -> 8 from changelogs: each old partition's split publishes its new partitions as it goes
    (and a replay file into itself); partition 3's changelog is corrupt, so the rescale fails and
    rolls back."""
    stream = FileStream(spark, tmp_path, "k LONG")
    with session_confs(spark, {PROVIDER_CONF: KS, "spark.sql.shuffle.partitions": "4",
                               PFX + "snapshotInterval": "100"}):
        query = stream.start(count_by_key, collect_into({}))
        try:
            for b in range(2):
                stream.step(query, [{"k": k} for k in range(b * 300, b * 300 + 1000)])
        finally:
            query.stop()
    root = Path(stream.checkpoint)
    op_dir = root / "state" / "0"
    before = {p: sorted(str(f.relative_to(p)) for f in p.rglob("*")) for p in op_dir.iterdir() if p.is_dir()}
    victim = op_dir / "3" / "1.ks-changelog"
    victim.write_bytes(victim.read_bytes()[:-5])
    (op_dir / "3" / ".1.ks-changelog.crc").unlink(missing_ok=True)
    with pytest.raises(Exception, match=re.escape(str(victim))):
        keyedstate.rescale(stream.checkpoint, 8, spark=spark)
    assert not (root / "offsets" / "2").exists(), "precondition: the repartition batch was rolled back"
    problems = []
    new_partitions = sorted(set(p.name for p in op_dir.iterdir() if p.is_dir()) - {p.name for p in before})
    if new_partitions:
        problems.append(f"new partition directories remain: {[str(op_dir / n) for n in new_partitions]}")
    added = {str(p): sorted(set(str(f.relative_to(p)) for f in p.rglob("*")) - set(files))
             for p, files in before.items()}
    added = {p: files for p, files in added.items() if files}
    if added:
        problems.append(f"files the rescale published into the old partitions remain: {added}")
    staging = [str(p) for p in root.iterdir() if "rescale" in p.name]
    if staging:
        problems.append(f"staging remains: {staging}")
    assert not problems, "after the rolled-back rescale: " + "; ".join(problems)


FINAL_FILE = re.compile(r"\.?\d+\.ks-(changelog|snapshot)(\.crc)?")


def test_temp_files_of_a_killed_write_do_not_stay(spark, tmp_path):
    """A write killed mid-way leaves its temp file in the checkpoint. The names the writer
    really uses are caught in flight (inotify on the partition directories while batches
    commit); a file left under such a name, two days old, must be cleaned up once the query
    runs again."""
    stream = FileStream(spark, tmp_path, "k STRING")
    confs = {PROVIDER_CONF: KS, PFX + "snapshotInterval": "100"}
    with session_confs(spark, confs):
        query = stream.start(count_by_key, collect_into({}))
        try:
            stream.step(query, [{"k": "first"}])  # the partition directories exist from here on
            created = CreatedNames([stream.partition_dir(partition=p) for p in (0, 1)])
            try:
                stream.step(query, [{"k": f"k-{i}"} for i in range(1000)])
            finally:
                caught = created.close()
        finally:
            query.stop()
    leftovers = sorted(p for p in caught
                       if not FINAL_FILE.fullmatch(p.name) and p.name != "ks-files" and not p.is_dir())
    assert leftovers, f"the commit wrote no file under a temporary name: {sorted(caught)}"
    old = time.time() - 2 * 86400
    for p in leftovers:  # what the killed write left: a partial file under its temp name
        if not p.exists():
            p.write_bytes(b"the first bytes of a write that was killed")
        os.utime(p, (old, old))
    with session_confs(spark, confs):
        query = stream.start(count_by_key, collect_into({}))
        try:
            stream.step(query, [{"k": "after-the-kill"}])
            try:
                wait_until(lambda: not any(p.exists() for p in leftovers), 20, "leftover temp files to go", 0.5)
            except AssertionError:
                pass
        finally:
            query.stop()
    remaining = sorted(str(p) for p in leftovers if p.exists())
    assert not remaining, f"temp files of a killed write are still in the checkpoint: {remaining}"


def test_executors_with_equal_pids_sharing_a_local_dir_do_not_collide(tmp_path):
    """Two executor JVMs in their own PID namespaces (as in two containers) get the same pid;
    they share one localDir. Neither may use the other's directories, and both compute exactly."""
    wrapper = ["unshare", "--pid", "--fork", "--mount-proc"]
    probe = subprocess.run([*wrapper, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create PID namespaces here: {probe.stderr.strip()}")
    local = tmp_path / "shared-local"
    local.mkdir()
    confs = {PFX + "localDir": str(local), PFX + "serverProcesses": "1"}
    # The two sessions start at once (each start is a JVM's); the with-block below stops both.
    b, a = started_beside(lambda: SessionProcess(tmp_path / "b", confs=confs, wrapper=wrapper),
                          lambda: SessionProcess(tmp_path / "a", confs=confs, wrapper=wrapper),
                          stop_beside=lambda session: session.kill(), stop_here=lambda session: session.kill())
    with a, b:
        if a.jvm_pid_in_ns != b.jvm_pid_in_ns:
            pytest.skip(f"the two JVMs got different pids ({a.jvm_pid_in_ns}, {b.jvm_pid_in_ns})")
        expected = {"a": Counter(), "b": Counter()}
        wrong = []
        for step in range(2):
            for name, session in (("a", a), ("b", b)):
                keys = [f"{name}-{(step * 5 + i) % 30}" for i in range(20)]
                expected[name].update(keys)
                result = session.run(tmp_path / name / "checkpoint", tmp_path / name / "input", keys)
                if not result["ok"]:
                    wrong.append(f"{name} step {step} failed: {result['error'][:300]}")
                elif result["counts"] != {k: expected[name][k] for k in set(keys)}:
                    wrong.append(f"{name} step {step} counted wrong: {result['counts']}")
        dirs = {name: top_entries([p for pid in s.servers() for p in local_paths(pid)], local)
                for name, s in (("a", a), ("b", b))}
    shared = sorted(str(p) for p in dirs["a"] & dirs["b"])
    assert not shared and not wrong, (f"JVM pid {a.jvm_pid_in_ns} in both containers; directories used by both: "
                                      f"{shared}; results: {wrong or 'exact'}")


def test_socket_dirs_of_servers_that_are_gone_are_removed_by_the_next_server(tmp_path, monkeypatch):
    """Only this user's ``ks-<16 hex>`` directories, older than a minute, holding just a
    ``data.sock`` that refuses connections: a live server's (listening), a starting one's
    (young), a link and anything else stay. Nothing goes on a file system that is not known to
    be this host's alone (another host's live socket refuses connections too)."""
    from keyedstate.server import api

    def socket_dir(name: str, listen: bool, age: float = 3600) -> tuple[Path, socket.socket]:
        d = tmp_path / name
        d.mkdir(mode=0o700)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(d / "data.sock"))
        if listen:
            s.listen(1)
        else:
            s.close()  # the file stays, nobody listens: a killed server's
        os.utime(d, (time.time() - age, time.time() - age))
        return d, s

    dead, _ = socket_dir("ks-00000000000000aa", listen=False)
    live, server = socket_dir("ks-00000000000000bb", listen=True)
    young, _ = socket_dir("ks-00000000000000cc", listen=False, age=5)
    other, _ = socket_dir("ks-not-hex-at-all", listen=False)
    crowded, _ = socket_dir("ks-00000000000000dd", listen=False)
    (crowded / "keep").write_text("not a server's")
    os.utime(crowded, (time.time() - 3600, time.time() - 3600))
    (tmp_path / "ks-00000000000000ee").symlink_to(dead)
    try:
        with monkeypatch.context() as shared:
            shared.setattr(api, "_LOCAL_FILE_SYSTEMS", frozenset())
            api._remove_abandoned_socket_dirs(tmp_path)
        assert dead.exists()
        api._remove_abandoned_socket_dirs(tmp_path)
    finally:
        server.close()
    assert not dead.exists()
    assert all(d.exists() for d in (live, young, other, crowded))
    assert (tmp_path / "ks-00000000000000ee").is_symlink()
