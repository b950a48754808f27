"""A read-only copy of a store's database (the offline tools' reads) reads it as the store does."""
from keyedstate.formats import rocksdb


def test_a_read_only_copy_answers_absent_keys_from_its_bloom_filters(tmp_path):
    """Reads of keys a database does not hold load no data block: the files' Bloom filters
    answer them, which RocksDB does only for a reader with the filter policy they were written
    with (a reader with default options searches a data block of the file instead)."""
    db = rocksdb.open_db(tmp_path / "db", bulk_load=False)
    for part in range(2):  # two files, each over every key range
        for i in range(part, 40_000, 2):
            db[b"key-%08d" % i] = b"v" * 100
        db.flush()
    db.close()

    copy = rocksdb.open_read_only(tmp_path / "db")
    try:
        before = copy.property_int_value("rocksdb.block-cache-usage")
        assert all(copy.get(b"key-%08d-absent" % i) is None for i in range(0, 40_000, 20))
        # The filters' false positives (1 % at 10 bits a key) load about 40 blocks (~150 KiB);
        # without the filters each of the 2,000 reads loads one of each file's (~4.7 MiB).
        assert copy.property_int_value("rocksdb.block-cache-usage") - before < 1 << 20
        assert copy.get(b"key-%08d" % 12_345) == b"v" * 100  # a present key loads its block
        assert copy.property_int_value("rocksdb.block-cache-usage") > before
    finally:
        copy.close()
