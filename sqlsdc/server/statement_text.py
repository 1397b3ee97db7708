"""What the server reads from a statement's text before any parser: blank statements, the
command tag, and the types of its parameters (``$1::int``, ``= ANY($1)``).

Regular expressions only, each written not to backtrack (a statement's text is the client's:
red team s35b held the event loop a day with 40 empty comments).
"""

from __future__ import annotations

import re

from sqlsdc.server import arrays, types
from sqlsdc.server.limits import MAX_PARAMETERS
from sqlsdc.server.quoted_literals import is_quoting, quoting_types

BLANK = re.compile(r"(?:\s|;|--[^\n]*+(?:\n|\Z)|/\*.*?\*/)*+\Z", re.S)
"""Spaces, semicolons and comments only (matched from the start), each comment the shortest: the
repetition is possessive, so a statement that is not blank fails once. It backtracked through
every way of reading ``/**//**/`` as one comment or two: 40 empty comments before ``SELECT 1``
(a 170-byte Query) held the event loop, and every session of every user, for about a day
(red team s35b)."""
_PARAMETER = re.compile(r"\$(\d{1,5})")
_NOT_CODE = re.compile(
    r"'(?:[^']|'')*+(?:'|\Z)|\"(?:[^\"]|\"\")*+(?:\"|\Z)|--[^\n]*+|/\*(?:.*?\*/|.*)", re.S
)
"""String literals, quoted names and comments, an unclosed one to the end (so that a text of
many unclosed ``/*`` is read once, not once per ``/*``): a ``$1`` inside them is no parameter."""
_CAST = re.compile(
    r"\$(\d{1,5})\s*::\s*(?:pg_catalog\s*\.\s*)?([a-z0-9_]+)(\s*\[\s*\])?"
    r"|cast\s*\(\s*\$(\d{1,5})\s+as\s+(?:pg_catalog\s*\.\s*)?([a-z0-9_]+)(\s*\[\s*\])?",
    re.I,
)
"""``$n::type`` and ``CAST($n AS type)``, ``type[]`` an array of it (a list for ``= ANY``);
the type may be qualified ``pg_catalog.int4``, as asyncpg writes it (its ``copy_from_query``
with arguments: :mod:`sqlsdc.server.quoted_literals`)."""
_QUOTED_TYPE = re.compile(
    r'(?:"pg_catalog"|pg_catalog)\s*\.\s*"([a-z0-9_]+)"|"pg_catalog"\s*\.\s*([a-z0-9_]+)', re.I
)
"""A type qualified with a quoted schema or name, ``"pg_catalog"."int4"`` (as JDBC tools and
asyncpg write it), read as ``pg_catalog.int4`` by :data:`_CAST` (the quoted names are blanked
with the other quoted names otherwise, and the parameter was typed text)."""
_ANY = re.compile(r"=\s*+any\s*+\(\s*+\$(\d{1,5})\s*+\)", re.I)
"""``= ANY($n)``: an untyped ``$n`` there is an array of the compared column's type, as
PostgreSQL infers it (:mod:`sqlsdc.server.list_types`), else of text, as psycopg sends a list
of str (``col = ANY(%s)``)."""
NOT_IN_TRANSACTION = ("COMMIT", "ROLLBACK")


def tag_of(sql: str) -> str:
    word = (sql.strip().split(None, 1) or [""])[0].rstrip(";").upper()
    return {"ABORT": "ROLLBACK", "END": "COMMIT"}.get(word, word)


def parameter_types(sql: str, given: tuple[int, ...]) -> tuple[int, ...]:
    """Types of ``$1 .. $n``: as the client gave them, else from a cast in the statement
    (``$1::int``, ``CAST($1 AS date)``, ``$1::text[]`` an array of text), else an array of
    text in ``= ANY($n)``, else text (the guard converts text as DuckDB does)."""
    return typed_parameters(sql, given)[0]


def untyped_parameters(sql: str, given: tuple[int, ...]) -> set[int]:
    """The numbers of the parameters typed text only because nothing typed them: neither the
    client, nor a cast, nor ``= ANY($n)`` (where they stand may tell their type:
    :func:`sqlsdc.server.list_types.scalar_types`)."""
    kinds, lists = typed_parameters(sql, given)
    code = _NOT_CODE.sub(" ", _unquoted_types(sql))
    cast = {int(m.group(1) or m.group(4)) for m in _CAST.finditer(code)}
    return {
        i + 1
        for i, kind in enumerate(kinds)
        if kind == types.TEXT and not (i < len(given) and given[i]) and i + 1 not in cast
    }


def typed_parameters(sql: str, given: tuple[int, ...]) -> tuple[tuple[int, ...], set[int]]:
    """:func:`parameter_types`, and the numbers of the parameters typed an array of text only
    because they stand untyped in ``= ANY($n)`` (whose column may tell their type)."""
    cast = {}
    if is_quoting(sql):  # asyncpg's: its types are quoted names, blanked below
        cast = {n: types.NAMES.get(name, types.TEXT) for n, name in quoting_types(sql).items()}
    sql = _NOT_CODE.sub(" ", _unquoted_types(sql))  # WHERE code <> '$2' takes no parameter
    count = max([len(given), *(int(n) for n in _PARAMETER.findall(sql))])
    if count > MAX_PARAMETERS:
        raise ValueError(f"{count} parameters")
    for match in _CAST.finditer(sql):
        number, name, array = match.group(1, 2, 3) if match.group(1) else match.group(4, 5, 6)
        oid = types.NAMES.get(name.lower(), types.TEXT)
        cast.setdefault(int(number), arrays.ARRAY_OF.get(oid, arrays.TEXT_ARRAY) if array else oid)
    lists = set()
    for match in _ANY.finditer(sql):
        number = int(match.group(1))
        if number not in cast and not (number <= len(given) and given[number - 1]):
            lists.add(number)
        cast.setdefault(number, arrays.TEXT_ARRAY)
    kinds = tuple(
        (given[i] if i < len(given) and given[i] else cast.get(i + 1, types.TEXT))
        for i in range(count)
    )
    return kinds, lists


def _unquoted_types(sql: str) -> str:
    """``sql`` with each ``"pg_catalog"."t"`` (and ``pg_catalog."t"``, ``"pg_catalog".t``)
    written ``pg_catalog.t``, for :data:`_CAST` (a text to read the parameters' types from,
    never the statement the guard checks)."""
    if "pg_catalog" not in sql.lower():
        return sql
    return _QUOTED_TYPE.sub(lambda m: f"pg_catalog.{m.group(1) or m.group(2)}", sql)
