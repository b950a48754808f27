"""Attacks on the rescale's splits by files, which run in worker processes of the driver
(keyedstate/offline/rescale/local_workers.py): the driver or a worker killed mid-split, damaged
parents; real Spark, real CLI processes, real files."""
from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

import pytest

import keyedstate
from keyedstate import checkpoint as ckpt, cli
from support.offline import await_a_split_running, kill_rescale_driver_while_splitting, rescale_cli, rescale_workers
from support.rescale_query import continues_exactly, expected, quiet_snapshotted_query


def test_a_killed_worker_fails_the_rescale_and_a_killed_driver_takes_its_workers_along(spark, tmp_path):
    """4 -> 8 from snapshots, on one query. First a worker process SIGKILLed from outside while
    it splits: the rescale fails naming the split it ran, and the driver's rollback leaves every
    file as it was. Then the CLI's driver process alone SIGKILLed while its workers split: every
    worker dies with it, and a rerun finishes the batch. The query goes on exactly."""
    stream, out, op_dir, confs, files = quiet_snapshotted_query(spark, tmp_path)
    root = Path(stream.checkpoint)
    before = files()
    killed: list[int] = []

    def kill_a_worker():
        await_a_split_running(root)
        killed.extend(rescale_workers(os.getpid())[:1])
        for pid in killed:
            os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_a_worker, daemon=True)
    killer.start()
    with pytest.raises(keyedstate.RescaleError, match=r"the worker process running the split of partition [0-3] "
                       rf"of {re.escape(str(op_dir))}/[0-3] was killed by SIGKILL before it finished"):
        keyedstate.rescale(stream.checkpoint, 8, spark=spark)
    killer.join()
    assert killed and not rescale_workers(os.getpid())
    after = files()
    assert after == before, (sorted(set(before) - set(after)), sorted(set(after) - set(before)))
    assert not (root / "_keyedstate_rescale").exists() and not (root / "offsets" / "3").exists()

    proc = rescale_cli("--checkpoint", stream.checkpoint, "--partitions", "8")
    workers = kill_rescale_driver_while_splitting(proc, root)  # they died with it
    assert workers, "the splits did not run in the driver's worker processes"
    result = keyedstate.rescale(stream.checkpoint, 8, spark=spark)
    assert result.splits_in_driver and result.resumed and result.keys == len(expected(3)), result
    continues_exactly(spark, stream, out, confs)


def test_a_split_by_files_of_a_damaged_manifest_warns_naming_it_and_splits_from_an_older_one(spark, tmp_path,
                                                                                            capfd):
    """One parent's snapshot manifest of the version read truncated: the split (in a worker
    process of the driver) skips it for the retained older snapshot plus changelogs, as a load
    does, and its warning naming the manifest reaches the driver's stderr; the query goes on
    exactly. (Damage to an SST every retained snapshot shares: see the next test.)"""
    stream, out, op_dir, confs, _ = quiet_snapshotted_query(spark, tmp_path)
    manifest = op_dir / "2" / "3.ks-snapshot"
    good = manifest.read_bytes()
    manifest.write_bytes(good[:len(good) // 2])
    capfd.readouterr()
    result = keyedstate.rescale(stream.checkpoint, 8, spark=spark)
    assert result.splits_in_driver and result.keys == len(expected(3)), result
    assert re.search(rf"WARNING keyedstate\.checkpoint\.rebuilder: skipping snapshot {re.escape(str(manifest))} "
                     r"in favour of an older one plus changelogs: .*truncated or corrupt", capfd.readouterr().err)
    continues_exactly(spark, stream, out, confs)


def test_a_split_by_files_that_cannot_rebuild_a_parent_fails_in_the_cli_naming_the_file(spark, tmp_path, capfd):
    """Every snapshot of parent 2 (through the SST they share) and its changelogs truncated:
    the CLI's split in a worker process fails, and what it prints names a damaged file of
    that partition, on one line, without a traceback; the rollback leaves every file as it was.
    (The CLI's own code, in this process: it takes the session that is already up.)"""
    stream, _, op_dir, _, files = quiet_snapshotted_query(spark, tmp_path)
    part = op_dir / "2"
    listed = ckpt.read_manifest(part / "3.ks-snapshot", 3).files
    damaged = [max((part / f.path for f in listed if f.name.endswith(".sst")), key=lambda p: p.stat().st_size),
               *sorted(part.glob("*.ks-changelog"))]
    good = {p: p.read_bytes() for p in damaged}
    for p in damaged:
        p.write_bytes(good[p][:len(good[p]) // 2])
    before = files()
    capfd.readouterr()
    code = cli.main(["rescale", "--checkpoint", stream.checkpoint, "--partitions", "8"])
    err = capfd.readouterr().err
    for p, data in good.items():
        p.write_bytes(data)
    said = [line for line in err.splitlines() if line.startswith("keyedstate: error:")]
    assert code == 1 and len(said) == 1, err[-3000:]
    assert any(str(p) in said[0] for p in damaged), said
    assert "Traceback" not in err.split("rolling back the repartition batch")[-1], err[-3000:]
    after = files()
    assert set(after) == set(before) and all(after[f] == before[f] for f in after
                                             if op_dir / f not in good), (sorted(set(before) ^ set(after)))
    assert not (Path(stream.checkpoint) / "_keyedstate_rescale").exists()
