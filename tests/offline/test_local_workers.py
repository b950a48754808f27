"""The driver's own worker processes, which run a rescale's splits by files (real processes,
real pipes; the tasks are builtins evaluated in the worker)."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keyedstate.offline.rescale import RescaleError, local_workers

log = logging.getLogger("test-local-workers")
SLEEPER = "__import__('time').sleep(120)"


def _run(tasks: list[str]) -> list:
    return local_workers.run(eval, tasks, "test", log, "tasks", lambda task: f"task {task!r}")


def _children(pid: int) -> set[int]:
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def test_results_come_back_in_task_order_from_other_processes():
    tasks = [f"({i}, __import__('os').getpid())" for i in range(7)]
    results = _run(tasks)
    assert [i for i, _ in results] == list(range(7))
    pids = {pid for _, pid in results}
    assert os.getpid() not in pids and 1 <= len(pids) <= local_workers.worker_count(7)


def test_workers_import_what_they_are_told_to_before_their_first_task():
    """A module to preload is imported while the worker waits (a missing one is passed over);
    without it the worker has not imported it."""
    probe = "'wave' in __import__('sys').modules"
    with local_workers.Workers(1, preload=("no_such_module_here", "wave")) as workers:
        assert workers.run(eval, [probe], "test", log, "tasks", repr) == [True]
    with local_workers.Workers(1) as workers:
        assert workers.run(eval, [probe], "test", log, "tasks", repr) == [False]


@pytest.mark.timeout(60)  # a broken protocol leaves the driver waiting for an answer
def test_a_preloaded_module_that_prints_or_reads_stdin_leaves_the_pipes_alone(tmp_path, monkeypatch, capfd):
    """What a module prints or reads while it is preloaded must not reach the answer pipe or
    take a request: the worker takes both pipes off stdin and stdout first."""
    (tmp_path / "noisy_preload.py").write_text(
        "import os, sys\n"
        "print('printed at import', flush=True)\n"
        "os.write(1, b'written at import')\n"
        "sys.stdin.read()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with local_workers.Workers(1, preload=("noisy_preload",)) as workers:
        assert workers.run(eval, ["6 * 7", "'noisy_preload' in __import__('sys').modules"], "test", log,
                           "tasks", repr) == [42, True]
    err = capfd.readouterr().err
    assert "printed at import" in err and "written at import" in err


def test_a_failed_task_raises_its_own_exception_and_stops_the_others_at_once():
    others = _children(os.getpid())  # a Spark JVM an earlier test of this process started
    started = time.monotonic()
    with pytest.raises(ZeroDivisionError) as failed:
        _run([SLEEPER, "1 / 0", SLEEPER, SLEEPER])
    assert time.monotonic() - started < 30  # the sleepers were killed, not waited for
    assert any("task '1 / 0'" in note and "worker process of the driver" in note
               for note in getattr(failed.value, "__notes__", []))
    assert not _children(os.getpid()) - others


def test_a_worker_that_dies_fails_the_run_with_its_exit_code():
    with pytest.raises(RescaleError, match=r"task .*_exit.* exited with code 3 before it finished"):
        _run(["__import__('os')._exit(3)"])


def test_an_exception_that_cannot_be_pickled_arrives_as_its_text():
    with pytest.raises(RescaleError, match=r"failed: .*Unpicklable"):
        _run(["exec('class Unpicklable(Exception):\\n def __reduce__(self): raise TypeError()\\n"
              "raise Unpicklable(\"no\")')"])


def test_workers_die_with_a_killed_driver(tmp_path):
    driver = subprocess.Popen(
        [sys.executable, "-c", "import logging; from keyedstate.offline.rescale import local_workers as w; "
         f"w.run(eval, [{SLEEPER!r}] * 2, 'x', logging.getLogger(), 'tasks', str)"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    try:
        deadline = time.monotonic() + 60
        while len(workers := _children(driver.pid)) < min(2, local_workers.worker_count(2)):
            assert time.monotonic() < deadline and driver.poll() is None, "the workers did not start"
            time.sleep(0.1)
        time.sleep(1)  # each has its task
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    deadline = time.monotonic() + 10
    while alive := [pid for pid in workers if Path(f"/proc/{pid}").exists()
                    and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]:
        assert time.monotonic() < deadline, f"workers {alive} outlived their driver"
        time.sleep(0.1)


def test_a_worker_killed_by_a_signal_fails_the_run_naming_the_signal():
    with pytest.raises(RescaleError, match=r"task .*getpid.* was killed by SIGKILL before it finished"):
        _run(["__import__('os').kill(__import__('os').getpid(), 9)"])


def test_a_package_in_the_drivers_cwd_is_not_imported_by_the_workers(tmp_path, monkeypatch, capfd):
    """A driver run from a directory others may write to (/tmp): a ``keyedstate`` placed there
    is not what the workers import (the driver's path is theirs), and they print nothing."""
    import keyedstate

    planted = tmp_path / "keyedstate"
    planted.mkdir()
    (planted / "__init__.py").write_text("open(__file__ + '.ran', 'w').close()\nraise SystemExit(9)\n")
    monkeypatch.chdir(tmp_path)
    assert _run(["__import__('keyedstate').__file__"] * 2) == [keyedstate.__file__] * 2
    assert not (planted / "__init__.py.ran").exists()
    assert capfd.readouterr().err == ""


def test_a_process_a_task_starts_reads_nothing_of_the_requests():
    """A child process of a task inherits the worker's stdin: it must see its end, not wait on
    (or consume) the driver's requests."""
    tasks = ["__import__('subprocess').run(['cat'], capture_output=True, timeout=5).stdout"] * 3
    assert _run(tasks) == [b""] * 3


class TwoArgs(Exception):
    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")


def _truncated(path: str):
    raise TwoArgs(path, "truncated")


def test_an_exception_that_pickles_but_does_not_unpickle_arrives_as_its_text():
    """An exception whose __init__ takes other arguments than its args pickles, then fails to
    unpickle: its text reaches the driver, with the task named, not the unpickler's TypeError."""
    with pytest.raises(RescaleError, match=r"task '/ck/3.ks-snapshot' failed: .*TwoArgs: /ck/3.ks-snapshot: truncated"):
        local_workers.run(_truncated, ["/ck/3.ks-snapshot"], "test", log, "tasks", lambda task: f"task {task!r}")



@pytest.mark.parametrize("level", [logging.INFO, logging.WARNING])
def test_what_a_task_prints_or_logs_goes_to_stderr_at_the_drivers_level(capfd, level):
    """Prints (Python's and the raw fd 1's, more than a pipe holds) reach stderr, not the
    answers; a task's log records pass the level the driver's keyedstate logger has."""
    task = ("(print('stray ' * 20000), __import__('os').write(1, b'raw-fd-1'),"
            " __import__('logging').getLogger('keyedstate.t').info('an-info-record'), 7)[-1]")
    logger = logging.getLogger("keyedstate")
    saved = logger.level
    logger.setLevel(level)
    try:
        assert _run([task] * 3) == [7] * 3
    finally:
        logger.setLevel(saved)
    out, err = capfd.readouterr()
    assert err.count("stray " * 20000) == 3 and err.count("raw-fd-1") == 3 and "stray" not in out
    assert err.count("an-info-record") == (3 if level == logging.INFO else 0)
