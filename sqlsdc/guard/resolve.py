"""Name resolution: every name an analyst writes must resolve inside the policy's view of the
database, and a name that does not resolve is refused with the same message whatever the
database holds.

Tables resolve to a CTE in scope or to a declared table of the main schema; columns resolve
against :func:`analyst_schema` (the declared, non-hidden columns of each declared table); types
are DuckDB's built-in ones. So a hidden table, a view, a sequence, a user type, the ``sqlsdc``
catalog, ``information_schema``, ``pg_catalog`` or an undeclared column is refused exactly as
a name that exists nowhere, and nothing reaches the engine that it could resolve differently.
"""

from __future__ import annotations

import re
from difflib import get_close_matches

from sqlglot import exp
from sqlglot.errors import OptimizeError
from sqlglot.optimizer.qualify import qualify

from sqlsdc.engines.duckdb_sql import PLAIN_NAME
from sqlsdc.engines.trees import nodes
from sqlsdc.errors import PolicyViolation
from sqlsdc.guard import using_columns
from sqlsdc.planner.allowlist import RESERVED_PREFIX
from sqlsdc.planner.identity import output_reference
from sqlsdc.planner.repeated_columns import RepeatedColumns
from sqlsdc.policy import ColumnRole, Policy

DIALECT = "duckdb"
_COLUMNS_HINT = "use the declared columns of the declared tables; see `sqlsdc policy show`"


def analyst_schema(
    policy: Policy, database: dict[str, dict[str, str]]
) -> dict[str, dict[str, str]]:
    """``{table: {column: type}}`` as analysts may see it, in the database's column order.

    A column is visible when the policy declares it for its table with a role other than
    ``hidden`` and it exists in the database; this holds for public tables as for confidential
    ones. Undeclared columns, hidden ones and sqlsdc's ``__`` columns do not exist for analysts.
    A table with no visible column is left out (:func:`qualify_tree` refuses reading it).
    """
    schema = {}
    for table in policy.tables.values():
        columns = database.get(table.name, {})
        visible = {
            name: dtype
            for name, dtype in columns.items()
            if (declared := table.column(name)) is not None
            and declared.role is not ColumnRole.HIDDEN
            and not name.startswith(RESERVED_PREFIX)
        }
        if visible:
            schema[table.name] = visible
    return schema


def readable(policy: Policy, table: exp.Table) -> bool:
    """Whether the guard accepts a statement that reads ``table``: :func:`check_tables` asked
    rather than restated (what the catalogs of :mod:`sqlsdc.server.visible` and
    ``Connection.stored_schemas`` list for users other than admins)."""
    probe = exp.select(exp.Star()).from_(table.copy())
    try:
        check_tables(probe, policy, probe.sql("duckdb"))
    except PolicyViolation:
        return False
    return True


def check_tables(
    tree: exp.Expr, policy: Policy, sql: str, walked: list[exp.Expr] | None = None
) -> set[str]:
    """Refuse every table reference that is neither a CTE in scope nor a declared table, every
    qualified name, table function, CTE shadowing a declared table or another CTE, and
    user-defined type. Returns the declared tables the statement reads (lower case).
    ``walked``: ``nodes(tree)``, when the caller has it."""
    found = _nodes_by_type(tree, exp.CTE, exp.Table, exp.Column, exp.DataType, walked=walked)
    ctes: set[str] = set()
    read: set[str] = set()
    for cte in found[exp.CTE]:
        name = cte.alias_or_name.lower()
        if policy.table(name) is not None:
            raise PolicyViolation(
                f"the CTE name {name!r} shadows a table of the database",
                "give the CTE another name",
                sql,
            )
        _check_reserved(name, sql)
        if name in ctes:
            # one WITH: DuckDB refuses the statement, sqlglot and the lineage read the last
            # definition; nested WITHs: sqlsdc's passes that look CTEs up by name (the release
            # validation) would see one of the two
            raise PolicyViolation(
                f"two CTEs are named {name!r}", "give every CTE its own name", sql
            )
        ctes.add(name)
    for table in found[exp.Table]:
        if not isinstance(table.this, exp.Identifier):
            raise PolicyViolation(
                f"table functions such as {table.this.sql(DIALECT)[:60]} are not allowed",
                f"query the declared tables: {_declared(policy)}",
                sql,
            )
        if table.args.get("db") or table.args.get("catalog"):
            raise PolicyViolation(
                f"qualified table name {table.sql(DIALECT)!r} is not allowed",
                f"use the plain table name; declared tables: {_declared(policy)}",
                sql,
            )
        alias = table.args.get("alias")
        if alias is not None and alias.columns:
            # DuckDB renames the table's first columns by position; sqlglot reads the names
            # as the table's own: ``persons AS p(sex)`` grouped by p.sex ran by the identifier
            raise PolicyViolation(
                f"column aliases on a table ({alias.sql(DIALECT)[:60]}) are not allowed",
                "rename columns in a derived table: (SELECT pid AS x FROM t) AS p",
                sql,
            )
        if _cte_in_scope(table):
            continue
        if policy.table(table.name) is None and table.name.lower() in policy.releases:
            raise PolicyViolation(
                f"released output {table.name!r} is not available: protected.{table.name} was "
                "dropped, or replaced by something other than a synthesis or anonymisation job, "
                "or holds records of a table the policy protects by differential privacy "
                "without being a DP synthesis",
                "ask an admin to run the job again (sqlsdc synthesize/anonymize --replace)",
                sql,
            )
        if policy.table(table.name) is None:
            raise PolicyViolation(
                f"table {table.name!r} is not declared in the policy",
                f"query the declared tables: {_declared(policy)}",
                sql,
            )
        read.add(table.name.lower())
    for column in found[exp.Column]:
        if column.args.get("db") or column.args.get("catalog"):
            raise PolicyViolation(
                f"qualified column name {column.sql(DIALECT)!r} is not allowed",
                "name a column as column or table.column (or alias.column)",
                sql,
            )
    for dtype in found[exp.DataType]:
        if dtype.this is exp.DataType.Type.USERDEFINED:
            raise PolicyViolation(
                f"type {dtype.sql(DIALECT)!r} is not a built-in type",
                "cast to a built-in type such as INTEGER, BIGINT, DOUBLE, VARCHAR or DATE",
                sql,
            )
    return read


