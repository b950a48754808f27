"""What a contiguous key-group layout would save a 4 -> 8 split by files (issue 49, point 5),
measured on one parent of W5's 10M-key state (2.5M keys of the key groups g = 0 mod 4, written
with keyedstate's RocksDB options and compacted, as a snapshot is) and one of its heirs:

- **strided** (today's layout): the heir hides every other key group of its parent, 25,200
  range deletes flushed with its share of the replayed changelogs (about 37k records) in one
  file; its reclaim is a full compaction, which rewrites every file.
- **contiguous** (a proxy of a layout in which each partition's key groups sort as one range):
  the heir hides the upper half of the key space with one range delete, flushed in a file of its
  own, then its records; its reclaim compacts the hidden range only.

For each: the clip (write and flush), the reclaim (`compact_range`), the scan of the heir's
visible keys before the reclaim, and how many of the parent's table files the heir still shares
after the reclaim (a shared file is never uploaded again). Python's rocksdict calls only; the
key prefix's order is the one thing the proxy changes.

    python3 -m benchmarks.clip_layout [--keys 2500000] [--file-mib 4] [--repeat 3] [--dir DIR]
"""
from __future__ import annotations

import argparse
import json
import shutil
import struct
import tempfile
import time
from pathlib import Path

from keyedstate.formats import keygroups, rocksdb
from keyedstate.offline.rescale.clip import not_owned_ranges

from .read_cost import write_compacted

KEY_GROUPS, FROM, TO = 201600, 4, 8
REPLAY_EVERY = 67  # one record of the replayed changelogs per 67 keys: 37k of 2.5M


def _stored_key(i: int) -> bytes:
    """Key i of partition 0 of FROM: key groups 0, 4, 8, ... in turn."""
    return keygroups.prefix(i % (KEY_GROUPS // FROM) * FROM) + struct.pack("<qq", 0, i)


def build_parent(db_dir: Path, keys: int, file_bytes: int) -> None:
    write_compacted(db_dir, ((_stored_key(i), struct.pack("<qq", 0, i % 1000)) for i in range(keys)), file_bytes)


def _visible(db) -> tuple[int, float]:
    from rocksdict import ReadOptions

    read = ReadOptions()
    read.fill_cache(False)
    started = time.perf_counter()
    n = sum(1 for _ in db.keys(read_opt=read))
    return n, time.perf_counter() - started


def measure(parent, work: Path, keys: int, layout: str) -> dict:
    from rocksdict import Checkpoint, WriteBatch

    if layout == "strided":
        hidden = not_owned_ranges(0, TO, KEY_GROUPS)
        owns = lambda g: g % TO == 0  # noqa: E731
    else:
        hidden = [(keygroups.prefix(KEY_GROUPS // 2), keygroups.prefix(KEY_GROUPS))]
        owns = lambda g: g < KEY_GROUPS // 2  # noqa: E731
    records = [(k, struct.pack("<qq", 0, 7)) for k in map(_stored_key, range(0, keys, REPLAY_EVERY))
               if owns(keygroups.key_group_of_stored_key(k))]
    heir_dir = work / f"heir-{layout}"
    shutil.rmtree(heir_dir, ignore_errors=True)
    Checkpoint(parent).create_checkpoint(str(heir_dir))
    parent_files = {f["name"] for f in parent.live_files()}
    db = rocksdb.open_db(heir_dir, bulk_load=False, compactions=False)
    try:
        started = time.perf_counter()
        batch = WriteBatch(raw_mode=True)
        for begin, end in hidden:
            batch.delete_range(begin, end)
        if layout == "contiguous":  # the range delete in a file of its own, over the hidden files only
            db.write(batch)
            db.flush()
            batch = WriteBatch(raw_mode=True)
        for k, v in records:
            batch.put(k, v)
        db.write(batch)
        db.flush()
        clip_s = time.perf_counter() - started
        visible, scan_s = _visible(db)
        started = time.perf_counter()
        if layout == "contiguous":
            db.compact_range(hidden[0][0], hidden[0][1])
        else:
            db.compact_range(None, None)
        reclaim_s = time.perf_counter() - started
        after = db.live_files()
        return {"layout": layout, "range_deletes": len(hidden), "clip_s": round(clip_s, 3),
                "scan_visible_s": round(scan_s, 3), "visible_keys": visible, "reclaim_s": round(reclaim_s, 3),
                "files_after": len(after), "shared_after": sum(f["name"] in parent_files for f in after),
                "new_mib_after": round(sum(f["size"] for f in after if f["name"] not in parent_files) / 2**20, 1)}
    finally:
        db.close()
        shutil.rmtree(heir_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=2_500_000)
    ap.add_argument("--file-mib", type=int, default=4, help="the parent's compaction output file size")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args(argv)
    work = args.dir or Path(tempfile.mkdtemp(prefix="ks-clip-layout-"))
    try:
        build_parent(work / "parent", args.keys, args.file_mib << 20)
        parent = rocksdb.open_db(work / "parent", bulk_load=False, compactions=False)
        try:
            files = parent.live_files()
            print(json.dumps({"parent_keys": args.keys, "parent_files": len(files),
                              "parent_mib": round(sum(f["size"] for f in files) / 2**20, 1)}))
            for _ in range(args.repeat):
                for layout in ("strided", "contiguous"):
                    print(json.dumps(measure(parent, work, args.keys, layout)), flush=True)
        finally:
            parent.close()
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
