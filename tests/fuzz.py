"""Fuzzer of keyedstate's readers of untrusted files, in both languages.

Mutations of the golden files (tests/golden) and of two Spark metadata files -- bit flips,
truncations, length and count fields set to huge values, zstd frame headers claiming huge
content sizes, changed JSON values, and the same inside a changelog's compressed body (its CRCs
fixed, so that the records are read) -- are fed to every reader. Each input must be read as a
valid file or refused with an error naming the file; never a crash, a hang, an Error, or more
than 64 MiB allocated above baseline. Python's readers run here under tracemalloc; the JVM's in a
child JVM with a 128 MiB heap (io.keyedstate.testing.ReaderFuzz), where an over-allocation shows
as an OutOfMemoryError.

    python3 -m tests.fuzz --count 100000            # from the repository root
    python3 -m tests.fuzz --count 500 --seconds 20 --readers manifest --no-jvm

tests/formats/test_fuzz.py runs it in CI for a bounded time.
"""
from __future__ import annotations

import argparse
import json
import random
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from keyedstate.formats import changelog, manifest  # noqa: E402
from keyedstate import checkpoint  # noqa: E402

GOLDEN = TESTS / "golden"
MEMORY_LIMIT = 64 << 20  # above baseline, per input
JVM_HEAP = "128m"
HANG_SECONDS = 10  # per input
JVM_START_SECONDS = 180
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
MAX_BYTES = changelog.MAX_BYTES

OFFSETS = (b'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":'
           b'{"spark.sql.shuffle.partitions":"2"}}\n{"logOffset":3}')
OPERATOR_METADATA = (b'v1\n{"operatorInfo":{"operatorId":0,"operatorName":"stateStoreSave"},'
                     b'"stateStoreInfo":[{"storeName":"default","numColsPrefixKey":0,"numPartitions":2}]}')


@dataclass
class Reader:
    name: str
    seeds: list[bytes]
    jvm: int | None  # ReaderFuzz's reader number
    python: Callable[[bytes, str], object] | None  # reads data under a name (a path for files it writes)
    json: bool = False
    path: str | None = None  # the file's path relative to a work directory, for readers that read a file


def _read_changelog(data: bytes, source: str) -> None:
    for _ in changelog.decode(data, source).records():
        pass


def _read_operator_metadata(data: bytes, path: str) -> None:
    Path(path).write_bytes(data)
    checkpoint.operator_metadata(Path(path).parent.parent)


def readers() -> dict[str, Reader]:
    def golden(*names: str) -> list[bytes]:
        return [(GOLDEN / n).read_bytes() for n in names]

    found = [Reader(f"changelog-{codec}", golden(f"changelog-{codec}.bin"), 0, _read_changelog)
             for codec in ("v1", "v2-none", "v2-zstd", "v2-zstd-split")]
    found.append(Reader("manifest", golden("manifest-v1.json", "manifest-v1-replay.json"), 1,
                        lambda d, s: manifest.decode(d, s), json=True))
    found.append(Reader("spark-offsets", [OFFSETS], 2, None, json=True, path="query/offsets/0"))
    found.append(Reader("spark-operator-metadata", [OPERATOR_METADATA], 3, _read_operator_metadata, json=True,
                        path="query/state/0/_metadata/metadata"))
    return {r.name: r for r in found}


# ------------------------------------------------------------------ mutations

HUGE_U32 = (0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0x7FFFFFBF, 0x04000001, 0xFFFFFFFE)
HUGE_U64 = (0xFFFFFFFFFFFFFFFF, 0x7FFFFFFFFFFFFFFF, MAX_BYTES, 1 << 40, 0x80000000)


def _claims(rng: random.Random) -> int:
    """A content size for a zstd header: above the heap, up to and past the 2 GiB limit."""
    return rng.choice((MAX_BYTES, MAX_BYTES - 1, (1 << 31) - 65, 100 << 20, 65 << 20,
                       rng.randrange(64 << 20, MAX_BYTES), MAX_BYTES + 1, (1 << 32) + 5))


