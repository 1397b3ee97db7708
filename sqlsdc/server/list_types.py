"""The element type of an untyped list parameter ``column = ANY($n)``, as PostgreSQL infers it:
the compared column's type (an array of ``int4`` for an INTEGER column), so that a driver that
encodes a list by the type the server describes (asyncpg) can send a list of integers.

Decided from the statement's parse tree and the tables the user may query
(:attr:`sqlsdc.guard.connection.Connection.analyst_schema`), never from data; where the column
is not plainly one column of one table of the statement (a CTE, a subquery, a name two tables
have, a table outside the policy, a type without an array here) the parameter stays an array
of text. The type only decides how the server reads the values: the guard checks the list as
the IN list it means, whatever its type.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from sqlsdc.server import arrays
from sqlsdc.server.shadow import _FROM_DUCKDB, TYPE_OIDS


def list_types(sql: str, numbers: set[int], schema: dict[str, dict[str, str]]) -> dict[int, int]:
    """Array type OIDs of the parameters ``numbers`` (each untyped in ``column = ANY($n)``)
    whose column is known; ``schema``: ``{table: {column: DuckDB type}}``."""
    try:
        tree = sqlglot.parse_one(sql, read="postgres")
    except (ParseError, TokenError, ValueError, RecursionError):
        return {}
    if tree is None or any(tree.find_all(exp.CTE, exp.Subquery)):
        return {}
    tables = {t.lower(): {c.lower(): k for c, k in cols.items()} for t, cols in schema.items()}
    aliases: dict[str, str] = {}
    for table in tree.find_all(exp.Table):
        name = table.name.lower()
        if name not in tables or table.db.lower() not in ("", "public", "main"):
            return {}
        aliases[table.alias_or_name.lower()] = name
    found = {}
    for node in tree.find_all(exp.Any):
        number, column = _compared(node)
        if number not in numbers or column is None:
            continue
        element = _column_type(column, aliases, tables)
        if element is not None and element in arrays.ARRAY_OF:
            found[number] = arrays.ARRAY_OF[element]
    return found


def _compared(node: exp.Any) -> tuple[int | None, exp.Column | None]:
    """``(n, column)`` of ``column = ANY($n)``, else ``(None, None)``."""
    parameter = node.this.unnest() if isinstance(node.this, exp.Paren) else node.this
    parent = node.parent
    if not isinstance(parameter, exp.Parameter) or not isinstance(parent, exp.EQ):
        return None, None
    if parent.expression is not node or not isinstance(parent.this, exp.Column):
        return None, None
    text = parameter.name if parameter.name.isdigit() else parameter.this.name
    return (int(text), parent.this) if text.isdigit() else (None, None)


def _column_type(column: exp.Column, aliases: dict[str, str], tables: dict) -> int | None:
    """The PostgreSQL type OID of ``column``: of its table (by alias), or of the one table of
    the statement that has a column of that name."""
    name = column.name.lower()
    if column.table:
        table = aliases.get(column.table.lower())
        candidates = [tables[table][name]] if table and name in tables[table] else []
    else:
        candidates = [tables[t][name] for t in set(aliases.values()) if name in tables[t]]
    if len(candidates) != 1:
        return None
    kind = candidates[0].upper()
    base = kind if kind.startswith("TIMESTAMP WITH") else kind.split("(")[0].strip()
    return TYPE_OIDS.get(_FROM_DUCKDB.get(base, ""))
