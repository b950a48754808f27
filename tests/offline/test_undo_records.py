"""``keyedstate undo`` reads its record from the checkpoint, so the record is untrusted like any
file there: it may restore only the changed store's schema file, and undo deletes only names the
change can have written. Checkpoints laid out by hand (no Spark: undo of a local checkpoint
needs none)."""
from __future__ import annotations

import base64
import json

import pytest

import keyedstate
from keyedstate.offline.processor import StateProcessorError

OFFSETS = b'v1\n{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}\n0\n'
COMMIT = b'v1\n{"nextBatchWatermarkMs":0}\n'


def _checkpoint(root):
    """A query that committed batch 0 (state version 1), then a change of batch 1 (version 2)
    whose record lists every name before it; returns the record (a dict) to write."""
    for rel, data in {"metadata": b'{"id":"q"}', "offsets/0": OFFSETS, "commits/0": COMMIT,
                      "state/0/0/1.delta": b"one", "state/0/0/_metadata/schema": b"old schema"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    for rel, data in {"offsets/1": OFFSETS, "commits/1": COMMIT, "state/0/0/2.delta": b"two",
                      "state/0/0/.2.delta.crc": b"crc", "state/0/0/_metadata/schema": b"new schema",
                      "state/0/0/_metadata/schema.before-batch-1": b"old schema"}.items():
        (root / rel).write_bytes(data)
    return {"batch": 1, "lastCommitted": 0, "operation": "transform", "operator": 0, "store": "default",
            "startedAt": 0, "names": names,
            "schemas": {"state/0/0/_metadata/schema": base64.b64encode(b"old schema").decode()}}


def _write(root, record):
    (root / "_keyedstate_changes").mkdir(exist_ok=True)
    (root / "_keyedstate_changes" / "1.json").write_text(json.dumps(record))


def _files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_undo_of_a_true_record_takes_the_change_back(tmp_path):
    _write(tmp_path, _checkpoint(tmp_path))
    result = keyedstate.undo(tmp_path)
    assert result["batch"] == 1
    assert _files(tmp_path) == {"commits/0": COMMIT, "metadata": b'{"id":"q"}', "offsets/0": OFFSETS,
                                "state/0/0/1.delta": b"one", "state/0/0/_metadata/schema": b"old schema"}


@pytest.mark.parametrize("target", ["offsets/0", "metadata", "state/0/0/1.delta"])
def test_a_record_restores_no_file_but_the_changed_stores_schema(tmp_path, target):
    """Before: undo wrote the record's bytes to whatever path it named (Spark's offsets/0 here;
    on hdfs:// or s3a:// a ``../`` path resolves outside the checkpoint)."""
    record = _checkpoint(tmp_path)
    record["schemas"] = {target: base64.b64encode(b"planted").decode()}
    _write(tmp_path, record)
    before = _files(tmp_path)
    with pytest.raises(StateProcessorError, match=r"1\.json: the record .* unreadable .*not the changed store's"):
        keyedstate.undo(tmp_path)
    assert _files(tmp_path) == before


def test_a_record_naming_a_store_outside_the_checkpoint_is_refused(tmp_path):
    record = _checkpoint(tmp_path)
    record["store"] = "../../../elsewhere"
    record["schemas"] = {"state/0/0/../../../elsewhere/_metadata/schema": base64.b64encode(b"planted").decode()}
    _write(tmp_path, record)
    before = _files(tmp_path)
    with pytest.raises(StateProcessorError, match=r"not a plain name"):
        keyedstate.undo(tmp_path)
    assert _files(tmp_path) == before


def test_undo_deletes_nothing_the_change_cannot_have_written(tmp_path):
    """Before: a record that leaves names out (tampered, or a query that wrote files since)
    made undo delete them: Spark's metadata, offsets and commits, older state versions."""
    record = _checkpoint(tmp_path)
    record["names"] = ["state", "state/0", "state/0/0", "state/0/0/_metadata", "state/0/0/_metadata/schema"]
    _write(tmp_path, record)
    before = _files(tmp_path)
    with pytest.raises(StateProcessorError, match=r"are not files that change writes .*nothing was undone"):
        keyedstate.undo(tmp_path)
    assert _files(tmp_path) == before


def test_undo_leaves_a_later_batchs_state_to_its_query(tmp_path):
    """A query that runs on the changed checkpoint writes version 3 before its offsets entry
    lists as batch 2's: undo refuses instead of deleting it."""
    _write(tmp_path, _checkpoint(tmp_path))
    (tmp_path / "state/0/0/3.delta").write_bytes(b"three")
    before = _files(tmp_path)
    with pytest.raises(StateProcessorError, match=r"3\.delta and 0 other name"):
        keyedstate.undo(tmp_path)
    assert _files(tmp_path) == before
