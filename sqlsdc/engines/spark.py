"""The Spark engine: the protected sqlglot tree runs on PySpark and returns DuckDB's answers.

ARCHITECTURE.md §7: the rewriter emits one engine-neutral tree; DuckDB runs it embedded, Spark
runs it at scale. sqlglot transpiles syntax, not meaning: it passes unknown functions through
(``hash`` is a 64-bit hash in DuckDB and a 32-bit signed Murmur3 in Spark) and keeps operators
whose results differ per engine. So a tree reaches Spark only through four passes:

1. ``read_as_duckdb``: the tree is re-read from the DuckDB SQL that the DuckDB engine runs, so
   semantics that sqlglot's DuckDB generator adds become explicit nodes (a ``LEAST`` built by a
   rewrite is NULL if any argument is NULL in DuckDB SQL, but not in Spark SQL).
2. ``check_portable``: every node must be a clause of :data:`PORTABLE_CLAUSES` or a function or
   operator of :data:`PORTABLE_FUNCTIONS`, each tested on both engines in ``tests/test_spark.py``.
   Anything else raises :class:`~sqlsdc.errors.NotSupportedError` naming it, before Spark runs.
3. ``rename_tables``: ``sqlsdc.ptable`` becomes the temporary view ``sqlsdc__ptable``.
4. ``keep_duckdb_semantics``: where the engines differ, the node is rewritten so that Spark
   computes DuckDB's value, or refused. Some rewrites depend on the type of an argument, so
   column types come from the view schemas (:class:`SparkEngine` passes them).

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
  tables copied by :meth:`SparkEngine.load_duckdb` of the types it keeps, or row-level VARCHAR,
  BOOLEAN and DOUBLE values computed from them; other arguments → refused.
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
  keys as Spark reads them); :func:`as_types` casts them to the types DuckDB binds for the same
  SQL, exactly or not at all (the guarded path, :mod:`sqlsdc.guard.spark`).

Integer overflow raises in both engines only under Spark's ANSI mode, so :class:`SparkEngine`
turns it on and refuses to run if it was turned off. The hardened DuckDB reads times in UTC
(``SET GLOBAL TimeZone = 'UTC'``); Spark in its session time zone, so that ``tz >= '2024-01-01'``
over a TIMESTAMP WITH TIME ZONE column counted other rows under one cell identity (red team
s36e) → the engine sets the session time zone to UTC and refuses to run if it was changed;
likewise Parquet dates are read without Julian rebasing (a LEGACY session moved 1582-10-04 to
1582-09-24, its hash, and the groups units kept). Every setting of :data:`SESSION` is pinned so
(decimal products keep DuckDB's digits, ordinals, case, literals, legacy meanings), and a
session that sets any other ``spark.sql.legacy.*`` is refused. A column of a collated string
type (``string collate UTF8_LCASE``) is refused when registered: Spark groups by the collation.
Floating-point SUM and AVG over rows depend on the order of additions, in Spark as in a
multi-threaded DuckDB: they agree to about 1e-15 relative, not bit for bit (the one difference
``tests/spark_differential.py`` still finds). Counts, integer and decimal sums and averages,
cell keys (``SUM(__rkey) % 4294967296``), thresholds, NULLs and DP's exact cells are exact.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse
from urllib.request import url2pathname

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.optimizer.scope import Scope, traverse_scope

from sqlsdc.engines.duckdb_hash import HASHED_DUCKDB_TYPES
from sqlsdc.errors import Error, NotSupportedError, OperationalError, ProgrammingError

if TYPE_CHECKING:
    import duckdb
    from pyspark.sql import DataFrame, SparkSession

DIALECT = "spark"
INSTALL_HINT = 'install it with: pip install "sqlsdc[spark]"'
ANSI = "spark.sql.ansi.enabled"
TIME_ZONE = "spark.sql.session.timeZone"
REBASE = "spark.sql.parquet.datetimeRebaseModeInRead"
SESSION = {
    ANSI: ("true", "Spark would wrap integer overflow where DuckDB raises"),
    TIME_ZONE: ("UTC", "Spark would read times and compare TIMESTAMP WITH TIME ZONE values "
                       "with text in another time zone than DuckDB's UTC"),
    REBASE: ("CORRECTED", "Spark would shift dates and times before 1582 of the Parquet "
                          "copies, which DuckDB writes in the proleptic Gregorian calendar"),
    "spark.sql.parquet.int96RebaseModeInRead": (
        "CORRECTED", "Spark would shift INT96 times before 1900 of Parquet files"),
    "spark.sql.parquet.inferTimestampNTZ.enabled": (
        "true", "Spark would read DuckDB's TIMESTAMP (without time zone) as an instant"),
    "spark.sql.decimalOperations.allowPrecisionLoss": (
        "false", "Spark would round a product of decimals to fewer digits than DuckDB keeps "
                 "(DECIMAL(20, 5) * DECIMAL(20, 5): 7 digits instead of 10)"),
    "spark.sql.legacy.exponentLiteralAsDecimal.enabled": (
        "false", "Spark would read 5.0e-01 as a DECIMAL, DuckDB reads a DOUBLE"),
    "spark.sql.legacy.literal.pickMinimumPrecision": (
        "true", "Spark would type integer literals in decimal arithmetic otherwise"),
    "spark.sql.caseSensitive": (
        "false", "Spark would tell column names apart by case, which DuckDB does not"),
    "spark.sql.groupByOrdinal": ("true", "GROUP BY 1 would group by the constant 1"),
    "spark.sql.orderByOrdinal": (
        "true", "ORDER BY 1 would sort by the constant 1 (and LIMIT keep other rows)"),
    "spark.sql.groupByAliases": ("true", "GROUP BY would not read the select list's aliases"),
    "spark.sql.ansi.doubleQuotedIdentifiers": ("false", "Spark would parse text otherwise"),
    "spark.sql.ansi.relationPrecedence": (
        "false", "Spark would bind JOIN and comma joins in another order"),
    "spark.sql.legacy.statisticalAggregate": (
        "false", "STDDEV of one value would be NaN on Spark, NULL on DuckDB"),
    "spark.sql.legacy.ctePrecedencePolicy": (
        "CORRECTED", "an inner WITH would not take precedence over an outer one of its name"),
    "spark.sql.legacy.scalarSubqueryCountBugBehavior": (
        "false", "a correlated COUNT subquery over no rows would be NULL instead of 0"),
    "spark.sql.legacy.duplicateBetweenInput": ("false", "BETWEEN would read its input twice"),
    "spark.sql.legacy.integerGroupingId": ("false", "GROUPING_ID would be an INT"),
    "spark.sql.legacy.setopsPrecedence.enabled": (
        "false", "INTERSECT would bind as UNION and EXCEPT, left to right"),
    "spark.sql.legacy.allowNegativeScaleOfDecimal": (
        "false", "decimal literals such as 1E10 would have a negative scale"),
    "spark.sql.legacy.decimal.retainFractionDigitsOnTruncate": (
        "false", "decimals cast to fewer digits would keep other digits"),
    "spark.sql.mapKeyDedupPolicy": ("EXCEPTION", "a map of repeated keys would keep the last"),
}  # fmt: skip
"""The session settings every :class:`SparkEngine` sets and checks before it translates or runs
a tree: its value and why another value would compute other cells than DuckDB. Every other
``spark.sql.legacy.*`` setting must keep its default (:data:`LEGACY`)."""
LEGACY = "spark.sql.legacy."
"""The prefix of Spark's settings that bring back older meanings of SQL: one set in the session
to anything but its default refuses the session, as it may change a cell (Spark 4.3 has about
a hundred)."""
HASH_UDF = "sqlsdc_duckdb_hash"
"""DuckDB's ``hash`` on Spark: the Arrow UDF each :class:`SparkEngine` registers on its session."""

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
DuckDB's ``hash`` (a function sqlglot does not know) is one too: see :func:`_hash`."""

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

