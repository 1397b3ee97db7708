"""validate_release: the last pass before anything runs, independent of the passes before it.

It re-derives from the final tree alone that every read of a confidential table sits inside a
protected-cells subquery (directly, or through CTEs used only there), that no internal column
leaves the query, and that DuckDB's own parser sees no other table than the policy allows.
A failure here is a bug in an earlier pass, so the query is refused rather than run.
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.catalog.schema import CATALOG_SCHEMA
from sqlsdc.catalog.store import PATTERN_PREFIX
from sqlsdc.errors import InternalError
from sqlsdc.policy import Policy
from sqlsdc.rewrite.cells import CELLS, HALF_WIDTH_PREFIX, SD_PREFIX, STATUS_PREFIX
from sqlsdc.rewrite.dp import RELATION_PREFIX

INTERNAL_COLUMNS = ("__rkey",)
CATALOG_TABLES = ("ptable_entries",)  # catalog tables a protected query may read, with the
# protected universes of suppressed tables (``suppressed__<table>``)


def validate_release(tree: exp.Expr, policy: Policy) -> None:
    ctes = {cte.alias_or_name.lower(): cte for cte in tree.find_all(exp.CTE)}
    for table in tree.find_all(exp.Table):
        if _catalog_lookup(table) or _noisy_cells(table):
            continue
        if (
            table.args.get("db")
            or table.args.get("catalog")
            or not isinstance(table.this, exp.Identifier)
        ):
            raise InternalError(f"unqualified base table expected, found {table.sql('duckdb')}")
        name = table.name.lower()
        if name in ctes:
            continue
        declared = policy.table(name)
        if declared is None:
            raise InternalError(f"undeclared table {name} in the protected query")
        if not declared.is_public and not _protected(table, ctes, set()):
            raise InternalError(f"confidential table {name} is read outside protected cells")
    for column in tree.find_all(exp.Column):
        if column.name.lower() in INTERNAL_COLUMNS and not _protected(column, ctes, set()):
            raise InternalError(f"internal column {column.name} in the protected query")
    hidden = (STATUS_PREFIX, SD_PREFIX, HALF_WIDTH_PREFIX)
    for name in _output_names(tree):
        if name.startswith("__") and not name.startswith(hidden):
            raise InternalError(f"internal column {name} would be returned")


def _noisy_cells(table: exp.Table) -> bool:
    """The noisy cells of a DP aggregation (registered by the connection), inside cells."""
    return (
        table.name.startswith(RELATION_PREFIX)
        and not table.args.get("db")
        and not table.args.get("catalog")
        and _protected(table, {}, set())
    )


def _catalog_lookup(table: exp.Table) -> bool:
    """A ptable read by a CKM frame or a suppression pattern, inside protected cells."""
    return (
        table.db == CATALOG_SCHEMA
        and not table.args.get("catalog")
        and (table.name in CATALOG_TABLES or table.name.startswith(PATTERN_PREFIX))
        and _protected(table, {}, set())
    )


def check_engine_tables(tables_read: set[str], tree: exp.Expr, policy: Policy) -> None:
    """Compare the tables DuckDB says the SQL reads with the policy (defence in depth).

    DuckDB resolves CTE scopes itself (a CTE in scope is not a table it reads), so a name that
    is also a CTE elsewhere in the tree is not exempt: it would be a catalog object."""
    internal = {t.name for t in tree.find_all(exp.Table) if _catalog_lookup(t) or _noisy_cells(t)}
    for name in tables_read:
        if name not in internal and policy.table(name) is None:
            raise InternalError(f"the engine would read undeclared table {name}")


def _protected(node: exp.Expr, ctes: dict[str, exp.CTE], seen: set[str]) -> bool:
    current = node.parent
    while current is not None:
        if isinstance(current, exp.Subquery) and current.alias == CELLS:
            return True
        if isinstance(current, exp.CTE):
            name = current.alias_or_name.lower()
            if name in seen:
                return False
            uses = [
                t
                for t in current.root().find_all(exp.Table)
                if t.name.lower() == name and not _inside(t, current)
            ]
            return all(_protected(t, ctes, seen | {name}) for t in uses)  # unused CTEs never run
        current = current.parent
    return False


def _inside(node: exp.Expr, container: exp.Expr) -> bool:
    current = node.parent
    while current is not None:
        if current is container:
            return True
        current = current.parent
    return False


def _output_names(tree: exp.Expr) -> list[str]:
    select = tree
    while isinstance(select, (exp.Union, exp.Intersect, exp.Except)):
        select = select.this
    while isinstance(select, exp.Subquery):
        select = select.this
    return [p.alias_or_name for p in select.expressions]
