"""Locating, and if needed building, the JVM shim jar.

The jar is compiled from ``jvm_bridge/`` against the jars of the *installed* pyspark, with the
Scala compiler that ships inside pyspark, on first use, and cached under a name keyed by the
pyspark version and a hash of the sources. Building at first use rather than at ``pip install``
time means the jar always matches the pyspark it runs in (an upgrade of pyspark simply builds a
new one), and pip's isolated build environment, which has no pyspark, never needs to compile.

The cache cannot be planted: its directory is created private (0700) and refused if another user
owns it or group/others may write to it; a jar is used only if its SHA-256 matches the one
recorded next to it (``<jar>.sha256``) when it was built, checked on every call; the build lock
and temp files are opened without following symbolic links (temp files exclusively), and the jar
and its hash are published by atomic renames.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import secrets
import shutil
import stat
import subprocess
import tempfile
import zipfile
from pathlib import Path

from ..version import __version__

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
    """The sources and keyedstate's version (which the jar's manifest records) as a jar name's hash."""
    digest = hashlib.sha256()
    digest.update(__version__.encode())
    for path in sources:
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    base = os.environ.get("KEYEDSTATE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "keyedstate")
    return Path(base)


def _foreign_link(path: Path) -> tuple[str, int] | None:
    """The first symbolic link on the way to ``path`` (each component, and each link's target
    in turn) that neither root nor this user owns, with its owner; None if there is none. Such
    a link, e.g. in a sticky /tmp where fs.protected_symlinks is off, can be re-pointed by its
    owner at any time, so a cache reached through it is not private even if its end is."""
    trusted = (0, os.getuid())
    pending = list(reversed(Path(os.path.join(os.getcwd(), path)).parts))
    current = "/"
    hops = 0
    while pending:
        name = pending.pop()
        if name in ("/", "", "."):
            current = "/" if name == "/" else current
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:  # the rest is created by mkdir, under what was checked
            return None
        if not stat.S_ISLNK(st.st_mode):
            current = candidate
            continue
        if st.st_uid not in trusted:
            return candidate, st.st_uid
        hops += 1
        if hops > 40:
            raise JarBuildError(f"the keyedstate jar cache {path} is reached through too many symbolic links")
        pending.extend(reversed(Path(os.readlink(candidate)).parts))
    return None


def _private_cache_dir() -> Path:
    """The cache directory, created 0700 if missing; refused unless it is the user's alone and
    reached through no symbolic link of another user (:func:`_foreign_link`)."""
    directory = cache_dir()
    link = _foreign_link(directory)
    if link is not None:
        raise JarBuildError(
            f"the keyedstate jar cache {directory} is reached through the symbolic link {link[0]}, owned by uid "
            f"{link[1]}, not by this user (uid {os.getuid()}) or root: its owner could point it at a jar of their "
            "own. Set KEYEDSTATE_CACHE_DIR to a private directory reached through no other user's link")
    if not directory.exists():
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            pass
    st = directory.stat()
    problem = None
    if not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory"
    elif st.st_uid != os.getuid():
        problem = f"is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    elif st.st_mode & 0o022:
        problem = f"is writable by {'group and others' if st.st_mode & 0o022 == 0o022 else 'group' if st.st_mode & 0o020 else 'others'} (mode {stat.filemode(st.st_mode)})"
    if problem:
        raise JarBuildError(
            f"the keyedstate jar cache {directory} {problem}: anyone who can write there could plant the jar "
            f"Spark loads. Use a directory only you can write to: chmod 700 {directory} (if it is yours), or "
            "set KEYEDSTATE_CACHE_DIR to a private directory")
    return directory


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _hash_file(jar: Path) -> Path:
    return jar.with_name(jar.name + ".sha256")


def _verified(jar: Path) -> bool:
    """Whether ``jar`` is a regular file of this user whose contents match the hash recorded
    when it was built."""
    try:
        for path in (jar, _hash_file(jar)):
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
                return False
        recorded = _hash_file(jar).read_text(encoding="ascii").strip()
        return recorded == _sha256(jar)
    except (OSError, ValueError):
        return False


def _open_lock(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise JarBuildError(f"the build lock {path} is a symbolic link; keyedstate does not follow it. "
                                f"Remove it and retry") from None
        raise


def _publish(data_writer, target: Path) -> None:
    """Write a file next to ``target`` under a fresh temp name (O_EXCL | O_NOFOLLOW, so never
    through a planted link), fsync it, and rename it to ``target`` atomically."""
    temp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            data_writer(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, target)
    finally:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass


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
    directory = _private_cache_dir()
    target = directory / name
    if _verified(target):
        return str(target)
    lock = _open_lock(directory / ".build.lock")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several processes may start at once
        if not _verified(target):
            if target.exists() or target.is_symlink():
                log.warning("%s does not match the hash recorded when it was built (or has none): rebuilding it",
                            target)
            _build(sources, target)
    finally:
        os.close(lock)
    return str(target)


def _build(sources: list[Path], target: Path) -> None:
    jars = pyspark_jars_dir()
    log.info("building %s from %d sources against %s", target.name, len(sources), jars)
    with tempfile.TemporaryDirectory(prefix="keyedstate-build-") as tmp:  # private (mkdtemp)
        classes = Path(tmp) / "classes"
        classes.mkdir()
        cmd = [_java(), "-cp", f"{jars}/*", "scala.tools.nsc.Main", "-usejavacp", "-nowarn",
               "-d", str(classes), *map(str, sources)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise JarBuildError(f"compiling the keyedstate JVM shim failed:\n{result.stdout}{result.stderr}")
        partial = Path(tmp) / target.name
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            # Implementation-Version: the keyedstate whose Python the jar expects (DriverConfCheck)
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: keyedstate\nImplementation-Title: "
                         f"keyedstate\nImplementation-Version: {__version__}\n")
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, str(path.relative_to(classes)))
        digest = _sha256(partial)
        # The hash first: a reader that sees it with the old jar rebuilds, under the lock, after us.
        _publish(lambda fh: fh.write((digest + "\n").encode("ascii")), _hash_file(target))
        with open(partial, "rb") as source:
            _publish(lambda fh: shutil.copyfileobj(source, fh, 1 << 20), target)
