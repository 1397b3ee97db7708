"""Red team s50n: the extended protocol's orders around a statement described before its
parameters are sent (s50m's mark, :mod:`sqlsdc.guard.unbound`). Describing accepts
``employees > $1`` whatever ``$1`` will be; each order below binds 49, off the class breaks
of employees, and must be refused when it runs (42501), never answered from the describe.
Held on int50 (a regression test: each passes there)."""

from __future__ import annotations

import struct

import pytest

from sqlsdc.server import codec
from tests.server.test_protocol import error_code, login, read_until

ABOVE = "SELECT COUNT(*) AS n FROM enterprises WHERE employees > $1"
INT4, INT4_ARRAY = 23, 1007


def _parse(name: str, sql: str, types=()) -> bytes:
    oids = b"".join(struct.pack("!i", t) for t in types)
    return codec.message(b"P", f"{name}\0{sql}\0".encode() + struct.pack("!h", len(types)) + oids)


def _bind(portal: str, statement: str, values) -> bytes:
    body = f"{portal}\0{statement}\0".encode() + struct.pack("!hh", 0, len(values))
    for value in values:
        text = str(value).encode()
        body += struct.pack("!i", len(text)) + text
    return codec.message(b"B", body + struct.pack("!h", 0))


def _describe(kind: bytes, name: str) -> bytes:
    return codec.message(b"D", kind + name.encode() + b"\0")


def _execute(portal: str) -> bytes:
    return codec.message(b"E", portal.encode() + b"\0" + struct.pack("!i", 0))


ORDERS = {
    "statement described, then bound": [
        _parse("a", ABOVE, (INT4,)), _describe(b"S", "a"), _bind("", "a", [49]), _execute(""),
    ],
    "untyped, described, then bound": [
        _parse("b", ABOVE), _describe(b"S", "b"), _bind("p", "b", [49]), _execute("p"),
    ],
    "portal described, executed twice": [
        _parse("c", ABOVE, (INT4,)), _bind("q", "c", [49]), _describe(b"P", "q"),
        _execute("q"), _execute("q"),
    ],
    "unnamed described, parsed again with the literal": [
        _parse("", ABOVE, (INT4,)), _describe(b"S", ""), _parse("", ABOVE.replace("$1", "49")),
        _bind("", "", []), _execute(""),
    ],
    "an IN list": [
        _parse("d", ABOVE.replace("> $1", "IN ($1, $2)"), (INT4, INT4)), _describe(b"S", "d"),
        _bind("", "d", [49, 51]), _execute(""),
    ],
    "an array for = ANY": [
        _parse("e", ABOVE.replace("> $1", "= ANY($1)"), (INT4_ARRAY,)), _describe(b"S", "e"),
        _bind("", "e", ["{49}"]), _execute(""),
    ],
}  # fmt: skip


@pytest.mark.parametrize("order", ORDERS)
def test_a_described_statement_bound_off_the_breaks_is_refused_when_run(server, order):
    sock, _, _ = login(server)
    try:
        sock.sendall(b"".join(ORDERS[order]) + codec.message(b"S"))
        messages = read_until(sock)
    finally:
        sock.close()
    kinds = [kind for kind, _ in messages]
    assert b"D" not in kinds  # no row
    errors = [body for kind, body in messages if kind == b"E"]
    assert [error_code(body) for body in errors] == ["42501"]
    assert b"class breaks" in errors[0] and b"49" in errors[0]


def test_the_same_statement_bound_at_a_break_is_answered(server):
    sock, _, _ = login(server)
    try:
        sock.sendall(_parse("a", ABOVE, (INT4,)) + _describe(b"S", "a") + _bind("", "a", [50])
                     + _execute("") + codec.message(b"S"))  # fmt: skip
        kinds = [kind for kind, _ in read_until(sock)]
    finally:
        sock.close()
    assert kinds == [b"1", b"t", b"T", b"2", b"D", b"C", b"Z"]
