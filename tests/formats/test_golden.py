"""Golden files: both codecs of every byte format (Python here, Scala through py4j) write exactly
the stored bytes and read them back to the same values (FORMATS.md; cases in support/golden.py)."""
from __future__ import annotations

import json
import zlib

import pytest

from keyedstate.formats import changelog, frames, key_group_counts, keygroups, manifest, stored
from keyedstate.offline.sparkhash import RowHasher

from support import golden
from support.jvm import byte_arrays, byte_buffer, key_codec, scala_iter, to_bytes, unsafe_row


def read(name: str) -> bytes:
    return (golden.GOLDEN / name).read_bytes()


@pytest.fixture(scope="module")
def fmt(spark):
    return spark._jvm.io.keyedstate.format


# -- changelog ---------------------------------------------------------------------------------

def test_changelog_python_codec():
    data = read("changelog-v1.bin")
    assert changelog.encode(**golden.CHANGELOG_V1) == data
    log = changelog.decode(data, "changelog-v1.bin")
    assert (log.version, log.key_groups, log.record_count) == (7, golden.KEY_GROUPS, 5)
    assert [tuple(r) for r in log.records()] == golden.CHANGELOG_V1["records"]


def test_changelog_scala_codec(spark, fmt):
    data = read("changelog-v1.bin")
    out = spark._jvm.java.io.ByteArrayOutputStream()
    writer = getattr(fmt, "ChangelogFormat$Writer")(out, 7, golden.KEY_GROUPS)
    for op, key, value in golden.CHANGELOG_V1["records"]:
        writer.delete(op, key) if value is None else writer.put(op, key, value)
    writer.finish()
    assert bytes(out.toByteArray()) == data
    log = fmt.ChangelogFormat.read(bytearray(data), "changelog-v1.bin")
    assert (log.version(), log.keyGroups(), log.recordCount()) == (7, golden.KEY_GROUPS, 5)
    records = [(r.op(), bytes(r.key()), None if r.value() is None else bytes(r.value()))
               for r in scala_iter(log.iterator())]
    assert records == golden.CHANGELOG_V1["records"]


@pytest.mark.parametrize("name,codec", [("changelog-v2-zstd.bin", changelog.CODEC_ZSTD),
                                        ("changelog-v2-none.bin", changelog.CODEC_NONE),
                                        ("changelog-v2-zstd-split.bin", changelog.CODEC_ZSTD_SPLIT)])
def test_changelog_v2_both_codecs(spark, fmt, name, codec):
    """Format 2 (what checkpoints hold): the same records, compressed, with metadata."""
    data, inner = read(name), read("changelog-v1.bin")
    assert changelog.compress(inner, golden.CHANGELOG_V2_META, codec) == data
    log = changelog.decode(data, name)
    assert [tuple(r) for r in log.records()] == golden.CHANGELOG_V1["records"]
    assert log.meta == {"version": 7, "keyGroups": golden.KEY_GROUPS, **golden.CHANGELOG_V2_META}
    scala = fmt.ChangelogFormat.read(bytearray(data), name)
    assert scala.recordCount() == 5 and scala.meta().uniqueId().get() == golden.CHANGELOG_V2_META["uniqueId"]
    lineage = [(scala.meta().lineage().apply(i)._1(), scala.meta().lineage().apply(i)._2())
               for i in range(scala.meta().lineage().size())]
    assert [list(item) for item in lineage] == golden.CHANGELOG_V2_META["lineage"]
    rewritten = fmt.ChangelogFormat.compress(byte_buffer(spark._jvm, inner), scala.meta(), codec)
    assert to_bytes(rewritten) == data  # the Scala writer, byte for byte (zstd: both sides libzstd 1.5.7)


