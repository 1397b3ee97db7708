"""PostgreSQL protocol v3 messages: framing, frontend parsing and backend encoding.

The wire format of "Frontend/Backend Protocol", chapter 55 of the PostgreSQL documentation
(section 55.7, "Message Formats"). This module is pure (bytes in, bytes out, no I/O): the
session (:mod:`sqlsdc.server.session`) reads frames with :func:`read_startup` and
:func:`read_message` and parses them here. Every length is checked against the bytes present
and against :data:`MAX_MESSAGE_BYTES`, so a malformed or hostile message raises
:class:`ProtocolError` instead of allocating or reading past its end.

No maintained Python codec for the *server* side was found on PyPI (see README, "Live BI");
this one implements only the messages sqlsdc needs.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

PROTOCOL_3_0 = 196608  # 3 << 16
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
MAX_STARTUP_BYTES = 10_000
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # a statement or a Bind's parameters; larger is refused

_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")
_HEADER = struct.Struct("!ci")


class ProtocolError(Exception):
    """A frontend message is malformed, truncated, too large or unexpected (SQLSTATE 08P01).
    The message is the server's own words; it is sent to the client as a FATAL error."""


class InvalidEncoding(ProtocolError):
    """A string of a message is not valid UTF-8. In a message of a session, PostgreSQL's
    ``invalid byte sequence for encoding "UTF8"``: an ERROR with SQLSTATE 22021
    (character_not_in_repertoire), and the session goes on (the message was read whole, so
    the stream is still in step); in the startup packet it stays a FATAL 08P01."""


