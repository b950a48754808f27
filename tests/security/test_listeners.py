"""The state server's listeners give an unauthenticated peer nothing, not even a thread for long.

Both of the state server's listeners (the data channel's and the py4j callback server's Unix
sockets) must
- keep accepting after accept() fails (EMFILE when the process is out of file descriptors):
  an authenticated client is served again as soon as descriptors are free;
- close a connection whose whole handshake is not done within its deadline
  (data.HELLO_TIMEOUT_S, api.AUTH_TIMEOUT_S), however slowly its peer keeps sending;
- close at once, unread, a connection beyond the few (data.MAX_HANDSHAKES,
  api.MAX_HANDSHAKES) still authenticating, so that a flood of idle peers holds a bounded
  number of threads.

The listeners are the real classes a state server runs (``DataServer`` and
``_GuardedCallbackServer``, started as ``server/api.py main()`` starts them) hosted without a JVM
in a child process (this file run as a script), so that its file descriptor limit can be lowered
and its descriptors exhausted on request; the secrets reach it as they reach a state server,
in its environment."""
from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keyedstate.formats import frames
from keyedstate.server.api import AUTH_TIMEOUT_S
from keyedstate.server.data import HELLO_TIMEOUT_S
from support.processes import answer

pytestmark = pytest.mark.timeout(120)

CAP = 32  # the handshakes a listener serves at once (data.MAX_HANDSHAKES, api.MAX_HANDSHAKES)


# -- the host: the state server's two listeners in a child process --------------------------------

def _host(workdir: str, nofile: str) -> None:
    """Runs a state server's listeners until stdin closes; on stdin ``exhaust`` takes every free
    file descriptor, on ``release`` gives them back (each answered with a line on stdout)."""
    import resource

    from keyedstate.server import api
    from keyedstate.server.data import DataServer
    from keyedstate.server.registry import StoreRegistry

    data_secret = os.environ.pop("KEYEDSTATE_DATA_SECRET")
    callback_secret = os.environ.pop("KEYEDSTATE_CALLBACK_SECRET")
    api._configure_logging([data_secret, callback_secret])
    if int(nofile):
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(nofile), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    root = Path(workdir)
    data = DataServer(StoreRegistry(root / "stores"), root / "data.sock", data_secret.encode())
    data.start()
    callback = api.start_callback_server(object(), root / api.CALLBACK_SOCKET, callback_secret)
    print(json.dumps({"data": str(data.path), "callback": callback.get_listening_address()}), flush=True)
    held: list[int] = []
    for line in sys.stdin:
        if line.strip() == "exhaust":
            try:
                while True:
                    held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                print(f"exhausted {len(held)} {exc.errno}", flush=True)
        elif line.strip() == "release":
            for fd in held:
                os.close(fd)
            held.clear()
            print("released", flush=True)