def test_changelog_v2_names_the_run_that_committed_it(spark, fmt):
    """A query's commit records its run (a later run replaces the file of an earlier one's attempt)."""
    data, inner = read("changelog-v2-run.bin"), read("changelog-v1.bin")
    assert changelog.compress(inner, golden.CHANGELOG_V2_RUN_META, changelog.CODEC_ZSTD_SPLIT) == data
    assert changelog.decode(data, "changelog-v2-run.bin").meta == {
        "version": 7, "keyGroups": golden.KEY_GROUPS, **golden.CHANGELOG_V2_RUN_META}
    scala = fmt.ChangelogFormat.read(bytearray(data), "changelog-v2-run.bin")
    meta = scala.meta()
    assert meta.runId().get() == golden.CHANGELOG_V2_RUN_META[changelog.RUN_ID]
    assert meta.uniqueId().isEmpty() and meta.lineage().isEmpty() and not meta.fromEmpty()
    rewritten = fmt.ChangelogFormat.compress(byte_buffer(spark._jvm, inner), meta, changelog.CODEC_ZSTD_SPLIT)
    assert to_bytes(rewritten) == data
    assert fmt.ChangelogFormat.readMeta(bytearray(data), "changelog-v2-run.bin").toOption().get().runId().get() == \
        golden.CHANGELOG_V2_RUN_META[changelog.RUN_ID]


def test_changelog_v2_refuses_a_zstd_bomb(fmt, spark):
    import zstandard

    bomb = zstandard.ZstdCompressor(level=1, write_content_size=False).compress(b"\0" * 1000)
    data = changelog.compress(read("changelog-v1.bin"), {}, changelog.CODEC_NONE)
    head = data[:len(data) - len(read("changelog-v1.bin"))]
    forged = head[:10] + bytes([changelog.CODEC_ZSTD]) + head[11:-4]
    import struct, zlib
    forged = forged + struct.pack(">I", zlib.crc32(forged)) + bomb  # no content size stated
    with pytest.raises(changelog.CorruptChangelogError, match="states -1 bytes"):
        changelog.decode(forged, "bomb")
    with pytest.raises(Exception, match="states -1 bytes"):
        fmt.ChangelogFormat.read(bytearray(forged), "bomb")


# -- manifest ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name,case", [("manifest-v1.json", golden.MANIFEST_V1),
                                       ("manifest-v1-replay.json", golden.MANIFEST_V1_REPLAY),
                                       ("manifest-v1-run.json", golden.MANIFEST_V1_RUN),
                                       ("manifest-v1-counts.json", golden.MANIFEST_V1_COUNTS)])
def test_manifest_both_codecs(fmt, name, case):
    data = read(name)
    assert manifest.encode(case) == data
    assert manifest.decode(data, name, case.version) == case
    decoded = fmt.ManifestFormat.decode(bytearray(data), name, case.version)
    assert bytes(fmt.ManifestFormat.encode(decoded)) == data  # the Scala writer, byte for byte
    files = [decoded.files().apply(i) for i in range(decoded.files().size())]
    assert [(f.name(), f.path(), f.size()) for f in files] == [(f.name, f.path, f.size) for f in case.files]
    assert (decoded.version(), decoded.keyGroups(), decoded.numKeys()) == (case.version, case.key_groups, case.num_keys)
    assert decoded.replay().isDefined() == (case.replay is not None)
    assert (decoded.runId().get() if decoded.runId().isDefined() else None) == case.run_id
    if case.key_layout is not None:
        layout = decoded.keyLayout().get()
        assert (layout.keyColumns(), layout.partitionKeyColumns(), layout.prefixColumns()) == (
            case.key_layout.key_columns, case.key_layout.partition_key_columns, case.key_layout.prefix_columns)


def test_a_manifest_listing_a_file_name_twice_is_refused_by_both_codecs(fmt):
    """Each name is a file of the restored RocksDB directory: a manifest naming one twice is
    corrupt (the load then falls back to an older snapshot, tests/queries/test_checkpoint_files.py)."""
    node = json.loads(read("manifest-v1.json"))
    node["files"].append(dict(node["files"][1], path=node["files"][0]["path"]))
    data = json.dumps(node, separators=(",", ":")).encode()
    with pytest.raises(manifest.CorruptManifestError, match="doubled.ks-snapshot .*MANIFEST-000005 2 times"):
        manifest.decode(data, "doubled.ks-snapshot")
    with pytest.raises(Exception, match="doubled.ks-snapshot .*MANIFEST-000005 2 times"):
        fmt.ManifestFormat.decode(bytearray(data), "doubled.ks-snapshot", -1)


# -- key-group counts --------------------------------------------------------------------------

