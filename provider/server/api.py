"""The state server process and its py4j control API.

The JVM shim starts it (``python -m keyedstate.server``, in its private work directory, importing
nothing from it) with, in its environment, that work directory and two random secrets, one per
use: ``KEYEDSTATE_CALLBACK_SECRET`` (the JVM -> this process's callback server) and
``KEYEDSTATE_DATA_SECRET`` (the data channel's HELLO). It then
1. opens the bulk data channel (a Unix domain socket in its private work dir),
2. starts its py4j callback server on a Unix domain socket beside it (no TCP listener: only this
   user can connect, so no other local user can take the connections the JVM needs; a peer is
   still cut off after a short auth line or :data:`AUTH_TIMEOUT_S` for the whole handshake, a
   connection beyond :data:`MAX_HANDSHAKES` still authenticating is closed at once, and the
   accept loop survives a failed accept or thread start, where py4j's ends for good),
3. says it is ready: its pid and the callback socket's path in the file ``ready`` of its work
   dir, written whole (the JVM opens no listener for it to call).
It exits when its stdin closes, i.e. when the JVM that started it is gone, removing the data
socket's directory if that had to live outside the work dir. Everything it creates is private
(umask 077); its log goes to stderr, which the JVM keeps in a bounded, rotated file, and no
secret reaches it at any level.
"""
from __future__ import annotations

import copy
import ctypes
import hmac
import json
import logging
import os
import re
import secrets
import select
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from py4j import protocol as proto
from py4j.java_gateway import (CallbackConnection, CallbackServer, CallbackServerParameters, GatewayClient,
                               GatewayParameters, PythonProxyPool, quiet_close, quiet_shutdown,
                               server_connection_error, server_connection_started, server_started,
                               server_stopped)

from .. import conf
from .data import ACCEPT_RETRY_S, DataServer, _RateLimitedLog
from .registry import StoreRegistry

log = logging.getLogger("keyedstate.server")

AUTH_TIMEOUT_S = 10.0
"""How long a connection to the callback server may take to authenticate, all of it (one deadline
for the whole exchange, not a timeout per read)."""
MAX_HANDSHAKES = 32
"""How many connections to the callback server may be authenticating at once (py4j gives each a
thread); one more is closed as soon as it is accepted, unread."""
AUTH_LINE_BYTES = 1024
"""The longest line read before a connection has authenticated."""
SOCKET_DIR_MARKER = "socket-dir"
"""A file in the work dir naming the data socket's directory when that is outside it."""
CALLBACK_SOCKET = "callback.sock"
"""The py4j callback server's Unix socket, in the data socket's directory."""
READY_FILE = "ready"
"""The file in the work dir that says the server is ready: its pid, then its callback socket's path."""
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


class StateServerApi:
    """Control calls from the JVM (py4j callbacks); implements the shim's PythonStateServer."""

    class Java:
        implements = ["io.keyedstate.bridge.PythonStateServer"]

    def __init__(self, registry: StoreRegistry, data_path: Path) -> None:
        self.registry = registry
        self.data_path = data_path

    def dataSocketPath(self) -> str:  # noqa: N802 (Java interface names)
        return str(self.data_path)

    def openStore(self, name: str, confs_json: str) -> str:  # noqa: N802
        settings = conf.parse(json.loads(confs_json))
        handle, _ = self.registry.open(name, settings)
        log.info("opened store %s as handle %d", name, handle)
        return json.dumps({"handle": handle, **{k: v for k, v in settings.items()}})

    def restore(self, handle: int, version: int, snapshot_dir: str | None, lineage: str,
                num_keys: int) -> None:
        self.registry.get(handle).restore(version, snapshot_dir, lineage, num_keys)

    def replay(self, handle: int, changelogs_json: str) -> None:
        self.registry.get(handle).replay(
            (int(v), local, origin) for v, local, origin in json.loads(changelogs_json))

    def stageSnapshot(self, handle: int) -> None:  # noqa: N802
        self.registry.get(handle).stage_snapshot()

    def stagedSnapshots(self, handle: int, through: int) -> str:  # noqa: N802
        return json.dumps(self.registry.get(handle).staged_snapshots(through))

    def dropStaged(self, handle: int, version: int) -> None:  # noqa: N802
        self.registry.get(handle).drop_staged(version)

    def storeInfo(self, handle: int) -> str:  # noqa: N802
        return json.dumps(self.registry.get(handle).info())

    def memoryBytes(self, handle: int) -> str:  # noqa: N802 (a string: py4j boxes small ints as Integer)
        return str(self.registry.get(handle).memory_bytes())

    def processMemoryBytes(self) -> str:  # noqa: N802
        """RocksDB memory of this whole process (its pool under a memoryBudget)."""
        return str(self.registry.memory_bytes())

    def closeStore(self, handle: int) -> None:  # noqa: N802
        self.registry.close(handle)


