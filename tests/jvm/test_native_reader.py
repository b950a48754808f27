"""The JVM's native reader of a state server's RocksDB files (NativeReader.scala)."""
from __future__ import annotations

import os
import struct

from keyedstate.formats import rocksdb
from support import jvmsession


def test_a_native_read_of_an_absent_key_is_answered_by_the_files_bloom_filters(jvm, tmp_path, request):
    """The server writes a Bloom filter into every file; the reader must configure the same
    policy, or RocksDB ignores the filters and every absent key costs a data-block search. Seen
    through the block cache: reads of absent keys load (almost) no data blocks, reads of as
    many present keys load many."""
    usage = jvm.io.keyedstate.engine.NativeReader.cacheUsage
    if usage() > 0 and not os.environ.get(jvmsession.CHILD_ENV):
        # Earlier tests of this JVM (other files on this xdist worker) used the executor-wide block
        # cache: its size, mode and contents are theirs (an LRU that stays full), so its growth
        # says nothing of this test's reads. Measured in a JVM of its own instead.
        outcomes = jvmsession.pytest_in_fresh_process(f"{request.node.path}::{request.node.name}", tmp_path / "fresh.xml")
        output = outcomes.pop("__output__")
        assert outcomes.get(request.node.name) == "passed", f"in a fresh process: {outcomes}\n{output}"
        return
    db = rocksdb.open_db(tmp_path / "db", bulk_load=False)
    for i in range(200_000):
        db[struct.pack(">IQ", i % 997, i * 2)] = b"value-%08d" % i
    db.flush()
    db.close()
    reader = jvm.io.keyedstate.engine.NativeReader(jvm.java.io.File(str(tmp_path / "secondary")).toPath())
    try:
        reader.follow(str(tmp_path / "db"))
        before = usage()
        assert before < 32 << 20, f"the shared block cache is too full to see this test's reads: {before} bytes"
        absent = sum(reader.get(bytearray(struct.pack(">IQ", i % 997, i * 2 + 1))) is not None for i in range(0, 200_000, 40))
        after_absent = usage()
        present = sum(reader.get(bytearray(struct.pack(">IQ", i % 997, i * 2))) is not None for i in range(0, 200_000, 40))
        after_present = usage()
    finally:
        reader.close()
    assert (absent, present) == (0, 5000)
    assert after_present - after_absent > 2 << 20  # 5,000 present keys: most of the ~1,300 data blocks
    assert after_absent - before < 512 << 10, f"absent keys loaded {after_absent - before} bytes of blocks"
