"""Spark's partition hash for state keys, computed from UnsafeRow bytes without a JVM.

Stateful operators place a key in shuffle partition ``pmod(Murmur3Hash(keyCols, 42), n)``
(``HashPartitioning``), and the state of partition ``p`` lives in store ``p``. An offline
rescale has to send every raw key read from a store to the partition Spark would send it to,
so this module re-implements exactly that hash over the UnsafeRow encoding of the key:

* ``Murmur3_x86_32`` from ``org.apache.spark.unsafe.hash``, including the legacy
  ``hashUnsafeBytes`` tail (each of the last 1-3 bytes is a full round on its *signed* value,
  which is not standard murmur3);
* the per-type rules of catalyst's ``HashExpression``/``Murmur3HashFunction`` (hash.scala):
  null leaves the running hash unchanged, ±0.0 hash as 0, NaN as Java's canonical NaN bits,
  decimals by unscaled long (precision <= 18) or by two's-complement bytes, structs and
  arrays fold their elements into the running hash.

Types whose hash this module cannot reproduce exactly (maps, calendar intervals, variants,
non-binary collations) are refused when a :class:`RowHasher` is built, never hashed wrongly.
"""
from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Callable
from typing import Any

from ..checkpoint.spark import parse_schema_json
from ..checkpoint.storage import link_refused
from ..formats import layout

__all__ = ["RowHasher", "UnsupportedKeyType", "read_key_schema"]

SEED = 42

Buffer = bytes | bytearray | memoryview
# reads the non-null value whose 8-byte slot (or array element) starts at ``pos``; ``base`` is
# the start of the enclosing row/array, which variable-length offsets are relative to.
_Reader = Callable[[Buffer, int, int, int], int]

_M32 = 0xFFFFFFFF
_U16 = struct.Struct("<H").unpack_from
_U32 = struct.Struct("<I").unpack_from
_U64 = struct.Struct("<Q").unpack_from
_U32X2 = struct.Struct("<II").unpack_from
_WORDS: dict[int, Callable] = {}  # word count -> unpack_from for that many little-endian u32s


class UnsupportedKeyType(ValueError):
    """A hashed key column has a type whose Spark hash this module does not reproduce."""


# --- Murmur3_x86_32 (all values are unsigned 32-bit ints; Java's int bits) -------------------
# C1 = 0xCC9E2D51, C2 = 0x1B873593; constants are literals on purpose: these functions run
# several times per key, and LOAD_CONST is cheaper than a global lookup. A rotation's result is
# not masked when only a multiplication (and addition) mod 2**32 follows: bits above 32 cannot
# reach the low 32 bits, and the mask after the multiplication drops them.

def _mix_k1(k: int) -> int:
    k = (k * 0xCC9E2D51) & 0xFFFFFFFF
    k = (k << 15) | (k >> 17)
    return (k * 0x1B873593) & 0xFFFFFFFF


# The legacy tail of hashUnsafeBytes, booleans and bytes each mix one byte, sign-extended as
# Java does: a table of mixK1 per byte value saves three big-int operations every time.
_K1_OF_BYTE = tuple(_mix_k1(b | 0xFFFFFF00 if b & 0x80 else b) for b in range(256))


def _fmix(h: int, length: int) -> int:
    """Murmur3's finalization (``fmix``) of ``h`` after ``length`` bytes: every hash below ends
    here but ``_hash_int``, which inlines it as the hash of most fixed-width columns."""
    h ^= length
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def _hash_k1(k1: int, h: int) -> int:
    """``hashInt`` from an already mixed ``k1`` (see ``_K1_OF_BYTE``)."""
    h ^= k1
    h = (h << 13) | (h >> 19)
    return _fmix((h * 5 + 0xE6546B64) & 0xFFFFFFFF, 4)


def _hash_int(k: int, h: int) -> int:
    """``Murmur3_x86_32.hashInt(k, h)``, inlined: it runs once per fixed-width column."""
    k = (k * 0xCC9E2D51) & 0xFFFFFFFF
    k = (k << 15) | (k >> 17)
    h ^= (k * 0x1B873593) & 0xFFFFFFFF
    h = (h << 13) | (h >> 19)
    h = (h * 5 + 0xE6546B64) & 0xFFFFFFFF
    h ^= 4
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def _hash_long(low: int, high: int, h: int) -> int:
    """``Murmur3_x86_32.hashLong``: the low then the high 32-bit half, length 8."""
    k = (low * 0xCC9E2D51) & 0xFFFFFFFF
    k = (k << 15) | (k >> 17)
    h ^= (k * 0x1B873593) & 0xFFFFFFFF
    h = (h << 13) | (h >> 19)
    h = (h * 5 + 0xE6546B64) & 0xFFFFFFFF
    k = (high * 0xCC9E2D51) & 0xFFFFFFFF
    k = (k << 15) | (k >> 17)
    h ^= (k * 0x1B873593) & 0xFFFFFFFF
    h = (h << 13) | (h >> 19)
    return _fmix((h * 5 + 0xE6546B64) & 0xFFFFFFFF, 8)