def _nodes_by_type(
    tree: exp.Expr, *types: type, walked: list[exp.Expr] | None = None
) -> dict[type, list[exp.Expr]]:
    """The nodes of each of ``types`` in ``tree``, each list in ``find_all`` order: one walk
    of the tree instead of one per type (a node counts for every listed type it is), none
    when the caller gives the walk (``walked``: ``nodes(tree)``)."""
    found: dict[type, list[exp.Expr]] = {t: [] for t in types}
    lists: dict[type, list[list[exp.Expr]]] = {}  # by class of node: the lists it goes in
    for node in nodes(tree) if walked is None else walked:
        into = lists.get(node.__class__)
        if into is None:  # isinstance, decided once per class
            into = lists[node.__class__] = [found[t] for t in types if isinstance(node, t)]
        for found_of_type in into:
            found_of_type.append(node)
    return found


def _cte_in_scope(table: exp.Table) -> bool:
    """Whether ``table`` names a CTE visible where it is written, as DuckDB binds it: a CTE of a
    WITH clause of an enclosing query; inside a CTE, only the CTEs before it in its WITH (and
    itself under WITH RECURSIVE, which the analysis refuses). Any other reference is to the
    catalog."""
    name = table.name.lower()
    child, node = table, table.parent
    while node is not None:
        if isinstance(node, exp.With):
            position = next(i for i, cte in enumerate(node.expressions) if cte is child)
            visible = node.expressions[: position + 1 if node.args.get("recursive") else position]
            if name in _names(visible):
                return True
            child, node = node.parent, node.parent.parent  # the WITH's own query sees no more
            continue
        with_ = node.args.get("with_")
        if isinstance(with_, exp.With) and name in _names(with_.expressions):
            return True
        child, node = node, node.parent
    return False


def _names(ctes: list[exp.CTE]) -> set[str]:
    return {cte.alias_or_name.lower() for cte in ctes}


