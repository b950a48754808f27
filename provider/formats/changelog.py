"""The changelog: one version's writes, as the JVM shim writes them to the checkpoint.

Spec: FORMATS.md, "Changelog"; the JVM twin is ``ChangelogFormat.scala``; golden files in
``tests/golden/``. The JVM writes ``<partition dir>/<version>.ks-changelog`` (that is the commit)
and ships the same bytes to the state server, which applies them to RocksDB; a load replays
changelogs on top of the nearest snapshot. Format 1 (all integers big-endian)::

    header   8s magic b"KSCHLOG1" | u16 format version | u64 version | u32 key groups
    record   u8 op | u32 key length | key | (puts only) u32 value length | value
    trailer  u8 0xFF | u64 record count | u32 CRC-32 of header and records

Format 2 is what the JVM writes to the checkpoint: a format-1 changelog wrapped in a small
header that names its compression and carries metadata, so that old checkpoints still load::

    header   8s magic b"KSCHLOG2" | u16 format version (2) | u8 codec | u32 meta length | meta
             | u32 CRC-32 of the header before it
    meta     UTF-8 JSON object: "version", "keyGroups" and optional "keyLayout", "uniqueId", "lineage",
             "fromEmpty", "runId"
    body     the format-1 changelog C: as is (codec 0); one zstd frame with its content size
             (codec 1); or, codec 2, split in two before compression: G = the first 4 bytes of
             every record's key (its key group) in record order, R = C with those 4 bytes cut
             out of every key (the key lengths unchanged), body = u32 |zstd(G)| | zstd(G) | zstd(R).
             Key groups are near random; apart from them the records compress well, so
             splitting them out makes files smaller than codec 1.

The state server receives format 1 (the JVM ships the uncompressed bytes); readers of files
accept both.

Ops carry what the writer knew of the key's existence before the record, so that an exact key
count costs no read when the JVM's near cache already knew (see ``OP_*``).

:func:`decode` reads the header once and checks framing and checksum. Two parsers read the
records, with the same checks (every length against the payload, the count against the trailer,
the file named in every error) and a test that holds them to the same verdicts:
:meth:`Changelog.entries` (and :meth:`Changelog.records` on it), for offline rebuilds and the
rescale's routing, and :meth:`Changelog.feed`, the state server's, which fills a write batch
without a Python object per record. A foreign or truncated file is never taken for an empty version.
"""
from __future__ import annotations

import json
import mmap
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, MutableMapping, NamedTuple

from .layout import MAX_CHANGELOG_BYTES, TooLargeError, json_of, open_file
from .layout import read_file as read_checkpoint_file
from .stored import KeyLayout
from .changelog_codecs import INSERT_CHUNK as _INSERT_CHUNK  # noqa: F401
from .changelog_codecs import ZSTD_UPFRONT_RATIO  # noqa: F401
from .changelog_codecs import join_key_groups as _join_key_groups
from .changelog_codecs import split_key_groups as _split_key_groups
from .changelog_codecs import zstd_decompress as _zstd_decompress
from .changelog_wire import (CODEC_NONE, CODEC_ZSTD, CODEC_ZSTD_SPLIT, DELETES, END, FORMAT_VERSION,  # noqa: F401
                             FORMAT_VERSION_V2, FROM_EMPTY, HEADER, HEADER_V2, MAGIC, MAGIC_V2, MAX_BYTES,
                             MAX_META_BYTES, OP_DELETE, OP_DELETE_EXISTING, OP_PUT, OP_PUT_EXISTING, OP_PUT_NEW,
                             PUTS, RUN_ID, TRAILER, ZSTD_LEVEL, CorruptChangelogError)
from .changelog_wire import U32 as _U32
from .changelog_wire import unpack_u32 as _unpack_u32
from .keygroups import count_key_groups as _count_key_groups


class Record(NamedTuple):
    op: int
    key: bytes
    value: bytes | None  # None for deletes


class Entry(NamedTuple):
    """A record and where its bytes are in the payload (``payload[start:end]``)."""

    op: int
    key: bytes
    value: bytes | None
    start: int
    end: int


class Fed(NamedTuple):
    """What :meth:`Changelog.feed` passed on: where it stopped and what the records' ops said."""

    end: int  # byte offset in the payload after the last record fed (Changelog.end: all were)
    records: int
    key_delta: int  # keys the writer knew it added, less those it knew it deleted
    deletes: int
    unknown_puts: list[bytes]  # keys put whose previous existence the writer did not know
    unknown_deletes: list[bytes]  # keys deleted whose previous existence the writer did not know