def test_key_group_counts_golden_file_holds_to_the_spec():
    """FORMATS.md, "Key-group counts", byte by byte: header, delta and count varints, CRC-32."""
    data = read("key-group-counts.bin")
    body = (b"KSGC" + bytes([1]) + golden.KEY_GROUPS.to_bytes(4, "big") + (5).to_bytes(8, "big")
            + (3).to_bytes(4, "big")
            + bytes([3, 2])  # group 3, 2 keys
            + bytes([0x80, 0x01, 1])  # +128 -> group 131, 1 key
            + bytes([0xFC, 0xA5, 0x0C, 2]))  # +201,468 -> group 201,599, 2 keys
    assert data == body + zlib.crc32(body).to_bytes(4, "big")
    assert key_group_counts.decode(data, "golden") == (golden.KEY_GROUPS, golden.KEY_GROUP_COUNTS)
    assert key_group_counts.encode(golden.KEY_GROUP_COUNTS, golden.KEY_GROUPS) == data


@pytest.mark.parametrize("change,error", [
    (lambda d: d[:-1], "checksum|too short"),
    (lambda d: b"KSGX" + d[4:], "not a key-group counts file"),
    (lambda d: d[:4] + b"\x02" + d[5:], "format 2"),
    (lambda d: d[:10] + bytes([d[10] ^ 1]) + d[11:], "checksum"),
])
def test_damaged_key_group_counts_are_refused(change, error):
    with pytest.raises(key_group_counts.CorruptKeyGroupCountsError, match=error):
        key_group_counts.decode(change(read("key-group-counts.bin")), "damaged")


@pytest.mark.parametrize("entries,error", [
    ([(3, 2), (0, 1)], "entry 1 has delta 0"),  # a key group twice
    ([(3, 0)], "count 0"),
    ([(golden.KEY_GROUPS, 1)], "not below"),
])
def test_key_group_counts_that_break_a_rule_are_refused_even_with_a_good_checksum(entries, error):
    out = bytearray()
    for delta, count in entries:
        key_group_counts._put_varint(out, delta)
        key_group_counts._put_varint(out, count)
    total = sum(c for _, c in entries)
    body = b"KSGC\x01" + golden.KEY_GROUPS.to_bytes(4, "big") + total.to_bytes(8, "big") + len(entries).to_bytes(4, "big") + out
    with pytest.raises(key_group_counts.CorruptKeyGroupCountsError, match=error):
        key_group_counts.decode(bytes(body) + zlib.crc32(body).to_bytes(4, "big"), "forged")


# -- data-channel frames -----------------------------------------------------------------------

def _jvm_request(jvm, fmt, op, handle, body) -> bytes:
    F = fmt.Frames
    if op == frames.OP_GET:
        payload = body
    elif op == frames.OP_MULTI_GET:
        payload = to_bytes(F.multiGetRequest(byte_arrays(jvm, body)))
    elif op == frames.OP_SCAN:
        prefix, after, max_bytes, keys_only = body
        payload = to_bytes(F.scanRequest(bytearray(prefix), None if after is None else bytearray(after),
                                         max_bytes, keys_only))
    elif op == frames.OP_APPLY:
        mode, ttl = body
        scan = jvm.scala.Option.empty() if ttl is None else jvm.scala.Some(fmt.TtlScan(*ttl))
        payload = to_bytes(F.applyHead(mode, scan))
    elif op == frames.OP_RELEASE:
        payload = to_bytes(F.releaseRequest(body))
    elif op == frames.OP_HELLO:
        payload = to_bytes(F.helloRequest(bytearray(body)))
    else:
        payload = b""
    return to_bytes(F.requestHead(op, handle, len(payload))) + payload


