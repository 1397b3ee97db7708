"""Builders of the DP stage's SQL trees, placing nodes in place instead of copying them.

sqlglot's builders (``exp.select``, ``from_``, ``where``, ``join``, ``with_``, ``alias_``,
``cast``, ``func``) copy the select or expression they extend at every call unless told
``copy=False``, and parse names given as strings: about half the check time of a small DP query
(benchmarks/README.md, session 34). The stage's nodes are new and used once, so they are
placed, not copied; a node that goes to two places is made (or copied) once per place, so every
node has one parent (:func:`key_columns` makes new key columns for each place).

Used by :mod:`sqlsdc.rewrite.dp` (the stage), :mod:`sqlsdc.rewrite.dp_bounding` (the bounded
cells) and :mod:`sqlsdc.rewrite.dp_report` (the bounding report).
"""

from __future__ import annotations

from fractions import Fraction

from sqlglot import exp

UNIT = "__u"
"""The rows' column of the privacy unit."""
DOUBLE, BIGINT, HUGEINT = (exp.DataType.Type.DOUBLE, exp.DataType.Type.BIGINT,
                           exp.DataType.Type.INT128)  # fmt: skip


def new_select(*expressions: exp.Expr) -> exp.Select:
    """``SELECT expressions``, built in place like the rest of the stage's SQL."""
    return exp.Select(expressions=list(expressions))


def window(function: str, partition: list, order: list) -> exp.Window:
    return exp.Window(
        this=exp.Anonymous(this=function),
        partition_by=partition,
        order=exp.Order(
            expressions=[o if isinstance(o, exp.Ordered) else exp.Ordered(this=o) for o in order]
        ),  # fmt: skip
    )


def from_(select: exp.Select, source: exp.Expr) -> exp.Select:
    select.set("from_", exp.From(this=source))
    return select


def named_table(name: str) -> exp.Table:
    return exp.Table(this=exp.to_identifier(name))


def sub(query: exp.Query, alias: str) -> exp.Subquery:
    return query.subquery(alias, copy=False)


def key_columns(n_keys: int) -> list[exp.Column]:
    """New columns ``__g0 .. __g<n-1>``: one list per place the keys go."""
    return [exp.column(f"__g{j}") for j in range(n_keys)]


def join_using(source: exp.Expr, column: str) -> exp.Join:
    return exp.Join(this=source, using=[exp.to_identifier(column)])


def with_named(query: exp.Select, *ctes: tuple[str, exp.Query]) -> exp.Select:
    """``query`` with the named subqueries ``ctes`` as its WITH, in order."""
    query.set("with_", exp.With(expressions=[
        exp.CTE(this=q, alias=exp.TableAlias(this=exp.to_identifier(name))) for name, q in ctes
    ]))  # fmt: skip
    return query


def func(name: str, *args: exp.Expr) -> exp.Func:
    return exp.func(name, *args, copy=False)


def cast(value: exp.Expr, to: exp.DataType.Type) -> exp.Cast:
    return exp.cast(value, to, copy=False)


def number(x: Fraction) -> exp.Literal:
    return exp.Literal.number(decimal(x))


def integer(x: Fraction) -> exp.Literal:
    return exp.Literal.number(int(x))


def decimal(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else repr(x.numerator / x.denominator)
