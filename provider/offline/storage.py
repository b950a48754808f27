"""The offline tools' side of checkpoint storage (:mod:`..checkpoint.storage`): the SparkSession
that a checkpoint on a Hadoop file system is reached through.

:func:`open_storage` takes ``spark``, or the active SparkSession, or (for the command line) a
local one started with the Spark confs of the environment (``spark-defaults.conf``, ``--conf``
flags of the tool). The storage classes are re-exported for the tools that import them here.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..checkpoint import storage as _storage
from ..checkpoint.storage import (Entry, HadoopStorage, LocalStorage, MissingFileError, Storage,  # noqa: F401
                                  StorageError, describe_location, inside, is_local, link_refused, local_path)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_EXTRA_CONFS: dict[str, str] = {}


def open_storage(location: str | os.PathLike, spark: "SparkSession | None" = None) -> Storage:
    """The storage of a checkpoint location as a query names it (local storage needs no Spark)."""
    if spark is None and not is_local(location):
        spark = active_or_new_session()
    return _storage.open_storage(location, spark)


def set_session_confs(confs: dict[str, str]) -> None:
    """Spark confs for a session the command line starts (``--conf k=v``; e.g. credentials)."""
    _EXTRA_CONFS.update(confs)


def active_or_new_session() -> "SparkSession":
    """The active SparkSession, else a local one with keyedstate's jar on its classpath."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    from ..shim.session import configure  # selects the provider and puts its jar on the path

    builder = (SparkSession.builder.master("local[1]").appName("keyedstate-offline")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false"))
    for key, value in _EXTRA_CONFS.items():
        builder = builder.config(key, value)
    session = configure(builder).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
