"""Issue 11, local state: what keyedstate keeps on the executor's disk is private.

With ``localDir`` set, every directory keyedstate creates is 0700 and owned by the user, files
are not readable by group or others, names cannot be predicted, pre-existing entries are never
reused or followed through symlinks, and no secret reaches a log at any log level.

``localDir`` is fixed per JVM by the first store it opens, so these tests run their Spark
session in a child process (support/sessions.py)."""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from support.constants import PFX
from support.files import describe_changes, tree
from support.processes import initial_environ, py4j_authenticates, server_ports, unix_listening_paths
from support.sessions import SessionProcess

pytestmark = pytest.mark.timeout(300)

KEYS = [f"user-{i}" for i in range(60)]


@pytest.fixture(scope="module")
def debug_session(tmp_path_factory):
    """A session with localDir set (created by keyedstate) and the state servers' log level at
    DEBUG, after two batches with a snapshot every version (the second one restarts the query
    and loads a snapshot); alive for the module's tests."""
    root = tmp_path_factory.mktemp("local-dir")
    local = root / "local"  # does not exist: keyedstate creates it
    session = SessionProcess(root / "session", confs={PFX + "localDir": str(local), PFX + "snapshotInterval": "1"},
                             env={"KEYEDSTATE_LOG_LEVEL": "DEBUG"})
    try:
        for b in range(2):
            result = session.run(root / "checkpoint", root / "input", KEYS[b * 10:b * 10 + 40])
            assert result["ok"], result
        yield SimpleNamespace(session=session, local=local, root=root)
    finally:
        session.kill()


def _lstat_tree(root: Path):
    """(path, lstat) of ``root`` and of everything below it, in path order. The session keeps
    writing meanwhile (its stopped query's stores stay loaded): an entry gone before its lstat, a
    transient file renamed away, is skipped, and os.walk skips a directory that vanishes while it
    walks (a staged snapshot, dropped), where rglob raised."""
    walked = [Path(top) / name for top, dirs, files in os.walk(root) for name in dirs + files]
    for path in [root, *sorted(walked)]:
        try:
            yield path, path.lstat()
        except FileNotFoundError:
            continue


def test_local_dir_state_is_private(debug_session):
    """Every directory is 0700 and the user's; every file is closed to group and others, but for
    a hard link to one of the checkpoint's files (a restored snapshot's table file), whose mode is
    the checkpoint's: its bytes are no more readable through localDir than through the checkpoint."""
    local: Path = debug_session.local
    uid = os.getuid()
    checkpoint_files = {(st.st_dev, st.st_ino) for _, st in _lstat_tree(debug_session.root / "checkpoint")
                        if stat.S_ISREG(st.st_mode)}
    open_dirs, open_files = [], []
    for path, st in _lstat_tree(local):
        rel = str(path.relative_to(local.parent))
        if stat.S_ISDIR(st.st_mode):
            if st.st_mode & 0o077 or st.st_uid != uid:
                open_dirs.append(f"{rel} {stat.filemode(st.st_mode)}")
        elif st.st_mode & 0o077 and (st.st_dev, st.st_ino) not in checkpoint_files:
            open_files.append(f"{rel} {stat.filemode(st.st_mode)}")
    assert not open_dirs, (f"{len(open_dirs)} directories under localDir are open to group/others "
                           f"(expected 0700, owned by uid {uid}): {open_dirs[:12]}")
    assert not open_files, f"{len(open_files)} files under localDir are group/other-accessible: {open_files[:12]}"


def test_local_dir_entry_names_are_unpredictable(debug_session):
    names = sorted(p.name for p in debug_session.local.iterdir())
    assert names, "keyedstate created nothing under localDir"
    predictable = [n for n in names if re.fullmatch(r"[A-Za-z]+([-_.]\d+)+", n)]
    assert not predictable, (f"entries under localDir are named from small counters and the JVM pid "
                             f"(JVM pid {debug_session.session.jvm_pid_in_ns}): {predictable}")


def test_secret_never_reaches_a_log_at_debug_level(debug_session):
    session: SessionProcess = debug_session.session
    servers = session.servers()
    assert servers, "no state server running"
    secrets = set()
    for pid in servers:
        for key, value in initial_environ(pid).items():
            if re.search("SECRET|TOKEN|AUTH", key) and len(value) >= 16:
                secrets.add(value)
    assert secrets, "found no secret in the state servers' environment to look for"
    logs = {p: p.read_bytes() for p in debug_session.local.rglob("*") if p.is_file() and not p.is_symlink()}
    logs[session.log_path] = session.log_path.read_bytes()
    leaked = sorted(str(p) for p, data in logs.items() for s in secrets if s.encode() in data)
    assert not leaked, f"the bridge secret appears in: {leaked}"
    # However the secret is handed over: no token found in a log may authenticate to the bridge.
    tokens = {m.decode() for data in logs.values()
              for m in re.findall(rb"(?<![0-9A-Za-z])[0-9a-fA-F]{32,}(?![0-9A-Za-z])", data)}
    ports = set()
    for pid in servers:
        own, gateway = server_ports(pid, session.jvm_pid)
        ports |= own | gateway | {p for p in unix_listening_paths(pid) if not p.endswith("/data.sock")}
    working = sorted({(t[:12] + "...", port) for t in list(tokens)[:200] for port in ports if py4j_authenticates(port, t)})
    assert not working, f"tokens written to a log authenticate to keyedstate's py4j endpoints: {working}"


def test_pre_existing_entries_at_predictable_names_are_neither_followed_nor_reused(tmp_path):
    """An attacker who can write to a shared localDir plants what the old names were
    (server-<n>-<jvm pid>) and names like keyedstate's own: a symlink to a directory they own,
    and a world-writable directory. keyedstate must neither follow the one nor reuse the
    other, and must still work."""
    local = tmp_path / "local"
    local.mkdir(mode=0o755)  # the operator's shared directory
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    os.chmod(attacker, 0o777)
    with SessionProcess(tmp_path / "session", confs={PFX + "localDir": str(local),
                                                     PFX + "serverProcesses": "2"}) as session:
        pid = session.jvm_pid_in_ns  # known before any store is opened
        os.symlink(attacker, local / f"server-1-{pid}")
        os.symlink(attacker, local / ("keyedstate-" + "0" * 32))
        planted = local / f"server-2-{pid}"
        planted.mkdir()
        os.chmod(planted, 0o777)
        (planted / "planted.txt").write_text("left by another user\n")
        (planted / "jvm.lock").write_text("")
        planted_before = tree(planted)
        result = session.run(tmp_path / "checkpoint", tmp_path / "input", KEYS)
        problems = []
        through_link = sorted(str(p.relative_to(attacker)) for p in attacker.rglob("*"))
        if through_link:
            problems.append(f"files created through the planted symlink: {through_link[:10]}")
        reused = describe_changes(planted_before, tree(planted))
        if reused:
            problems.append(f"the planted world-writable directory was reused: {reused[:10]}")
        if not result["ok"]:
            problems.append(f"the query failed because of the planted entries: {result['error'][:800]}")
    assert not problems, "\n".join(problems)
