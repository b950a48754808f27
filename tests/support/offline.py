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