@dataclass(frozen=True)
class Changelog:
    """A changelog whose framing and checksum were checked: the version it produces and its records."""

    version: int
    key_groups: int
    record_count: int
    payload: bytes | mmap.mmap  # holds the records at payload[first:end]; a mapping's slices are bytes too (see decode)
    source: str  # names the file in errors
    meta: dict[str, Any] = field(default_factory=dict)  # format 2's metadata (empty for format 1)
    first: int = 0  # offset of the first record in payload
    end: int = -1  # offset after the last record (-1: len(payload))

    def __post_init__(self) -> None:
        if self.end < 0:
            object.__setattr__(self, "end", len(self.payload))

    @property
    def size(self) -> int:
        """The records' bytes."""
        return self.end - self.first

    def discard_before(self, pos: int) -> None:
        """Give the memory of the records before offset ``pos`` back to the system, when they are
        read in place from a shipped frame's anonymous mapping (see :func:`decode`): a state server
        then holds only what it has not applied yet of a large changelog, not all of it until
        its last record is written. Those records read as zeros
        afterwards, so nothing may read them again; a payload of bytes is left as it is."""
        if isinstance(self.payload, mmap.mmap):
            cut = min(pos, self.end) // mmap.PAGESIZE * mmap.PAGESIZE
            if cut > 0:
                self.payload.madvise(mmap.MADV_DONTNEED, 0, cut)

    def _overrun(self, record: int, pos: int) -> CorruptChangelogError:
        """The error of record number ``record``, at payload offset ``pos``, running past the end
        (offsets in messages count from the first record, wherever the payload holds it)."""
        return CorruptChangelogError(
            f"{self.source}: record {record} at byte {pos - self.first} overruns the file")

    def _unknown_op(self, op: int, pos: int) -> CorruptChangelogError:
        return CorruptChangelogError(f"{self.source}: unknown record op {op} at byte {pos - self.first}")

    def records(self) -> Iterator[Record]:
        """Every record, in order (see :meth:`entries`)."""
        for op, key, value, _, _ in self.entries():
            yield Record(op, key, value)

    def entries(self) -> Iterator[Entry]:
        """Every record with its place in the payload, in order (the offline tools' parser;
        :meth:`feed` is the state server's, with the same checks). It
        fails naming the file on any length, op or count that does not fit the payload (a CRC
        only proves the bytes are the writer's, not that they parse)."""
        buf, source = self.payload, self.source
        pos, end, count = self.first, self.end, 0
        puts, deletes, unpack = PUTS, DELETES, _unpack_u32
        try:
            while pos < end:
                op = buf[pos]
                key_start = pos + 5
                key_end = key_start + unpack(buf, pos + 1)[0]
                if op in puts:
                    value_start = key_end + 4
                    record_end = value_start + unpack(buf, key_end)[0]
                    if record_end > end:
                        raise self._overrun(count, pos)
                    yield Entry(op, buf[key_start:key_end], buf[value_start:record_end], pos, record_end)
                elif op in deletes:
                    if key_end > end:
                        raise self._overrun(count, pos)
                    yield Entry(op, buf[key_start:key_end], None, pos, key_end)
                    record_end = key_end
                else:
                    raise self._unknown_op(op, pos)
                pos = record_end
                count += 1
        except struct.error:
            raise self._overrun(count, pos) from None
        if count != self.record_count:
            raise CorruptChangelogError(
                f"{source} holds {count} records but its trailer says {self.record_count}: corrupt")

    def feed(self, put: Callable[[bytes, bytes], object], delete: Callable[[bytes], object],
             start: int | None = None, records_before: int = 0, max_records: int | None = None,
             unknown_keys: bool = True, counts: MutableMapping[int, int] | None = None) -> Fed:
        """Call ``put(key, value)`` or ``delete(key)`` for each record from byte ``start`` of the
        payload on (None: the first record), at most ``max_records`` of them (None: to the end);
        ``records_before`` is how many records precede ``start``. This is the state server's
        parser: it makes no generator or tuple per record, so a write batch is filled at about half the cost per record of
        :meth:`entries` (measured: 1.1-1.4 against 2.2-2.6 us). It checks what :meth:`entries`
        checks, and the trailer's count when it reaches the end. A record that does not parse
        raises before anything of it is passed on. ``unknown_keys=False``: the keys whose
        existence the writer did not know are not collected (a replay that counts nothing).
        The callbacks must not raise ``struct.error`` (it reads as a record that overruns the
        payload). ``counts``: keys by key group (a Counter), changed by the records whose op says
        the key is new or was there; the caller adds the unknown keys' (FORMATS.md, "Key-group
        counts")."""
        if max_records is not None and max_records < 1:
            raise ValueError(f"max_records must be at least 1, not {max_records}")
        buf, source = self.payload, self.source
        pos, end = (self.first if start is None else start), self.end
        cap = end if max_records is None else max_records  # a record takes at least 5 bytes
        unpack = _unpack_u32
        n = delta = deletes = 0
        unknown_puts: list[bytes] = []
        unknown_deletes: list[bytes] = []
        # Keys the ops say are new or were there, counted by key group at the end (or when many
        # wait) in one C-level pass: cheaper than a Counter update per record.
        added: list[bytes] = []
        removed: list[bytes] = []
        try:
            while pos < end and n < cap:
                op = buf[pos]
                key_end = pos + 5 + unpack(buf, pos + 1)[0]
                if op == OP_PUT_EXISTING or op == OP_PUT_NEW or op == OP_PUT:
                    value_start = key_end + 4
                    record_end = value_start + unpack(buf, key_end)[0]
                    if record_end > end:
                        raise self._overrun(records_before + n, pos)
                    key = buf[pos + 5:key_end]
                    put(key, buf[value_start:record_end])
                    if op == OP_PUT_NEW:
                        delta += 1
                        if counts is not None:
                            added.append(key)
                            if len(added) >= _COUNT_BATCH:
                                _count_key_groups(counts, added, 1)
                                added.clear()
                    elif op == OP_PUT and unknown_keys:
                        unknown_puts.append(key)
                elif op == OP_DELETE_EXISTING or op == OP_DELETE:
                    if key_end > end:
                        raise self._overrun(records_before + n, pos)
                    key = buf[pos + 5:key_end]
                    delete(key)
                    deletes += 1
                    if op == OP_DELETE_EXISTING:
                        delta -= 1
                        if counts is not None:
                            removed.append(key)
                            if len(removed) >= _COUNT_BATCH:
                                _count_key_groups(counts, removed, -1)
                                removed.clear()
                    elif unknown_keys:
                        unknown_deletes.append(key)
                    record_end = key_end
                else:
                    raise self._unknown_op(op, pos)
                pos = record_end
                n += 1
        except struct.error:
            raise self._overrun(records_before + n, pos) from None
        if pos >= end and records_before + n != self.record_count:
            raise CorruptChangelogError(
                f"{source} holds {records_before + n} records but its trailer says {self.record_count}: corrupt")
        if counts is not None:
            _count_key_groups(counts, added, 1)
            _count_key_groups(counts, removed, -1)
        return Fed(pos, n, delta, deletes, unknown_puts, unknown_deletes)


