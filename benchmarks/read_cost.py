"""The cost ratio behind the near cache's cold start (``CacheWarmer.ScanKeysPerRead``): a point
read of a key against one key's share of a sequential scan, in the JVM through Spark's
rocksdbjni, on one partition of W5's state after a 4 -> 8 rescale (1.25M keys; stored key =
4-byte key group + the grouping key as an UnsafeRow, value = the count as an UnsafeRow), written
with keyedstate's own RocksDB options and compacted, as a snapshot is. ``NativeReadCost.java``
is compiled with the JDK's javac against pyspark's rocksdbjni jar and run in a fresh JVM.

    python3 -m benchmarks.read_cost [--keys 1250000] [--reads 100000] [--dir /tmp/ks-read-cost]

The warm-up's per-key cost also includes the near cache's insert: compare ``scan_us_per_entry``
with ``keyedstateLoadLatencyMs`` over the keys loaded in a benchmark run.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import struct
import subprocess
import tempfile
from itertools import islice
from pathlib import Path
from typing import Iterable

from keyedstate.formats import rocksdb
from keyedstate.shim.jar import pyspark_jars_dir

KEY_GROUPS = 201600


def _stored_key(k: int) -> bytes:
    row = struct.pack("<qq", 0, k)  # UnsafeRow: null bits, then the long
    return struct.pack(">I", (k * 2654435761) % KEY_GROUPS) + row


def write_compacted(db_dir: Path, items: Iterable[tuple[bytes, bytes]], file_bytes: int | None = None) -> None:
    """A database of ``items`` written with keyedstate's RocksDB options and compacted, as a
    snapshot is (``file_bytes``: its table files' target size, else RocksDB's)."""
    from rocksdict import WriteBatch

    db = rocksdb.open_db(db_dir, bulk_load=False)
    try:
        if file_bytes is not None:
            db.set_options({"target_file_size_base": str(file_bytes)})
        items = iter(items)
        while chunk := list(islice(items, 100_000)):
            batch = WriteBatch(raw_mode=True)
            for key, value in chunk:
                batch.put(key, value)
            db.write(batch)
        db.flush()
        db.compact_range(None, None)
    finally:
        db.close()


def build(db_dir: Path, keys: int) -> list[int]:
    """Every 8th integer from 0 is a key (the others are absent keys in between)."""
    present = [i * 8 for i in range(keys)]
    write_compacted(db_dir, ((_stored_key(k), struct.pack("<qq", 0, k % 1000)) for k in present))
    return present


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=1_250_000)
    ap.add_argument("--reads", type=int, default=100_000)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args(argv)
    work = args.dir or Path(tempfile.mkdtemp(prefix="ks-read-cost-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        present = build(work / "db", args.keys)
        rng = random.Random(1)
        (work / "present.bin").write_bytes(b"".join(_stored_key(k) for k in rng.sample(present, args.reads)))
        (work / "absent.bin").write_bytes(b"".join(_stored_key(k * 8 + 5) for k in rng.sample(range(args.keys), args.reads)))
        jar = next(pyspark_jars_dir().glob("rocksdbjni-*.jar"))
        source = Path(__file__).with_name("NativeReadCost.java")
        subprocess.run(["javac", "-d", str(work), "-cp", str(jar), str(source)], check=True)
        out = subprocess.run(["java", "-cp", f"{jar}:{work}", "NativeReadCost", str(work / "db"),
                              str(work / "present.bin"), str(work / "absent.bin"), "20"],
                             check=True, capture_output=True, text=True).stdout
        rounds = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        for r in rounds:
            print(json.dumps(r))
        last = rounds[-1]
        print(f"point read / scanned entry: present {last['read_present_us'] / last['scan_us_per_entry']:.1f}x, "
              f"absent {last['read_absent_us'] / last['scan_us_per_entry']:.1f}x (last round)")
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
