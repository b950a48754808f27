"""Helpers for the offline tools' tests (tests/offline/): checkpoints on the objtest:// scheme,
and corrupting checkpoint files on purpose."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path


def objtest_root(spark) -> Path:
    """The local directory behind objtest:// in the shared session (conftest's objtest conf)."""
    root = spark.sparkContext.getConf().get("spark.hadoop.fs.objtest.root", None)
    if not root:
        raise RuntimeError("the session has no objtest:// filesystem (conftest's spark fixture sets it up)")
    return Path(root)


def to_objtest(spark, local_checkpoint: Path, bucket: str = "ckpt") -> str:
    """Copy a local checkpoint into objtest:// (objects are files under the backing root, so a
    tree copy is exactly what uploading every object gives) and return its URI."""
    key = f"{local_checkpoint.name}-{uuid.uuid4().hex[:8]}"
    shutil.copytree(local_checkpoint, objtest_root(spark) / bucket / key,
                    ignore=shutil.ignore_patterns(".*.crc"))
    return f"objtest://{bucket}/{key}"


def objtest_local(spark, uri: str) -> Path:
    """The backing local directory of an objtest:// URI (to corrupt files in tests)."""
    rest = uri[len("objtest://"):]
    return objtest_root(spark) / rest


def copy_checkpoint(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns(".*.crc"))
    return dest


def rescale_cli(*args: str, **kwargs) -> subprocess.Popen:
    """``keyedstate rescale ARGS`` in a process group of its own (stderr piped: it logs each step)."""
    return subprocess.Popen([sys.executable, "-m", "keyedstate.cli", "rescale", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)


def kill_rescale_after(proc: subprocess.Popen, step: str, timeout: float = 180) -> str:
    """SIGKILL the rescale CLI ``proc`` as soon as it logs ``step`` (e.g. "offsets/", "split:");
    returns what it logged. If it ends first, nothing is killed (check ``proc.returncode``)."""
    seen = []
    deadline = time.monotonic() + timeout
    for line in proc.stderr:
        seen.append(line)
        if f"keyedstate.offline.rescaling: {step}" in line:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"the rescale did not log {step!r} within {timeout}s:\n{''.join(seen)}")
    seen.append(proc.stderr.read())
    proc.wait(60)
    return "".join(seen)


def rescale_workers(driver_pid: int) -> list[int]:
    """The live worker processes of the rescale driver ``driver_pid`` (their argv names it)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
            state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if any(b"rescale.local_workers" in a for a in argv) and str(driver_pid).encode() in argv and state != "Z":
            found.append(int(cmdline.parent.name))
    return found


def await_a_split_running(checkpoint: Path, running=lambda: True, timeout: float = 180) -> None:
    """Waits until a split task of a rescale of ``checkpoint`` has made its temp directory (it
    is cutting its partition), while ``running()``."""
    deadline = time.monotonic() + timeout
    while not list((Path(checkpoint) / "_keyedstate_rescale").glob("batch-*/*/*/from-*.tmp")):
        if not running() or time.monotonic() > deadline:
            raise TimeoutError(f"no split of {checkpoint} started")
        time.sleep(0.005)


def kill_rescale_driver_while_splitting(proc: subprocess.Popen, checkpoint: Path) -> list[int]:
    """SIGKILL the driver process of the rescale CLI ``proc`` alone (not its group) while a split
    task runs; returns its worker processes of that moment, once each has died with it (else
    AssertionError). The rest of its group (its JVM) is killed after."""
    try:
        await_a_split_running(checkpoint, lambda: proc.poll() is None)
        workers = rescale_workers(proc.pid)
        proc.kill()
        proc.communicate(timeout=60)
        deadline = time.monotonic() + 10
        while alive := [pid for pid in workers if pid in rescale_workers(proc.pid)]:
            assert time.monotonic() < deadline, f"the rescale's workers {alive} outlived their driver"
            time.sleep(0.1)
        return workers
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
