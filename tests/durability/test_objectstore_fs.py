"""Self-test of the objtest:// filesystem (tests/jvm/src/.../ObjectStoreFileSystem.java): its
object-store semantics, every fault it injects, and a real streaming query checkpointing on it.
Runs on the suite's shared session, whose JVM has the test jar and the objtest conf (conftest).
"""
from __future__ import annotations

import os
import re
import threading
import time

import pytest

from support import testjar
from support.constants import HDFS_PROVIDER
from support.durability import objtest_root

pytestmark = pytest.mark.slow


@pytest.fixture
def root(spark):
    return objtest_root(spark)


@pytest.fixture
def fs(spark, root, request):
    """(FileSystem, bucket URI) on a bucket of the test's own; faults disarmed afterwards."""
    testjar.disarm(root)
    testjar.clear_fault_log(root)
    bucket = "objtest://" + re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:60]
    fs, _ = testjar.hadoop_fs(spark, bucket + "/")
    yield fs, bucket
    testjar.disarm(root)


def P(spark, uri):
    return spark._jvm.org.apache.hadoop.fs.Path(uri)


def put(spark, fs, uri, data: bytes = b"x", overwrite=True):
    out = fs.create(P(spark, uri), overwrite)
    out.write(bytearray(data))
    out.close()


