"""Snapshots of directory trees, to tell what a run created, changed or deleted, and the names
created in directories while something runs (Linux inotify: every name, however short-lived)."""
from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path


def tree(root: Path) -> dict[str, tuple[str, int, bytes | None]]:
    """Everything under ``root`` (not following symlinks): relative path -> (kind, mode, content)."""
    out: dict[str, tuple[str, int, bytes | None]] = {}
    if not os.path.lexists(root):
        return out
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = ("link", st.st_mode & 0o7777, os.readlink(path).encode())
            elif path.is_dir():
                out[rel] = ("dir", st.st_mode & 0o7777, None)
            else:
                try:
                    data = path.read_bytes() if path.is_file() else None
                except OSError:
                    data = None
                out[rel] = ("file", st.st_mode & 0o7777, data)
    return out


def describe_changes(before: dict, after: dict) -> list[str]:
    changes = []
    for rel in sorted(set(before) | set(after)):
        if rel not in before:
            changes.append(f"created {rel} ({after[rel][0]})")
        elif rel not in after:
            changes.append(f"deleted {rel}")
        elif before[rel] != after[rel]:
            changes.append(f"modified {rel}")
    return changes


class CreatedNames:
    """Every name created or moved into ``dirs`` (not recursive) between construction and
    :meth:`close`, read from Linux inotify: a temp file that lives for microseconds is seen too,
    where listing the directory in a loop catches it only by luck."""

    _IN_CREATE, _IN_MOVED_TO, _IN_Q_OVERFLOW = 0x100, 0x80, 0x4000
    _IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000
    _EVENT = struct.Struct("iIII")

    def __init__(self, dirs: list[Path]) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._fd = libc.inotify_init1(self._IN_NONBLOCK | self._IN_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._dirs: dict[int, Path] = {}
        self.paths: set[Path] = set()
        try:
            for d in dirs:
                wd = libc.inotify_add_watch(self._fd, os.fsencode(d), self._IN_CREATE | self._IN_MOVED_TO)
                if wd < 0:
                    raise OSError(ctypes.get_errno(), f"inotify_add_watch {d}")
                self._dirs[wd] = Path(d)
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise

    def close(self) -> set[Path]:
        """Stop watching; every path created meanwhile (an overflowed event queue is an error:
        names would be missing)."""
        if self._fd < 0:
            return self.paths
        try:
            while True:
                try:
                    data = os.read(self._fd, 1 << 16)
                except BlockingIOError:
                    break
                at = 0
                while at < len(data):
                    wd, mask, _cookie, length = self._EVENT.unpack_from(data, at)
                    name = data[at + self._EVENT.size: at + self._EVENT.size + length].rstrip(b"\0")
                    at += self._EVENT.size + length
                    if mask & self._IN_Q_OVERFLOW:
                        raise RuntimeError(f"inotify queue overflowed watching {sorted(map(str, self._dirs.values()))}")
                    if name and wd in self._dirs:
                        self.paths.add(self._dirs[wd] / os.fsdecode(name))
        finally:
            os.close(self._fd)
            self._fd = -1
        return self.paths
