"""Issue 11, the jar cache cannot be planted: the cache directory is created private and
refused when another user owns it or group/others can write to it; a file that merely has the
jar's name is not trusted; lock and temp files are not opened through symlinks and the jar is
published atomically.

Everything goes through the real ``keyedstate jar`` command with ``KEYEDSTATE_CACHE_DIR``. A
build that must happen runs a stand-in for the Scala compiler (a ``java`` on PATH that writes a
class file after a second), so that the cache's file handling is tested without a 30 s
compile; tests that only need a build to *start* run with no ``java`` at all, so that it stops
right after taking its lock."""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.timeout(300)

NOBODY = 65534

FAKE_COMPILER = """#!/bin/sh
# Stands in for `java -cp ... scala.tools.nsc.Main ... -d <dir> <sources>`: one class file, a second later.
while [ "$#" -gt 0 ]; do
  if [ "$1" = "-d" ]; then out="$2"; fi
  shift
done
sleep 1
mkdir -p "$out/io/keyedstate"
printf 'not a real class' > "$out/io/keyedstate/Compiled.class"
"""


def keyedstate_jar(cache: Path | None, **env_changes: str | None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "keyedstate.cli", "jar"], capture_output=True, text=True,
                          env=jar_env(cache, **env_changes), timeout=600)


def jar_env(cache: Path | None, **env_changes: str | None) -> dict:
    env = dict(os.environ)
    env.pop("KEYEDSTATE_CACHE_DIR", None)
    if cache is not None:
        env["KEYEDSTATE_CACHE_DIR"] = str(cache)
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def printed_path(result: subprocess.CompletedProcess) -> Path:
    return Path(result.stdout.strip().splitlines()[-1])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def no_java(tmp_path: Path) -> dict:
    """An environment in which no JVM can be found: a build stops at once, after its lock."""
    empty = tmp_path / "no-java-bin"
    empty.mkdir(exist_ok=True)
    return {"PATH": str(empty), "JAVA_HOME": None}


@pytest.fixture(scope="module")
def fake_compiler(tmp_path_factory) -> dict:
    """An environment whose only ``java`` is FAKE_COMPILER."""
    bin_dir = tmp_path_factory.mktemp("fake-java-bin")
    java = bin_dir / "java"
    java.write_text(FAKE_COMPILER)
    java.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "JAVA_HOME": None}


@pytest.fixture(scope="module")
def jar_name() -> str:
    """The name this installation's jar has in any cache (pyspark version, hash of the sources)."""
    from keyedstate.shim import jar

    src = jar.source_dir()
    return f"keyedstate-{jar._pyspark_version()}-{jar._sources_hash(sorted(src.rglob('*.scala')), src)}.jar"


@pytest.fixture(scope="module")
def genuine_jar() -> Path:
    """The shim jar of this installation, from the default cache (the suite's Spark uses it)."""
    result = keyedstate_jar(None)
    assert result.returncode == 0, result.stderr[-3000:]
    return printed_path(result)


def assert_refused_or_not_used(result: subprocess.CompletedProcess, cache: Path, why: str) -> None:
    if result.returncode == 0:
        used = printed_path(result)
        assert not used.resolve().is_relative_to(cache.resolve()), (
            f"`keyedstate jar` used {used} from {cache}, {why}")
    else:
        assert str(cache) in result.stderr, f"refused without naming {cache}: {result.stderr[-1500:]}"
        assert "Traceback" not in result.stderr, result.stderr[-1500:]


@pytest.fixture(scope="module")
def other_device_tmpdir(tmp_path_factory):
    """A TMPDIR on another file system than the cache, so that a finished build crosses devices
    (what happens whenever $TMPDIR and the home directory are on different file systems)."""
    base = tmp_path_factory.getbasetemp()
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shm.stat().st_dev != base.stat().st_dev:
        path = shm / f"keyedstate-test-{uuid.uuid4()}"
        path.mkdir()
        yield path
        shutil.rmtree(path, ignore_errors=True)
        return
    mount_point = tmp_path_factory.mktemp("other-device")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(mount_point)],
                      capture_output=True).returncode != 0:
        yield None
        return
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


@pytest.fixture(scope="module")
def fresh_build(jar_name, fake_compiler, tmp_path_factory, other_device_tmpdir):
    """One build into a cache directory that does not exist yet. While it compiles, a symlink
    to a victim file is planted at the name a build's temp file once had next to the jar
    (``<jar name>.tmp``), as anyone able to write there could do."""
    root = tmp_path_factory.mktemp("fresh-build")
    cache = root / "home" / "keyedstate-cache"
    victim = root / "victim.txt"
    victim.write_text("precious\n")
    temp_link = cache / (jar_name[: -len(".jar")] + ".tmp")
    env = jar_env(cache, **fake_compiler)
    if other_device_tmpdir is not None:
        env["TMPDIR"] = str(other_device_tmpdir)
    proc = subprocess.Popen([sys.executable, "-m", "keyedstate.cli", "jar"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    planted = False
    while proc.poll() is None:
        if not planted and cache.is_dir():
            try:
                os.symlink(victim, temp_link)
                planted = True
            except OSError:
                pass
        time.sleep(0.01)
    stdout, stderr = proc.communicate()
    return SimpleNamespace(result=subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr),
                           cache=cache, victim=victim, planted=planted, crossed_devices=other_device_tmpdir is not None)


def test_cache_dir_is_created_private(fresh_build):
    result, cache = fresh_build.result, fresh_build.cache
    assert result.returncode == 0, result.stderr[-3000:]
    st = cache.stat()
    assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0, (
        f"the cache directory was created {stat.filemode(st.st_mode)} (uid {st.st_uid}); expected 0700")
    jar = printed_path(result)
    if not jar.is_symlink():  # (a symlink is the last test's business)
        assert stat.S_IMODE(jar.stat().st_mode) & 0o022 == 0, stat.filemode(jar.stat().st_mode)


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777], ids=["world-writable", "group-writable", "sticky-world-writable"])
def test_cache_dir_writable_by_others_is_refused(genuine_jar, tmp_path, mode):
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    shutil.copyfile(genuine_jar, cache / genuine_jar.name)  # what anyone could have put there
    os.chmod(cache, mode)
    result = keyedstate_jar(cache)
    assert_refused_or_not_used(result, cache, f"a directory with mode {stat.filemode(cache.stat().st_mode)}")