# DuckDB's type class of a value; enough to choose the rewrites above.
INT, DECIMAL, FLOAT, TEXT, BOOL, NULL, UNKNOWN = (
    "INTEGER", "DECIMAL", "DOUBLE", "VARCHAR", "BOOLEAN", "NULL", "unknown type"
)  # fmt: skip
NUMERIC = (INT, DECIMAL, FLOAT)


# --- the passes --------------------------------------------------------------------------------


def to_spark_sql(
    tree: exp.Expr,
    schema: Mapping[str, Mapping[str, str]] | None = None,
    duckdb_types: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    """Spark SQL that computes what DuckDB computes for ``tree``; ``tree`` is not changed.

    ``schema`` maps view names to ``{column: type}`` (Spark or DuckDB type names); without it,
    rewrites that depend on a column's type refuse. ``duckdb_types`` maps the views copied from
    DuckDB to their columns' DuckDB types; without it, ``hash`` of a column is refused.

    Example:
        >>> tree = sqlglot.parse_one("SELECT p.v FROM sqlsdc.t AS p ORDER BY p.v", read="duckdb")
        >>> to_spark_sql(tree)
        'SELECT p.v FROM sqlsdc__t AS p ORDER BY p.v NULLS LAST'
    """
    return to_spark(tree, schema, duckdb_types).sql(dialect=DIALECT)


def to_spark(
    tree: exp.Expr,
    schema: Mapping[str, Mapping[str, str]] | None = None,
    duckdb_types: Mapping[str, Mapping[str, str]] | None = None,
) -> exp.Expr:
    """The Spark tree for a protected tree: the passes of this module on a private copy."""
    duckdb_tree = read_as_duckdb(tree)
    _check(duckdb_tree)
    return _translate(duckdb_tree, schema, duckdb_types)


def _translate(duckdb_tree: exp.Expr, schema, duckdb_types=None) -> exp.Expr:
    """Passes 3 and 4 on a checked tree of our own (mutated)."""
    rename_tables(duckdb_tree)
    _check_no_32_bit_floats(duckdb_tree, schema or {})
    return keep_duckdb_semantics(duckdb_tree, _Types(duckdb_tree, schema, duckdb_types))


SINGLE_PRECISION = frozenset({"float", "real", "float4"})
"""Type names (Spark's, DuckDB's; lower case) of 32-bit floating-point columns."""


def _check_no_32_bit_floats(tree: exp.Expr, schema: Mapping[str, Mapping[str, str]]) -> None:
    """Refuse a tree that reads a 32-bit FLOAT column (by name or through a star) of a view it
    reads, other than as an argument of ``hash`` (hashed bit for bit). DuckDB computes with
    FLOAT in 32 bits (``r > 0.1`` casts 0.1 to FLOAT, ``r / 3`` is a FLOAT) where Spark widens
    to DOUBLE, so the same filter kept other rows: one DP cell identity, two exact values (red
    team s36e)."""
    named = {c.name.lower() for c in tree.find_all(exp.Column) if not _is_hash(c.parent)}
    for scope in traverse_scope(tree):
        star = _has_star(scope.expression)
        for source in _selected(scope):
            if not isinstance(source, exp.Table):
                continue
            for column, kind in schema.get(source.name.lower(), {}).items():
                if kind.lower() in SINGLE_PRECISION and (star or column.lower() in named):
                    raise NotSupportedError(
                        f"{source.name}.{column} is a 32-bit FLOAT, which DuckDB computes and "
                        "compares in 32 bits and Spark in 64: not portable to Spark; run this "
                        "query on DuckDB, or store the column as DOUBLE"
                    )


def read_as_duckdb(tree: exp.Expr) -> exp.Expr:
    """A new tree parsed from the DuckDB SQL of ``tree``: what the DuckDB engine actually runs."""
    return sqlglot.parse_one(tree.sql(dialect="duckdb"), read="duckdb")


def check_portable(tree: exp.Expr) -> None:
    """Raise NotSupportedError naming the first construct of ``tree`` not known to be portable."""
    _check(read_as_duckdb(tree))


def _check(tree: exp.Expr) -> None:
    for node in tree.walk():
        if type(node) in PORTABLE_FUNCTIONS:
            problem = _ARGUMENT_RULES.get(type(node), _no_problem)(node)
        elif _is_hash(node):
            problem = "" if node.expressions else "hash() needs an argument"
        elif _is_list_slice(node):
            problem = _list_problem(node)
        elif type(node) in PORTABLE_CLAUSES:
            problem = _clause_problem(node)
        else:
            problem = (
                "it is not among the functions and clauses tested on both DuckDB and Spark "
                "(sqlsdc.engines.spark.PORTABLE_FUNCTIONS)"
            )
        if problem:
            raise NotSupportedError(
                f"{_describe(node)} is not portable to Spark: {problem}; "
                "run this query on DuckDB, or write it without it"
            )


def rename_tables(tree: exp.Expr) -> exp.Expr:
    """Point tables at their Spark views (mutates ``tree``): ``sqlsdc.x`` → ``sqlsdc__x``."""
    for table in list(tree.find_all(exp.Table)):
        if table.args.get("db"):
            if not table.alias:
                table.set("alias", exp.TableAlias(this=exp.to_identifier(table.name)))
            table.set("this", exp.to_identifier(view_name(_qualified_name(table))))
            table.set("db", None)
    return tree


def keep_duckdb_semantics(tree: exp.Expr, types: _Types) -> exp.Expr:
    """Rewrite nodes whose Spark meaning differs from DuckDB's (mutates ``tree``).

    Children are rewritten before their parents; a replacement keeps the DuckDB type class of
    the node it replaces, which is what the parent's rule asks for.
    """
    for node in list(tree.walk()):
        types.of(node)  # classify the whole tree before anything moves
    root = tree
    for node in reversed(list(tree.walk(bfs=False))):
        rule = _SEMANTICS.get(type(node))
        new = rule(node, types) if rule else node
        if new is node:
            continue
        if isinstance(new, exp.Binary):
            new = exp.Paren(this=new)
        types.inherit(new, node)
        if node is root:
            root = new
        else:
            node.replace(new)
    return root


# --- names -------------------------------------------------------------------------------------


def view_name(name: str) -> str:
    """The Spark view of a DuckDB table: ``persons`` → ``persons``, ``sqlsdc.x`` → ``sqlsdc__x``."""
    table = exp.to_table(name)
    if table.catalog:
        raise NotSupportedError(f"table {name} names a database; Spark views have no database")
    if table.db and table.db.lower() != "main":
        return f"{table.db}__{table.name}".lower()
    return table.name.lower()


def tables_read(tree: exp.Expr) -> set[str]:
    """The DuckDB names (``persons``, ``sqlsdc.ptable``) of the tables a tree reads."""
    return _tables(read_as_duckdb(tree))


def _tables(duckdb_tree: exp.Expr) -> set[str]:
    names = set()
    for scope in traverse_scope(duckdb_tree):
        for source in scope.sources.values():
            if isinstance(source, exp.Table):
                names.add(_qualified_name(source))
    return names


def _qualified_name(table: exp.Table) -> str:
    if table.catalog:
        raise NotSupportedError(f"table {table.sql('duckdb')} names a database")
    return f"{table.db}.{table.name}".lower() if table.db else table.name.lower()


# --- argument checks (no types needed) ----------------------------------------------------------


def _no_problem(node: exp.Expr) -> str:
    return ""


def _int_literal(node: exp.Expr | None) -> int | None:
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
    if digits is not None and (_int_literal(digits) is None or abs(_int_literal(digits)) > 22):
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
    if count is None or (_int_literal(count) is not None and _int_literal(count) >= 1):
        return ""
    return "the n of MAX(x, n) must be a positive integer constant"


def _min_problem(node: exp.Min) -> str:
    count = node.args.get("count")
    if count is None:
        return ""
    if not isinstance(node.parent, exp.ArrayMax):
        return "only LIST_MAX(MIN(x, n)), the n-th smallest value, is portable"
    if _int_literal(count) is None or _int_literal(count) < 1:
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
        and _int_literal(node.expressions[0]) is not None
        and _int_literal(node.expressions[0]) >= 0
    ):
        return ""
    return "only an element of MAX(x, n) at a constant position is portable"


