"""The test-only JVM classes (``tests/jvm/src``) and helpers to drive them from Python.

The jar is compiled with ``javac`` against the installed pyspark's jars on first use and cached
under the same cache directory as the keyedstate shim (``$KEYEDSTATE_CACHE_DIR`` or
``~/.cache/keyedstate``), named by pyspark version and a hash of the sources, so every checkout
and pyspark version gets a matching jar and nothing is built twice. Building takes a few seconds.

The object-store test filesystem (``objtest://bucket/key``, see ObjectStoreFileSystem.java) is
controlled through files in its backing root, not through py4j, because executors are separate
JVMs: ``arm()`` rewrites the control file that every JVM re-reads, ``injected_faults()`` reads the
log every JVM appends to.
"""
from __future__ import annotations

import collections
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import uuid
import zipfile
from pathlib import Path
from typing import Any, Mapping

SOURCE_DIR = Path(__file__).resolve().parent.parent / "jvm" / "src"
OBJTEST_CLASS = "io.keyedstate.testing.ObjectStoreFileSystem"
OPS = ("create", "rename", "open", "listStatus", "delete", "hsync")


class TestJarBuildError(RuntimeError):
    """javac failed; the message carries its output."""


def _pyspark() -> tuple[str, Path]:
    import pyspark

    return pyspark.__version__, Path(pyspark.__file__).resolve().parent / "jars"


