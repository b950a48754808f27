"""Wire format of the bulk data channel between the JVM shim and the state server.

py4j carries control calls (open, load, snapshot, close); it moves bytes as base64 text at
~25 MB/s, so keys, values and changelogs travel over a Unix domain socket instead, as
length-prefixed binary frames (big-endian)::

    request   u32 length | u8 op | u32 store handle | body
    response  u32 length | u8 status | body

Ops and bodies mirror ``DataChannel.scala``; keep the two in step.
"""
from __future__ import annotations

import struct

OP_GET = 1        # body: key                         -> OK value | NOT_FOUND
OP_SCAN = 2       # body: u32 plen prefix u8 has_after [u32 alen after] u32 max_bytes u8 flags
                  #   u32 max_entries (0 = no limit)
                  #   (flags bit 0: keys only)        -> OK u8 has_more u32 n (u32 klen k u32 vlen v)*
OP_APPLY = 3      # body: u8 mode u8 has_ttl [i64 expire_before u32 interval u32 budget]
                  #   changelog                       -> OK u64 num_keys (0 when applied behind)
OP_MULTI_GET = 4  # body: u32 n (u32 klen k)*         -> OK (u8 found [u32 vlen v])*
OP_TTL_CANDIDATES = 5  # body: (none)                 -> OK i64 version u32 scan_ms u32 n (u32 klen k)*
OP_SYNC = 6       # body: (none), waits for pending applies and flushes -> OK i64 version, RocksDB dir (utf-8)

APPLY_NOW = 0     # apply before replying (the writer needs the exact key count)
APPLY_BEHIND = 1  # queue and reply at once (write-behind)

STATUS_OK = 0
STATUS_NOT_FOUND = 1
STATUS_ERROR = 2

U8 = struct.Struct(">B")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
I64 = struct.Struct(">q")
TTL_SCAN = struct.Struct(">qII")  # expire_before (epoch ms), interval (versions), budget (entries)
TTL_HEAD = struct.Struct(">qII")  # version scanned (-1: none), scan ms, number of keys
REQUEST_HEAD = struct.Struct(">IBI")  # length, op, handle
RESPONSE_HEAD = struct.Struct(">IB")  # length, status
