"""The state server's py4j callback server, hardened.

It listens on a Unix domain socket (no TCP listener: only this user can connect, so no other
local user can take the connections the JVM needs); a peer is still cut off after a short auth
line or :data:`AUTH_TIMEOUT_S` for the whole handshake, a connection beyond
:data:`MAX_HANDSHAKES` still authenticating is closed at once, and the accept loop survives a
failed accept or thread start, where py4j's ends for good.
"""
from __future__ import annotations

import copy
import hmac
import logging
import select
import socket
import threading
import time
from pathlib import Path

from py4j import protocol as proto
from py4j.java_gateway import (CallbackConnection, CallbackServer, CallbackServerParameters, GatewayClient,
                               GatewayParameters, PythonProxyPool, quiet_close, quiet_shutdown,
                               server_connection_error, server_connection_started, server_started,
                               server_stopped)

from .data import ACCEPT_RETRY_S
from .rate_limited_log import RateLimitedLog

log = logging.getLogger("keyedstate.server")

AUTH_TIMEOUT_S = 10.0
"""How long a connection to the callback server may take to authenticate, all of it (one deadline
for the whole exchange, not a timeout per read)."""
MAX_HANDSHAKES = 32
"""How many connections to the callback server may be authenticating at once (py4j gives each a
thread); one more is closed as soon as it is accepted, unread."""
AUTH_LINE_BYTES = 1024
"""The longest line read before a connection has authenticated."""

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
        self._log_accept_error = RateLimitedLog(log, logging.ERROR)
        self._log_refused = RateLimitedLog(log, logging.WARNING)

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