def _cache_dir() -> Path:
    base = os.environ.get("KEYEDSTATE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "keyedstate")
    return Path(base)


def _javac() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").exists():
        return str(Path(home) / "bin" / "javac")
    found = shutil.which("javac")
    if not found:
        raise TestJarBuildError("no 'javac' on PATH or in JAVA_HOME: the test jar needs a JDK 17")
    return found


def test_jar_path() -> str:
    """Path of the test jar for the installed pyspark, compiling it on first use."""
    version, jars = _pyspark()
    sources = sorted(SOURCE_DIR.rglob("*.java"))
    if not sources:
        raise TestJarBuildError(f"no Java sources under {SOURCE_DIR}")
    digest = hashlib.sha256()
    for path in sources:
        digest.update(str(path.relative_to(SOURCE_DIR)).encode())
        digest.update(path.read_bytes())
    target = _cache_dir() / f"keyedstate-testing-{version}-{digest.hexdigest()[:16]}.jar"
    if target.exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build-testing.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # pytest-xdist workers, or two test runs, may race here
        if not target.exists():
            _build(sources, jars, target)
    return str(target)


test_jar_path.__test__ = False  # its name starts with "test": not a pytest test


def _build(sources: list[Path], jars: Path, target: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="keyedstate-testjar-") as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        cmd = [_javac(), "--release", "17", "-nowarn", "-encoding", "UTF-8", "-cp", f"{jars}/*",
               "-d", str(classes), *map(str, sources)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise TestJarBuildError(f"compiling the test jar failed:\n{result.stdout}{result.stderr}")
        partial = target.parent / f".{target.name}.{os.getpid()}.tmp"  # same directory: atomic rename
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: keyedstate tests\n")
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, str(path.relative_to(classes)))
        os.replace(partial, target)


# ------------------------------------------------------------------ the objtest:// filesystem

def objtest_conf(root: str | os.PathLike, settings: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Spark confs for a session that uses ``objtest://`` (driver and executors).

    ``settings`` are static ObjectStoreFileSystem keys (``{"rename.existing": "overwrite"}``).
    The result sets ``spark.jars`` to the test jar; to add other jars, join them with a comma.
    """
    conf = {
        "spark.jars": test_jar_path(),
        "spark.hadoop.fs.objtest.impl": OBJTEST_CLASS,
        "spark.hadoop.fs.objtest.root": str(Path(root).resolve()),
    }
    for key, value in (settings or {}).items():
        conf[f"spark.hadoop.fs.objtest.{key}"] = str(value)
    return conf


FORKLESS_LOCAL_CLASS = "io.keyedstate.checkpoint.ForklessLocalFileSystem"
PLAIN_LOCAL_FS_ENV = "KEYEDSTATE_TEST_PLAIN_LOCAL_FS"


def forkless_local_conf() -> dict[str, str]:
    """Spark confs that serve every ``file:`` path (Spark's own files too) with keyedstate's
    forkless local file system (ForklessLocalFileSystem.scala: Hadoop's, minus the ``readlink``
    and ``chmod`` child processes it starts without its native library, as with pyspark; they
    made local-checkpoint queries 2x slower on 2 cores). keyedstate uses it for its own files
    anyway; this makes Spark's files cheap too. Empty when ``$KEYEDSTATE_TEST_PLAIN_LOCAL_FS`` is
    set: then Spark's files go through Hadoop's own. keyedstate's jar goes on the class paths,
    not only in ``spark.jars``: spark-submit reads local files before ``spark.jars`` is loaded."""
    if os.environ.get(PLAIN_LOCAL_FS_ENV):
        return {}
    from keyedstate.shim.jar import jar_path

    jar = jar_path()
    return {"spark.driver.extraClassPath": jar,
            "spark.executor.extraClassPath": jar,
            "spark.hadoop.fs.file.impl": FORKLESS_LOCAL_CLASS,
            "spark.hadoop.fs.AbstractFileSystem.file.impl": FORKLESS_LOCAL_CLASS + "$Fs"}


def jvm_main_command(main_class: str, *jvm_options: str) -> list[str]:
    """A command running ``main_class`` of the test jar in a JVM of its own, with keyedstate's jar
    and pyspark's jars on its class path (``$JAVA_HOME``'s java, else the one on PATH)."""
    from keyedstate.shim.jar import jar_path, pyspark_jars_dir

    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
    classpath = os.pathsep.join([jar_path(), test_jar_path(), f"{pyspark_jars_dir()}/*"])
    return [java, *jvm_options, "-cp", classpath, main_class]


def hadoop_fs(spark, uri: str):
    """The JVM FileSystem for ``uri`` as the driver sees it, and the Hadoop Path of ``uri``."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path


def _meta(root: str | os.PathLike) -> Path:
    return Path(root) / ".objtest"


def arm(root: str | os.PathLike, rules: Mapping[str, Any] | None = None, **ops: Mapping[str, Any]) -> None:
    """Replace the fault rules of every JVM using ``root``, and restart their counters.

    ``arm(root, create={"nth": 2, "path": "/state/"}, rename={"nth": 1, "at": "afterCopy"})``;
    keys without an operation go in ``rules``: ``arm(root, {"shortReads": "true",
    "diskFull.afterBytes": 4096, "rename.delayMs": 500})``. Counting is per JVM unless an
    operation says ``"scope": "global"``. A JVM sees the new rules at its next filesystem call.
    """
    lines = [f"generation={uuid.uuid4().hex}"]
    for key, value in (rules or {}).items():
        lines.append(f"{key}={_prop(value)}")
    for op, spec in ops.items():
        if op.split("#")[0] not in OPS:  # "rename#2": a second rule on rename, counted apart
            raise ValueError(f"unknown operation {op!r}: one of {', '.join(OPS)} (or <op>#<1..9>)")
        lines.extend(f"{op}.{key}={_prop(value)}" for key, value in spec.items())
    meta = _meta(root)
    meta.mkdir(parents=True, exist_ok=True)
    tmp = meta / f".control.{os.getpid()}.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, meta / "control")  # a new inode: every JVM notices, none reads half a file


def _prop(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def disarm(root: str | os.PathLike) -> None:
    """No more faults or dynamic settings (static Hadoop conf settings still apply)."""
    arm(root)


def injected_faults(root: str | os.PathLike) -> list[dict[str, Any]]:
    """Every fault injected so far, by any JVM: op, kind (start/close/afterCopy/diskFull/shortRead),
    call (the matching call's number, or bytes for diskFull), pid, time_ms and paths."""
    log = _meta(root) / "faults.log"
    if not log.exists():
        return []
    faults = []
    for line in log.read_text().splitlines():
        time_ms, pid, op, kind, call, *paths = line.split("\t")
        faults.append({"time_ms": int(time_ms), "pid": int(pid), "op": op, "kind": kind,
                       "call": int(call), "paths": paths})
    return faults


def fault_counts(root: str | os.PathLike) -> collections.Counter:
    """Injected faults per operation (``write`` counts disk-full failures; ``open`` includes
    streams that returned short reads)."""
    return collections.Counter(f["op"] for f in injected_faults(root))


def clear_fault_log(root: str | os.PathLike) -> None:
    (_meta(root) / "faults.log").unlink(missing_ok=True)