_COUNT_BATCH = 1 << 16
"""Keys :meth:`Changelog.feed` holds before it adds them to ``counts``: bounds the list, not the work."""


def decode(data: bytes | bytearray | memoryview | mmap.mmap, source: str, offset: int = 0) -> Changelog:
    """Check the framing and checksum of the changelog of either format at ``data[offset:]``;
    ``source`` names it in errors. The records are copied out, except from an anonymous mapping
    (the state server receives large frames into one, ``server/data.py``): a format-1 changelog
    there is read in place, since slicing a mapping makes bytes as slicing bytes does, so a
    large changelog is held once, not once in its frame and once in its copy."""
    view = memoryview(data)[offset:]
    if bytes(view[:8]) == MAGIC_V2:
        return _decode_v2(view, source)
    in_place = (data, offset) if isinstance(data, mmap.mmap) else None
    return _decode_v1(view, source, in_place=in_place)


def _decode_v1(view: memoryview, source: str, meta: dict[str, Any] | None = None,
               in_place: tuple[mmap.mmap, int] | None = None) -> Changelog:
    if len(view) < HEADER.size or bytes(view[:8]) != MAGIC:
        raise CorruptChangelogError(
            f"{source} is not a keyedstate changelog (bad magic; written by another state "
            f"store provider, or corrupt)")
    _, fmt, version, key_groups = HEADER.unpack_from(view, 0)
    if fmt != FORMAT_VERSION:
        raise CorruptChangelogError(
            f"{source} has changelog format version {fmt}; this keyedstate reads formats 1 and 2")
    if len(view) < HEADER.size + TRAILER.size:
        raise CorruptChangelogError(f"{source} is truncated ({len(view)} bytes)")
    end, count, crc = TRAILER.unpack_from(view, len(view) - TRAILER.size)
    body = view[:len(view) - TRAILER.size]
    if end != END or zlib.crc32(body) != crc:
        raise CorruptChangelogError(
            f"{source} is truncated or corrupt (trailer or CRC-32 mismatch, {len(view)} bytes)")
    if key_groups > 0x7FFFFFFF:  # a u32 field holding 0..2^31-1 (FORMATS.md; the JVM's readV1 refuses the same)
        raise CorruptChangelogError(f"{source} is corrupt ({key_groups} key groups in its header, at most 2147483647)")
    if version > (1 << 63) - 1 or count > (1 << 63) - 1:  # u64 fields holding 0..2^63-1 (the JVM's Long)
        raise CorruptChangelogError(f"{source} is corrupt (version {version}, {count} records: each at most "
                                    "9223372036854775807)")
    if in_place is not None:
        mapping, offset = in_place
        return Changelog(version, key_groups, count, mapping, source, meta or {},
                         first=offset + HEADER.size, end=offset + len(body))
    return Changelog(version, key_groups, count, bytes(body[HEADER.size:]), source, meta or {})