class _AuthFailed(Exception):
    pass


def _auth_line(stream, sock: socket.socket, deadline: float) -> bytes:
    """One line of the auth exchange, at most AUTH_LINE_BYTES (py4j reads lines unbounded), read
    from ``stream`` (``sock``'s buffered reader, which keeps what follows the line) by ``deadline``
    (time.monotonic()), else socket.timeout."""
    line = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("the deadline passed")
        sock.settimeout(remaining)
        buffered = stream.peek(1)  # what is buffered, else one recv
        if not buffered:
            raise _AuthFailed("an auth line that is cut short" if line else "closed before authenticating")
        end = buffered.find(b"\n", 0, AUTH_LINE_BYTES - len(line))
        line += stream.read(end + 1 if end >= 0 else min(len(buffered), AUTH_LINE_BYTES - len(line)))
        if end >= 0:
            return line[:-1]
        if len(line) >= AUTH_LINE_BYTES:
            raise _AuthFailed("an auth line that is too long")


class _GuardedCallbackConnection(CallbackConnection):
    """py4j's callback connection, authenticated here first with bounded lines and one deadline
    (py4j's own auth reads lines of any length and waits for ever)."""

    handshake_slot: threading.BoundedSemaphore | None = None
    """The server's handshake slot this connection holds until it has authenticated or failed to."""

    def run(self):
        params = self.callback_server_parameters
        try:
            try:
                deadline = time.monotonic() + AUTH_TIMEOUT_S
                command = _auth_line(self.input, self.socket, deadline)
                token = _auth_line(self.input, self.socket, deadline)
                _auth_line(self.input, self.socket, deadline)  # py4j's end marker
                if command != proto.AUTH_COMMAND_NAME.encode() or not hmac.compare_digest(
                        token, params.auth_token.encode()):
                    self.socket.sendall(proto.ERROR_RETURN_MESSAGE.encode("utf-8"))
                    raise _AuthFailed("a wrong auth command or token")
                self.socket.sendall(proto.OUTPUT_VOID_COMMAND.encode("utf-8"))
                self.socket.settimeout(params.read_timeout)
            finally:
                if self.handshake_slot is not None:
                    self.handshake_slot.release()
        except (_AuthFailed, OSError, ValueError) as exc:
            log.warning("refused a callback connection: %s", exc if isinstance(exc, _AuthFailed)
                        else type(exc).__name__)
            self.close(reset=True)
            return
        self.callback_server_parameters = copy.copy(params)  # authenticated: py4j serves the rest
        self.callback_server_parameters.auth_token = None
        super().run()


_py4j_log = logging.getLogger("py4j.java_gateway")


