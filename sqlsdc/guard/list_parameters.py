"""A list parameter of ``column = ANY(?)`` bound as the IN list of literals it means, and
``column = ANY(ARRAY[constants])`` written out read as that IN list too.

psycopg (and other PostgreSQL drivers) send a Python list as one array parameter, and write
a multi-value filter as ``col = ANY(%s)``; in SQL ``x = ANY(array)`` is ``x IN (elements)``
(true where one element equals x, NULL where none does and an element or x is NULL, false
otherwise). So the parameter becomes the literals of its values, one by one as a parameter
of their type is bound, and the comparison the ``IN`` of them; from there it takes every
check a written IN list takes (the column's role and class breaks, one type family,
totality). Only this form: a list anywhere else, and ``ANY`` of anything else or under
another comparison, stay refused. A list is as long as its IN list written out may be: the
statement with it must fit the policy's ``max_statement_characters``.

psycopg2 writes a list into the statement's text (``col = ANY(ARRAY['R01','R02'])``, a
date ``'2020-01-02'::date``), and DuckDB's list literal ``['R01', 'R02']`` is the same node:
an array of constants (no column, subquery, aggregate or window) under ``x = ANY(...)`` is
rewritten the same way (:func:`arrays_as_in`); its length is the statement's.

A driver that sends the list untyped names its type in a cast, ``x = ANY($1::text[])`` or
``x = ANY(CAST($1 AS INT[]))`` (the server then reads the parameter as an array of that
element type, :func:`sqlsdc.server.statement_text.parameter_types`): the list is the IN list of its
literals each cast to the element type, ``x IN (CAST(30 AS TEXT), ...)``, so a value of another
type than the cast, or one the cast cannot convert, meets the checks of that IN list written
out. Only a plain cast to a one-dimensional array of a scalar type: ``int[][]``, a fixed size
``int[3]``, ``STRUCT(...)[]`` or ``TRY_CAST`` are refused.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from sqlsdc.engines.trees import of_kind
from sqlsdc.errors import PolicyViolation, ProgrammingError

LIST_TYPES = (list, tuple)


def is_list(value) -> bool:
    """Whether ``value`` is a list parameter: a built-in list or tuple only (a subclass may
    iterate over other values than its ``repr`` shows the check cache)."""
    return type(value) in LIST_TYPES


def is_any_operand(placeholder: exp.Expr) -> bool:
    """Whether ``placeholder`` is the operand of ``x = ANY(placeholder)``, or of
    ``x = ANY(CAST(placeholder AS T[]))`` (:func:`array_cast`)."""
    operand = placeholder.parent
    if array_cast(placeholder) is not None:
        operand = operand.parent
    if isinstance(operand, exp.Paren):
        operand = operand.parent
    return isinstance(operand, exp.Any) and _compared(operand) is not None


def array_cast(placeholder: exp.Expr) -> exp.Cast | None:
    """The ``CAST(placeholder AS <array type>)`` right above ``placeholder``, else None."""
    cast = placeholder.parent
    if type(cast) is exp.Cast and cast.this is placeholder and cast.to.is_type("array"):
        return cast
    return None


def _element_type(cast: exp.Cast) -> exp.DataType:
    """The element type of ``cast``'s array type: one dimension of a scalar type only."""
    array = cast.to
    element = array.expressions[0] if len(array.expressions) == 1 else None
    if element is None or array.args.get("values") or element.args.get("nested"):
        raise ProgrammingError(
            f"a list parameter of = ANY(...) is cast to {array.sql('duckdb')}; cast it to a "
            "one-dimensional array of a plain type (text[], int[], date[] ...)"
        )
    return element


def listed(
    values,
    literal: Callable[[object], exp.Expr],
    sql: str | None,
    max_length: int,
    cast: exp.Cast | None = None,
) -> exp.Tuple:
    """The literals of a list parameter's values, to be read by :func:`any_as_in`, each cast
    to the element type of ``cast`` (the parameter's :func:`array_cast`) if there is one. A
    list that cannot fit ``max_length`` written out (a value and ``, `` take three characters
    at least) is refused before its literals are made."""
    element = _element_type(cast) if cast is not None else None
    if len(sql or "") + 3 * len(values) > max_length:
        raise _too_long(len(sql or "") + 3 * len(values), max_length, sql)
    if not values:
        raise ProgrammingError(
            "a list parameter of = ANY(...) is empty: it matches no row; leave the condition "
            "out, or pass at least one value"
        )
    for value in values:
        if isinstance(value, LIST_TYPES):
            raise ProgrammingError("a list parameter of = ANY(...) holds a list; pass values")
    literals = [literal(v) for v in values]
    if element is not None:
        literals = [exp.Cast(this=v, to=element.copy()) for v in literals]
    return exp.Tuple(expressions=literals)


def any_as_in(bound: list[exp.Tuple], sql: str | None, max_length: int) -> None:
    """Replace each ``x = ANY(<bound list>)`` of the tree by ``x IN (<its literals>)``
    (changes the tree). Refuses lists whose IN lists would make the statement longer than
    ``max_length`` characters, as a long written IN list is refused."""
    length = len(sql or "")
    for values in bound:
        length += sum(len(v.sql()) + 2 for v in values.expressions)
    if length > max_length:
        raise _too_long(length, max_length, sql)
    for values in bound:
        operand = values.parent.parent if type(values.parent) is exp.Cast else values.parent
        if isinstance(operand, exp.Paren):
            operand = operand.parent
        comparison = _compared(operand)
        comparison.replace(exp.In(this=comparison.this, expressions=values.expressions))


def _too_long(length: int, max_length: int, sql: str | None) -> PolicyViolation:
    return PolicyViolation(
        f"the statement with its list parameters written out is {length:,} characters long "
        f"(at least); the limit is {max_length:,}",
        "pass fewer values (e.g. a range instead of a long list), or ask an admin about the "
        "policy's `limits.max_statement_characters`",
        sql,
    )


def _compared(operand: exp.Any) -> exp.EQ | None:
    """The ``x = ANY(...)`` whose right side is ``operand``, else None."""
    comparison = operand.parent
    if isinstance(comparison, exp.EQ) and comparison.expression is operand:
        return comparison
    return None


_NOT_CONSTANT = (exp.Column, exp.Subquery, exp.Select, exp.AggFunc, exp.Window, exp.Placeholder,
                 exp.Parameter)  # fmt: skip


def arrays_as_in(walked: list[exp.Expr]) -> bool:
    """Replace each ``x = ANY(ARRAY[constants])`` among ``walked`` (a tree's nodes, parameters
    bound) by ``x IN (constants)`` (changes the tree); True when one was."""
    changed = False
    for operand in of_kind(walked, exp.Any):
        comparison = _compared(operand)
        array = operand.this.this if isinstance(operand.this, exp.Paren) else operand.this
        if comparison is None or not isinstance(array, exp.Array) or not array.expressions:
            continue
        if any(e.find(*_NOT_CONSTANT) for e in array.expressions):
            continue
        comparison.replace(exp.In(this=comparison.this, expressions=array.expressions))
        changed = True
    return changed
