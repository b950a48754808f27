"""Enabling keyedstate on a SparkSession builder: :func:`configure` puts the shim jar on the
classpath and selects keyedstate as the state store provider (the package root re-exports it;
the offline tools' local session uses it too)."""
from __future__ import annotations

import logging
import os
import sys
import urllib.parse
from typing import TYPE_CHECKING, Any

from .. import conf
from . import PROVIDER_CLASS
from .jar import jar_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PROVIDER_CLASS_CONF = "spark.sql.streaming.stateStore.providerClass"

log = logging.getLogger(__name__)


def configure(builder: "SparkSession.Builder", **options: Any) -> "SparkSession.Builder":
    """Put the shim jar on the classpath, select keyedstate as the provider, set knobs.

    ``options`` are keyedstate knobs by short name (``snapshotInterval=5``); they are validated
    here, before the session starts. The state server runs on this interpreter unless
    ``pythonExec`` (or ``spark.pyspark.python``) says otherwise.
    """
    confs = {conf.PREFIX + name: str(value) for name, value in options.items()}
    conf.parse(confs)  # fail fast on the driver with the same message executors would give
    jar = jar_path()
    jars = _merged_jars(getattr(builder, "_options", {}).get("spark.jars"), jar)
    _add_to_running_driver(jar)
    builder = builder.config("spark.jars", jars).config(PROVIDER_CLASS_CONF, PROVIDER_CLASS)
    if "pythonExec" not in options:  # used only when spark.pyspark.python/PYSPARK_PYTHON are unset
        builder = builder.config(conf.PREFIX + "pythonExec", sys.executable)
    for key, value in confs.items():
        builder = builder.config(key, value)
    return builder


def _merged_jars(on_builder: str | None, jar: str) -> str:
    """``spark.jars`` with keyedstate's jar appended: after the launcher's (spark-submit's
    ``--jars``/``spark.jars``, which the builder's value would replace) and the builder's own."""
    launcher = None
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # spark-submit started the driver JVM: connect to it
        from pyspark import SparkContext

        SparkContext._ensure_initialized()
        launcher = SparkContext._jvm.java.lang.System.getProperty("spark.jars")
    merged: dict[str, str] = {}  # one entry per file, however given (spark-submit makes paths file: URIs)
    for entry in filter(None, (e.strip() for e in ",".join(filter(None, [launcher, on_builder, jar])).split(","))):
        merged.setdefault(_jar_file(entry), entry)
    return ",".join(merged.values())


def _jar_file(entry: str) -> str:
    """The file a ``spark.jars`` entry names, as Spark resolves it: a plain path against the
    working directory, a ``file:`` URI percent-decoded; ``..`` and links resolved. Entries of
    other schemes stay as given."""
    url = urllib.parse.urlparse(entry)
    if url.scheme == "file":
        return os.path.realpath(urllib.parse.unquote(url.path))
    if url.scheme == "" or len(url.scheme) == 1:  # a plain path (or a drive letter)
        return os.path.realpath(entry)
    return entry


def _add_to_running_driver(jar: str) -> None:
    """Make a driver JVM that is already running load the provider class.

    ``spark.jars`` reaches the driver's class loader only when it launches the JVM; a session
    built in a JVM that is already up (a second session in one Python process) gets the jar on
    its executors alone, and Spark loads the provider class on the driver too (the streaming UI
    tab that ``spark.streams`` creates, a stateful operator's metrics), with the context class
    loader that spark-submit installed: a MutableURLClassLoader, shared by the driver's threads.
    """
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return  # the JVM is launched with spark.jars on its class path
    loader = gateway.jvm.java.lang.Thread.currentThread().getContextClassLoader()
    try:
        loader.loadClass(PROVIDER_CLASS)
        return
    except Exception:  # py4j's Py4JJavaError wrapping ClassNotFoundException
        pass
    try:
        loader.addURL(gateway.jvm.java.io.File(jar).toURI().toURL())
    except Exception as exc:
        log.warning("keyedstate: cannot add %s to the running driver JVM's class loader (%s); "
                    "start the session in a fresh Python process", jar, exc)