def _header_v2(view: memoryview, source: str) -> tuple[int, int, dict[str, Any]]:
    """Format 2's header, checked against its own CRC-32: (codec, where the body starts, metadata)."""
    _, fmt, codec, _ = HEADER_V2.unpack_from(view, 0)
    if fmt != FORMAT_VERSION_V2:
        raise CorruptChangelogError(f"{source} has changelog format version {fmt}; this keyedstate reads formats 1 and 2")
    meta_length = _meta_length(view, source)
    head_end = HEADER_V2.size + meta_length
    if head_end + 4 > len(view):
        raise CorruptChangelogError(f"{source} is truncated ({len(view)} bytes, header of {head_end + 4})")
    if zlib.crc32(view[:head_end]) != struct.unpack_from(">I", view, head_end)[0]:
        raise CorruptChangelogError(f"{source} is corrupt (header CRC-32 mismatch)")
    try:
        meta = json_of(bytes(view[HEADER_V2.size:head_end]).decode("utf-8"))
        if not isinstance(meta, dict):
            raise ValueError("not an object")
        if "keyLayout" in meta:  # null or malformed is refused, as by the JVM (FORMATS.md)
            KeyLayout.from_json(meta["keyLayout"])
        if meta.get(RUN_ID) is not None and not isinstance(meta[RUN_ID], str):
            raise ValueError(f"field '{RUN_ID}' is {meta[RUN_ID]!r}, expected a string")
    except (ValueError, KeyError) as exc:
        raise CorruptChangelogError(f"{source} has unreadable metadata ({exc})") from None
    return codec, head_end + 4, meta


def _meta_length(head: bytes | bytearray | memoryview, source: str) -> int:
    """Format 2's metadata length from its header, refused beyond :data:`MAX_META_BYTES`."""
    meta_length = HEADER_V2.unpack_from(head, 0)[3]
    if meta_length > MAX_META_BYTES:
        raise CorruptChangelogError(f"{source} is corrupt (metadata of {meta_length} bytes, at most {MAX_META_BYTES})")
    return meta_length


def meta_bytes_needed(head: bytes | bytearray | memoryview, source: str = "a changelog") -> int:
    """How many leading bytes of a changelog :func:`read_meta` needs, given at least its first
    ``HEADER_V2.size`` (or all, if shorter): the whole format-2 header; format 1 has none."""
    if len(head) < HEADER_V2.size or bytes(head[:8]) != MAGIC_V2:
        return 0
    return HEADER_V2.size + _meta_length(head, source) + 4


def read_meta(head: bytes | bytearray | memoryview, source: str) -> dict[str, Any]:
    """The metadata of a changelog from its header alone, checked by the header's own CRC-32
    (format 1: none): the body is neither read nor checked, as by the JVM's ``readMeta``. ``head``
    holds at least the changelog's first :func:`meta_bytes_needed` bytes."""
    view = memoryview(head)
    if len(view) < 8 or bytes(view[:8]) != MAGIC_V2:
        return {}
    if len(view) < HEADER_V2.size + 4:
        raise CorruptChangelogError(f"{source} is truncated ({len(view)} bytes)")
    return _header_v2(view, source)[2]


def read_file_meta(path: str) -> dict[str, Any]:
    """:func:`read_meta` of a local changelog file, reading its header only (no link followed)."""
    with open_file(path) as fh:
        head = fh.read(HEADER_V2.size)
        needed = meta_bytes_needed(head, path)
        if needed > len(head):
            head += fh.read(needed - len(head))
    return read_meta(head, path)


