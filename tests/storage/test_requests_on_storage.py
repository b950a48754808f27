"""What keyedstate asks of S3 (issue 48, item 4), counted by the proxy in front of moto
(support/s3proxy.py): a store partition's cleanup lists and reads its directory only when what it
would delete can have changed, a snapshot file is uploaded in one PUT (no rename), and commits and
loads ask no more, of each kind of request, than Spark's RocksDB provider's of the same
changelogs. benchmarks/faults_storage.py's ``requests`` run reports the counts per batch beside
Spark's providers."""
from __future__ import annotations

import collections
import re
import time

import pytest

from support.constants import KS, PFX, ROCKSDB_PROVIDER, STATE_PREFIX
from support.scenarios import KV_STEPS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PARTITION = "state/0/0"


def _key_prefix(uri: str) -> str:
    """The object key prefix of ``s3a://bucket/<key>``, as the proxy records keys."""
    return uri.split("://", 1)[1].split("/", 1)[1].rstrip("/") + "/"


def _versions(names: list[str], suffix: str) -> list[int]:
    return sorted(int(m.group(1)) for n in names if (m := re.fullmatch(rf"(\d+){re.escape(suffix)}", n)))


def test_cleanup_runs_again_only_when_retention_or_snapshot_moved(storage_session, storage_root, s3_proxy,
                                                             candidate_provider, tmp_path):
    if candidate_provider != KS:
        pytest.skip(f"runs keyedstate's cleanup, which {candidate_provider} has none of")
    checkpoint = f"{storage_root('s3a', 'requests')}/cleanup"
    storage_session.run_scenario("aggregation-update", KS, checkpoint, tmp_path / "run",
                                 confs={PFX + "snapshotInterval": "2"})
    names = storage_session.tool("store_files", checkpoint=checkpoint, partition_dir=PARTITION)
    changelogs, snapshots = _versions(names, ".ks-changelog"), _versions(names, ".ks-snapshot")
    head = changelogs[-1]
    assert head == len(KV_STEPS) and snapshots and snapshots[-1] <= head - 1, names
    rows = storage_session.offline("state_rows", checkpoint)

    # retain 1 version: the newest snapshot below head is the base, everything older goes
    runs = storage_session.tool("store_cleanups", checkpoint=checkpoint, partition_dir=PARTITION, min_versions=1,
                                runs=[[head, snapshots[-1]], [head, snapshots[-1]], [head + 1, snapshots[-1]],
                                      [head, snapshots[-1] + 1]])
    prefix = _key_prefix(f"{checkpoint}/{PARTITION}")
    asked = [collections.Counter(r.op for r in s3_proxy.since(run["start"], run["end"]) if r.key.startswith(prefix))
             for run in runs]
    base = snapshots[-1]
    left = storage_session.tool("store_files", checkpoint=checkpoint, partition_dir=PARTITION)
    assert runs[0]["deleted"] > 0 and asked[0]["LIST"] >= 1, (runs, asked)
    assert _versions(left, ".ks-changelog") == [v for v in changelogs if v > base], left
    assert _versions(left, ".ks-snapshot") == [base], left
    # the same head and snapshot: what the first one settled is not listed or read again
    assert runs[1]["deleted"] == 0 and sum(asked[1].values()) == 0, (runs, asked)
    # a newer head whose retention reaches no snapshot newer than the base: not listed either
    assert runs[2]["deleted"] == 0 and sum(asked[2].values()) == 0, (runs, asked)
    # a newer snapshot: a full cleanup again (nothing left to delete)
    assert runs[3]["deleted"] == 0 and asked[3]["LIST"] >= 1, (runs, asked)
    assert storage_session.offline("state_rows", checkpoint) == rows


