"""The state server process: owns every RocksDB store of one executor JVM.

The JVM shim starts it (``python -m keyedstate.server``) with the py4j gateway's loopback port
and a random secret in its environment. It then
1. opens the bulk data channel (a Unix domain socket in its private work dir),
2. starts its py4j callback server on loopback (port 0, same secret, TCP_NODELAY on every
   socket: without it any py4j payload over ~6 KB waits ~40 ms for Nagle + delayed ACK),
3. points the JVM's callback client at it and says ``serverReady``.
It exits when its stdin closes, i.e. when the JVM that started it is gone.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from py4j.java_gateway import (CallbackServer, CallbackServerParameters, GatewayClient,
                               GatewayParameters, JavaGateway)

from . import conf, protocol as p
from .store import Applier, TtlScan, VersionedStore

log = logging.getLogger("keyedstate.server")


class StoreRegistry:
    """Open stores by handle; a handle is only meaningful inside this server process."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._stores: dict[int, VersionedStore] = {}
        self._next = 1
        self._lock = threading.Lock()
        self.applier = Applier()

    def open(self, name: str, settings: dict[str, Any]) -> tuple[int, VersionedStore]:
        with self._lock:
            handle = self._next
            self._next += 1
        store = VersionedStore(name, self.workdir / "stores" / str(handle),
                               settings["keyGroups"], settings["snapshotInterval"], self.applier)
        with self._lock:
            self._stores[handle] = store
        return handle, store

    def get(self, handle: int) -> VersionedStore:
        try:
            return self._stores[handle]
        except KeyError:
            raise KeyError(f"no open store with handle {handle}") from None

    def close(self, handle: int) -> None:
        with self._lock:
            store = self._stores.pop(handle, None)
        if store is not None:
            store.close()


class DataServer:
    """Serves GET/SCAN/APPLY/... frames on a Unix domain socket, one thread per connection."""

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
            head = bytearray(p.REQUEST_HEAD.size)
            while True:
                if not _recv_exact(conn, memoryview(head)):
                    return
                length, op, handle = p.REQUEST_HEAD.unpack(head)
                body = bytearray(length - 5)
                if body and not _recv_exact(conn, memoryview(body)):
                    return
                try:
                    status, reply = self._dispatch(op, handle, body)
                except Exception as exc:  # reported to the JVM, which fails the task
                    log.exception("data op %s on store %s failed", op, handle)
                    status, reply = p.STATUS_ERROR, f"{type(exc).__name__}: {exc}".encode()
                response_head = p.RESPONSE_HEAD.pack(len(reply) + 1, status)
                if len(reply) < 65536:  # one syscall for the common small reply
                    conn.sendall(response_head + reply)
                else:  # do not copy a large reply just to prepend five bytes
                    conn.sendall(response_head)
                    conn.sendall(reply)

    def _dispatch(self, op: int, handle: int, body: bytearray) -> tuple[int, bytes]:
        store = self.registry.get(handle)
        if op == p.OP_GET:
            value = store.get(bytes(body))
            return (p.STATUS_NOT_FOUND, b"") if value is None else (p.STATUS_OK, value)
        if op == p.OP_MULTI_GET:
            (count,) = p.U32.unpack_from(body, 0)
            keys, pos = [], 4
            for _ in range(count):
                (klen,) = p.U32.unpack_from(body, pos)
                keys.append(bytes(body[pos + 4:pos + 4 + klen]))
                pos += 4 + klen
            parts = []
            for value in store.get_many(keys):
                parts.append(b"\x00" if value is None else b"\x01" + p.U32.pack(len(value)) + value)
            return p.STATUS_OK, b"".join(parts)
        if op == p.OP_SCAN:
            pos = 0
            (plen,) = p.U32.unpack_from(body, pos)
            prefix = bytes(body[4:4 + plen])
            pos = 4 + plen
            start_after = None
            if body[pos]:
                (alen,) = p.U32.unpack_from(body, pos + 1)
                start_after = bytes(body[pos + 5:pos + 5 + alen])
                pos += 5 + alen
            else:
                pos += 1
            max_bytes, flags = p.U32.unpack_from(body, pos)[0], body[pos + 4]
            max_entries = p.U32.unpack_from(body, pos + 5)[0]
            entries, more = store.scan(prefix, start_after, max_bytes, keys_only=bool(flags & 1),
                                       max_entries=max_entries)
            parts = [p.U8.pack(1 if more else 0), p.U32.pack(len(entries))]
            for key, value in entries:
                parts += (p.U32.pack(len(key)), key, p.U32.pack(len(value)), value)
            return p.STATUS_OK, b"".join(parts)
        if op == p.OP_APPLY:
            source = f"changelog of {store.name}"
            ttl, start = None, 2
            if body[1]:
                ttl = TtlScan(*p.TTL_SCAN.unpack_from(body, 2))
                start += p.TTL_SCAN.size
            data = memoryview(body)[start:]  # body is ours alone: no copy
            if body[0] == p.APPLY_BEHIND:
                store.submit(data, source, ttl)
                return p.STATUS_OK, p.U64.pack(0)
            return p.STATUS_OK, p.U64.pack(store.apply(data, source, ttl))
        if op == p.OP_TTL_CANDIDATES:
            version, scan_ms, keys = store.take_ttl_candidates()
            parts = [p.TTL_HEAD.pack(version, scan_ms, len(keys))]
            for key in keys:
                parts += (p.U32.pack(len(key)), key)
            return p.STATUS_OK, b"".join(parts)
        if op == p.OP_SYNC:
            version, directory = store.sync()
            return p.STATUS_OK, p.I64.pack(version) + directory.encode()
        raise ValueError(f"unknown data op {op}")


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

    def stagedSnapshots(self, handle: int) -> str:  # noqa: N802
        return json.dumps(self.registry.get(handle).staged_snapshots())

    def dropStaged(self, handle: int, version: int) -> None:  # noqa: N802
        self.registry.get(handle).drop_staged(version)

    def storeInfo(self, handle: int) -> str:  # noqa: N802
        return json.dumps(self.registry.get(handle).info())

    def memoryBytes(self, handle: int) -> str:  # noqa: N802 (a string: py4j boxes small ints as Integer)
        return str(self.registry.get(handle).memory_bytes())

    def closeStore(self, handle: int) -> None:  # noqa: N802
        self.registry.close(handle)