def _decode_v2(view: memoryview, source: str) -> Changelog:
    if len(view) < HEADER_V2.size + 4:
        raise CorruptChangelogError(f"{source} is truncated ({len(view)} bytes)")
    codec, head_end, meta = _header_v2(view, source)
    body = view[head_end:]
    if codec == CODEC_ZSTD:
        body = memoryview(_zstd_decompress(body, source))
    elif codec == CODEC_ZSTD_SPLIT:
        if len(body) < 4:
            raise CorruptChangelogError(f"{source} is truncated ({len(view)} bytes)")
        groups_length = _U32.unpack_from(body, 0)[0]
        if 4 + groups_length > len(body):
            raise CorruptChangelogError(f"{source} is truncated or corrupt (key groups of {groups_length} bytes)")
        groups = _zstd_decompress(body[4:4 + groups_length], source)
        rest = _zstd_decompress(body[4 + groups_length:], source)
        joined = _join_key_groups(groups, rest, source)
        del groups, rest  # the format-1 decode copies the payload out: hold two copies at most, not three
        body = memoryview(joined)
    elif codec != CODEC_NONE:
        raise CorruptChangelogError(f"{source} uses compression codec {codec}; this keyedstate reads 0 (none), "
                                    "1 (zstd) and 2 (zstd, key groups apart)")
    log = _decode_v1(body, source, meta)
    version, key_groups = meta.get("version"), meta.get("keyGroups")
    # integers within the JVM's Long and Int: a bool (True == 1), 3.0 or a larger number is no match
    if (not all(isinstance(n, int) and not isinstance(n, bool) for n in (version, key_groups))
            or version > (1 << 63) - 1 or key_groups > 0x7FFFFFFF
            or (log.version, log.key_groups) != (version, key_groups)):
        raise CorruptChangelogError(f"{source}: its header says version {meta.get('version')} with "
                                    f"{meta.get('keyGroups')} key groups, its records version {log.version} "
                                    f"with {log.key_groups}: corrupt")
    return log


def compress(inner: bytes, meta: dict[str, Any], codec: int = CODEC_ZSTD_SPLIT) -> bytes:
    """A format-2 file of a format-1 changelog; ``meta`` adds to its version and key groups."""
    _, fmt, version, key_groups = HEADER.unpack_from(inner, 0)
    head = {"version": version, "keyGroups": key_groups, **meta}
    encoded = json.dumps(head, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(encoded) > MAX_META_BYTES:
        raise ValueError(f"a changelog's metadata would be {len(encoded)} bytes, at most {MAX_META_BYTES}")
    header = HEADER_V2.pack(MAGIC_V2, FORMAT_VERSION_V2, codec, len(encoded)) + encoded
    if codec in (CODEC_ZSTD, CODEC_ZSTD_SPLIT):
        import zstandard

        compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        if codec == CODEC_ZSTD:
            body = compressor.compress(inner)
        else:
            groups, rest = (compressor.compress(part) for part in _split_key_groups(inner))
            body = _U32.pack(len(groups)) + groups + rest
    elif codec == CODEC_NONE:
        body = inner
    else:
        raise ValueError(f"unknown codec {codec}")
    return header + struct.pack(">I", zlib.crc32(header)) + body


def read_file(path: str) -> Changelog:
    """A changelog file (no link followed; refused unread above ``layout.MAX_CHANGELOG_BYTES``)."""
    try:
        data = read_checkpoint_file(path, MAX_CHANGELOG_BYTES, "changelog")
    except TooLargeError as exc:
        raise CorruptChangelogError(str(exc)) from None
    return decode(data, path)


def encode_record(op: int, key: bytes, value: bytes | None) -> bytes:
    if op in PUTS:
        if value is None:
            raise ValueError(f"op {op} is a put and needs a value")
        return b"".join((bytes((op,)), _U32.pack(len(key)), key, _U32.pack(len(value)), value))
    if op not in DELETES:
        raise ValueError(f"unknown op {op}")
    return b"".join((bytes((op,)), _U32.pack(len(key)), key))


def encode(version: int, key_groups: int, records: list[tuple[int, bytes, bytes | None]]) -> bytes:
    """A changelog of ``(op, key, value)`` records (offline tools and tests; the JVM has its own writer)."""
    return frame(version, key_groups, [encode_record(*r) for r in records], len(records))


def frame(version: int, key_groups: int, encoded_records: list[bytes], count: int) -> bytes:
    """Header + already encoded records + trailer."""
    body = b"".join([HEADER.pack(MAGIC, FORMAT_VERSION, version, key_groups), *encoded_records])
    return body + TRAILER.pack(END, count, zlib.crc32(body))
