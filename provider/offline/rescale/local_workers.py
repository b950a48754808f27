"""Tasks run in worker processes the driver starts on its own machine, not as Spark tasks.

A split by files touches a few files per heir, so starting PySpark's workers for it (their
daemon, a fork per task, keyedstate imported in each) costs more than the work itself. Each
worker here is ``python -P -c "from keyedstate.offline.rescale.local_workers import _main; ..."``
(``-P``: nothing from the cwd shadows a module; the driver's ``sys.path`` is its path): it takes pickled
``(fn, task)`` pairs on its stdin and answers each with ``("ok", result)`` or ``("error",
exception, traceback text)`` on its stdout (what else it prints goes to stderr). A worker dies
with the driver (Linux's parent-death signal, and the end of its stdin); on a failed task the
driver kills every worker before it returns, so no task of a failed run writes afterwards. The
driver starts them (:class:`Workers`) before it has their tasks, so that their start overlaps
its own work.
"""
from __future__ import annotations

import importlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Sequence

from ..progress import Steps
from .errors import RescaleError

_PR_SET_PDEATHSIG = 1


def worker_count(tasks: int) -> int:
    """As many workers as this process may use cores, and no more than there are tasks."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(tasks, cores))


class _Worker:
    def __init__(self, log_level: int, preload: Sequence[str]) -> None:
        env = dict(os.environ)
        # The driver's own import path, resolved as the driver resolves it ('' is its cwd): the
        # worker imports the keyedstate the driver runs, and -P adds no cwd (anyone's /tmp) to it.
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in sys.path if isinstance(p, str))
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-c", f"from {__name__} import _main; _main()", str(os.getpid()), str(log_level),
             *preload],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        self.send = Connection(os.dup(self.proc.stdin.fileno()), readable=False)
        self.recv = Connection(os.dup(self.proc.stdout.fileno()), writable=False)
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.index: int | None = None  # the task it runs

    def stop(self, kill: bool) -> None:
        if kill:
            self.proc.kill()
        self.send.close()  # the end of its stdin: an idle worker exits
        self.proc.wait()
        self.recv.close()


class Workers:
    """``count`` worker processes, started at once so that their start overlaps what the driver
    does before it has tasks for them, each importing the modules ``preload`` names meanwhile
    (what its tasks would otherwise import inside the first one); :meth:`close` stops them
    (killed if ``kill``)."""

    def __init__(self, count: int, preload: Sequence[str] = ()) -> None:
        self._workers: list[_Worker] = []
        try:  # a failed start stops the started ones
            for _ in range(count):
                self._workers.append(_Worker(logging.getLogger("keyedstate").getEffectiveLevel(), preload))
        except BaseException:
            self.close(kill=True)
            raise

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        self.close(kill=kind is not None)

    def close(self, kill: bool = False) -> None:
        while self._workers:
            self._workers.pop().stop(kill=kill)

    def run(self, fn: Callable[[Any], dict], tasks: Sequence[Any], phase: str, log: logging.Logger,
            unit: str, describe: Callable[[Any], str]) -> list[dict]:
        """``fn(task)`` for each task, results in the tasks' order. The first task that fails
        stops every worker (killed) and raises its exception, with a note naming the task."""
        workers = self._workers
        if not workers:
            raise RescaleError("internal: no worker process left to run tasks in")
        results: list[dict | None] = [None] * len(tasks)
        steps = Steps(phase, len(tasks), log, unit)
        queue = list(range(len(tasks)))[::-1]
        try:
            for worker in workers:
                _give(worker, fn, tasks, queue)
            busy = {w.recv: w for w in workers if w.index is not None}
            while busy:
                for conn in wait(list(busy)):
                    worker = busy.pop(conn)
                    index = worker.index
                    try:
                        answer = conn.recv()
                    except EOFError:
                        code = worker.proc.wait()
                        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                        raise RescaleError(f"the worker process running {describe(tasks[index])} {how} "
                                           "before it finished (see its messages above)") from None
                    if answer[0] == "error":
                        _, exc, text = answer
                        log.error("%s failed in a worker process:\n%s", describe(tasks[index]), text)
                        if exc is None:
                            raise RescaleError(f"{describe(tasks[index])} failed: {text.strip().splitlines()[-1]}")
                        exc.add_note(f"(in {describe(tasks[index])}, run in a worker process of the driver)")
                        raise exc
                    results[index] = answer[1]
                    steps.step()
                    if _give(worker, fn, tasks, queue):
                        busy[worker.recv] = worker
        except BaseException:
            self.close(kill=True)  # no task of a failed run may write after it
            raise
        return results  # type: ignore[return-value]


def run(fn: Callable[[Any], dict], tasks: Sequence[Any], phase: str, log: logging.Logger,
        unit: str, describe: Callable[[Any], str]) -> list[dict]:
    """:meth:`Workers.run` in as many workers as there are cores, none kept."""
    with Workers(worker_count(len(tasks))) as workers:
        return workers.run(fn, tasks, phase, log, unit, describe)


def _give(worker: _Worker, fn: Callable, tasks: Sequence[Any], queue: list[int]) -> bool:
    worker.index = queue.pop() if queue else None
    if worker.index is None:
        return False
    try:
        worker.send.send((fn, tasks[worker.index]))
    except BrokenPipeError:
        pass  # it died: the end of its answers reports the task, with its exit status
    return True


def _take_pipes() -> tuple[Connection, Connection]:
    """The request and answer pipes, taken off stdin and stdout: from then on what anything
    else prints goes to stderr, and nothing else reads the requests."""
    requests = Connection(os.dup(0), writable=False)
    answers = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return requests, answers


def _serve(parent: int, requests: Connection, answers: Connection) -> None:
    while True:
        try:
            fn, task = requests.recv()
        except EOFError:
            return
        try:
            answer: tuple = ("ok", fn(task))
        except BaseException as exc:  # noqa: BLE001 -- every failure is the driver's to report
            text = traceback.format_exc()
            try:  # a round trip: some pickle, then fail to unpickle (an __init__ of other arguments)
                pickle.loads(pickle.dumps(exc))
            except Exception:  # an exception that does not cross processes: its text does
                exc = None  # type: ignore[assignment]
            answer = ("error", exc, text)
        answers.send(answer)
        if os.getppid() != parent:
            return


def _die_with(parent: int) -> None:
    """SIGKILL this process when the driver dies (Linux); elsewhere the end of stdin stops it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it died before the signal was set
        os._exit(1)


def _main() -> None:
    """A worker: ``sys.argv`` is [-c, the driver's pid, its log level, modules to preload...]."""
    parent, level = int(sys.argv[1]), int(sys.argv[2])
    _die_with(parent)
    requests, answers = _take_pipes()  # before a preloaded module can print or read
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for module in sys.argv[3:]:
        try:
            importlib.import_module(module)
        except (Exception, SystemExit):  # noqa: BLE001 -- only a head start: a task that needs it fails on its own
            pass
    _serve(parent, requests, answers)