def _hash_bytes(buf: Buffer, pos: int, length: int, h: int) -> int:
    """``Murmur3_x86_32.hashUnsafeBytes`` (legacy, not standard murmur3 when length % 4 != 0)."""
    nwords = length >> 2
    if nwords:
        unpack = _WORDS.get(nwords)
        if unpack is None:
            unpack = struct.Struct(f"<{nwords}I").unpack_from
            if nwords <= 256:  # keys are mostly short; don't keep one per length of long ones
                _WORDS[nwords] = unpack
        for k in unpack(buf, pos):
            k = (k * 0xCC9E2D51) & 0xFFFFFFFF
            k = (k << 15) | (k >> 17)
            h ^= (k * 0x1B873593) & 0xFFFFFFFF
            h = (h << 13) | (h >> 19)
            h = (h * 5 + 0xE6546B64) & 0xFFFFFFFF
    for i in range(pos + (nwords << 2), pos + length):
        h ^= _K1_OF_BYTE[buf[i]]
        h = (h << 13) | (h >> 19)
        h = (h * 5 + 0xE6546B64) & 0xFFFFFFFF
    return _fmix(h, length)


# --- per-type readers over UnsafeRow / UnsafeArrayData bytes ---------------------------------

def _read_bool(buf: Buffer, base: int, pos: int, h: int) -> int:
    return _hash_k1(_K1_OF_BYTE[1 if buf[pos] else 0], h)


def _read_byte(buf: Buffer, base: int, pos: int, h: int) -> int:
    return _hash_k1(_K1_OF_BYTE[buf[pos]], h)


def _read_short(buf: Buffer, base: int, pos: int, h: int) -> int:
    (v,) = _U16(buf, pos)
    return _hash_int(v | 0xFFFF0000 if v & 0x8000 else v, h)


def _read_int(buf: Buffer, base: int, pos: int, h: int) -> int:
    return _hash_int(_U32(buf, pos)[0], h)


def _read_long(buf: Buffer, base: int, pos: int, h: int) -> int:
    low, high = _U32X2(buf, pos)
    return _hash_long(low, high, h)


def _read_float(buf: Buffer, base: int, pos: int, h: int) -> int:
    (bits,) = _U32(buf, pos)
    if not bits & 0x7FFFFFFF:  # -0.0f == 0.0f -> hashInt(0)
        bits = 0
    elif bits & 0x7F800000 == 0x7F800000 and bits & 0x007FFFFF:  # floatToIntBits(NaN)
        bits = 0x7FC00000
    return _hash_int(bits, h)


def _read_double(buf: Buffer, base: int, pos: int, h: int) -> int:
    low, high = _U32X2(buf, pos)
    if not low and not high & 0x7FFFFFFF:  # -0.0d == 0.0d -> hashLong(0L)
        high = 0
    elif high & 0x7FF00000 == 0x7FF00000 and (low or high & 0x000FFFFF):  # doubleToLongBits(NaN)
        low, high = 0, 0x7FF80000
    return _hash_long(low, high, h)


def _read_bytes(buf: Buffer, base: int, pos: int, h: int) -> int:
    """String (UTF-8 bytes), binary, and big decimal (unscaled two's-complement, big-endian)."""
    (slot,) = _U64(buf, pos)
    return _hash_bytes(buf, base + (slot >> 32), slot & _M32, h)


def _read_null(buf: Buffer, base: int, pos: int, h: int) -> int:
    return h


def _null_mask(i: int) -> tuple[int, int]:
    """(byte offset, bit mask) of element ``i``'s null bit in a little-endian 64-bit bitset."""
    return i >> 3, 1 << (i & 7)


def _struct_reader(fields: tuple[tuple[int, int, int, _Reader], ...]) -> _Reader:
    def read_struct(buf: Buffer, base: int, pos: int, h: int) -> int:
        (slot,) = _U64(buf, pos)
        row = base + (slot >> 32)
        for byte, mask, slot_pos, reader in fields:
            if not buf[row + byte] & mask:
                h = reader(buf, row, row + slot_pos, h)
        return h
    return read_struct


