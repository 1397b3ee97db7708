"""Which DuckDB trees may reach Spark: the functions, operators and clauses tested on both
engines, and the argument shapes each is portable in (no types needed).

Pass 2 of :mod:`sqlsdc.engines.spark_translate`: sqlglot transpiles syntax, not meaning, and passes
unknown functions through, so a tree reaches Spark only if every node is a clause of
:data:`PORTABLE_CLAUSES` or a function or operator of :data:`PORTABLE_FUNCTIONS` in a shape its
rule accepts; anything else raises :class:`~sqlsdc.errors.NotSupportedError` naming it, before
Spark runs. The shape helpers (``is_hash``, ``kept_values_of`` …) are shared with the rewrites of
:mod:`sqlsdc.engines.spark_semantics`, which recognise the same shapes.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from sqlsdc.errors import NotSupportedError
from sqlsdc.written import written_name

HASH_UDF = "sqlsdc_duckdb_hash"
"""DuckDB's ``hash`` on Spark: the Arrow UDF each
:class:`sqlsdc.engines.spark.SparkEngine` registers on its session."""

PORTABLE_FUNCTIONS: frozenset[type[exp.Expr]] = frozenset(
    {
        # aggregates, window ranking, grouping
        exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max, exp.Bracket, exp.ArrayMax,
        # the distinct values of DP's COUNT(DISTINCT column) (_list_problem: two shapes only)
        exp.ArrayAgg, exp.ArrayDistinct, exp.ArraySort, exp.Flatten, exp.Length,
        exp.RowNumber, exp.Rank, exp.DenseRank, exp.Grouping,
        # scalar functions
        exp.Abs, exp.Least, exp.Greatest, exp.Coalesce, exp.Nullif, exp.Case, exp.If,
        exp.Cast, exp.Round, exp.Floor, exp.Ceil, exp.Sqrt, exp.IsNan,
        # operators
        exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Neg,
        exp.EQ, exp.NEQ, exp.NullSafeEQ, exp.GT, exp.GTE, exp.LT, exp.LTE,
        exp.And, exp.Or, exp.Not, exp.Is, exp.In, exp.Between,
    }
)  # fmt: skip
"""Functions and operators that may reach Spark: each is evaluated on both engines in tests.
DuckDB's ``hash`` (a function sqlglot does not know) is one too: see
:func:`sqlsdc.engines.spark_semantics._hash`."""

PORTABLE_CLAUSES: frozenset[type[exp.Expr]] = frozenset(
    {
        exp.Select, exp.From, exp.Join, exp.Where, exp.Group, exp.Having, exp.Order,
        exp.Ordered, exp.Limit, exp.Offset, exp.Subquery, exp.With, exp.CTE, exp.Union,
        exp.Qualify,
        exp.Cube, exp.Rollup, exp.GroupingSets, exp.Window, exp.WindowSpec, exp.Distinct,
        exp.Table, exp.TableAlias, exp.Column, exp.Identifier, exp.Alias, exp.Star,
        exp.Paren, exp.Tuple, exp.Literal, exp.Null, exp.Boolean, exp.DataType,
        exp.DataTypeParam,
    }
)  # fmt: skip
"""Query structure that means the same in both engines."""


def check_duckdb_tree(tree: exp.Expr) -> None:
    for node in tree.walk():
        if type(node) in PORTABLE_FUNCTIONS:
            problem = _ARGUMENT_RULES.get(type(node), _no_problem)(node)
        elif is_hash(node):
            problem = "" if node.expressions else "hash() needs an argument"
        elif is_list_slice(node):
            problem = _list_problem(node)
        elif type(node) in PORTABLE_CLAUSES:
            problem = _clause_problem(node)
        else:
            problem = (
                "it is not among the functions and clauses tested on both DuckDB and Spark "
                "(sqlsdc.engines.spark_portable.PORTABLE_FUNCTIONS)"
            )
        if problem:
            raise NotSupportedError(
                f"{_describe(node)} is not portable to Spark: {problem}; "
                "run this query on DuckDB, or write it without it"
            )


def _no_problem(node: exp.Expr) -> str:
    return ""


def int_literal(node: exp.Expr | None) -> int | None:
    negative = isinstance(node, exp.Neg)
    node = node.this if negative else node
    if isinstance(node, exp.Literal) and node.is_int:
        return -int(node.this) if negative else int(node.this)
    return None


def _mod_problem(node: exp.Mod) -> str:
    divisor = node.expression
    if isinstance(divisor, exp.Neg):
        divisor = divisor.this
    if isinstance(divisor, exp.Literal) and divisor.is_number and float(divisor.this) != 0:
        return ""
    return (
        "the divisor of % must be a non-zero constant (a DOUBLE remainder by zero is NaN in "
        "DuckDB and an error in Spark)"
    )


def _round_problem(node: exp.Round) -> str:
    if node.args.get("truncate") or node.args.get("casts_non_integer_decimals"):
        return "only ROUND(x) and ROUND(x, digits) are portable"
    digits = node.args.get("decimals")
    if digits is not None and (int_literal(digits) is None or abs(int_literal(digits)) > 22):
        return "the number of digits must be an integer constant between -22 and 22"
    return ""


def _floor_problem(node: exp.Floor | exp.Ceil) -> str:
    if node.args.get("decimals") is not None or node.args.get("to") is not None:
        return "only FLOOR(x) and CEIL(x) are portable"
    return ""


def _is_problem(node: exp.Is) -> str:
    return "" if isinstance(node.expression, exp.Null) else "only IS NULL is portable"


def _in_problem(node: exp.In) -> str:
    if any(node.args.get(k) for k in ("query", "unnest", "field")):
        return "only IN with a list of values is portable"
    return ""


def _max_problem(node: exp.Max) -> str:
    count = node.args.get("count")
    if count is None or (int_literal(count) is not None and int_literal(count) >= 1):
        return ""
    return "the n of MAX(x, n) must be a positive integer constant"


def _min_problem(node: exp.Min) -> str:
    count = node.args.get("count")
    if count is None:
        return ""
    if not isinstance(node.parent, exp.ArrayMax):
        return "only LIST_MAX(MIN(x, n)), the n-th smallest value, is portable"
    if int_literal(count) is None or int_literal(count) < 1:
        return "the n of MIN(x, n) must be a positive integer constant"
    return ""


def _list_max_problem(node: exp.ArrayMax) -> str:
    if isinstance(node.this, exp.Min) and node.this.args.get("count") is not None:
        return ""
    return "only LIST_MAX(MIN(x, n)), the n-th smallest value, is portable"


def _bracket_problem(node: exp.Bracket) -> str:
    top = node.this
    if (
        isinstance(top, exp.Max)
        and top.args.get("count") is not None
        and len(node.expressions) == 1
        and int_literal(node.expressions[0]) is not None
        and int_literal(node.expressions[0]) >= 0
    ):
        return ""
    return "only an element of MAX(x, n) at a constant position is portable"


def _between_problem(node: exp.Between) -> str:
    return "BETWEEN SYMMETRIC is DuckDB only" if node.args.get("symmetric") else ""


def is_hash(node: exp.Expr) -> bool:
    """Whether ``node`` is DuckDB's ``hash(...)`` (a function sqlglot does not know)."""
    return isinstance(node, exp.Anonymous) and node.name.upper() == "HASH"


