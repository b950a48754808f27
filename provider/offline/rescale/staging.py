"""Where a rescale keeps its work: ``_keyedstate_rescale/batch-<B>/`` in the checkpoint, with
the journal that says which batch it reads and which failed batches it skips."""
from __future__ import annotations

import json
from pathlib import Path

from ...formats import layout

STAGING = "_keyedstate_rescale"
JOURNAL = "journal.json"
OUTBOX = "publish"  # inside a batch's staging: the new partitions' snapshots before commit.publish


def work_dir(root: Path, batch: int) -> Path:
    """The staging directory of repartition batch ``batch`` of the checkpoint ``root``."""
    return root / STAGING / f"batch-{batch}"


def skipped_batches(journal: dict, batch: int) -> list[int]:
    """The batches the rescale journalled for repartition batch ``batch`` skips: only ever those
    between the batch it reads and ``batch`` (anything else in a journal is not this tool's, and
    no commit outside them is touched)."""
    skipped, read = journal.get("skipped", []), journal.get("readBatch")
    return skipped if isinstance(read, int) and skipped == list(range(read + 1, batch)) else []


def read_journal(path: Path) -> dict:
    try:
        return json.loads(layout.read_file(path, layout.MAX_SPARK_METADATA_BYTES, "rescale journal"))
    except (OSError, ValueError):
        return {}


