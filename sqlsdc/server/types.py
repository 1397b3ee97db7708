"""PostgreSQL type OIDs and the text and binary formats of sqlsdc's result types.

Arrow result columns map to the PostgreSQL types of ``pg_type`` (OIDs fixed since PostgreSQL 7):
integers to int2/int4/int8 (an unsigned type to the next wider one, UBIGINT and HUGEINT to
numeric), floats to float4/float8, decimals to numeric, strings to text, dates, timestamps
(with or without time zone), times, intervals, booleans. Text formats follow PostgreSQL's output
functions (``boolout``, ``float8out`` with shortest round-trip digits, ISO dates with the
session's ``DateStyle = ISO, MDY`` and ``TimeZone = UTC``); binary formats follow the ``*send``
functions (big-endian integers and IEEE floats, dates as days and timestamps as microseconds
since 2000-01-01, numeric as base-10000 digits).
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import struct
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from sqlsdc.server import arrays

BOOL, BYTEA, INT8, INT2, INT4, TEXT, FLOAT4, FLOAT8 = 16, 17, 20, 21, 23, 25, 700, 701
OID = 26  # object identifiers: asyncpg's type introspection binds an oid[] of them
UNKNOWN, VARCHAR, DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, NUMERIC = (
    705, 1043, 1082, 1083, 1114, 1184, 1186, 1700)  # fmt: skip

SIZES = {BOOL: 1, INT2: 2, INT4: 4, INT8: 8, FLOAT4: 4, FLOAT8: 8, DATE: 4, TIME: 8,
         TIMESTAMP: 8, TIMESTAMPTZ: 8, INTERVAL: 16}  # fmt: skip
NAMES = {"bool": BOOL, "boolean": BOOL, "smallint": INT2, "int2": INT2, "int": INT4,
         "integer": INT4, "int4": INT4, "bigint": INT8, "int8": INT8, "oid": OID, "real": FLOAT4,
         "float4": FLOAT4, "float": FLOAT8, "double": FLOAT8, "float8": FLOAT8,
         "decimal": NUMERIC, "numeric": NUMERIC, "text": TEXT, "varchar": VARCHAR,
         "date": DATE, "timestamp": TIMESTAMP, "timestamptz": TIMESTAMPTZ}  # fmt: skip
"""Type names as written in a cast (``$1::int``), for the parameter types of a statement."""

EPOCH = dt.date(2000, 1, 1)
EPOCH_TS = dt.datetime(2000, 1, 1)
_POSTGRES_EPOCH_DAYS = EPOCH.toordinal()


class ParameterError(ValueError):
    """A parameter value cannot be read as its declared type (SQLSTATE 22P02)."""


def oid_of(arrow_type: pa.DataType) -> int:
    """The PostgreSQL type of an Arrow result column."""
    t = arrow_type
    if pa.types.is_dictionary(t):
        return oid_of(t.value_type)
    if pa.types.is_boolean(t):
        return BOOL
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint8(t):
        return INT2
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return INT4
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return INT8
    if pa.types.is_uint64(t) or pa.types.is_decimal(t):
        return NUMERIC
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return FLOAT4
    if pa.types.is_float64(t):
        return FLOAT8
    if pa.types.is_date(t):
        return DATE
    if pa.types.is_timestamp(t):
        return TIMESTAMPTZ if t.tz else TIMESTAMP
    if pa.types.is_time(t):
        return TIME
    if pa.types.is_duration(t) or t == pa.month_day_nano_interval():
        return INTERVAL
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return BYTEA
    return TEXT  # strings, NULL columns and anything nested: shown as text


def size_of(oid: int) -> int:
    return SIZES.get(oid, -1)


# --- values out --------------------------------------------------------------------------------


def _float_text(value: float, oid: int) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    text = str(np.float32(value)) if oid == FLOAT4 else repr(value)
    return text[:-2] if text.endswith(".0") else text


def _interval_parts(value) -> tuple[int, int, int]:
    """(months, days, microseconds) of an Arrow interval or duration value."""
    if isinstance(value, dt.timedelta):
        return 0, value.days, value.seconds * 1_000_000 + value.microseconds
    months, days, nanos = value.months, value.days, value.nanoseconds
    return months, days, nanos // 1000


def _interval_text(value) -> str:
    months, days, micros = _interval_parts(value)
    parts = []
    years, months = divmod(months, 12)
    for amount, unit in ((years, "year"), (months, "mon"), (days, "day")):
        if amount:
            parts.append(f"{amount} {unit}{'s' if abs(amount) != 1 else ''}")
    if micros or not parts:
        sign = "-" if micros < 0 else ""
        seconds, micro = divmod(abs(micros), 1_000_000)
        minutes, second = divmod(seconds, 60)
        hours, minute = divmod(minutes, 60)
        frac = f".{micro:06d}".rstrip("0") if micro else ""
        parts.append(f"{sign}{hours:02d}:{minute:02d}:{second:02d}{frac}")
    return " ".join(parts)


def text_value(value, oid: int) -> bytes:
    """PostgreSQL's text output of one non-NULL value."""
    if oid == BOOL:
        return b"t" if value else b"f"
    if oid in (FLOAT4, FLOAT8):
        return _float_text(float(value), oid).encode()
    if oid == NUMERIC:
        return format(decimal.Decimal(value), "f").encode()
    if oid == TIMESTAMPTZ:
        utc = value.astimezone(dt.UTC).replace(tzinfo=None)
        return (utc.isoformat(sep=" ") + "+00").encode()
    if oid in (TIMESTAMP, DATE, TIME):
        return (value.isoformat(sep=" ") if oid == TIMESTAMP else value.isoformat()).encode()
    if oid == INTERVAL:
        return _interval_text(value).encode()
    if oid == BYTEA:
        return b"\\x" + bytes(value).hex().encode()
    return str(value).encode("utf-8")


