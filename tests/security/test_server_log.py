"""Issue 46.5: a state server's log drain keeps draining whatever happens to the log's file.

The JVM copies a server's output (a pipe) into its log (``ServerLog``). When writing the log fails
(a full disk), the drain must drop that output and go on reading: a server whose pipe nobody reads
blocks on its next 64 KiB of output, every thread of it that logs. Once writing works again the
log says how much was lost.

The real ``ServerLog`` of the session's JVM drains a FIFO this test writes to, into a log on a
1 MiB tmpfs that the test fills and then empties (mounting one needs root)."""
from __future__ import annotations

import errno
import os
import select
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` to the last byte; returns the filler file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (64 << 10, 4 << 10, 1):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    finally:
        os.close(fd)
    return filler


def write_within(fd: int, data: bytes, seconds: float) -> int:
    """Write ``data`` to the non-blocking ``fd``; the bytes written before ``seconds`` passed."""
    deadline = time.monotonic() + seconds
    sent = 0
    while sent < len(data) and time.monotonic() < deadline:
        _, writable, _ = select.select([], [fd], [], max(0.0, deadline - time.monotonic()))
        if writable:
            try:
                sent += os.write(fd, data[sent:sent + 4096])
            except BlockingIOError:
                pass
    return sent


def wait_for(path: Path, text: bytes, seconds: float) -> bytes:
    deadline = time.monotonic() + seconds
    content = b""
    while time.monotonic() < deadline:
        content = path.read_bytes() if path.exists() else b""
        if text in content:
            break
        time.sleep(0.05)
    return content


def test_the_log_drain_survives_a_full_disk(spark, tmp_path, small_disk):
    jvm = spark._jvm
    fifo = tmp_path / "server-output"
    os.mkfifo(fifo, 0o600)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a writer first: the JVM's open does not block
    log_path = small_disk / "server.log"
    log = jvm.io.keyedstate.bridge.ServerLog(jvm.java.io.File(str(log_path)).toPath())
    try:
        log.pump(jvm.java.io.FileInputStream(str(fifo)), "test-server-output")
        assert write_within(writer, b"before the disk filled\n", 10) > 0
        assert b"before the disk filled" in wait_for(log_path, b"before the disk filled", 10)

        filler = fill(small_disk)
        lost = b"lost while the disk was full\n" * 1000  # ~29 KiB, within the pipe's buffer
        assert write_within(writer, lost, 10) == len(lost)
        time.sleep(1.0)  # the drain reads it and fails to write it
        filler.unlink()

        after = b"".join(b"after the disk had room again %06d\n" % i for i in range(8000))  # ~280 KiB
        sent = write_within(writer, after, 20)
        assert sent == len(after), (f"the drain stopped reading the server's output after a failed write: "
                                    f"{sent} of {len(after)} bytes went into the pipe in 20 s")
        content = wait_for(log_path, b"after the disk had room again 007999", 10)
        assert b"after the disk had room again 007999" in content, content[-500:]
        assert b"bytes of this server's output were dropped" in content, \
            "the log does not say that output was dropped"
        assert b"before the disk filled" in content
    finally:
        os.close(writer)
        log.awaitEnd(2000)
        log.close()
