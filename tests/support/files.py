"""Snapshots of directory trees, to tell what a run created, changed or deleted."""
from __future__ import annotations

import os
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
