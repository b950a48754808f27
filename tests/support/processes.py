"""Processes a test watches: state servers, their memory."""
from __future__ import annotations

import os
from pathlib import Path


def state_server_pids() -> list[int]:
    """PIDs of running keyedstate state servers (read from /proc, no extra dependency)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"keyedstate.server" in cmdline:
                pids.append(int(entry))
    return pids


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no VmRSS for pid {pid}")
