"""The split task of a 4 -> 8 rescale by files, on real RocksDB and real checkpoint files (no
Spark): what a heir writes of its own when its parent's version is a snapshot plus changelogs."""
from __future__ import annotations

import zlib
from collections import Counter
from pathlib import Path

import pytest
from rocksdict import Checkpoint

from keyedstate import checkpoint as ckpt
from keyedstate.formats import changelog, keygroups, rocksdb
from keyedstate.formats import manifest as mf
from keyedstate.formats.layout import CHANGELOG_SUFFIX
from keyedstate.offline.rescale import clip, tasks

KEY_GROUPS, FROM, TO = 256, 4, 8
SNAPSHOT, CHANGELOGS = 20, 3


def _key(i: int) -> bytes:  # a key of partition 0 of 4: key groups 0, 4, 8, ...
    group = zlib.crc32(b"%d" % i) % (KEY_GROUPS // FROM) * FROM
    return keygroups.prefix(group) + b"key-%09d" % i


def _parent(part: Path, scratch: Path, keys: int,
            counted: bool = False) -> tuple[mf.Manifest, dict[bytes, bytes], list[bytes]]:
    """Snapshot 20 of partition 0 as a store leaves it, three L0 files (a seed and two later
    flushes; with its key-group counts if ``counted``), then changelogs 21-23, each updating 1 %
    of the keys, adding as many, deleting a few, and putting or deleting some keys the one before
    added or deleted, every op of a key its writer did not know: the snapshot's manifest, the
    state at version 23 and the changelogs' keys."""
    state: dict[bytes, bytes] = {}
    replayed: list[bytes] = []
    db = rocksdb.open_db(scratch / "db", compactions=False)
    seed, second = keys - 2 * keys // 50, keys - keys // 50
    for begin, end in ((0, seed), (seed, second), (second, keys)):
        for i in range(begin, end):
            db[_key(i)] = state[_key(i)] = b"value-%012d" % i
        db.flush()
    assert db.property_int_value("rocksdb.num-files-at-level0") == 3
    Checkpoint(db).create_checkpoint(str(scratch / "snapshot"))
    db.close()
    counts = Counter(keygroups.key_group_of_stored_key(k) for k in state) if counted else None
    manifest = ckpt.write_snapshot(scratch / "snapshot", part, SNAPSHOT, KEY_GROUPS, len(state),
                                   key_group_counts=counts)
    step = keys // 100
    for v in range(SNAPSHOT + 1, SNAPSHOT + 1 + CHANGELOGS):
        n = v - SNAPSHOT
        records = [(changelog.OP_PUT, _key(i), b"update-%d-%d" % (v, i)) for i in range(n * step, (n + 1) * step)]
        records += [(changelog.OP_PUT, _key(i), b"new-%d" % i) for i in range(keys + n * step, keys + (n + 1) * step)]
        records += [(changelog.OP_DELETE, _key(i), None) for i in range(keys - n * 10, keys - n * 10 + 5)]
        if n > 1:  # whether these keys are there is the changelog before's doing
            added, deleted = keys + (n - 1) * step, keys - (n - 1) * 10
            records += [(changelog.OP_PUT, _key(i), b"again-%d" % i) for i in range(added, added + 3)]
            records += [(changelog.OP_DELETE, _key(i), None) for i in range(added + 3, added + 5)]
            records += [(changelog.OP_DELETE, _key(i), None) for i in range(deleted, deleted + 2)]
        replayed += [k for _, k, _ in records]
        for op, k, value in records:
            if value is None:
                state.pop(k, None)
            else:
                state[k] = value
        inner = changelog.encode(v, KEY_GROUPS, records)
        (part / f"{v}{CHANGELOG_SUFFIX}").write_bytes(changelog.compress(inner, {}))
    return manifest, state, replayed


@pytest.mark.parametrize("counted", [False, True], ids=["keys-counted", "key-group-counts"])
def test_a_split_by_files_of_a_snapshot_plus_changelogs_writes_the_replay_and_range_deletes_alone(tmp_path, counted):
    """The parent's snapshot has three L0 files; the replay of its changelogs flushes a fourth,
    RocksDB's L0 compaction trigger. A heir lists every SST of the snapshot where it is and
    writes one file of its own: its range deletes (32 or 33 tombstones) and the changelogs'
    records of the key groups it owns (~3 % of the snapshot's keys here, half of ~6 %). So its
    own bytes are far below a quarter of the snapshot's; a compaction of the parent (its
    output, a rewrite of the whole snapshot, new to every heir) would put them near the
    snapshot's whole size. Each heir loads exactly the parent's keys of the key groups it owns,
    with its manifest counting them, and its file holds no other heir's key. Where the snapshot
    has key-group counts, the split takes them through the changelogs without writing them into
    the parent's files (asking the snapshot, and the changelogs before, whether the keys their
    writer did not know were there): each heir's counts are its keys', key group by key group."""
    op_dir = tmp_path / "state" / "0"
    part = op_dir / "0"
    part.mkdir(parents=True)
    for q in range(1, TO):
        (op_dir / str(q)).mkdir()
    parent, state, replayed = _parent(part, tmp_path / "build", 60_000, counted)
    snapshot_ssts = {f.path.rsplit("/", 1)[1]: f.size for f in parent.files if f.name.endswith(".sst")}
    last, version = SNAPSHOT + CHANGELOGS, SNAPSHOT + CHANGELOGS + 2
    staging = tmp_path / "staging"
    staging.mkdir()
    task = tasks.SplitTask(operator=0, store="default", store_path=str(part), partition=0, version=last,
                           staging=str(staging / "0"), partitions=TO, key_groups=KEY_GROUPS, hash_spec=None,
                           direct=True, from_partitions=FROM, target_version=version, targets=str(op_dir),
                           origin={"fromPartitions": FROM}, key_layout=None)
    result = tasks.split(task)
    assert "clip" in result["seconds"], result  # the split by files
    assert result["countedByKeys"] is not counted, result
    assert result["published"] == [0, 4]
    # Only the split keeps the changelogs it replayed decoded; every other rebuild frees them.
    with ckpt.rebuild(ckpt.list_store(part, 0), last) as rebuilt:
        assert rebuilt.changelogs_applied == CHANGELOGS and rebuilt.logs == ()

    for q in (0, 4):
        heir = ckpt.read_manifest(op_dir / str(q) / f"{version}.ks-snapshot", version)
        listed = {f.path.rsplit("/", 1)[1]: f for f in heir.files if f.name.endswith(".sst")}
        own = [f for name, f in listed.items() if name not in snapshot_ssts]
        assert sum(f.size for f in own) < sum(snapshot_ssts.values()) / 4, (q, own, sum(snapshot_ssts.values()))
        assert len(own) == 1, (q, own)  # its range deletes and its share of the replay
        assert set(snapshot_ssts) <= set(listed), (q, sorted(listed))
        assert all(listed[name].size == size for name, size in snapshot_ssts.items())

        expected = {k: v for k, v in state.items() if keygroups.key_group_of_stored_key(k) % TO == q}
        with ckpt.rebuild(ckpt.list_store(op_dir / str(q), q), version, count_key_groups=True) as rebuilt:
            assert dict(rebuilt.db.items()) == expected, q
            by_group = Counter(keygroups.key_group_of_stored_key(k) for k in expected)
            assert {g: c for g, c in rebuilt.key_group_counts.items() if c} == by_group, q
            [file] = [f for f in rebuilt.db.live_files() if f["name"].endswith(f"/{own[0].name}")]
        # its records (the changelogs' keys of its key groups: all different) and its range deletes
        mine = sum(keygroups.key_group_of_stored_key(k) % TO == q for k in set(replayed))
        assert file["num_entries"] == mine + len(clip.not_owned_ranges(q, TO, KEY_GROUPS)), (q, file, mine)
        assert heir.num_keys == len(expected) == result["keys"][str(q)]


@pytest.mark.parametrize("key, refused", [
    (keygroups.prefix(1) + b"of-partition-1", "puts key {hex}, which names no key group it owns"),
    (keygroups.prefix(KEY_GROUPS) + b"past-the-last", "puts key {hex}, which names no key group it owns"),
    (b"abc", "is corrupt \\(a key shorter than its key group\\)")], ids=["foreign", "past-key-groups", "too-short"])
def test_a_changelog_put_of_a_key_the_parent_does_not_own_fails_the_split(tmp_path, key, refused):
    """The changelogs are cut by heir without being written into the parent's files, so no seek
    over the rebuilt version meets their keys: a put of a key partition 0 does not own (key
    group 1 is partition 1's; key group KEY_GROUPS is no one's) fails the split naming the
    changelog, instead of being dropped by the routing or kept above every range delete, as one
    too short to name a key group does (refused by the changelog's reader)."""
    op_dir = tmp_path / "state" / "0"
    part = op_dir / "0"
    part.mkdir(parents=True)
    for q in range(1, TO):
        (op_dir / str(q)).mkdir()
    _parent(part, tmp_path / "build", 2_000, counted=True)
    last = SNAPSHOT + CHANGELOGS
    inner = changelog.encode(last + 1, KEY_GROUPS, [(changelog.OP_PUT, key, b"misplaced")])
    (part / f"{last + 1}{CHANGELOG_SUFFIX}").write_bytes(changelog.compress(inner, {}))
    (tmp_path / "staging").mkdir()
    task = tasks.SplitTask(operator=0, store="default", store_path=str(part), partition=0, version=last + 1,
                           staging=str(tmp_path / "staging" / "0"), partitions=TO, key_groups=KEY_GROUPS,
                           hash_spec=None, direct=True, from_partitions=FROM, target_version=last + 2,
                           targets=str(op_dir), origin={"fromPartitions": FROM}, key_layout=None)
    refused = refused.format(hex=key.hex())
    with pytest.raises(ckpt.CheckpointError, match=rf"/{last + 1}{CHANGELOG_SUFFIX} .*{refused}"):
        tasks.split(task)
    assert not list((tmp_path / "staging").iterdir())
    assert not (op_dir / "4" / f"{last + 2}.ks-snapshot").exists()


@pytest.mark.parametrize("contradiction", ["deletes-of-absent-keys", "put-and-delete-in-an-emptied-key-group"])
def test_changelogs_that_contradict_the_files_get_the_heirs_counted_by_keys(tmp_path, contradiction):
    """Counts brought through changelogs are checked as the seek over a rebuilt version checked
    them: a DELETE_EXISTING of keys that are not there would leave a key group that holds keys
    with a count of 0; an unknown put then delete of one key (out of the format's rule of a key
    once per changelog) in a key group whose keys it deletes would leave that empty key group a
    count of 1. The split counts the version's keys instead, and each heir's counts are its keys'."""
    op_dir = tmp_path / "state" / "0"
    part = op_dir / "0"
    part.mkdir(parents=True)
    for q in range(1, TO):
        (op_dir / str(q)).mkdir()
    _, state, _ = _parent(part, tmp_path / "build", 2_000, counted=True)
    last = SNAPSHOT + CHANGELOGS
    by_group: dict[int, list[bytes]] = {}
    for k in state:
        by_group.setdefault(keygroups.key_group_of_stored_key(k), []).append(k)
    held, emptied = sorted(by_group)[:2]
    if contradiction == "deletes-of-absent-keys":
        records = [(changelog.OP_DELETE_EXISTING, keygroups.prefix(held) + b"absent-%d" % i, None)
                   for i in range(len(by_group[held]))]
    else:
        records = [(changelog.OP_DELETE_EXISTING, k, None) for k in by_group.pop(emptied)]
        records += [(changelog.OP_PUT, keygroups.prefix(emptied) + b"gone", b"x"),
                    (changelog.OP_DELETE, keygroups.prefix(emptied) + b"gone", None)]
    state = {k: v for g, keys in by_group.items() for k in keys for v in (state[k],)}
    inner = changelog.encode(last + 1, KEY_GROUPS, records)
    (part / f"{last + 1}{CHANGELOG_SUFFIX}").write_bytes(changelog.compress(inner, {}))
    (tmp_path / "staging").mkdir()
    version = last + 2
    task = tasks.SplitTask(operator=0, store="default", store_path=str(part), partition=0, version=last + 1,
                           staging=str(tmp_path / "staging" / "0"), partitions=TO, key_groups=KEY_GROUPS,
                           hash_spec=None, direct=True, from_partitions=FROM, target_version=version,
                           targets=str(op_dir), origin={"fromPartitions": FROM}, key_layout=None)
    result = tasks.split(task)
    assert result["countedByKeys"] is True, result
    for q in (0, 4):
        expected = Counter(g for k in state if (g := keygroups.key_group_of_stored_key(k)) % TO == q)
        assert result["keys"][str(q)] == sum(expected.values())
        with ckpt.rebuild(ckpt.list_store(op_dir / str(q), q), version, count_key_groups=True) as rebuilt:
            assert len(list(rebuilt.db.keys())) == rebuilt.manifest.num_keys == sum(expected.values())
            assert {g: c for g, c in rebuilt.key_group_counts.items() if c} == expected, q