def _nodelay(sock: socket.socket | None) -> None:
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _NoDelayGatewayClient(GatewayClient):
    def _create_connection(self):
        connection = super()._create_connection()
        _nodelay(connection.socket)
        return connection


class _NoDelayCallbackServer(CallbackServer):
    def _create_connection(self, socket_instance, stream):
        _nodelay(socket_instance)
        return super()._create_connection(socket_instance, stream)


class _NoDelayGateway(JavaGateway):
    def _create_gateway_client(self):
        return _NoDelayGatewayClient(gateway_parameters=self.gateway_parameters)

    def _create_callback_server(self, callback_server_parameters):
        return _NoDelayCallbackServer(self.gateway_property.pool, self._gateway_client,
                                      callback_server_parameters=callback_server_parameters)


def _socket_path(workdir: Path) -> Path:
    """The data socket, in the private work dir unless that path is too long for AF_UNIX
    (108 bytes); then in a fresh private directory under /tmp."""
    path = workdir / "data.sock"
    if len(str(path).encode()) < 100:
        return path
    short = Path(tempfile.mkdtemp(prefix="ks-"))  # mode 0700
    return short / "data.sock"


def main() -> None:
    logging.basicConfig(level=os.environ.get("KEYEDSTATE_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    port = int(os.environ["KEYEDSTATE_GATEWAY_PORT"])
    secret = os.environ.pop("KEYEDSTATE_GATEWAY_SECRET")
    workdir = Path(os.environ["KEYEDSTATE_WORK_DIR"])
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "pid").write_text(str(os.getpid()))

    registry = StoreRegistry(workdir)
    data = DataServer(registry, _socket_path(workdir))
    data.start()
    api = StateServerApi(registry, data.path)
    gateway = _NoDelayGateway(
        gateway_parameters=GatewayParameters(address="127.0.0.1", port=port, auth_token=secret,
                                             auto_convert=True),
        callback_server_parameters=CallbackServerParameters(
            address="127.0.0.1", port=0, auth_token=secret, daemonize=True,
            daemonize_connections=True),
        python_server_entry_point=api)
    server = gateway.java_gateway_server
    callback_port = gateway.get_callback_server().get_listening_port()
    server.resetCallbackClient(server.getCallbackClient().getAddress(), callback_port)
    gateway.entry_point.serverReady(os.getpid())
    log.info("keyedstate state server %d ready (work dir %s)", os.getpid(), workdir)

    sys.stdin.buffer.read()  # returns when the JVM closes our stdin or dies
    log.info("JVM gone; state server %d exiting", os.getpid())
    os._exit(0)


if __name__ == "__main__":
    main()