def is_list_slice(node: exp.Expr) -> bool:
    return isinstance(node, exp.Anonymous) and node.name.upper() == "LIST_SLICE"


_LIST_NODES = (exp.ArrayAgg, exp.ArrayDistinct, exp.ArraySort, exp.Flatten, exp.Length)


def _list_problem(node: exp.Expr) -> str:
    """Lists are portable in the two shapes of DP's COUNT(DISTINCT column) only
    (:func:`sqlsdc.rewrite.dp_bounding._kept_values` and its count): a unit's at most r smallest
    distinct values of a column, ``LIST_SLICE(LIST_SORT(LIST_DISTINCT(ARRAY_AGG(x))), 1, r)``,
    and a cell's number of distinct values, ``LEN(LIST_DISTINCT(FLATTEN(ARRAY_AGG(k))))``."""
    top = node
    while isinstance(top.parent, _LIST_NODES) or is_list_slice(top.parent):
        top = top.parent
    if kept_values_of(top) is not None or distinct_count_of(top) is not None:
        return ""
    return (
        "lists are portable only as the distinct values of COUNT(DISTINCT column) under "
        "differential privacy"
    )


def kept_values_of(node: exp.Expr) -> exp.Expr | None:
    """``x`` of ``LIST_SLICE(LIST_SORT(LIST_DISTINCT(ARRAY_AGG(x))), 1, r)`` (else None)."""
    if not is_list_slice(node) or len(node.expressions) != 3:
        return None
    listed, start, end = node.expressions
    if int_literal(start) != 1 or (int_literal(end) or 0) < 1:
        return None
    ordered = isinstance(listed, exp.ArraySort) and not listed.args.get("expression")
    if not ordered or listed.args.get("nulls_first") not in (None, exp.false()):
        return None
    distinct = listed.this
    if not isinstance(distinct, exp.ArrayDistinct) or not isinstance(distinct.this, exp.ArrayAgg):
        return None
    return distinct.this.this if isinstance(distinct.this.this, exp.Column) else None


