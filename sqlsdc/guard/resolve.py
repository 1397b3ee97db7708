"""Name resolution: every table must be a declared table of the main schema; columns are then
qualified against the policy's view of the schema (declared columns only; ``__`` columns and
undeclared columns of confidential tables do not exist for analysts).
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.errors import OptimizeError
from sqlglot.optimizer.qualify import qualify

from sqlsdc.errors import PolicyViolation
from sqlsdc.guard.allowlist import RESERVED_PREFIX
from sqlsdc.policy import Policy

DIALECT = "duckdb"


def analyst_schema(
    policy: Policy, database: dict[str, dict[str, str]]
) -> dict[str, dict[str, str]]:
    """``{table: {column: type}}`` as analysts may see it."""
    schema = {}
    for table in policy.tables.values():
        columns = database.get(table.name, {})
        if table.is_public:
            visible = {c: t for c, t in columns.items() if not c.startswith(RESERVED_PREFIX)}
        else:
            visible = {c: columns[c] for c in table.columns if c in columns}
        schema[table.name] = visible
    return schema


def check_tables(tree: exp.Expr, policy: Policy, sql: str) -> None:
    """Refuse table functions, qualified names, undeclared tables and CTEs shadowing tables."""
    cte_names = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for name in cte_names:
        if policy.table(name) is not None:
            raise PolicyViolation(
                f"the CTE name {name!r} shadows a table of the database",
                "give the CTE another name",
                sql,
            )
        _check_reserved(name, sql)
    for table in tree.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            raise PolicyViolation(
                f"table functions such as {table.this.sql(DIALECT)[:60]} are not allowed",
                f"query the declared tables: {_declared(policy)}",
                sql,
            )
        name = table.name.lower()
        if table.args.get("db") or table.args.get("catalog"):
            raise PolicyViolation(
                f"qualified table name {table.sql(DIALECT)!r} is not allowed",
                f"use the plain table name; declared tables: {_declared(policy)}",
                sql,
            )
        if name in cte_names:
            continue
        if policy.table(name) is None:
            raise PolicyViolation(
                f"table {table.name!r} is not declared in the policy",
                f"query the declared tables: {_declared(policy)}",
                sql,
            )


def qualify_tree(tree: exp.Expr, schema: dict, sql: str) -> exp.Expr:
    """Qualify every column with its source (sqlglot ``qualify``); unknown names are refused."""
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
        raise PolicyViolation(
            f"name resolution failed: {message}",
            "use the declared columns of the declared tables; see `sqlsdc policy show`",
            sql,
        ) from None
    for node in qualified.find_all(exp.Identifier):
        _check_reserved(node.name, sql)
    return qualified


def _check_reserved(name: str, sql: str) -> None:
    if name.startswith(RESERVED_PREFIX):
        raise PolicyViolation(
            f"names starting with {RESERVED_PREFIX!r} are reserved for sqlsdc ({name!r})",
            "rename the alias or column",
            sql,
        )


def _declared(policy: Policy) -> str:
    return ", ".join(sorted(policy.tables))
