"""The one line a user needs when a query or a state read fails for a reason keyedstate can name.

Spark prints a failed query's exception with its plan and every task's stack trace after the
cause, so the cause (a bad keyedstate conf, a provider class the driver cannot load) ends far
from the end of what a program prints. :func:`summary` finds it in a PySpark exception;
:func:`install` adds it as the last line of an uncaught exception's report (``import
keyedstate`` installs it, chained to the hook before it).
"""
from __future__ import annotations

import re
import sys
import time
from types import TracebackType
from typing import Optional

from .shim import PROVIDER_CLASS

_JAR_HINT = ('add the keyedstate jar: spark-submit --jars "$(keyedstate jar)", or build the session '
             'with keyedstate.configure(SparkSession.builder)')
# A conf the state server refused (keyedstate/conf.py), or one the JVM checks (TTL overrides,
# launch knobs): each is one line naming the conf. The driver's check raises a refused value as
# Spark's INVALID_CONF_VALUE.REQUIREMENT, whose message wraps that line in Spark's template (the
# class and its sentence before it, the SQLSTATE after it): only the line is kept.
_CONF = re.compile(r"(?:keyedstate\.conf\.ConfError|java\.lang\.IllegalArgumentException|"
                   r"org\.apache\.spark\.SparkIllegalArgumentException): "
                   r"(?:\[INVALID_CONF_VALUE\.REQUIREMENT\] [^\n]*? is invalid\. )?"
                   r"((?:Unknown keyedstate conf|Invalid (?:value|conf)) [^\n]*?)(?: SQLSTATE: \w+)?$", re.MULTILINE)

# A failure keyedstate explains in one line of its own (a task's, as the driver reports it): a
# change feed or snapshot read the checkpoint cannot serve, a corrupt or missing file; after
# Spark's error class when it carries one ("[CANNOT_LOAD_STATE_STORE.UNCATEGORIZED] keyedstate: ...").
_OWN = re.compile(r"(?:io\.keyedstate\.[\w.$]+|org\.apache\.spark\.SparkException|java\.lang\.\w+Exception)"
                  r": (?:\[[A-Z][A-Z0-9_.]*\] )?(keyedstate: [^\n]*)")


def summary(exc: BaseException) -> Optional[str]:
    """``keyedstate: <what>`` for a failure keyedstate can name, else None."""
    text = "\n".join(filter(None, [str(getattr(exc, "_desc", "") or ""), str(getattr(exc, "_stackTrace", "") or ""),
                                   _plain_str(exc)]))
    if "keyedstate" not in text:
        return None
    if re.search(r"ClassNotFoundException: " + re.escape(PROVIDER_CLASS) + r"\b", text) or \
            re.search(r"terminated with exception: " + re.escape(PROVIDER_CLASS) + r"\b", text):
        return f"keyedstate: Spark cannot load {PROVIDER_CLASS} on the driver; {_JAR_HINT}"
    match = _CONF.search(text)
    if match:
        return f"keyedstate: {match.group(1).strip()}"
    match = _OWN.search(text)
    if match:
        return match.group(1).strip()
    return None


def _plain_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a PySpark exception's str asks the JVM, which may be gone
        return ""


def _wait_for_killed_tasks(timeout: float = 10.0) -> None:
    """Wait (bounded) until the active SparkContext runs no task: an aborted job's other tasks
    are killed asynchronously, and Spark logs each kill, which would bury the summary line."""
    try:
        from pyspark import SparkContext
        sc = SparkContext._active_spark_context
        if sc is None:
            return
        jsc = sc._jsc.sc()
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            jsc.listenerBus().waitUntilEmpty(max(1, int(left * 1000)))
            executors = jsc.statusStore().executorList(True)
            if sum(executors.apply(i).activeTasks() for i in range(executors.size())) == 0:
                return
            time.sleep(0.1)
    except Exception:  # the JVM may be gone or stopping: print the line as it is
        return


def install() -> None:
    """Print :func:`summary` after the report of an uncaught exception (once per process)."""
    previous = sys.excepthook
    if getattr(previous, "_keyedstate", False):
        return

    def hook(kind: type[BaseException], exc: BaseException, tb: Optional[TracebackType]) -> None:
        previous(kind, exc, tb)
        try:
            line = summary(exc)
        except Exception:
            line = None
        if line:
            _wait_for_killed_tasks()
            print(line, file=sys.stderr, flush=True)

    hook._keyedstate = True  # type: ignore[attr-defined]
    sys.excepthook = hook
