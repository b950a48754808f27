"""Latency of ``keyedstate get`` on a large local state (issue 15: under 1 s on 10M keys).

Synthesises a keyedstate checkpoint of one streaming aggregation partition (key ``k: string``,
value ``count: long, sum: long``) with ``--keys`` keys in one RocksDB snapshot (version 1) plus
``--changelogs`` changelogs of ``--changelog-keys`` puts each, in exactly the layout the JVM
writes (manifest, zstd changelogs format 2, Spark's schema file, offset and commit logs), then
times lookups: in-process ``keyedstate.get`` and the whole ``keyedstate get`` command (a new
Python process: imports included), for keys answered by the newest changelog, by the snapshot,
and absent keys. Writes the numbers to ``benchmarks/RESULTS-get.md``.

    python3 -m benchmarks.get_latency --keys 10000000 --dir /tmp/ks-get
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

from keyedstate.formats import changelog, manifest as mf, rocksdb
from keyedstate.formats.layout import FILE_NAME
from keyedstate.formats.stored import KeyLayout
from keyedstate.offline import rows
from keyedstate.offline.sparkhash import RowHasher

KEY = {"type": "struct", "fields": [{"name": "k", "type": "string", "nullable": True, "metadata": {}}]}
VALUE = {"type": "struct", "fields": [{"name": "count", "type": "long", "nullable": False, "metadata": {}},
                                      {"name": "sum", "type": "long", "nullable": True, "metadata": {}}]}
KEY_GROUPS = 201600


def _utf(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack(">H", len(b)) + b


def build(root: Path, keys: int, changelogs: int, changelog_keys: int) -> None:
    part = root / "state" / "0" / "0"
    files = part / "ks-files"
    files.mkdir(parents=True)
    (part / "_metadata").mkdir()
    (part / "_metadata" / "schema").write_bytes(
        _utf("v2") + struct.pack(">i", 1) + _utf(json.dumps(KEY)) + struct.pack(">i", 1) + _utf(json.dumps(VALUE)))
    (root / "state" / "0" / "_metadata").mkdir()
    (root / "state" / "0" / "_metadata" / "metadata").write_text(
        'v1\n{"operatorInfo":{"operatorId":0,"operatorName":"stateStoreSave"},'
        '"stateStoreInfo":[{"storeName":"default","numColsPrefixKey":0,"numPartitions":1}]}')
    hasher = RowHasher(KEY, 1)

    def stored(i: int) -> bytes:
        row = rows.encode_row(KEY, [f"key-{i:09d}"])
        return struct.pack(">I", hasher.hash(row) % KEY_GROUPS) + row

    def value(i: int, n: int) -> bytes:
        return b"\x01" + rows.encode_row(VALUE, [n, i])

    db_dir = root / ".build-db"
    db = rocksdb.open_db(db_dir, bulk_load=False)
    from rocksdict import WriteBatch

    t0 = time.time()
    for start in range(0, keys, 200_000):
        batch = WriteBatch(raw_mode=True)
        for i in range(start, min(keys, start + 200_000)):
            batch.put(stored(i), value(i, 1))
        db.write(batch)
    db.flush()
    db.compact_range(None, None)
    db.close()
    print(f"wrote {keys} keys in {time.time() - t0:.0f} s", file=sys.stderr)
    batch_id = uuid.uuid4()
    listed = []
    for f in sorted(db_dir.iterdir()):
        if FILE_NAME.fullmatch(f.name):
            rel = f"ks-files/{batch_id}-{f.name}"
            os.replace(f, part / rel)
            listed.append(mf.SnapshotFile(f.name, rel, (part / rel).stat().st_size))
    m = mf.Manifest(1, KEY_GROUPS, keys, tuple(listed), key_layout=KeyLayout(1, 1, 0))
    (part / "1.ks-snapshot").write_bytes(mf.encode(m))
    (part / "1.ks-changelog").write_bytes(changelog.compress(changelog.encode(1, KEY_GROUPS, []), {}))
    for v in range(2, 2 + changelogs):
        recs = [(changelog.OP_PUT_EXISTING, stored(i), value(i, v)) for i in range((v - 2) * changelog_keys,
                                                                                   (v - 1) * changelog_keys)]
        (part / f"{v}.ks-changelog").write_bytes(changelog.compress(changelog.encode(v, KEY_GROUPS, recs),
                                                                    {"keyLayout": KeyLayout(1, 1, 0).to_json()}))
    last = changelogs  # batch = version - 1
    for d in ("offsets", "commits"):
        (root / d).mkdir()
    (root / "offsets" / str(last)).write_text(
        'v1\n{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{"spark.sql.shuffle.partitions":"1"}}\n-')
    (root / "commits" / str(last)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def _read_one_changelog_ms(fixed_width: bool, records: int = 100_000) -> float:
    import random

    rnd = random.Random(7)
    puts = [(changelog.OP_PUT_NEW, struct.pack(">I", rnd.randrange(KEY_GROUPS)) +
             (b"key-%09d" % i if fixed_width else b"key-%d" % rnd.randrange(10 ** rnd.randrange(1, 10))),
             b"\x01" + bytes(17)) for i in range(records)]
    data = changelog.compress(changelog.encode(2, KEY_GROUPS, puts), {"version": 2, "keyGroups": KEY_GROUPS})
    times = []
    for _ in range(5):
        t = time.perf_counter()
        changelog.decode(data, "bench")
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=10_000_000)
    ap.add_argument("--changelogs", type=int, default=9)
    ap.add_argument("--changelog-keys", type=int, default=100_000)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/keyedstate-get-bench"))
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "RESULTS-get.md")
    args = ap.parse_args()
    if not (args.dir / "commits").exists():
        build(args.dir, args.keys, args.changelogs, args.changelog_keys)
    from keyedstate import get

    def timed(key: str) -> tuple[float, dict]:
        t = time.perf_counter()
        r = get(args.dir, 0, {"k": key})
        return (time.perf_counter() - t) * 1000, r

    newest = args.changelogs - 1
    cases = {"newest changelog": f"key-{newest * args.changelog_keys + 5:09d}",
             "snapshot (searched every changelog)": f"key-{args.keys - 7:09d}",
             "absent": "key-x"}
    lines = ["# `keyedstate get` latency", "",
             f"State: {args.keys:,} keys in one store partition (one RocksDB snapshot, "
             f"{sum(p.stat().st_size for p in (args.dir / 'state/0/0/ks-files').iterdir()) / 1e6:.0f} MB) plus "
             f"{args.changelogs} zstd changelogs of {args.changelog_keys:,} puts each after it. "
             f"Machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start.", "",
             "| lookup | in-process median (ms) | in-process max (ms) | `keyedstate get` command, wall (ms) |",
             "|---|---|---|---|"]
    for label, key in cases.items():
        ms = [timed(key)[0] for _ in range(5)]
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "keyedstate.cli", "get", "--checkpoint", str(args.dir),
                               "--operator", "0", "--key", json.dumps({"k": key})], capture_output=True, text=True)
        wall = (time.perf_counter() - t) * 1000
        assert proc.returncode in (0, 3), proc.stderr
        lines.append(f"| {label} | {statistics.median(ms):.0f} | {max(ms):.0f} | {wall:.0f} |")
    lines += ["", "A lookup reads every changelog after the snapshot in full (framing, CRC-32, record count). "
              "Reading one changelog of codec 2 (key groups apart) of 100,000 puts, median of 5 (ms):", "",
              "| key layout | read (ms) |", "|---|---|"]
    for label, width in (("fixed width (as above: numpy joins the key groups back)", True),
                         ("variable width (a walk over the record boundaries)", False)):
        lines.append(f"| {label} | {_read_one_changelog_ms(width):.0f} |")
    lines += ["", "With variable-width keys the nine changelogs above would cost about nine times the "
              "second figure, on top of the snapshot read.", "",
              f"Load average at the end: {os.getloadavg()[0]:.1f}.", ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