def _array_reader(element_size: int, element: _Reader) -> _Reader:
    def read_array(buf: Buffer, base: int, pos: int, h: int) -> int:
        (slot,) = _U64(buf, pos)
        array = base + (slot >> 32)
        (n,) = _U64(buf, array)
        values = array + 8 + ((n + 63) >> 6 << 3)
        for i in range(n):
            if not buf[array + 8 + (i >> 3)] & (1 << (i & 7)):
                h = element(buf, array, values + i * element_size, h)
        return h
    return read_array


_SIMPLE: dict[str, tuple[int, _Reader]] = {  # type name -> (size as an array element, reader)
    "boolean": (1, _read_bool),
    "byte": (1, _read_byte),
    "short": (2, _read_short),
    "integer": (4, _read_int),
    "date": (4, _read_int),
    "long": (8, _read_long),
    "timestamp": (8, _read_long),
    "timestamp_ntz": (8, _read_long),
    "float": (4, _read_float),
    "double": (8, _read_double),
    "string": (8, _read_bytes),
    "binary": (8, _read_bytes),
    "void": (8, _read_null),  # NullType: always null, never changes the hash
}
_DECIMAL = re.compile(r"decimal\((\d+),\s*(-?\d+)\)$")
_CHAR = re.compile(r"(var)?char\(\d+\)$")
_TIME = re.compile(r"time\(\d\)$")  # TimeType: nanoseconds of the day as a long
_INTERVAL = re.compile(
    r"interval (year|month|day|hour|minute|second)( to (month|hour|minute|second))?$")
_BINARY_COLLATIONS = {"spark.UTF8_BINARY", "UTF8_BINARY"}


def _compile(dtype: Any, where: str) -> tuple[int, _Reader]:
    """(array element size, reader) for a Spark type in its JSON form; ``where`` names it."""
    if isinstance(dtype, str):
        if dtype in _SIMPLE:
            return _SIMPLE[dtype]
        m = _DECIMAL.match(dtype)
        if m:  # Decimal.MAX_LONG_DIGITS = 18: unscaled long in the slot, else variable-length
            return (8, _read_long) if int(m.group(1)) <= 18 else (8, _read_bytes)
        if dtype == "decimal":  # bare "decimal" is DecimalType(10, 0)
            return 8, _read_long
        if _CHAR.match(dtype):  # CharType/VarcharType are UTF8String at runtime
            return 8, _read_bytes
        if _TIME.match(dtype):
            return 8, _read_long
        m = _INTERVAL.match(dtype)
        if m:  # YearMonthIntervalType: months as int; DayTimeIntervalType: micros as long
            return (4, _read_int) if m.group(1) in ("year", "month") else (8, _read_long)
        if dtype.startswith("string collate "):
            if dtype[len("string collate "):] in _BINARY_COLLATIONS:
                return 8, _read_bytes
            raise UnsupportedKeyType(
                f"key field {where!r} has type {dtype!r}: non-binary collations hash by a "
                f"collation key, which is not reproduced here")
        why = (": Spark's generated and interpreted hashes of CalendarInterval differ"
               if dtype == "interval" else "")
        raise UnsupportedKeyType(f"key field {where!r} has unsupported type {dtype!r}{why}")
    if isinstance(dtype, dict):
        kind = dtype.get("type")
        if kind == "struct":
            return 8, _compile_struct(dtype, where)
        if kind == "array":
            size, element = _compile(dtype.get("elementType"), f"{where}.element")
            return 8, _array_reader(size, element)
        if kind == "udt" and "sqlType" in dtype:  # a UDT is stored and hashed as its sqlType
            return _compile(dtype["sqlType"], where)
        raise UnsupportedKeyType(
            f"key field {where!r} has unsupported type {kind!r}"
            + (": Spark refuses to hash maps by default" if kind == "map" else ""))
    raise UnsupportedKeyType(f"key field {where!r} has unrecognised type {dtype!r}")


def _fields_of(schema: Any, where: str) -> list[dict]:
    if (not isinstance(schema, dict) or schema.get("type") != "struct"
            or not isinstance(schema.get("fields"), list)):
        raise ValueError(f"{where}: expected a struct type with a 'fields' list, "
                         f"got {str(schema)[:200]}")
    return schema["fields"]


