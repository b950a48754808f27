"""The bulk data channel: GET/SCAN/APPLY/... frames (formats/frames.py) on a Unix domain socket."""
from __future__ import annotations

import logging
import os
import socket
import threading
from pathlib import Path

from ..formats import frames as f
from .registry import StoreRegistry

log = logging.getLogger(__name__)


class DataServer:
    """Serves frames on a Unix domain socket in the server's private directory, one thread per
    connection (the JVM keeps a small pool of connections, one per concurrent task)."""

    def __init__(self, registry: StoreRegistry, path: Path) -> None:
        self.registry = registry
        self.path = path
        if path.exists():
            path.unlink()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        os.chmod(path, 0o600)
        self._sock.listen(128)

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, name="keyedstate-data-accept", daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            conn, _ = self._sock.accept()
            threading.Thread(target=self._serve, args=(conn,), name="keyedstate-data",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            head = bytearray(f.REQUEST_HEAD.size)
            while True:
                if not _recv_exact(conn, memoryview(head)):
                    return
                length, op, handle = f.REQUEST_HEAD.unpack(head)
                body = bytearray(length - 5)
                if body and not _recv_exact(conn, memoryview(body)):
                    return
                try:
                    status, reply = self._dispatch(op, handle, body)
                except Exception as exc:  # reported to the JVM, which fails the task
                    log.exception("data op %s on store %s failed", op, handle)
                    status, reply = f.STATUS_ERROR, f"{type(exc).__name__}: {exc}".encode()
                head_bytes = f.response_head(status, len(reply))
                if len(reply) < 65536:  # one syscall for the common small reply
                    conn.sendall(head_bytes + reply)
                else:  # do not copy a large reply just to prepend five bytes
                    conn.sendall(head_bytes)
                    conn.sendall(reply)

    def _dispatch(self, op: int, handle: int, body: bytearray) -> tuple[int, bytes]:
        store = self.registry.get(handle)
        if op == f.OP_GET:
            value = store.get(bytes(body))
            return (f.STATUS_NOT_FOUND, b"") if value is None else (f.STATUS_OK, value)
        if op == f.OP_MULTI_GET:
            return f.STATUS_OK, f.multi_get_reply(store.get_many(f.multi_get_request(body)))
        if op == f.OP_SCAN:
            request = f.scan_request(body)
            entries, more = store.scan(request.prefix, request.start_after, request.max_bytes,
                                       keys_only=request.keys_only)
            return f.STATUS_OK, f.scan_reply(entries, more)
        if op == f.OP_APPLY:
            request = f.apply_request(body)  # the changelog is a view of body, which is ours alone
            source = f"changelog of {store.name}"
            if request.behind:
                store.submit(request.changelog, source, request.ttl)
                return f.STATUS_OK, f.count_reply(0)
            return f.STATUS_OK, f.count_reply(store.apply(request.changelog, source, request.ttl))
        if op == f.OP_TTL_CANDIDATES:
            return f.STATUS_OK, f.ttl_candidates_reply(*store.take_ttl_candidates())
        if op == f.OP_SYNC:
            return f.STATUS_OK, f.sync_reply(*store.sync())
        raise f.FrameError(f"unknown data op {op}")


def _recv_exact(conn: socket.socket, view: memoryview) -> bool:
    """Fill ``view``; False on a clean EOF before the first byte."""
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            if got == 0:
                return False
            raise ConnectionError("data channel closed mid-frame")
        got += n
    return True