def numeric_binary(value: decimal.Decimal) -> bytes:
    """``numeric_send``: ndigits, weight, sign, dscale, then base-10000 digits."""
    if value.is_nan():
        return struct.pack("!hhHH", 0, 0, 0xC000, 0)
    if value.is_infinite():
        return struct.pack("!hhHH", 0, 0, 0xF000 if value < 0 else 0xD000, 0)
    sign, digits, exponent = value.as_tuple()
    text = "".join(map(str, digits))
    scale = max(0, -exponent)
    if exponent > 0:
        text += "0" * exponent
        exponent = 0
    point = len(text) + exponent  # digits before the decimal point
    whole = text[:point] if point > 0 else ""
    fraction = text[point:] if point >= 0 else "0" * -point + text
    whole = whole.lstrip("0")
    whole = "0" * (-len(whole) % 4) + whole
    fraction += "0" * (-len(fraction) % 4)
    groups = [int(whole[i : i + 4]) for i in range(0, len(whole), 4)]
    groups += [int(fraction[i : i + 4]) for i in range(0, len(fraction), 4)]
    weight = len(whole) // 4 - 1
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    head = struct.pack("!hhHH", len(groups), weight, 0x4000 if sign else 0, scale)
    return head + struct.pack(f"!{len(groups)}H", *groups)


def binary_value(value, oid: int) -> bytes:
    """PostgreSQL's binary (``*send``) output of one non-NULL value."""
    if oid == BOOL:
        return b"\x01" if value else b"\x00"
    if oid in (INT2, INT4, INT8):
        return struct.pack({INT2: "!h", INT4: "!i", INT8: "!q"}[oid], value)
    if oid == FLOAT4:
        return struct.pack("!f", value)
    if oid == FLOAT8:
        return struct.pack("!d", value)
    if oid == NUMERIC:
        return numeric_binary(decimal.Decimal(value))
    if oid == DATE:
        return struct.pack("!i", value.toordinal() - _POSTGRES_EPOCH_DAYS)
    if oid in (TIMESTAMP, TIMESTAMPTZ):
        if oid == TIMESTAMPTZ:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        delta = value - EPOCH_TS
        return struct.pack("!q", (delta.days * 86400 + delta.seconds) * 1_000_000
                           + delta.microseconds)  # fmt: skip
    if oid == TIME:
        micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000
        return struct.pack("!q", micros + value.microsecond)
    if oid == INTERVAL:
        months, days, micros = _interval_parts(value)
        return struct.pack("!qii", micros, days, months)
    if oid == BYTEA:
        return bytes(value)
    return text_value(value, oid)


