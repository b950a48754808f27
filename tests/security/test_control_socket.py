"""The JVM's control connection to a state server (py4j over ``UnixChannelSocket``), driven from a
JVM of its own that runs no Spark and no py4j gateway, as an executor's: a small Java harness
compiled against the keyedstate jar and pyspark's jars calls the real bridge classes.

- py4j writes every command and answer to java.util.logging at INFO (into the executor's log,
  through Spark's bridge) unless its GatewayServer class is initialised, which an executor JVM
  does not do by itself: control calls must log nothing.
- A task killed while it waits for a control answer (Spark interrupts its thread) must not spin:
  a selector returns at once while its thread is interrupted. As on a TCP socket the wait goes on
  until the answer, the timeout or a close, and the interrupt is kept for the caller. Such a
  thread still connects, as on TCP (its cleanup calls must reach the server).
- A server start interrupted (a task killed meanwhile) leaves no server process behind."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.processes import alive

pytestmark = pytest.mark.timeout(300)

HARNESS = r'''
import io.keyedstate.bridge.*;
import java.lang.management.ManagementFactory;

public class BridgeHarness {
  static ServerLaunch launch(String python, String localDir) {
    return new ServerLaunch(python, scala.Option.apply(localDir), 60000L, 20000, 1);
  }

  public static void main(String[] a) throws Exception {
    switch (a[0]) {
      case "calls": {
        StateServerProcess s = StateServerProcess.get(launch(a[1], a[2]), 0);
        for (int i = 0; i < 3; i++) s.api().processMemoryBytes();
        System.out.println("calls done " + s.pid());
        break;
      }
      case "interrupt": {
        java.net.Socket sock = new UnixChannelSocket(java.nio.file.Paths.get(a[1]));
        int timeout = Integer.parseInt(a[2]);
        sock.setSoTimeout(timeout);
        Thread.currentThread().interrupt();
        long t0 = System.nanoTime();
        long cpu0 = ManagementFactory.getThreadMXBean().getCurrentThreadCpuTime();
        String outcome;
        try { outcome = "read " + sock.getInputStream().read(); }
        catch (java.io.IOException e) { outcome = e.getClass().getSimpleName(); }
        long cpu = ManagementFactory.getThreadMXBean().getCurrentThreadCpuTime() - cpu0;
        boolean kept = Thread.interrupted();
        System.out.println("interrupt " + outcome + " " + (System.nanoTime() - t0) / 1000000 + " "
            + cpu / 1000000 + " " + kept);
        sock.close();
        break;
      }
      case "interrupted-connect": {
        Thread.currentThread().interrupt();
        String outcome;
        try {
          java.net.Socket sock = new UnixChannelSocket(java.nio.file.Paths.get(a[1]));
          sock.getOutputStream().write("ping\n".getBytes());
          sock.close();
          outcome = "connected";
        } catch (java.io.IOException e) { outcome = e.getClass().getSimpleName(); }
        System.out.println("connect " + outcome + " " + Thread.interrupted());
        break;
      }
      case "startup-interrupt": {
        final Thread main = Thread.currentThread();
        new Thread(() -> { // interrupts the start once the server's process runs, then a[3] ms later
          try {
            while (ProcessHandle.current().children().count() == 0) Thread.sleep(20);
            Thread.sleep(Long.parseLong(a[3]));
          } catch (InterruptedException e) { return; }
          main.interrupt();
        }).start();
        String outcome;
        try { StateServerProcess.get(launch(a[1], a[2]), 0); outcome = "started"; }
        catch (Throwable e) { outcome = e.getClass().getSimpleName(); }
        Thread.interrupted();
        Thread.sleep(1000);
        StringBuilder left = new StringBuilder();
        ProcessHandle.current().children().filter(ProcessHandle::isAlive)
            .forEach(p -> left.append(" ").append(p.pid()));
        System.out.println("startup " + outcome + " children" + left);
        System.out.flush();
        Runtime.getRuntime().halt(0); // no shutdown hook: what the failed start left is seen as is
      }
    }
  }
}
'''


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    import pyspark

    import keyedstate

    build = tmp_path_factory.mktemp("harness")
    (build / "BridgeHarness.java").write_text(HARNESS)
    classpath = f"{keyedstate.jar_path()}:{Path(pyspark.__file__).resolve().parent / 'jars'}/*"
    done = subprocess.run(["javac", "-nowarn", "-cp", classpath, "-d", str(build), str(build / "BridgeHarness.java")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr

    def run(*args: str, timeout: float = 120) -> tuple[str, str]:
        result = subprocess.run(["java", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{classpath}:{build}",
                                 "BridgeHarness", *args], capture_output=True, text=True, timeout=timeout,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        return result.stdout, result.stderr
    return run


def test_control_calls_log_no_py4j_commands(harness, tmp_path):
    """Failed before: every control call logged its command and its answer at INFO
    ('Sending CB command: c t processMemoryBytes e', 'Returning CB command: ...')."""
    out, err = harness("calls", sys.executable, str(tmp_path))
    assert "calls done" in out, f"the control calls failed: {out}\n{err[-3000:]}"
    assert "CB command" not in err and "Communication Channel" not in err, \
        f"py4j logged the control calls:\n{err[-2000:]}"


def test_an_interrupted_control_read_waits_without_spinning(harness, tmp_path):
    """A read on a connection whose peer never answers, by an interrupted thread: it times out
    after its full timeout, keeps the interrupt, and uses next to no CPU meanwhile. Failed before:
    it spun on the selector for the whole timeout (0.7 s of CPU in 5 s on a loaded 2-core box,
    a whole core on an idle one)."""
    path = tmp_path / "silent.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(4)
    try:
        out, err = harness("interrupt", str(path), "4000")
    finally:
        listener.close()
    fields = out.split()
    assert fields[:1] == ["interrupt"], f"the harness failed: {out}\n{err[-3000:]}"
    outcome, elapsed_ms, cpu_ms, kept = fields[1], int(fields[2]), int(fields[3]), fields[4]
    assert outcome == "SocketTimeoutException", out
    assert elapsed_ms >= 3900, f"the interrupted read ended early: {out}"
    assert kept == "true", "the interrupt was lost"
    assert cpu_ms < 100, f"the interrupted read spun: {cpu_ms} ms of CPU in {elapsed_ms} ms"


def test_an_interrupted_server_start_leaves_no_process(harness, tmp_path):
    """The store's first open starts a server, whose Python takes 3 s to start; the task's thread
    is interrupted 0.5 s after the process started. The start fails and the server process is gone. Failed before: the
    InterruptedException left the process running (until its stdin pipe was collected), and the
    next open started another."""
    slow = tmp_path / "slow-python"
    slow.write_text(f"#!/bin/sh\nsleep 3\nexec {sys.executable} \"$@\"\n")
    slow.chmod(0o700)
    out, err = harness("startup-interrupt", str(slow), str(tmp_path / "local"), "500")
    fields = out.split()
    assert fields[:1] == ["startup"], f"the harness failed: {out}\n{err[-3000:]}"
    assert fields[1] != "started", f"the start was not interrupted: {out}"
    left = [int(p) for p in fields[3:]]
    try:
        assert not left, f"an interrupted start left server processes running: {left}"
    finally:
        for pid in left:
            if alive(pid):
                os.kill(pid, 9)


def test_an_interrupted_thread_still_connects(harness, tmp_path):
    """A control connection opened by an interrupted thread (a killed task's cleanup, when no idle
    connection is pooled) connects and works, and the interrupt is kept. Failed before: the
    blocking channel closed itself at once (ClosedByInterruptException)."""
    path = tmp_path / "listener.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(4)
    try:
        out, err = harness("interrupted-connect", str(path))
        listener.settimeout(5)
        try:
            peer, _ = listener.accept()
            with peer:
                peer.settimeout(10)
                received = peer.recv(16)
        except socket.timeout:
            received = None
    finally:
        listener.close()
    assert out.split() == ["connect", "connected", "true"], f"{out}\n{err[-3000:]}"
    assert received == b"ping\n"
