"""The golden cases: for every byte format, the inputs whose encoding is stored in tests/golden/.

Both codecs (Python here, Scala through py4j in tests/formats/test_golden.py) must write exactly
the stored bytes and read them back to these inputs. The files were written once by
``python -m support.golden`` from tests/; a format change must come with a new format version
and new files, never an edit of old ones (old checkpoints must stay readable).
"""
from __future__ import annotations

from pathlib import Path

from keyedstate.formats import changelog, frames, key_group_counts, manifest, stored

GOLDEN = Path(__file__).resolve().parent.parent / "golden"

KEY_GROUPS = 201600
# Stored keys: u32 key group | a key row (as an opaque byte string here).
K1 = (4711).to_bytes(4, "big") + bytes(range(16))
K2 = (0).to_bytes(4, "big") + b"\x00" * 16
K3 = (201599).to_bytes(4, "big") + b"\xff" * 24
PLAIN = bytes([stored.PLAIN_VALUE]) + bytes(range(8, 24))
TIMED = bytes([stored.TIMED_VALUE]) + (1_700_000_123_456).to_bytes(8, "big") + bytes(range(8, 24))

CHANGELOG_V1 = dict(version=7, key_groups=KEY_GROUPS, records=[
    (changelog.OP_PUT, K1, PLAIN),
    (changelog.OP_DELETE, K2, None),
    (changelog.OP_PUT_NEW, K3, TIMED),
    (changelog.OP_PUT_EXISTING, K1, b"\x01"),
    (changelog.OP_DELETE_EXISTING, K3, None),
])

CHANGELOG_V2_META = {"keyLayout": {"keyColumns": 2, "partitionKeyColumns": 1, "prefixColumns": 1},
                     "uniqueId": "9a3c2b1e-0d4f-4e5a-8b7c-6d5e4f3a2b1c",
                     "lineage": [[6, "1f2e3d4c-5b6a-4798-8a9b-0c1d2e3f4a5b"], [5, "2a3b4c5d-6e7f-4a8b-9c0d-1e2f3a4b5c6d"]]}

# What a query's commit under checkpoint format 1 writes: no unique id or lineage, its run.
CHANGELOG_V2_RUN_META = {"keyLayout": {"keyColumns": 1, "partitionKeyColumns": 1, "prefixColumns": 0},
                         changelog.RUN_ID: "5d1e8f3a-7c2b-4e9d-a6f0-3b8c1d2e4f5a"}

MANIFEST_V1 = manifest.Manifest(
    version=12, key_groups=KEY_GROUPS, num_keys=3456,
    files=(manifest.SnapshotFile("000012.sst", "ks-files/0b6c3f9e-1d2a-4b7e-9f00-123456789abc-000012.sst", 104857),
           manifest.SnapshotFile("MANIFEST-000005", "ks-files/0b6c3f9e-1d2a-4b7e-9f00-123456789abc-MANIFEST-000005", 230),
           manifest.SnapshotFile("CURRENT", "ks-files/0b6c3f9e-1d2a-4b7e-9f00-123456789abc-CURRENT", 16)),
    key_layout=stored.KeyLayout(key_columns=2, partition_key_columns=1, prefix_columns=1),
    ttl={"ttlMs": 86400000, "updateType": "OnCreateAndWrite", "visibility": "NeverReturnExpired",
         "expiresWith": "itself"})

MANIFEST_V1_REPLAY = manifest.Manifest(
    version=5, key_groups=KEY_GROUPS, num_keys=10, files=(),
    replay=manifest.SnapshotFile("replay-5.ks-changelog", "ks-files/77aa-replay-5.ks-changelog", 999),
    rescale={"batch": 4, "fromPartitions": 4, "toPartitions": 8})

# What a query's snapshot upload writes: the run whose changelog of the version it was taken of.
MANIFEST_V1_RUN = manifest.Manifest(
    version=7, key_groups=KEY_GROUPS, num_keys=5,
    files=(manifest.SnapshotFile("000009.sst", "ks-files/4c1d9e2a-8b3f-4a6e-9d0c-5e7f1a2b3c4d-000009.sst", 2048),
           manifest.SnapshotFile("CURRENT", "ks-files/4c1d9e2a-8b3f-4a6e-9d0c-5e7f1a2b3c4d-CURRENT", 16)),
    key_layout=stored.KeyLayout(key_columns=1, partition_key_columns=1, prefix_columns=0),
    run_id=CHANGELOG_V2_RUN_META[changelog.RUN_ID])
MANIFEST_V1_COUNTS = manifest.Manifest(
    version=30, key_groups=KEY_GROUPS, num_keys=5,
    files=(manifest.SnapshotFile("000031.sst", "ks-files/9a1f3c5e-2b4d-4f6a-8c0e-1d3f5a7b9c2e-000031.sst", 4096),
           manifest.SnapshotFile("CURRENT", "ks-files/9a1f3c5e-2b4d-4f6a-8c0e-1d3f5a7b9c2e-CURRENT", 16),
           manifest.SnapshotFile(key_group_counts.NAME,
                                 f"ks-files/9a1f3c5e-2b4d-4f6a-8c0e-1d3f5a7b9c2e-{key_group_counts.NAME}", 34)),
    key_layout=stored.KeyLayout(key_columns=1, partition_key_columns=1, prefix_columns=0),
    run_id=CHANGELOG_V2_RUN_META[changelog.RUN_ID])