class _GuardedCallbackServer(CallbackServer):
    """py4j's callback server on a Unix socket, whose accept loop keeps accepting when accepting or serving one
    connection fails (py4j's ends for good on the first error, e.g. EMFILE while a flood of
    connections holds every file descriptor), and closes a connection at once, unread, while
    :data:`MAX_HANDSHAKES` others are still authenticating."""

    LISTEN_BACKLOG = 128
    """As the data channel's: on a Unix socket a connect beyond the backlog fails at once (EAGAIN)."""

    def __init__(self, *args, unix_path: Path, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.unix_path = unix_path
        self._handshakes = threading.BoundedSemaphore(MAX_HANDSHAKES)
        self._log_accept_error = _RateLimitedLog(log, logging.ERROR)
        self._log_refused = _RateLimitedLog(log, logging.WARNING)

    def start(self):
        """py4j's ``CallbackServer.start`` on the Unix socket ``unix_path`` (a new entry: an
        existing one fails), listening before it returns."""
        self.server_socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.server_socket.bind(str(self.unix_path))
            self.server_socket.listen(self.LISTEN_BACKLOG)
        except OSError as exc:
            quiet_close(self.server_socket)
            raise RuntimeError(f"cannot start the callback server on {self.unix_path}: {exc}") from exc
        self._listening_address, self._listening_port = str(self.unix_path), 0
        self.thread = threading.Thread(target=self.run, name="keyedstate-callback-server",
                                       daemon=self.callback_server_parameters.daemonize)
        self.thread.start()

    def _create_connection(self, socket_instance, stream):
        return _GuardedCallbackConnection(self.pool, stream, socket_instance, self.gateway_client,
                                          self.callback_server_parameters, self)

    def run(self):
        """py4j 0.10.9's ``CallbackServer.run`` (the same signals, logs and shutdown), but each connection is accepted by :meth:`_accept_one`, which contains its
        errors."""
        try:
            with self.lock:
                self.is_shutdown = False
            _py4j_log.info("Callback Server Starting")
            self.server_socket.listen(self.LISTEN_BACKLOG)
            _py4j_log.info("Socket listening on {0}".format(proto.smart_decode(self.server_socket.getsockname())))
            server_started.send(self, server=self)

            read_list = [self.server_socket]
            while not self.is_shutdown:
                readable, _, _ = select.select(read_list, [], [], self.callback_server_parameters.accept_timeout)
                if self.is_shutdown:
                    break
                if readable:
                    self._accept_one()
        except Exception as e:
            if self.is_shutdown:
                _py4j_log.info("Error while waiting for a connection.")
            else:
                server_connection_error.send(self, error=e)
                _py4j_log.exception("Error while waiting for a connection.")

        server_stopped.send(self, server=self)

    def _accept_one(self) -> None:
        """Accept and start serving one connection; an OSError or RuntimeError (no descriptor,
        no thread, ...) is logged and the server waits :data:`ACCEPT_RETRY_S` before the next."""
        try:
            socket_instance, _ = self.server_socket.accept()
        except OSError as exc:
            if not self.is_shutdown:
                self._log_accept_error("callback server: could not accept a connection (%s); accepting again", exc)
                time.sleep(ACCEPT_RETRY_S)
            return
        if not self._handshakes.acquire(blocking=False):
            quiet_close(socket_instance)
            self._log_refused("callback server: closed a new connection: %d others are still authenticating",
                              MAX_HANDSHAKES)
            return
        started = False
        try:
            if self.callback_server_parameters.read_timeout:
                socket_instance.settimeout(self.callback_server_parameters.read_timeout)
            if self.ssl_context:
                socket_instance = self.ssl_context.wrap_socket(socket_instance, server_side=True)
            connection = self._create_connection(socket_instance, socket_instance.makefile("rb"))
            connection.handshake_slot = self._handshakes
            with self.lock:
                if not self.is_shutdown:
                    self.connections.add(connection)
                    connection.start()
                    started = True
                    server_connection_started.send(self, connection=connection)
                else:
                    quiet_shutdown(connection.socket)
                    quiet_close(connection.socket)
        except (OSError, RuntimeError) as exc:
            if not started:
                quiet_close(socket_instance)
            if not self.is_shutdown:
                self._log_accept_error("callback server: could not serve a connection (%s); accepting again", exc)
                time.sleep(ACCEPT_RETRY_S)
        finally:
            if not started:
                self._handshakes.release()


def start_callback_server(api: object, path: Path, secret: str) -> _GuardedCallbackServer:
    """The py4j callback server serving ``api`` (a :class:`StateServerApi`) as its entry point on
    the Unix socket ``path``, listening when it returns.
    Its gateway client is one that reaches nothing: the JVM passes only strings and numbers, and
    this process never calls into the JVM."""
    pool = PythonProxyPool()
    pool.put(api, proto.ENTRY_POINT_OBJECT_ID)
    server = _GuardedCallbackServer(
        pool, GatewayClient(gateway_parameters=GatewayParameters(port=1)), unix_path=path,
        callback_server_parameters=CallbackServerParameters(
            port=0, auth_token=secret, daemonize=True, daemonize_connections=True))
    server.start()
    return server


class _RedactingFormatter(logging.Formatter):
    """Writes every record with the process's secrets blanked out, whatever logged them."""

    def __init__(self, fmt: str, secrets_: list[str]) -> None:
        super().__init__(fmt)
        self._secrets = [s for s in secrets_ if s]

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "<redacted>")
        return text


