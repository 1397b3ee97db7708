"""Small builders of SQL expressions shared by the rewrite modules (sqlglot AST, no strings)."""

from __future__ import annotations

from functools import lru_cache

from sqlglot import exp

from sqlsdc.engines.trees import copy_tree


def data_type(name: str, dialect: str | None = None) -> exp.DataType:
    """``exp.DataType.build(name, dialect=dialect)``: a fresh copy of the type parsed once per
    name. sqlglot parses a type's name at every build (60-100 µs: five such casts were 0.3 ms
    of the check of a small DP query, benchmarks/README.md "session 42"); a copy of the
    parsed tree is the same tree in 5 µs."""
    return _parsed_type(name, dialect).copy()


@lru_cache(maxsize=128)
def _parsed_type(name: str, dialect: str | None) -> exp.DataType:
    """The parsed type of :func:`data_type`, kept: never handed out, only its copies."""
    return exp.DataType.build(name, dialect=dialect)


def cast(value: exp.Expr, name: str) -> exp.Cast:
    """``exp.cast(value, name)`` (a copy of ``value`` cast to the type ``name``) without parsing
    the type's name again (:func:`data_type`)."""
    return exp.cast(value, data_type(name), copy=True)


def missing(alias: str) -> exp.Expr:
    return exp.Is(this=exp.column("lo", alias), expression=exp.null())


def any_(conditions: list[exp.Expr]) -> exp.Expr:
    return exp.or_(*conditions) if conditions else exp.false()


def at_least_column(column: exp.Expr, k: int) -> exp.Expr:
    return exp.GTE(this=column.copy(), expression=exp.Literal.number(k))


def number(value: float) -> exp.Expr:
    """A numeric literal: integers as such, other numbers as DOUBLE (exponent notation)."""
    magnitude = abs(value)
    if float(magnitude).is_integer() and magnitude < 2**53:
        literal = exp.Literal.number(int(magnitude))
    else:
        literal = exp.Literal.number(f"{float(magnitude):.17e}")
    return exp.Neg(this=literal) if value < 0 else literal


def lt(value: exp.Expr, bound: float) -> exp.Expr:
    return exp.LT(this=value.copy(), expression=number(bound))


def mul(value: exp.Expr, factor: float) -> exp.Expr:
    return mul_expr(value.copy(), number(factor))


def mul_expr(a: exp.Expr, b: exp.Expr) -> exp.Expr:
    return exp.Mul(this=paren(a), expression=paren(b))


def div(value: exp.Expr, divisor: float) -> exp.Expr:
    return exp.Div(this=paren(value.copy()), expression=number(divisor))


def paren(node: exp.Expr) -> exp.Expr:
    if isinstance(node, (exp.Column, exp.Literal, exp.Paren, exp.Func)):
        return node
    return exp.Paren(this=node)


def copy_clause(value: exp.Expr | list[exp.Expr]) -> exp.Expr | list[exp.Expr]:
    """:func:`copy_tree` of a clause of a SELECT (a node, or a list of nodes)."""
    return [copy_tree(v) for v in value] if isinstance(value, list) else copy_tree(value)
