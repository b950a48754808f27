"""Which partitions a rescale marks as retired (FORMATS.md, "Partitions a scale-down retires"):
every partition directory of the store at or past the new count that is not live, including
those an earlier scale-down left without a marker (one before markers existed, or Spark's own
repartition), so that no retired partition's files stay for good."""
from __future__ import annotations

from pathlib import Path

from keyedstate.offline.rescale.commit import mark_retired


def _partition(op_dir: Path, p: int, *names: str) -> Path:
    d = op_dir / str(p)
    (d / "ks-files").mkdir(parents=True)
    (d / "ks-files" / "x-1.sst").write_bytes(b"s")
    for name in names:
        (d / name).write_bytes(b"")
    (d / "3.ks-changelog").write_bytes(b"c")
    return d


def _markers(op_dir: Path) -> list[str]:
    return sorted(f"{p.parent.name}/{p.name}" for p in op_dir.glob("*/ks-retired-*"))


def test_a_scale_down_marks_the_partitions_an_unmarked_earlier_scale_down_left(tmp_path):
    """16 -> 8 by a tool that wrote no marker left 8..15 (12 and 13 hold state); 8 -> 4 marks
    4..7 and also 12 and 13, each in partition q mod 4."""
    op_dir = tmp_path / "state" / "0"
    for p in (0, 1, 2, 3, 4, 5, 6, 7, 12, 13):
        _partition(op_dir, p)
    mark_retired(op_dir, "default", 4, 8, 21)
    assert _markers(op_dir) == ["0/ks-retired-12-21", "0/ks-retired-4-21", "1/ks-retired-13-21",
                                "1/ks-retired-5-21", "2/ks-retired-6-21", "3/ks-retired-7-21"]


def test_a_partition_an_existing_marker_names_is_not_marked_again(tmp_path):
    """12, retired by a marked 16 -> 8 (its marker in 4), goes with 4 by the marker 4 holds:
    8 -> 4 writes no second one. A scale-up marks the leftovers it does not recreate."""
    op_dir = tmp_path / "state" / "0"
    for p in range(8):
        _partition(op_dir, p, *(["ks-retired-12-11"] if p == 4 else []))
    _partition(op_dir, 12)
    mark_retired(op_dir, "default", 4, 8, 21)
    assert _markers(op_dir) == ["0/ks-retired-4-21", "1/ks-retired-5-21", "2/ks-retired-6-21",
                                "3/ks-retired-7-21", "4/ks-retired-12-11"]
    for n, marked in ((8, []), (4, ["0/ks-retired-4-21", "1/ks-retired-5-21"])):
        up = tmp_path / f"up-{n}" / "state" / "0"
        for p in (0, 1, 4, 5):  # 2 partitions after a 6 -> 2 whose leftovers 4, 5 hold state
            _partition(up, p)
        mark_retired(up, "default", n, 2, 21)  # 2 -> 8 recreates 4 and 5; 2 -> 4 leaves them
        assert _markers(up) == marked


def test_a_join_store_is_marked_in_its_own_directory(tmp_path):
    """A leftover partition of a join holds each store in a subdirectory: the marker goes into
    that store's directory of partition q mod N, and only for stores the leftover holds."""
    op_dir = tmp_path / "state" / "0"
    for p in (0, 1, 6):
        for store in ("left-keyToNumValues", "right-keyToNumValues"):
            if p == 6 and store.startswith("right"):
                continue
            d = op_dir / str(p) / store
            (d / "ks-files").mkdir(parents=True)
            (d / "3.ks-changelog").write_bytes(b"c")
    for store in ("left-keyToNumValues", "right-keyToNumValues"):
        mark_retired(op_dir, store, 1, 2, 21)
    assert sorted(str(p.relative_to(op_dir)) for p in op_dir.glob("*/*/ks-retired-*")) == [
        "0/left-keyToNumValues/ks-retired-1-21", "0/left-keyToNumValues/ks-retired-6-21",
        "0/right-keyToNumValues/ks-retired-1-21"]
