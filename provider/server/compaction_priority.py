"""RocksDB's bottom-priority compaction pool at the lowest CPU priority, for one compaction.

A full manual compaction writes to the bottommost level, which RocksDB hands to its
bottom-priority pool whenever that pool has threads (and to the low-priority pool otherwise).
:func:`lowered_bottom_pool` gives the pool one thread at nice 19, the value RocksDB's own
``Env::LowerThreadPoolCPUPriority`` sets, so that the compaction takes only the CPU that nothing
else in the machine wants. An unprivileged process cannot raise a thread's priority again, so
afterwards :func:`renew_bottom_pool` retires that thread and starts one at normal priority.
While the pool is lowered, every store's compactions into the bottommost level wait behind the
compaction at that priority, as they wait behind it in the single low-priority thread without it.

Linux only: a thread's nice value is its own there, set through its id (``setpriority``). On
other systems the pool is left alone and the compaction runs where RocksDB puts it.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)

LOWEST_NICE = 19
"""Linux's lowest CPU priority for a normal thread: the scheduler gives it about 1.5 % of a core
that a thread at nice 0 wants, and all of a core nothing else wants."""

BOTTOM_THREAD_NAME = "rocksdb:bottom"
"""How RocksDB names the threads of its bottom-priority pool (``pthread_setname_np``)."""

_TASKS = Path("/proc/self/task")
_THREAD_START_SECONDS = 2.0  # a new pool thread names itself when it first runs


def supported() -> bool:
    """Whether this process can lower one thread's priority (Linux, with ``/proc``)."""
    return sys.platform.startswith("linux") and _TASKS.is_dir()


def bottom_threads() -> dict[int, int]:
    """The bottom-priority pool's threads in this process: thread id -> nice value."""
    threads = {}
    for task in _TASKS.iterdir() if supported() else ():
        try:
            if (task / "comm").read_text().strip() != BOTTOM_THREAD_NAME:
                continue
            # Field 19 of stat is the nice value; the name (field 2) may hold spaces, so split after it.
            threads[int(task.name)] = int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])
        except (OSError, ValueError, IndexError):  # a thread that ended while it was read
            continue
    return threads


@contextlib.contextmanager
def lowered_bottom_pool() -> Iterator[bool]:
    """Run the block with RocksDB's bottom-priority pool holding one thread at
    :data:`LOWEST_NICE`; yields whether it does (False: not supported, or the thread could not
    be lowered, and the pool is as it was). The caller renews the pool afterwards when True
    (:func:`renew_bottom_pool`), so that no thread stays at that priority."""
    from rocksdict import Env

    if not supported():
        yield False
        return
    env = Env()
    env.set_bottom_priority_background_threads(1)
    deadline = time.monotonic() + _THREAD_START_SECONDS
    while not (threads := bottom_threads()) and time.monotonic() < deadline:
        time.sleep(0.005)
    lowered = bool(threads)
    for tid, nice in threads.items():
        if nice < LOWEST_NICE:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, LOWEST_NICE)
            except OSError:  # ended since it was listed, or refused: the pool is renewed anyway
                lowered = False
    if not threads:
        log.warning("RocksDB started no bottom-priority thread within %.0f s: compacting at normal priority",
                    _THREAD_START_SECONDS)
        env.set_bottom_priority_background_threads(0)
    yield lowered


def renew_bottom_pool() -> None:
    """Replace the pool's lowered threads by one at normal priority. A pool shrunk to no thread
    leaves the compactions queued in it waiting, so it gets a new thread once the lowered one
    is gone (it ends after the compaction it runs, if any); the wait is unbounded, so call this
    off every task's path."""
    from rocksdict import Env

    if not supported():
        return
    env = Env()
    env.set_bottom_priority_background_threads(0)
    while any(nice >= LOWEST_NICE for nice in bottom_threads().values()):
        time.sleep(0.01)
    env.set_bottom_priority_background_threads(1)
