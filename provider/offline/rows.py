"""Spark's UnsafeRow, in Python: encode a key as Spark would, decode keys and values for people.

Offline tools that look up one key without a JVM (``keyedstate get``) must produce exactly the
bytes Spark's ``UnsafeProjection`` produces for the key (they are what is stored, and what is
hashed to find the partition and key group), and must show stored values decoded with the state
schema. This module does both for the types state schemas commonly hold: boolean, byte, short,
int, long, float, double, string, binary, date, timestamp, timestamp_ntz, decimal, null/void,
structs and arrays (nested), and decodes maps. Other types are refused with a message naming the
field, never guessed.

The layout (``org.apache.spark.sql.catalyst.expressions.UnsafeRow``/``UnsafeRowWriter``):
``ceil(n/64)`` 8-byte words of null bits, one 8-byte little-endian slot per field (fixed-size
values in place; variable-size ones as ``offset << 32 | size``, offset from the row start), then
the variable-size data, each piece zero-padded to 8 bytes. A null field has its bit set and a
zero slot. Decimals of precision > 18 always reserve 16 bytes. Arrays (``UnsafeArrayData``):
u64 count, ``ceil(n/64)`` words of null bits, elements of their natural size (1, 2, 4 or 8
bytes; variable-size ones as offset/size slots relative to the array start), the whole padded to
8 bytes, then the variable-size data.

Values in Python: timestamps are ``datetime`` (UTC, naive for timestamp_ntz), dates ``date``,
decimals ``Decimal``, structs ``dict``, arrays ``list``. :func:`to_json_value` renders them for
JSON (ISO strings, decimals as strings, binary as base64); :func:`from_json_value` accepts those
renderings back (and epoch microseconds for timestamps).
"""
from __future__ import annotations

import base64
import datetime as dt
import decimal
import re
import struct
from typing import Any

EPOCH = dt.datetime(1970, 1, 1)
EPOCH_DATE = dt.date(1970, 1, 1)
_DECIMAL = re.compile(r"decimal\((\d+),\s*(-?\d+)\)$")
_FIXED = {"boolean": ("<?", 1), "byte": ("<b", 1), "short": ("<h", 2), "integer": ("<i", 4),
          "long": ("<q", 8), "float": ("<f", 4), "double": ("<d", 8), "date": ("<i", 4),
          "timestamp": ("<q", 8), "timestamp_ntz": ("<q", 8)}


class UnsupportedType(ValueError):
    """A field's type is not one this module encodes or decodes; the message names the field."""


def fields(schema: dict) -> list[dict]:
    return schema["fields"]


def _round8(n: int) -> int:
    return (n + 7) & ~7


