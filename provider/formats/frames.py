"""Frames of the bulk data channel between the JVM shim and the state server.

Spec: FORMATS.md, "Data-channel frames"; the JVM twin is ``Frames.scala``; golden files in
``tests/golden/``. py4j carries control calls (open, load, snapshot, close) and moves bytes as
base64 text at ~25 MB/s, so keys, values and changelogs travel over a Unix domain socket
instead, as length-prefixed binary frames (big-endian)::

    request   u32 length | u8 op | u32 store handle | body     (length counts op, handle, body)
    response  u32 length | u8 status | body                    (length counts status, body)

Bodies, by op (``->`` the OK reply)::

    GET        key                                    -> value | NOT_FOUND, empty
    SCAN       u32 plen prefix | u8 has_after [u32 alen after] | u32 max_bytes | u8 flags (1: keys only)
                                                      -> u8 has_more | u32 n | (u32 klen k | u32 vlen v)*
    APPLY      u8 mode | u8 has_ttl [i64 expire_before | u32 interval | u32 budget] | changelog
                                                      -> u64 key count (0 when applied behind or held)
    RELEASE    u8 apply (1: apply the held changelog behind, 0: drop it)   -> (empty)
    MULTI_GET  u32 n | (u32 klen k)*                  -> (u8 found [u32 vlen v])*
    TTL_CANDIDATES (empty)                            -> i64 version | u32 scan ms | u32 n | (u32 klen k)*
    SYNC       (empty)                                -> i64 version | RocksDB directory (UTF-8)
    HELLO      u16 protocol version | secret (UTF-8)  -> (empty)

An ERROR reply carries a UTF-8 message. Every length is checked before anything is allocated:
a request's length against the largest body its op can have (:func:`max_body`), every field
against the body. HELLO (handle 0) is the first frame of every connection; the server refuses
any other first frame and closes the connection.
"""
from __future__ import annotations

import struct
from typing import Iterable, NamedTuple

OP_GET = 1
OP_SCAN = 2
OP_APPLY = 3
OP_MULTI_GET = 4
OP_TTL_CANDIDATES = 5
OP_SYNC = 6
OP_HELLO = 7
OP_RELEASE = 8

PROTOCOL_VERSION = 3
"""Version 2 added HELLO (the data-channel secret) as the first frame of a connection;
version 3 added the HOLD apply mode and RELEASE."""

APPLY_NOW = 0  # apply before replying (the writer needs the exact key count)
APPLY_BEHIND = 1  # queue and reply at once (write-behind)
APPLY_HOLD = 2  # keep it, unapplied, until RELEASE says whether its checkpoint file is durable
APPLY_MODES = (APPLY_NOW, APPLY_BEHIND, APPLY_HOLD)

STATUS_OK = 0
STATUS_NOT_FOUND = 1
STATUS_ERROR = 2

REQUEST_HEAD = struct.Struct(">IBI")  # length, op, handle
RESPONSE_HEAD = struct.Struct(">IB")  # length, status
TTL_SCAN = struct.Struct(">qII")  # expire_before (epoch ms), interval (versions), budget (entries)
TTL_HEAD = struct.Struct(">qII")  # version scanned (-1: none), scan ms, number of keys
U8 = struct.Struct(">B")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
I64 = struct.Struct(">q")
U16 = struct.Struct(">H")

MAX_SECRET_BYTES = 256
_KIB, _MIB = 1 << 10, 1 << 20
_MAX_BODY = {
    OP_APPLY: (1 << 31) - 1 - 5,  # a changelog: up to what a Java ByteBuffer frame can hold
    OP_MULTI_GET: (1 << 31) - 1 - 5,
    OP_GET: 64 * _MIB,  # one key
    OP_SCAN: 128 * _MIB,  # a prefix and a key
    OP_TTL_CANDIDATES: 0,
    OP_SYNC: 0,
    OP_HELLO: U16.size + MAX_SECRET_BYTES,
    OP_RELEASE: U8.size,
}
UNKNOWN_OP_MAX_BODY = 64 * _KIB
"""An unknown op's body is read and dropped (so the connection stays in step) up to this size."""


class FrameError(ValueError):
    """A frame whose lengths or fields do not fit: the exchange fails, the server does not."""


