"""Every read of a checkpoint file by the offline tools is size-capped and follows no symbolic
link: a linked or oversized file is refused with an error naming it, before it is read."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from keyedstate.checkpoint import Checkpoint, CheckpointError, list_store
from keyedstate.checkpoint.storage import LocalStorage
from keyedstate.formats import layout
from keyedstate.offline.sparkhash import read_key_schema

LINK = "is a symbolic link"
TOO_LARGE = f"({layout.MAX_SPARK_METADATA_BYTES})"


def _sparse(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


def _linked(path: Path, target: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"v1\n{}")
    path.symlink_to(target)
    return path


def test_a_linked_changelog_in_a_store_partition_is_refused_naming_it(tmp_path):
    part = tmp_path / "state" / "0" / "0"
    (part).mkdir(parents=True)
    (part / "1.ks-changelog").write_bytes(b"")
    link = _linked(part / "2.ks-changelog", tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match=LINK) as err:
        list_store(part, 0)
    assert str(link) in str(err.value)


def test_a_linked_or_oversized_state_schema_file_is_refused_naming_it(tmp_path):
    schema = _linked(tmp_path / "a" / "_metadata" / "schema", tmp_path / "elsewhere")
    with pytest.raises(ValueError, match=LINK) as err:
        read_key_schema(schema)
    assert str(schema) in str(err.value)
    huge = _sparse(tmp_path / "b" / "_metadata" / "schema", layout.MAX_SPARK_METADATA_BYTES + 1)
    with pytest.raises(ValueError) as err:
        read_key_schema(huge)
    assert str(huge) in str(err.value) and TOO_LARGE in str(err.value)


def test_an_oversized_state_schema_file_is_refused_unread_through_a_checkpoint(tmp_path):
    (tmp_path / "offsets").mkdir()
    huge = _sparse(tmp_path / "state" / "0" / "0" / "_metadata" / "schema", layout.MAX_SPARK_METADATA_BYTES + 1)
    with pytest.raises(CheckpointError) as err:
        Checkpoint(LocalStorage(tmp_path)).schema(0)
    assert str(huge) in str(err.value) and TOO_LARGE in str(err.value)


def test_linked_or_oversized_operator_metadata_is_refused_naming_it(tmp_path):
    op = tmp_path / "state" / "0"
    meta = _linked(op / "_metadata" / "metadata", tmp_path / "elsewhere")
    ck = Checkpoint(LocalStorage(tmp_path))
    with pytest.raises(CheckpointError, match=LINK) as err:
        ck.operator_metadata(str(op))
    assert str(meta) in str(err.value)
    os.unlink(meta)
    _sparse(meta, layout.MAX_SPARK_METADATA_BYTES + 1)
    with pytest.raises(CheckpointError) as err:
        ck.operator_metadata(str(op))
    assert str(meta) in str(err.value) and TOO_LARGE in str(err.value)
