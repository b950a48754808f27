"""An HTTP proxy in front of an S3 API server (moto, support/storage.py) that sees every request an
s3a client makes: it counts them by S3 operation and checkpoint file, and can be switched, per run,
to answer errors (503 SlowDown throttling, 500 InternalError) or to answer slowly for a while, or to
call a hook when a request for a given file arrives (e.g. to kill a process at that moment).

    proxy = S3Proxy(moto.endpoint)                       # proxy.endpoint: s3a's fs.s3a.endpoint
    proxy.fail_for(4.0, status=503)                      # every request for 4 s: 503 SlowDown
    proxy.on_request(lambda r: r.op == "PUT" and ".ks-changelog" in r.key, kill)   # once

Stdlib only: ``http.server`` (HTTP/1.1, keep-alive; 100-continue is answered before the body is
read) and one ``http.client`` connection to the server per proxy thread.
"""
from __future__ import annotations

import collections
import http.client
import http.server
import logging
import re
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger(__name__)

OPS = ("PUT", "GET", "LIST", "HEAD", "DELETE", "COPY")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
               "transfer-encoding", "upgrade", "expect", "content-length"}
_ERRORS = {503: ("SlowDown", "Please reduce your request rate."),
           500: ("InternalError", "We encountered an internal error. Please try again.")}


@dataclass(frozen=True)
class Request:
    """One request as S3 bills it: ``op`` one of OPS (a multipart upload's initiate, part and
    complete are PUTs, a bulk delete is one DELETE), ``key`` the object key (a LIST's prefix)."""
    time: float
    op: str
    key: str
    status: int = 0  # what the client got; set once answered
    injected: bool = False
    size: int = 0  # bytes of the request's body forwarded to the server (a PUT's object or part)
    if_none_match: str = ""  # the request's If-None-Match header ("*": a create refused if the key exists)


def classify(method: str, path: str, headers) -> tuple[str, str]:
    """(operation, key) of a path-style request ``/<bucket>/<key>?<query>``."""
    parsed = urllib.parse.urlsplit(path)
    query = urllib.parse.parse_qs(parsed.query, keep_blank_values=True)
    _, _, key = urllib.parse.unquote(parsed.path).lstrip("/").partition("/")
    if method == "HEAD":
        return "HEAD", key
    if method == "GET":
        if not key and ("list-type" in query or "prefix" in query or "delimiter" in query or "uploads" in query
                        or not query):
            return "LIST", query.get("prefix", [""])[0]
        return "GET", key
    if method == "PUT":
        return ("COPY" if headers.get("x-amz-copy-source") else "PUT"), key
    if method == "POST":
        return ("DELETE" if "delete" in query else "PUT"), key
    if method == "DELETE":
        return "DELETE", key
    return method, key


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # A response's headers and body go out in two writes: with Nagle's algorithm on, the body
    # waits for the client's delayed ACK of the headers (tens of ms per request on loopback).
    disable_nagle_algorithm = True
    server: "_Server"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        log.debug("s3 proxy: " + format, *args)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        proxy = self.server.proxy
        body = self._body()
        op, key = classify(self.command, self.path, self.headers)
        if op == "DELETE" and not key:  # a bulk delete: its first key says what it deletes
            match = re.search(rb"<Key>([^<]*)</Key>", body)
            key = match.group(1).decode(errors="replace") if match else key
        request = Request(time.time(), op, key)
        condition = self.headers.get("If-None-Match", "")
        proxy._before(request)
        fault = proxy._fault_now()
        if fault is not None and fault[0] == "delay":
            time.sleep(fault[1])
            fault = None
        if fault is not None:
            proxy._record(Request(request.time, op, key, fault[1], True, if_none_match=condition))
            self._send_error(fault[1])
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers["Content-Length"] = str(len(body))
        for attempt in (1, 2):  # the server may have closed a kept-alive connection: one new one
            connection = proxy._connection()
            try:
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
                break
            except (OSError, http.client.HTTPException):
                proxy._drop_connection()
                if attempt == 2:
                    raise
        lost = proxy._lost(request)
        if lost:  # the server applied the request; the client is told it failed
            proxy._record(Request(request.time, op, key, lost, True, size=len(body), if_none_match=condition))
            self._send_error(lost)
            return
        proxy._record(Request(request.time, op, key, response.status, size=len(body), if_none_match=condition))
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        if self.command == "HEAD":
            self.send_header("Content-Length", response.getheader("Content-Length", "0"))
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_error(self, status: int) -> None:
        """S3's error answer for ``status`` (one of _ERRORS), in place of the server's."""
        code, message = _ERRORS[status]
        payload = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}'
                   f'</Message><RequestId>proxy</RequestId></Error>').encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(payload) if self.command != "HEAD" else 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    proxy: "S3Proxy"

    def handle_error(self, request, client_address) -> None:
        # a client closing its kept-alive connection (a stopped query) is no error of the proxy's
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            log.debug("s3 proxy: %s closed its connection", client_address)
        else:
            super().handle_error(request, client_address)