def _zstd_frame_header(data: bytes, at: int) -> tuple[int, int, int] | None:
    """(where the content-size field is, its width, where the header ends) of the frame at ``at``."""
    if at + 5 > len(data):
        return None
    fhd = data[at + 4]
    fcs_flag, single, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    pos = at + 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    return (pos, width, pos + width) if pos + width <= len(data) else None


def zstd_huge_claim(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A zstd frame of ``data`` rewritten to claim a huge content size (its blocks unchanged), with
    codec 2's key-group length moved along when the header grows."""
    frames = [i for i in range(len(data)) if data.startswith(ZSTD_MAGIC, i)]
    if not frames:
        return bit_flips(data, rng)
    at = rng.choice(frames)
    header = _zstd_frame_header(data, at)
    if header is None:
        return bit_flips(data, rng)
    pos, width, end = header
    claim = _claims(rng)
    window = rng.choice((None, 0x00, 0x58))  # single segment (window = claim), or a small/large window
    fhd = data[at + 4] & 0b00000111 | (0b11 << 6 if claim >= 1 << 32 or rng.random() < 0.5 else 0b10 << 6)
    if window is None:
        fhd |= 1 << 5
    new_width = 8 if fhd >> 6 == 3 else 4
    dict_id = data[at + 5 + (0 if data[at + 4] >> 5 & 1 else 1):pos]
    new_header = (ZSTD_MAGIC + bytes([fhd]) + (b"" if window is None else bytes([window])) + dict_id
                  + (claim & ((1 << 8 * new_width) - 1)).to_bytes(new_width, "little"))
    out = bytearray(data[:at] + new_header + data[end:])
    grew = len(new_header) - (end - at)
    if data.startswith(changelog.MAGIC_V2) and data[10] == changelog.CODEC_ZSTD_SPLIT and frames.index(at) == 0:
        body = _v2_body_start(data)
        if body is not None and body + 4 <= at:
            length = struct.unpack_from(">I", data, body)[0]
            struct.pack_into(">I", out, body, (length + grew) & 0xFFFFFFFF)
    return bytes(out), f"zstd frame at {at} claims {claim} bytes"


def _v2_body_start(data: bytes) -> int | None:
    if len(data) < 15:
        return None
    meta_length = struct.unpack_from(">I", data, 11)[0]
    return 15 + meta_length + 4 if 15 + meta_length + 4 <= len(data) else None


def bit_flips(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    out = bytearray(data)
    if not out:
        return bytes([rng.randrange(256)]), "one random byte"
    flips = [rng.randrange(len(out) * 8) for _ in range(rng.choice((1, 1, 2, 3, 8)))]
    for bit in flips:
        out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out), f"bits {flips} flipped"


def truncation(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    n = rng.randrange(len(data)) if data else 0
    return data[:n], f"truncated to {n} bytes"


def overwrite(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    out = bytearray(data)
    if not out:
        return bytes(rng.randrange(256) for _ in range(8)), "8 random bytes"
    at, n = rng.randrange(len(out)), rng.randrange(1, 9)
    out[at:at + n] = bytes(rng.randrange(256) for _ in range(n))
    return bytes(out), f"{n} random bytes at {at}"


def insert_or_delete(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    at, n = rng.randrange(len(data) + 1), rng.randrange(1, 17)
    if rng.random() < 0.5:
        return data[:at] + bytes(rng.randrange(256) for _ in range(n)) + data[at:], f"{n} bytes inserted at {at}"
    return data[:at] + data[at + n:], f"{n} bytes deleted at {at}"


def huge_field(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A u32 or u64 (a length, count or version, at a known place or anywhere) set to a huge value."""
    places = _field_offsets(data)
    at = rng.choice(places) if places and rng.random() < 0.7 else rng.randrange(max(1, len(data) - 3))
    width = rng.choice((4, 4, 8))
    value = rng.choice(HUGE_U32 if width == 4 else HUGE_U64)
    out = bytearray(data)
    if at + width > len(out):
        width, value = 4, rng.choice(HUGE_U32)
    if at + width > len(out):
        return truncation(data, rng)
    out[at:at + width] = value.to_bytes(width, "big")
    return bytes(out), f"u{width * 8} at {at} set to {value:#x}"


def _field_offsets(data: bytes) -> list[int]:
    """Where a changelog keeps its lengths and counts."""
    if data.startswith(changelog.MAGIC_V2):
        places = [11]
        body = _v2_body_start(data)
        if body is not None and len(data) > 10 and data[10] == changelog.CODEC_ZSTD_SPLIT:
            places.append(body)
        return places
    if data.startswith(changelog.MAGIC):
        return [18, 23, max(0, len(data) - 12), max(0, len(data) - 8)]
    return []


def splice(data: bytes, rng: random.Random, other: bytes) -> tuple[bytes, str]:
    a, b = rng.randrange(len(data) + 1), rng.randrange(len(other) + 1)
    return data[:a] + other[b:], f"spliced at {a} with another seed from {b}"


def json_value(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One value of a JSON file (after its version line, if any) replaced, or a list entry doubled."""
    head, sep, body = data.partition(b"\n") if data.startswith(b"v1\n") else (b"", b"", data)
    lines = body.split(b"\n")
    which = rng.randrange(len(lines))
    try:
        tree = json.loads(lines[which])
    except ValueError:
        return bit_flips(data, rng)
    nodes: list[tuple[object, object]] = []

    def walk(node: object) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in list(items):
            nodes.append((node, key))
            walk(child)

    walk(tree)
    if not nodes:
        return bit_flips(data, rng)
    parent, key = rng.choice(nodes)
    old = parent[key]
    if isinstance(parent, list) and rng.random() < 0.3:
        parent.insert(key, old)  # a duplicate entry, e.g. a snapshot file listed twice
        what = f"entry {key} doubled"
    else:
        new = rng.choice((-1, 0, 1 << 31, 1 << 63, 1 << 64, 10 ** 30, 1.5, "", None, True, [], {}, "x" * 300,
                          "../../etc/passwd", "/abs", "a/b", "ks-files/../x", [[[[]]]], {"a": {"b": {}}}))
        parent[key] = new
        what = f"{key!r} set to {new!r:.40}"
    lines[which] = json.dumps(tree, separators=(",", ":")).encode()
    return head + sep + b"\n".join(lines), f"JSON {what}"


def inner_changelog(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A changelog whose format-1 records are mutated and its CRCs fixed, recompressed with its
    own codec: reaches the record reader behind the checksums."""
    try:
        log = changelog.decode(data, "seed")
    except changelog.CorruptChangelogError:
        return bit_flips(data, rng)
    inner = _inner_of(data)
    mutate = rng.choice((bit_flips, overwrite, huge_field, insert_or_delete, truncation))
    mutated, what = mutate(inner[:-changelog.TRAILER.size], rng)
    count = log.record_count if rng.random() < 0.8 else rng.choice((0, log.record_count + 1, (1 << 63) - 1))
    count &= (1 << 64) - 1
    inner_file = mutated + struct.pack(">BQ", changelog.END, count)
    inner_file += struct.pack(">I", zlib.crc32(mutated))
    if not data.startswith(changelog.MAGIC_V2):
        return inner_file, f"records: {what}, CRC fixed"
    codec = data[10]
    if codec == changelog.CODEC_ZSTD_SPLIT:
        try:
            meta = json.loads(data[15:15 + struct.unpack_from(">I", data, 11)[0]])
            rest = {k: v for k, v in meta.items() if k not in ("version", "keyGroups")}
            return changelog.compress(inner_file, rest, codec), f"records (codec 2): {what}, CRCs fixed"
        except Exception:  # noqa: BLE001 -- codec 2 splits by record: what it cannot split goes out as codec 1
            codec = changelog.CODEC_ZSTD
    import zstandard

    head = bytearray(data[:15 + struct.unpack_from(">I", data, 11)[0]])
    head[10] = codec
    body = inner_file if codec == changelog.CODEC_NONE else zstandard.ZstdCompressor(level=1).compress(inner_file)
    return bytes(head) + struct.pack(">I", zlib.crc32(head)) + body, f"records (codec {codec}): {what}, CRCs fixed"


def _inner_of(data: bytes) -> bytes:
    if not data.startswith(changelog.MAGIC_V2):
        return data
    body = data[_v2_body_start(data):]
    codec = data[10]
    if codec == changelog.CODEC_NONE:
        return body
    if codec == changelog.CODEC_ZSTD:
        return bytes(changelog._zstd_decompress(memoryview(body), "seed"))
    length = struct.unpack_from(">I", body, 0)[0]
    groups = changelog._zstd_decompress(memoryview(body[4:4 + length]), "seed")
    rest = changelog._zstd_decompress(memoryview(body[4 + length:]), "seed")
    return bytes(changelog._join_key_groups(bytes(groups), bytes(rest), "seed"))


def fix_header_crc(data: bytes) -> bytes:
    """A format-2 changelog's header CRC recomputed, so that a mutation behind it is read."""
    if not data.startswith(changelog.MAGIC_V2) or len(data) < 15:
        return data
    end = 15 + struct.unpack_from(">I", data, 11)[0]
    if end + 4 > len(data):
        return data
    return data[:end] + struct.pack(">I", zlib.crc32(data[:end])) + data[end + 4:]


def mutate(reader: Reader, rng: random.Random) -> tuple[bytes, str]:
    seed = rng.choice(reader.seeds)
    if reader.json:
        choices = [bit_flips, truncation, overwrite, insert_or_delete, json_value, json_value, json_value]
    else:
        choices = [bit_flips, truncation, overwrite, insert_or_delete, huge_field, huge_field]
        if ZSTD_MAGIC in seed:
            choices += [zstd_huge_claim, zstd_huge_claim, zstd_huge_claim]
        choices += [inner_changelog, inner_changelog]
    pick = rng.choice(choices)
    if rng.random() < 0.05 and len(reader.seeds) > 1:
        data, what = splice(seed, rng, rng.choice(reader.seeds))
    else:
        data, what = pick(seed, rng)
    if not reader.json and rng.random() < 0.2:  # a second mutation
        data, more = rng.choice(choices)(data, rng)
        what += "; " + more
    if not reader.json and pick is not inner_changelog and rng.random() < 0.5:
        data = fix_header_crc(data)
        what += "; header CRC fixed"
    return data, what


# ------------------------------------------------------------------ running

@dataclass
class Outcome:
    reader: str
    language: str
    inputs: int = 0
    read: int = 0
    refused: int = 0
    seconds: float = 0.0
    peak: int = 0  # bytes above baseline, the largest of any input (Python only)
    failures: list[str] = field(default_factory=list)


class _Hang(Exception):
    pass


def _alarm(signum, frame):  # noqa: ARG001
    raise _Hang()


def inputs(reader: Reader, seed: int, count: int):
    """The same inputs for both languages: (i, data, what)."""
    rng = random.Random(f"{seed}/{reader.name}")
    for i in range(count):
        data, what = mutate(reader, rng)
        yield i, data, what


def _given(cases: list[tuple[bytes, str]]):
    return ((i, data, what) for i, (data, what) in enumerate(cases))


def run_python(reader: Reader, workdir: Path, count: int, seconds: float, seed: int,
               cases: list[tuple[bytes, str]] | None = None) -> Outcome:
    """``reader``'s Python side on ``count`` mutations (or on ``cases``: (data, what))."""
    outcome = Outcome(reader.name, "python")
    if reader.python is None:
        return outcome
    start = time.monotonic()
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for i, data, what in _given(cases) if cases is not None else inputs(reader, seed, count):
            if time.monotonic() - start > seconds:
                break
            source = str(workdir / reader.path) if reader.path else f"fuzz/{reader.name}/{i}.input"
            if reader.path:
                Path(source).parent.mkdir(parents=True, exist_ok=True)
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            signal.setitimer(signal.ITIMER_REAL, HANG_SECONDS)
            problem = None
            try:
                reader.python(data, source)
                outcome.read += 1
            except _Hang:
                problem = f"hung for {HANG_SECONDS} s"
            except Exception as exc:  # noqa: BLE001 -- judged by its message
                if source in str(exc) and not isinstance(exc, (MemoryError, RecursionError)):
                    outcome.refused += 1
                else:
                    problem = f"{type(exc).__name__} not naming the file: {exc}"
            except BaseException as exc:  # noqa: BLE001
                if isinstance(exc, KeyboardInterrupt):
                    raise
                problem = f"{type(exc).__name__}: {exc}"
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            peak = tracemalloc.get_traced_memory()[1] - base
            outcome.peak = max(outcome.peak, peak)
            if peak > MEMORY_LIMIT and problem is None:
                problem = f"allocated {peak >> 20} MiB above baseline"
            outcome.inputs += 1
            if problem:
                outcome.failures.append(_failure(workdir, reader, "python", i, data, what, problem))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if not tracing:
            tracemalloc.stop()
    outcome.seconds = time.monotonic() - start
    return outcome


def _failure(workdir: Path, reader: Reader, language: str, i: int, data: bytes, what: str, problem: str) -> str:
    saved = workdir / "failures" / f"{reader.name}-{language}-{i}.bin"
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_bytes(data)
    return f"{reader.name} input {i} ({what}; saved as {saved}): {problem}"


def jvm_command() -> list[str]:
    from support.testjar import jvm_main_command

    return jvm_main_command("io.keyedstate.testing.ReaderFuzz", f"-Xmx{JVM_HEAP}", "-XX:+UseSerialGC",
                            "-XX:TieredStopAtLevel=1", "-Xshare:auto")


def run_jvm(chosen: list[Reader], workdir: Path, count: int, seconds: float, seed: int,
            cases: dict[str, list[tuple[bytes, str]]] | None = None) -> list[Outcome]:
    """Every reader's inputs (``count`` mutations, or its ``cases``) through one child JVM (a new
    one after it dies)."""
    outcomes = []
    child = None
    try:
        for reader in chosen:
            if reader.jvm is None:
                continue
            outcome = Outcome(reader.name, "jvm")
            outcomes.append(outcome)
            child = child or _Child()
            start = time.monotonic()
            pending = _given(cases[reader.name]) if cases is not None else inputs(reader, seed, count)
            while True:
                child = child or _Child()
                if child.feed(reader, pending, workdir, outcome, start + seconds):
                    break
                child = None
            outcome.seconds = time.monotonic() - start
    finally:
        if child:
            child.close()
    return outcomes


class _Child:
    """A ReaderFuzz JVM."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(jvm_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE)
        self.stderr: list[bytes] = []
        threading.Thread(target=lambda: self.stderr.append(self.process.stderr.read()), daemon=True).start()
        ready = _readline(self.process, JVM_START_SECONDS)
        if ready != "READY":
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"the fuzzing JVM did not start ({ready!r}): {b''.join(self.stderr).decode(errors='replace')}")

    def feed(self, reader: Reader, pending, workdir: Path, outcome: Outcome, deadline: float) -> bool:
        """Runs inputs until they end or the time is up (True), or the JVM dies or hangs (False)."""
        child = self.process
        for i, data, what in pending:
            if time.monotonic() > deadline:
                return True
            source = str(workdir / reader.path) if reader.path else f"fuzz/{reader.name}/{i}.input"
            if reader.path:
                Path(source).parent.mkdir(parents=True, exist_ok=True)
            name = source.encode()
            line = None
            try:
                child.stdin.write(bytes([reader.jvm]) + struct.pack(">I", len(name)) + name
                                  + struct.pack(">I", len(data)) + data)
                child.stdin.flush()
                line = _readline(child, HANG_SECONDS)
            except BrokenPipeError:
                pass
            outcome.inputs += 1
            if line is None:
                hung = child.poll() is None
                child.kill()
                child.wait()
                time.sleep(0.2)  # the stderr reader's last bytes
                problem = (f"hung for {HANG_SECONDS} s" if hung else
                           f"the JVM died ({child.returncode}): {b''.join(self.stderr).decode(errors='replace')[-500:]}")
                outcome.failures.append(_failure(workdir, reader, "jvm", i, data, what, problem))
                return False
            status, _, rest = line.partition("\t")
            if status == "OK":
                outcome.read += 1
            elif status == "ERR" and source in rest:
                outcome.refused += 1
            else:
                outcome.failures.append(_failure(workdir, reader, "jvm", i, data, what, f"{status} {rest}"))
                if status == "FATAL":
                    child.wait()
                    return False
        return True

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _readline(child: subprocess.Popen, timeout: float) -> str | None:
    import select

    ready, _, _ = select.select([child.stdout], [], [], timeout)
    if not ready:
        return None
    line = child.stdout.readline()
    return line.decode("utf-8", errors="replace").rstrip("\n") if line else None


def run(count: int, seconds: float, seed: int, names: list[str] | None = None, python: bool = True,
        jvm: bool = True, workdir: Path | None = None) -> list[Outcome]:
    """Fuzzes the readers named (all by default), each for at most ``count`` inputs and
    ``seconds`` per language."""
    chosen = [r for n, r in readers().items() if names is None or n in names]
    with tempfile.TemporaryDirectory(prefix="keyedstate-fuzz-") as tmp:
        work = workdir or Path(tmp)
        outcomes = [run_python(r, work / "py", count, seconds, seed) for r in chosen if python and r.python]
        if jvm:
            outcomes += run_jvm(chosen, work / "jvm", count, seconds, seed)
    return outcomes


def report(outcomes: list[Outcome]) -> str:
    lines = [f"{'reader':26} {'lang':6} {'inputs':>8} {'read':>7} {'refused':>8} {'seconds':>8} {'peak MiB':>8} failures"]
    for o in outcomes:
        lines.append(f"{o.reader:26} {o.language:6} {o.inputs:8} {o.read:7} {o.refused:8} {o.seconds:8.1f} "
                     f"{(o.peak / (1 << 20)) if o.language == 'python' else float('nan'):8.2f} {len(o.failures)}")
        lines.extend(f"    {f}" for f in o.failures[:20])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000, help="inputs per reader and language")
    parser.add_argument("--seconds", type=float, default=3600, help="at most this long per reader and language")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--readers", help=f"comma-separated, of: {', '.join(readers())}")
    parser.add_argument("--no-python", action="store_true")
    parser.add_argument("--no-jvm", action="store_true")
    parser.add_argument("--keep", type=Path, help="work directory to keep (failing inputs go to failures/)")
    args = parser.parse_args(argv)
    names = args.readers.split(",") if args.readers else None
    print(f"seed {args.seed}", flush=True)
    outcomes = []
    for name in names or readers():  # reader by reader, each reported as it ends
        outcomes += run(args.count, args.seconds, args.seed, [name], not args.no_python, not args.no_jvm, args.keep)
        print(report(outcomes), flush=True)
    return 1 if any(o.failures for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
