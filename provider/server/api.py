"""The state server process and its py4j control API.

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

from .. import conf
from .data import DataServer
from .registry import StoreRegistry

log = logging.getLogger("keyedstate.server")


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
