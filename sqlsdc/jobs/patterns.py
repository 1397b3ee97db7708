"""Protected universes of suppressed tables, kept in the catalog and kept fresh.

Before a query reads ``sqlsdc.suppressed__<table>``, :func:`ensure_patterns` recomputes the
table's inner cells in SQL and compares their fingerprint (data and policy settings) with the
one recorded in ``sqlsdc.suppressions``. When they differ — new data, new rules — the universe is
protected again, carrying over the earlier pattern (:mod:`sqlsdc.tabular.universe`), inside the
caller's transaction: a query never reads a pattern made for other data.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from sqlglot import exp

from sqlsdc.catalog.schema import CATALOG_SCHEMA
from sqlsdc.catalog.store import now, pattern_table
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines import duckdb_schema, duckdb_sql
from sqlsdc.errors import PolicyError, TabularError
from sqlsdc.policy import Policy
from sqlsdc.tabular.universe import (
    LEVEL,
    Universe,
    fingerprint,
    inner_cells_sql,
    universe_of,
)

if TYPE_CHECKING:
    import pandas as pd

S = CATALOG_SCHEMA
CODE_TYPES = ("VARCHAR", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT",
              "USMALLINT", "UINTEGER", "UBIGINT")  # fmt: skip
PATTERN_VIEW = "__sqlsdc_pattern"


def ensure_patterns(con, policy: Policy, policy_version: int, tables) -> list[dict]:
    """Make the protected universe of every table in ``tables`` match the data; return the
    reports of the universes protected anew (empty when all were fresh)."""
    reports = []
    for name in tables:
        universe = universe_of(policy, name)
        types = _code_types(con, universe)
        cells = engine.run(con, duckdb_sql.to_sql(inner_cells_sql(universe))).to_pandas()
        digest = fingerprint(universe, cells)
        current = engine.one(con, f"SELECT fingerprint FROM {S}.suppressions WHERE table_name = ?",
                             [universe.table])  # fmt: skip
        if current is not None and current[0] == digest:
            continue
        from sqlsdc.tabular.universe_pattern import protect_universe  # the solvers, when stale

        earlier = _load(con, universe) if current is not None else None
        pattern, report = protect_universe(universe, cells, earlier)
        _store(con, universe, pattern, types)
        con.execute(f"DELETE FROM {S}.suppressions WHERE table_name = ?", [universe.table])
        con.execute(
            f"INSERT INTO {S}.suppressions VALUES (?, ?, ?, ?, ?, ?)",
            [universe.table, digest, policy_version, now(), len(pattern), json.dumps(report)],
        )
        reports.append({"table": universe.table, **report})
    return reports


def refuse_uncoded_types(con, policy: Policy) -> None:
    """Refuse a policy whose suppression universe has a dimension of a type the pattern cannot
    code (an ENUM, a DATE, a BOOLEAN...): applied, every query of the table was refused with
    "the suppression pattern cannot be made" and only ``sqlsdc publish`` said why (new user
    s48e, an ENUM size class). Run before the policy is applied
    (:func:`sqlsdc.admin.policy_checks`)."""
    schemas = duckdb_schema.table_schemas(con)
    problems = []
    for table in policy.confidential_tables:
        if table.suppression is None:
            continue
        types = schemas.get(table.name, {})
        for column in universe_of(policy, table.name).columns:
            kind = types.get(column)
            if kind is not None and kind not in CODE_TYPES:
                shown = "ENUM" if kind.upper().startswith("ENUM") else kind
                problems.append(
                    f"{policy.source}: tables.{table.name}.suppression.dimensions: {column} is "
                    f"{shown}, and suppression needs text or integer codes: store it as text, "
                    f"e.g. CREATE OR REPLACE TABLE {table.name} AS SELECT * REPLACE "
                    f"(CAST({column} AS VARCHAR) AS {column}) FROM {table.name}"
                )
    if problems:
        raise PolicyError(problems)


def _code_types(con, universe: Universe) -> dict[str, str]:
    """Types of the universe columns; codes must be text or integers (compared as text)."""
    types = duckdb_schema.table_schemas(con).get(universe.table, {})
    for column in universe.columns:
        if types.get(column) not in CODE_TYPES:
            raise TabularError(
                f"{universe.table}.{column} has type {types.get(column)}; suppression "
                "dimensions must hold text or integer codes"
            )
    return {c: types[c] for c in universe.columns}


def _store(con, universe: Universe, pattern: pd.DataFrame, types: dict[str, str]) -> None:
    """Write the pattern with the universe columns in their original types."""
    columns = [exp.alias_(exp.cast(exp.column(LEVEL), "INTEGER"), LEVEL)]
    for column in universe.columns:
        columns.append(exp.alias_(exp.cast(exp.column(column), types[column]), column))
    for name in pattern.columns[len(universe.columns) + 1 :]:
        value = exp.column(name)
        if name.startswith("count__value") or name.endswith("__n"):
            value = exp.cast(value, "BIGINT")
        columns.append(exp.alias_(value, name))
    select = exp.select(*columns).from_(PATTERN_VIEW)
    create = exp.Create(
        this=pattern_table(universe.table), kind="TABLE", expression=select, replace=True
    )
    con.register(PATTERN_VIEW, pattern)
    try:
        con.execute(duckdb_sql.to_sql(create))
    finally:
        con.unregister(PATTERN_VIEW)


def _load(con, universe: Universe) -> pd.DataFrame | None:
    """The stored pattern, universe columns as text (as :func:`protect_universe` makes them)."""
    table = pattern_table(universe.table)
    stored = duckdb_schema.table_columns(con, S, table.name)
    if not stored:
        return None
    text = {c: exp.alias_(exp.cast(exp.column(c), "VARCHAR"), c) for c in universe.columns}
    select = exp.select(*[text.get(c, exp.column(c)) for c in stored]).from_(table)
    return engine.run(con, duckdb_sql.to_sql(select)).to_pandas()
