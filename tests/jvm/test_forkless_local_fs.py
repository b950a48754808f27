"""keyedstate's local file system (ForklessLocalFileSystem.scala), which serves its checkpoint
files on ``file:`` when the conf leaves ``file:`` to Hadoop's own (and the suite's Spark files,
testjar.forkless_local_conf): it answers like Hadoop's own, through FileSystem and FileContext
(same modes after create, mkdirs and setPermission under the configured umask, same statuses for
files, directories, symlinks, dangling symlinks and missing paths), and keyedstate's checkpoint
writes start none of the ``chmod`` and ``readlink`` processes Hadoop's own starts without its
native library (pyspark ships none)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from py4j.protocol import Py4JJavaError

from support import testjar


@pytest.fixture
def both(spark):
    """(name, conf) of Hadoop's own local file system (a fresh Configuration) and keyedstate's
    (what keyedstate makes of that conf for a ``file:`` checkpoint; of a conf that names Hadoop's
    class itself, nothing)."""
    jvm = spark._jvm
    plain = jvm.org.apache.hadoop.conf.Configuration()
    plain.set("fs.permissions.umask-mode", "027")
    forkless = jvm.io.keyedstate.checkpoint.ForklessLocalFileSystem.confFor(
        jvm.org.apache.hadoop.fs.Path("file:///checkpoint"), plain)
    assert forkless.get("fs.file.impl") == testjar.FORKLESS_LOCAL_CLASS
    kept = jvm.org.apache.hadoop.conf.Configuration(plain)
    kept.set("fs.file.impl", "org.apache.hadoop.fs.LocalFileSystem")
    assert jvm.io.keyedstate.checkpoint.ForklessLocalFileSystem.confFor(
        jvm.org.apache.hadoop.fs.Path("file:///checkpoint"), kept).equals(kept)
    return jvm, [("hadoop", plain), ("forkless", forkless)]


def _statuses(jvm, conf, root, via_context: bool) -> dict:
    hpath = jvm.org.apache.hadoop.fs.Path
    uri = jvm.java.net.URI("file:///")
    fs = jvm.org.apache.hadoop.fs.FileSystem.newInstance(uri, conf)
    fc = jvm.org.apache.hadoop.fs.FileContext.getLocalFSFileContext(conf)
    perm = jvm.org.apache.hadoop.fs.permission.FsPermission
    try:
        if via_context:
            flags = jvm.java.util.EnumSet.of(jvm.org.apache.hadoop.fs.CreateFlag.CREATE)
            create_opts = jvm.org.apache.hadoop.fs.Options.CreateOpts
            opts = _array(create_opts, [create_opts.perms(perm(0o666))])
            fc.create(hpath(f"{root}/file"), flags, opts).close()
            fc.mkdir(hpath(f"{root}/dir"), perm(0o777), True)
        else:
            fs.create(hpath(f"{root}/file"), perm(0o666), True, 4096, 1, 1 << 20, None).close()
            fs.mkdirs(hpath(f"{root}/dir"), perm(0o777))
        fs.create(hpath(f"{root}/changed"), True).close()
        fs.setPermission(hpath(f"{root}/changed"), perm(0o604))
        os.symlink(f"{root}/file", f"{root}/link")
        os.symlink(f"{root}/gone", f"{root}/dangling")
        out = {name: oct(os.lstat(f"{root}/{name}").st_mode & 0o7777) for name in ("file", "dir", "changed")}
        for name in ("file", "dir", "link", "dangling", "missing"):
            try:
                s = (fc.getFileLinkStatus if via_context else fs.getFileLinkStatus)(hpath(f"{root}/{name}"))
                out[f"status {name}"] = (s.isFile(), s.isDirectory(), s.isSymlink(), s.getLen(),
                                         str(s.getSymlink()).rsplit("/", 1)[-1] if s.isSymlink() else None,
                                         s.getPath().getName())
            except Py4JJavaError as e:  # the Java exception's class is what is compared
                out[f"status {name}"] = e.java_exception.getClass().getName()
        return out
    finally:
        fs.close()


def _array(cls, items):
    """A Java array of ``cls`` (py4j: through the gateway)."""
    from pyspark import SparkContext

    array = SparkContext._gateway.new_array(cls, len(items))
    for i, item in enumerate(items):
        array[i] = item
    return array


@pytest.mark.parametrize("setgid_root", [False, True], ids=["plain-root", "setgid-root"])
@pytest.mark.parametrize("via_context", [False, True], ids=["FileSystem", "FileContext"])
def test_keyedstates_local_file_system_answers_like_hadoops(both, tmp_path, via_context, setgid_root):
    """A setgid root (a group-shared checkpoint): the directories made in it keep the bit."""
    jvm, confs = both
    seen = {}
    for name, conf in confs:
        root = tmp_path / name
        root.mkdir()
        if setgid_root:
            root.chmod(0o2770)
        seen[name] = _statuses(jvm, conf, root, via_context)
    assert seen["forkless"] == seen["hadoop"]
    hadoop = seen["hadoop"]
    dir_mode = "0o2750" if setgid_root else "0o750"
    assert (hadoop["file"], hadoop["dir"], hadoop["changed"]) == ("0o640", dir_mode, "0o604")  # umask 027 applied
    assert hadoop["status missing"] == "java.io.FileNotFoundException" and hadoop["status dangling"][2]


def test_keyedstates_checkpoint_writes_on_local_disk_start_no_processes(tmp_path):
    """Changelogs, a snapshot file's upload and download, a listing and a delete through
    CheckpointFiles with Hadoop's own local file system configured: no ``chmod``, ``readlink``,
    ``stat`` or ``ls`` names the checkpoint. Spark's CheckpointFileManager writing changelogs
    the same way does start them (the wrappers see Hadoop's processes)."""
    wrappers, log = tmp_path / "bin", tmp_path / "processes.log"
    wrappers.mkdir()
    for command in ("chmod", "readlink", "stat", "ls"):
        real = shutil.which(command)
        assert real, command
        script = wrappers / command
        script.write_text(f'#!/bin/sh\necho "{command} $*" >> "{log}"\nexec {real} "$@"\n')
        script.chmod(0o755)
    env = {**os.environ, "PATH": f"{wrappers}{os.pathsep}{os.environ['PATH']}"}
    started = {}
    for way in ("keyedstate", "spark"):
        checkpoint = tmp_path / way / "state" / "0" / "0"
        checkpoint.mkdir(parents=True)
        command = testjar.jvm_main_command("io.keyedstate.testing.LocalCheckpointWrites", "-Xshare:auto",
                                           "-XX:TieredStopAtLevel=1")
        done = subprocess.run([*command, way, str(checkpoint)],
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "DONE" in done.stdout, done.stderr[-3000:]
        lines = log.read_text().splitlines() if log.exists() else []
        started[way] = [line for line in lines if str(tmp_path / way) in line]
    assert started["spark"], "the wrappers saw none of Hadoop's processes: the test proves nothing"
    assert started["keyedstate"] == [], started["keyedstate"]
