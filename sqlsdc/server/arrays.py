"""One-dimensional array parameters (``text[]``, ``int4[]``...) as Python lists.

psycopg sends a Python list as an array parameter, for ``col = ANY(%s)``; the guard binds a
list there as the IN list of its values (:mod:`sqlsdc.guard.list_parameters`) and refuses it
anywhere else. Formats are PostgreSQL's ``array_out``/``array_recv``: text ``{a,"b c",NULL}``
(double quotes and backslash escapes; an unquoted ``NULL`` is a null), binary as dimensions,
flags, element type and length-prefixed elements. An array of more than one dimension, with
explicit bounds (``[2:3]={...}``) or not well formed is refused (SQLSTATE 22P02).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

ELEMENTS = {  # array type OID -> element type OID (pg_type's typelem)
    1000: 16,  # bool
    1005: 21,  # int2
    1007: 23,  # int4
    1016: 20,  # int8
    1028: 26,  # oid
    1009: 25,  # text
    1015: 1043,  # varchar
    1021: 700,  # float4
    1022: 701,  # float8
    1231: 1700,  # numeric
    1182: 1082,  # date
    1115: 1114,  # timestamp
    1185: 1184,  # timestamptz
}

ARRAY_OF = {element: array for array, element in ELEMENTS.items()}  # element OID -> array OID
TEXT_ARRAY = 1009

Reader = Callable[[bytes | None, int, bool], object]  # (data, element OID, binary) -> value


class ArrayError(ValueError):
    """An array parameter that is not one well-formed dimension."""


def read_array(data: bytes, oid: int, binary: bool, read: Reader) -> list:
    """The values of an array parameter of type ``oid``, each read by ``read`` as its element
    type in the same format."""
    element = ELEMENTS[oid]
    if binary:
        return [read(item, element, True) for item in _binary_items(data, element)]
    return [None if item is None else read(item.encode(), element, False)
            for item in _text_items(data.decode("utf-8"))]  # fmt: skip


def _binary_items(data: bytes, element: int) -> list[bytes | None]:
    ndim, _flags, given = struct.unpack_from("!iiI", data)
    if ndim == 0:
        if len(data) != 12:
            raise ArrayError("malformed binary array")
        return []
    if ndim != 1:
        raise ArrayError("array parameters of more than one dimension are not supported")
    if given != element:
        raise ArrayError(f"an array of element type OID {given} sent as one of OID {element}")
    count, _lower = struct.unpack_from("!ii", data, 12)
    if count < 0:
        raise ArrayError("malformed binary array")
    items, at = [], 20
    for _ in range(count):
        (length,) = struct.unpack_from("!i", data, at)
        at += 4
        if length < 0:
            items.append(None)
            continue
        if at + length > len(data):
            raise ArrayError("malformed binary array")
        items.append(data[at : at + length])
        at += length
    if at != len(data):
        raise ArrayError("malformed binary array")
    return items


def _text_items(text: str) -> list[str | None]:
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise ArrayError("an array parameter is written {value, ...}")
    body, items, i = text[1:-1], [], 0
    if not body.strip():
        return []
    while True:
        item, i = _text_item(body, i)
        items.append(item)
        if i == len(body):
            return items
        i += 1  # the comma


def _text_item(body: str, i: int) -> tuple[str | None, int]:
    """The element starting at ``body[i]`` and the position of the comma or end after it."""
    while i < len(body) and body[i].isspace():
        i += 1
    quoted, chars = i < len(body) and body[i] == '"', []
    i += quoted
    while i < len(body):
        char = body[i]
        if char == "\\":
            if i + 1 == len(body):
                raise ArrayError("malformed array parameter")
            chars.append(body[i + 1])
            i += 2
            continue
        if quoted and char == '"':
            i += 1
            break
        if not quoted and char in ',"':
            break
        if not quoted and char in "{}":
            raise ArrayError("array parameters of more than one dimension are not supported")
        chars.append(char)
        i += 1
    else:
        if quoted:
            raise ArrayError("malformed array parameter")
    while i < len(body) and body[i].isspace():
        i += 1
    if i < len(body) and body[i] != ",":
        raise ArrayError("malformed array parameter")
    value = "".join(chars)
    if not quoted:
        value = value.rstrip()
        if not value:
            raise ArrayError("malformed array parameter")
        if value.upper() == "NULL":
            return None, i
    return value, i
