"""RocksDB's bottom-priority pool lowered for one compaction, on real RocksDB threads: the
compaction runs on a thread at idle CPU priority, and the pool is at normal priority after."""
import os
import random

import pytest

from keyedstate.formats import rocksdb
from keyedstate.server import compaction_priority

pytestmark = pytest.mark.skipif(not compaction_priority.supported(), reason="thread priorities are Linux's")


def _cpu_ticks(tid: int) -> int:
    try:
        with open(f"/proc/self/task/{tid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:  # the thread ended
        return 0
    return int(fields[11]) + int(fields[12])


def _level0_database(path, files: int = 4, keys_per_file: int = 150_000):
    """A database of ``files`` overlapping L0 files, compactions off: a full compaction of it
    takes some CPU-seconds' tenths."""
    from rocksdict import WriteBatch

    db = rocksdb.open_db(path, bulk_load=False, compactions=False)
    rng = random.Random(7)
    for _ in range(files):
        batch = WriteBatch(raw_mode=True)
        for _ in range(keys_per_file):
            batch.put(rng.randbytes(16), rng.randbytes(48))
        db.write(batch)
        db.flush()
    return db


def test_a_compaction_in_the_lowered_pool_runs_at_idle_priority_and_the_pool_is_renewed(tmp_path):
    db = _level0_database(tmp_path / "db")
    try:
        with compaction_priority.lowered_bottom_pool() as lowered:
            assert lowered
            threads = compaction_priority.bottom_threads()
            assert threads and all(threads.values())
            before = {tid: _cpu_ticks(tid) for tid in threads}
            db.compact_range(None, None)
            spent = {tid: _cpu_ticks(tid) - ticks for tid, ticks in before.items()}
        assert db.property_int_value("rocksdb.num-files-at-level0") == 0
        assert sum(spent.values()) > 0, spent  # the lowered thread did the compaction's work
        compaction_priority.renew_bottom_pool()
        renewed = compaction_priority.bottom_threads()
        assert renewed and set(renewed).isdisjoint(threads)
        assert not any(renewed.values())
        assert all(os.sched_getscheduler(tid) == os.sched_getscheduler(0) for tid in renewed)  # this thread's
    finally:
        db.close()