def _between_problem(node: exp.Between) -> str:
    return "BETWEEN SYMMETRIC is DuckDB only" if node.args.get("symmetric") else ""


def _is_list_slice(node: exp.Expr) -> bool:
    return isinstance(node, exp.Anonymous) and node.name.upper() == "LIST_SLICE"


_LIST_NODES = (exp.ArrayAgg, exp.ArrayDistinct, exp.ArraySort, exp.Flatten, exp.Length)


def _list_problem(node: exp.Expr) -> str:
    """Lists are portable in the two shapes of DP's COUNT(DISTINCT column) only
    (:func:`sqlsdc.rewrite.dp._kept_values` and its count): a unit's at most r smallest
    distinct values of a column, ``LIST_SLICE(LIST_SORT(LIST_DISTINCT(ARRAY_AGG(x))), 1, r)``,
    and a cell's number of distinct values, ``LEN(LIST_DISTINCT(FLATTEN(ARRAY_AGG(k))))``."""
    top = node
    while isinstance(top.parent, _LIST_NODES) or _is_list_slice(top.parent):
        top = top.parent
    if _kept_values_of(top) is not None or _distinct_count_of(top) is not None:
        return ""
    return (
        "lists are portable only as the distinct values of COUNT(DISTINCT column) under "
        "differential privacy"
    )


def _kept_values_of(node: exp.Expr) -> exp.Expr | None:
    """``x`` of ``LIST_SLICE(LIST_SORT(LIST_DISTINCT(ARRAY_AGG(x))), 1, r)`` (else None)."""
    if not _is_list_slice(node) or len(node.expressions) != 3:
        return None
    listed, start, end = node.expressions
    if _int_literal(start) != 1 or (_int_literal(end) or 0) < 1:
        return None
    ordered = isinstance(listed, exp.ArraySort) and not listed.args.get("expression")
    if not ordered or listed.args.get("nulls_first") not in (None, exp.false()):
        return None
    distinct = listed.this
    if not isinstance(distinct, exp.ArrayDistinct) or not isinstance(distinct.this, exp.ArrayAgg):
        return None
    return distinct.this.this if isinstance(distinct.this.this, exp.Column) else None


def _distinct_count_of(node: exp.Expr) -> exp.Expr | None:
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
    Of DOUBLEs it is a DOUBLE in DuckDB and an error in Spark (:func:`_int_divide`)."""
    bigints = all(
        isinstance(o, exp.Cast) and o.to.this == exp.DataType.Type.BIGINT
        for o in (node.this, node.expression)
    )
    if bigints or _int_literal(node.expression) not in (None, 0, -1):
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
        if node.args.get("using") and _has_star(node.parent):
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
    if _has_star(select):
        return "QUALIFY is portable only with the columns named (no *)"
    if any(select.args.get(k) for k in ("order", "limit", "offset", "distinct")):
        return "QUALIFY is portable only without ORDER BY, LIMIT, OFFSET and DISTINCT"
    return ""


def _has_star(select: exp.Expr) -> bool:
    return isinstance(select, exp.Select) and any(
        isinstance(p, exp.Star) or isinstance(p.this, exp.Star) for p in select.selects
    )


def _describe(node: exp.Expr) -> str:
    if isinstance(node, exp.Anonymous):
        return f"function {node.name.lower()}()"
    if isinstance(node, exp.Func):
        return f"function {node.sql_name().lower()}()"
    return f"{type(node).__name__.upper()} ({node.sql('duckdb')[:60]})"


# --- DuckDB type classes ------------------------------------------------------------------------


def type_class(dtype: str | exp.DataType) -> str:
    """DuckDB's class (INTEGER, DECIMAL, DOUBLE, VARCHAR, BOOLEAN) of a Spark or DuckDB type."""
    if isinstance(dtype, str):
        return _named_type_class(dtype)
    kind = dtype.this
    if kind in exp.DataType.INTEGER_TYPES:
        return INT
    if kind in exp.DataType.FLOAT_TYPES:
        return FLOAT
    if kind in exp.DataType.REAL_TYPES:
        return DECIMAL
    if kind in exp.DataType.TEXT_TYPES:
        return TEXT
    return {exp.DataType.Type.BOOLEAN: BOOL, exp.DataType.Type.NULL: NULL}.get(kind, UNKNOWN)


