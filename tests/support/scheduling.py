"""How pytest-xdist shares the suite between its workers (pyproject.toml: ``-n 2 --dist loadfile``;
the scheduler below extends xdist 3's LoadFileScheduling, so setup.py keeps xdist below 4).

A worker runs whole files, so a module-scoped fixture is built once, and all of tests/storage, so
that one worker alone starts HDFS, moto and the s3a session (session fixtures, ~1 min each on 2
loaded cores) and runs each scenario on them once. (``--dist loadgroup`` with ``xdist_group``
marks would say the same, but pytest-xdist 3.8 groups by editing ``item._nodeid``, which pytest 9
no longer reads: the marks are silently ignored.)

Workers take files in order, the next when they run out; xdist's order (most tests first) would
leave the files of one or two tests that run for minutes (clusters, fault campaigns) to the
end, where one worker runs the last of them alone. LONG_FIRST goes first instead.
"""
from __future__ import annotations

from xdist.scheduler import LoadFileScheduling

GROUPED_DIRS = ("tests/storage",)
"""Directories whose files share one worker."""

LONG_FIRST = (
    "tests/storage",  # HDFS, moto and an s3a session; every scenario run on both
    "tests/offline/test_rescaling.py",
    "tests/offline/test_rescale_in_driver.py",  # CLI drivers killed mid-split
    "tests/queries/test_first_contact.py",
    "tests/durability/test_provider_lifetime.py",
    "tests/queries/test_memory_budget.py",  # a state ten times its budget
    "tests/durability/test_cluster.py",  # local-cluster, executors killed
    "tests/durability/test_fault_campaign.py",  # child drivers killed, round after round
    "tests/durability/test_spark_submit_exit.py",
    "tests/durability/test_speculation.py",  # a standalone cluster on two hosts
)
"""Units that each run for minutes, longest first (a file missing here is ignored)."""


class FileOrDirScheduling(LoadFileScheduling):
    _ordered = False

    def _split_scope(self, nodeid: str) -> str:
        file = nodeid.split("::", 1)[0]
        return next((d for d in GROUPED_DIRS if file.startswith(d + "/")), file)

    def _assign_work_unit(self, node) -> None:
        if not self._ordered:  # the first call: the work queue is complete, nothing taken yet
            self._ordered = True
            rank = {scope: i for i, scope in enumerate(LONG_FIRST)}
            # a stable sort: the other files keep xdist's order
            for scope in sorted(self.workqueue, key=lambda s: rank.get(s, len(rank))):
                self.workqueue.move_to_end(scope)
        super()._assign_work_unit(node)