def get(spark, fs, uri) -> bytes:
    stream = fs.open(P(spark, uri))
    try:
        return bytes(spark._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
    finally:
        stream.close()


def names(spark, fs, uri):
    return [(s.getPath().getName(), bool(s.isDirectory())) for s in fs.listStatus(P(spark, uri))]


def java_error(excinfo) -> str:
    """Class and message of the Java exception behind a Py4JJavaError."""
    err = excinfo.value.java_exception
    return f"{err.getClass().getName()}: {err.getMessage()}"


# ------------------------------------------------------------------ semantics


def test_directories_are_prefixes_and_objects_appear_on_close(spark, fs):
    fs, b = fs
    assert fs.mkdirs(P(spark, f"{b}/d/e"))  # succeeds, creates nothing
    assert not fs.exists(P(spark, f"{b}/d/e"))
    with pytest.raises(Exception, match="FileNotFoundException"):
        fs.listStatus(P(spark, f"{b}/d"))

    out = fs.create(P(spark, f"{b}/d/e/obj"), False)
    out.write(bytearray(b"hello"))
    out.hflush()  # an object store publishes nothing before close
    assert not fs.exists(P(spark, f"{b}/d/e/obj")) and not fs.exists(P(spark, f"{b}/d"))
    out.close()
    assert get(spark, fs, f"{b}/d/e/obj") == b"hello"
    assert fs.getFileStatus(P(spark, f"{b}/d")).isDirectory()
    put(spark, fs, f"{b}/d/a")
    assert names(spark, fs, f"{b}/d") == [("a", False), ("e", True)]  # key order, prefixes synthesised

    with pytest.raises(Exception) as e:
        fs.create(P(spark, f"{b}/d/a"), False)
    assert "FileAlreadyExistsException" in java_error(e)
    with pytest.raises(Exception) as e:
        fs.create(P(spark, f"{b}/d/e"), True)  # a prefix is a directory
    assert "FileAlreadyExistsException" in java_error(e)

    assert fs.delete(P(spark, f"{b}/d/e/obj"), False)
    assert not fs.exists(P(spark, f"{b}/d/e"))  # the last object under a prefix takes it with it
    assert names(spark, fs, f"{b}/d") == [("a", False)]


def test_directory_markers_on_request(spark, fs, root):
    fs, b = fs
    testjar.arm(root, {"dirMarkers": "true"})  # what s3a's mkdirs does: an empty "dir/" object
    assert fs.mkdirs(P(spark, f"{b}/m/n"))
    assert fs.getFileStatus(P(spark, f"{b}/m/n")).isDirectory() and names(spark, fs, f"{b}/m/n") == []
    put(spark, fs, f"{b}/m/n/x")
    assert names(spark, fs, f"{b}/m/n") == [("x", False)]  # the marker is never listed
    assert fs.rename(P(spark, f"{b}/m"), P(spark, f"{b}/moved"))
    assert names(spark, fs, f"{b}/moved/n") == [("x", False)] and not fs.exists(P(spark, f"{b}/m"))
    assert fs.delete(P(spark, f"{b}/moved"), True) and not fs.exists(P(spark, f"{b}/moved/n"))


def test_rename_copies_then_deletes_and_refuses_an_existing_destination(spark, fs, root):
    fs, b = fs
    put(spark, fs, f"{b}/src", b"1")
    assert fs.rename(P(spark, f"{b}/src"), P(spark, f"{b}/dst"))
    assert not fs.exists(P(spark, f"{b}/src")) and get(spark, fs, f"{b}/dst") == b"1"
    assert not fs.rename(P(spark, f"{b}/missing"), P(spark, f"{b}/x"))  # s3a: false, no exception

    put(spark, fs, f"{b}/src", b"2")
    with pytest.raises(Exception) as e:  # what s3a does
        fs.rename(P(spark, f"{b}/src"), P(spark, f"{b}/dst"))
    assert "FileAlreadyExistsException" in java_error(e)
    testjar.arm(root, {"rename.existing": "false"})  # what HDFS does
    assert not fs.rename(P(spark, f"{b}/src"), P(spark, f"{b}/dst"))
    testjar.arm(root, {"rename.existing": "overwrite"})  # what a POSIX rename does
    assert fs.rename(P(spark, f"{b}/src"), P(spark, f"{b}/dst"))
    assert get(spark, fs, f"{b}/dst") == b"2" and not fs.exists(P(spark, f"{b}/src"))

    put(spark, fs, f"{b}/dir/f")  # a file onto a prefix lands under it
    assert fs.rename(P(spark, f"{b}/dst"), P(spark, f"{b}/dir"))
    assert get(spark, fs, f"{b}/dir/dst") == b"2"


def test_prefix_rename_is_observable_between_copy_and_delete(spark, fs, root):
    fs, b = fs
    for i in range(3):
        put(spark, fs, f"{b}/a/{i}", str(i).encode())
    testjar.arm(root, {"rename.delayMs": 1500})
    result = {}
    thread = threading.Thread(target=lambda: result.update(ok=fs.rename(P(spark, f"{b}/a"), P(spark, f"{b}/b"))))
    thread.start()
    deadline = time.monotonic() + 30
    while not fs.exists(P(spark, f"{b}/b/2")):
        assert time.monotonic() < deadline, "the copy never showed up"
        time.sleep(0.05)
    both = fs.exists(P(spark, f"{b}/a/2")) and fs.exists(P(spark, f"{b}/b/2"))
    thread.join()
    assert both, "source and destination should both exist inside the rename"
    assert result["ok"] and not fs.exists(P(spark, f"{b}/a"))
    assert [get(spark, fs, f"{b}/b/{i}") for i in range(3)] == [b"0", b"1", b"2"]

    put(spark, fs, f"{b}/c/x")  # onto a non-empty prefix: refused
    assert not fs.rename(P(spark, f"{b}/b"), P(spark, f"{b}/c"))


def test_delete_of_a_prefix_deletes_every_object(spark, fs):
    fs, b = fs
    for key in ("p/1", "p/q/2", "p/q/r/3", "pp"):
        put(spark, fs, f"{b}/{key}")
    with pytest.raises(Exception) as e:
        fs.delete(P(spark, f"{b}/p"), False)
    assert "PathIsNotEmptyDirectoryException" in java_error(e)
    assert fs.delete(P(spark, f"{b}/p"), True)
    assert not fs.exists(P(spark, f"{b}/p")) and fs.exists(P(spark, f"{b}/pp"))
    assert not fs.delete(P(spark, f"{b}/p"), True)


def test_spark_uses_the_filesystem_checkpoint_manager(spark, fs):
    fs, b = fs
    cfm = spark._jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.create(
        P(spark, f"{b}/ckpt"), spark._jsc.hadoopConfiguration())
    # no AbstractFileSystem for objtest: FileContext is unsupported, Spark falls back (with a WARN)
    assert cfm.getClass().getSimpleName() == "FileSystemBasedCheckpointFileManager"
    out = cfm.createAtomic(P(spark, f"{b}/ckpt/0"), False)
    out.write(bytearray(b"v1"))
    out.close()
    assert get(spark, fs, f"{b}/ckpt/0") == b"v1"
    assert names(spark, fs, f"{b}/ckpt") == [("0", False)]  # the temp object is gone


# ------------------------------------------------------------------ faults


@pytest.mark.parametrize("op", testjar.OPS)
def test_nth_call_of_each_operation_fails_once(spark, fs, root, op):
    fs, b = fs
    put(spark, fs, f"{b}/keep/x")
    calls = {
        "create": lambda i: fs.create(P(spark, f"{b}/c{i}"), True).close(),
        "rename": lambda i: fs.rename(P(spark, f"{b}/keep/x"), P(spark, f"{b}/keep/x")),
        "open": lambda i: fs.open(P(spark, f"{b}/keep/x")).close(),
        "listStatus": lambda i: fs.listStatus(P(spark, f"{b}/keep")),
        "delete": lambda i: fs.delete(P(spark, f"{b}/nothing{i}"), True),
        "hsync": lambda i: _hsync_and_close(fs.create(P(spark, f"{b}/h{i}"), True)),
    }
    # hsync=true: the streams offer hsync (rules on it fail those calls)
    testjar.arm(root, {"hsync": "true"} if op == "hsync" else None, **{op: {"nth": 2, "path": f"{b}/"}})
    outcomes = []
    for i in range(4):
        try:
            calls[op](i)
            outcomes.append("ok")
        except Exception as e:
            assert "objtest: injected" in str(e)
            outcomes.append("fault")
    assert outcomes == ["ok", "fault", "ok", "ok"]
    assert testjar.fault_counts(root) == {op: 1}
    (fault,) = testjar.injected_faults(root)
    assert fault["call"] == 2 and fault["kind"] == "start" and fault["pid"] != os.getpid()


def _hsync_and_close(out) -> None:
    try:
        out.hsync()
    finally:
        out.close()


def test_path_filter_times_probability_and_global_scope(spark, fs, root):
    fs, b = fs
    # Every rule names this test's bucket: the shared session's maintenance thread may be writing
    # and reading other tests' objtest:// checkpoints meanwhile, and would take the faults.
    testjar.arm(root, create={"nth": 1, "times": 2, "path": f"{b}/state/"})
    put(spark, fs, f"{b}/other")  # not matching: not counted
    for _ in range(2):
        with pytest.raises(Exception, match="injected create fault"):
            put(spark, fs, f"{b}/state/1")
    put(spark, fs, f"{b}/state/1")
    assert testjar.fault_counts(root) == {"create": 2}

    testjar.clear_fault_log(root)
    testjar.arm(root, {"seed": 7}, open={"probability": 0.5, "path": f"{b}/other"})
    faults = 0
    for _ in range(40):
        try:
            fs.open(P(spark, f"{b}/other")).close()
        except Exception:
            faults += 1
    assert 5 < faults < 35 and testjar.fault_counts(root) == {"open": faults}

    testjar.clear_fault_log(root)
    testjar.arm(root, delete={"nth": 3, "scope": "global", "path": f"{b}/none"})
    assert [fs.delete(P(spark, f"{b}/none"), True) for _ in range(2)] == [False, False]
    with pytest.raises(Exception, match="matching call #3"):
        fs.delete(P(spark, f"{b}/none"), True)
    assert (root / ".objtest" / "counters").is_dir()


def test_create_fault_at_close_publishes_nothing(spark, fs, root):
    fs, b = fs
    testjar.arm(root, create={"nth": 1, "at": "close", "path": f"{b}/"})
    out = fs.create(P(spark, f"{b}/obj"), True)
    out.write(bytearray(b"data"))
    with pytest.raises(Exception, match="injected create fault \\(close"):
        out.close()
    assert not fs.exists(P(spark, f"{b}/obj"))


def test_rename_fault_after_copy_leaves_both(spark, fs, root):
    fs, b = fs
    put(spark, fs, f"{b}/tmp", b"v")
    testjar.arm(root, rename={"nth": 1, "at": "afterCopy", "path": f"{b}/"})
    with pytest.raises(Exception, match="afterCopy"):
        fs.rename(P(spark, f"{b}/tmp"), P(spark, f"{b}/final"))
    assert get(spark, fs, f"{b}/tmp") == b"v" and get(spark, fs, f"{b}/final") == b"v"
    assert testjar.injected_faults(root)[0]["kind"] == "afterCopy"


def test_short_reads_are_legal_and_readers_that_loop_are_fine(spark, fs, root):
    fs, b = fs
    data = os.urandom(100_000)
    put(spark, fs, f"{b}/big", data)
    testjar.arm(root, {"shortReads": "true"})
    stream = fs.open(P(spark, f"{b}/big"))
    buf = spark.sparkContext._gateway.new_array(spark._jvm.byte, 8192)
    sizes = []
    while True:
        n = stream.read(buf, 0, 8192)
        if n == -1:
            break
        sizes.append(n)
    stream.close()
    assert sum(sizes) == len(data) and all(0 < n for n in sizes)
    assert sum(n < 8192 for n in sizes) > len(sizes) // 2  # mostly short, never EOF early
    assert get(spark, fs, f"{b}/big") == data  # readFully-style readers see the right bytes
    assert testjar.fault_counts(root)["open"] == 2  # one line per stream that read short


def test_disk_full_fails_writes_after_n_bytes_and_publishes_nothing(spark, fs, root):
    fs, b = fs
    testjar.arm(root, {"diskFull.afterBytes": 1000, "diskFull.path": f"{b}/"})
    out = fs.create(P(spark, f"{b}/obj"), True)
    out.write(bytearray(600))
    with pytest.raises(Exception, match="No space left on device"):
        out.write(bytearray(600))
    with pytest.raises(Exception):
        out.close()
    assert not fs.exists(P(spark, f"{b}/obj"))
    with pytest.raises(Exception, match="No space left on device"):  # the disk stays full
        put(spark, fs, f"{b}/obj2", b"12")
    assert testjar.fault_counts(root)["write"] == 2
    testjar.disarm(root)
    put(spark, fs, f"{b}/obj3", b"ok")


# ------------------------------------------------------------------ a streaming query on it


def test_streaming_aggregation_checkpoints_on_objtest_and_restarts(spark, fs):
    fs, b = fs
    checkpoint = f"{b}/ckpt"
    provider_key = "spark.sql.streaming.stateStore.providerClass"
    previous_provider = spark.conf.get(provider_key, None)
    seen: dict[int, int] = {}

    def run() -> None:
        """One run of the query: with availableNow, exactly one micro-batch of 10 rows, then it
        stops by itself (stopping a Python foreachBatch from outside can kill Spark 4.3's stream
        thread with a StackOverflowError in its interruption check)."""
        spark.conf.set(provider_key, HDFS_PROVIDER)  # Spark's default, whatever the session says
        query = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
                 .groupBy().count()
                 .writeStream.outputMode("update")
                 .foreachBatch(lambda df, batch_id: seen.__setitem__(batch_id, df.collect()[0][0]))
                 .option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(180), "the availableNow run did not finish"
            assert query.exception() is None, query.exception()
        finally:
            query.stop()
            if previous_provider is None:
                spark.conf.unset(provider_key)
            else:
                spark.conf.set(provider_key, previous_provider)

    for _ in range(3):  # each run after the first restarts from the objtest checkpoint
        run()
    # every batch adds 10 rows to the one running count: nothing lost or counted twice
    assert seen == {0: 10, 1: 20, 2: 30}
    assert fs.exists(P(spark, f"{checkpoint}/state/0/0/3.delta"))
    assert names(spark, fs, f"{checkpoint}/commits") == [("0", False), ("1", False), ("2", False)]