def _configure_logging(secrets_: list[str]) -> None:
    level = os.environ.get("KEYEDSTATE_LOG_LEVEL", "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", secrets_))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # py4j logs every command it sends at DEBUG (the auth command with its token among them) and
    # every callback at INFO: never below WARNING, whatever the level asked for.
    logging.getLogger("py4j").setLevel(logging.WARNING)

    def excepthook(args) -> None:  # uncaught thread errors go through the redacting log too
        if args.exc_type is not SystemExit:
            log.error("uncaught error in thread %s", getattr(args.thread, "name", "?"),
                      exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

    threading.excepthook = excepthook


def _socket_path(workdir: Path) -> tuple[Path, Path | None]:
    """The data socket, in the private work dir unless that path is too long for AF_UNIX
    (108 bytes); then in a fresh private directory ``ks-<random>`` under $TMPDIR (or /tmp),
    named in the work dir's SOCKET_DIR_MARKER first so that whoever cleans up the work dir
    finds it. Returns the socket path and that directory (None when inside the work dir)."""
    path = workdir / "data.sock"
    if len(str(path).encode()) < 100:
        return path, None
    base = Path(tempfile.gettempdir())
    if len(str(base).encode()) > 70:
        base = Path("/tmp")
    _remove_abandoned_socket_dirs(base)
    short = base / f"ks-{secrets.token_hex(8)}"
    (workdir / SOCKET_DIR_MARKER).write_text(str(short))
    short.mkdir(mode=0o700)  # never an existing entry (a planted one fails here)
    return short / "data.sock", short


_SOCKET_DIR_NAME = re.compile(r"ks-[0-9a-f]{16}")
_SOCKET_DIR_GRACE_S = 60.0
"""A socket directory this young may be a starting server's that has not bound its socket yet."""


def _remove_abandoned_socket_dirs(base: Path) -> None:
    """Remove the ``ks-<16 hex>`` socket directories under ``base`` whose server is gone. The JVM
    removes a dead server's directory through the marker in its work dir; when the work dir went
    first (an executor killed, its local dirs deleted by the cluster manager) nobody would, and
    each such server left one in /tmp for good. Only this user's directories, never through a
    link, holding nothing but a ``data.sock`` nobody listens on (connecting is refused) and
    perhaps the server's :data:`CALLBACK_SOCKET`, and older
    than a minute are removed, and only on a local file system (a socket of another host refuses
    connections too); anything else is left alone."""
    if not _on_local_file_system(base):
        return  # a temp dir shared between hosts: another host's live socket refuses us too
    uid = os.getuid()
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    for entry in entries:
        if not _SOCKET_DIR_NAME.fullmatch(entry.name):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if (not stat.S_ISDIR(info.st_mode) or info.st_uid != uid
                    or time.time() - info.st_mtime < _SOCKET_DIR_GRACE_S
                    or "data.sock" not in (names := os.listdir(entry.path))
                    or not set(names) <= {"data.sock", CALLBACK_SOCKET}):
                continue
            sock = Path(entry.path, "data.sock")
            if not stat.S_ISSOCK(sock.lstat().st_mode) or _listening(sock):
                continue
            for name in names:
                Path(entry.path, name).unlink()
            os.rmdir(entry.path)
            log.info("removed the data socket directory %s of a state server that is gone", entry.path)
        except OSError:  # raced with its owner or another sweeper: leave it
            continue


_LOCAL_FILE_SYSTEMS = frozenset({"tmpfs", "ext2", "ext3", "ext4", "xfs", "btrfs", "overlay", "f2fs", "zfs"})


def _on_local_file_system(path: Path) -> bool:
    """Whether ``path`` is on a file system of this host alone (its mount's type, from
    /proc/self/mountinfo; False when that cannot be told, e.g. not Linux)."""
    try:
        target = os.path.realpath(path)
        best, kind = "", None
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mounts:
            for line in mounts:
                fields, _, rest = line.partition(" - ")
                point = fields.split()[4].replace("\\040", " ")
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, rest.split()[0]
        return kind in _LOCAL_FILE_SYSTEMS
    except (OSError, IndexError):
        return False


def _listening(path: Path) -> bool:
    """Whether a process accepts connections on the Unix socket ``path`` (a live state server
    takes a connection that sends nothing as a peer that went away)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
        return True
    except ConnectionRefusedError:
        return False
    except OSError:  # a timeout or anything unexpected: assume it lives
        return True
    finally:
        probe.close()


def _return_large_buffers_to_the_os() -> None:
    """Fix glibc's mmap and trim thresholds at 128 KiB. glibc otherwise raises them to the largest
    block freed so far (up to 32 MiB on 64-bit), and from then on serves the changelogs,
    write batches and compaction buffers of every batch from heaps that keep freed memory
    resident, so a server's peak RSS would follow its largest batch ever, not its current one."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # this process's C library, no subprocess to find it
    except (OSError, AttributeError):  # not glibc: its allocator has no such thresholds
        return
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if not (mallopt(_M_MMAP_THRESHOLD, 128 << 10) and mallopt(_M_TRIM_THRESHOLD, 128 << 10)):
        log.warning("could not fix the C allocator's mmap threshold; freed buffers may stay resident")


def main() -> None:
    os.umask(0o077)  # everything this process creates is its user's alone
    callback_secret = os.environ.pop("KEYEDSTATE_CALLBACK_SECRET")
    data_secret = os.environ.pop("KEYEDSTATE_DATA_SECRET")
    _configure_logging([callback_secret, data_secret])
    _return_large_buffers_to_the_os()  # before any thread starts: mallopt is not thread-safe
    workdir = Path(os.environ["KEYEDSTATE_WORK_DIR"])
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (workdir / "pid").write_text(str(os.getpid()))

    socket_path, socket_dir = _socket_path(workdir)

    def exit_now(*_: Any) -> None:
        if socket_dir is not None:
            shutil.rmtree(socket_dir, ignore_errors=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, exit_now)
    registry = StoreRegistry(workdir)
    data = DataServer(registry, socket_path, data_secret.encode())
    data.start()
    api = StateServerApi(registry, data.path)
    callback_path = socket_path.with_name(CALLBACK_SOCKET)
    start_callback_server(api, callback_path, callback_secret)
    pending = workdir / f".{READY_FILE}.new"
    pending.write_text(f"{os.getpid()}\n{callback_path}\n")
    pending.rename(workdir / READY_FILE)  # whole, or not there
    log.info("keyedstate state server %d ready (work dir %s)", os.getpid(), workdir)

    sys.stdin.buffer.read()  # returns when the JVM closes our stdin or dies
    log.info("JVM gone; state server %d exiting", os.getpid())
    exit_now()


if __name__ == "__main__":
    main()