class S3Proxy:
    """A proxy on 127.0.0.1 (a port the OS chose) in front of ``upstream`` (``http://host:port``)."""

    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self._upstream = (parsed.hostname, parsed.port)
        self._local = threading.local()
        self._lock = threading.Lock()
        self.requests: list[Request] = []
        self._faults: list[tuple[float, float, str, float]] = []  # (from, until, kind, status or delay)
        self._hooks: list[tuple[Callable[[Request], bool], Callable[[Request], None]]] = []
        self._losses: list[tuple[Callable[[Request], bool], int]] = []
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-proxy", daemon=True)
        self._thread.start()

    # -- faults ---------------------------------------------------------------------------------
    def fail_for(self, seconds: float, status: int = 503, after: float = 0.0) -> None:
        """Answer every request arriving from ``after`` s from now, for ``seconds``, with ``status``
        (503: SlowDown, 500: InternalError) instead of forwarding it."""
        if status not in _ERRORS:
            raise ValueError(f"status {status}: one of {sorted(_ERRORS)}")
        start = time.time() + after
        with self._lock:
            self._faults.append((start, start + seconds, "status", status))

    def slow_for(self, seconds: float, delay: float, after: float = 0.0) -> None:
        """Hold every request arriving in the window ``delay`` s before forwarding it."""
        start = time.time() + after
        with self._lock:
            self._faults.append((start, start + seconds, "delay", delay))

    def on_request(self, matches: Callable[[Request], bool], hook: Callable[[Request], None]) -> None:
        """Call ``hook(request)`` once, for the first request that ``matches``, before it is forwarded."""
        with self._lock:
            self._hooks.append((matches, hook))

    def lose_response(self, matches: Callable[[Request], bool], status: int = 500) -> None:
        """Forward the first request that ``matches`` (the server applies it), then answer the
        client ``status`` instead of the server's answer: a response lost on its way back."""
        if status not in _ERRORS:
            raise ValueError(f"status {status}: one of {sorted(_ERRORS)}")
        with self._lock:
            self._losses.append((matches, status))

    def disarm(self) -> None:
        with self._lock:
            self._faults.clear()
            self._hooks.clear()
            self._losses.clear()

    def _lost(self, request: Request) -> int:
        with self._lock:
            for i, (matches, status) in enumerate(self._losses):
                if matches(request):
                    del self._losses[i]
                    return status
        return 0

    def _fault_now(self) -> tuple[str, float] | None:
        now = time.time()
        with self._lock:
            self._faults = [f for f in self._faults if f[1] > now]
            for start, until, kind, value in self._faults:
                if start <= now:
                    return kind, value
        return None

    def _before(self, request: Request) -> None:
        with self._lock:
            fired = [h for h in self._hooks if h[0](request)]
            self._hooks = [h for h in self._hooks if h not in fired]
        for _, hook in fired:
            hook(request)

    # -- counts ---------------------------------------------------------------------------------
    def _record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def since(self, start: float, until: float | None = None) -> list[Request]:
        """The requests that arrived in [start, until)."""
        with self._lock:
            return [r for r in self.requests if r.time >= start and (until is None or r.time < until)]

    def counts(self, start: float = 0.0, until: float | None = None) -> collections.Counter:
        return collections.Counter(r.op for r in self.since(start, until))

    def injected(self, start: float = 0.0) -> int:
        return sum(1 for r in self.since(start) if r.injected)

    # -- plumbing -------------------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = http.client.HTTPConnection(*self._upstream, timeout=120)
        return connection

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