def qualify_tree(
    tree: exp.Expr,
    schema: dict,
    sql: str,
    repeated: RepeatedColumns | None = None,
    walked: list[exp.Expr] | None = None,
    qualified_nodes: list[exp.Expr] | None = None,
) -> exp.Expr:
    """Qualify every column with its source (sqlglot ``qualify``); unknown names are refused.

    The refusal quotes sqlglot's message, which is computed from ``schema`` (the analyst's view)
    alone, so it is the same whether or not a hidden object of that name exists. ``repeated``:
    the columns of long chains that sqlglot resolves once per group, set aside here and left
    out of the qualified tree until type inference has run too (the others then get copies of
    the first one's resolved and typed column, before the analysis reads them:
    :func:`sqlsdc.planner.analyze.analyze`). One walk of the tree on each side of ``qualify``
    is shared with the other passes: ``walked`` is ``nodes(tree)`` when the caller has it, and
    ``qualified_nodes``, when given, receives ``nodes()`` of the qualified tree."""
    before = _nodes_by_type(tree, exp.Table, exp.Join, walked=walked)
    for table in before[exp.Table]:
        if table.name.lower() not in schema and not _cte_in_scope(table):
            raise PolicyViolation(
                f"table {table.name!r} has no columns that analysts may read",
                "ask an admin to declare its columns in the policy",
                sql,
            )
    merged_by_using = using_columns.mark(before[exp.Join])
    if repeated is not None:
        repeated.detach()
    try:
        qualified = qualify(
            tree,
            schema=schema,
            dialect=DIALECT,
            quote_identifiers=False,
            validate_qualify_columns=True,
        )
    except OptimizeError as e:
        message = str(e).split(". Line")[0]
        read = sorted({t.name.lower() for t in before[exp.Table]} & schema.keys())
        columns = {name: schema[name] for name in read}
        raise PolicyViolation(
            f"name resolution failed: {message}", _columns_hint(message, sql, columns), sql
        ) from None
    if merged_by_using:
        using_columns.merge(qualified, schema)
    after = nodes(qualified)
    if qualified_nodes is not None:
        qualified_nodes[:] = after
    found = _nodes_by_type(qualified, exp.Column, exp.Identifier, walked=after)
    for column in found[exp.Column]:
        if not column.table and not isinstance(column.this, exp.Star):
            _check_output_reference(column, sql)
    for node in found[exp.Identifier]:
        _check_reserved(node.name, sql)
        if not node.quoted and node.name and not PLAIN_NAME.match(node.name):
            node.set("quoted", True)  # a * expanded with a quoted alias (red team s50e)
    return qualified


_TYPOGRAPHIC_QUOTES = "\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u00ab\u00bb"


def _columns_hint(message: str, sql: str | None, columns: dict[str, dict] | None = None) -> str:
    """The hint for a name that does not resolve; a value written in quotes that are not SQL's
    string quotes (a word processor's ’R01’, or "R01") is a column name to SQL. ``columns``:
    the analyst's columns of each table read; a name that two of them have is ambiguous, and
    a misspelt name gets the close ones among them."""
    if any(q in message for q in _TYPOGRAPHIC_QUOTES):
        return (
            "the statement has typographic quotes (’ “ ”) where SQL needs straight ones: write "
            "strings in single quotes, e.g. region = 'R01'"
        )
    unresolved = re.search(r"Column '([^']*)'", message)
    quoted = unresolved and sql and re.search(f'"({re.escape(unresolved.group(1))})"', sql, re.I)
    if quoted:  # as written, not as sqlglot normalised it
        return (
            f'"{quoted.group(1)}" in double quotes names a column; write strings in single '
            f"quotes, e.g. '{quoted.group(1)}'; {_COLUMNS_HINT}"
        )
    name = unresolved.group(1).lower() if unresolved else ""
    holders = [table for table, cols in (columns or {}).items() if name in cols]
    if len(holders) > 1:
        return (
            f"{name} is a column of {' and '.join(holders)}: say which, e.g. "
            f"{holders[0]}.{name} (or an alias's name before the dot)"
        )
    known = sorted({c for cols in (columns or {}).values() for c in cols})
    close = name and get_close_matches(name, known, n=3)
    if close:
        return f"did you mean {' or '.join(close)}? {_COLUMNS_HINT}"
    return _COLUMNS_HINT


def _check_output_reference(column: exp.Column, sql: str) -> None:
    """A column ``qualify`` left unqualified must name an output of its query in ORDER BY.

    sqlglot does not resolve every clause (a bare name in HAVING stays as written), and DuckDB
    would bind such a name to any column of the table, hidden ones included, while a name that
    exists nowhere fails in the engine: the two must be refused alike, here."""
    order = column.find_ancestor(exp.Order)
    query = order.parent if order is not None else None
    select = query
    while isinstance(select, (exp.Union, exp.Intersect, exp.Except, exp.Subquery)):
        select = select.this
    if not isinstance(select, exp.Select) or column.name not in select.named_selects:
        raise PolicyViolation(
            f"name resolution failed: Column {column.name!r} could not be resolved",
            _COLUMNS_HINT,
            sql,
        )
    if output_reference(select, column) is None:
        # DuckDB reads an ORDER BY key that is a name alone as the output, but a name inside
        # an expression as a column of the tables first (a hidden one too), the output only
        # when no column has that name
        raise PolicyViolation(
            f"the output name {column.name!r} inside an ORDER BY expression is ambiguous "
            "(DuckDB would read a column of that name first)",
            "order by the output's name alone or its position, or write the expression out",
            sql,
        )


def _check_reserved(name: str, sql: str) -> None:
    if name.startswith(RESERVED_PREFIX):
        raise PolicyViolation(
            f"names starting with {RESERVED_PREFIX!r} are reserved for sqlsdc ({name!r})",
            "rename the alias or column",
            sql,
        )


def _declared(policy: Policy) -> str:
    return ", ".join(sorted(policy.tables))
