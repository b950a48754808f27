"""The state server process: ``python -m keyedstate.server``.

The JVM shim starts it (in its private work directory, importing nothing from it) with, in its
environment, that work directory and two random secrets, one per use:
``KEYEDSTATE_CALLBACK_SECRET`` (the JVM -> this process's callback server) and
``KEYEDSTATE_DATA_SECRET`` (the data channel's HELLO). It then
1. opens the bulk data channel (a Unix domain socket in its private work dir),
2. starts its py4j callback server on a Unix domain socket beside it (:mod:`.callback_server`),
3. says it is ready: its pid and the callback socket's path in the file ``ready`` of its work
   dir, written whole (the JVM opens no listener for it to call).
It exits when its stdin closes, i.e. when the JVM that started it is gone, removing the data
socket's directory if that had to live outside the work dir. Everything it creates is private
(umask 077); its log goes to stderr, which the JVM keeps in a bounded, rotated file, and no
secret reaches it at any level (:mod:`.log_redaction`).
"""
from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from .api import CALLBACK_SOCKET, StateServerApi, data_socket_path
from .callback_server import start_callback_server
from .data import DataServer
from .log_redaction import configure_logging
from .registry import StoreRegistry

log = logging.getLogger("keyedstate.server")

READY_FILE = "ready"
"""The file in the work dir that says the server is ready: its pid, then its callback socket's path."""
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)

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
    configure_logging([callback_secret, data_secret])
    _return_large_buffers_to_the_os()  # before any thread starts: mallopt is not thread-safe
    workdir = Path(os.environ["KEYEDSTATE_WORK_DIR"])
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (workdir / "pid").write_text(str(os.getpid()))

    socket_path, socket_dir = data_socket_path(workdir)

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