# Key-group counts of 5 keys: groups 3 (2 keys), 131 (1), 201599 (2, a delta of 3 varint bytes).
KEY_GROUP_COUNTS = {3: 2, 131: 1, KEY_GROUPS - 1: 2}

# Frames: (file, op, handle, request body) and (file, reply body).
SCAN_PREFIX, SCAN_AFTER = K1[:6], K1
REQUESTS = {
    "request-get.bin": (frames.OP_GET, 3, K1),
    "request-multi-get.bin": (frames.OP_MULTI_GET, 3, [K1, K2, K3]),
    "request-scan.bin": (frames.OP_SCAN, 9, (SCAN_PREFIX, SCAN_AFTER, 4 << 20, True)),
    "request-scan-from-start.bin": (frames.OP_SCAN, 9, (b"", None, 65536, False)),
    "request-apply-head.bin": (frames.OP_APPLY, 2, (frames.APPLY_BEHIND, frames.TtlScan(1_700_000_000_000, 10, 1_000_000))),
    "request-apply-head-no-ttl.bin": (frames.OP_APPLY, 2, (frames.APPLY_NOW, None)),
    "request-apply-head-hold.bin": (frames.OP_APPLY, 2, (frames.APPLY_HOLD, None)),
    "request-release.bin": (frames.OP_RELEASE, 2, True),
    "request-ttl-candidates.bin": (frames.OP_TTL_CANDIDATES, 2, None),
    "request-sync.bin": (frames.OP_SYNC, 2, None),
    # Protocol 3 (request-hello.bin held protocol 2's: a wire frame, never stored, so not kept).
    "request-hello-v3.bin": (frames.OP_HELLO, 0, b"5f0c2a9e8b7d6c4e3a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b"),
}
REPLIES = {
    "reply-scan.bin": frames.scan_reply([(K1, PLAIN), (K3, TIMED)], True),
    "reply-multi-get.bin": frames.multi_get_reply([PLAIN, None, TIMED]),
    "reply-count.bin": frames.count_reply(123_456_789),
    "reply-ttl-candidates.bin": frames.ttl_candidates_reply(41, 17, [K2, K3]),
    "reply-sync.bin": frames.sync_reply(41, "/tmp/keyedstate-x/stores/3/db"),
}


def encode_request(op: int, handle: int, body) -> bytes:
    """A request frame as the JVM writes it (the Python side only reads requests)."""
    if op == frames.OP_GET:
        payload = body
    elif op == frames.OP_MULTI_GET:
        payload = frames.U32.pack(len(body)) + b"".join(frames.U32.pack(len(k)) + k for k in body)
    elif op == frames.OP_SCAN:
        prefix, after, max_bytes, keys_only = body
        payload = frames.U32.pack(len(prefix)) + prefix
        payload += b"\x00" if after is None else b"\x01" + frames.U32.pack(len(after)) + after
        payload += frames.U32.pack(max_bytes) + bytes([1 if keys_only else 0])
    elif op == frames.OP_APPLY:
        mode, ttl = body
        payload = bytes([mode])
        payload += b"\x00" if ttl is None else b"\x01" + frames.TTL_SCAN.pack(*ttl)
    elif op == frames.OP_RELEASE:
        payload = bytes([1 if body else 0])
    elif op == frames.OP_HELLO:
        payload = frames.U16.pack(frames.PROTOCOL_VERSION) + body
    else:
        payload = b""
    return frames.REQUEST_HEAD.pack(5 + len(payload), op, handle) + payload


def files() -> dict[str, bytes]:
    v1 = changelog.encode(**CHANGELOG_V1)
    out = {"changelog-v1.bin": v1,
           "changelog-v2-zstd.bin": changelog.compress(v1, CHANGELOG_V2_META, changelog.CODEC_ZSTD),
           "changelog-v2-none.bin": changelog.compress(v1, CHANGELOG_V2_META, changelog.CODEC_NONE),
           "changelog-v2-zstd-split.bin": changelog.compress(v1, CHANGELOG_V2_META, changelog.CODEC_ZSTD_SPLIT),
           "changelog-v2-run.bin": changelog.compress(v1, CHANGELOG_V2_RUN_META, changelog.CODEC_ZSTD_SPLIT),
           "manifest-v1.json": manifest.encode(MANIFEST_V1),
           "manifest-v1-replay.json": manifest.encode(MANIFEST_V1_REPLAY),
           "manifest-v1-run.json": manifest.encode(MANIFEST_V1_RUN),
           "manifest-v1-counts.json": manifest.encode(MANIFEST_V1_COUNTS),
           "key-group-counts.bin": key_group_counts.encode(KEY_GROUP_COUNTS, KEY_GROUPS),
           "value-plain.bin": PLAIN, "value-timed.bin": TIMED}
    out.update({name: encode_request(*case) for name, case in REQUESTS.items()})
    out.update(REPLIES)
    return out


if __name__ == "__main__":
    GOLDEN.mkdir(exist_ok=True)
    for name, data in files().items():
        if (GOLDEN / name).exists():
            if (GOLDEN / name).read_bytes() != data:
                raise SystemExit(f"{GOLDEN / name} differs: golden files are never rewritten")
            continue
        (GOLDEN / name).write_bytes(data)
        print("wrote", name, len(data), "bytes")
