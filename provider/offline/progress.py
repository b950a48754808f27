"""Progress of an offline tool's Spark job, logged on the driver: how many of its tasks have
finished, whenever that changes, so that a long rescale, migrate or transform shows it (the
remote session runs without Spark's console progress bar)."""
from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from typing import Iterator


class Progress:
    """Logs ``<phase> <done>/<total> <unit> done`` to ``log`` whenever the number of finished
    tasks of the job group changes (polled every ``interval`` seconds while the job runs)."""

    def __init__(self, sc, group: str, phase: str, total: int, log: logging.Logger, unit: str,
                 interval: float = 1.0) -> None:
        self._tracker, self._group, self._phase, self._total = sc.statusTracker(), group, phase, total
        self._log, self._unit = log, unit
        self._reported = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(interval,), daemon=True,
                                        name=f"keyedstate-{phase}-progress")
        self._thread.start()

    def _watch(self, interval: float) -> None:
        while not self._stopped.wait(interval):
            try:
                tracker = self._tracker
                stages = [s for j in tracker.getJobIdsForGroup(self._group) if (job := tracker.getJobInfo(j))
                          for s in job.stageIds]
                done = sum(stage.numCompletedTasks for s in stages if (stage := tracker.getStageInfo(s)))
            except Exception:  # the session is stopping: progress is only informational
                self._log.debug("no progress for %s", self._group, exc_info=True)
                return
            self.report(min(done, self._total))

    def report(self, done: int) -> None:
        if done != self._reported:
            self._reported = done
            self._log.info("%s %d/%d %s done", self._phase, done, self._total, self._unit)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()


class Steps:
    """Progress of a tool that works step by step in its own process: logs ``<phase> <done>/<total>
    <unit> done`` at most once per ``interval`` seconds, and always at the last step."""

    def __init__(self, phase: str, total: int, log: logging.Logger, unit: str, interval: float = 1.0) -> None:
        self._phase, self._total, self._log, self._unit, self._interval = phase, total, log, unit, interval
        self._done = 0
        self._logged_at = time.monotonic()

    def step(self) -> None:
        self._done += 1
        now = time.monotonic()
        if self._done == self._total or now - self._logged_at >= self._interval:
            self._logged_at = now
            self._log.info("%s %d/%d %s done", self._phase, self._done, self._total, self._unit)


@contextlib.contextmanager
def tracked(sc, tool: str, phase: str, total: int, log: logging.Logger, unit: str) -> Iterator[None]:
    """Runs the block's Spark jobs in a job group of their own, logging their progress, and
    ``<total>/<total>`` once the block has finished."""
    group = f"keyedstate-{tool}-{uuid.uuid4().hex[:8]}"
    before = {key: sc.getLocalProperty(key) for key in _GROUP_PROPERTIES}
    sc.setJobGroup(group, f"keyedstate {tool}: {phase} {total} {unit}")
    progress = Progress(sc, group, phase, total, log, unit)
    try:
        yield
    finally:
        progress.stop()
        for key, value in before.items():  # the caller's later jobs are not this block's
            sc.setLocalProperty(key, value)
    progress.report(total)


_GROUP_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