def _compile_field(field: dict, where: str) -> tuple[int, _Reader]:
    collations = (field.get("metadata") or {}).get("__COLLATIONS") or {}
    for path, collation in collations.items():
        if collation not in _BINARY_COLLATIONS:
            raise UnsupportedKeyType(
                f"key field {where!r} has a string with collation {collation!r} (at {path!r}): "
                f"non-binary collations hash by a collation key, which is not reproduced here")
    return _compile(field.get("type"), where)


def _compile_struct(schema: dict, where: str) -> _Reader:
    fields = _fields_of(schema, where)
    bitset = ((len(fields) + 63) >> 6) << 3
    compiled = []
    for i, field in enumerate(fields):
        _, reader = _compile_field(field, f"{where}.{field.get('name')}")
        byte, mask = _null_mask(i)
        compiled.append((byte, mask, bitset + 8 * i, reader))
    return _struct_reader(tuple(compiled))


class RowHasher:
    """Spark's ``Murmur3Hash(first N key columns, 42)`` over UnsafeRow bytes of a state key.

    Everything that depends only on the schema (null-bit positions, slot offsets, per-type
    readers) is resolved here, once, so :meth:`hash` only reads slots and mixes: it runs on
    every key of a store. Only the hashed columns need supported types; later columns (e.g. the
    index of a stream-stream join key) are skipped, their count still sizes the null bitset.
    """

    def __init__(self, key_schema: dict, hashed_columns: int) -> None:
        fields = _fields_of(key_schema, "key schema")
        if not fields:
            raise ValueError("the key schema has no fields: Spark does not hash-partition such "
                             "state (a global aggregation keeps it in one partition)")
        if not 1 <= hashed_columns <= len(fields):
            raise ValueError(f"hashed_columns must be in 1..{len(fields)} (the key has "
                             f"{len(fields)} fields), got {hashed_columns}")
        bitset = ((len(fields) + 63) >> 6) << 3
        self.key_schema, self.hashed_columns = key_schema, hashed_columns
        compiled = []
        for i, field in enumerate(fields[:hashed_columns]):
            _, reader = _compile_field(field, str(field.get("name")))
            byte, mask = _null_mask(i)
            compiled.append((byte, mask, bitset + 8 * i, reader))
        self._fields: tuple[tuple[int, int, int, _Reader], ...] = tuple(compiled)

    def hash(self, row: Buffer, offset: int = 0) -> int:
        """The signed 32-bit hash Spark computes for this key.

        ``row[offset:]`` is the UnsafeRow: ``offset`` skips whatever a store's encoding puts
        in front of it (a version byte, a column-family prefix); trailing bytes are ignored.
        """
        h = SEED
        try:
            for byte, mask, slot_pos, reader in self._fields:
                if not row[offset + byte] & mask:
                    h = reader(row, offset, offset + slot_pos, h)
        except (IndexError, struct.error) as e:
            raise ValueError(f"malformed or truncated UnsafeRow at offset {offset}: {e}") from None
        return h - 0x100000000 if h & 0x80000000 else h

    def partition(self, row: Buffer, num_partitions: int, offset: int = 0) -> int:
        """The partition Spark's ``HashPartitioning`` gives this key: ``pmod(hash, n)``."""
        return self.hash(row, offset) % num_partitions  # Python's % of a positive n is pmod

    def __repr__(self) -> str:
        names = [f.get("name") for f in self.key_schema["fields"][:self.hashed_columns]]
        return f"RowHasher(columns={names})"


# --- state schema files -----------------------------------------------------------------------

def read_key_schema(schema_file: str | os.PathLike) -> dict:
    """The key StructType (as ``StructType.jsonValue()``) from a state ``_metadata/schema`` file.

    The rescale tool needs the key schema to decode raw keys, and this file is the only place
    a checkpoint records it. Formats are Spark's ``SchemaHelper`` v1 and v2; v3
    (transformWithState's column-family list) is refused. Errors name the file.
    """
    path = os.fspath(schema_file)
    try:
        data = layout.read_file(path, layout.MAX_SPARK_METADATA_BYTES, "Spark state schema file")
    except layout.TooLargeError as exc:
        raise ValueError(str(exc)) from None
    except OSError:
        if os.path.islink(path):
            raise ValueError(link_refused(path)) from None
        raise
    try:
        key_json, _ = parse_schema_json(data)  # the value schema is read only to reject truncated files
        schema = json.loads(key_json)
        _fields_of(schema, "key schema")
    except (ValueError, UnicodeError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path}: not a readable Spark state schema file: {e}") from None
    return schema
