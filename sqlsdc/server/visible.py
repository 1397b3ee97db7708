"""What a user may see of a database: the one model behind every catalog sqlsdc shows.

The PostgreSQL catalog of a server session (:mod:`sqlsdc.server.catalog`) and the reflection
of the embedded SQLAlchemy dialect (:mod:`sqlsdc.dialect`) are both built from
:func:`visible_tables`, so the two never disagree and neither has a rule of its own:

- which tables exist is the guard's decision: a table is listed when the guard's
  :func:`~sqlsdc.guard.resolve.check_tables` accepts a statement reading it. Declared tables of
  the main schema pass; a job's output ``protected.<name>`` passes the day the policy lets
  analysts read it (today the guard refuses every qualified name, so none is listed);
- which columns exist is the guard's name-resolution schema
  (:attr:`sqlsdc.Connection.analyst_schema`): declared, non-hidden columns only, never a
  record key or another ``__`` column;
- comments tell what a column may be used for (its policy role) and how a table's cells are
  protected; nothing else is said: no row count, statistic, index or constraint, and never the
  ``sqlsdc`` schema.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from sqlsdc.guard.resolve import readable
from sqlsdc.policy import ColumnRole, Policy, Table

OUTPUT_SCHEMA = "protected"  # where back-end jobs store their outputs (sqlsdc.jobs.session)

_ROLE_NOTES = {
    ColumnRole.IDENTIFIER: "identifier: for joins along declared keys and COUNT(DISTINCT) only",
    ColumnRole.DIMENSION: "dimension: may be grouped by, filtered on and counted",
    ColumnRole.MEASURE: "measure: may be summed or averaged; never grouped by or shown row by row",
    ColumnRole.WEIGHT: "weight: may be summed or averaged; never grouped by or shown row by row",
}


@dataclass(frozen=True)
class VisibleColumn:
    name: str
    type: str  # the engine's type name (DuckDB's, e.g. ``BIGINT``, ``DECIMAL(18,2)``)
    comment: str = ""


@dataclass(frozen=True)
class VisibleTable:
    """A table as a user sees it: ``schema`` is ``public`` for the declared tables (PostgreSQL
    clients' default schema; the guard reads them unqualified) or ``protected``."""

    schema: str
    name: str
    columns: tuple[VisibleColumn, ...]
    comment: str = ""
    is_view: bool = False


def visible_tables(connection) -> tuple[VisibleTable, ...]:
    """The tables, columns and comments ``connection``'s user may query, sorted by schema and
    name. ``connection`` is a guarded :class:`sqlsdc.Connection`."""
    policy: Policy = connection.policy
    tables = []
    for name, columns in sorted(connection.analyst_schema.items()):
        if readable(policy, exp.to_table(name)):
            table = policy.table(name)
            tables.append(
                VisibleTable(
                    schema="public",
                    name=name,
                    columns=tuple(
                        VisibleColumn(c, dtype, _column_comment(table, c))
                        for c, dtype in columns.items()
                    ),
                    comment=_table_comment(table),
                )
            )
    outputs = connection.stored_schemas(OUTPUT_SCHEMA)
    for name, columns in sorted(outputs.items()):
        if readable(policy, exp.table_(name, db=OUTPUT_SCHEMA)):
            tables.append(
                VisibleTable(
                    schema=OUTPUT_SCHEMA,
                    name=name,
                    columns=tuple(
                        VisibleColumn(c, dtype)
                        for c, dtype in columns.items()
                        if not c.startswith("__")
                    ),
                    comment="protected output of a back-end job: its cells are already protected",
                    is_view=True,
                )
            )
    return tuple(tables)


def _column_comment(table: Table | None, column: str) -> str:
    declared = table.column(column) if table is not None else None
    if table is None or declared is None or table.is_public:
        return declared.description if declared is not None else ""
    note = _ROLE_NOTES.get(declared.role, declared.role.value)
    return f"{note}; {declared.description}" if declared.description else note


def _table_comment(table: Table | None) -> str:
    if table is None:
        return ""
    if table.is_public:
        how = "public table: rows may be read as they are"
    else:
        rules = ", ".join(
            f"{kind.value}: {rule.method.value}" for kind, rule in sorted(table.protection.items())
        )
        how = f"confidential table: only protected aggregates are answered ({rules})"
    return f"{how}; {table.description}" if table.description else how
