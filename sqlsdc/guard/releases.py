"""Released outputs: synthetic and anonymised tables that analysts read row by row.

A policy may list outputs of synthesis and anonymisation jobs under ``releases:``. Each such
output ``protected.<name>`` is shown to analysts as a public table named ``<name>``: every
column visible, any SQL over it answered as it is (the records are synthetic or already
anonymised, so no cell needs protecting), and a join with a confidential table protected as
any join of a public table with one. Nothing else becomes readable:

* the output must be a base table of the ``protected`` schema (not a view, which could read
  anything) recorded in ``sqlsdc.outputs`` by a ``synthesize`` or ``anonymize`` job; an
  output dropped, or replaced by another job's table (a protected aggregate) or by hand, is
  not available, and a query naming it is refused with a message that says so;
* no table or view of the main schema may have the same name (it would be ambiguous);
* its job read no table the policy protects by differential privacy, unless it is a DP
  synthesis (:func:`dp_table_read`): a policy may put a table under DP after a synthesis or
  anonymisation of it was made, and its records would be read outside the budget (red team
  s36d);
* the guard reads it through a temporary view ``<name>`` over ``protected.<name>`` that it
  creates on its own engine connection each time it opens the file, so what the name reads
  is decided here, not by anything stored in the database.

This is checked on every opening of the file, so an output dropped or replaced while a
connection is idle is no longer read once the connection opens the file again.
"""

from __future__ import annotations

import json
from dataclasses import replace
from types import MappingProxyType

import sqlglot
from sqlglot import exp

from sqlsdc.engines import duckdb_sql
from sqlsdc.policy import ColumnRole, Policy
from sqlsdc.policy.model import Column, Table, TableKind

__all__ = ["RELEASABLE", "attach_releases", "available_releases", "dp_table_read", "with_releases"]

RELEASABLE = ("synthesize", "anonymize")  # job methods whose outputs are record-level files
OUTPUT_SCHEMA = "protected"

Releases = dict[str, dict[str, str]]  # name -> {column: type}


def available_releases(con, policy: Policy) -> Releases:
    """The policy's releases that are stored, releasable outputs (module docstring), with
    their columns in order."""
    if not policy.releases:
        return {}
    found: Releases = {}
    listed = {f"{OUTPUT_SCHEMA}.{name}" for name in policy.releases}
    outputs = {
        name.lower(): None if dp_table_read(policy, method, sql, report) else method
        for name, method, sql, report in con.execute(
            "SELECT name, method, sql_text, report FROM sqlsdc.outputs "
            "WHERE name LIKE 'protected.%'"
        ).fetchall()
        if name.lower() in listed
    }
    if not any(outputs.get(f"{OUTPUT_SCHEMA}.{name}") in RELEASABLE for name in policy.releases):
        return found  # nothing to look up in the engine's listings (~7 ms on each opening)
    tables = {
        t.lower(): t
        for (t,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
            "AND schema_name = ? AND NOT temporary",
            [OUTPUT_SCHEMA],
        ).fetchall()
    }
    shadows = {
        n.lower()
        for (n,) in con.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_catalog = current_database() AND table_schema = 'main'"
        ).fetchall()
    }
    for name in policy.releases:
        if outputs.get(f"{OUTPUT_SCHEMA}.{name}") not in RELEASABLE:
            continue
        if name not in tables or name in shadows:
            continue
        columns = con.execute(
            "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = "
            "current_database() AND schema_name = ? AND table_name = ? ORDER BY column_index",
            [OUTPUT_SCHEMA, tables[name]],
        ).fetchall()
        visible = {c.lower(): t for c, t in columns if not c.startswith("__")}
        if visible:
            found[name] = visible
    return found


def dp_table_read(policy: Policy, method: str, sql: str, report: str | None) -> str | None:
    """The table protected by DP in ``policy`` that a job output (its ``sqlsdc.outputs``
    method, SQL and report) was made from by a method that is not DP, else None. A DP
    synthesis (its report has an ε) is DP; SQL that does not parse is taken to read every
    table."""
    if method == "synthesize":
        try:
            if json.loads(report or "{}").get("epsilon") is not None:
                return None
        except (ValueError, AttributeError):
            pass
    try:
        tables = {t.name for t in sqlglot.parse_one(sql, read="duckdb").find_all(exp.Table)}
    except sqlglot.errors.ParseError:
        tables = set(policy.tables)
    declared = (policy.table(t) for t in tables)
    return min((t.name for t in declared if t is not None and t.differentially_private),
               default=None)  # fmt: skip


def attach_releases(con, releases: Releases) -> None:
    """Create the temporary view ``<name>`` of each release on this engine connection."""
    for name, columns in releases.items():
        select = exp.select(*(exp.column(c, quoted=True) for c in columns)).from_(
            exp.table_(exp.to_identifier(name, quoted=True), db=OUTPUT_SCHEMA)
        )
        view = exp.to_identifier(name, quoted=True).sql("duckdb")
        con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS {duckdb_sql.to_sql(select)}")


def with_releases(policy: Policy, releases: Releases) -> Policy:
    """``policy`` with each available release as a public table of all its columns."""
    if not releases:
        return policy
    tables = dict(policy.tables)
    for name, columns in releases.items():
        declared = {c: Column(c, ColumnRole.DIMENSION) for c in columns}
        tables[name] = Table(
            name=name,
            kind=TableKind.PUBLIC,
            columns=MappingProxyType(declared),
            description=f"released output {OUTPUT_SCHEMA}.{name}",
        )
    return replace(policy, tables=MappingProxyType(tables))
