"""The bulk data channel: GET/SCAN/APPLY/... frames (formats/frames.py) on a Unix domain socket.

Every connection starts with a HELLO frame carrying the data-channel secret the JVM gave this
server; anything else, or a wrong secret, gets an ERROR reply and the connection is closed. Until
then a peer may hold a connection for :data:`HELLO_TIMEOUT_S` in all (however slowly it sends),
make the server allocate nothing beyond a fixed-size header, and hold one of the
:data:`MAX_HANDSHAKES` threads that serve handshakes (a connection beyond them is closed at once,
unread). The accept loop survives a failed accept (out of file descriptors) or thread start. A
request longer than its op can be is refused before its body is allocated; a malformed request
fails that exchange with an ERROR reply, never the server.
"""
from __future__ import annotations

import hmac
import logging
import mmap
import os
import socket
import threading
import time
from pathlib import Path

from ..formats import changelog
from ..formats import frames as f
from .rate_limited_log import RateLimitedLog
from .registry import StoreRegistry

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0
"""How long a new connection may take to say HELLO, all of it (one deadline for the whole
handshake, not a timeout per read: a peer sending a byte at a time is closed when it is up)."""
MAX_HANDSHAKES = 32
"""How many connections may be in their handshake at once (each has a thread); one more is
closed as soon as it is accepted, unread. Authenticated connections are not counted."""
ACCEPT_RETRY_S = 0.05
"""How long a listener waits before accepting again after accept() or a thread start failed
(EMFILE, ENFILE, ENOMEM, no thread left, ...): that condition usually lasts a while, and an
accept that fails at once must not spin."""


class _UnknownStore(Exception):
    """A frame names a store handle that is not open here."""


class _Closed(Exception):
    """The peer closed the connection (cleanly between frames, or in the middle of one)."""


