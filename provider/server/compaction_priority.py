"""RocksDB's bottom-priority compaction pool at idle CPU priority, for one compaction.

A full manual compaction writes to the bottommost level, which RocksDB hands to its
bottom-priority pool whenever that pool has threads (and to the low-priority pool otherwise).
:func:`lowered_bottom_pool` gives the pool one thread under Linux's ``SCHED_IDLE`` policy (what
RocksDB's own ``Env::LowerThreadPoolCPUPriority(kIdle)`` sets), so that the compaction takes only
the CPU that nothing else in the machine wants: a core running only such a thread counts as idle
to the scheduler, which puts a waking thread there and preempts the compaction at once. An
unprivileged process cannot raise a thread's policy again, so afterwards
:func:`renew_bottom_pool` retires that thread and starts one at normal priority.
While the pool is lowered, every store's compactions into the bottommost level wait behind the
compaction at that priority, as they wait behind it in the single low-priority thread without it.

Linux only: a thread's scheduling policy is its own there, set through its id. On other systems
the pool is left alone and the compaction runs where RocksDB puts it.
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

IDLE_POLICY = getattr(os, "SCHED_IDLE", 5)
"""The scheduling policy of a lowered thread: it runs only where no other thread wants the CPU."""

BOTTOM_THREAD_NAME = "rocksdb:bottom"
"""How RocksDB names the threads of its bottom-priority pool (``pthread_setname_np``)."""

_TASKS = Path("/proc/self/task")
_THREAD_START_SECONDS = 2.0  # a new pool thread names itself when it first runs


def supported() -> bool:
    """Whether this process can lower one thread's priority (Linux, with ``/proc``)."""
    return sys.platform.startswith("linux") and _TASKS.is_dir() and hasattr(os, "sched_setscheduler")


def bottom_threads() -> dict[int, bool]:
    """The bottom-priority pool's threads in this process: thread id -> whether it is lowered."""
    threads = {}
    for task in _TASKS.iterdir() if supported() else ():
        try:
            if (task / "comm").read_text().strip() == BOTTOM_THREAD_NAME:
                threads[int(task.name)] = os.sched_getscheduler(int(task.name)) == IDLE_POLICY
        except (OSError, ValueError):  # a thread that ended while it was read
            continue
    return threads


@contextlib.contextmanager
def lowered_bottom_pool() -> Iterator[bool]:
    """Run the block with RocksDB's bottom-priority pool holding one thread under
    :data:`IDLE_POLICY`; yields whether it does (False: not supported, or the thread could not
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
    for tid, already in threads.items():
        if not already:
            try:
                os.sched_setscheduler(tid, IDLE_POLICY, os.sched_param(0))
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
    while any(bottom_threads().values()):
        time.sleep(0.01)
    env.set_bottom_priority_background_threads(1)
