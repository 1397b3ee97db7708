"""asyncpg's quoting of its arguments, answered by the server: ``SELECT
quote_literal($1::pg_catalog.int4::text), ...``.

asyncpg's ``copy_from_query(query, *args)`` inlines its arguments into the query's text before
it sends ``COPY (query) TO STDOUT`` (COPY takes no parameters): it asks the server to quote
each one with that statement, a function of the values it sends and nothing else. The guard
refused it (``pg_catalog.int4`` is no type it knows), so an export with arguments failed. The
statement is recognised by its exact form (one regular expression, anchored, that cannot
backtrack) and answered here, from the values alone: each the text of the value as PostgreSQL
casts it to text, quoted as a standard string literal (:func:`quote_literal`). The query
asyncpg then sends is judged by the guard like any.
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

import pyarrow as pa

_TYPE = r'(?:"pg_catalog"\.|pg_catalog\.)?"?([a-z_][a-z0-9_]*)"?'
_ITEM = rf"quote_literal\(\$(\d{{1,5}})::{_TYPE}::text\)"
_STATEMENT = re.compile(rf"SELECT {_ITEM}(?:, {_ITEM})*+", re.I)
_NUMBER = re.compile(r"\$(\d{1,5})")
_TYPED = re.compile(rf"\$(\d{{1,5}})::{_TYPE}::text", re.I)


def is_quoting(text: str) -> bool:
    """Whether ``text`` is asyncpg's quoting statement (``SELECT quote_literal($1::"pg_catalog"
    ."int4"::text), ...``: every type quoted, which the server's reading of casts, blind to
    quoted names, does not see)."""
    return text[:21].lower().startswith("select quote_literal(") and bool(
        _STATEMENT.fullmatch(text.strip().rstrip(";").strip())
    )


def quoting_types(text: str) -> dict[int, str]:
    """The type name of each parameter of asyncpg's quoting statement (``int4``)."""
    return {int(n): name.lower() for n, name in _TYPED.findall(text)}


def quoted_literals(text: str, params: tuple | None):
    """The one-row answer (a :class:`pyarrow.Table` of text columns ``quote_literal``) to
    asyncpg's quoting statement ``text`` with the values ``params``, or None for any other
    statement (or a value of a type this module does not write)."""
    if not is_quoting(text):
        return None
    numbers = [int(n) for n in _NUMBER.findall(text)]
    values = tuple(params) if params else (None,) * max(numbers)  # a Query: no values
    if any(n < 1 or n > len(values) for n in numbers):
        return None
    quoted = []
    for n in numbers:
        value = values[n - 1]
        written = None if value is None else _text(value)
        if value is not None and written is None:
            return None
        quoted.append(None if written is None else quote_literal(written))
    return pa.table(
        [pa.array([q], pa.string()) for q in quoted], names=["quote_literal"] * len(quoted)
    )


def quote_literal(text: str) -> str:
    """``text`` as a standard string literal, quotes doubled: what PostgreSQL's
    ``quote_literal`` means under ``standard_conforming_strings = on`` (the server's setting,
    under which a backslash is an ordinary character). PostgreSQL writes a text with a
    backslash as ``E'a\\\\b'``, an escape string the guard refuses; ``'a\\b'`` is the same
    value for both."""
    return "'" + text.replace("'", "''") + "'"


def _text(value) -> str | None:
    """The value cast to text as PostgreSQL writes it, or None for a type not written here."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, Decimal, str)):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else None
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value.isoformat()
    return None
