"""The changelog formats' fixed parts (FORMATS.md, "Changelog"): magic numbers, versions,
codecs, record ops, header and trailer layouts, size limits and format 2's metadata keys, and
the error a reader raises; :mod:`.changelog` reads and writes the files with them."""
from __future__ import annotations

import struct

MAGIC = b"KSCHLOG1"
FORMAT_VERSION = 1
MAGIC_V2 = b"KSCHLOG2"
FORMAT_VERSION_V2 = 2
CODEC_NONE = 0
CODEC_ZSTD = 1
CODEC_ZSTD_SPLIT = 2  # zstd, key groups in a stream of their own
ZSTD_LEVEL = 1  # measured: the best ratio and speed on changelogs (levels 3+ compress them worse)
MAX_BYTES = (1 << 31) - 64  # one changelog, uncompressed (the JVM writes one Java array)
MAX_META_BYTES = 16 << 20  # format 2's metadata, written or read (FORMATS.md; JVM: ChangelogFormat.MaxMetaBytes)
OP_PUT = 1  # put; whether the key existed is unknown
OP_DELETE = 2  # delete; whether the key existed is unknown
OP_PUT_NEW = 3  # put of a key that did not exist
OP_PUT_EXISTING = 4  # put over an existing key
OP_DELETE_EXISTING = 5  # delete of an existing key
PUTS = frozenset((OP_PUT, OP_PUT_NEW, OP_PUT_EXISTING))
DELETES = frozenset((OP_DELETE, OP_DELETE_EXISTING))
END = 0xFF
HEADER = struct.Struct(">8sHQI")
TRAILER = struct.Struct(">BQI")
HEADER_V2 = struct.Struct(">8sHBI")  # magic, format version, codec, meta length; then meta, u32 CRC
U32 = struct.Struct(">I")
unpack_u32 = U32.unpack_from


FROM_EMPTY = "fromEmpty"
"""Format 2's metadata key marking a version written from empty (by migrate, the state processor
or a repartition): a load replays it from empty, as a base, not as a delta on the version before."""


RUN_ID = "runId"
"""Format 2's metadata key naming the query run that committed the version (absent in files of
offline writers). A later run that executes the batch again replaces the file of an earlier run
(and that version's snapshot manifest): the attempt Spark commits is the version."""


class CorruptChangelogError(ValueError):
    """A changelog is truncated, corrupt, or not written by keyedstate; the message names it."""
