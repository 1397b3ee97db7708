"""The message codec and the type formats, without a server: every malformed input is a
ProtocolError or ParameterError, and values have PostgreSQL's own text and binary forms."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import struct

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sqlsdc.server import arrays, codec, types
from sqlsdc.server.codec import ProtocolError, Reader
from sqlsdc.server.list_types import list_types, scalar_types
from sqlsdc.server.statement_text import parameter_types, typed_parameters, untyped_parameters


def _read(function, data: bytes, **options):
    """Run a framing function over a stream holding ``data`` then end of file."""

    async def main():
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await function(reader, **options)

    return asyncio.run(main())


def test_bind_round_trip():
    body = (b"portal\0stmt\0" + struct.pack("!hh", 1, 1) + struct.pack("!h", 2)
            + struct.pack("!i", 3) + b"abc" + struct.pack("!i", -1)
            + struct.pack("!hh", 1, 0))  # fmt: skip
    bind = codec.parse_bind(Reader(body))
    assert bind == codec.Bind("portal", "stmt", (1,), (b"abc", None), (0,))


@pytest.mark.parametrize(
    "body, message",
    [
        (b"p\0s\0" + struct.pack("!h", 1), "truncated"),
        (b"p\0s\0\0\0" + struct.pack("!h", 1) + struct.pack("!i", 99) + b"x", "truncated"),
        (b"p\0s\0\0\0" + struct.pack("!h", 1) + struct.pack("!i", -5), "negative value"),
        (b"p\0s", "terminating zero"),
        (b"p\0s\0\0\0\0\0\0\0extra", "longer than its fields"),
        (b"p\0s\0" + struct.pack("!h", -1), "negative count"),
    ],
)
def test_malformed_bind_is_a_protocol_error(body, message):
    with pytest.raises(ProtocolError, match=message):
        codec.parse_bind(Reader(body))


@pytest.mark.parametrize(
    "bind, wrong",
    [
        (codec.Bind("", "", (7,), (b"1",), ()), "unsupported format code: 7"),
        (codec.Bind("", "", (), (), (0, 5)), "unsupported format code: 5"),
        (
            codec.Bind("", "", (0, 1), (b"1", b"2", b"3"), ()),
            "bind message has 2 parameter formats but 3 parameters",
        ),
        (codec.Bind("", "", (1,), (b"1", b"2"), (0, 1)), None),
    ],
)
def test_a_bind_s_format_codes_are_judged_apart_from_its_form(bind, wrong):
    """Well-formed Binds with format codes the server does not take: the statement's error
    (PostgreSQL's ERROR), no longer the message's (which ended the session)."""
    assert codec.bind_formats_error(bind) == wrong


def test_message_length_limits():
    with pytest.raises(ProtocolError, match="out of range"):
        _read(codec.read_message, b"Q" + struct.pack("!i", 3))
    with pytest.raises(ProtocolError, match="the limit is 100 bytes"):
        _read(codec.read_message, b"Q" + struct.pack("!i", 101), limit=100)
    with pytest.raises(asyncio.IncompleteReadError):
        _read(codec.read_message, b"Q" + struct.pack("!i", 50) + b"short")
    with pytest.raises(ProtocolError, match="startup packet length"):
        _read(codec.read_startup, struct.pack("!i", 1_000_000))


@given(st.binary(max_size=80))
def test_frontend_parsers_raise_only_protocol_errors(data):
    for parse in (codec.parse_bind, codec.parse_parse, codec.parse_describe,
                  codec.parse_execute, codec.parse_close, codec.parse_query,
                  codec.parse_sasl_initial, codec.parse_startup):  # fmt: skip
        try:
            parse(Reader(data))
        except ProtocolError:
            pass


def test_error_response_fields():
    data = codec.error_response("ERROR", "42501", "refused", hint="do this")
    assert data[:1] == b"E"
    assert b"SERROR\0VERROR\0C42501\0Mrefused\0Hdo this\0\0" == data[5:]


@pytest.mark.parametrize(
    "value, expected",
    [
        # numeric_send: ndigits, weight, sign, dscale, base-10000 digits
        ("1234.5678", (2, 0, 0, 4, [1234, 5678])),
        ("-0.00012", (2, -1, 0x4000, 5, [1, 2000])),
        ("10000", (1, 1, 0, 0, [1])),
        ("0", (0, 0, 0, 0, [])),
        ("123456789012345678901", (6, 5, 0, 0, [1, 2345, 6789, 123, 4567, 8901])),
    ],
)
def test_numeric_binary(value, expected):
    data = types.numeric_binary(decimal.Decimal(value))
    ndigits, weight, sign, scale = struct.unpack("!hhHH", data[:8])
    digits = list(struct.unpack(f"!{ndigits}H", data[8:]))
    assert (ndigits, weight, sign, scale, digits) == expected
    assert types.read_parameter(data, types.NUMERIC, binary=True) == decimal.Decimal(value)


@pytest.mark.parametrize(
    "value, oid, text, binary",
    [
        (True, types.BOOL, b"t", b"\x01"),
        (-3, types.INT2, b"-3", b"\xff\xfd"),
        (7, types.INT8, b"7", struct.pack("!q", 7)),
        (0.1, types.FLOAT8, b"0.1", struct.pack("!d", 0.1)),
        (100.0, types.FLOAT8, b"100", struct.pack("!d", 100.0)),
        (float("inf"), types.FLOAT8, b"Infinity", struct.pack("!d", float("inf"))),
        (dt.date(2000, 1, 2), types.DATE, b"2000-01-02", struct.pack("!i", 1)),
        (dt.datetime(2000, 1, 1, 0, 0, 1), types.TIMESTAMP, b"2000-01-01 00:00:01",
         struct.pack("!q", 1_000_000)),
        (dt.datetime(2000, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1))),
         types.TIMESTAMPTZ, b"2000-01-01 00:00:00+00", struct.pack("!q", 0)),
        (dt.timedelta(days=1, seconds=3661), types.INTERVAL, b"1 day 01:01:01",
         struct.pack("!qii", 3661_000_000, 1, 0)),
        ("Zürich", types.TEXT, "Zürich".encode(), "Zürich".encode()),
    ],
)  # fmt: skip
def test_value_formats(value, oid, text, binary):
    assert types.text_value(value, oid) == text
    assert types.binary_value(value, oid) == binary


@pytest.mark.parametrize(
    "arrow_type, oid",
    [(pa.int64(), types.INT8), (pa.int32(), types.INT4), (pa.int16(), types.INT2),
     (pa.uint64(), types.NUMERIC), (pa.float64(), types.FLOAT8), (pa.float32(), types.FLOAT4),
     (pa.decimal128(38, 0), types.NUMERIC), (pa.string(), types.TEXT), (pa.bool_(), types.BOOL),
     (pa.date32(), types.DATE), (pa.timestamp("us"), types.TIMESTAMP),
     (pa.timestamp("us", tz="UTC"), types.TIMESTAMPTZ), (pa.null(), types.TEXT)],
)  # fmt: skip
def test_type_oids(arrow_type, oid):
    assert types.oid_of(arrow_type) == oid


def test_parameters_in():
    assert types.read_parameter(b"42", types.INT4, binary=False) == 42
    assert types.read_parameter(struct.pack("!i", 42), types.INT4, binary=True) == 42
    assert types.read_parameter(b"on", types.BOOL, binary=False) is True
    assert types.read_parameter(b"R01", 0, binary=False) == "R01"
    assert types.read_parameter(None, types.INT8, binary=False) is None
    assert types.read_parameter(b"2024-02-29 10:00:00+01", types.TIMESTAMPTZ, binary=False) == (
        dt.datetime(2024, 2, 29, 9)
    )
    with pytest.raises(types.ParameterError, match="not a valid value of type OID 23"):
        types.read_parameter(b"forty", types.INT4, binary=False)
    with pytest.raises(types.ParameterError, match="not a valid value"):
        types.read_parameter(b"\x00", types.INT4, binary=True)


def test_parameter_types_from_the_client_then_casts_then_text():
    assert parameter_types("SELECT $1, $2::int, CAST($3 AS date)", (types.INT8,)) == (
        types.INT8, types.INT4, types.DATE)  # fmt: skip
    assert parameter_types("SELECT 1", ()) == ()


def test_parameter_types_of_array_casts_are_arrays_of_their_elements():
    sql = "WHERE a = ANY($1::text[]) AND b = ANY(CAST($2 AS INT [ ])) AND c = ANY($3::date[])"
    assert parameter_types(sql, ()) == (1009, 1007, 1182)  # text[], int4[], date[]
    assert parameter_types("WHERE a = ANY($1::interval[])", ()) == (arrays.TEXT_ARRAY,)
    assert parameter_types("WHERE a = ANY($1::text[]) AND b = $2::text", (types.INT8,)) == (
        types.INT8, types.TEXT)  # fmt: skip


SCHEMA = {"persons": {"id": "BIGINT", "age": "INTEGER", "region": "VARCHAR", "born": "DATE",
                      "income": "DECIMAL(18,2)"},
          "visits": {"id": "BIGINT", "region": "VARCHAR"}}  # fmt: skip


@pytest.mark.parametrize(
    "sql, expected",
    [
        ("SELECT COUNT(*) FROM persons WHERE age = ANY($1) AND region = ANY($2)",
         {1: arrays.ARRAY_OF[types.INT4], 2: arrays.ARRAY_OF[types.VARCHAR]}),
        ("SELECT COUNT(*) FROM persons p JOIN visits v ON p.id = v.id WHERE v.region = "
         "ANY($1) AND p.born = ANY($2) AND income = ANY($3)",
         {1: arrays.ARRAY_OF[types.VARCHAR], 2: arrays.ARRAY_OF[types.DATE],
          3: arrays.ARRAY_OF[types.NUMERIC]}),
        ("SELECT COUNT(*) FROM persons p JOIN visits v ON p.id = v.id WHERE region = ANY($1)",
         {}),  # two tables have a region: not plainly one column
        ("WITH t AS (SELECT CAST(age AS TEXT) AS age FROM persons) SELECT COUNT(*) FROM t "
         "WHERE age = ANY($1)", {}),  # a CTE's column is not its table's
        ("SELECT COUNT(*) FROM other WHERE age = ANY($1)", {}),  # not a table of the policy
        ("SELECT COUNT(*) FROM persons WHERE age <> ANY($1)", {}),  # only = ANY
    ],
)  # fmt: skip
def test_an_untyped_list_under_any_takes_its_columns_type(sql, expected):
    """PostgreSQL types ``column = ANY($1)`` as an array of the column's type; sqlsdc typed
    it text[] whatever the column, so asyncpg (which encodes a list as the server describes
    it) refused a list of integers. Where the column is not plainly one, it stays text[]."""
    assert list_types(sql, {1, 2, 3}, SCHEMA) == expected


@pytest.mark.parametrize(
    "sql, expected",
    [
        ("SELECT region, COUNT(*) FROM persons WHERE age > $1 AND $2 = region AND income "
         "BETWEEN $3 AND $3 AND born IN ($4, $4) GROUP BY region LIMIT $5 OFFSET $6",
         {1: types.INT4, 2: types.VARCHAR, 3: types.NUMERIC, 4: types.DATE, 5: types.INT8,
          6: types.INT8}),
        ("SELECT COUNT(*) FROM persons p JOIN visits v ON p.id = v.id WHERE v.region = $1 "
         "AND region = $2", {1: types.VARCHAR}),  # region: two tables have one
        ("SELECT COUNT(*) FROM persons WHERE age > $1 AND region = $1", {}),  # two types
        ("SELECT COUNT(*) FROM persons WHERE age + 1 > $1 AND $2 > 3", {}),  # no plain column
        ("WITH t AS (SELECT age FROM persons) SELECT COUNT(*) FROM t WHERE age > $1", {}),
        ("SELECT COUNT(*) FROM other WHERE age > $1", {}),  # not a table of the policy
    ],
)  # fmt: skip
def test_an_untyped_scalar_takes_the_type_where_it_stands(sql, expected):
    """PostgreSQL types ``age > $1`` an ``int4`` and ``LIMIT $1`` an ``int8``; sqlsdc
    described them as text, so asyncpg refused ``fetch("... WHERE age > $1", 40)`` ("expected
    str, got int"; red team s49e). Where the column is not plainly one, the type stays."""
    assert scalar_types(sql, {1, 2, 3, 4, 5, 6}, SCHEMA) == expected


def test_only_parameters_nothing_typed_are_untyped():
    sql = "SELECT 1 FROM persons WHERE a > $1 AND b > $2::int AND c = ANY($3) AND d > $4"
    assert untyped_parameters(sql, (0, 0, 0, types.TEXT)) == {1}


def test_only_untyped_lists_under_any_are_left_to_their_column():
    """A list typed by the client or by a cast keeps that type; only an untyped one is typed
    by its column."""
    sql = "SELECT 1 FROM persons WHERE a = ANY($1) AND b = ANY($2::int[]) AND c = ANY($3)"
    kinds, lists = typed_parameters(sql, (0, 0, types.TEXT))
    assert kinds == (arrays.TEXT_ARRAY, arrays.ARRAY_OF[types.INT4], types.TEXT)
    assert lists == {1}
