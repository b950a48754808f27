"""The driver's conf check (``DriverConfCheck``): which Python it runs, and that it never hangs
planning. Driven through py4j in the shared session's JVM (the driver)."""
from __future__ import annotations

import stat
import threading
import time
import uuid
from pathlib import Path

import keyedstate
from keyedstate import conf


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_the_driver_never_runs_a_python_a_session_conf_names(spark, tmp_path):
    """A session conf any SQL statement can SET (``pythonExec``) does not choose the program the
    driver runs while planning; SparkConf and the environment do. Before, the driver ran it."""
    marker = tmp_path / "ran"
    planted = _script(tmp_path / "planted", f'touch "{marker}"\necho \'{{"error": "planted"}}\'\n')
    spark.conf.set(conf.PREFIX + "pythonExec", str(planted))
    spark.conf.set(conf.PREFIX + "snapshotInterval", str(1000 + uuid.uuid4().int % 1000))  # a fresh set of confs
    try:
        spark._jvm.io.keyedstate.spark.DriverConfCheck.onDriver()
    finally:
        spark.conf.unset(conf.PREFIX + "pythonExec")
        spark.conf.unset(conf.PREFIX + "snapshotInterval")
    assert not marker.exists()


def test_a_python_that_never_answers_is_killed_with_its_children_at_the_time_limit(spark, tmp_path):
    """A Python that reads no input and never exits (here a script that starts a sleeping child),
    given more confs than a pipe buffers: the check gives up at its time limit, kills the child and
    what it started, and planning goes on. Before, writing the confs blocked for ever."""
    pid_file = tmp_path / "pid"
    stuck = _script(tmp_path / "stuck", f'sleep 600 &\necho $! > "{pid_file}"\nwait\n')
    confs = spark._jvm.java.util.HashMap()
    confs.put(conf.PREFIX + "snapshotInterval", "5")
    confs.put(conf.PREFIX + "padding", "x" * (1 << 20))
    outcome: dict = {}

    def check() -> None:
        outcome["answer"] = spark._jvm.io.keyedstate.spark.DriverConfCheck.ask(confs, str(stuck), 2000)

    started = time.monotonic()
    thread = threading.Thread(target=check, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the check hung"
    assert time.monotonic() - started < 20 and outcome["answer"].isEmpty()
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the child's child was left running"


def test_an_answer_from_another_keyedstate_version_is_not_used(spark, tmp_path):
    """The driver's Python may import another keyedstate than the jar's (a skewed install): its
    rules may differ from the state servers', so its answer is not used (the servers check the
    confs). The same answer from the jar's version is."""
    confs = spark._jvm.java.util.HashMap()
    confs.put(conf.PREFIX + "snapshotInterval", "5")
    check = spark._jvm.io.keyedstate.spark.DriverConfCheck
    for version, used in (("0.0.0-other", False), (keyedstate.__version__, True)):
        answers = _script(tmp_path / f"answers-{version}", f'cat > /dev/null\necho \'{{"error": "refused", "version": "{version}"}}\'\n')
        answer = check.ask(confs, str(answers), 30000)
        assert (answer.isDefined() and answer.get().message() == "refused") == used, version
