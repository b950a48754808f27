"""Every reader of an untrusted file, in Python and in the JVM, on mutations of the golden files
(tests/fuzz.py): each input is read as a valid file or refused naming the file, never with a
crash, a hang, or more than 64 MiB allocated. CI runs each reader for a few seconds per language;
``python3 -m tests.fuzz --count 100000`` runs them for longer."""
from __future__ import annotations

import json
import random
import struct
import zlib

import pytest

import fuzz
from keyedstate.formats import changelog

SECONDS = 2.5  # per reader and language: 7 readers in the JVM, 6 in Python, within 60 s in all
SEED = 46


def _failures(outcomes: list[fuzz.Outcome]) -> str:
    return fuzz.report(outcomes) if any(o.failures for o in outcomes) else ""


def test_python_readers_read_or_refuse_every_mutation(tmp_path):
    chosen = fuzz.readers().values()
    outcomes = [fuzz.run_python(r, tmp_path, 100_000, SECONDS, SEED) for r in chosen if r.python]
    assert not _failures(outcomes), _failures(outcomes)
    assert all(o.inputs >= 50 and o.refused > 0 for o in outcomes), fuzz.report(outcomes)


def test_jvm_readers_read_or_refuse_every_mutation(tmp_path):
    outcomes = fuzz.run_jvm(list(fuzz.readers().values()), tmp_path, 100_000, SECONDS, SEED)
    assert not _failures(outcomes), _failures(outcomes)
    assert len(outcomes) == 7 and all(o.inputs >= 50 and o.refused > 0 for o in outcomes), fuzz.report(outcomes)


def _huge_claims(reader: fuzz.Reader) -> list[tuple[bytes, str]]:
    """Every zstd frame of the reader's golden file claiming 64 MiB to 2 GiB, with and without a
    window of its own, the header CRC fixed or not."""
    rng = random.Random(SEED)
    cases = []
    for _ in range(40):
        data, what = fuzz.zstd_huge_claim(reader.seeds[0], rng)
        if rng.random() < 0.5:
            data, what = fuzz.fix_header_crc(data), what + "; header CRC fixed"
        cases.append((data, what))
    return cases


ZSTD_READERS = ("changelog-v2-zstd", "changelog-v2-zstd-split")


@pytest.mark.parametrize("language", ["python", "jvm"])
def test_a_zstd_header_claiming_up_to_2_gib_is_refused_without_allocating_it(tmp_path, language):
    """A ~100-byte tampered changelog made the JVM allocate what its zstd header claimed: an
    OutOfMemoryError (here in a 128 MiB heap), in local mode the application's death."""
    readers = {n: r for n, r in fuzz.readers().items() if n in ZSTD_READERS}
    cases = {n: _huge_claims(r) for n, r in readers.items()}
    if language == "python":
        outcomes = [fuzz.run_python(r, tmp_path, 0, 600, SEED, cases[n]) for n, r in readers.items()]
    else:
        outcomes = fuzz.run_jvm(list(readers.values()), tmp_path, 0, 600, SEED, cases)
    assert not _failures(outcomes), _failures(outcomes)
    assert [o.refused for o in outcomes] == [40, 40], fuzz.report(outcomes)


@pytest.mark.parametrize("language", ["python", "jvm"])
def test_a_truncated_or_corrupt_compressed_changelog_is_refused_naming_it(tmp_path, language):
    """The JVM raised zstd's own exception for these, without the file's name."""
    readers = {n: r for n, r in fuzz.readers().items() if n in ZSTD_READERS}
    cases = {}
    for name, reader in readers.items():
        seed = reader.seeds[0]
        body = fuzz._v2_body_start(seed)
        cases[name] = [(seed[:n], f"truncated to {n} bytes") for n in range(body, len(seed))]
        rng = random.Random(SEED)
        for _ in range(100):  # the body's bytes changed behind a valid header
            data, what = fuzz.overwrite(seed[body:], rng)
            cases[name].append((seed[:body] + data, what))
    if language == "python":
        outcomes = [fuzz.run_python(r, tmp_path, 0, 600, SEED, cases[n]) for n, r in readers.items()]
    else:
        outcomes = fuzz.run_jvm(list(readers.values()), tmp_path, 0, 600, SEED, cases)
    assert not _failures(outcomes), _failures(outcomes)
    assert all(o.refused > len(changelog.MAGIC) for o in outcomes), fuzz.report(outcomes)