class Host:
    def __init__(self, workdir: Path, nofile: int = 0) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.data_secret = secrets.token_hex(32)
        self.callback_secret = secrets.token_hex(32)
        self.log_path = workdir / "host.log"
        tests_dir = str(Path(__file__).resolve().parents[1])  # this file imports from support/
        env = {**os.environ, "KEYEDSTATE_DATA_SECRET": self.data_secret,
               "KEYEDSTATE_CALLBACK_SECRET": self.callback_secret,
               "PYTHONPATH": os.pathsep.join(filter(None, [tests_dir, os.environ.get("PYTHONPATH")]))}
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, __file__, str(workdir), str(nofile)], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        ready = self.proc.stdout.readline()
        assert ready, f"the listeners' host did not start: {self.log()}"
        info = json.loads(ready)
        self.pid, self.data_path, self.callback_path = self.proc.pid, info["data"], info["callback"]

    def command(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def threads(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        raise ValueError(f"no thread count for pid {self.pid}")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()


@pytest.fixture
def start_host(tmp_path_factory):
    hosts = []

    def start(nofile: int = 0) -> Host:
        host = Host(tmp_path_factory.mktemp("listeners"), nofile)
        hosts.append(host)
        return host

    yield start
    for host in hosts:
        host.stop()
        log = host.log()
        assert host.data_secret not in log and host.callback_secret not in log
        assert "<redacted>" not in log, f"something logged a secret (redacted): {log[-2000:]}"


# -- clients ------------------------------------------------------------------------------------

def connect(host: Host, listener: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(host.data_path if listener == "data" else host.callback_path)
    return sock


def handshake(host: Host, listener: str, secret: str | None = None) -> bytes:
    """The first bytes a client with the secret sends."""
    if listener == "data":
        body = frames.U16.pack(frames.PROTOCOL_VERSION) + (secret or host.data_secret).encode()
        return frames.REQUEST_HEAD.pack(5 + len(body), frames.OP_HELLO, 0) + body
    return f"A\n{secret or host.callback_secret}\ne\n".encode()


def served(host: Host, listener: str, sock: socket.socket | None = None, timeout: float = 5.0) -> str:
    """Authenticate (on ``sock`` when given: its handshake already sent) and make one request
    past the handshake; 'served' or what went wrong."""
    if sock is None:
        sock = connect(host, listener)
        sock.sendall(handshake(host, listener))
    with sock:
        first = answer(sock, timeout)
        if listener == "data":
            if first != frames.response_head(frames.STATUS_OK, 0):
                return f"hello answered {first!r}"
            sock.sendall(frames.REQUEST_HEAD.pack(5, frames.OP_SYNC, 987654))  # no such store: an error reply
            second = answer(sock, timeout)
            ok = isinstance(second, bytes) and second[4:5] == bytes([frames.STATUS_ERROR]) and b"987654" in second
        else:
            if first != b"!yv\n":
                return f"auth answered {first!r}"
            sock.sendall(b"g\nno-such-proxy\ne\n")  # py4j's garbage-collect command: '!y'
            second = answer(sock, timeout)
            ok = second == b"!y\n"
        return "served" if ok else f"authenticated, then a request answered {second!r}"


def closed_soon(sock: socket.socket, within: float) -> bool:
    return answer(sock, within) == "closed"


# -- tests --------------------------------------------------------------------------------------

@pytest.mark.parametrize("listener", ["data", "callback"])
def test_a_listener_accepts_again_after_accept_fails_with_emfile(start_host, listener):
    """accept() fails with EMFILE while the process has no free descriptor (e.g. during a
    connection flood): once descriptors are free again, the client that waited is served, and so
    is a new one. Failed before: the accept loop ended on the first error, for good."""
    host = start_host(nofile=128)
    time.sleep(0.3)
    baseline = host.threads()
    assert served(host, listener) == "served"
    deadline = time.monotonic() + 10  # the server closed that connection (or exhausting leaves its descriptor)
    while host.threads() > baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    outcome = host.command("exhaust")
    assert outcome.startswith("exhausted") and outcome.endswith(" 24"), outcome  # EMFILE
    # In the listen backlog. An accept() already waiting in the kernel may take it with the
    # descriptor it reserved before they ran out; the one after it fails with EMFILE.
    waiting = connect(host, listener)
    waiting.sendall(handshake(host, listener))
    deadline = time.monotonic() + 10
    while "Too many open files" not in host.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "Too many open files" in host.log(), f"accept() never failed with EMFILE: {host.log()[-2000:]}"
    time.sleep(0.5)  # more failed attempts
    assert host.command("release") == "released"
    assert served(host, listener, waiting) == "served"
    assert served(host, listener) == "served"


def test_a_slow_unauthenticated_peer_is_closed_when_the_handshake_time_is_up(start_host):
    """A peer that sends a byte of its handshake every second (each well within the timeout of one
    read) is closed when the handshake's time is up, counted from the connection, not held
    for the hours its allowance would take at that pace."""
    host = start_host()
    deadlines = {"data": HELLO_TIMEOUT_S, "callback": AUTH_TIMEOUT_S}
    payloads = {"data": handshake(host, "data", secret="0" * 64),  # 75 bytes: 75 s at a byte a second
                "callback": b"A\n" + b"x" * 200}
    socks = {name: connect(host, name) for name in deadlines}
    started = time.monotonic()
    closed_after: dict[str, float] = {}
    sent = 0
    while len(closed_after) < len(socks) and time.monotonic() - started < max(deadlines.values()) + 6:
        for name, sock in socks.items():
            if name in closed_after:
                continue
            try:
                sock.sendall(payloads[name][sent:sent + 1])
            except OSError:
                closed_after[name] = time.monotonic() - started
        sent += 1
        next_byte = started + sent
        for name, sock in socks.items():  # until the next byte is due: has the listener closed it?
            if name not in closed_after and closed_soon(sock, max(0.01, next_byte - time.monotonic())):
                closed_after[name] = time.monotonic() - started
        time.sleep(max(0.0, next_byte - time.monotonic()))
    for sock in socks.values():
        sock.close()
    for name, deadline in deadlines.items():
        assert name in closed_after, (f"{name}: a peer sending a byte a second was still connected after "
                                      f"{time.monotonic() - started:.0f} s (its handshake deadline is {deadline} s)")
        assert deadline - 1 <= closed_after[name] <= deadline + 3, \
            f"{name}: closed after {closed_after[name]:.1f} s; its handshake deadline is {deadline} s"
    assert served(host, "data") == "served" and served(host, "callback") == "served"


@pytest.mark.parametrize("listener", ["data", "callback"])
def test_unauthenticated_connections_beyond_a_few_are_closed_at_once(start_host, listener):
    """48 idle connections: all but the few allowed to authenticate at once are closed at once,
    unread, the server holds no thread for them, and once the idle peers leave an authenticated
    client is served. Failed before: every connection kept a thread until its timeout. (A few
    more than the cap will do.)"""
    host = start_host()
    time.sleep(0.3)
    baseline = host.threads()
    flood = [connect(host, listener) for _ in range(48)]
    try:
        time.sleep(0.5)
        threads = host.threads()
        kept = sum(not closed_soon(sock, 0.02) for sock in flood)
        assert kept <= CAP, f"{kept} of 48 idle unauthenticated connections still open"
        assert threads <= baseline + CAP + 1, f"48 idle unauthenticated connections took {threads - baseline} threads"
    finally:
        for sock in flood:
            sock.close()
    deadline = time.monotonic() + 10  # the idle peers' threads see them go and end
    while host.threads() > baseline and time.monotonic() < deadline:
        time.sleep(0.1)
    assert served(host, listener) == "served"


if __name__ == "__main__":
    _host(*sys.argv[1:])
