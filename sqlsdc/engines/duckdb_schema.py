"""What a DuckDB database holds, as sqlsdc reads it: the tables and views of a schema with their
columns and types, a table's data version (the fingerprint DP cells are named by), and the tables
a statement reads by DuckDB's own parser.
"""

from __future__ import annotations

import re

import duckdb

from sqlsdc.engines.duckdb import one


def table_schemas(
    con: duckdb.DuckDBPyConnection, schema: str = "main"
) -> dict[str, dict[str, str]]:
    """``{table: {column: type}}`` of the user tables and views in ``schema``."""
    rows = con.execute(
        "SELECT lower(table_name), lower(column_name), data_type FROM information_schema.columns "
        "WHERE table_catalog = current_database() AND table_schema = ? "
        "ORDER BY table_name, ordinal_position",
        [schema],
    ).fetchall()
    schemas: dict[str, dict[str, str]] = {}
    for table, column, dtype in rows:
        schemas.setdefault(table, {})[column] = dtype
    return schemas


_ENUM = re.compile(r"ENUM\((?:\s*'(?:[^']|'')*'\s*,?)*\)", re.IGNORECASE)


def shown_type(dtype: str) -> str:
    """``dtype`` as a user who may not read the data sees it: every ENUM (alone or inside a
    LIST/STRUCT/MAP) as VARCHAR. An ENUM's labels are values of the data, often built from
    its distinct values: a category no row has, or one a protection hides (a DP group below
    the selection threshold, a suppressed cell), would be listed (red team s47g)."""
    return _ENUM.sub("VARCHAR", dtype)


def described(
    con: duckdb.DuckDBPyConnection, tables: list[str], schema: str = "main"
) -> dict[str, list[tuple[str, str, str | None]]]:
    """``{table: [(column, type, key), ...]}`` of the named tables or views of ``schema`` in
    the connection's database (``DESCRIBE``: types as ``table_schemas`` spells them; key
    ``PRI`` or ``UNI`` on a column of a primary key or unique constraint, single-column or
    not); a table that does not exist is left out.

    Unlike the listings of the engine's catalog (``duckdb_tables()``, ``duckdb_columns()``,
    ``information_schema``), which build and bind every system view of a newly opened
    database first, 7-13 ms apiece, a description reads the named table alone (0.3 ms). Only
    outside a transaction: a table that does not exist fails the statement, and a failed
    statement aborts the transaction it is in.
    """
    (database,) = one(con, "SELECT current_database()")
    found = {}
    for table in tables:
        name = ".".join(f'"{_quoted(part)}"' for part in (database, schema, table))
        try:
            rows = con.execute(f"DESCRIBE {name}").fetchall()
        except duckdb.CatalogException:
            continue
        found[table] = [(column, dtype, key) for column, dtype, _null, key, *_ in rows]
    return found


def table_columns(con: duckdb.DuckDBPyConnection, schema: str, table: str) -> list[str]:
    """Column names of ``schema.table`` in order (empty when it does not exist)."""
    rows = con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() "
        "AND schema_name = ? AND table_name = ? ORDER BY column_index",
        [schema, table],
    ).fetchall()
    return [r[0] for r in rows]


def base_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    """Names of real tables (not views) in the main schema."""
    rows = con.execute(
        "SELECT lower(table_name) FROM duckdb_tables() "
        "WHERE database_name = current_database() AND schema_name = 'main'"
    ).fetchall()
    return {r[0] for r in rows}


def data_version(con: duckdb.DuckDBPyConnection, table: str) -> str:
    """A fingerprint of a table's rows: their count, and the XOR and the sum of their hashes.
    DP cells are named by it, so changed data gets fresh noise, never the old noise over a new
    exact value. The sum keeps what the XOR alone loses: two equal rows cancel in an XOR, so
    a pair of duplicates replaced by another pair would keep the version.

    DuckDB hashes values that compare equal alike, but some of them are told apart by
    functions an analyst may call: ``-0.0`` and ``0.0`` (``1 / x``, ``CAST(x AS VARCHAR)``),
    the NaNs of either sign, ``INTERVAL '1 month'`` and ``'30 days'`` (``date_part``). A
    column of such a type is hashed again by what tells them apart (:func:`_distinguishing`):
    a row changed from one to the other changes the version. Tables without such a column
    keep the fingerprint of their rows alone.

    The row is read by the table's name, unless a column has that name (``hash("visits")``
    of a table with a column ``visits`` hashed that column alone, and an update of any other
    kept the version): then by that name with underscores before it, one that no column has
    (a row's hash does not depend on the name it is read by)."""
    columns = [
        (d[0], str(d[1])) for d in con.execute(f'SELECT * FROM "{table}" LIMIT 0').description
    ]
    names = {name.lower() for name, _kind in columns}
    row = table
    while row.lower() in names:
        row = "_" + row
    texts = "".join(
        f", {text}"
        for name, kind in columns
        if (text := _distinguishing(f'"{row}"."{_quoted(name)}"', kind)) is not None
    )
    rows, xor, total = one(
        con,
        f'SELECT count(*), bit_xor(hash("{row}"{texts})), sum(hash("{row}"{texts})) '
        f'FROM "{table}" AS "{row}"',
    )
    return f"{rows}:{xor}:{total or 0}"


_EQUAL_BUT_DISTINCT = ("FLOAT", "DOUBLE", "REAL", "INTERVAL")
"""Types with values that DuckDB hashes alike and functions tell apart (:func:`data_version`)."""


def _distinguishing(column: str, kind: str) -> str | None:
    """What :func:`data_version` hashes besides the row for a column of type ``kind``: the
    sign bit of a plain float (the zeros and the NaNs that are hashed alike differ by it
    alone; formatting every float as text made the version of a table of doubles eight times
    slower), the text of an interval or of a nested value holding either; None for other
    types."""
    kind = kind.upper()
    if kind in ("FLOAT", "DOUBLE", "REAL"):
        return f"signbit({column})"
    if any(t in kind for t in _EQUAL_BUT_DISTINCT):
        return f"CAST({column} AS VARCHAR)"
    return None


def _quoted(name: str) -> str:
    return name.replace('"', '""')


def tables_read_by(con: duckdb.DuckDBPyConnection, sql: str) -> set[str]:
    """The tables DuckDB's own parser says a statement reads (defence in depth). It reads no
    data, but binds constants: ``x BETWEEN '3' AND 5`` raises a
    :data:`~sqlsdc.engines.duckdb.TextRefusal` ("Cannot
    mix values of type VARCHAR and INTEGER_LITERAL"), though running the statement binds it."""
    return {name.split(".")[-1].lower() for name in con.get_table_names(sql, qualified=False)}