def test_cache_dir_owned_by_another_user_is_refused(genuine_jar, tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    cache = tmp_path / "their-cache"
    cache.mkdir()
    shutil.copyfile(genuine_jar, cache / genuine_jar.name)
    os.chown(cache / genuine_jar.name, NOBODY, NOBODY)
    os.chown(cache, NOBODY, NOBODY)
    os.chmod(cache, 0o755)
    result = keyedstate_jar(cache)
    assert_refused_or_not_used(result, cache, f"a directory owned by uid {NOBODY}")


def test_cache_reached_through_another_users_link_is_refused(genuine_jar, tmp_path):
    """A private cache directory of this user, reached through a symbolic link that another user
    (nobody) owns in a sticky, world-writable directory: with fs.protected_symlinks=0 the link
    is followed, and its owner can re-point it at a directory of their own whenever they like."""
    if os.getuid() != 0:
        pytest.skip("needs root to give a symbolic link to another user")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    mine = tmp_path / "mine"
    cache = mine / "keyedstate"
    cache.mkdir(parents=True, mode=0o700)
    mine.chmod(0o700)
    shutil.copyfile(genuine_jar, cache / genuine_jar.name)
    shutil.copyfile(genuine_jar.with_name(genuine_jar.name + ".sha256"), cache / (genuine_jar.name + ".sha256"))
    link = shared / "cache"
    os.symlink(mine, link)
    os.lchown(link, NOBODY, NOBODY)
    assert os.lstat(link).st_uid == NOBODY
    result = keyedstate_jar(link / "keyedstate")
    assert result.returncode != 0, f"`keyedstate jar` used {result.stdout.strip()} through {link}, owned by uid {NOBODY}"
    assert str(link) in result.stderr and f"uid {NOBODY}" in result.stderr, result.stderr[-1500:]
    assert "Traceback" not in result.stderr, result.stderr[-1500:]
    # a link of this user's own is followed as before
    own = tmp_path / "own-link"
    os.symlink(mine, own)
    result = keyedstate_jar(own / "keyedstate")
    assert result.returncode == 0 and printed_path(result) == own / "keyedstate" / genuine_jar.name, result.stderr[-1500:]


def test_planted_file_with_the_jars_name_is_not_used(jar_name, fake_compiler, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    planted = cache / jar_name
    with zipfile.ZipFile(planted, "w") as jar:  # a well-formed jar, just not ours
        jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: keyedstate\n")
        jar.writestr("io/keyedstate/spark/Planted.class", b"\xca\xfe\xba\xbe not really")
    planted_hash = sha256(planted)
    (cache / (jar_name + ".sha256")).write_text("0" * 64 + "\n")  # a hash that does not match it
    result = keyedstate_jar(cache, **fake_compiler)
    if result.returncode == 0:
        used = printed_path(result)
        assert sha256(used) != planted_hash, f"`keyedstate jar` handed out the planted {used} (trusted by its name alone)"


def test_lock_file_symlink_is_not_followed(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, cache / ".build.lock")
    keyedstate_jar(cache, **no_java(tmp_path))  # the build cannot succeed; only its lock matters
    assert victim.is_file() and victim.read_text() == "precious\n", \
        f"the build lock was opened through the symlink {cache / '.build.lock'}: {victim} now holds {victim.read_bytes()[:40]!r}"


def test_build_temp_file_symlink_is_not_followed_and_the_jar_is_published_atomically(fresh_build):
    """The symlink planted at a build's temp name (see fresh_build) must not receive the jar,
    and the published jar must be a regular file, not the planted link."""
    if not fresh_build.crossed_devices:
        pytest.skip("no second file system for TMPDIR (no /dev/shm, cannot mount a tmpfs)")
    assert fresh_build.planted, "the cache directory never appeared during the build"
    result, victim = fresh_build.result, fresh_build.victim
    problems = []
    if victim.read_bytes() != b"precious\n":
        problems.append(f"{victim} was overwritten through the planted temp-file symlink "
                        f"(now {victim.stat().st_size} bytes)")
    if result.returncode == 0:
        jar = printed_path(result)
        if jar.is_symlink():
            problems.append(f"the published jar {jar} is a symlink to {os.readlink(jar)}")
    assert not problems, "\n".join(problems)