@functools.cache
def _named_type_class(name: str) -> str:
    if name.lower() == "void":  # Spark's type of an untyped NULL
        return NULL
    for dialect in (DIALECT, "duckdb"):
        try:
            return type_class(exp.DataType.build(name, dialect=dialect))
        except (sqlglot.errors.ParseError, ValueError):
            continue
    return UNKNOWN


def _unify(classes: Iterable[str]) -> str:
    """The class of a value that is one of several (CASE branches, operands), as DuckDB casts."""
    found = {c for c in classes if c != NULL}
    if len(found) <= 1:
        return found.pop() if found else NULL
    if found <= set(NUMERIC):
        return FLOAT if FLOAT in found else DECIMAL
    return UNKNOWN


class _Types:
    """The DuckDB type class of every node of one tree, from the schemas of the views it reads;
    and, for the columns of views copied from DuckDB, their DuckDB type (:meth:`stored`)."""

    def __init__(self, tree: exp.Expr, schema: Mapping[str, Mapping[str, str]] | None,
                 duckdb_types: Mapping[str, Mapping[str, str]] | None = None):  # fmt: skip
        self.schema = {
            view.lower(): {column.lower(): type_class(t) for column, t in columns.items()}
            for view, columns in (schema or {}).items()
        }
        self.duckdb_types = {
            view.lower(): {column.lower(): t for column, t in columns.items()}
            for view, columns in (duckdb_types or {}).items()
        }
        self.scope_of: dict[int, Scope] = {}
        for scope in traverse_scope(tree):  # innermost scopes first
            for node in scope.walk():
                if isinstance(node, exp.Column):
                    self.scope_of.setdefault(id(node), scope)
        self.memo: dict[int, str] = {}
        self.keep: list[exp.Expr] = []  # keeps classified nodes alive, so ids stay unique

    def of(self, node: exp.Expr) -> str:
        if id(node) not in self.memo:
            self.memo[id(node)] = UNKNOWN  # cycles (an alias naming itself) stay unknown
            self.keep.append(node)
            self.memo[id(node)] = self._infer(node)
        return self.memo[id(node)]

    def inherit(self, new: exp.Expr, old: exp.Expr) -> None:
        for node in (new, new.unnest()):
            self.keep.append(node)
            self.memo[id(node)] = self.of(old)

    def _infer(self, node: exp.Expr) -> str:
        if isinstance(node, exp.Literal):
            if node.is_string:
                return TEXT
            text = node.this.lower()
            return FLOAT if "e" in text else DECIMAL if "." in text else INT
        if isinstance(node, exp.Column):
            return self._column(node)
        if isinstance(node, exp.Cast):
            return type_class(node.to)
        if isinstance(node, (exp.Count, exp.RowNumber, exp.Rank, exp.DenseRank, exp.Grouping,
                             exp.Length, exp.IntDiv)):  # fmt: skip
            return INT
        if isinstance(node, (exp.Avg, exp.Div, exp.Sqrt)):
            return FLOAT
        if isinstance(node, (exp.Predicate, exp.Connector, exp.Not, exp.Boolean)):
            return BOOL
        if isinstance(node, exp.Null):
            return NULL
        if isinstance(node, (exp.Floor, exp.Ceil)):
            inner = self.of(node.this)
            return FLOAT if inner in (INT, FLOAT, NULL) else inner
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Mod)):
            return _unify([self.of(node.this), self.of(node.expression)])
        if isinstance(node, exp.Case):
            branches = [i.args["true"] for i in node.args["ifs"]] + [node.args.get("default")]
            return _unify(self.of(b) for b in branches if b is not None)
        if isinstance(node, exp.If):
            return _unify(self.of(b) for b in (node.args["true"], node.args.get("false")) if b)
        if isinstance(node, (exp.Coalesce, exp.Least, exp.Greatest)):
            return _unify(self.of(e) for e in [node.this, *node.expressions])
        if isinstance(node, exp.Distinct) and len(node.expressions) == 1:
            return self.of(node.expressions[0])
        if isinstance(node, (exp.Alias, exp.Paren, exp.Neg, exp.Abs, exp.Min, exp.Max, exp.Sum,
                             exp.Round, exp.Nullif, exp.Window, exp.Ordered, exp.Order,
                             exp.Bracket, exp.ArrayMax)):  # fmt: skip
            return self.of(node.this)
        if _is_hash(node) or (isinstance(node, exp.Anonymous) and node.name.lower() == HASH_UDF):
            return INT  # DuckDB's UBIGINT; the UDF's DECIMAL(20, 0) holds the same integers
        return UNKNOWN

    def stored(self, node: exp.Expr) -> str | None:
        """The DuckDB type of the column whose values ``node`` is (through aliases, derived
        tables, MIN, MAX and ``CASE WHEN c THEN x END``, whose type is x's), if it reads a view
        copied from DuckDB; else None."""
        while isinstance(node, (exp.Alias, exp.Paren, exp.Min, exp.Max)) or _only_branch(node):
            if isinstance(node, exp.Case):
                node = node.args["ifs"][0].args["true"]
                continue
            if node.args.get("count") is not None:
                return None
            node = node.this
        if not isinstance(node, exp.Column):
            return None
        found = self.defined_as(node)
        if isinstance(found, tuple):
            return self.duckdb_types.get(found[0], {}).get(found[1])
        return self.stored(found) if found is not None else None

    def defined_as(self, column: exp.Column) -> tuple[str, str] | exp.Expr | None:
        """What ``column`` reads: ``(view, column)`` of a table, the projection of a derived
        table or CTE that defines it, or None (unknown, a star, a set operation)."""
        scope = self.scope_of.get(id(column))
        if scope is None:
            return None
        if column.table:
            sources = [scope.sources.get(column.table)]
        else:
            sources = [s for s in _selected(scope) if self._has(s, column.name)]
        if len(sources) != 1:
            return None
        source = sources[0]
        if isinstance(source, exp.Table):
            return source.name.lower(), column.name.lower()
        if isinstance(source, Scope):
            return self._projected(source, column.name)
        return None

    def _has(self, source: exp.Table | Scope, name: str) -> bool:
        if isinstance(source, exp.Table):
            return name.lower() in self.schema.get(source.name.lower(), {})
        return isinstance(source, Scope) and self._projected(source, name) is not None

    def _projected(self, scope: Scope, name: str) -> exp.Expr | None:
        """The expression of output column ``name`` of a one-branch scope (the first of that
        name, as in DuckDB), or None (a star, a set operation, no such column)."""
        if not isinstance(scope.expression, exp.Select):
            return None
        for projection in scope.expression.selects:
            if isinstance(projection, exp.Star) or isinstance(projection.this, exp.Star):
                return None
            if projection.alias_or_name == name:
                return projection
        return None

    def _column(self, column: exp.Column) -> str:
        scope = self.scope_of.get(id(column))
        if scope is None:
            return UNKNOWN
        if column.table:
            kind = self._output(scope.sources.get(column.table), column.name)
        else:  # ORDER BY names projections first, other clauses the tables first
            in_order = isinstance(column.find_ancestor(exp.Order, exp.Select), exp.Order)
            kind = self._projection(scope, column.name) if in_order else None
            if kind is None:
                found = [self._output(s, column.name) for s in _selected(scope)]
                found = [k for k in found if k is not None]
                kind = found[0] if len(found) == 1 else None
        return UNKNOWN if kind is None else kind

    def _output(self, source: exp.Table | Scope | None, name: str) -> str | None:
        """The class of column ``name`` of a table or subquery; None if it has no such column."""
        if isinstance(source, exp.Table):
            return self.schema.get(source.name.lower(), {}).get(name.lower())
        if isinstance(source, Scope):
            return self._projection(source, name)
        return None

    def _projection(self, scope: Scope, name: str) -> str | None:
        """The class of output column ``name`` of a scope. As in DuckDB, the first projection of
        that name wins (``t.*`` included); set operations unify their branches."""
        selects = _branches(scope.expression)
        for position, projection in enumerate(selects[0].selects if selects else []):
            if isinstance(projection, exp.Star) or isinstance(projection.this, exp.Star):
                table = projection.table if isinstance(projection, exp.Column) else ""
                sources = [scope.sources.get(table)] if table else _selected(scope)
                found = [k for k in (self._output(s, name) for s in sources) if k is not None]
                if found:
                    return found[0]
            elif projection.alias_or_name == name:
                same = [s.selects[position] for s in selects if len(s.selects) > position]
                return _unify(self.of(p) for p in same)
        return None


