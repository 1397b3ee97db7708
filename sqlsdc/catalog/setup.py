"""Create the catalog and apply a policy to a database (``sqlsdc init`` / ``policy apply``).

Applying checks the policy against the database (every declared table and column exists, units
are never NULL), stores it as a new version, creates the PRF secret once, gives every row of every
confidential table a record key, and enforces the privacy unit with NOT NULL and, where units are
one per row, a unique index (which lets the guard count units with COUNT(*) instead of
COUNT(DISTINCT ...)).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlsdc.catalog import keys, store
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines.duckdb import one
from sqlsdc.errors import PolicyError
from sqlsdc.policy import Policy, load_policy


def unit_index_name(table: str) -> str:
    return f"__sqlsdc_unit_{table}"


@dataclass
class ApplyReport:
    version: int
    keyed_rows: dict[str, int] = field(default_factory=dict)
    unit_per_row: dict[str, bool] = field(default_factory=dict)
    secret_created: bool = False


def database_problems(con, policy: Policy) -> list[str]:
    """Problems of ``policy`` against the tables actually in the database."""
    schemas = engine.table_schemas(con)
    tables = engine.base_tables(con)
    problems = []
    for table in policy.tables.values():
        where = f"tables.{table.name}"
        if table.name not in schemas:
            known = ", ".join(sorted(schemas)) or "none"
            problems.append(f"{where}: no such table in the database (tables: {known})")
            continue
        if not table.is_public and table.name not in tables:
            problems.append(f"{where}: a confidential relation must be a table, not a view")
        for column in table.columns:
            if column not in schemas[table.name]:
                cols = ", ".join(c for c in schemas[table.name] if not c.startswith("__"))
                problems.append(
                    f"{where}.columns.{column}: no such column in the table (columns: {cols})"
                )
        unit = table.privacy_unit
        if unit and unit in schemas[table.name]:
            (nulls,) = one(con, f'SELECT count(*) FROM "{table.name}" WHERE "{unit}" IS NULL')
            if nulls:
                problems.append(
                    f"{where}.privacy_unit: {nulls} rows have no {unit}; every row must belong "
                    "to a unit"
                )
    return problems


def apply_policy(con, policy: Policy, applied_by: str) -> ApplyReport:
    """Apply ``policy`` inside one transaction; raises PolicyError naming every problem."""
    problems = [f"{policy.source}: {p}" for p in database_problems(con, policy)]
    if problems:
        raise PolicyError(problems)
    con.execute("BEGIN TRANSACTION")
    try:
        store.ensure_catalog(con)
        created = store.ensure_secret(con)
        report = ApplyReport(version=0, secret_created=created)
        for table in policy.confidential_tables:
            report.keyed_rows[table.name] = keys.materialise_record_keys(con, table.name)
            report.unit_per_row[table.name] = _enforce_unit(con, table.name, table.privacy_unit)
        report.version = store.store_policy(con, dict(policy.document), policy.source, applied_by)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return report


def _enforce_unit(con, table: str, unit: str) -> bool:
    """NOT NULL on the unit column; a unique index when each row is its own unit."""
    nullable = one(
        con,
        "SELECT is_nullable FROM information_schema.columns WHERE table_schema = 'main' "
        "AND table_catalog = current_database() AND lower(table_name) = ? "
        "AND lower(column_name) = ?",
        [table, unit],
    )
    if nullable and nullable[0] == "YES":
        con.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{unit}" SET NOT NULL')
    index = unit_index_name(table)
    exists = one(
        con,
        "SELECT 1 FROM duckdb_indexes() WHERE database_name = current_database() "
        "AND index_name = ?",
        [index],
    )
    if exists:
        return True
    total, distinct = one(con, f'SELECT count(*), count(DISTINCT "{unit}") FROM "{table}"')
    if total != distinct:
        return False
    con.execute(f'CREATE UNIQUE INDEX "{index}" ON "{table}" ("{unit}")')
    return True


def init(db_path, policy, *, applied_by: str = "admin") -> ApplyReport:
    """Create or upgrade the catalog of ``db_path`` and apply ``policy`` (path, text or dict).

    Example:
        >>> import sqlsdc, duckdb, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "x.duckdb")
        >>> duckdb.connect(path).execute("CREATE TABLE t AS SELECT 1 AS id, 'a' AS g").close()
        >>> sqlsdc.init(path, {"tables": {"t": {"privacy_unit": "id", "columns": {
        ...     "id": {"role": "identifier"}, "g": {"role": "dimension"}}}},
        ...     "users": {"root": {"role": "admin"}}}).version
        1
    """
    if not isinstance(policy, Policy):
        policy = load_policy(policy)
    con = engine.open_database(db_path)
    try:
        return apply_policy(con, policy, applied_by)
    finally:
        con.close()
