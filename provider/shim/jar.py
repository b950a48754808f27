"""Locating, and if needed building, the JVM shim jar.

The jar is compiled from ``jvm_bridge/`` against the jars of the *installed* pyspark, with the
Scala compiler that ships inside pyspark, on first use, and cached under a name keyed by the
pyspark version and a hash of the sources. Building at first use rather than at ``pip install``
time means the jar always matches the pyspark it runs in (an upgrade of pyspark simply builds a
new one), and pip's isolated build environment, which has no pyspark, never needs to compile.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the keyedstate package
_SOURCE_DIRS = (
    _PACKAGE_DIR / "_jvm_bridge",  # copied into wheels by setup.py
    _PACKAGE_DIR.parent / "jvm_bridge" / "src" / "main" / "scala",  # source checkout / editable
)


class JarBuildError(RuntimeError):
    """The shim could not be compiled; the message carries the compiler output."""


def pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def _pyspark_version() -> str:
    import pyspark

    return pyspark.__version__


def source_dir() -> Path:
    for candidate in _SOURCE_DIRS:
        if candidate.is_dir() and any(candidate.rglob("*.scala")):
            return candidate
    raise JarBuildError(f"JVM shim sources not found (looked in {', '.join(map(str, _SOURCE_DIRS))})")


def _sources_hash(sources: list[Path], root: Path) -> str:
    digest = hashlib.sha256()
    for path in sources:
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    base = os.environ.get("KEYEDSTATE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "keyedstate")
    return Path(base)


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise JarBuildError("no 'java' found on PATH or in JAVA_HOME; keyedstate needs JDK 17")
    return found


def jar_path() -> str:
    """Path of the shim jar for the installed pyspark, building it on first use."""
    src = source_dir()
    sources = sorted(src.rglob("*.scala"))
    name = f"keyedstate-{_pyspark_version()}-{_sources_hash(sources, src)}.jar"
    target = cache_dir() / name
    if target.exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several processes may start at once
        if not target.exists():
            _build(sources, target)
    return str(target)


def _build(sources: list[Path], target: Path) -> None:
    jars = pyspark_jars_dir()
    log.info("building %s from %d sources against %s", target.name, len(sources), jars)
    with tempfile.TemporaryDirectory(prefix="keyedstate-build-") as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        cmd = [_java(), "-cp", f"{jars}/*", "scala.tools.nsc.Main", "-usejavacp", "-nowarn",
               "-d", str(classes), *map(str, sources)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise JarBuildError(f"compiling the keyedstate JVM shim failed:\n{result.stdout}{result.stderr}")
        partial = Path(tmp) / target.name
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: keyedstate\n")
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, str(path.relative_to(classes)))
        shutil.move(str(partial), target.with_suffix(".tmp"))
        os.replace(target.with_suffix(".tmp"), target)
