"""Prepared statements and portals of a server session (the extended query protocol,
PostgreSQL documentation 55.2.3), and what each keeps: its answer and the values of its Bind,
counted against its user's bound (:data:`sqlsdc.server.limits.MAX_HELD_BYTES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from sqlsdc.server import codec, types
from sqlsdc.server.catalog import CatalogAnswer
from sqlsdc.server.limits import MAX_NAME
from sqlsdc.server.sqlstate import StatementError


@dataclass
class Statement:
    sql: str
    param_types: tuple[int, ...]
    described: CatalogAnswer | None = None  # run by Describe (no parameters), for the Execute
    text_only: bool = False  # described before its parameters were known: columns as text
    schema: pa.Schema | None = None  # a catalog statement's, described with NULL parameters
    given: tuple[int, ...] = ()  # the parameter types its Parse gave (0: none)
    inferred: bool = False  # its untyped parameters were typed where they stand (Describe)

    @property
    def nbytes(self) -> int:
        """Bytes it keeps: the answer of its Describe, not yet taken by a Bind."""
        return answer_bytes(self.described)


@dataclass
class Portal:
    statement: Statement
    params: tuple
    formats: tuple[int, ...]
    result: CatalogAnswer | None = None
    position: int = 0
    text_only: bool = False
    encoded: list | None = field(default=None, repr=False)
    size: int = 0  # bytes of the parameter values of its Bind, which it keeps
    hold: bool = False  # a cursor declared WITH HOLD: kept after its transaction block

    @property
    def nbytes(self) -> int:
        """Bytes it keeps: its answer and the parameter values of its Bind."""
        return self.size + answer_bytes(self.result)


def within_name_limit(name: str, what: str) -> str:
    """``name`` if a session may keep it as the name of a ``what`` (at most :data:`MAX_NAME`
    characters; 42622 name_too_long otherwise). A session keeps a thousand statements, portals
    and cursors by name, so an unbounded name was a megabyte kept for free (red team s43f)."""
    if len(name) > MAX_NAME:
        raise StatementError("42622", f"a {what} name is at most {MAX_NAME:,} characters long; "
                             f"this one has {len(name):,}", f"name the {what} shorter")  # fmt: skip
    return name


def answer_bytes(answer: CatalogAnswer | None) -> int:
    return 0 if answer is None or answer.table is None else answer.table.nbytes


def bind_values(message: codec.Bind, param_types: tuple[int, ...]) -> tuple:
    """The values of a Bind's parameters, each read as its type in its format.

    Raises:
        types.ParameterError: a value that is not one of its type.
    """
    formats = message.param_formats or (0,)
    return tuple(
        types.read_parameter(value, oid, (formats[i] if len(formats) > 1 else formats[0]) == 1)
        for i, (value, oid) in enumerate(zip(message.params, param_types, strict=True))
    )


def as_described(answer: CatalogAnswer, schema: pa.Schema | None) -> CatalogAnswer:
    """A catalog answer with the column types its statement's Describe sent (``schema``, run
    with NULL parameters): rows encoded as other types than described would be misread.

    Raises:
        StatementError: 42804 for an answer whose columns cannot take those types.
    """
    if schema is None or answer.table is None or answer.table.schema.equals(schema):
        return answer
    try:
        return CatalogAnswer(answer.table.cast(schema), answer.tag)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        raise StatementError("42804", "the answer's columns are not of the types the "
                             "statement's Describe gave", "cast the parameters in the "
                             "statement (such as $1::int)") from None  # fmt: skip


def forget_answer(statement: Statement | None) -> None:
    """A statement closed or replaced lets go of the answer of its Describe: the portals bound
    to it still hold the statement, and through it that answer, which no count saw any more
    (Parse, Bind, Describe, Close, repeated in a transaction block, kept 18 MB a round
    uncounted past the 64 MB bound; red team s35b)."""
    if statement is not None:
        statement.described = None
