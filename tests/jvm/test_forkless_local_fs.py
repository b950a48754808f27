"""The suite's local file system (ForklessLocalFileSystem, testjar.forkless_local_conf) answers
like Hadoop's own, through FileSystem and FileContext: same modes after create, mkdirs and
setPermission under the configured umask, same statuses for files, directories, symlinks,
dangling symlinks and missing paths. Hadoop's own is what a fresh Configuration gives."""
from __future__ import annotations

import os

import pytest
from py4j.protocol import Py4JJavaError

from support import testjar


@pytest.fixture
def both(spark):
    """(name, conf) of Hadoop's own local file system and the suite's."""
    jvm = spark._jvm
    if not testjar.forkless_local_conf():
        pytest.skip(f"${testjar.PLAIN_LOCAL_FS_ENV} is set: the suite runs on Hadoop's own")
    plain = jvm.org.apache.hadoop.conf.Configuration()
    suite = jvm.org.apache.hadoop.conf.Configuration(spark._jsc.hadoopConfiguration())
    for conf in (plain, suite):
        conf.set("fs.permissions.umask-mode", "027")
    return jvm, [("hadoop", plain), ("suite", suite)]


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


@pytest.mark.parametrize("via_context", [False, True], ids=["FileSystem", "FileContext"])
def test_the_suites_local_file_system_answers_like_hadoops(both, tmp_path, via_context):
    jvm, confs = both
    seen = {}
    for name, conf in confs:
        root = tmp_path / name
        root.mkdir()
        seen[name] = _statuses(jvm, conf, root, via_context)
    assert seen["suite"] == seen["hadoop"]
    hadoop = seen["hadoop"]
    assert (hadoop["file"], hadoop["dir"], hadoop["changed"]) == ("0o640", "0o750", "0o604")  # umask 027 applied
    assert hadoop["status missing"] == "java.io.FileNotFoundException" and hadoop["status dangling"][2]