@pytest.mark.parametrize("name", sorted(golden.REQUESTS))
def test_requests_written_by_the_jvm_are_read_by_python(spark, fmt, name):
    op, handle, body = golden.REQUESTS[name]
    data = read(name)
    assert _jvm_request(spark._jvm, fmt, op, handle, body) == data
    length, op_read, handle_read = frames.REQUEST_HEAD.unpack_from(data)
    assert (length, op_read, handle_read) == (len(data) - 4, op, handle)
    payload = data[frames.REQUEST_HEAD.size:]
    if op == frames.OP_MULTI_GET:
        assert frames.multi_get_request(payload) == body
    elif op == frames.OP_SCAN:
        assert tuple(frames.scan_request(payload)) == body
    elif op == frames.OP_APPLY:
        request = frames.apply_request(payload)
        assert (request.mode, request.ttl, bytes(request.changelog)) == (*body, b"")
    elif op == frames.OP_RELEASE:
        assert frames.release_request(payload) is body
    elif op == frames.OP_HELLO:
        assert frames.hello_request(payload) == (frames.PROTOCOL_VERSION, body) == (3, body)


@pytest.mark.parametrize("name", sorted(golden.REPLIES))
def test_replies_written_by_python_are_read_by_the_jvm(spark, fmt, name):
    data = read(name)
    assert golden.REPLIES[name] == data
    F, buf = fmt.Frames, byte_buffer(spark._jvm, data)
    if name == "reply-scan.bin":
        chunk = F.scanReply(buf)
        assert chunk.hasMore() and [bytes(k) for k in chunk.keys()] == [golden.K1, golden.K3]
        assert [bytes(v) for v in chunk.values()] == [golden.PLAIN, golden.TIMED]
    elif name == "reply-multi-get.bin":
        values = F.multiGetReply(buf, 3)
        assert [None if v is None else bytes(v) for v in values] == [golden.PLAIN, None, golden.TIMED]
    elif name == "reply-count.bin":
        assert F.countReply(buf) == 123_456_789
    elif name == "reply-ttl-candidates.bin":
        found = F.ttlCandidatesReply(buf)
        assert (found.version(), found.scanMs(), [bytes(k) for k in found.keys()]) == (41, 17, [golden.K2, golden.K3])
    elif name == "reply-sync.bin":
        held = F.syncReply(buf)
        assert (held._1(), held._2()) == (41, "/tmp/keyedstate-x/stores/3/db")


def test_a_reply_that_does_not_fit_is_refused_before_allocating(spark, fmt):
    lying = frames.U8.pack(0) + frames.U32.pack(1 << 30)  # "a billion entries" in 5 bytes
    with pytest.raises(Exception, match="cannot fit"):
        fmt.Frames.scanReply(byte_buffer(spark._jvm, lying))
    with pytest.raises(frames.FrameError, match="does not fit"):
        frames.multi_get_request(frames.U32.pack(1 << 30))


# -- stored keys and values --------------------------------------------------------------------

def test_values_both_codecs(fmt):
    plain, timed = read("value-plain.bin"), read("value-timed.bin")
    assert (plain, timed) == (golden.PLAIN, golden.TIMED)
    assert bytes(fmt.KeyCodec.withWriteTime(bytearray(plain), 1_700_000_123_456)) == timed
    assert fmt.KeyCodec.writtenAt(bytearray(timed)) == stored.written_at(timed) == 1_700_000_123_456
    assert stored.written_at(plain) is None


@pytest.mark.parametrize("name,key_ddl,values,prefix", [
    ("key-int.bin", "k INT", [7], 0),
    ("key-prefix.bin", "k STRING, start LONG", ["user-42", 1_700_000_000_000_000], 1),
])
def test_keys_written_by_the_jvm_carry_sparks_key_group(spark, name, key_ddl, values, prefix):
    jvm = spark._jvm
    codec, key_schema, _ = key_codec(jvm, key_ddl, "n LONG", prefix_columns=prefix)
    data = bytes(codec.encodeKey(unsafe_row(jvm, key_schema, values)))
    assert data == read(name)
    layout = stored.KeyLayout(len(values), prefix or len(values), prefix)
    assert (codec.layout().keyColumns(), codec.layout().partitionKeyColumns(), codec.layout().prefixColumns()) == (
        layout.key_columns, layout.partition_key_columns, layout.prefix_columns)
    # Python finds the key group where the JVM put it, equal to Spark's partition hash of the
    # partition-key columns, recomputed from the stored row bytes.
    schema = json.loads(key_schema.json())
    spark_hash = RowHasher(schema, layout.partition_key_columns).hash(data, layout.row_offset(data))
    assert keygroups.key_group_of_stored_key(data) == spark_hash % golden.KEY_GROUPS