def _only_branch(node: exp.Expr) -> bool:
    """Whether ``node`` is ``CASE WHEN c THEN x END`` (one branch, NULL otherwise)."""
    if not isinstance(node, exp.Case) or node.this is not None or len(node.args["ifs"]) != 1:
        return False
    return isinstance(node.args.get("default"), (type(None), exp.Null))


def _selected(scope: Scope) -> list[exp.Table | Scope]:
    """The tables and subqueries a scope's FROM and JOINs read (its ``sources`` also hold the
    CTEs it could read, which an unqualified column does not name)."""
    return [source for _node, source in scope.selected_sources.values()]


def _branches(expression: exp.Expr) -> list[exp.Select]:
    if isinstance(expression, exp.SetOperation):
        return _branches(expression.this) + _branches(expression.expression)
    if isinstance(expression, exp.Subquery):
        return _branches(expression.this)
    return [expression] if isinstance(expression, exp.Select) else []


# --- DuckDB semantics on Spark ------------------------------------------------------------------


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
        f"{node.sql('duckdb')[:80]} is not portable to Spark: {why}; run this query on DuckDB"
    )


def _divide(node: exp.Div, types: _Types) -> exp.Expr:
    """DuckDB divides as DOUBLE with IEEE results for zero divisors (x/0 = ±inf, 0/0 = NaN);
    Spark raises, and divides decimals as decimals. ``POWER(±0.0, -1)`` is ±inf in Java."""
    a, b = _double(node.this), _double(node.expression)
    zero = exp.EQ(this=b.copy(), expression=exp.Literal.number(0))
    reciprocal = exp.Pow(this=b.copy(), expression=exp.Literal.number(-1))
    by_zero = exp.Mul(this=a.copy(), expression=reciprocal)
    return exp.Case(ifs=[exp.If(this=zero, true=by_zero)], default=exp.Div(this=a, expression=b))


def _average(node: exp.Avg, types: _Types) -> exp.Expr:
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


def _sum_exactly(node: exp.Sum, types: _Types) -> exp.Expr:
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


