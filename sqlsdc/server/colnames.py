"""PostgreSQL's names for unaliased function columns of a result, as clients of the server
expect them.

DuckDB names an unaliased ``COUNT(*)`` ``count_star()`` and ``SUM(income)`` ``sum(income)``;
PostgreSQL names both after the function: ``count``, ``sum`` (PostgreSQL documentation,
"SELECT", output names: "If no output column name is specified using AS, the system assigns a
default column name. For simple column references, this is the name of the referenced column.
For function calls, this is the name of the function."; the rule is ``FigureColname`` in
parser/parse_target.c, which also looks through casts). BI tools key charts and
``ResultSet.getLong("count")`` on those names. :func:`postgres_names` renames, in the server's
answer only, the columns of a guarded result that the statement left unaliased and that are
function calls; the guard, its checks and its cells are untouched.
"""

from __future__ import annotations

import re

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from sqlsdc.server.textcache import text_cache

DIALECT = "duckdb"  # the guard's dialect (sqlsdc.guard.parse)
_WRAPPERS = (exp.Cast, exp.Window, exp.Filter, exp.WithinGroup, exp.Paren)


def postgres_names(sql: str, names: list[str]) -> list[str]:
    """``names`` (the engine's column names of the result of ``sql``) with each unaliased
    function call named after its function, as PostgreSQL does; unchanged when the statement's
    select list does not match the result column for column.

    Example:
        >>> postgres_names("SELECT region, COUNT(*) FROM persons GROUP BY region",
        ...                ["region", "count_star()"])
        ['region', 'count']
    """
    if not any("(" in name for name in names):
        return names  # no function column to rename: the statement is not parsed again
    figured = _select_names(sql)
    if figured is None or len(figured) != len(names):
        return names
    return [new if new is not None and "(" in old else old
            for old, new in zip(names, figured, strict=True)]  # fmt: skip


@text_cache
def _select_names(sql: str) -> tuple[str | None, ...] | None:
    """PostgreSQL's name of each function column of the statement's (first) select list, None
    for the others; None when the statement is not one plain query or selects ``*``."""
    try:
        trees = sqlglot.parse(sql, read=DIALECT)
    except (ParseError, TokenError, ValueError, RecursionError):  # RecursionError: nested
        # too deeply for sqlglot (the guard's names stay)
        return None
    if len(trees) != 1 or not isinstance(trees[0], exp.Query):
        return None
    select = trees[0]
    while isinstance(select, exp.SetOperation):  # UNION …: the first branch names the columns
        select = select.this
    if not isinstance(select, exp.Select) or any(
        isinstance(e, exp.Star) or (isinstance(e, exp.Column) and e.is_star)
        for e in select.expressions
    ):
        return None
    return tuple(_function_name(e) for e in select.expressions)


def _function_name(node: exp.Expr) -> str | None:
    while isinstance(node, _WRAPPERS):
        node = node.this
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    if isinstance(node, exp.AggFunc):
        return node.sql_name().lower()
    if isinstance(
        node, exp.Func
    ):  # version(), current_schema(), upper(x): the name it is called by
        called = _CALLED.match(node.sql(DIALECT))
        return called.group(1).lower() if called else None
    return None


_CALLED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\(")