class DataServer:
    """Serves frames on a Unix domain socket in the server's private directory, one thread per
    connection (the JVM keeps a small pool of connections, one per concurrent task)."""

    def __init__(self, registry: StoreRegistry, path: Path, secret: bytes) -> None:
        self.registry = registry
        self.path = path
        self._secret = secret
        if path.exists():
            path.unlink()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        os.chmod(path, 0o600)
        self._sock.listen(128)
        self._handshakes = threading.BoundedSemaphore(MAX_HANDSHAKES)
        self._log_accept_error = RateLimitedLog(log, logging.ERROR)
        self._log_refused = RateLimitedLog(log, logging.WARNING)

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, name="keyedstate-data-accept", daemon=True).start()

    def _accept_loop(self) -> None:
        while self._sock.fileno() != -1:  # for as long as the socket is open, whatever fails
            try:
                conn, _ = self._sock.accept()
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS, ...: the next accept may succeed
                if self._sock.fileno() == -1:
                    return
                self._log_accept_error("data channel: could not accept a connection (%s); accepting again",
                                       exc)
                time.sleep(ACCEPT_RETRY_S)
                continue
            if not self._handshakes.acquire(blocking=False):
                conn.close()
                self._log_refused("data channel: closed a new connection: %d others are still in their "
                                  "handshake", MAX_HANDSHAKES)
                continue
            try:
                threading.Thread(target=self._serve, args=(conn,), name="keyedstate-data",
                                 daemon=True).start()
            except RuntimeError as exc:  # no thread can be started now
                self._handshakes.release()
                conn.close()
                self._log_accept_error("data channel: could not serve a connection (%s); accepting again",
                                       exc)
                time.sleep(ACCEPT_RETRY_S)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                try:
                    authenticated = self._hello(conn)
                finally:
                    self._handshakes.release()
                if authenticated:
                    self._serve_frames(conn)
            except _Closed as closed:
                if str(closed):
                    log.debug("data channel: %s", closed)
            except OSError as exc:  # reset by the peer, timed out, ...
                log.debug("data channel closed: %s", exc)

    def _hello(self, conn: socket.socket) -> bool:
        """Reads and checks the first frame; False (after an ERROR reply) when it is no valid HELLO."""
        deadline = time.monotonic() + HELLO_TIMEOUT_S
        head = bytearray(f.REQUEST_HEAD.size)
        try:
            if not _recv_exact(conn, memoryview(head), deadline):
                return False
        except socket.timeout:
            raise _Closed("no hello within the timeout") from None
        length, op, _ = f.REQUEST_HEAD.unpack(head)
        if op != f.OP_HELLO or not 5 < length <= 5 + f.max_body(f.OP_HELLO):
            log.warning("data channel: refused a connection whose first frame is not a hello "
                        "(op %d, length %d)", op, length)
            _reply(conn, f.STATUS_ERROR, b"the first frame of a connection must be a hello with the "
                                         b"data-channel secret")
            return False
        body = bytearray(length - 5)
        try:
            if not _recv_exact(conn, memoryview(body), deadline):
                return False
        except socket.timeout:
            raise _Closed("hello cut short") from None
        try:
            hello = f.hello_request(body)
        except f.FrameError as exc:
            _reply(conn, f.STATUS_ERROR, f"malformed hello: {exc}".encode())
            return False
        if hello.protocol != f.PROTOCOL_VERSION:
            _reply(conn, f.STATUS_ERROR, f"data-channel protocol {hello.protocol} is not this server's "
                                         f"{f.PROTOCOL_VERSION}: the shim jar and the keyedstate package "
                                         f"differ".encode())
            return False
        if not hmac.compare_digest(hello.secret, self._secret):
            log.warning("data channel: refused a connection with a wrong secret")
            _reply(conn, f.STATUS_ERROR, b"wrong data-channel secret")
            return False
        conn.settimeout(None)
        _reply(conn, f.STATUS_OK, b"")
        return True

    def _serve_frames(self, conn: socket.socket) -> None:
        head = bytearray(f.REQUEST_HEAD.size)
        while True:
            if not _recv_exact(conn, memoryview(head)):
                return
            length, op, handle = f.REQUEST_HEAD.unpack(head)
            if length < 5:
                # The frame cannot even hold its own head: the stream is out of step for good.
                _reply(conn, f.STATUS_ERROR, f"malformed frame: length {length} is below the 5 bytes of "
                                             f"its op and handle".encode())
                return
            if length - 5 > f.max_body(op):
                _reply(conn, f.STATUS_ERROR, f"malformed frame: a body of {length - 5} bytes is more than "
                                             f"op {op} can have ({f.max_body(op)})".encode())
                return
            try:
                body = _frame_body(length - 5)
            except (OSError, MemoryError) as exc:  # the body stays unread: the stream is out of step
                log.error("data channel: no memory for a frame of %d bytes (op %d): %s", length - 5, op, exc)
                _reply(conn, f.STATUS_ERROR, f"the state server could not allocate {length - 5} bytes for a "
                                             f"frame of op {op}: {exc}".encode())
                return
            if body and not _recv_exact(conn, memoryview(body)):
                raise _Closed("the peer closed the data channel in the middle of a frame")
            try:
                status, reply = self._dispatch(op, handle, body)
            except f.FrameError as exc:  # the request is malformed: that exchange fails
                log.warning("data op %s on store %s: malformed frame: %s", op, handle, exc)
                status, reply = f.STATUS_ERROR, f"malformed frame: {exc}".encode()
            except _UnknownStore as exc:
                log.warning("data op %s: %s", op, exc)
                status, reply = f.STATUS_ERROR, str(exc).encode()
            except Exception as exc:  # reported to the JVM, which fails the task
                log.exception("data op %s on store %s failed", op, handle)
                status, reply = f.STATUS_ERROR, f"{type(exc).__name__}: {exc}".encode()
            body = None  # a changelog applied behind or held must not stay alive here until the next frame
            _reply(conn, status, reply)

    def _dispatch(self, op: int, handle: int, body: bytearray | mmap.mmap) -> tuple[int, bytes]:
        if op == f.OP_HELLO:
            raise f.FrameError("a second hello on one connection")
        if op not in (f.OP_GET, f.OP_MULTI_GET, f.OP_SCAN, f.OP_APPLY, f.OP_TTL_CANDIDATES, f.OP_SYNC,
                      f.OP_RELEASE):
            raise f.FrameError(f"unknown data op {op}")
        if op == f.OP_GET:
            value = self._store(handle).get(bytes(body))
            return (f.STATUS_NOT_FOUND, b"") if value is None else (f.STATUS_OK, value)
        if op == f.OP_MULTI_GET:
            keys = f.multi_get_request(body)
            return f.STATUS_OK, f.multi_get_reply(self._store(handle).get_many(keys))
        if op == f.OP_SCAN:
            request = f.scan_request(body)
            entries, more = self._store(handle).scan(request.prefix, request.start_after, request.max_bytes,
                                                     keys_only=request.keys_only)
            return f.STATUS_OK, f.scan_reply(entries, more)
        if op == f.OP_APPLY:
            request = f.apply_request(body)
            store = self._store(handle)
            source = f"changelog of {store.name}"
            # Checked here (a CRC-32, cheap beside the apply), so a corrupt ship fails its commit;
            # a large frame's records are then read in place (see _frame_body).
            log_ = changelog.decode(body, source, offset=len(body) - len(request.changelog))
            request.changelog.release()
            if request.mode == f.APPLY_HOLD:
                store.hold(log_, source, request.ttl)
                return f.STATUS_OK, f.count_reply(0)
            if request.mode == f.APPLY_BEHIND:
                store.submit(log_, source, request.ttl)
                return f.STATUS_OK, f.count_reply(0)
            return f.STATUS_OK, f.count_reply(store.apply(log_, source, request.ttl))
        if op == f.OP_RELEASE:
            apply = f.release_request(body)
            self._store(handle).release(apply)
            return f.STATUS_OK, b""
        if op == f.OP_TTL_CANDIDATES:
            return f.STATUS_OK, f.ttl_candidates_reply(*self._store(handle).take_ttl_candidates())
        return f.STATUS_OK, f.sync_reply(*self._store(handle).sync())

    def _store(self, handle: int):
        try:
            return self.registry.get(handle)
        except KeyError as exc:  # a frame naming no open store: that exchange fails
            raise _UnknownStore(exc.args[0]) from None