def test_snapshot_files_are_uploaded_without_a_rename(storage_session, storage_root, s3_proxy, candidate_provider,
                                                      tmp_path):
    """A snapshot file goes to the checkpoint under its final name in one PUT: no temporary
    object, so no COPY and DELETE (s3a's rename), and no probe of the new name first. The
    restarted query loads those snapshots, and verify finds every file its manifests list."""
    if candidate_provider != KS:
        pytest.skip(f"uploads keyedstate's snapshots, which {candidate_provider} has none of")
    checkpoint = f"{storage_root('s3a', 'requests')}/snapshot-upload"
    storage_session.run_scenario("aggregation-update", KS, checkpoint, tmp_path / "run", restart_every_step=True,
                                 confs={PFX + "snapshotInterval": "2"})
    prefix = _key_prefix(f"{checkpoint}/state")
    files = [r for r in s3_proxy.since(0) if r.key.startswith(prefix) and "/ks-files/" in r.key
             and not r.key.endswith("/ks-files/")]
    uploaded = [r.key for r in files if r.op == "PUT"]
    names = [k.rsplit("/", 1)[-1] for k in uploaded]
    assert not [n for n in names if n.startswith(".") or n.endswith(".tmp")], names  # temporary objects
    assert len(uploaded) >= 4 and any(n.endswith(".sst") for n in names), names
    assert collections.Counter(r.op for r in files)["COPY"] == 0, collections.Counter(r.op for r in files)
    put_at = {r.key: r.time for r in files if r.op == "PUT"}
    probed_first = [(r.op, r.key) for r in files if r.op in ("HEAD", "LIST")
                    and r.key.rstrip("/") in put_at and r.time <= put_at[r.key.rstrip("/")]]
    assert not probed_first, probed_first
    assert any(n.endswith(".ks-snapshot") for n in
               storage_session.tool("store_files", checkpoint=checkpoint, partition_dir=PARTITION))
    report = storage_session.offline("verify", checkpoint)
    assert report["ok"], report


def _state_requests(proxy, start: float, end: float, checkpoint: str) -> collections.Counter:
    """(op, what, path) -> how many requests for the checkpoint's changelogs (path: partition and
    version, alike for both providers' names, temporary ones included) and store directories;
    snapshot files and manifests (which the two providers upload at different times) left out."""
    prefix = _key_prefix(f"{checkpoint}/state")
    out: collections.Counter = collections.Counter()
    for r in proxy.since(start, end):
        if not r.key.startswith(prefix):
            continue
        name = r.key.rstrip("/").rsplit("/", 1)[-1]
        where = r.key[len(prefix):].rstrip("/")
        if "changelog" in name:
            temp = name.endswith(".tmp")
            version = re.search(r"(\d+)(?:_[^.]*)?\.(?:ks-)?changelog", name)
            out[(r.op, "changelog (temp)" if temp else "changelog",
                 f"{where.rsplit('/', 1)[0]}/{version.group(1) if version else name}")] += 1
        elif "." not in name and "/ks-files" not in r.key and "/SSTs" not in r.key and "_metadata" not in r.key:
            out[(r.op, "store directory", where)] += 1
    return out


def _kinds(requests: collections.Counter) -> collections.Counter:
    """(op, what) -> how many, over every name."""
    out: collections.Counter = collections.Counter()
    for (op, what, _), n in requests.items():
        out[(op, what)] += n
    return out


def test_commit_and_load_ask_no_more_than_rocksdb(storage_session, storage_root, s3_proxy, candidate_provider,
                                                  tmp_path):
    """The same query, restarted after every step, with Spark's RocksDB provider (changelog
    checkpointing) and with keyedstate: the same versions committed and loaded, so at most as many
    requests of each kind (PUT, GET, LIST, HEAD, DELETE, COPY) for changelogs, temporary files
    and the store directories, each taken on its own."""
    if candidate_provider != KS:
        pytest.skip(f"compares keyedstate with RocksDB, not {candidate_provider}")
    requests = {}
    for label, provider, confs in [
            ("rocksdb", ROCKSDB_PROVIDER, {STATE_PREFIX + "rocksdb.changelogCheckpointing.enabled": "true"}),
            ("keyedstate", KS, {PFX + "snapshotInterval": "1000"})]:  # snapshots counted elsewhere
        checkpoint = f"{storage_root('s3a', 'requests')}/commit-{label}"
        start = time.time()
        storage_session.run_scenario("aggregation-update", provider, checkpoint, tmp_path / label,
                                     restart_every_step=True, confs=confs)
        requests[label] = _state_requests(s3_proxy, start, time.time(), checkpoint)
    # each keyedstate changelog is one conditional PUT of its final name: no temporary file, no COPY
    written = _kinds(requests["keyedstate"])
    assert written[("PUT", "changelog")] >= len(KV_STEPS), dict(written)
    assert written[("PUT", "changelog (temp)")] == written[("COPY", "changelog")] == 0, dict(written)
    # a changelog's requests counted together, whether they name its temporary file or its own
    merged = {label: collections.Counter() for label in requests}
    for label, counts in requests.items():
        for (op, what, path), n in counts.items():
            merged[label][(op, what.replace(" (temp)", ""), path)] += n
    rocksdb, keyedstate = _kinds(merged["rocksdb"]), _kinds(merged["keyedstate"])
    more = {kind: (n, rocksdb[kind]) for kind, n in keyedstate.items() if n > rocksdb[kind]}
    # which paths keyedstate asked for more often, to tell where an excess comes from
    where = {kind: sorted((path, n, merged["rocksdb"][(op, what, path)])
                          for (op, what, path), n in merged["keyedstate"].items()
                          if (op, what) == kind and n > merged["rocksdb"][(op, what, path)])
             for kind in more}
    assert not more, (more, where, dict(keyedstate), dict(rocksdb))