# --- parameters in -----------------------------------------------------------------------------


def _bool_text(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("t", "true", "y", "yes", "on", "1"):
        return True
    if lowered in ("f", "false", "n", "no", "off", "0"):
        return False
    raise ParameterError(f"invalid input for type boolean: {text!r}")


def _timestamp_text(text: str, oid: int) -> dt.datetime:
    value = dt.datetime.fromisoformat(text.strip().replace(" ", "T", 1))
    if value.tzinfo is not None:  # a TIMESTAMP literal in UTC, as the session's time zone
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


_TEXT_READERS: dict[int, Callable[[str], object]] = {
    BOOL: _bool_text,
    INT2: int,
    INT4: int,
    INT8: int,
    OID: int,
    FLOAT4: float,
    FLOAT8: float,
    NUMERIC: decimal.Decimal,
    DATE: lambda s: dt.date.fromisoformat(s.strip()),
    TIMESTAMP: lambda s: _timestamp_text(s, TIMESTAMP),
    TIMESTAMPTZ: lambda s: _timestamp_text(s, TIMESTAMPTZ),
}


def _numeric_from_binary(data: bytes) -> decimal.Decimal:
    ndigits, weight, sign, scale = struct.unpack("!hhHH", data[:8])
    if sign == 0xC000:
        return decimal.Decimal("NaN")
    if ndigits < 0 or len(data) != 8 + 2 * ndigits:
        raise ParameterError("malformed binary numeric")
    digits = struct.unpack(f"!{ndigits}H", data[8:])
    value = sum((decimal.Decimal(d) * decimal.Decimal(10000) ** (weight - i)
                 for i, d in enumerate(digits)), decimal.Decimal(0))  # fmt: skip
    value = -value if sign == 0x4000 else value
    return value.quantize(decimal.Decimal(1).scaleb(-scale)) if scale < 1000 else value


def _binary_reader(oid: int) -> Callable[[bytes], object] | None:
    fixed = {BOOL: "!?", INT2: "!h", INT4: "!i", INT8: "!q", FLOAT4: "!f", FLOAT8: "!d",
             OID: "!I"}  # fmt: skip
    if oid in fixed:
        return lambda data: struct.unpack(fixed[oid], data)[0]
    if oid == DATE:
        return lambda data: dt.date.fromordinal(struct.unpack("!i", data)[0]
                                                + _POSTGRES_EPOCH_DAYS)  # fmt: skip
    if oid in (TIMESTAMP, TIMESTAMPTZ):
        return lambda data: EPOCH_TS + dt.timedelta(microseconds=struct.unpack("!q", data)[0])
    if oid == NUMERIC:
        return _numeric_from_binary
    if oid in (TEXT, VARCHAR, UNKNOWN, 0):
        return lambda data: data.decode("utf-8")
    return None


def read_parameter(data: bytes | None, oid: int, binary: bool):
    """A parameter of a Bind message as the Python value the guard binds as a literal."""
    if data is None:
        return None
    try:
        if oid in arrays.ELEMENTS:  # a list, for col = ANY($1)
            return arrays.read_array(data, oid, binary, read_parameter)
        if binary:
            reader = _binary_reader(oid)
            if reader is None:
                raise ParameterError(f"binary parameters of type OID {oid} are not supported")
            return reader(data)
        text = data.decode("utf-8")
        return _TEXT_READERS.get(oid, str)(text)
    except (ValueError, struct.error, decimal.InvalidOperation, OverflowError) as e:
        if isinstance(e, ParameterError):
            raise
        if isinstance(e, arrays.ArrayError):
            raise ParameterError(str(e)) from None
        raise ParameterError(f"a parameter value is not a valid value of type OID {oid}") from None
