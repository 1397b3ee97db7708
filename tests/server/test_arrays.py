"""Array parameters read as lists (:mod:`sqlsdc.server.arrays`), in PostgreSQL's text and
binary formats; anything but one well-formed dimension is refused."""

from __future__ import annotations

import struct

import pytest

from sqlsdc.server import types
from sqlsdc.server.types import ParameterError

TEXT_ARRAY, INT4_ARRAY, INT8_ARRAY = 1009, 1007, 1016


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("{}", []),
        ("{R01,R03}", ["R01", "R03"]),
        ('{ a , "b c" ,NULL,"NULL",null}', ["a", "b c", None, "NULL", None]),
        (r'{"x,\"y\"",a\,b,"{}"}', ['x,"y"', "a,b", "{}"]),
    ],
)
def test_text_arrays(text, values):
    assert types.read_parameter(text.encode(), TEXT_ARRAY, False) == values


def test_elements_are_read_as_their_type():
    assert types.read_parameter(b"{1, -2,NULL}", INT4_ARRAY, False) == [1, -2, None]
    with pytest.raises(ParameterError):
        types.read_parameter(b"{1,x}", INT4_ARRAY, False)


@pytest.mark.parametrize(
    "text",
    ["R01", "{{1,2},{3,4}}", "[1:2]={1,2}", "{1,,2}", '{"a}', "{a,}", '{"a"b}', "{a\\}"],
)
def test_malformed_or_nested_text_arrays_are_refused(text):
    with pytest.raises(ParameterError):
        types.read_parameter(text.encode(), TEXT_ARRAY, False)


def _binary(elements: list[bytes | None], element_oid: int = 20, ndim: int = 1) -> bytes:
    data = struct.pack("!iiIii", ndim, 0, element_oid, len(elements), 1)
    for e in elements:
        data += struct.pack("!i", -1) if e is None else struct.pack("!i", len(e)) + e
    return data


def test_binary_arrays():
    items = [struct.pack("!q", 5), None, struct.pack("!q", -7)]
    assert types.read_parameter(_binary(items), INT8_ARRAY, True) == [5, None, -7]
    assert types.read_parameter(struct.pack("!iiI", 0, 0, 20), INT8_ARRAY, True) == []


@pytest.mark.parametrize(
    "data",
    [
        _binary([struct.pack("!q", 5)], element_oid=23),  # another element type
        _binary([struct.pack("!q", 5)], ndim=2),
        _binary([struct.pack("!q", 5)])[:-1],  # truncated
        _binary([struct.pack("!q", 5)]) + b"\0",  # trailing bytes
        _binary([struct.pack("!i", 5)]),  # an element of the wrong width
        b"\0\0",
    ],
)
def test_malformed_binary_arrays_are_refused(data):
    with pytest.raises(ParameterError):
        types.read_parameter(data, INT8_ARRAY, True)


def test_psycopgs_text_arrays_read_back_as_the_lists_dumped():
    """What psycopg writes for a list of str (quotes, backslashes, braces, commas, blanks,
    ``NULL`` as text and as a null, empty strings, non-ASCII) reads back as that list."""
    adapt = pytest.importorskip("psycopg.adapt")
    import random

    rng = random.Random(41)
    alphabet = ["a", "Z", " ", ",", '"', "\\", "{", "}", "é", "N", "U", "L", "\t"]
    transformer = adapt.Transformer()
    for _ in range(300):
        values = [
            None if rng.random() < 0.1 else
            rng.choice(["NULL", "null", ""]) if rng.random() < 0.1 else
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6)))
            for _ in range(rng.randint(1, 5))
        ]  # fmt: skip
        dumped = bytes(transformer.get_dumper(values, adapt.PyFormat.TEXT).dump(values))
        assert types.read_parameter(dumped, TEXT_ARRAY, False) == values, dumped