def max_body(op: int) -> int:
    """The largest request body ``op`` can have; a longer frame is refused unread."""
    return _MAX_BODY.get(op, UNKNOWN_OP_MAX_BODY)


class TtlScan(NamedTuple):
    """Every ``interval`` versions, look for entries written at or before ``expire_before``
    (epoch ms), examining up to ``budget`` entries."""

    expire_before: int
    interval: int
    budget: int


class ScanRequest(NamedTuple):
    prefix: bytes
    start_after: bytes | None
    max_bytes: int
    keys_only: bool


class ApplyRequest(NamedTuple):
    mode: int  # APPLY_NOW, APPLY_BEHIND or APPLY_HOLD
    ttl: TtlScan | None
    changelog: memoryview


class _Reader:
    """Reads fields from a body, checking each length against what is left."""

    def __init__(self, body: bytes | bytearray | memoryview) -> None:
        self.buf, self.pos = memoryview(body), 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise FrameError(f"frame field of {n} bytes at byte {self.pos} overruns the {len(self.buf)}-byte body")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: struct.Struct) -> tuple:
        return fmt.unpack(self.take(fmt.size))

    def u8(self) -> int:
        return self.unpack(U8)[0]

    def u32(self) -> int:
        return self.unpack(U32)[0]

    def sized(self) -> bytes:
        return bytes(self.take(self.u32()))

    def rest(self) -> memoryview:
        return self.take(len(self.buf) - self.pos)

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise FrameError(f"{len(self.buf) - self.pos} unexpected bytes at the end of the frame")


def scan_request(body) -> ScanRequest:
    r = _Reader(body)
    prefix = r.sized()
    start_after = r.sized() if r.u8() else None
    max_bytes = r.u32()
    flags = r.u8()
    r.done()
    return ScanRequest(prefix, start_after, max_bytes, bool(flags & 1))


def multi_get_request(body) -> list[bytes]:
    r = _Reader(body)
    count = r.u32()
    if count > len(r.buf) // 4:  # each key takes at least its length field
        raise FrameError(f"a multi-get of {count} keys does not fit its {len(r.buf)}-byte body")
    keys = [r.sized() for _ in range(count)]
    r.done()
    return keys


def apply_request(body) -> ApplyRequest:
    r = _Reader(body)
    mode = r.u8()
    if mode not in APPLY_MODES:
        raise FrameError(f"unknown apply mode {mode}")
    ttl = TtlScan(*r.unpack(TTL_SCAN)) if r.u8() else None
    return ApplyRequest(mode, ttl, r.rest())


def release_request(body) -> bool:
    """Whether to apply (True) or drop (False) the changelog held by an APPLY in HOLD mode."""
    r = _Reader(body)
    flag = r.u8()
    r.done()
    if flag not in (0, 1):
        raise FrameError(f"unknown release flag {flag}")
    return flag == 1


class HelloRequest(NamedTuple):
    protocol: int
    secret: bytes


def hello_request(body) -> HelloRequest:
    r = _Reader(body)
    (protocol,) = r.unpack(U16)
    secret = bytes(r.rest())
    if not secret or len(secret) > MAX_SECRET_BYTES:
        raise FrameError(f"a hello with a secret of {len(secret)} bytes")
    return HelloRequest(protocol, secret)


def scan_reply(entries: list[tuple[bytes, bytes]], more: bool) -> bytes:
    parts = [U8.pack(1 if more else 0), U32.pack(len(entries))]
    for key, value in entries:
        parts += (U32.pack(len(key)), key, U32.pack(len(value)), value)
    return b"".join(parts)


def multi_get_reply(values: Iterable[bytes | None]) -> bytes:
    return b"".join(b"\x00" if v is None else b"\x01" + U32.pack(len(v)) + v for v in values)


def ttl_candidates_reply(version: int, scan_ms: int, keys: list[bytes]) -> bytes:
    parts = [TTL_HEAD.pack(version, scan_ms, len(keys))]
    for key in keys:
        parts += (U32.pack(len(key)), key)
    return b"".join(parts)


def sync_reply(version: int, directory: str) -> bytes:
    return I64.pack(version) + directory.encode("utf-8")


def count_reply(count: int) -> bytes:
    return U64.pack(count)


def response_head(status: int, body_length: int) -> bytes:
    return RESPONSE_HEAD.pack(body_length + 1, status)
