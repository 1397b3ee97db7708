"""Argument roles of the functions the guard allows: which arguments must be literals.

Some arguments decide whether a function can run at all: a date part (``DATE_TRUNC('bogus', d)``
fails), a format string, a divisor of ``//`` or ``%``, a substring position, a rounding precision,
an interval amount, a quantile. If such an argument is computed from the data, e.g.
``DATE_TRUNC(CASE WHEN income > 50000 THEN 'bogus' ELSE 'year' END, d)``, the query fails exactly
when some row satisfies the condition: one bit about the data per query, with no noise. So, on
confidential rows, every such argument is a :class:`LiteralArgument` of the function's
:class:`Signature`: it must be a literal (or an expression without columns, subqueries or
aggregates, which is checked by evaluating the call once on a sample value before the query
runs). The other arguments are *values*: the function is total in them for values of the
right type, which :mod:`sqlsdc.planner.totality` checks.

:data:`SIGNATURES` lists every function and operator the guard allows in expressions evaluated on
confidential rows, and only these: anything else is refused there (fail closed).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from sqlglot import exp

DIALECT = "duckdb"
MAX_POSITION = 2**31 - 1  # DuckDB casts positions, precisions and offsets to INTEGER


class Check(Enum):
    """What a literal argument must be, beyond being a literal."""

    VALID = "valid"  # any literal the function accepts (checked by one evaluation)
    SMALL_INTEGER = "small integer"  # an integer literal of at most 2^31 - 1 in absolute value
    POSITIVE = "positive number"  # a number literal greater than zero
    FRACTION = "fraction"  # a number literal between 0 and 1


@dataclass(frozen=True)
class LiteralArgument:
    """An argument that must be a literal: its key in the sqlglot node and how to say it."""

    key: str
    what: str  # "the date part", "the format"
    check: Check = Check.VALID


@dataclass(frozen=True)
class Signature:
    """A function or operator allowed on confidential rows, with its literal arguments.

    ``sample`` gives, for the probe that validates a literal, a sample value for each value
    argument (every value argument of a function with a VALID literal needs one).
    """

    name: str
    literals: tuple[LiteralArgument, ...] = ()
    example: str = ""
    sample: tuple[tuple[str, str], ...] = ()


_DATE = "CAST('2000-01-01 00:00:00' AS TIMESTAMP)"
_DATE_PART = LiteralArgument("unit", "date part")
_DIVISOR = (LiteralArgument("expression", "divisor", Check.POSITIVE),)
_PRECISION = LiteralArgument("decimals", "precision", Check.SMALL_INTEGER)


def _value(name: str) -> Signature:
    return Signature(name)


SIGNATURES: dict[type, Signature] = {
    # Conditionals and comparisons: total when their values have compatible types.
    exp.Case: _value("CASE"),
    exp.If: _value("IF"),
    exp.Coalesce: _value("COALESCE"),
    exp.Nullif: _value("NULLIF"),
    exp.Greatest: _value("GREATEST"),
    exp.Least: _value("LEAST"),
    exp.And: _value("AND"),
    exp.Or: _value("OR"),
    exp.Not: _value("NOT"),
    exp.Is: _value("IS"),
    exp.EQ: _value("="),
    exp.NEQ: _value("<>"),
    exp.GT: _value(">"),
    exp.GTE: _value(">="),
    exp.LT: _value("<"),
    exp.LTE: _value("<="),
    exp.NullSafeEQ: _value("IS NOT DISTINCT FROM"),
    exp.NullSafeNEQ: _value("IS DISTINCT FROM"),
    exp.In: _value("IN"),
    exp.Between: _value("BETWEEN"),
    exp.Like: _value("LIKE"),
    exp.ILike: _value("ILIKE"),
    # Casts: the target is a type name, never a value.
    exp.Cast: _value("CAST"),
    exp.TryCast: _value("TRY_CAST"),
    # Arithmetic: total on DOUBLE (infinities and NaN instead of errors); / always gives DOUBLE.
    exp.Add: _value("+"),
    exp.Sub: _value("-"),
    exp.Mul: _value("*"),
    exp.Div: _value("/"),
    exp.Neg: _value("-"),
    exp.IntDiv: Signature(
        "//", _DIVISOR, "FLOOR(CAST(x AS DOUBLE) / 10), or x // 10 with a literal"
    ),
    exp.Mod: Signature("%", _DIVISOR, "x % 10 with a literal divisor"),
    exp.Abs: _value("ABS"),
    # FLOOR(x, n) / CEIL(x, n): sqlglot writes them ROUND(FLOOR(x * POWER(10, CAST(n AS INT)))
    # / ..., n), casting a precision not typed as an integer to INT (which fails for a DOUBLE
    # out of its range): the precision is a literal, as ROUND's (red team s50g).
    exp.Floor: Signature("FLOOR", (_PRECISION,), "FLOOR(CAST(x AS DOUBLE), -1)"),
    exp.Ceil: Signature("CEIL", (_PRECISION,), "CEIL(CAST(x AS DOUBLE), 1)"),
    exp.Sign: _value("SIGN"),
    exp.Sqrt: _value("SQRT"),
    exp.Ln: _value("LN"),
    exp.Log: _value("LOG"),
    exp.Exp: _value("EXP"),
    exp.Pow: _value("POW"),
    exp.Round: Signature(
        "ROUND",
        (_PRECISION,),
        "ROUND(CAST(x AS DOUBLE), 2)",
    ),
    # Text: total on text; positions are literals so that no value can make them fail.
    exp.Lower: _value("LOWER"),
    exp.Upper: _value("UPPER"),
    exp.Length: _value("LENGTH"),
    exp.Trim: _value("TRIM"),
    exp.Concat: _value("CONCAT"),
    exp.DPipe: _value("||"),
    exp.StartsWith: _value("STARTS_WITH"),
    exp.Substring: Signature(
        "SUBSTRING",
        (
            LiteralArgument("start", "start position", Check.SMALL_INTEGER),
            LiteralArgument("length", "length", Check.SMALL_INTEGER),
        ),
        "SUBSTRING(occupation, 1, 3)",
    ),
    # Dates: total on dates and timestamps (infinities give NULL) once the part or format is fixed.
    exp.Extract: Signature(
        "EXTRACT",
        (LiteralArgument("this", "date part"),),
        "EXTRACT(YEAR FROM d)",
        (("expression", _DATE),),
    ),
    exp.DateTrunc: Signature(
        "DATE_TRUNC", (_DATE_PART,), "DATE_TRUNC('year', d)", (("this", _DATE),)
    ),
    exp.TimestampTrunc: Signature(
        "DATE_TRUNC", (_DATE_PART,), "DATE_TRUNC('year', d)", (("this", _DATE),)
    ),
    exp.TimeToStr: Signature(
        "STRFTIME",
        (LiteralArgument("format", "format"),),
        "STRFTIME(d, '%Y-%m')",
        (("this", _DATE),),
    ),
    exp.Year: _value("YEAR"),
    exp.Month: _value("MONTH"),
    exp.Quarter: _value("QUARTER"),
    exp.Interval: Signature("INTERVAL", (LiteralArgument("this", "amount"),), "INTERVAL 1 DAY"),
    exp.Grouping: _value("GROUPING"),
    # Aggregates: their arguments are values; a quantile is a literal fraction.
    exp.Count: _value("COUNT"),
    exp.Sum: _value("SUM"),
    exp.Avg: _value("AVG"),
    exp.Min: _value("MIN"),
    exp.Max: _value("MAX"),
    exp.Stddev: _value("STDDEV"),
    exp.StddevSamp: _value("STDDEV_SAMP"),
    exp.StddevPop: _value("STDDEV_POP"),
    exp.Variance: _value("VARIANCE"),
    exp.VariancePop: _value("VAR_POP"),
    exp.Median: _value("MEDIAN"),
    exp.Quantile: Signature(
        "QUANTILE",
        (LiteralArgument("quantile", "quantile", Check.FRACTION),),
        "QUANTILE(amount, 0.5)",
    ),
    exp.PercentileCont: Signature(
        "QUANTILE_CONT",
        (LiteralArgument("expression", "quantile", Check.FRACTION),),
        "QUANTILE_CONT(amount, 0.5)",
    ),
    exp.PercentileDisc: Signature(
        "QUANTILE_DISC",
        (LiteralArgument("expression", "quantile", Check.FRACTION),),
        "QUANTILE_DISC(amount, 0.5)",
    ),
    # Window functions (only over protected cells): offsets are literals.
    exp.RowNumber: _value("ROW_NUMBER"),
    exp.Rank: _value("RANK"),
    exp.DenseRank: _value("DENSE_RANK"),
    exp.Lag: Signature(
        "LAG", (LiteralArgument("offset", "offset", Check.SMALL_INTEGER),), "LAG(x, 1)"
    ),
    exp.Lead: Signature(
        "LEAD", (LiteralArgument("offset", "offset", Check.SMALL_INTEGER),), "LEAD(x, 1)"
    ),
    exp.FirstValue: _value("FIRST_VALUE"),
    exp.LastValue: _value("LAST_VALUE"),
}


_ORACLE = "could raise an error for some confidential values only, which would reveal them"


@dataclass(frozen=True)
class Refusal:
    reason: str
    hint: str


def signature(node: exp.Expr) -> Signature | None:
    """The signature of a function or operator node, or None when it is not listed."""
    return SIGNATURES.get(type(node))


def _unwrap(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _number(node: exp.Expr) -> float | None:
    """The value of a number literal (possibly negated), or None."""
    node = _unwrap(node)
    sign = 1
    if isinstance(node, exp.Neg):
        node, sign = _unwrap(node.this), -1
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return sign * float(node.this)
        except ValueError:
            return None
    return None


def _integer(node: exp.Expr) -> bool:
    node = _unwrap(node)
    if isinstance(node, exp.Neg):
        node = _unwrap(node.this)
    return isinstance(node, exp.Literal) and re.fullmatch(r"\d+", str(node.this)) is not None


def _passes(check: Check, node: exp.Expr) -> bool:
    value = _number(node)
    if check is Check.SMALL_INTEGER:
        return _integer(node) and value is not None and abs(value) <= MAX_POSITION
    if check is Check.POSITIVE:
        return value is not None and value > 0
    if check is Check.FRACTION:
        return value is not None and 0 <= value <= 1
    return True


def _is_constant(node: exp.Expr) -> bool:
    """No column, subquery, aggregate, window or parameter: the same value on every row."""
    return not any(
        isinstance(n, (exp.Column, exp.Subquery, exp.Select, exp.AggFunc, exp.Window))
        or isinstance(n, (exp.Placeholder, exp.Parameter))
        for n in node.walk()
    )


def _probe(node: exp.Expr, sig: Signature) -> exp.Expr:
    """A copy of the call with its value arguments replaced by samples (a constant)."""
    probe = node.copy()
    for key, sample in sig.sample:
        if probe.args.get(key) is not None:
            probe.set(key, exp.maybe_parse(sample, dialect=DIALECT))
    return probe


def literal_refusal(
    node: exp.Expr, constant_type: Callable[[exp.Expr], exp.DataType | None]
) -> Refusal | None:
    """Why an argument of ``node`` that must be a literal is not one, or None.

    An argument passes if it is a literal of the required kind, or (for VALID arguments) a
    constant expression with which one evaluation of the call on sample values succeeds.
    """
    sig = signature(node)
    if sig is None:
        return None
    for literal in sig.literals:
        argument = node.args.get(literal.key)
        if argument is None:
            continue
        where = f"the {literal.what} of {sig.name}"
        instead = f"write it as a literal, e.g. {sig.example}" if sig.example else "write a literal"
        if not _is_constant(argument):
            return Refusal(
                f"{where} must be a literal, not {argument.sql(DIALECT)[:80]}: computed from the "
                f"data, it {_ORACLE}",
                f"{instead}; to treat rows differently, put the CASE around the whole call "
                "(CASE WHEN ... THEN <call with one literal> ELSE <call with another> END)",
            )
        if not _passes(literal.check, argument):
            return Refusal(
                f"{where} must be a {literal.check.value} literal, not "
                f"{argument.sql(DIALECT)[:80]}: any other value {_ORACLE}",
                instead,
            )
        if literal.check is Check.VALID and constant_type(_probe(node, sig)) is None:
            return Refusal(
                f"{where} {argument.sql(DIALECT)[:80]} is not valid: the call raises an error",
                instead,
            )
    return None
