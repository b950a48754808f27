"""Processes a test watches: state servers, their memory, files and sockets (read-only views
from /proc; nothing here reaches into keyedstate's internals)."""
from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, TypeVar

B = TypeVar("B")
F = TypeVar("F")


def state_server_pids() -> list[int]:
    """PIDs of running keyedstate state servers (read from /proc, no extra dependency)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"keyedstate.server" in cmdline:
                pids.append(int(entry))
    return pids


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no VmRSS for pid {pid}")


def peak_rss_bytes(pid: int) -> int:
    """Peak resident memory of a process since it started (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no VmHWM for pid {pid}")


# -- read-only views of processes and their sockets, from /proc ------------------------------------

def cmdline(pid: int) -> list[str]:
    try:
        return [c.decode(errors="replace") for c in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if c]
    except OSError:
        return []


def ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def children(pid: int) -> list[int]:
    return [p for p in all_pids() if ppid(p) == pid]


def descendants(pid: int) -> list[int]:
    parents = {p: ppid(p) for p in all_pids()}
    out, frontier = [], [pid]
    while frontier:
        nxt = [c for c, par in parents.items() if par in frontier]
        out += nxt
        frontier = nxt
    return out


def alive(pid: int) -> bool:
    """Running (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def signal_quietly(pid: int, sig: int) -> None:
    """Send a signal to a process that may be gone already."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def signal_group_quietly(pgid: int, sig: int) -> None:
    """Send a signal to a process group that may be gone already."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def initial_environ(pid: int) -> dict[str, str]:
    """The environment a process was started with (as the kernel keeps it)."""
    env = {}
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if b"=" in item:
            k, _, v = item.partition(b"=")
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def open_files(pid: int) -> list[str]:
    out = []
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                out.append(os.readlink(fd))
            except OSError:
                pass
    except OSError:
        pass
    return out


def socket_inodes(pid: int) -> set[int]:
    return {int(m.group(1)) for t in open_files(pid) for m in [re.match(r"socket:\[(\d+)\]", t)] if m}


def tcp_sockets(pid: int) -> list[dict[str, Any]]:
    """The TCP sockets ``pid`` holds: local and remote port and state ('LISTEN', 'ESTABLISHED', ...)."""
    states = {"01": "ESTABLISHED", "0A": "LISTEN"}
    mine = socket_inodes(pid)
    out = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if int(parts[9]) in mine:
                out.append({"local_port": int(parts[1].rsplit(":", 1)[1], 16),
                            "remote_port": int(parts[2].rsplit(":", 1)[1], 16),
                            "state": states.get(parts[3], parts[3])})
    return out


def listening_ports(pid: int) -> set[int]:
    return {s["local_port"] for s in tcp_sockets(pid) if s["state"] == "LISTEN"}


def unix_listening_paths(pid: int) -> list[str]:
    """Paths of the Unix domain sockets ``pid`` listens on."""
    mine = socket_inodes(pid)
    out = []
    for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
        parts = line.split()
        # Num RefCount Protocol Flags Type St Inode [Path]; flags 00010000 = __SO_ACCEPTCON (listening)
        if len(parts) >= 8 and int(parts[6]) in mine and int(parts[3], 16) & 0x10000:
            out.append(parts[7])
    return out


def server_ports(server_pid: int, jvm_pid: int) -> tuple[set[int], set[int]]:
    """(the state server's own TCP listening ports: its py4j callback server; the ports of the
    JVM it is connected to that the JVM listens on: keyedstate's py4j gateway)."""
    sockets = tcp_sockets(server_pid)
    own = {s["local_port"] for s in sockets if s["state"] == "LISTEN"}
    remote = {s["remote_port"] for s in sockets if s["state"] == "ESTABLISHED" and s["local_port"] not in own}
    return own, remote & listening_ports(jvm_pid)


def answer(sock: socket.socket, timeout: float) -> bytes | str:
    """What a listener says on ``sock`` within ``timeout``: its bytes, or 'closed' / 'nothing'."""
    sock.settimeout(timeout)
    try:
        data = sock.recv(4096)
    except socket.timeout:
        return "nothing"
    except OSError:
        return "closed"
    return data or "closed"


def py4j_authenticates(port: int | str, token: str, timeout: float = 10.0) -> bool:
    """Whether a py4j endpoint on loopback ``port`` (or the Unix socket at that path) accepts
    ``token`` (py4j's auth command)."""
    try:
        if isinstance(port, str):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(port)
        else:
            sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        with sock:
            sock.sendall(f"A\n{token}\ne\n".encode())  # py4j's Python side also reads an end line
            answer = sock.recv(64)
    except OSError:
        return False
    return answer.startswith(b"!yv")


def wait_until(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``condition`` until it returns something true (returned), or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def started_beside(beside: Callable[[], B], here: Callable[[], F], stop_beside: Callable[[B], Any],
                   stop_here: Callable[[F], Any] | None = None) -> tuple[B, F]:
    """``beside()`` on a thread while ``here()`` runs on this one (two slow starts at once, such
    as two JVMs); both results. When either fails, what the other started is stopped
    (``stop_beside``, ``stop_here``; best effort) and the first failure is raised."""
    with ThreadPoolExecutor(1) as pool:
        starting = pool.submit(beside)
        try:
            mine = here()
        except BaseException:
            with contextlib.suppress(Exception):
                stop_beside(starting.result())
            raise
        try:
            theirs = starting.result()
        except BaseException:
            if stop_here is not None:
                with contextlib.suppress(Exception):
                    stop_here(mine)
            raise
    return theirs, mine
