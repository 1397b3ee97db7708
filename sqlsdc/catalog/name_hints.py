"""What to tell an administrator whose policy names a table or column the database does not hold
under that name: where the database does hold tables (another schema), and which of its names a
policy cannot write (spaces, accents, a leading digit), with the DuckDB statement that fixes it.

A statistics office's own database is not shaped like the demo: tables in a schema of their own
(``stat."Enterprises"``), names quoted with spaces (``"Unit ID"``). sqlsdc reads the ``main``
schema, and a policy names tables and columns as plain identifiers (letters, digits, ``_``); the
message said ``tables: none`` of a database holding two tables, and listed ``unit id`` as a
column the policy could not name (new user s48e).
"""

from __future__ import annotations

import re
import unicodedata

from sqlsdc.catalog.schema import CATALOG_SCHEMA

PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
"""A name a policy can write (``schemas/policy.schema.json``, ``$defs.name``)."""

_OURS = {CATALOG_SCHEMA, "protected", "synthetic"}  # the catalog and the jobs' outputs


def quoted(name: str) -> str:
    """``name`` as DuckDB reads it back: bare when plain, else in double quotes."""
    return name if PLAIN.fullmatch(name) else '"' + name.replace('"', '""') + '"'


def plain(name: str) -> str:
    """A plain name for ``name``: lower case, runs of other characters as one ``_``."""
    ascii_ = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    text = re.sub(r"[^a-z0-9]+", "_", ascii_.lower()).strip("_")
    return text if text[:1].isalpha() else f"t_{text}"


def main_tables(con) -> list[str]:
    """The user's tables and views of ``main``, as spelt."""
    rows = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' UNION ALL SELECT view_name FROM duckdb_views() "
        "WHERE database_name = current_database() AND schema_name = 'main' AND NOT internal"
    ).fetchall()
    return [r[0] for r in rows]


def main_columns(con, table: str) -> list[str]:
    """The columns of ``main``'s table ``table`` (any case), as spelt, without sqlsdc's own."""
    rows = con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND lower(table_name) = ? ORDER BY column_index",
        [table.lower()],
    ).fetchall()
    return [r[0] for r in rows if not r[0].startswith("__")]


def elsewhere(con) -> list[tuple[str, str]]:
    """``(schema, table)`` of the user's tables and views outside ``main``, as spelt."""
    rows = con.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() "
        "WHERE database_name = current_database() AND schema_name <> 'main' "
        "UNION ALL SELECT schema_name, view_name FROM duckdb_views() "
        "WHERE database_name = current_database() AND schema_name <> 'main' AND NOT internal "
        "ORDER BY 1, 2"
    ).fetchall()
    return [(s, t) for s, t in rows if s not in _OURS]


def missing_table(con, name: str, main: list[str]) -> str:
    """Why ``name`` is not found, and what to do, given the spelt names of ``main``'s tables."""
    other = elsewhere(con)
    known = ", ".join(quoted(t) for t in sorted(main, key=str.lower)) or (
        "none" if other else
        "none; load the data first, e.g. with DuckDB: CREATE TABLE t AS FROM 'file.csv'"
    )  # fmt: skip
    text = f"no such table in the database (tables: {known})"
    text += _renaming("tables", main, lambda t: f"ALTER TABLE {quoted(t)} RENAME TO {plain(t)}")
    if other:
        listed = ", ".join(f"{quoted(s)}.{quoted(t)}" for s, t in other[:5])
        more = f" and {len(other) - 5} more" if len(other) > 5 else ""
        s, t = next(((s, t) for s, t in other if t.lower() == name), other[0])
        text += (
            f"; sqlsdc reads the main schema only, and the database has {listed}{more}: copy "
            f"a table there, e.g. CREATE TABLE {plain(t)} AS FROM {quoted(s)}.{quoted(t)}"
        )
    return text


def missing_column(table: str, columns: list[str]) -> str:
    """Why a declared column of ``table`` is not found, given the table's spelt columns."""
    text = f"no such column in the table (columns: {', '.join(quoted(c) for c in columns)})"
    return text + _renaming(
        "columns", columns, lambda c: f"ALTER TABLE {table} RENAME COLUMN {quoted(c)} TO {plain(c)}"
    )


def _renaming(kind: str, names: list[str], statement) -> str:
    """The hint for the first of ``names`` a policy cannot write, with ``statement(name)``
    renaming it; empty when a policy can write them all."""
    unwritable = [n for n in names if not PLAIN.fullmatch(n)]
    if not unwritable:
        return ""
    first = unwritable[0]
    return (
        f"; a policy names {kind} with letters, digits and _ only: rename {quoted(first)}, "
        f"e.g. {statement(first)}"
    )
