"""``COPY (query) TO STDOUT`` of a server session: the query's answer as CopyData rows
(PostgreSQL documentation, COPY, "File Formats"; protocol 55.2.6 "COPY Operations").

psql's ``\\copy (SELECT ...) TO 'file.csv' CSV HEADER`` and psycopg's ``cursor.copy()`` send
``COPY (query) TO STDOUT [options]``; the guard refuses COPY, so an analyst could not export a
protected table to a file the way PostgreSQL users do. Only the query form is read here: its
query runs through the catalog or the guard like any statement (audited and charged as
one), and its answer is written in the text or CSV format. ``COPY table ...``, ``COPY ... FROM``
and a ``BINARY`` format are left to the guard, which refuses them; options other than
``FORMAT``, ``HEADER``, ``DELIMITER`` and ``NULL`` are refused as not supported (0A000).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

from sqlsdc.errors import NotSupportedError
from sqlsdc.server import codec
from sqlsdc.server.rows import encode, sendable

_COPY = re.compile(r"\A\s*COPY\s*\((?P<query>.*)\)\s*TO\s+STDOUT\b(?P<options>.*)\Z", re.I | re.S)
r"""Matched against the statement without its trailing semicolons and white space
(:func:`_without_end`): with a lazy ``(?P<options>.*?)[\s;]*\Z`` instead, the engine tried
the tail at every position, in time quadratic in its length, on the event loop: ``COPY (SELECT
1) TO STDOUT`` and 65,536 semicolons and an ``x`` took 16 s of CPU, in which no session of any
user was served; a 4 MB Query would have taken hours (red team s49k)."""
_OPTION = re.compile(
    r"\s*(?P<name>FORMAT|HEADER|DELIMITER|NULL|CSV|TEXT)\b\s*(?P<value>'(?:[^']|'')*'|\w+)?\s*,?",
    re.I,
)
_TRUE, _FALSE = {"", "TRUE", "ON", "1"}, {"FALSE", "OFF", "0"}


@dataclass(frozen=True)
class CopyOut:
    query: str
    csv: bool = False
    header: bool = False
    delimiter: str = "\t"
    null: str = "\\N"


def copy_out(sql: str) -> CopyOut | None:
    """The ``COPY (query) TO STDOUT`` statement ``sql``, else None (a statement for the
    catalog or the guard).

    Raises:
        NotSupportedError: an option this server does not write (``BINARY``, ``QUOTE`` …).
    """
    match = _COPY.match(sql, 0, _without_end(sql))
    if match is None:
        return None
    text = match["options"].strip()
    text = re.sub(r"(?i)\AWITH\b", "", text).strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    options, at = {}, 0
    while at < len(text):
        option = _OPTION.match(text, at)
        if option is None or option.end() == at:
            raise NotSupportedError(
                f"COPY ... TO STDOUT {match['options'].strip()[:80]} is not supported: sqlsdc "
                "serve writes FORMAT text or csv, with HEADER, DELIMITER and NULL"
            )
        name, value = option["name"].upper(), option["value"] or ""
        if name in ("CSV", "TEXT"):  # the older spelling: COPY ... TO STDOUT CSV HEADER
            name, value, at = "FORMAT", name, option.start("value") if value else option.end()
        else:
            at = option.end()
        options[name] = value[1:-1].replace("''", "'") if value.startswith("'") else value
    return _read(match["query"], options, sql)


def _without_end(sql: str) -> int:
    r"""The length of ``sql`` without its trailing semicolons and white space (a loop, not a
    pattern: a search for ``[\s;]*\Z`` is itself quadratic in a run of them)."""
    end = len(sql)
    while end and (sql[end - 1] == ";" or sql[end - 1].isspace()):
        end -= 1
    return end


def _read(query: str, options: dict[str, str], sql: str) -> CopyOut:
    fmt = options.get("FORMAT", "text").lower()
    header = options.get("HEADER", "false").upper()
    if fmt not in ("text", "csv") or header not in _TRUE | _FALSE:
        raise NotSupportedError(
            f"COPY ... TO STDOUT with FORMAT {fmt} HEADER {header.lower()} is not supported: "
            "sqlsdc serve writes FORMAT text or csv, HEADER true or false"
        )
    csv = fmt == "csv"
    delimiter = options.get("DELIMITER", "," if csv else "\t")
    if len(delimiter) != 1 or delimiter in '\r\n\\"':
        raise NotSupportedError("the COPY delimiter must be one character (not a quote, "
                                "backslash or line break)")  # fmt: skip
    null = options.get("NULL", "" if csv else "\\N")
    return CopyOut(query, csv, header in _TRUE, delimiter, null)


def copy_messages(copy: CopyOut, table: pa.Table) -> bytes:
    """CopyOutResponse, a CopyData per row (the header first, when asked), CopyDone: the
    answer ``table`` in ``copy``'s format, in one piece (a short answer; the session writes a
    long one a chunk at a time: :func:`copy_response`, :func:`copy_data`, :data:`COPY_DONE`)."""
    head = copy_response(table) + (copy_header(copy, table) if copy.header else b"")
    return head + copy_data(copy, table) + COPY_DONE


def copy_response(table: pa.Table) -> bytes:
    """The CopyOutResponse of the answer ``table``: text, one column each."""
    return codec.message(b"H", b"\0" + (table.num_columns).to_bytes(2, "big")
                         + b"\0\0" * table.num_columns)  # fmt: skip


def copy_header(copy: CopyOut, table: pa.Table) -> bytes:
    """The CopyData of the HEADER line: the answer's column names."""
    return codec.message(b"d", _line(copy, [name.encode() for name in table.column_names]))


def copy_data(copy: CopyOut, rows: pa.Table) -> bytes:
    """A CopyData per row of ``rows`` (a chunk of the answer): encoded a chunk at a time, as
    DataRows are, since a row's Python values and messages take some 20 times its Arrow bytes
    (an answer of 262,144 rows encoded at once took 130 MB of the server for 10 MB written,
    red team s49k)."""
    with sendable():
        return b"".join(codec.message(b"d", _line(copy, row))
                        for row in encode(rows, (), text_only=False))  # fmt: skip


COPY_DONE = codec.message(b"c")


def _line(copy: CopyOut, values) -> bytes:
    null, delimiter = copy.null.encode(), copy.delimiter.encode()
    field = _csv_field if copy.csv else _text_field
    return delimiter.join(null if v is None else field(v, delimiter, null) for v in values) + b"\n"


def _text_field(value: bytes, delimiter: bytes, null: bytes) -> bytes:
    """A value of the text format: backslash, line breaks and the delimiter escaped."""
    value = value.replace(b"\\", b"\\\\").replace(b"\n", b"\\n").replace(b"\r", b"\\r")
    return value.replace(delimiter, b"\\" + delimiter) if delimiter != b"\t" else \
        value.replace(b"\t", b"\\t")  # fmt: skip


def _csv_field(value: bytes, delimiter: bytes, null: bytes) -> bytes:
    """A value of the CSV format, quoted when it holds the delimiter, a quote or a line
    break, or reads as the NULL string (PostgreSQL quotes an empty string so)."""
    if value == null or any(c in value for c in (delimiter, b'"', b"\n", b"\r")):
        return b'"' + value.replace(b'"', b'""') + b'"'
    return value