@pytest.mark.parametrize("where", ["hdfs", "s3a"])
def test_a_write_store_opens_its_changelog_before_the_commit(storage_session, storage_root, s3_proxy,
                                                            candidate_provider, where):
    """The commit does not wait for its changelog's create (HDFS's NameNode create, and with
    changelogSync=true HDFS's first block and its pipeline): the file opens when the task's write
    store is handed out. On s3a the changelog is written under its final name, one PUT refused if
    the name exists (If-None-Match), with no probe, copy or delete. Nothing of an open that never
    commits stays: an abort or the provider's close drops it, and only the committed version loads."""
    if candidate_provider != KS:
        pytest.skip(f"opens keyedstate's changelogs, which {candidate_provider} has none of")
    checkpoint = f"{storage_root(where, 'requests')}/opened-ahead"
    # changelogSync=true: on HDFS the open also hsyncs the file's first bytes (checked below)
    out = storage_session.tool("commit_opened_ahead", checkpoint=checkpoint,
                               confs={"spark.sql.streaming.stateStore.keyedstate.changelogSync": "true"})
    temp = re.compile(r"\.1\.ks-changelog\..+\.tmp")
    assert out["committed"] == 1 and out["value"] == 10, out
    for step in ("aborted", "closed"):
        assert out[step] == ["1.ks-changelog"], (step, out)
    if where == "hdfs":  # a file system shows a file while it is written
        assert any(temp.fullmatch(n) for n in out["before_commit"]), out
        # its first bytes hsynced: the pipeline and block were set up at the open
        assert [h for n, h in out["before_commit_bytes"].items() if temp.fullmatch(n)] == [b"KSCHLOG2\x00\x02".hex()], out
        assert any(re.fullmatch(r"\.2\.ks-changelog\..+\.tmp", n) for n in out["open"]), out
    else:  # an object store: one conditional PUT under the final name, at the commit, and nothing else
        prefix = _key_prefix(f"{checkpoint}/{PARTITION}")

        def changelog_1(start: float, until: float | None = None) -> list[tuple[str, str, str, int]]:
            return [(r.op, r.key[len(prefix):], r.if_none_match, r.status) for r in s3_proxy.since(start, until)
                    if r.key.startswith(prefix) and ".ks-changelog" in r.key and "/1." in "/" + r.key[len(prefix):]]

        assert changelog_1(0, out["commit_start"]) == [], changelog_1(0)  # s3a's create asks nothing
        assert changelog_1(out["commit_start"], out["commit_end"]) == [("PUT", "1.ks-changelog", "*", 200)], \
            changelog_1(0)
        assert not [n for n in out["open"] + out["aborted"] + out["closed"] if temp.fullmatch(n)], out


@pytest.mark.parametrize("where", ["hdfs", "s3a"])
def test_a_second_attempt_of_a_version_keeps_the_first_ones_changelog(storage_session, storage_root, s3_proxy,
                                                                       candidate_provider, where):
    """Two attempts of one version (two executors) both commit: the first one's changelog stays
    and loads, on HDFS through the rename that refuses an existing name, on s3a through the PUT
    that S3 refuses when the name exists (412)."""
    if candidate_provider != KS:
        pytest.skip("keyedstate's changelogs")
    checkpoint = f"{storage_root(where, 'requests')}/two-attempts"
    out = storage_session.tool("two_attempts", checkpoint=checkpoint)
    assert (out["first"], out["second"], out["value"]) == (1, 1, 10), out
    if where == "s3a":
        prefix = _key_prefix(f"{checkpoint}/{PARTITION}")
        puts = [(r.key[len(prefix):], r.if_none_match, r.status) for r in s3_proxy.since(out["second_start"])
                if r.op == "PUT" and r.key.startswith(prefix) and r.key.endswith(".ks-changelog")]
        assert puts == [("1.ks-changelog", "*", 412)], puts


