"""Changelog format 2's codecs below the frame (FORMATS.md, "Changelog"): one zstd frame
decompressed within its stated size, and codec 2's split of a format-1 changelog into its key
groups and the rest, and their join (the JVM's twin is ``ChangelogCodecs``)."""
from __future__ import annotations

import struct

from .changelog_wire import DELETES, HEADER, MAX_BYTES, PUTS, TRAILER, CorruptChangelogError, unpack_u32

ZSTD_UPFRONT_RATIO = 64  # output bytes allocated per frame byte before they decompress (FORMATS.md)
_ZSTD_UPFRONT_SLACK = 1 << 16


def zstd_decompress(frame: memoryview, source: str) -> bytes | bytearray:
    """One zstd frame: exactly the content size its header states (at most ``MAX_BYTES``), else
    ``CorruptChangelogError`` naming ``source``. A claim beyond ``ZSTD_UPFRONT_RATIO`` times the
    frame's size is not allocated on its word: the output grows from there as the stream yields
    bytes (the JVM's twin is ``ChangelogCodecs.unzstd``)."""
    import zstandard

    try:
        size = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as exc:
        raise CorruptChangelogError(f"{source} is truncated or corrupt (zstd: {exc})") from None
    if size < 0 or size > MAX_BYTES:  # no size recorded, or a bomb
        raise CorruptChangelogError(f"{source} is corrupt (its zstd frame states {size} bytes)")
    upfront = min(size, ZSTD_UPFRONT_RATIO * len(frame) + _ZSTD_UPFRONT_SLACK)
    if upfront == size:  # within the bound: one call into the exact size, the fastest way
        try:
            return zstandard.ZstdDecompressor().decompress(frame, max_output_size=size, allow_extra_data=False)
        except zstandard.ZstdError as exc:
            raise CorruptChangelogError(f"{source} is truncated or corrupt (zstd: {exc})") from None
    out = bytearray(upfront)
    n = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(frame, read_across_frames=True) as reader:
            while True:
                if n == len(out) and n < size:
                    out.extend(bytes(min(size, 2 * n) - n))
                if n < len(out):
                    with memoryview(out) as view:
                        got = reader.readinto(view[n:])
                else:
                    got = len(reader.read(1))
                if got == 0:
                    break
                if n == size:
                    raise CorruptChangelogError(
                        f"{source} is truncated or corrupt (zstd: more than the {size} bytes its frame states)")
                n += got
    except zstandard.ZstdError as exc:
        raise CorruptChangelogError(f"{source} is truncated or corrupt (zstd: {exc})") from None
    if n != size:
        raise CorruptChangelogError(f"{source} is truncated or corrupt (zstd: {n} of {size} bytes)")
    return out


def split_key_groups(inner: bytes) -> tuple[bytes, bytes]:
    """Codec 2's split of a format-1 changelog: (key groups, the rest)."""
    groups, rest = [], [inner[:HEADER.size]]
    end = len(inner) - TRAILER.size
    pos = HEADER.size
    while pos < end:
        op = inner[pos]
        key_start = pos + 5
        key_end = key_start + unpack_u32(inner, pos + 1)[0]
        record_end = key_end + 4 + unpack_u32(inner, key_end)[0] if op in PUTS else key_end
        groups.append(inner[key_start:key_start + 4])
        rest += (inner[pos:key_start], inner[key_start + 4:record_end])
        pos = record_end
    rest.append(inner[end:])
    return b"".join(groups), b"".join(rest)


