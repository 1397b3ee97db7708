"""SQL cursors of a server session: ``DECLARE name CURSOR [WITH HOLD] FOR query``, ``FETCH``,
``MOVE`` and ``CLOSE``, read into what the session does with them.

psycopg's and psycopg2's named cursors and SQLAlchemy's ``stream_results`` declare a cursor
and fetch from it, one statement per message. The session runs the query
of a ``DECLARE`` through the guard once, like any statement, keeps its answer as a portal named
by the cursor, and hands out its rows forward only: ``FETCH [NEXT | FORWARD [n | ALL] | n |
ALL] [FROM | IN] name``. What a cursor keeps counts against its user's 64 MB as a portal's
answer does. Scrolling (``SCROLL``, ``BACKWARD``, ``PRIOR``, ``ABSOLUTE`` …) and ``BINARY``
cursors are refused as not supported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlsdc.errors import NotSupportedError, SqlSyntaxError

ALL = -1  # FETCH ALL / FORWARD ALL: every remaining row

_NAME = r'"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*'
_DECLARE = re.compile(
    rf"DECLARE\s+(?P<name>{_NAME})\s+(?P<options>(?:[A-Za-z]+\s+)*?)CURSOR\b\s*"
    r"(?P<hold>(?:WITH|WITHOUT)\s+HOLD\s+)?FOR\b\s*(?P<query>.*)\Z",
    re.I | re.S,
)
_MOTION = re.compile(
    rf"(?P<verb>FETCH|MOVE)\s+(?P<direction>[A-Za-z]+\s+)??(?P<count>\d+\s+|ALL\s+)?"
    rf"(?:(?:FROM|IN)\s+)?(?P<name>{_NAME})\s*\Z",
    re.I | re.S,
)
_CLOSE = re.compile(rf"CLOSE\s+(?P<name>{_NAME})\s*\Z", re.I | re.S)
_OPTIONS = {"", "ASENSITIVE", "INSENSITIVE"}  # what a forward-only cursor is anyway
_COMMENTS = re.compile(r"\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/)*", re.S)
KEYWORDS = ("DECLARE", "FETCH", "MOVE", "CLOSE")


@dataclass(frozen=True)
class Declare:
    name: str
    hold: bool  # WITH HOLD: kept after the transaction block ends
    query: str


@dataclass(frozen=True)
class Motion:
    name: str
    count: int  # rows to hand out (FETCH) or skip (MOVE); ALL: the rest
    fetch: bool  # FETCH (rows sent) or MOVE (position only)


@dataclass(frozen=True)
class Close:
    name: str | None  # None: CLOSE ALL


def cursor_text(sql: str) -> str | None:
    """``sql`` without its leading comments and final semicolons when it is a cursor
    statement (its first word ``DECLARE``, ``FETCH``, ``MOVE`` or ``CLOSE``), else None."""
    text = _COMMENTS.sub("", sql).strip().rstrip(";").strip()
    words = text.split(None, 1)
    return text if words and words[0].upper() in KEYWORDS else None


def read(text: str) -> Declare | Motion | Close:
    """The cursor statement ``text`` (as :func:`cursor_text` gives it).

    Raises:
        NotSupportedError: scrolling, ``BINARY``, a direction other than forward.
        SqlSyntaxError: a statement that cannot be read as one of the four.
    """
    keyword = text.split(None, 1)[0].upper()
    if keyword == "DECLARE":
        match = _DECLARE.match(text)
        if match is None:
            raise SqlSyntaxError(
                f"cannot read the DECLARE statement {text[:80]!r}",
                "write DECLARE name CURSOR [WITH HOLD] FOR SELECT ...",
            )
        options = " ".join(match["options"].upper().split())
        if options.removesuffix("NO SCROLL").strip() not in _OPTIONS:
            raise NotSupportedError(
                f"DECLARE ... {options} CURSOR is not supported: cursors of sqlsdc serve "
                "move forward only, and send rows as text or binary as FETCH asks"
            )
        hold = bool(match["hold"]) and match["hold"].upper().startswith("WITH ")
        return Declare(_unquote(match["name"]), hold, match["query"])
    if keyword == "CLOSE":
        match = _CLOSE.match(text)
        if match is None:
            raise SqlSyntaxError(
                f"cannot read the CLOSE statement {text[:80]!r}", "write CLOSE name or CLOSE ALL"
            )
        name = match["name"]
        return Close(None if name.upper() == "ALL" else _unquote(name))
    match = _MOTION.match(text)
    if match is None:
        raise SqlSyntaxError(
            f"cannot read the {keyword} statement {text[:80]!r}",
            f"write {keyword} [FORWARD] [n | ALL] FROM name",
        )
    return Motion(_unquote(match["name"]), _count(match), keyword == "FETCH")


def _count(match: re.Match) -> int:
    direction = (match["direction"] or "").strip().upper()
    count = (match["count"] or "").strip().upper()
    if direction in {"", "FORWARD"}:
        return ALL if count == "ALL" else int(count) if count else 1
    if direction in {"NEXT", "ALL"} and not count:
        return 1 if direction == "NEXT" else ALL
    raise NotSupportedError(
        f"{match['verb'].upper()} {direction} is not supported: cursors of "
        "sqlsdc serve move forward only (NEXT, FORWARD n, FORWARD ALL)"
    )


def _unquote(name: str) -> str:
    """A cursor's name as PostgreSQL keeps it: quoted as written, else in lower case."""
    if name.startswith('"'):
        return name[1:-1].replace('""', '"')
    return name.lower()