def _bitset_bytes(n: int) -> int:
    return ((n + 63) // 64) * 8


def _decimal_of(dtype: str) -> tuple[int, int] | None:
    if dtype == "decimal":
        return 10, 0
    m = _DECIMAL.match(dtype)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _is_var(dtype: Any) -> bool:
    if isinstance(dtype, dict):
        return dtype.get("type") in ("struct", "array", "map")
    if dtype in ("string", "binary") or dtype.startswith(("string", "char(", "varchar(")):
        return True
    d = _decimal_of(dtype)
    return bool(d and d[0] > 18)


def _element_size(dtype: Any) -> int:
    if isinstance(dtype, str) and dtype in _FIXED:
        return _FIXED[dtype][1]
    if isinstance(dtype, str) and _decimal_of(dtype) and not _is_var(dtype):
        return 8
    return 8


# -- encoding ------------------------------------------------------------------------------------

def encode_row(schema: dict, values: Any, where: str = "row") -> bytes:
    """The UnsafeRow bytes of ``values`` (a dict by field name, or a sequence in field order)."""
    fs = fields(schema)
    if isinstance(values, dict):
        unknown = set(values) - {f["name"] for f in fs}
        if unknown:
            raise ValueError(f"{where}: no field(s) {sorted(unknown)} in {[f['name'] for f in fs]}")
        ordered = [values.get(f["name"]) for f in fs]
    else:
        ordered = list(values)
        if len(ordered) != len(fs):
            raise ValueError(f"{where}: {len(ordered)} values for {len(fs)} fields {[f['name'] for f in fs]}")
    n = len(fs)
    bits = _bitset_bytes(n)
    head = bytearray(bits + 8 * n)
    var = bytearray()
    for i, (f, v) in enumerate(zip(fs, ordered)):
        dtype = f["type"]
        slot = bits + 8 * i
        name = f"{where}.{f['name']}"
        d = _decimal_of(dtype) if isinstance(dtype, str) else None
        if d and d[0] > 18:  # always 16 bytes reserved, even for null
            offset = len(head) + len(var)
            if v is None:
                head[i // 8] |= 1 << (i % 8)
                struct.pack_into("<Q", head, slot, offset << 32)
            else:
                unscaled = int(decimal.Decimal(v).scaleb(d[1]).to_integral_value())
                raw = unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)
                struct.pack_into("<Q", head, slot, (offset << 32) | len(raw))
                var += raw + bytes(16 - len(raw))
                continue
            var += bytes(16)
            continue
        if v is None:
            head[i // 8] |= 1 << (i % 8)
            continue
        if _is_var(dtype):
            data = _encode_var(dtype, v, name)
            offset = len(head) + len(var)
            struct.pack_into("<Q", head, slot, (offset << 32) | len(data))
            var += data + bytes(_round8(len(data)) - len(data))
        else:
            _encode_fixed(head, slot, dtype, v, name)
    return bytes(head + var)


def _encode_fixed(buf: bytearray, pos: int, dtype: Any, v: Any, name: str) -> None:
    if dtype in ("void", "null"):
        return
    d = _decimal_of(dtype) if isinstance(dtype, str) else None
    if d:
        struct.pack_into("<q", buf, pos, int(decimal.Decimal(v).scaleb(d[1]).to_integral_value()))
        return
    if dtype not in _FIXED:
        raise UnsupportedType(f"field {name!r} has type {dtype!r}, which keyedstate's offline tools do not encode")
    fmt, _ = _FIXED[dtype]
    if dtype in ("timestamp", "timestamp_ntz"):
        v = _micros(v, name)
    elif dtype == "date":
        v = _days(v, name)
    elif dtype in ("float", "double"):
        v = float(v)
    elif dtype == "boolean":
        v = bool(v)
    else:
        v = int(v)
    struct.pack_into(fmt, buf, pos, v)


def _encode_var(dtype: Any, v: Any, name: str) -> bytes:
    if isinstance(dtype, str):
        if dtype == "binary":
            return base64.b64decode(v) if isinstance(v, str) else bytes(v)
        if dtype.startswith(("string", "char(", "varchar(")):
            return str(v).encode("utf-8")
        raise UnsupportedType(f"field {name!r} has type {dtype!r}, which keyedstate's offline tools do not encode")
    kind = dtype["type"]
    if kind == "struct":
        return encode_row(dtype, v, name)
    if kind == "array":
        return _encode_array(dtype["elementType"], list(v), name)
    raise UnsupportedType(f"field {name!r} has type {kind!r}, which keyedstate's offline tools do not encode")


def _encode_array(element: Any, items: list, name: str) -> bytes:
    n = len(items)
    size = 8 if _is_var(element) else _element_size(element)
    header = 8 + _bitset_bytes(n)
    fixed = _round8(size * n)
    head = bytearray(header + fixed)
    struct.pack_into("<q", head, 0, n)
    var = bytearray()
    for i, v in enumerate(items):
        pos = header + size * i
        if v is None:
            head[8 + i // 8] |= 1 << (i % 8)
            continue
        if _is_var(element):
            data = _encode_var(element, v, f"{name}[{i}]")
            struct.pack_into("<Q", head, pos, ((len(head) + len(var)) << 32) | len(data))
            var += data + bytes(_round8(len(data)) - len(data))
        else:
            tmp = bytearray(8)
            _encode_fixed(tmp, 0, element, v, f"{name}[{i}]")
            head[pos:pos + size] = tmp[:size]
    return bytes(head + var)


def _micros(v: Any, name: str) -> int:
    if isinstance(v, bool):
        raise ValueError(f"{name}: {v!r} is not a timestamp")
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        v = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(dt.timezone.utc).replace(tzinfo=None)
        delta = v - EPOCH
        return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    raise ValueError(f"{name}: {v!r} is not a timestamp (an ISO string or epoch microseconds)")


def _days(v: Any, name: str) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str):
        v = dt.date.fromisoformat(v)
    if isinstance(v, dt.datetime):
        v = v.date()
    if isinstance(v, dt.date):
        return (v - EPOCH_DATE).days
    raise ValueError(f"{name}: {v!r} is not a date")


# -- decoding ------------------------------------------------------------------------------------

def decode_row(schema: dict, data: bytes | memoryview, offset: int = 0) -> dict[str, Any]:
    """The fields of the UnsafeRow at ``data[offset:]``, by name."""
    fs = fields(schema)
    bits = _bitset_bytes(len(fs))
    out: dict[str, Any] = {}
    for i, f in enumerate(fs):
        if data[offset + i // 8] & (1 << (i % 8)):
            out[f["name"]] = None
            continue
        out[f["name"]] = _decode_at(f["type"], data, offset, offset + bits + 8 * i, f["name"])
    return out


def _decode_at(dtype: Any, data, base: int, pos: int, name: str, size_hint: int = 8) -> Any:
    if isinstance(dtype, str):
        if dtype in ("void", "null"):
            return None
        d = _decimal_of(dtype)
        if d and d[0] <= 18:
            return decimal.Decimal(struct.unpack_from("<q", data, pos)[0]).scaleb(-d[1])
        if dtype in _FIXED:
            fmt, _ = _FIXED[dtype]
            v = struct.unpack_from(fmt, data, pos)[0]
            if dtype == "timestamp":
                return EPOCH.replace(tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=v)
            if dtype == "timestamp_ntz":
                return EPOCH + dt.timedelta(microseconds=v)
            if dtype == "date":
                return EPOCH_DATE + dt.timedelta(days=v)
            return v
    word = struct.unpack_from("<Q", data, pos)[0]
    start, length = base + (word >> 32), word & 0xFFFFFFFF
    raw = data[start:start + length]
    if isinstance(dtype, str):
        d = _decimal_of(dtype)
        if d:
            return decimal.Decimal(int.from_bytes(bytes(raw), "big", signed=True)).scaleb(-d[1])
        if dtype == "binary":
            return bytes(raw)
        if dtype.startswith(("string", "char(", "varchar(")):
            return bytes(raw).decode("utf-8")
        raise UnsupportedType(f"field {name!r} has type {dtype!r}, which keyedstate's offline tools do not decode")
    kind = dtype["type"]
    if kind == "struct":
        return decode_row(dtype, data, start)
    if kind == "array":
        return _decode_array(dtype["elementType"], data, start, name)
    if kind == "map":
        key_bytes = struct.unpack_from("<q", data, start)[0]
        keys = _decode_array(dtype["keyType"], data, start + 8, name)
        values = _decode_array(dtype["valueType"], data, start + 8 + key_bytes, name)
        return dict(zip(keys, values)) if all(isinstance(k, (str, int, float, bool)) for k in keys) \
            else list(zip(keys, values))
    if kind == "udt" and "sqlType" in dtype:
        return _decode_at(dtype["sqlType"], data, base, pos, name)
    raise UnsupportedType(f"field {name!r} has type {kind!r}, which keyedstate's offline tools do not decode")


def _decode_array(element: Any, data, start: int, name: str) -> list:
    n = struct.unpack_from("<q", data, start)[0]
    header = 8 + _bitset_bytes(n)
    size = 8 if _is_var(element) else _element_size(element)
    out = []
    for i in range(n):
        if data[start + 8 + i // 8] & (1 << (i % 8)):
            out.append(None)
            continue
        pos = start + header + size * i
        if not _is_var(element) and size < 8:
            tmp = bytes(data[pos:pos + size]) + bytes(8 - size)
            out.append(_decode_at(element, tmp, 0, 0, f"{name}[{i}]"))
        else:
            out.append(_decode_at(element, data, start, pos, f"{name}[{i}]"))
    return out


# -- JSON ----------------------------------------------------------------------------------------

def to_json_value(v: Any) -> Any:
    """A decoded value rendered for JSON."""
    if isinstance(v, dict):
        return {k: to_json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [to_json_value(x) for x in v]
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(dt.timezone.utc).replace(tzinfo=None)
            return v.isoformat() + "Z"
        return v.isoformat()
    if isinstance(v, dt.date):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, float) and v != v:
        return "NaN"
    return v