IN_PLACE_FRAME_BYTES = 1 << 20
"""Frames of at least this size are received into an anonymous mapping, not a bytearray: a
changelog in one is applied in place and its pages go back to the system as its records are
written (``Changelog.discard_before``), and the whole mapping when it is dropped, never left
to fragment the heap. (A bytearray would hold the frame and its decoded copy at once.)"""


def _frame_body(size: int) -> bytearray | mmap.mmap:
    """A buffer for a frame body of ``size`` bytes (see :data:`IN_PLACE_FRAME_BYTES`). A mapping
    takes memory only as bytes arrive, where a bytearray is zeroed whole at once."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE) if size >= IN_PLACE_FRAME_BYTES else bytearray(size)


def _reply(conn: socket.socket, status: int, reply: bytes) -> None:
    head_bytes = f.response_head(status, len(reply))
    if len(reply) < 65536:  # one syscall for the common small reply
        conn.sendall(head_bytes + reply)
    else:  # do not copy a large reply just to prepend five bytes
        conn.sendall(head_bytes)
        conn.sendall(reply)


def _recv_exact(conn: socket.socket, view: memoryview, deadline: float | None = None) -> bool:
    """Fill ``view``; False on a clean EOF before the first byte. With a ``deadline``
    (time.monotonic(), the handshake's), socket.timeout once it passes, however slowly the peer
    sends; the socket's timeout is then left at what remained of it."""
    got = 0
    while got < len(view):
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("the deadline passed")
            conn.settimeout(remaining)
        n = conn.recv_into(view[got:])
        if n == 0:
            if got == 0:
                return False
            raise _Closed("the peer closed the data channel in the middle of a frame")
        got += n
    return True
