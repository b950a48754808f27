"""The state server's py4j control API, and where its sockets live.

The JVM drives the server over py4j for control (:class:`StateServerApi`, served by
:mod:`.callback_server`) and over :mod:`.data` for bulk data. The data socket lives in the
server's private work dir, or, when that path is too long for AF_UNIX, in a private directory
of its own (:func:`data_socket_path`), which a later server removes once abandoned. The process
itself is :mod:`.main`.
"""
from __future__ import annotations

import json
import logging
import os
import re
import secrets
import socket
import stat
import tempfile
import time
from pathlib import Path

from .. import conf
from .callback_server import AUTH_TIMEOUT_S, MAX_HANDSHAKES, start_callback_server
from .log_redaction import configure_logging as _configure_logging
from .registry import StoreRegistry

__all__ = ["AUTH_TIMEOUT_S", "CALLBACK_SOCKET", "MAX_HANDSHAKES", "SOCKET_DIR_MARKER", "StateServerApi",
           "_configure_logging", "start_callback_server"]

log = logging.getLogger("keyedstate.server")

SOCKET_DIR_MARKER = "socket-dir"
"""A file in the work dir naming the data socket's directory when that is outside it."""
CALLBACK_SOCKET = "callback.sock"
"""The py4j callback server's Unix socket, in the data socket's directory."""


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


def data_socket_path(workdir: Path) -> tuple[Path, Path | None]:
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