def _metadata_cases() -> dict[str, tuple[list[tuple[bytes, str]], int]]:
    """Per reader: the golden file as is, then the metadata both languages read differently
    before (FORMATS.md, "Text and metadata"): invalid UTF-8 (the JVM replaced it, Python refused)
    and a null or malformed ``keyLayout`` (the JVM took null as absent and checked no column
    counts; Python's changelog reader checked nothing). Returns (cases, how many are valid)."""
    inner = fuzz.GOLDEN.joinpath("changelog-v1.bin").read_bytes()
    good_changelog = fuzz.GOLDEN.joinpath("changelog-v2-none.bin").read_bytes()

    def changelog_with(meta: dict, raw: tuple[bytes, bytes] | None = None) -> bytes:
        data = changelog.compress(inner, meta, changelog.CODEC_NONE)
        if raw is not None:  # same length, so only the header CRC needs fixing
            data = fuzz.fix_header_crc(data.replace(*raw, 1))
        return data

    def changelog_raw(meta_text: bytes) -> bytes:  # metadata bytes as given, framed and checksummed
        header = changelog.HEADER_V2.pack(changelog.MAGIC_V2, changelog.FORMAT_VERSION_V2, changelog.CODEC_NONE,
                                          len(meta_text)) + meta_text
        return header + struct.pack(">I", zlib.crc32(header)) + inner

    _, _, inner_version, inner_groups = changelog.HEADER.unpack_from(inner, 0)
    own_meta = json.dumps({"version": inner_version, "keyGroups": inner_groups}, separators=(",", ":")).encode()
    run = {changelog.RUN_ID: "run-AAAA"}
    manifest_node = json.loads(fuzz.GOLDEN.joinpath("manifest-v1.json").read_bytes())

    def manifest_with(**fields) -> bytes:
        return json.dumps({**manifest_node, **fields}, separators=(",", ":")).encode()

    good_manifest = fuzz.GOLDEN.joinpath("manifest-v1.json").read_bytes()
    records = [tuple(r) for r in changelog.decode(inner, "changelog-v1.bin").records()]
    padded = own_meta + b" " * (changelog.MAX_META_BYTES - len(own_meta))  # whitespace may follow the object
    return {
        "changelog-v1": ([
            (inner, "the golden file"),
            (changelog.encode(inner_version, (1 << 31) - 1, records), "keyGroups 2^31-1 in the header"),
            (changelog.encode(inner_version, 1 << 31, records), "keyGroups 2^31 in the header (u32, signed in Java)"),
            (changelog.encode(inner_version, (1 << 32) - 1, records), "keyGroups 2^32-1 in the header"),
            (changelog.encode((1 << 63) - 1, inner_groups, records), "version 2^63-1 in the header"),
            (changelog.encode(1 << 63, inner_groups, records), "version 2^63 in the header (u64, signed in Java)"),
        ], 3),
        "changelog-v2-none": ([
            (good_changelog, "the golden file"),
            (changelog_raw(padded), "metadata of MAX_META_BYTES (16 MiB)"),
            (changelog_raw(padded + b" "), "metadata of MAX_META_BYTES + 1"),
            (changelog_with(run, (b"run-AAAA", b"run-A\xffAA")), "invalid UTF-8 in the metadata"),
            (changelog_with(run, (b"run-AAAA", b"run-\xc3\x28AA")), "an invalid UTF-8 sequence in the metadata"),
            (changelog_with({"keyLayout": None}), "keyLayout null"),
            (changelog_with({"keyLayout": 3}), "keyLayout a number"),
            (changelog_with({"keyLayout": {"keyColumns": 1, "partitionKeyColumns": 2, "prefixColumns": 0}}),
             "keyLayout hashing more columns than the key has"),
            (changelog_raw(own_meta + b" {}"), "data after the metadata object"),
            (changelog_raw(own_meta[:-1] + b',"x":NaN}'), "NaN in the metadata"),
            (changelog_with({"keyGroups": inner_groups + (1 << 32)}), "keyGroups beyond 2^31-1 (its low bits right)"),
            (changelog_with({changelog.RUN_ID: 5}), "runId a number"),
        ], 2),
        "manifest": ([
            (good_manifest, "the golden file"),
            (good_manifest.replace(b"itself", b"its\xffelf", 1), "invalid UTF-8 in a string"),
            (manifest_with(keyLayout=None), "keyLayout null"),
            (manifest_with(keyLayout={"keyColumns": 1, "partitionKeyColumns": 0, "prefixColumns": 2}),
             "keyLayout with more prefix columns than the key has"),
            (good_manifest + b" {}", "data after the manifest object"),
            (manifest_with(ttl={"x": float("nan")}), "NaN in ttl"),
            (manifest_with(keyGroups=manifest_node["keyGroups"] + (1 << 32)), "keyGroups beyond 2^31-1 (its low bits right)"),
            (manifest_with(keyGroups=1 << 31), "keyGroups 2^31"),
            (manifest_with(numKeys=1 << 63), "numKeys beyond 2^63-1"),
        ], 1),
        "spark-operator-metadata": ([
            (fuzz.OPERATOR_METADATA, "the seed"),
            (fuzz.OPERATOR_METADATA.replace(b"stateStoreSave", b"stateSt\xfereSave", 1), "invalid UTF-8"),
        ], 1),
    }


@pytest.mark.parametrize("language", ["python", "jvm"])
def test_both_languages_read_or_refuse_the_same_metadata(tmp_path, language):
    """Every case is read as valid, or refused naming the file, the same way in both languages."""
    cases = _metadata_cases()
    readers = {n: r for n, r in fuzz.readers().items() if n in cases}
    given = {n: c for n, (c, _) in cases.items()}
    if language == "python":
        outcomes = [fuzz.run_python(r, tmp_path, 0, 600, SEED, given[n]) for n, r in readers.items()]
    else:
        outcomes = fuzz.run_jvm(list(readers.values()), tmp_path, 0, 600, SEED, given)
    assert not _failures(outcomes), _failures(outcomes)
    assert {o.reader: (o.read, o.refused) for o in outcomes} == {
        n: (valid, len(c) - valid) for n, (c, valid) in cases.items()}, fuzz.report(outcomes)