def _cast(node: exp.Cast, types: _Types) -> exp.Expr:
    """DuckDB rounds to integers (DOUBLE half to even, DECIMAL half away from zero); Spark
    truncates. Spark has no HUGEINT: DECIMAL(38, 0) holds its values (the DP sums of
    :func:`sqlsdc.rewrite.dp._scaled`). Other casts are portable only between the types and
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


def _round(node: exp.Round, types: _Types) -> exp.Expr:
    """DuckDB rounds a DOUBLE to n ≠ 0 digits as round(x·10^n)/10^n (x/10^-n for n < 0) and
    keeps x when that is not finite; Spark rounds the decimal digits of x (0.285 → 0.29)."""
    kind, digits = types.of(node.this), _int_literal(node.args.get("decimals")) or 0
    if kind in (INT, DECIMAL, NULL) or (kind == FLOAT and digits == 0):
        return node
    if kind != FLOAT:
        raise _refuse(node, f"ROUND of {_a(kind)}")
    x = exp.Paren(this=node.this.copy())
    scale = exp.Cast(this=exp.Literal.number(10 ** abs(digits)), to=_type("DOUBLE"))
    if digits > 0:
        rounded = exp.Div(this=exp.Round(this=exp.Mul(this=x, expression=scale)), expression=scale)
    else:
        rounded = exp.Mul(this=exp.Round(this=exp.Div(this=x, expression=scale)), expression=scale)
    finite = exp.LT(this=exp.Abs(this=rounded), expression=_infinity())
    return exp.Case(ifs=[exp.If(this=finite, true=rounded.copy())], default=x.copy())


def _floor_or_ceil(node: exp.Floor | exp.Ceil, types: _Types) -> exp.Expr:
    """DuckDB's FLOOR/CEIL of an integer or DOUBLE is a DOUBLE; Spark's is a BIGINT and raises
    beyond 2^63. Doubles from 2^52 up are integers already, and NaN sorts above them."""
    kind = types.of(node.this)
    if kind == DECIMAL:
        return node
    if kind in (INT, NULL):
        return _double(node.this)
    if kind != FLOAT:
        raise _refuse(node, f"{node.sql_name()} of {_a(kind)}")
    integral = exp.GTE(this=exp.Abs(this=node.this.copy()), expression=exp.Literal.number(2**52))
    return exp.Case(ifs=[exp.If(this=integral, true=node.this.copy())], default=_double(node))


def _grouping(node: exp.Grouping, types: _Types) -> exp.Expr:
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


def _is_nan(node: exp.IsNan, types: _Types) -> exp.Expr:
    """ISNAN(NULL) is NULL in DuckDB and false in Spark."""
    missing = exp.Is(this=node.this.copy(), expression=exp.Null())
    return exp.Case(ifs=[exp.If(this=missing, true=exp.Null())], default=node.copy())


def _compare(node: exp.Expr, types: _Types) -> exp.Expr:
    """A VARCHAR compared with a number is cast to INTEGER by DuckDB and to BIGINT by Spark."""
    operands = [v for k, v in node.args.items() if k != "expressions" and isinstance(v, exp.Expr)]
    classes = {types.of(o) for o in [*operands, *node.args.get("expressions", [])]}
    if TEXT in classes and classes & set(NUMERIC):
        raise _refuse(node, "it compares a VARCHAR with a number")
    return node


def _top_values(node: exp.Max, types: _Types) -> exp.Expr:
    """DuckDB's ``MAX(x, n)`` (the n largest values, ties kept, NULLs ignored, NULL for no
    values) has no Spark aggregate → the first n of the values sorted in descending order."""
    if node.args.get("count") is None:
        return node
    values = exp.Anonymous(this="COLLECT_LIST", expressions=[node.this.copy()])
    descending = exp.Anonymous(this="SORT_ARRAY", expressions=[values, exp.false()])
    return exp.Anonymous(
        this="SLICE", expressions=[descending, exp.Literal.number(1), node.args["count"].copy()]
    )


def _bottom_values(node: exp.Min, types: _Types) -> exp.Expr:
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


def _is_hash(node: exp.Expr) -> bool:
    return isinstance(node, exp.Anonymous) and node.name.upper() == "HASH"


def _hash(node: exp.Expr, types: _Types) -> exp.Expr:
    """DuckDB's ``hash(a, b, ...)`` is a 64-bit hash (a UBIGINT) of the values by their DuckDB
    types, Spark's a 32-bit Murmur3 → :data:`HASH_UDF`, which computes DuckDB's
    (:mod:`sqlsdc.engines.duckdb_hash`) as DECIMAL(20, 0), over a struct of the arguments.

    The hash depends on the DuckDB type of each argument (an INTEGER -1 and a BIGINT -1 hash
    apart), and the UDF sees Spark's types. So an argument must be a column (or MIN or MAX of
    one) of a table copied from DuckDB whose type is in :data:`HASHED_DUCKDB_TYPES` (the copy
    keeps its hash), or a VARCHAR or BOOLEAN computed from such columns; anything else is
    refused."""
    if not _is_hash(node):
        return node
    fields: list[exp.Expr] = []
    for position, argument in enumerate(node.expressions):
        problem = _unhashable(argument, types)
        if problem:
            raise _refuse(node, problem)
        fields += [exp.Literal.string(f"a{position}"), argument.copy()]
    struct = exp.Anonymous(this="NAMED_STRUCT", expressions=fields)
    return exp.Anonymous(this=HASH_UDF, expressions=[struct])


def _unhashable(argument: exp.Expr, types: _Types) -> str:
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


def _computed_problem(value: exp.Expr, types: _Types) -> str:
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


def _element(node: exp.Bracket, types: _Types) -> exp.Expr:
    """DuckDB's ``list[j]`` is NULL beyond the end; Spark's ``array[j]`` raises in ANSI mode →
    ``TRY_ELEMENT_AT`` (1-based, NULL beyond the end)."""
    position = _int_literal(node.expressions[0]) + 1  # the tree's index is 0-based
    return exp.Bracket(
        this=node.this.copy(), expressions=[exp.Literal.number(position)], offset=1, safe=True
    )


def _in_any_order(rule: Callable[[exp.Expr, _Types], exp.Expr], exact: tuple[str, ...]):
    """``rule`` for an aggregate that the rewrite orders by its values (``SUM(x ORDER BY x)``,
    :mod:`sqlsdc.rewrite.order`: floating-point additions depend on their order, which hidden
    groups move). Spark has no ordered aggregates: over values of the ``exact`` classes the
    result is the same in any order, and the ORDER BY is dropped; over others it is refused."""

    def apply(node: exp.Expr, types: _Types) -> exp.Expr:
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


def _kept_values(node: exp.Expr, types: _Types) -> exp.Expr:
    """A unit's at most r smallest distinct non-NULL values of ``x``: DuckDB's
    ``LIST_SLICE(LIST_SORT(LIST_DISTINCT(ARRAY_AGG(x))), 1, r)`` (LIST_DISTINCT drops NULLs) is
    Spark's ``SLICE(ARRAY_SORT(ARRAY_DISTINCT(COLLECT_LIST(x))), 1, r)`` (COLLECT_LIST drops
    them), values of a class both engines tell apart and order alike."""
    value = _kept_values_of(node)
    kind = types.of(value)
    if kind not in _DISTINCT_CLASSES:
        raise _refuse(node, f"the distinct values of {_a(kind)}")
    listed = exp.Anonymous(this="COLLECT_LIST", expressions=[value.copy()])
    distinct = exp.Anonymous(this="ARRAY_DISTINCT", expressions=[listed])
    ordered = exp.Anonymous(this="ARRAY_SORT", expressions=[distinct])
    return exp.Anonymous(
        this="SLICE", expressions=[ordered, *(e.copy() for e in node.expressions[1:])]
    )


def _anonymous(node: exp.Expr, types: _Types) -> exp.Expr:
    return _kept_values(node, types) if _is_list_slice(node) else _hash(node, types)


def _distinct_count(node: exp.Length, types: _Types) -> exp.Expr:
    """A cell's number of distinct values, DuckDB's ``LEN(LIST_DISTINCT(FLATTEN(ARRAY_AGG(k))))``
    (a BIGINT; NULL over no rows, where Spark's COLLECT_LIST is empty) → a BIGINT SIZE of
    Spark's lists, NULL when the scope has no rows."""
    lists = _distinct_count_of(node)
    flat = exp.Anonymous(this="FLATTEN", expressions=[
        exp.Anonymous(this="COLLECT_LIST", expressions=[lists.copy()])])  # fmt: skip
    size = exp.Anonymous(this="SIZE", expressions=[
        exp.Anonymous(this="ARRAY_DISTINCT", expressions=[flat])])  # fmt: skip
    none = exp.EQ(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(0))
    return exp.Case(
        ifs=[exp.If(this=none, true=exp.Null())], default=exp.Cast(this=size, to=_type("BIGINT"))
    )


def _int_divide(node: exp.IntDiv, types: _Types) -> exp.Expr:
    """``//`` of integers is Spark's DIV; of anything else DuckDB divides otherwise."""
    kind = types.of(node.this)
    if kind not in (INT, NULL):
        raise _refuse(node, f"// of {_a(kind)} (a DOUBLE floor division in DuckDB)")
    return node


_SEMANTICS: dict[type[exp.Expr], Callable[[exp.Expr, _Types], exp.Expr]] = {
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
    exp.IsNan: _is_nan,
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


# --- results -----------------------------------------------------------------------------------


def normalise_types(table: pa.Table) -> pa.Table:
    """Arrow types on which DuckDB and Spark results agree, so that equal results compare equal.

    Integers → int64 (UBIGINT → float64, as Spark reads it as DECIMAL(20, 0)); decimals and
    floats → float64 (DuckDB's HUGEINT sums arrive as decimal128(38, 0), Spark's as decimals
    too); large strings → string; every column nullable (Spark marks some NOT NULL). Values are
    kept, except decimals beyond 2^53, which become the nearest double on both sides alike.
    """
    fields = []
    for field in table.schema:
        kind = field.type
        if pa.types.is_uint64(kind) or pa.types.is_decimal(kind) or pa.types.is_floating(kind):
            kind = pa.float64()
        elif pa.types.is_integer(kind):
            kind = pa.int64()
        elif pa.types.is_large_string(kind):
            kind = pa.string()
        fields.append(field.with_type(kind).with_nullable(True))
    return table.cast(pa.schema(fields))


def as_types(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Spark's answer ``table`` in the types of ``schema`` (DuckDB's types of the same tree,
    :func:`sqlsdc.engines.duckdb.result_schema`), value for value: integers and decimals are
    cast only where no digit is lost (DuckDB's DECIMAL(38, 2) sum holds Spark's DECIMAL(20, 2)
    sum), text and booleans as they are. A column Spark computed in another kind of number
    (a DOUBLE where DuckDB has a DECIMAL, or the reverse) or whose values do not fit is
    refused: its values could differ in the last digits.

    Raises:
        OperationalError: a column cannot take DuckDB's type exactly.
    """
    if table.num_columns != len(schema):
        raise OperationalError(
            f"Spark returned {table.num_columns} columns, DuckDB types {len(schema)}"
        )
    columns = []
    for column, have, want in zip(table.columns, table.schema, schema, strict=True):
        if have.type != want.type:
            if _kind(have.type) != _kind(want.type):
                raise OperationalError(
                    f"Spark computed {want.name} as {have.type} where DuckDB computes "
                    f"{want.type}: its values could differ; run this query on DuckDB"
                )
            try:
                column = column.cast(want.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise OperationalError(
                    f"Spark's {want.name} does not fit DuckDB's {want.type}; run this query "
                    "on DuckDB"
                ) from None
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema.with_metadata(None))


def _kind(kind: pa.DataType) -> str:
    """The kind of Arrow type whose values :func:`as_types` casts exactly within it."""
    if pa.types.is_integer(kind) or pa.types.is_decimal(kind):
        return "exact number"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "text"
    if pa.types.is_timestamp(kind):
        return f"timestamp {kind.unit} {'instant' if kind.tz else 'local'}"
    return str(kind)


# --- the engine --------------------------------------------------------------------------------


def _require_pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise NotSupportedError(f"the Spark engine needs PySpark; {INSTALL_HINT}") from None


def _register_hash(session: SparkSession) -> None:
    """Register :data:`HASH_UDF` on ``session``. Its module is shipped to Spark's Python
    workers by value, so they need numpy and pyarrow (as every Arrow UDF does), not sqlsdc.

    Registered again before every tree that hashes (:meth:`SparkEngine.run_exact`, 20-60 ms):
    a function registered under its name in the session since (a constant, say) kept every
    group of every unit, and the DP cells, under the identity and noise of DuckDB's capped
    ones, differed from them by exactly the rows the caps drop (red team s40c)."""
    from pyspark import cloudpickle
    from pyspark.sql.functions import arrow_udf

    from sqlsdc.engines import duckdb_hash

    cloudpickle.register_pickle_by_value(duckdb_hash)
    session.udf.register(HASH_UDF, arrow_udf(duckdb_hash.hash_struct, "decimal(20,0)"))


class SparkEngine:
    """Runs protected trees on a SparkSession; results are Arrow tables typed as by
    :func:`normalise_types`, equal to DuckDB's for the same data.

    The engine turns on ANSI mode for the session (``spark.sql.ansi.enabled=true``, Spark 4's
    default): without it Spark wraps integer overflow silently where DuckDB raises, and a
    wrapped cell key would pick the wrong noise. It sets the session time zone to UTC, DuckDB's,
    and reads Parquet dates as written (:data:`SESSION`). It refuses to run if one was changed.

    Example:
        >>> engine = SparkEngine(SparkSession.builder.getOrCreate())  # doctest: +SKIP
        >>> engine.register("persons", "s3://bucket/persons.parquet")  # doctest: +SKIP
        >>> engine.register("sqlsdc.ptable_entries", "s3://bucket/ptable.parquet")  # doctest: +SKIP
        >>> tree = con.explain("SELECT sex, COUNT(*) FROM persons GROUP BY sex")  # doctest: +SKIP
        >>> tree = tree.tree  # doctest: +SKIP
        >>> engine.run(tree)  # doctest: +SKIP

    Guarded queries run on Spark through :func:`sqlsdc.guard.spark.run_protected`, which audits
    them and records their cells in the ledger; :meth:`run` alone records nothing.
    """

    def __init__(self, session: SparkSession):
        _require_pyspark()
        self.session = session
        for setting, (value, _why) in SESSION.items():
            session.conf.set(setting, value)
        self.schemas: dict[str, dict[str, str]] = {}  # view -> {column: Spark type}
        self.data_versions: dict[str, str] = {}  # tables copied by load_duckdb: DuckDB version
        self._copies: dict[str, tuple] = {}  # their views: what load_duckdb left (_copy_state)
        self.duckdb_types: dict[str, dict[str, str]] = {}  # their views: {column: DuckDB type}
        self.summable: dict[tuple[str, str], bool] = {}  # sqlsdc.guard.summable's scans
        self._folders: list[str] = []
        # held while a guarded answer registers its DP cells and runs over them: the cells'
        # view names are the same in every query (sqlsdc.guard.spark._answer)
        self.answering = threading.Lock()
        _register_hash(session)

    def register(self, name: str, source: DataFrame | str | Path) -> None:
        """Make table ``name`` (DuckDB name, e.g. ``persons`` or ``sqlsdc.ptable``) readable by
        protected trees, from a DataFrame of this session or a Parquet path."""
        is_path = isinstance(source, (str, Path))
        frame = self.session.read.parquet(str(source)) if is_path else source
        self._register_frame(name, frame)
        self.data_versions.pop(name.lower(), None)  # not (or no longer) a copy of a DuckDB table
        self._copies.pop(view_name(name), None)
        self.duckdb_types.pop(view_name(name), None)
        self.summable = {key: ok for key, ok in self.summable.items() if key[0] != name.lower()}

    def register_cells(self, name: str, cells: pa.Table) -> None:
        """Make a relation of released cells (the noisy DP cells a protected tree reads,
        aggregated values only) readable by protected trees."""
        self._register_frame(name, self.session.createDataFrame(cells))

    def _register_frame(self, name: str, frame: DataFrame) -> None:
        view = view_name(name)
        for f in frame.schema:
            if "collate" in f.dataType.simpleString().lower():
                raise NotSupportedError(
                    f"{name}.{f.name} is {f.dataType.simpleString()}: Spark would compare and "
                    "group its text by that collation, DuckDB by the bytes; register it as "
                    "a plain string"
                )
        frame.createOrReplaceTempView(view)
        self.schemas[view] = {f.name.lower(): f.dataType.simpleString() for f in frame.schema}

    def data_version(self, table: str) -> str:
        """The DuckDB data version (row count and hash, as the guarded connection computes it)
        of a table copied by :meth:`load_duckdb`: DP cells are named by it, so the same cells
        get the same noise on both engines and changed data gets fresh noise.

        The version is that of the copy :meth:`load_duckdb` made, and Spark reads whatever
        the view of that name holds when the tree runs: a view replaced since (the session's
        ``createOrReplaceTempView``) or a Parquet copy rewritten would release other rows
        under the copy's version, so under the noise of the DuckDB cells, and a Spark answer
        next to a DuckDB one (another analyst's) was the exact difference (red team s40c).
        The view must still be the copy: its plan's semantic hash and its files' sizes and
        modification times as :meth:`load_duckdb` left them.

        Raises:
            NotSupportedError: ``table`` was not copied from DuckDB by :meth:`load_duckdb`,
                or its view or copy changed since.
        """
        try:
            version = self.data_versions[table.lower()]
        except KeyError:
            raise NotSupportedError(
                f"differential privacy on Spark needs {table} copied with load_duckdb(): its "
                "cells are named by the data version of the DuckDB table they come from"
            ) from None
        view = view_name(table)
        state = self._copy_state(view)
        if state is None or state != self._copies.get(view):
            raise NotSupportedError(
                f"Spark's view of {table} is no longer the copy load_duckdb() made (the view "
                "was replaced or its Parquet copy changed): its cells would carry the noise "
                "of the DuckDB table's version over other rows; copy it again with load_duckdb()"
            )
        return version

    def _copy_state(self, view: str) -> tuple | None:
        """What identifies the rows of ``view``: its plan's semantic hash and the size and
        modification time of each file it reads (None when it cannot be read)."""
        from pyspark.errors import PySparkException

        try:
            frame = self.session.table(view)
            plan, files = frame.semanticHash(), sorted(frame.inputFiles())
            stats = [os.stat(Path(url2pathname(urlparse(f).path))) for f in files]
        except (PySparkException, OSError):
            return None
        return plan, tuple((f, s.st_size, s.st_mtime_ns) for f, s in zip(files, stats, strict=True))

    def load_duckdb(self, database: str | Path | duckdb.DuckDBPyConnection, tables: Iterable[str]):
        """Copy DuckDB tables (all columns, hidden ``__rkey`` included; ``sqlsdc.*`` too) into
        Spark through Parquet files in a temporary folder that :meth:`close` removes.

        ``database`` is a path, opened read-only with a plain connection (sqlsdc's hardened
        connections refuse file access), or a connection allowed to write files. HUGEINT columns
        are copied as DECIMAL(38, 0), which Parquet keeps exactly (DuckDB writes HUGEINT as
        DOUBLE).
        """
        import duckdb

        from sqlsdc.engines.duckdb import data_version, open_database

        folder = tempfile.mkdtemp(prefix="sqlsdc-spark-")
        self._folders.append(folder)
        own = isinstance(database, (str, Path))
        con = open_database(database, read_only=True) if own else database
        try:
            for name in tables:
                path = Path(folder) / f"{view_name(name)}.parquet"
                relation = con.table(name)
                exact = [
                    duckdb.ColumnExpression(c).cast(duckdb.sqltype("DECIMAL(38, 0)")).alias(c)
                    if str(t) in ("HUGEINT", "UHUGEINT")
                    else duckdb.ColumnExpression(c)
                    for c, t in zip(relation.columns, relation.types, strict=True)
                ]
                try:
                    relation.select(*exact).to_parquet(str(path))
                except duckdb.Error as e:
                    raise Error(
                        f"DuckDB could not write {name} to Parquet ({str(e).splitlines()[0]}); "
                        "pass the database path instead of a hardened sqlsdc connection"
                    ) from None
                self.register(name, path)
                self.duckdb_types[view_name(name)] = {
                    c.lower(): str(t) for c, t in zip(relation.columns, relation.types, strict=True)
                }
                if "." not in name:  # a data table (not sqlsdc.*): as Connection._data_version
                    self.data_versions[name.lower()] = data_version(con, name)
                    self._copies[view_name(name)] = self._copy_state(view_name(name))
        finally:
            if own:
                con.close()

    def _check_session(self) -> None:
        """Refuse a session whose :data:`SESSION` settings were changed since the engine set
        them: its cells would not be DuckDB's. Checked before a tree is translated, so a DP
        stage is refused before anything is charged."""
        for setting, (value, why) in SESSION.items():
            if str(self.session.conf.get(setting)).lower() != value.lower():
                raise NotSupportedError(f"{setting} was changed from {value}: {why}")
        legacy = sorted(k for k in self.session.conf.getAll if k.lower().startswith(LEGACY))
        unpinned = [k for k in legacy if k not in SESSION]
        if unpinned:
            raise NotSupportedError(
                f"the Spark session sets {', '.join(unpinned)}: a legacy meaning of SQL may "
                "compute other cells than DuckDB; unset it (spark.conf.unset) to run here"
            )

    def sql(self, tree: exp.Expr) -> str:
        """The Spark SQL for a protected tree, after every check (runs nothing)."""
        self._check_session()
        duckdb_tree = read_as_duckdb(tree)
        _check(duckdb_tree)
        missing = sorted(t for t in _tables(duckdb_tree) if view_name(t) not in self.schemas)
        if missing:
            raise ProgrammingError(
                f"table {', '.join(missing)} is not registered with the Spark engine; "
                "use register() or load_duckdb()"
            )
        return _translate(duckdb_tree, self.schemas, self.duckdb_types).sql(dialect=DIALECT)

    def run(self, tree: exp.Expr) -> pa.Table:
        """Run a protected tree; the result has DuckDB's values, typed by normalise_types."""
        return normalise_types(self.run_exact(tree))

    def run_exact(self, tree: exp.Expr) -> pa.Table:
        """Run a protected tree; the result has DuckDB's values in Spark's Arrow types (exact
        decimals; :func:`as_types` gives them DuckDB's types)."""
        from pyspark.errors import PySparkException

        sql = self.sql(tree)  # checks the session first
        if HASH_UDF in sql.lower():  # ours, whatever the session registered under its name since
            _register_hash(self.session)
        try:
            return self.session.sql(sql).toArrow()
        except PySparkException as e:  # the message may quote confidential values: not shown
            condition = e.getCondition() or type(e).__name__
            raise OperationalError(
                "the query failed on Spark; the engine's message is withheld",
                detail=f"{condition}: {e}",
            ) from None

    def close(self) -> None:
        """Drop the views this engine registered and its Parquet copies; the session stays."""
        for view in self.schemas:
            self.session.catalog.dropTempView(view)
        self.schemas.clear()
        self.data_versions.clear()
        self._copies.clear()
        self.duckdb_types.clear()
        for folder in self._folders:
            shutil.rmtree(folder, ignore_errors=True)
        self._folders.clear()

    def __enter__(self) -> SparkEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
