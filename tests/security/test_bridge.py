"""Issue 11, the bridge survives hostile local peers.

A local process that does not know the secret must not be able to make the state server or
the JVM allocate more than a small bounded amount of memory, or hold a connection (a thread)
open; each direction has its own secret; the data channel refuses peers without its secret and
data frames with impossible lengths before allocating them; malformed frames fail one exchange,
never the server; a hung state server fails the task within bounded time instead of hanging it.

The tests attack a state server started by a Spark session in a child process (one server,
``bridgeTimeout=5s``, ``bridgeIdleTimeout=2s``) through its real sockets, found in /proc; after
each attack the query must still run exactly. The data channel's HELLO frame is FORMATS.md's
(protocol 2); its secret is read where a same-user peer could read it, the server's initial
environment."""
from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from keyedstate.formats import frames
from support.constants import PFX
from support.processes import answer as raw_answer
from support.processes import (alive, initial_environ, py4j_authenticates, rss_bytes, server_ports, signal_quietly,
                               socket_inodes, unix_listening_paths, wait_until)
from support.sessions import SessionProcess

MiB = 1 << 20

pytestmark = pytest.mark.timeout(300)

IDLE_SECONDS = 2
"""The session's bridgeIdleTimeout: the JVM closes a control connection unused for 1 to 2 times this."""


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    root = tmp_path_factory.mktemp("bridge")
    session = SessionProcess(root / "session", confs={PFX + "serverProcesses": "1", PFX + "bridgeTimeout": "5s",
                                                      PFX + "bridgeIdleTimeout": f"{IDLE_SECONDS}s"})
    expected = Counter()
    batches = iter(range(10**6))

    def serves() -> None:
        """One more batch runs, and its counts are exact."""
        b = next(batches)
        keys = [f"key-{(b * 13 + i) % 90}" for i in range(40)]
        expected.update(keys)
        result = session.run(root / "checkpoint", root / "input", keys)
        assert result["ok"], f"the query failed after the attack: {result['error'][:1500]}"
        assert result["counts"] == {k: expected[k] for k in set(keys)}

    try:
        serves()
        yield SimpleNamespace(session=session, serves=serves, root=root)
    finally:
        session.kill()


def the_server(bridge) -> int:
    servers = bridge.session.servers()
    assert len(servers) == 1, f"expected one state server, found {servers}"
    return servers[0]


Address = int | str
"""A py4j listener: a loopback TCP port, or a Unix socket's path."""


def py4j_ports(bridge) -> tuple[int, set[Address], set[Address]]:
    """(server pid, its py4j callback server's listeners: its TCP listening ports and its Unix
    sockets but the data channel's; the JVM's TCP ports it is connected to, keyedstate's py4j
    gateway, empty where the JVM opens no listener for it)."""
    server = the_server(bridge)
    callback_ports, gateway_ports = server_ports(server, bridge.session.jvm_pid)
    callback_paths = {p for p in unix_listening_paths(server) if not p.endswith("/data.sock")}
    return server, callback_ports | callback_paths, gateway_ports


def connect_to(address: Address, timeout: float = 10) -> socket.socket:
    if isinstance(address, int):
        return socket.create_connection(("127.0.0.1", address), timeout=timeout)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(address)
    return sock