def test_a_changelog_put_whose_answer_is_lost_commits_its_version_once(storage_session, storage_root, s3_proxy,
                                                                       candidate_provider):
    """S3 stores the changelog's PUT but its answer is lost (a 500): the client's retry is refused
    (412, the name exists: its own file). The commit keeps that file as the version, the next
    version commits on top of it, and both versions' writes load, once each."""
    if candidate_provider != KS:
        pytest.skip("keyedstate's changelogs")
    checkpoint = f"{storage_root('s3a', 'requests')}/lost-answer"
    prefix = _key_prefix(f"{checkpoint}/{PARTITION}")
    s3_proxy.lose_response(lambda r: r.op == "PUT" and r.key == prefix + "1.ks-changelog")
    try:
        out = storage_session.tool("commit_twice", checkpoint=checkpoint)
    finally:
        s3_proxy.disarm()
    puts = [(r.key[len(prefix):], r.if_none_match, r.status) for r in s3_proxy.since(out["first_start"])
            if r.op == "PUT" and r.key.startswith(prefix) and r.key.endswith(".ks-changelog")]
    assert puts[:2] == [("1.ks-changelog", "*", 500), ("1.ks-changelog", "*", 412)], puts
    assert (out["first"], out["second"], out["values"]) == (1, 2, [10, 20]), out


def test_hdfs_request_log_has_each_call_with_its_time(storage_session, storage_root, hdfs, candidate_provider):
    """The MiniDFSCluster's request log (what benchmarks/storage.py counts on hdfs://) holds a
    file's create, rename and open by the Hadoop client, with their paths, and the RPCs of its
    write (addBlock, complete, fsync from hsync), each timed inside the client's window; nothing
    of them before it."""
    if candidate_provider != KS:
        pytest.skip("counts the Hadoop client's requests, the same for every provider")
    directory = f"{storage_root('hdfs', 'requests')}/request-log"
    out = storage_session.tool("write_and_rename", directory=directory)
    assert out["first_byte"] == ord("r"), out
    temp, final = out["temp"].lstrip("/"), out["final"].lstrip("/")
    lo, hi = out["start"] - 0.001, out["end"] + 0.001  # the log's times have ms resolution
    time.sleep(0.2)  # the NameNode answers, then logs: the last line lands just after the client returns
    mine = [r for r in hdfs.requests.since(0) if r.source == "audit" and r.op in ("create", "rename", "open")
            and r.key in (temp, final)]
    assert [(r.op, r.key, r.dst, r.ok) for r in mine] == [
        ("create", temp, "", True), ("rename", temp, final, True), ("open", final, "", True)], mine
    assert all(lo <= r.time < hi for r in mine), (lo, hi, mine)
    rpcs = collections.Counter(r.op for r in hdfs.requests.since(lo, hi) if r.source == "rpc")
    for method in ("create", "addBlock", "fsync", "complete", "rename", "getBlockLocations"):
        assert rpcs[method] >= 1, (method, rpcs)


def test_changelog_sync_off_commits_without_the_namenode_fsync(storage_session, storage_root, hdfs,
                                                               candidate_provider):
    """changelogSync=false (the default) closes the changelog as Spark's providers do: a commit
    and its changelog's open ask the NameNode no fsync, where changelogSync=true asks one; both
    versions load."""
    if candidate_provider != KS:
        pytest.skip("a keyedstate conf")
    fsyncs = {}
    for sync in ("true", "false"):
        checkpoint = f"{storage_root('hdfs', 'requests')}/sync-{sync}"
        out = storage_session.tool("commit_one", checkpoint=checkpoint,
                                   confs={"spark.sql.streaming.stateStore.keyedstate.changelogSync": sync})
        assert out["committed"] == 1 and out["value"] == 10, out
        time.sleep(0.2)  # the NameNode answers, then logs
        fsyncs[sync] = sum(1 for r in hdfs.requests.since(out["handed_out"] - 0.001, out["commit_end"] + 0.001)
                           if r.source == "rpc" and r.op == "fsync")
    assert fsyncs["true"] >= 1 and fsyncs["false"] == 0, fsyncs