def join_key_groups(groups: bytes, rest: bytes, source: str) -> bytearray:
    """The inverse of :func:`split_key_groups`; lengths are checked by the format-1 decode after.
    Written in place into one new buffer: a state server decodes a large changelog at its peak
    memory, so no intermediate copies (they would multiply its size at the peak).

    Records of one layout (one op class, one key length, one value length: UnsafeRows of
    fixed-width columns) are joined with numpy at C speed once every row's op and length fields
    are checked against the first record's; others by a walk over the record boundaries that
    only reads lengths, the insertion itself again at C speed."""
    end = len(rest) - TRAILER.size
    if end < HEADER.size or len(groups) % 4:
        raise CorruptChangelogError(f"{source} is corrupt (key groups and records disagree)")
    joined = _join_fixed_width(groups, rest, end)
    if joined is not None:
        return joined
    starts, pos, unpack, puts = [], HEADER.size, unpack_u32, PUTS
    try:
        while pos < end:
            starts.append(pos)
            key_rest = pos + 1 + unpack(rest, pos + 1)[0]  # pos + 5 + (key length - 4)
            if key_rest < pos + 5:
                raise CorruptChangelogError(f"{source} is corrupt (a key shorter than its key group)")
            pos = key_rest + 4 + unpack(rest, key_rest)[0] if rest[pos] in puts else key_rest
    except struct.error:
        raise CorruptChangelogError(f"{source} is truncated or corrupt (a record overruns the file)") from None
    if pos != end or len(starts) * 4 != len(groups):
        raise CorruptChangelogError(f"{source} is corrupt (key groups and records disagree)")
    return _insert_groups(groups, rest, starts)


def _join_fixed_width(groups: bytes, rest: bytes, end: int) -> bytearray | None:
    import numpy as np

    count = len(groups) // 4
    body = end - HEADER.size
    if count == 0 or body % count or body // count < 5:
        return None
    size = body // count
    rows = np.frombuffer(rest, dtype=np.uint8, count=body, offset=HEADER.size).reshape(count, size)
    op = int(rows[0, 0])
    key_rest = 1 + unpack_u32(rest, HEADER.size + 1)[0]  # the key's bytes after its group end here
    fields = [slice(1, 5)]
    if op in PUTS:
        if key_rest + 4 > size or key_rest + 4 + unpack_u32(rest, HEADER.size + key_rest)[0] != size:
            return None
        fields.append(slice(key_rest, key_rest + 4))
        allowed = list(PUTS)
    elif op in DELETES:
        if key_rest != size:
            return None
        allowed = list(DELETES)
    else:
        return None
    if key_rest < 5 or not np.isin(rows[:, 0], allowed).all():
        return None
    if any(not (rows[:, cols] == rows[0, cols]).all() for cols in fields):
        return None
    joined = bytearray(len(rest) + len(groups))
    joined[:HEADER.size] = rest[:HEADER.size]
    records = np.frombuffer(joined, dtype=np.uint8, count=count * (size + 4), offset=HEADER.size).reshape(count, size + 4)
    records[:, :5] = rows[:, :5]
    records[:, 5:9] = np.frombuffer(groups, dtype=np.uint8).reshape(count, 4)
    records[:, 9:] = rows[:, 5:]
    del records  # releases its export of joined's buffer
    joined[HEADER.size + count * (size + 4):] = rest[end:]
    return joined


INSERT_CHUNK = 16_384
"""Records whose key groups :func:`_insert_groups` inserts at a time: its index arrays take 8
bytes per byte of the records, so a whole changelog at once would take ~25x its size."""


def _insert_groups(groups: bytes, rest: bytes, starts: list[int]) -> bytearray:
    """``rest`` with the 4 bytes of key group i inserted after byte 5 of record i (at ``starts[i]``)."""
    import numpy as np

    joined = bytearray(len(rest) + len(groups))
    out = np.frombuffer(joined, dtype=np.uint8)
    src = np.frombuffer(rest, dtype=np.uint8)
    group_bytes = np.frombuffer(groups, dtype=np.uint8).reshape(-1, 4)
    head = starts[0] if starts else len(rest)
    out[:head] = src[:head]
    for first in range(0, len(starts), INSERT_CHUNK):
        stop = min(first + INSERT_CHUNK, len(starts))
        lo, hi = starts[first], (starts[stop] if stop < len(starts) else len(rest))
        part = src[lo:hi]
        dest = out[lo + 4 * first:hi + 4 * stop]
        at = np.asarray(starts[first:stop], dtype=np.int64) + (5 - lo)
        shift = np.zeros(len(part), dtype=np.int64)
        shift[at[at < len(part)]] = 4  # from each insertion point on, the part's bytes move 4 further
        np.cumsum(shift, out=shift)
        dest[np.arange(len(part), dtype=np.int64) + shift] = part
        slots = (at + 4 * np.arange(stop - first, dtype=np.int64))[:, None] + np.arange(4, dtype=np.int64)
        dest[slots.ravel()] = group_bytes[first:stop].ravel()
    del out, src, group_bytes  # release their exports of the buffers
    return joined