class PeakRss:
    """Samples a process's RSS in the background; ``stop()`` returns peak - baseline."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.baseline = rss_bytes(pid)
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except (OSError, ValueError):
                return
            time.sleep(0.01)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak - self.baseline


def flood_line(port: Address, total: int, chunk: int = MiB) -> tuple[socket.socket, int, str]:
    """Connect without the secret and stream ``total`` bytes of one line that never ends."""
    sock = connect_to(port)
    data = b"A" * chunk
    sent = 0
    try:
        while sent < total:
            sock.sendall(data)
            sent += chunk
        outcome = "the peer read all of it"
    except socket.timeout:
        outcome = "the peer stopped reading"
    except OSError as exc:
        outcome = f"the peer closed the connection ({exc.strerror or exc})"
    return sock, sent, outcome


def test_endless_unauthenticated_line_to_the_state_server_is_bounded(bridge):
    server, callback_ports, _ = py4j_ports(bridge)
    for port in callback_ports:
        rss = PeakRss(server)
        sock, sent, outcome = flood_line(port, 200 * MiB)
        time.sleep(0.5)
        growth = rss.stop()
        sock.close()
        assert growth < 16 * MiB, (f"an unauthenticated peer grew the state server (pid {server}) by "
                                   f"{growth / MiB:.0f} MiB with a {sent / MiB:.0f} MiB line to port {port} ({outcome})")
    assert alive(server)
    bridge.serves()


def test_endless_unauthenticated_line_to_the_jvm_gateway_is_bounded(bridge):
    session = bridge.session
    server, _, gateway_ports = py4j_ports(bridge)
    for port in gateway_ports:
        baseline = session.heap_used()
        rss = PeakRss(session.jvm_pid)
        sock, sent, outcome = flood_line(port, 128 * MiB)
        time.sleep(0.5)
        held = session.heap_used() - baseline  # while the connection is still open
        growth = rss.stop()
        sock.close()
        assert held < 32 * MiB, (f"an unauthenticated peer made the JVM (pid {session.jvm_pid}) hold "
                                 f"{held / MiB:.0f} MiB of heap (RSS +{growth / MiB:.0f} MiB) with a "
                                 f"{sent / MiB:.0f} MiB line to keyedstate's gateway port {port} ({outcome})")
    bridge.serves()


def test_idle_unauthenticated_connections_are_closed(bridge):
    """A peer that connects and sends half an auth exchange must not hold a thread for ever
    (nor a data-channel connection that never says HELLO)."""
    server, callback_ports, gateway_ports = py4j_ports(bridge)
    socks = {}
    for what, ports in (("state server", callback_ports), ("JVM gateway", gateway_ports)):
        for port in ports:
            sock = connect_to(port)
            sock.sendall(b"A\n")  # the auth command, then nothing: no token, no newline
            socks[f"{what} port {port}"] = sock
    data = data_socket(server)
    data.sendall(frames.REQUEST_HEAD.pack(5 + 2, frames.OP_HELLO, 0)[:5])  # half a frame head, then nothing
    socks["data channel"] = data
    for sock in socks.values():
        sock.settimeout(0.2)
    deadline = time.monotonic() + 30
    still_open = set(socks)
    while still_open and time.monotonic() < deadline:
        for name in list(still_open):
            try:
                if socks[name].recv(4096) == b"":
                    still_open.discard(name)
            except socket.timeout:
                pass
            except OSError:
                still_open.discard(name)
    for sock in socks.values():
        sock.close()
    assert not still_open, f"unauthenticated idle connections still open after 30 s: {sorted(still_open)}"


def test_a_slow_unauthenticated_peer_is_closed_when_the_handshake_time_is_up(bridge):
    """The JVM gateway's 10 s to authenticate are for the whole handshake: a peer that sends a
    byte of an auth line every second (each read well within 10 s) is closed after 10 s, not
    held for the hours its 16 KiB allowance would take at that pace."""
    _, _, gateway_ports = py4j_ports(bridge)
    for port in gateway_ports:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.settimeout(1.0)
        started = time.monotonic()
        closed_after = None
        try:
            sock.sendall(b"A\n")
            while time.monotonic() - started < 25:
                try:
                    sock.sendall(b"x")
                    if sock.recv(4096) == b"":
                        closed_after = time.monotonic() - started
                        break
                except socket.timeout:
                    continue
                except OSError:
                    closed_after = time.monotonic() - started
                    break
        finally:
            sock.close()
        assert closed_after is not None and closed_after < 15, \
            f"a peer trickling an auth line to gateway port {port} was still connected after 25 s"
    bridge.serves()


@pytest.mark.parametrize("side", ["JVM gateway", "state server"])
def test_unauthenticated_connections_beyond_a_few_are_closed_at_once(bridge, side):
    """py4j gives every connection a thread: more than 32 connections to a py4j listener (the
    JVM's gateway, where it has one; the state server's callback server) that have not
    authenticated are closed as soon as they are accepted, and the query still runs."""
    _, callback, gateway = py4j_ports(bridge)
    for port in gateway if side == "JVM gateway" else callback:
        socks = [connect_to(port) for _ in range(48)]
        try:
            time.sleep(1.0)
            closed = 0
            for sock in socks:
                sock.settimeout(0.05)
                try:
                    if sock.recv(1) == b"":
                        closed += 1
                except socket.timeout:
                    pass
                except OSError:
                    closed += 1
            assert closed >= 48 - 32, \
                f"only {closed} of 48 idle unauthenticated connections to {port} were closed at once"
        finally:
            for sock in socks:
                sock.close()
    bridge.serves()


def test_each_direction_has_its_own_secret(bridge):
    """The secret the state server uses to reach the JVM must not also open the server's own
    callback port (and vice versa): a peer that learns one cannot impersonate the other side."""
    server, callback_ports, gateway_ports = py4j_ports(bridge)
    tokens = {v for k, v in initial_environ(server).items() if len(v) >= 32 and " " not in v and "/" not in v}
    assert tokens, "found no secret in the state server's environment to check"
    both = []
    for token in tokens:
        to_jvm = [p for p in gateway_ports if py4j_authenticates(p, token)]
        to_server = [p for p in callback_ports if py4j_authenticates(p, token)]
        if to_jvm and to_server:
            both.append(f"{token[:8]}... opens JVM port {to_jvm} and state server port {to_server}")
    assert not both, "one secret serves both directions: " + "; ".join(both)


# A local user other than the job's: holds as many connections as it can to every listener it is
# given (TCP ports on loopback, Unix socket paths), reconnecting those closed, until its stdin
# closes or 300 s have passed. First prints what it could connect to.
OTHER_USER_ATTACKER = r'''
import json, socket, sys, threading, time
targets = json.loads(sys.argv[1])
PER_TARGET = 80
held = {str(t): [] for t in targets}
errors = {}

def connect(target):
    if isinstance(target, int):
        return socket.create_connection(("127.0.0.1", target), timeout=2)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2)
    sock.connect(target)
    return sock

def fill():
    for target in targets:
        live = []
        for sock in held[str(target)]:
            sock.setblocking(False)
            try:
                if sock.recv(1) == b"":
                    sock.close()
                    continue
            except BlockingIOError:
                pass
            except OSError:
                sock.close()
                continue
            live.append(sock)
        held[str(target)] = live
        while len(live) < PER_TARGET:
            try:
                live.append(connect(target))
            except OSError as exc:
                errors[str(target)] = f"{type(exc).__name__}: {exc}"
                break

fill()
print(json.dumps({"held": {t: len(s) for t, s in held.items()}, "errors": errors}), flush=True)
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
deadline = time.monotonic() + 300
while not done.wait(0.3) and time.monotonic() < deadline:
    fill()
'''


def control_connections(server: int, callback: set[Address]) -> set[int]:
    """Inodes of the connections ``server`` accepted on its py4j callback listeners' Unix sockets
    (an accepted socket carries its listener's path in /proc/net/unix)."""
    paths = {p for p in callback if isinstance(p, str)}
    assert paths, f"state server {server} has no Unix callback socket"
    mine = socket_inodes(server)
    found = set()
    for line in Path(f"/proc/{server}/net/unix").read_text().splitlines()[1:]:
        parts = line.split()
        # Num RefCount Protocol Flags Type St Inode Path; flags 00010000: listening; St 03: connected
        if len(parts) >= 8 and parts[7] in paths and not int(parts[3], 16) & 0x10000 and parts[5] == "03" \
                and int(parts[6]) in mine:
            found.add(int(parts[6]))
    return found


def test_another_local_user_holding_connections_cannot_stop_a_query(bridge):
    """Another local user holds as many connections as it can (80 at a time, renewed as they are
    closed) to every listener keyedstate opens: the state server's and keyedstate's in the JVM,
    TCP or Unix. A query must still start, with new control connections to the state server (the
    JVM closes idle ones after IDLE_SECONDS to twice that: the test waits until the server holds
    none of the connections it had before the attack), and run exactly. Failed before: the
    callback server's 32 pre-authentication places were all taken, the JVM's new connection was
    closed at once, and the query failed ('Error while obtaining a new communication channel')."""
    if os.geteuid() != 0:
        pytest.skip("running a process as another user needs root")
    server, callback, gateway = py4j_ports(bridge)
    targets = sorted(callback | gateway, key=str) + [p for p in unix_listening_paths(server) if p not in callback]
    assert targets, "found no listener of keyedstate to attack"
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    jvm_connections = control_connections(server, callback)  # only the JVM's: the attack has not begun
    attacker = subprocess.Popen([python, "-c", OTHER_USER_ATTACKER, json.dumps(targets)], user=65534, group=65534,
                                extra_groups=[], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        first = attacker.stdout.readline()
        assert first, "the attacker did not start"
        reached = json.loads(first)
        # the JVM's idle control connections are closed: the next query opens new ones
        wait_until(lambda: not jvm_connections & control_connections(server, callback), 2 * IDLE_SECONDS + 10,
                   f"the JVM to close its idle control connections to state server {server}")
        assert attacker.poll() is None, "the attacker stopped early"
        bridge.serves()
        bridge.serves()
    finally:
        attacker.stdin.close()
        try:
            attacker.wait(30)
        except subprocess.TimeoutExpired:
            attacker.kill()
            attacker.wait()
    print(f"the attacker reached: {reached}")


# -- the data channel ---------------------------------------------------------------------------------

RESPONSE_HEAD = struct.Struct(">IB")  # length, status


def data_socket(server: int) -> socket.socket:
    paths = [p for p in unix_listening_paths(server) if p.endswith("/data.sock")]
    assert paths, f"state server {server} listens on no data socket"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(paths[0])
    return sock


def data_secret(server: int) -> bytes:
    """What a same-user peer can read: the secret the JVM gave the server for the data channel."""
    secrets = [v for k, v in initial_environ(server).items() if "DATA" in k and len(v) >= 32]
    assert len(secrets) == 1, "expected the data-channel secret in the state server's environment"
    return secrets[0].encode()


def hello(secret: bytes) -> bytes:
    body = frames.U16.pack(frames.PROTOCOL_VERSION) + secret
    return frames.REQUEST_HEAD.pack(5 + len(body), frames.OP_HELLO, 0) + body


def authenticated_data_socket(server: int) -> socket.socket:
    sock = data_socket(server)
    sock.sendall(hello(data_secret(server)))
    answer = reply_or_close(sock, 5)
    assert answer.startswith("reply status 0"), f"the HELLO with the server's secret was refused: {answer}"
    return sock


def reply_or_close(sock: socket.socket, timeout: float) -> str:
    """The data server's reply, parsed, or 'closed' / 'nothing' / 'garbage'."""
    data = raw_answer(sock, timeout)
    if isinstance(data, str):
        return data
    if len(data) >= RESPONSE_HEAD.size:
        length, status = RESPONSE_HEAD.unpack_from(data)
        return f"reply status {status}: {data[RESPONSE_HEAD.size:].decode(errors='replace')}"
    return "garbage"


def send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:  # the server closed the connection already: what follows reads that
        pass


def test_data_channel_refuses_peers_without_the_secret(bridge):
    """The socket may live in a shared temporary directory: a peer that can connect must still
    get nothing served without the secret."""
    server = the_server(bridge)
    outcomes = {}
    for what, first in (("a GET as the first frame", frames.REQUEST_HEAD.pack(5 + 4, frames.OP_GET, 1) + b"key!"),
                        ("a HELLO with a wrong secret", hello(b"0" * 64)),
                        ("a HELLO of another protocol version",
                         frames.REQUEST_HEAD.pack(5 + 2 + 64, frames.OP_HELLO, 0) + frames.U16.pack(1) + b"0" * 64)):
        sock = data_socket(server)
        sock.sendall(first)
        answer = reply_or_close(sock, 5)
        send_quietly(sock, frames.REQUEST_HEAD.pack(5, frames.OP_SYNC, 1))  # then a request: never served
        after = reply_or_close(sock, 5)
        sock.close()
        outcomes[what] = (answer, after)
    assert alive(server)
    for what, (answer, after) in outcomes.items():
        assert answer.startswith("reply status 2") or answer == "closed", f"{what}: {answer}"
        assert after in ("closed", "nothing"), f"{what}: a request after it was served: {after}"
    bridge.serves()


def test_malformed_data_frames_fail_one_exchange_not_the_server(bridge):
    server = the_server(bridge)
    outcomes = {}
    sock = authenticated_data_socket(server)
    sock.sendall(frames.REQUEST_HEAD.pack(5 + 1, frames.OP_SCAN, 1) + b"\x00")  # a SCAN whose body is cut short
    outcomes["scan body cut short"] = reply_or_close(sock, 5)
    sock.sendall(frames.REQUEST_HEAD.pack(5, 99, 1))  # an unknown op
    outcomes["unknown op"] = reply_or_close(sock, 5)
    sock.sendall(frames.REQUEST_HEAD.pack(5, frames.OP_RELEASE, 1))  # a RELEASE without its flag
    outcomes["release without a flag"] = reply_or_close(sock, 5)
    sock.sendall(frames.REQUEST_HEAD.pack(5 + 1, frames.OP_RELEASE, 987654) + b"\x02")  # an unknown flag
    outcomes["release with an unknown flag"] = reply_or_close(sock, 5)  # refused before the store is looked up
    sock.sendall(frames.REQUEST_HEAD.pack(5, frames.OP_SYNC, 987654))  # a store handle that is not open
    outcomes["unknown store"] = reply_or_close(sock, 5)
    sock.close()
    sock = authenticated_data_socket(server)
    sock.sendall(frames.REQUEST_HEAD.pack(2, frames.OP_GET, 1))  # a length shorter than the header it follows
    outcomes["length below the header size"] = reply_or_close(sock, 5)
    sock.close()
    sock = authenticated_data_socket(server)
    sock.sendall(frames.REQUEST_HEAD.pack(5 + 100, frames.OP_GET, 1) + b"x" * 10)  # the peer goes mid-frame
    sock.close()
    assert alive(server), f"a malformed frame killed the state server: {outcomes}"
    for what in ("scan body cut short", "unknown op", "release without a flag", "release with an unknown flag",
                 "unknown store"):
        assert outcomes[what].startswith("reply status 2"), f"{what}: expected an error reply, got {outcomes[what]}"
    assert "malformed frame: unknown release flag 2" in outcomes["release with an unknown flag"], outcomes
    assert outcomes["length below the header size"] != "nothing", outcomes
    bridge.serves()


@pytest.mark.parametrize("authenticated", [False, True], ids=["before-hello", "after-hello"])
def test_data_frame_with_impossible_length_is_rejected_before_allocation(bridge, authenticated):
    """A frame header claiming 2 GiB + 16 bytes (more than the JVM can ever send: its frames
    are Java ByteBuffers) must be refused at once, without allocating it."""
    server = the_server(bridge)
    rss = PeakRss(server)
    sock = authenticated_data_socket(server) if authenticated else data_socket(server)
    sock.sendall(frames.REQUEST_HEAD.pack(0x80000010, frames.OP_GET, 1))
    answer = reply_or_close(sock, timeout=5)
    time.sleep(0.3)
    growth = rss.stop()
    sock.close()
    try:  # let a server that did allocate it give the memory back, so later tests see a sane server
        wait_until(lambda: rss_bytes(server) < rss.baseline + 64 * MiB, 30, "the state server's memory to settle")
    except AssertionError:
        pass
    assert growth < 16 * MiB, (f"a data frame header claiming 2 GiB made the state server (pid {server}) grow by "
                               f"{growth / MiB:.0f} MiB ({answer})")
    assert answer != "nothing", "the frame was neither refused nor the connection closed within 5 s"
    assert alive(server)
    bridge.serves()


def test_hung_state_server_fails_the_batch_within_bounded_time(bridge):
    """SIGSTOP the state server between two batches of a running query (its stores loaded, its
    near cache complete, so the batch's only exchange with the server is the commit shipping
    its changelog over the data channel): the batch must end within 60 s, not hang. The
    bridgeTimeout conf is 5 s."""
    session = bridge.session
    assert session.start_query("steady", bridge.root / "steady-checkpoint", bridge.root / "steady-input")["ok"]
    first = session.feed("steady", ["a", "b", "a"])
    assert first["ok"] and first["counts"] == {"a": 2, "b": 1}, first
    server = the_server(bridge)
    os.kill(server, signal.SIGSTOP)
    try:
        started = time.monotonic()
        session.send({"op": "feed", "name": "steady", "keys": ["a", "c"]})
        try:
            result = session.reply(timeout=60)
        except TimeoutError:
            result = None
        elapsed = time.monotonic() - started
    finally:
        signal_quietly(server, signal.SIGKILL)  # keyedstate may have stopped it already
        signal_quietly(server, signal.SIGCONT)
    assert result is not None, "the batch still hangs 60 s after the state server stopped responding"
    if result["ok"]:  # recovered (e.g. a new server reloaded the state): then exactly
        assert result["counts"] == {"a": 3, "c": 1}, result
    else:
        error = result["error"].lower()
        clear = ("timed out", "timeout", "time out", "did not respond", "not responding", "no response",
                 "did not answer", "unresponsive", "hung")
        assert any(c in error for c in clear), f"unclear error after {elapsed:.0f} s: {result['error'][:1500]}"


def test_hung_state_server_fails_a_control_call_within_bounded_time(bridge):
    """SIGSTOP the state server, then start a query on a new checkpoint: opening its stores is a
    py4j control call (over the callback server's Unix socket), which must end within 60 s, not
    hang, with the bridgeTimeout of 5 s: an error naming the hang, or (a new server) exact counts."""
    session = bridge.session
    # a server to stop, whatever the tests before left: the one a running query's batch uses
    assert session.start_query("warm", bridge.root / "warm-checkpoint", bridge.root / "warm-input")["ok"]
    assert session.feed("warm", ["w"])["ok"]
    server = the_server(bridge)
    os.kill(server, signal.SIGSTOP)
    try:
        started = time.monotonic()
        session.send({"op": "run", "checkpoint": str(bridge.root / "control-checkpoint"),
                      "input": str(bridge.root / "control-input"), "keys": ["x", "y", "x"], "confs": {}})
        try:
            result = session.reply(timeout=60)
        except TimeoutError:
            result = None
        elapsed = time.monotonic() - started
    finally:
        signal_quietly(server, signal.SIGKILL)
        signal_quietly(server, signal.SIGCONT)
    assert result is not None, "starting a query still hangs 60 s after the state server stopped responding"
    if result["ok"]:
        assert result["counts"] == {"x": 2, "y": 1}, result
    else:
        error = result["error"].lower()
        assert "did not answer" in error or "hung" in error, \
            f"unclear error after {elapsed:.0f} s: {result['error'][:1500]}"
