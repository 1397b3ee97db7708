"""Pass 4 of :mod:`sqlsdc.engines.spark_translate`: nodes whose Spark meaning differs from
DuckDB's are rewritten so that Spark computes DuckDB's value, or refused.

Differences found (DuckDB 2.0, Spark 4.3 in ANSI mode; each tested) and what happens here:

- ``a / b``: DuckDB divides as DOUBLE, x/0 = ±inf, 0/0 = NaN; Spark raises on zero and divides
  decimals as decimals (1.0/3 = 0.333333) → IEEE division of DOUBLEs.
- ``SUM`` of integers: DuckDB HUGEINT; Spark BIGINT, overflowing at 2^63 → SUM of DECIMAL(38, 0).
- ``AVG`` of integers and decimals: DuckDB the DOUBLE of the exact sum over the count; Spark
  DECIMAL(p+4, s+4), or a DOUBLE sum of integers → DuckDB's formula over the exact sum.
- ``CAST(… AS INT)``: DuckDB rounds, DOUBLE half to even, DECIMAL half away from zero; Spark
  truncates → BROUND / ROUND first. DOUBLE to DECIMAL (0.285 → 0.28 vs 0.29) or VARCHAR
  (``1e+20`` vs ``1.0E20``) and VARCHAR to INT ('2.5' → 3 vs error) → refused.
- ``ROUND(double, n)``, n ≠ 0: DuckDB round(x·10^n)/10^n in binary (0.285 → 0.28); Spark rounds
  the decimal digits (0.29) → DuckDB's formula.
- ``FLOOR``/``CEIL`` of an integer or DOUBLE: DuckDB DOUBLE; Spark BIGINT, raising beyond 2^63
  → a DOUBLE, exact.
- ``ROUND``, ``FLOOR``, ``CEIL`` of a DOUBLE rounded to zero: DuckDB keeps the sign of the
  argument (ROUND(-0.4) = -0.0, so 1 / it is -inf), Spark gives +0.0 → the sign made explicit.
- an integer compared with (or chosen among) decimals: DuckDB widens a BIGINT to 19 digits,
  Spark to 20, and rounds the decimals away past 38 (``CAST(v AS BIGINT) =
  3.0000000000000000001`` held month 3) → the integer cast to DECIMAL of its DuckDB digits.
- ``GROUPING(a, b)``: DuckDB's bit mask; Spark takes one argument → sum of bits.
- ``ISNAN(NULL)``: NULL in DuckDB, false in Spark → NULL made explicit.
- ``x % y``: a DOUBLE remainder by zero is NaN in DuckDB, an error in Spark → ``y`` must be a
  non-zero constant.
- ``LEAST``/``GREATEST`` built by a rewrite: NULL-propagating in sqlglot's DuckDB SQL only → the
  DuckDB SQL is what is translated (pass 1).
- ``MAX(x, n)``, the n largest values (the CKM's top contributions): DuckDB only → the first n
  of ``SORT_ARRAY(COLLECT_LIST(x), FALSE)``; ``list[j]`` beyond the end: NULL in DuckDB, an
  error in ANSI Spark → ``TRY_ELEMENT_AT``. Only a constant element of ``MAX(x, n)`` is portable.
- ``ORDER BY``: NULLS LAST in DuckDB, NULLS FIRST ascending in Spark → made explicit.
- ``hash(a, b, ...)``, the keyed choices of DP bounding: DuckDB's 64-bit hash of the values by
  their DuckDB types → :data:`HASH_UDF`, the same hash in numpy (:mod:`.duckdb_hash`), as
  DECIMAL(20, 0) (DuckDB's UBIGINT), over arguments whose DuckDB type is known: columns of
  tables copied by :meth:`sqlsdc.engines.spark.SparkEngine.load_duckdb` of the types it keeps,
  or row-level VARCHAR, BOOLEAN and DOUBLE values computed from them; other arguments →
  refused.
- ``LIST_MAX(MIN(x, n))``, the n-th smallest value (a unit's group cut): DuckDB only → the
  largest of the first n of ``SORT_ARRAY(COLLECT_LIST(x))``; ``MIN(x, n)`` alone → refused.
- ``CAST(x AS HUGEINT)``: no such Spark type → DECIMAL(38, 0), rounded as casts to integers.
- ``JOIN ... USING``: only INNER joins, whose meaning is the same (Spark does not resolve the
  right side's qualified key, which then fails to run), and no ``*`` (Spark puts the key first).
- ``QUALIFY``: none in Spark; sqlglot filters a subquery instead → only for a SELECT of named
  columns without ORDER BY, LIMIT or DISTINCT (which would change place).
- a 32-bit FLOAT column: DuckDB compares and computes in FLOAT (``r > 0.1`` with 0.1 cast to
  FLOAT; ``r / 3`` a FLOAT), Spark in DOUBLE → refused.
- ``a // b`` (DOUBLEs in DuckDB, error in Spark) → refused, but for integers divided by a
  constant other than 0 and -1 or two BIGINT casts (the DP bounding report's): both truncate,
  both raise on zero → ``DIV``. ``LIKE`` (``\\`` escapes in
  Spark only), ``EXP`` and ``LN`` (libm vs Java: last bit, and LN(0) is -inf vs NULL) → refused.
- ``GROUP BY ()``, the grand total: a syntax error in Spark → ``GROUP BY GROUPING SETS
  (())`` (one row, over no rows too, as DuckDB); ``()`` beside other keys → dropped.
  ``ROLLUP``, ``CUBE`` and ``GROUPING SETS`` with ``()`` over no rows: DuckDB's grand total
  rows, none in Spark → a global aggregate beside them (:mod:`sqlsdc.engines.spark_sets`, a
  pass before this one).
- ``GROUPING(x)`` under a plain GROUP BY: 0 in DuckDB, an error in Spark → 0. GROUPING is a
  BIGINT in DuckDB, a TINYINT in Spark → cast.
- ``IS NOT DISTINCT FROM``: Spark's ``<=>``, the same for the types compared here.
- lists, in the two shapes of DP's ``COUNT(DISTINCT column)`` only: a unit's r smallest
  distinct values ``LIST_SLICE(LIST_SORT(LIST_DISTINCT(ARRAY_AGG(x))), 1, r)`` → ``SLICE``,
  ``ARRAY_SORT``, ``ARRAY_DISTINCT`` and ``COLLECT_LIST`` (which drops NULLs, as LIST_DISTINCT
  does) for INTEGER, DECIMAL, VARCHAR and BOOLEAN values (DOUBLE's -0.0 and NaN → refused);
  their count ``LEN(LIST_DISTINCT(FLATTEN(ARRAY_AGG(k))))`` → a BIGINT ``SIZE``, NULL over no
  rows as in DuckDB (Spark's COLLECT_LIST of no rows is empty, not NULL).
- the answer's types: Spark's are its own (DECIMAL(p+10, s) sums, TINYINT GROUPING, INTEGER
  keys as Spark reads them); :func:`sqlsdc.engines.spark.as_types` casts them to the types
  DuckDB binds for the same SQL, exactly or not at all (the guarded path,
  :mod:`sqlsdc.guard.spark`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sqlglot import exp

from sqlsdc.engines.duckdb_hash import HASHED_DUCKDB_TYPES
from sqlsdc.engines.spark_portable import (
    HASH_UDF,
    distinct_count_of,
    int_literal,
    is_hash,
    is_list_slice,
    kept_values_of,
)
from sqlsdc.engines.spark_types import (
    BOOL,
    DECIMAL,
    FLOAT,
    INT,
    NULL,
    NUMERIC,
    TEXT,
    UNKNOWN,
    Types,
    type_class,
)
from sqlsdc.errors import NotSupportedError
from sqlsdc.written import spelled_sql, written_name

GROWTH = 8
"""How many nodes the rewrites may create per node of the DuckDB tree (:data:`SLACK` more), as
copies of the subtrees they repeat: a rewritten tree is a few times its DuckDB tree, and the
bound holds the work of translating (and of Spark's per-row evaluation) to a multiple of the
work the guard bounded on DuckDB's tree."""
SLACK = 20_000


def keep_duckdb_semantics(tree: exp.Expr, types: Types) -> exp.Expr:
    """Rewrite nodes whose Spark meaning differs from DuckDB's (mutates ``tree``).

    Children are rewritten before their parents; a replacement keeps the DuckDB type class of
    the node it replaces, which is what the parent's rule asks for.

    Some rewrites repeat an argument (``a / b`` reads ``b`` three times, ``ROUND(x, n)`` and
    ``FLOOR(x)`` read ``x`` three to six times), so nested ones multiply: ten nested divisions,
    a 200-character condition the guard accepts, were 7 MB of Spark SQL after 63 s of CPU,
    each level three times the last, and twelve would have held the connection (and the GIL)
    for ten minutes (red team s44k). The nodes the rewrites create are counted as they go,
    and a tree that would pass :data:`GROWTH` times its size is refused before it grows
    further (each rewrite copies what was counted, at most three times).

    Raises:
        NotSupportedError: a rewrite is not portable, or the rewritten tree would be too large.
    """
    nodes = list(tree.walk())
    for node in nodes:
        types.of(node)  # classify the whole tree before anything moves
    budget, created = GROWTH * len(nodes) + SLACK, 0
    root = tree
    for node in reversed(list(tree.walk(bfs=False))):
        rule = _SEMANTICS.get(type(node))
        new = rule(node, types) if rule else node
        if new is node:
            continue
        created += sum(1 for _ in new.walk())
        if created > budget:
            raise NotSupportedError(
                "nested divisions, ROUND, FLOOR or CEIL repeat their arguments on Spark: this "
                f"query's translation would pass {GROWTH} times its size; not portable to "
                "Spark: run this query on DuckDB, or nest fewer of them"
            )
        if isinstance(new, exp.Binary):
            new = exp.Paren(this=new)
        types.inherit(new, node)
        if node is root:
            root = new
        else:
            node.replace(new)
    return root


_TYPES = {name: exp.DataType.build(name) for name in ("DOUBLE", "BIGINT", "DECIMAL(38, 0)")}


def _type(name: str) -> exp.DataType:
    return _TYPES[name].copy()  # built once: DataType.build parses its argument


def _double(node: exp.Expr) -> exp.Expr:
    return exp.Cast(this=node.copy(), to=_type("DOUBLE"))


def _infinity() -> exp.Expr:
    return exp.Cast(this=exp.Literal.string("Infinity"), to=_type("DOUBLE"))


def _a(kind: str) -> str:
    if kind == UNKNOWN:
        return "a value of unknown type (pass the view schemas)"
    return f"an {kind}" if kind[0] in "AEIOU" else f"a {kind}"


def _refuse(node: exp.Expr, why: str) -> NotSupportedError:
    return NotSupportedError(
        f"{spelled_sql(node)} is not portable to Spark: {why}; run this query on DuckDB"
    )


def _divide(node: exp.Div, types: Types) -> exp.Expr:
    """DuckDB divides as DOUBLE with IEEE results for zero divisors (x/0 = ±inf, 0/0 = NaN);
    Spark raises, and divides decimals as decimals. ``POWER(±0.0, -1)`` is ±inf in Java."""
    a, b = _double(node.this), _double(node.expression)
    zero = exp.EQ(this=b.copy(), expression=exp.Literal.number(0))
    reciprocal = exp.Pow(this=b.copy(), expression=exp.Literal.number(-1))
    by_zero = exp.Mul(this=a.copy(), expression=reciprocal)
    return exp.Case(ifs=[exp.If(this=zero, true=by_zero)], default=exp.Div(this=a, expression=b))


def _average(node: exp.Avg, types: Types) -> exp.Expr:
    """DuckDB averages integers and decimals as ``CAST(SUM(x) AS DOUBLE) / COUNT(x)`` over
    their exact sum (tested on both engines: the conversion of the exact sum to DOUBLE is
    correctly rounded in both); Spark averages decimals to DECIMAL(p+4, s+4) and integers by a
    DOUBLE sum → DuckDB's formula over Spark's exact sum. A DOUBLE average is Spark's."""
    argument = node.this
    distinct = isinstance(argument, exp.Distinct)
    inner = argument.expressions[0] if distinct else argument
    kind = types.of(inner)
    if kind not in (*NUMERIC, NULL):
        raise _refuse(node, f"AVG of {_a(kind)}")
    if kind in (FLOAT, NULL) or isinstance(node.parent, exp.Window):  # a window: its frame's
        new = node.copy()  # DOUBLE sum, exact to 2^53 (a window's AVG is over released values)
        target = new.this.expressions[0] if distinct else new.this
        target.replace(_double(target))
        return new
    value = inner.copy()
    if kind == INT:
        value = exp.Cast(this=value, to=_type("DECIMAL(38, 0)"))
    total = exp.Sum(this=exp.Distinct(expressions=[value]) if distinct else value)
    count = exp.Count(this=exp.Distinct(expressions=[inner.copy()]) if distinct else inner.copy())
    divisor = exp.Nullif(this=count, expression=exp.Literal.number(0))
    return exp.Div(this=_double(total), expression=_double(divisor))


def _sum_exactly(node: exp.Sum, types: Types) -> exp.Expr:
    """DuckDB sums integers into HUGEINT (exact to 1.7e38); Spark into BIGINT, which overflows
    at 2^63, i.e. after 2^31 record keys of 32 bits. DECIMAL(38, 0) is exact to 1e38 in both."""
    argument = node.this
    inner = argument.expressions[0] if isinstance(argument, exp.Distinct) else argument
    kind = types.of(inner)
    if kind in (DECIMAL, FLOAT, NULL):
        return node
    if kind != INT:
        raise _refuse(node, f"SUM of {_a(kind)}")
    new = node.copy()
    target = new.this.expressions[0] if isinstance(new.this, exp.Distinct) else new.this
    target.replace(exp.Cast(this=target.copy(), to=_type("DECIMAL(38, 0)")))
    return new


_CAST_REFUSALS = {
    (FLOAT, DECIMAL): "DuckDB rounds the binary value (0.285 → 0.28), Spark its decimal digits",
    (FLOAT, TEXT): "DuckDB writes 1e+20, Spark 1.0E20",
    (TEXT, INT): "DuckDB accepts '2.5' (→ 3), Spark raises",
}


_CAST_TARGETS = {
    exp.DataType.Type.INT, exp.DataType.Type.BIGINT, exp.DataType.Type.INT128,
    exp.DataType.Type.DOUBLE, exp.DataType.Type.DECIMAL, exp.DataType.Type.VARCHAR,
    exp.DataType.Type.TEXT,
}  # fmt: skip


def _cast(node: exp.Cast, types: Types) -> exp.Expr:
    """DuckDB rounds to integers (DOUBLE half to even, DECIMAL half away from zero); Spark
    truncates. Spark has no HUGEINT: DECIMAL(38, 0) holds its values (the DP sums of
    :func:`sqlsdc.rewrite.dp_bounding._scaled`). Other casts are portable only between the types and
    classes tested."""
    if node.to.this not in _CAST_TARGETS:
        raise _refuse(
            node, "only casts to INTEGER, BIGINT, HUGEINT, DOUBLE, DECIMAL and VARCHAR are tested"
        )
    source, target = types.of(node.this), type_class(node.to)
    huge = node.to.this == exp.DataType.Type.INT128
    to = _type("DECIMAL(38, 0)") if huge else node.to.copy()
    if target == INT and source == FLOAT:
        return exp.Cast(this=exp.func("BROUND", node.this.copy()), to=to)
    if target == INT and source == DECIMAL:
        return exp.Cast(this=exp.Round(this=node.this.copy()), to=to)
    if huge and source in (INT, NULL):
        return exp.Cast(this=node.this.copy(), to=to)
    portable = {
        INT: (INT, BOOL, NULL),
        DECIMAL: (INT, DECIMAL, NULL),
        FLOAT: (*NUMERIC, NULL),
        TEXT: (INT, DECIMAL, TEXT, BOOL, NULL),
    }
    if source in portable.get(target, ()):
        return node
    why = _CAST_REFUSALS.get((source, target), f"a cast of {_a(source)} to {target} is untested")
    raise _refuse(node, why)


def _round(node: exp.Round, types: Types) -> exp.Expr:
    """DuckDB rounds a DOUBLE to n ≠ 0 digits as round(x·10^n)/10^n (x/10^-n for n < 0) and
    keeps x when that is not finite; Spark rounds the decimal digits of x (0.285 → 0.29).
    DuckDB's zero keeps the sign of x (C's round); Spark's is +0.0 (:func:`_zero_of`)."""
    kind, digits = types.of(node.this), int_literal(node.args.get("decimals")) or 0
    if kind in (INT, DECIMAL, NULL):
        return node
    if kind != FLOAT:
        raise _refuse(node, f"ROUND of {_a(kind)}")
    x = exp.Paren(this=node.this.copy())
    half = exp.Literal.number(0.5)
    if digits == 0:  # std::round is ±0 exactly for |x| < 0.5
        small = exp.LT(this=exp.Abs(this=x.copy()), expression=half)
        return exp.Case(ifs=[exp.If(this=small, true=_zero_of(x))], default=exp.Round(this=x))
    scale = exp.Cast(this=exp.Literal.number(10 ** abs(digits)), to=_type("DOUBLE"))
    if digits > 0:
        scaled = exp.Mul(this=x.copy(), expression=scale.copy())
        rounded = exp.Div(this=exp.Round(this=scaled.copy()), expression=scale)
    else:
        scaled = exp.Div(this=x.copy(), expression=scale.copy())
        rounded = exp.Mul(this=exp.Round(this=scaled.copy()), expression=scale)
    small = exp.LT(this=exp.Abs(this=scaled), expression=half)
    finite = exp.LT(this=exp.Abs(this=rounded), expression=_infinity())
    return exp.Case(
        ifs=[exp.If(this=small, true=_zero_of(x)), exp.If(this=finite, true=rounded.copy())],
        default=x.copy(),
    )


def _zero_of(x: exp.Expr) -> exp.Expr:
    """The zero of the sign of ``x`` (finite), what C's round, floor and ceil (DuckDB's) give
    where they round ``x`` to zero: ROUND(-0.4), CEIL(-0.5) and FLOOR(-0.0) are -0.0. Spark
    rounds through BigDecimal or BIGINT to +0.0. The two zeros are equal, but 1 / zero is -inf
    or +inf: ``1 / ROUND(-income / 1e9) < 0`` held every row with an income on DuckDB and none
    on Spark, under one DP cell identity (red team s47k)."""
    zero = exp.Cast(this=exp.Literal.number(0), to=_type("DOUBLE"))
    return exp.Paren(this=exp.Mul(this=exp.Paren(this=x.copy()), expression=zero))


def _floor_or_ceil(node: exp.Floor | exp.Ceil, types: Types) -> exp.Expr:
    """DuckDB's FLOOR/CEIL of an integer or DOUBLE is a DOUBLE; Spark's is a BIGINT and raises
    beyond 2^63. Doubles from 2^52 up are integers already, and NaN sorts above them."""
    kind = types.of(node.this)
    if kind == DECIMAL:
        return node
    if kind in (INT, NULL):
        return _double(node.this)
    if kind != FLOAT:
        raise _refuse(node, f"{written_name(node) or node.sql_name()} of {_a(kind)}")
    integral = exp.GTE(this=exp.Abs(this=node.this.copy()), expression=exp.Literal.number(2**52))
    x, one, zero = node.this, exp.Literal.number(1), exp.Literal.number(0)
    if isinstance(node, exp.Floor):  # floor is ±0 exactly on [0, 1), ceil on (-1, 0]
        zeroed = exp.and_(exp.GTE(this=x.copy(), expression=zero),
                          exp.LT(this=x.copy(), expression=one))  # fmt: skip
    else:
        zeroed = exp.and_(exp.GT(this=x.copy(), expression=exp.Neg(this=one)),
                          exp.LTE(this=x.copy(), expression=zero))  # fmt: skip
    return exp.Case(
        ifs=[exp.If(this=integral, true=x.copy()), exp.If(this=zeroed, true=_zero_of(x))],
        default=_double(node),
    )


def _grouping(node: exp.Grouping, types: Types) -> exp.Expr:
    """DuckDB's GROUPING(a, b) is the bit mask 2·GROUPING(a) + GROUPING(b), a BIGINT; Spark's
    GROUPING takes one argument and is a TINYINT. Under a plain GROUP BY, DuckDB's GROUPING is
    0 and Spark's an error."""
    arguments = node.expressions
    bigint = _type("BIGINT")
    select = node.find_ancestor(exp.Select)
    group = select.args.get("group") if select is not None else None
    if group is None or group.find(exp.Cube, exp.Rollup, exp.GroupingSets) is None:
        return exp.Cast(this=exp.Literal.number(0), to=bigint)
    if len(arguments) == 1:
        return exp.Cast(this=node.copy(), to=bigint)
    bits = [
        exp.Mul(
            this=exp.Cast(this=exp.Grouping(expressions=[a.copy()]), to=bigint.copy()),
            expression=exp.Literal.number(2 ** (len(arguments) - 1 - i)),
        )
        for i, a in enumerate(arguments)
    ]
    total = bits[0]
    for bit in bits[1:]:
        total = exp.Add(this=total, expression=bit)
    return total


def _is_nan(node: exp.IsNan, types: Types) -> exp.Expr:
    """ISNAN(NULL) is NULL in DuckDB and false in Spark."""
    missing = exp.Is(this=node.this.copy(), expression=exp.Null())
    return exp.Case(ifs=[exp.If(this=missing, true=exp.Null())], default=node.copy())


def _compare(node: exp.Expr, types: Types) -> exp.Expr:
    """A VARCHAR compared with a number is cast to INTEGER by DuckDB and to BIGINT by Spark;
    integers compared with wide decimals are cast as DuckDB casts them (:func:`_mix_exactly`)."""
    operands = [v for k, v in node.args.items() if k != "expressions" and isinstance(v, exp.Expr)]
    operands += node.args.get("expressions", [])
    classes = {types.of(o) for o in operands}
    if TEXT in classes and classes & set(NUMERIC):
        raise _refuse(node, "it compares a VARCHAR with a number")
    _mix_exactly(node, operands, types)
    return node


_DUCKDB_DIGITS = {
    "TINYINT": 3, "SMALLINT": 5, "INTEGER": 10, "BIGINT": 19,
    "UTINYINT": 3, "USMALLINT": 5, "UINTEGER": 10, "UBIGINT": 20,
}  # fmt: skip
"""The digits of DuckDB's integer types, as it widens them to DECIMAL to compare or mix them
with decimals (:mod:`sqlsdc.planner.exact_mixing`)."""
_CAST_DIGITS = {
    exp.DataType.Type.TINYINT: 3, exp.DataType.Type.SMALLINT: 5, exp.DataType.Type.INT: 10,
    exp.DataType.Type.BIGINT: 19,
}  # fmt: skip
_SPARK_EXACT_SCALE = 18
"""Spark widens every integer type to at most DECIMAL(20, 0) (a BIGINT): beside decimals of at
most 18 decimals the widened type fits 38 digits, and nothing is rounded."""


def _mix_exactly(node: exp.Expr, operands: list[exp.Expr], types: Types) -> None:
    """Integers compared with (or chosen among) decimals of many decimals are widened by Spark
    to other digits than DuckDB (mutates ``node``'s operands).

    Both engines compare or mix an integer with a DECIMAL in a DECIMAL holding the integer
    type's digits and the decimals; DuckDB gives a BIGINT 19 digits, Spark 20 (a UINTEGER 10
    and 20), and where the two need more than 38 digits, Spark rounds the decimals away
    (DuckDB's guard refuses what needs more than 38 in DuckDB). So ``CAST(month AS BIGINT) =
    3.0000000000000000001`` held no row on DuckDB and every row of month 3 on Spark: a DP cell
    named by that condition had DuckDB's noise over other rows, and the two answers' difference
    was the month's exact cell (red team s47k). An integer operand of known DuckDB type is cast
    to DECIMAL of its DuckDB digits, which holds each of its values exactly; an integer of
    unknown type beside decimals of more than 18 (or unknown) decimals is refused."""
    integers = [o for o in operands if types.of(o) == INT and not _is_literal(o)]
    scales = [_scale(o, types) for o in operands if types.of(o) == DECIMAL]
    if not integers or all(s is not None and s <= _SPARK_EXACT_SCALE for s in scales):
        return
    for operand in integers:
        digits = _integer_digits(operand, types)
        if digits is None:
            raise _refuse(
                node,
                "Spark would widen an integer of unknown type beside a decimal of more than "
                f"{_SPARK_EXACT_SCALE} decimals to other digits than DuckDB; cast the integer "
                "to a DECIMAL or to DOUBLE",
            )
        cast = exp.Cast(this=operand.copy(), to=exp.DataType.build(f"DECIMAL({digits}, 0)"))
        types.inherit(cast, operand)
        operand.replace(cast)


def _is_literal(node: exp.Expr) -> bool:
    node = node.this if isinstance(node, exp.Neg) else node
    return isinstance(node, (exp.Literal, exp.Null))


def _integer_digits(node: exp.Expr, types: Types) -> int | None:
    """The digits of DuckDB's integer type of ``node`` (a copied column, a cast, a COUNT)."""
    stored = types.stored(node)
    if stored is not None:
        return _DUCKDB_DIGITS.get(stored.upper())
    node = node.unnest()
    if isinstance(node, exp.Cast):  # DECIMAL(38, 0): a HUGEINT, as translated
        if node.to.this == exp.DataType.Type.DECIMAL and _scale_of_type(node.to) == 0:
            return _precision_of_type(node.to)
        return _CAST_DIGITS.get(node.to.this)
    return 19 if isinstance(node, exp.Count) else None


def _scale(node: exp.Expr, types: Types) -> int | None:
    """The decimals of a DECIMAL value of known type (a literal, a column, a cast); 0 for a
    HUGEINT or UBIGINT column, which Spark holds as DECIMAL(38, 0) or DECIMAL(20, 0)."""
    for declared in (types.stored(node), types.registered(node)):
        if declared is None:
            continue
        found = re.fullmatch(r"DECIMAL\(\s*\d+\s*,\s*(\d+)\s*\)", declared.upper())
        if found:
            return int(found.group(1))
        return 0 if type_class(declared) == INT else None
    node = node.unnest()
    node = node.this if isinstance(node, exp.Neg) else node
    if isinstance(node, exp.Literal) and node.is_number:
        text = str(node.this)
        return len(text.split(".")[1]) if "." in text and "e" not in text.lower() else 0
    if isinstance(node, exp.Cast):
        return _scale_of_type(node.to)
    return None


def _decimal_params(dtype: exp.DataType) -> tuple[int, int] | None:
    """(precision, scale) of a DECIMAL type, DuckDB's DECIMAL(18, 3) when not written."""
    if dtype.this != exp.DataType.Type.DECIMAL:
        return None
    params = [int(p.this.this) for p in dtype.expressions if isinstance(p.this, exp.Literal)]
    return (params[0], params[1]) if len(params) == 2 else (params[0], 0) if params else (18, 3)


def _scale_of_type(dtype: exp.DataType) -> int | None:
    params = _decimal_params(dtype)
    return params[1] if params else None


def _precision_of_type(dtype: exp.DataType) -> int | None:
    params = _decimal_params(dtype)
    return params[0] if params else None


def _mix_choice(node: exp.Expr, types: Types) -> exp.Expr:
    """GREATEST, LEAST, COALESCE, NULLIF, IF and CASE widen their values (and a simple CASE
    its operand and WHEN values) to one type as comparisons do (:func:`_mix_exactly`)."""
    if isinstance(node, exp.Case):
        ifs = node.args.get("ifs") or []
        if node.this is not None:
            _mix_exactly(node, [node.this, *(i.this for i in ifs)], types)
        values = [i.args.get("true") for i in ifs] + [node.args.get("default")]
    elif isinstance(node, exp.If):
        if simple_case(node):
            return node
        values = [node.args.get("true"), node.args.get("false")]
    elif isinstance(node, exp.Nullif):
        values = [node.this, node.expression]
    else:
        values = [node.this, *node.expressions]
    _mix_exactly(node, [v for v in values if v is not None], types)
    return node


def simple_case(node: exp.Expr) -> bool:
    """A WHEN of a CASE (its values are the CASE's: :func:`_mix_choice` of the CASE)."""
    return node.arg_key == "ifs" and isinstance(node.parent, exp.Case)


def _top_values(node: exp.Max, types: Types) -> exp.Expr:
    """DuckDB's ``MAX(x, n)`` (the n largest values, ties kept, NULLs ignored, NULL for no
    values) has no Spark aggregate → the first n of the values sorted in descending order."""
    if node.args.get("count") is None:
        return node
    values = exp.Anonymous(this="COLLECT_LIST", expressions=[node.this.copy()])
    descending = exp.Anonymous(this="SORT_ARRAY", expressions=[values, exp.false()])
    return exp.Anonymous(
        this="SLICE", expressions=[descending, exp.Literal.number(1), node.args["count"].copy()]
    )


def _bottom_values(node: exp.Min, types: Types) -> exp.Expr:
    """DuckDB's ``MIN(x, n)`` (the n smallest values, ties kept, NULLs ignored) has no Spark
    aggregate → the first n of the values sorted in ascending order. Only ``LIST_MAX`` of it is
    portable (the n-th smallest value; NULL over no values on both engines)."""
    if node.args.get("count") is None:
        return node
    values = exp.Anonymous(this="COLLECT_LIST", expressions=[node.this.copy()])
    ascending = exp.Anonymous(this="SORT_ARRAY", expressions=[values, exp.true()])
    return exp.Anonymous(
        this="SLICE", expressions=[ascending, exp.Literal.number(1), node.args["count"].copy()]
    )


def _hash(node: exp.Expr, types: Types) -> exp.Expr:
    """DuckDB's ``hash(a, b, ...)`` is a 64-bit hash (a UBIGINT) of the values by their DuckDB
    types, Spark's a 32-bit Murmur3 → :data:`HASH_UDF`, which computes DuckDB's
    (:mod:`sqlsdc.engines.duckdb_hash`) as DECIMAL(20, 0), over a struct of the arguments.

    The hash depends on the DuckDB type of each argument (an INTEGER -1 and a BIGINT -1 hash
    apart), and the UDF sees Spark's types. So an argument must be a column (or MIN or MAX of
    one) of a table copied from DuckDB whose type is in :data:`HASHED_DUCKDB_TYPES` (the copy
    keeps its hash), or a VARCHAR or BOOLEAN computed from such columns; anything else is
    refused."""
    if not is_hash(node):
        return node
    fields: list[exp.Expr] = []
    for position, argument in enumerate(node.expressions):
        problem = _unhashable(argument, types)
        if problem:
            raise _refuse(node, problem)
        fields += [exp.Literal.string(f"a{position}"), argument.copy()]
    struct = exp.Anonymous(this="NAMED_STRUCT", expressions=fields)
    return exp.Anonymous(this=HASH_UDF, expressions=[struct])


def _unhashable(argument: exp.Expr, types: Types) -> str:
    """Why Spark cannot hash ``argument`` as DuckDB does ("" if it can)."""
    stored = types.stored(argument)
    if stored is not None:
        if HASHED_DUCKDB_TYPES.fullmatch(stored):
            return ""
        return f"hash of {_a(stored)} column, which Spark's copy does not hash as DuckDB does"
    kind = types.of(argument)
    if kind not in (TEXT, BOOL, FLOAT, NULL):
        return (
            f"hash of a computed {kind} (or of a column not copied with load_duckdb), whose "
            "DuckDB type Spark does not know"
        )
    return _computed_problem(argument, types)


def _computed_problem(value: exp.Expr, types: Types) -> str:
    """Why a computed VARCHAR, BOOLEAN or DOUBLE may be typed or valued otherwise on Spark
    ("" if not). Its DuckDB type is the class's one type when every column it reads (through
    derived tables) is a copied column of :data:`HASHED_DUCKDB_TYPES` other than FLOAT (casts
    to FLOAT are refused); row-level operations give the same bits on both engines (this
    module's rewrites), aggregates of DOUBLEs do not (the order of additions). Numbers of more
    than 15 digits (HUGEINT, UBIGINT, DECIMAL(16+)) are left out too: DuckDB converts them to
    DOUBLE in two roundings, Spark in one, which may differ in the last bit."""
    for node in value.walk():
        if isinstance(node, exp.AggFunc):
            return f"hash of a value computed by the aggregate {node.sql('duckdb')[:40]}"
        if not isinstance(node, exp.Column):
            continue
        found = types.defined_as(node)
        if isinstance(found, exp.Expr):
            problem = _computed_problem(found, types)
            if problem:
                return problem
            continue
        stored = types.stored(node) if found is not None else None
        if stored is None:
            return (
                f"hash of a value computed from {node.sql('duckdb')}, whose DuckDB type is not "
                "known (a column not copied with load_duckdb, or read through a star)"
            )
        if not HASHED_DUCKDB_TYPES.fullmatch(stored) or _wide(stored):
            return f"hash of a value computed from {node.sql('duckdb')}, of type {stored}"
    return ""


def _wide(stored: str) -> bool:
    """A FLOAT, or a number whose conversion to DOUBLE may differ between the engines."""
    if stored.startswith("DECIMAL("):
        return int(stored[8:].split(",")[0]) > 15
    return stored in ("FLOAT", "HUGEINT", "UBIGINT")


def _element(node: exp.Bracket, types: Types) -> exp.Expr:
    """DuckDB's ``list[j]`` is NULL beyond the end; Spark's ``array[j]`` raises in ANSI mode →
    ``TRY_ELEMENT_AT`` (1-based, NULL beyond the end)."""
    position = int_literal(node.expressions[0]) + 1  # the tree's index is 0-based
    return exp.Bracket(
        this=node.this.copy(), expressions=[exp.Literal.number(position)], offset=1, safe=True
    )


def _in_any_order(rule: Callable[[exp.Expr, Types], exp.Expr], exact: tuple[str, ...]):
    """``rule`` for an aggregate that the rewrite orders by its values (``SUM(x ORDER BY x)``,
    :mod:`sqlsdc.rewrite.order`: floating-point additions depend on their order, which hidden
    groups move). Spark has no ordered aggregates: over values of the ``exact`` classes the
    result is the same in any order, and the ORDER BY is dropped; over others it is refused."""

    def apply(node: exp.Expr, types: Types) -> exp.Expr:
        argument = node.this
        if isinstance(argument, exp.Order):
            value = argument.this
            inner = value.expressions[0] if isinstance(value, exp.Distinct) else value
            if types.of(inner) not in exact:
                raise _refuse(
                    node,
                    f"over {_a(types.of(inner))} its result depends on the order "
                    "Spark reads the values in, which hidden groups can change",
                )
            node.set("this", value)  # in place: ``types`` knows the nodes below
        return rule(node, types)

    return apply


_DISTINCT_CLASSES = (INT, DECIMAL, TEXT, BOOL)
"""Classes whose distinct values and their order are the same on both engines (DOUBLE's -0.0
and NaN are not)."""


def _kept_values(node: exp.Expr, types: Types) -> exp.Expr:
    """A unit's at most r smallest distinct non-NULL values of ``x``: DuckDB's
    ``LIST_SLICE(LIST_SORT(LIST_DISTINCT(ARRAY_AGG(x))), 1, r)`` (LIST_DISTINCT drops NULLs) is
    Spark's ``SLICE(ARRAY_SORT(ARRAY_DISTINCT(COLLECT_LIST(x))), 1, r)`` (COLLECT_LIST drops
    them), values of a class both engines tell apart and order alike."""
    value = kept_values_of(node)
    kind = types.of(value)
    if kind not in _DISTINCT_CLASSES:
        raise _refuse(node, f"the distinct values of {_a(kind)}")
    listed = exp.Anonymous(this="COLLECT_LIST", expressions=[value.copy()])
    distinct = exp.Anonymous(this="ARRAY_DISTINCT", expressions=[listed])
    ordered = exp.Anonymous(this="ARRAY_SORT", expressions=[distinct])
    return exp.Anonymous(
        this="SLICE", expressions=[ordered, *(e.copy() for e in node.expressions[1:])]
    )


def _anonymous(node: exp.Expr, types: Types) -> exp.Expr:
    return _kept_values(node, types) if is_list_slice(node) else _hash(node, types)


def _distinct_count(node: exp.Length, types: Types) -> exp.Expr:
    """A cell's number of distinct values, DuckDB's ``LEN(LIST_DISTINCT(FLATTEN(ARRAY_AGG(k))))``
    (a BIGINT; NULL over no rows, where Spark's COLLECT_LIST is empty) → a BIGINT SIZE of
    Spark's lists, NULL when the scope has no rows."""
    lists = distinct_count_of(node)
    flat = exp.Anonymous(this="FLATTEN", expressions=[
        exp.Anonymous(this="COLLECT_LIST", expressions=[lists.copy()])])  # fmt: skip
    size = exp.Anonymous(this="SIZE", expressions=[
        exp.Anonymous(this="ARRAY_DISTINCT", expressions=[flat])])  # fmt: skip
    none = exp.EQ(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(0))
    return exp.Case(
        ifs=[exp.If(this=none, true=exp.Null())], default=exp.Cast(this=size, to=_type("BIGINT"))
    )


def _empty_sets(node: exp.Group, types: Types) -> exp.Expr:
    """DuckDB's ``GROUP BY ()`` (the grand total: one row, over no rows too) is a syntax error
    in Spark → ``GROUPING SETS (())``, which Spark answers so; a ``()`` beside other keys
    (``GROUP BY (), region``: the keys' groups) is dropped (mutates ``node``)."""
    keys = node.expressions
    kept = [k for k in keys if not (isinstance(k, exp.Tuple) and not k.expressions)]
    if len(kept) == len(keys):
        return node
    others = any(node.args.get(k) for k in ("grouping_sets", "cube", "rollup"))
    if not kept and not others:
        kept = [exp.GroupingSets(expressions=[exp.Tuple()])]
    node.set("expressions", kept)
    return node


def _int_divide(node: exp.IntDiv, types: Types) -> exp.Expr:
    """``//`` of integers is Spark's DIV; of anything else DuckDB divides otherwise."""
    kind = types.of(node.this)
    if kind not in (INT, NULL):
        raise _refuse(node, f"// of {_a(kind)} (a DOUBLE floor division in DuckDB)")
    return node


_SEMANTICS: dict[type[exp.Expr], Callable[[exp.Expr, Types], exp.Expr]] = {
    exp.Max: _top_values,
    exp.IntDiv: _int_divide,
    exp.Min: _bottom_values,
    exp.Anonymous: _anonymous,
    exp.Length: _distinct_count,
    exp.Bracket: _element,
    exp.Div: _divide,
    exp.Avg: _in_any_order(_average, (INT, DECIMAL, NULL)),
    exp.Sum: _in_any_order(_sum_exactly, (INT, DECIMAL, NULL)),
    exp.Cast: _cast,
    exp.Round: _round,
    exp.Floor: _floor_or_ceil,
    exp.Ceil: _floor_or_ceil,
    exp.Grouping: _grouping,
    exp.Group: _empty_sets,
    exp.IsNan: _is_nan,
    **{
        kind: _mix_choice
        for kind in (exp.Greatest, exp.Least, exp.Coalesce, exp.Nullif, exp.If, exp.Case)
    },
    **{
        kind: _compare
        for kind in (
            exp.EQ,
            exp.NEQ,
            exp.NullSafeEQ,
            exp.GT,
            exp.GTE,
            exp.LT,
            exp.LTE,
            exp.In,
            exp.Between,
        )  # fmt: skip
    },
}
