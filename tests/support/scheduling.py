"""How pytest-xdist shares the suite between its workers (pyproject.toml: ``-n 2 --dist loadfile``).

A worker runs whole files, so a module-scoped fixture is built once, and all of tests/storage, so
that one worker alone starts HDFS, moto and the s3a session (session fixtures, ~1 min each on 2
loaded cores) and runs each scenario on them once. (``--dist loadgroup`` with ``xdist_group``
marks would say the same, but pytest-xdist 3.8 groups by editing ``item._nodeid``, which pytest 9
no longer reads: the marks are silently ignored.)
"""
from __future__ import annotations

from xdist.scheduler import LoadFileScheduling

GROUPED_DIRS = {("tests", "storage")}
"""Directories whose files share one worker."""


class FileOrDirScheduling(LoadFileScheduling):
    def _split_scope(self, nodeid: str) -> str:
        file = nodeid.split("::", 1)[0]
        parts = tuple(file.split("/"))
        for grouped in GROUPED_DIRS:
            if parts[:len(grouped)] == grouped:
                return "/".join(grouped)
        return file