class Reader:
    """Reads the fields of one message body; every read checks the bytes left."""

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ProtocolError("truncated message")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def int16(self) -> int:
        return _I16.unpack(self._take(2))[0]

    def int32(self) -> int:
        return _I32.unpack(self._take(4))[0]

    def byte(self) -> bytes:
        return self._take(1)

    def cstring(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise ProtocolError("string without its terminating zero byte")
        raw = self.data[self.pos : end]
        self.pos = end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            shown = " ".join(f"0x{b:02x}" for b in raw[e.start : e.end])
            raise InvalidEncoding(f'invalid byte sequence for encoding "UTF8": {shown}') from None

    def value(self) -> bytes | None:
        """An int32 length then that many bytes; length -1 is NULL."""
        n = self.int32()
        if n == -1:
            return None
        if n < -1:
            raise ProtocolError("negative value length")
        return self._take(n)

    def count(self) -> int:
        """An int16 count of the items that follow (never negative)."""
        n = self.int16()
        if n < 0:
            raise ProtocolError("negative count")
        return n

    def rest(self) -> bytes:
        return self._take(len(self.data) - self.pos)

    def end(self) -> None:
        if self.pos != len(self.data):
            raise ProtocolError("message longer than its fields")


# --- framing ---------------------------------------------------------------------------------


async def read_startup(reader: asyncio.StreamReader) -> tuple[int, Reader]:
    """The first packet of a connection: (protocol code, reader over the rest)."""
    length = _I32.unpack(await reader.readexactly(4))[0]
    if not 8 <= length <= MAX_STARTUP_BYTES:
        raise ProtocolError(f"startup packet length {length} is out of range")
    body = await reader.readexactly(length - 4)
    return _I32.unpack(body[:4])[0], Reader(body[4:])


async def read_message(reader: asyncio.StreamReader, limit: int = MAX_MESSAGE_BYTES):
    """One typed frontend message: (type byte, reader over its body)."""
    kind, length = _HEADER.unpack(await reader.readexactly(5))
    if not 4 <= length <= limit:
        raise ProtocolError(
            f"message of {length} bytes is out of range (the limit is {limit} bytes)"
        )
    return kind, Reader(await reader.readexactly(length - 4))


def parse_startup(body: Reader) -> dict[str, str]:
    """Key/value parameters of a StartupMessage."""
    params: dict[str, str] = {}
    while True:
        key = body.cstring()
        if not key:
            break
        params[key] = body.cstring()
        if len(params) > 64:
            raise ProtocolError("too many startup parameters")
    body.end()
    return params


# --- frontend messages -------------------------------------------------------------------------


@dataclass(frozen=True)
class Parse:
    name: str
    sql: str
    param_types: tuple[int, ...]


@dataclass(frozen=True)
class Bind:
    portal: str
    statement: str
    param_formats: tuple[int, ...]
    params: tuple[bytes | None, ...]
    result_formats: tuple[int, ...]


@dataclass(frozen=True)
class Describe:
    kind: str  # "S" statement or "P" portal
    name: str


@dataclass(frozen=True)
class Execute:
    portal: str
    max_rows: int


@dataclass(frozen=True)
class Close:
    kind: str
    name: str


def _formats(body: Reader) -> tuple[int, ...]:
    """Format codes as sent: which ones the server takes is the statement's error, not the
    message's (:func:`bind_formats_error`)."""
    return tuple(body.int16() for _ in range(body.count()))


def _kind(body: Reader) -> str:
    kind = body.byte().decode("latin-1")
    if kind not in ("S", "P"):
        raise ProtocolError("Describe and Close take 'S' (statement) or 'P' (portal)")
    return kind


def parse_query(body: Reader) -> str:
    sql = body.cstring()
    body.end()
    return sql


def parse_parse(body: Reader) -> Parse:
    name, sql = body.cstring(), body.cstring()
    types = tuple(body.int32() for _ in range(body.count()))
    body.end()
    return Parse(name, sql, types)


def parse_bind(body: Reader) -> Bind:
    portal, statement = body.cstring(), body.cstring()
    param_formats = _formats(body)
    params = tuple(body.value() for _ in range(body.count()))
    result_formats = _formats(body)
    body.end()
    return Bind(portal, statement, param_formats, params, result_formats)


def bind_formats_error(bind: Bind) -> str | None:
    """What is wrong with a well-formed Bind's format codes, or None. PostgreSQL answers these
    with an ERROR and goes on with the session (a code other than 0 or 1, as many parameter
    formats as neither 0, 1 nor the parameters); they ended the session here (red team s47g)."""
    codes = sorted({f for f in bind.param_formats + bind.result_formats if f not in (0, 1)})
    if codes:
        return f"unsupported format code: {codes[0]}"
    if len(bind.param_formats) not in (0, 1, len(bind.params)):
        return (f"bind message has {len(bind.param_formats)} parameter formats but "
                f"{len(bind.params)} parameters")  # fmt: skip
    return None


def parse_describe(body: Reader) -> Describe:
    kind, name = _kind(body), body.cstring()
    body.end()
    return Describe(kind, name)


def parse_execute(body: Reader) -> Execute:
    portal, max_rows = body.cstring(), body.int32()
    body.end()
    return Execute(portal, max(max_rows, 0))


def parse_close(body: Reader) -> Close:
    kind, name = _kind(body), body.cstring()
    body.end()
    return Close(kind, name)


def parse_sasl_initial(body: Reader) -> tuple[str, bytes]:
    mechanism = body.cstring()
    data = body.value()
    body.end()
    return mechanism, data or b""


# --- backend messages --------------------------------------------------------------------------


def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + _I32.pack(len(body) + 4) + body


def cstr(text: str) -> bytes:
    return text.replace("\0", "").encode("utf-8") + b"\0"


def authentication(code: int, data: bytes = b"") -> bytes:
    return message(b"R", _I32.pack(code) + data)


AUTH_OK, AUTH_SASL, AUTH_SASL_CONTINUE, AUTH_SASL_FINAL = 0, 10, 11, 12


def sasl_mechanisms(*names: str) -> bytes:
    return authentication(AUTH_SASL, b"".join(cstr(n) for n in names) + b"\0")


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", cstr(name) + cstr(value))


def backend_key_data(pid: int, secret: int) -> bytes:
    return message(b"K", _I32.pack(pid) + _I32.pack(secret))


def ready_for_query(status: str) -> bytes:
    return message(b"Z", status.encode("ascii"))


def negotiate_protocol_version(minor: int, unknown: list[str]) -> bytes:
    body = _I32.pack(minor) + _I32.pack(len(unknown)) + b"".join(cstr(u) for u in unknown)
    return message(b"v", body)


def row_description(fields: list[tuple[str, int, int, int]]) -> bytes:
    """``fields``: (name, type OID, type size, format code) per column."""
    parts = [_I16.pack(len(fields))]
    for name, oid, size, fmt in fields:
        parts.append(cstr(name) + struct.pack("!ihihih", 0, 0, oid, size, -1, fmt))
    return message(b"T", b"".join(parts))


def parameter_description(oids: tuple[int, ...]) -> bytes:
    """The parameters' type OIDs; the count is an unsigned 16-bit number (at most 65535)."""
    return message(b"t", struct.pack("!H", len(oids)) + b"".join(_I32.pack(o) for o in oids))


def data_row(values: list[bytes | None]) -> bytes:
    parts = [_I16.pack(len(values))]
    for v in values:
        parts.append(b"\xff\xff\xff\xff" if v is None else _I32.pack(len(v)) + v)
    return message(b"D", b"".join(parts))


def command_complete(tag: str) -> bytes:
    return message(b"C", cstr(tag))


PARSE_COMPLETE = message(b"1")
BIND_COMPLETE = message(b"2")
CLOSE_COMPLETE = message(b"3")
NO_DATA = message(b"n")
EMPTY_QUERY = message(b"I")
PORTAL_SUSPENDED = message(b"s")


def error_response(
    severity: str, code: str, text: str, *, hint: str = "", detail: str = "", notice: bool = False
) -> bytes:
    """An ErrorResponse (or NoticeResponse) with severity, SQLSTATE, message and hint."""
    fields = [b"S" + cstr(severity), b"V" + cstr(severity), b"C" + cstr(code), b"M" + cstr(text)]
    if detail:
        fields.append(b"D" + cstr(detail))
    if hint:
        fields.append(b"H" + cstr(hint))
    return message(b"N" if notice else b"E", b"".join(fields) + b"\0")