def distinct_count_of(node: exp.Expr) -> exp.Expr | None:
    """``k`` of ``LEN(LIST_DISTINCT(FLATTEN(ARRAY_AGG(k))))`` (else None)."""
    if not isinstance(node, exp.Length) or not isinstance(node.this, exp.ArrayDistinct):
        return None
    flat = node.this.this
    if not isinstance(flat, exp.Flatten) or not isinstance(flat.this, exp.ArrayAgg):
        return None
    return flat.this.this if isinstance(flat.this.this, exp.Column) else None


def _int_div_problem(node: exp.IntDiv) -> str:
    """DuckDB's ``//`` of integers truncates, as Spark's DIV does, and both raise on zero (the
    DP bounding report's ``CAST(a AS BIGINT) // CAST(b AS BIGINT)``); by a constant other than
    0 and -1 (``INT_MIN // -1`` overflows in DuckDB's INTEGER, not in Spark's BIGINT result).
    Of DOUBLEs it is a DOUBLE in DuckDB and an error in Spark
    (:func:`sqlsdc.engines.spark_semantics._int_divide`)."""
    bigints = all(
        isinstance(o, exp.Cast) and o.to.this == exp.DataType.Type.BIGINT
        for o in (node.this, node.expression)
    )
    if bigints or int_literal(node.expression) not in (None, 0, -1):
        return ""
    return "only // of two values cast to BIGINT, or by an integer constant but 0 and -1"


_ARGUMENT_RULES: dict[type[exp.Expr], Callable[[exp.Expr], str]] = {
    **{kind: _list_problem for kind in _LIST_NODES},
    exp.IntDiv: _int_div_problem,
    exp.Mod: _mod_problem,
    exp.Round: _round_problem,
    exp.Floor: _floor_problem,
    exp.Ceil: _floor_problem,
    exp.Is: _is_problem,
    exp.In: _in_problem,
    exp.Between: _between_problem,
    exp.Max: _max_problem,
    exp.Min: _min_problem,
    exp.ArrayMax: _list_max_problem,
    exp.Bracket: _bracket_problem,
}


def _clause_problem(node: exp.Expr) -> str:
    if isinstance(node, exp.Join):
        if node.args.get("method") or node.args.get("match_condition"):
            return "only INNER, LEFT, RIGHT, FULL and CROSS joins with ON are portable"
        if node.args.get("using") and (node.side or node.kind not in ("", "INNER")):
            return "only INNER joins may be written with USING"
        if node.args.get("using") and has_star(node.parent):
            return "a USING join's * puts the key first in Spark; name the columns"
        if (node.kind or "INNER") not in ("INNER", "OUTER", "CROSS"):
            return f"{node.kind} joins are not portable"
    if isinstance(node, exp.Qualify):
        return _qualify_problem(node.parent)
    if isinstance(node, exp.Group) and node.args.get("all"):
        return "GROUP BY ALL is not portable; list the keys"
    if isinstance(node, exp.Distinct) and node.args.get("on") is not None:
        return "DISTINCT ON is DuckDB only"
    if isinstance(node, exp.Table) and node.catalog:
        return "tables are named by schema and name only"
    return ""


def _qualify_problem(select: exp.Expr) -> str:
    """Spark has no QUALIFY: sqlglot moves the SELECT into a subquery with the window as a
    column ``_w`` and filters on it, which keeps the meaning only for a SELECT of named columns
    without ORDER BY, LIMIT or DISTINCT (a star would return ``_w`` too, ORDER BY and LIMIT would
    move inside the filter)."""
    if not isinstance(select, exp.Select):
        return "QUALIFY is portable in a SELECT only"
    if has_star(select):
        return "QUALIFY is portable only with the columns named (no *)"
    if any(select.args.get(k) for k in ("order", "limit", "offset", "distinct")):
        return "QUALIFY is portable only without ORDER BY, LIMIT, OFFSET and DISTINCT"
    return ""


def has_star(select: exp.Expr) -> bool:
    return isinstance(select, exp.Select) and any(
        isinstance(p, exp.Star) or isinstance(p.this, exp.Star) for p in select.selects
    )


def _describe(node: exp.Expr) -> str:
    """The refused node, a function by the name the statement wrote (``substr``, not
    sqlglot's ``substring``)."""
    if isinstance(node, exp.Func):
        return f"function {written_name(node) or node.sql_name().lower()}()"
    return f"{type(node).__name__.upper()} ({node.sql('duckdb')[:60]})"
