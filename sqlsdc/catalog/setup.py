"""Create the catalog and apply a policy to a database (``sqlsdc init`` / ``policy apply``).

Applying checks the policy against the database (every declared table and column exists, units
are never NULL), stores it as a new version, creates the PRF secret once, gives every row of every
confidential table a record key, and enforces the privacy unit with NOT NULL and, where units are
one per row, a unique index (which lets the guard count units with COUNT(*) instead of
COUNT(DISTINCT ...)).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from sqlsdc.catalog import budget, keys, name_hints, ptables, store
from sqlsdc.catalog.class_notes import class_notes
from sqlsdc.catalog.domain_notes import unlisted_nulls
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines import duckdb_schema, file_lock
from sqlsdc.engines.duckdb import one
from sqlsdc.errors import AccessDenied, PolicyError
from sqlsdc.policy import AggregateKind, ColumnRole, Method, Policy, UserRole, load_policy
from sqlsdc.policy.read import located

UNIT_INDEX_PREFIX = "__sqlsdc_unit_"
KEY_INDEX_PREFIX = "__sqlsdc_key_"


def unit_index_name(table: str, unit: str) -> str:
    """The unique index that proves one row per unit (its existence enables COUNT(*))."""
    return f"{UNIT_INDEX_PREFIX}{table}__{unit}"


@dataclass
class ApplyReport:
    version: int
    keyed_rows: dict[str, int] = field(default_factory=dict)
    unit_per_row: dict[str, bool] = field(default_factory=dict)
    secret_created: bool = False
    notes: list[str] = field(default_factory=list)  # what analysts will not be able to do


_NUMERIC = re.compile(r"U?(TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT)|FLOAT|REAL|DOUBLE|DECIMAL.*")


def _measure_type_problem(dtype: str) -> str | None:
    """What a measure's column type must be instead, or None: a text (or date, list...)
    measure cannot be summed, so SUM and AVG of it would be refused in every query. (HUGEINT
    and wide DECIMAL measures are summed cast to DOUBLE; the guard refuses their plain sums.)"""
    if not _NUMERIC.fullmatch(dtype):
        return "a numeric column (declare it a dimension, or store it as a number)"
    return None


_WIDE = re.compile(r"U?HUGEINT|DECIMAL\((19|[2-9]\d|\d{3,}),\s*\d+\)")


def _wide_measures(con, policy: Policy) -> list[str]:
    """Measures whose SUM and AVG the guard refuses (HUGEINT, DECIMAL over 18 digits: their
    sums can overflow for some values only, ``sqlsdc.planner.totality.wide_exact``): told at
    apply time, not first by an analyst's refusal."""
    schemas = duckdb_schema.table_schemas(con)
    return [
        f"{table.name}.{column} is {schemas[table.name][column]}: SUM and AVG of it are refused "
        "(store it as DOUBLE, BIGINT or DECIMAL(18, s))"
        for table in policy.confidential_tables
        for column, spec in table.columns.items()
        if spec.role in (ColumnRole.MEASURE, ColumnRole.WEIGHT)
        and _WIDE.fullmatch(schemas.get(table.name, {}).get(column, ""))
    ]


def _suppressed_means(con, policy: Policy) -> list[str]:
    """Measures whose AVG a suppressed table never publishes: under ``method: suppress`` an AVG
    is published only when every unit of the table has a value (``rewrite.suppress``: whether
    a cell's units all have one would be told otherwise), so one missing value anywhere makes
    every AVG of the measure NULL. Told at apply time: the demo has no missing values, and a
    new user's export shares with 10 % missing got NULL means in every cell (new user s38)."""
    notes = []
    for table in policy.confidential_tables:
        if table.suppression is None or table.rule(AggregateKind.MAGNITUDES).method is not (
            Method.SUPPRESS
        ):
            continue
        unit = table.privacy_unit
        for column, spec in table.columns.items():
            if spec.role not in (ColumnRole.MEASURE, ColumnRole.WEIGHT):
                continue
            units, valued = one(
                con,
                f'SELECT count(DISTINCT "{unit}"), count(DISTINCT "{unit}") FILTER '
                f'(WHERE "{column}" IS NOT NULL) FROM "{table.name}"',
            )
            if valued < units:
                notes.append(
                    f"{table.name}.{column} has no value for {units - valued} of {units} units: "
                    "under suppression its AVG is published only when every unit has one, so "
                    "it is NULL in every cell (SUM and COUNT are published); fill the missing "
                    "values, or leave those units out, where means are wanted"
                )
    return notes


def _uncoded_dimensions(con, table, columns: dict) -> list[str]:
    """Dimensions of a table's suppression universe that hold NULLs: the pattern needs a code
    in every row, and every query of the table failed on it, first told by an analyst's
    failed query (exit 1) after init had applied the policy (new user s38)."""
    if table.suppression is None:
        return []
    problems = []
    for name in table.suppression.dimensions:
        for column in table.hierarchies.get(name, (name,)):
            if column not in columns:
                continue
            (nulls,) = one(con, f'SELECT count(*) FROM "{table.name}" WHERE "{column}" IS NULL')
            if nulls:
                problems.append(
                    f"tables.{table.name}.suppression.dimensions: {column} has no value in "
                    f"{nulls} rows; suppression needs a code in every row: recode them in the "
                    f"database, e.g. UPDATE {table.name} SET {column} = 'unknown' WHERE "
                    f"{column} IS NULL"
                )
    return problems


def _domain_problems(con, where: str, domain, dtype: str) -> list[str]:
    """Values of a declared domain that are not values of the column's type as they are: a
    text code declared for an INTEGER or DATE column (``R01``, and also ``'1'`` or
    ``'2020-01-01'``, which DuckDB casts), a fraction for an integer one, a number for a text
    column (YAML's ``[01, 02]`` are 1 and 2: new user s38). The DP release matches declared
    values to the engine's by value, so their cells would match no row: a DP table would
    release noise for them and leave the real groups out."""
    problems = []
    for value in domain:
        if value is None:
            continue
        if dtype == "VARCHAR" and not isinstance(value, str):
            if isinstance(value, bool):  # YAML 1.1: NO (Norway), yes, on, off
                why = "YAML reads NO, yes, on and off as true or false: quote such codes, 'NO'"
            elif isinstance(value, int | float):
                why = f"'{value}' (YAML reads 01 as the number 1, so '01' needs them too)"
            else:
                why = f"'{value}'"
            problems.append(
                f"{where}: {value!r} is not text, and the column holds text: write the codes "
                f"in quotes, {why}"
            )  # a number's group matched no text code: a DP table released noise around 0
            continue
        held = one(con, f"SELECT TRY_CAST(? AS {dtype})", [value])[0]
        if held is None or held != value:
            # the release matches declared values to the engine's by Python equality: text
            # that DuckDB casts ('1' for an INTEGER, '2020-01-01' for a DATE) matched no
            # group, and a DP count of every real group was noise around 0 (red team s41b)
            why = ""
            if isinstance(value, str) and isinstance(held, bool | int | float | Decimal):
                why = f" (it is text: write it unquoted, {str(held).lower()})"
            elif isinstance(value, str) and held is not None:  # dates, times, UUIDs...
                why = (" (a policy writes it as text, which no value of the column equals: "
                       "list the groups in a public table and join it, or store the column "
                       "as text)")  # fmt: skip
            problems.append(f"{where}: {value!r} is not a value of the column's type {dtype}{why}")
    return problems


def database_problems(con, policy: Policy) -> list[str]:
    """Problems of ``policy`` against the tables actually in the database."""
    schemas = duckdb_schema.table_schemas(con)
    tables = duckdb_schema.base_tables(con)
    problems = []
    for table in policy.tables.values():
        where = f"tables.{table.name}"
        if table.name not in schemas:
            main = name_hints.main_tables(con)
            problems.append(f"{where}: {name_hints.missing_table(con, table.name, main)}")
            continue
        if not table.is_public and table.name not in tables:
            problems.append(f"{where}: a confidential relation must be a table, not a view")
        for column, spec in table.columns.items():
            if column not in schemas[table.name]:
                cols = name_hints.main_columns(con, table.name)
                problems.append(
                    f"{where}.columns.{column}: {name_hints.missing_column(table.name, cols)}"
                )
            elif not table.is_public and spec.role in (ColumnRole.MEASURE, ColumnRole.WEIGHT):
                problem = _measure_type_problem(schemas[table.name][column])
                if problem:  # SUM and AVG of it would be refused in every query
                    problems.append(
                        f"{where}.columns.{column}: a {spec.role.value} must be {problem}; "
                        f"{column} is {schemas[table.name][column]}"
                    )
            if column in schemas[table.name] and spec.domain:
                problems += _domain_problems(
                    con, f"{where}.columns.{column}.domain", spec.domain,
                    schemas[table.name][column],
                )  # fmt: skip
        key = table.key
        if key and key not in schemas[table.name]:
            problems.append(f"{where}.key: no such column in the table")
        elif key:
            total, distinct = one(
                con, f'SELECT count(*), count(DISTINCT "{key}") FROM "{table.name}"'
            )
            if total != distinct:
                problems.append(
                    f"{where}.key: {key} is not unique ({total - distinct} rows repeat a value "
                    "or are NULL); a key must identify each row"
                )
            elif table.name not in tables:
                problems.append(f"{where}.key: a keyed public relation must be a table, not a view")
        problems += _uncoded_dimensions(con, table, schemas[table.name])
        unit = table.privacy_unit
        if unit and unit in schemas[table.name]:
            (nulls,) = one(con, f'SELECT count(*) FROM "{table.name}" WHERE "{unit}" IS NULL')
            if nulls:
                problems.append(
                    f"{where}.privacy_unit: {nulls} rows have no {unit}; every row must belong "
                    "to a unit"
                )
    return problems


PolicyCheck = Callable[[object, Policy], None]
"""A refusal of the layers above the catalog, run on the database before a policy is applied."""


def apply_policy(
    con, policy: Policy, applied_by: str, *, checks: Sequence[PolicyCheck]
) -> ApplyReport:
    """Apply ``policy`` inside one transaction; raises PolicyError naming every problem.

    ``checks`` run once the database's own problems are known and before anything is written:
    the jobs' refusals of what the policy would release next to the outputs stored
    (:func:`sqlsdc.admin.policy_checks`; the jobs build on the catalog, so the catalog takes
    them from its caller). A keyword without a default: no caller applies a policy without
    saying which checks it runs."""
    problems = [located(policy.source, p, policy.marks) for p in database_problems(con, policy)]
    if problems:
        raise PolicyError(problems)
    for check in checks:
        check(con, policy)
    con.execute("BEGIN TRANSACTION")
    try:
        store.ensure_catalog(con)
        created = store.ensure_secret(con)
        store.ensure_mix_keys(con)
        notes = [*_wide_measures(con, policy), *_suppressed_means(con, policy),
                 *class_notes(con, policy), *unlisted_nulls(con, policy)]  # fmt: skip
        report = ApplyReport(version=0, secret_created=created, notes=notes)
        for table in policy.confidential_tables:
            _drop_stale_unit_indexes(con, table.name, table.privacy_unit)
            with _indexes_set_aside(con, table.name, _needs_alter(con, table)):
                keyed = keys.materialise_record_keys(con, table.name, table.privacy_unit)
                report.keyed_rows[table.name] = keyed
                if keyed:
                    store.record_key_event(con, table.name, "generated", keyed, applied_by)
                _set_not_null(con, table.name, table.privacy_unit)
            report.unit_per_row[table.name] = _index_unit(con, table.name, table.privacy_unit)
        for table in policy.tables.values():
            if table.is_public and table.key:
                _index_key(con, table.name, table.key)
        ptables.ensure_ptables(con, policy)
        notes.extend(_same_policy_redraws(con, policy))
        report.version = store.store_policy(con, policy.document_dict(), policy.source, applied_by)
        budget.note_policy(con)
        con.execute("COMMIT")
    except BaseException:
        engine.rollback(con)
        raise
    return report


def _same_policy_redraws(con, policy: Policy) -> list[str]:
    """A note when ``policy`` is the one in force and some table is under differential
    privacy: the new version (stored all the same, as new rows may have been keyed) draws
    every DP cell afresh, so analysts pay again for cells asked before. Re-running ``init``
    or ``policy apply`` with nothing changed did this without a word (new user s39)."""
    current = store.current_policy(con)
    if current is None or current[1] != policy.document_dict():
        return []
    if not any(t.differentially_private for t in policy.confidential_tables):
        return []
    return [
        f"the policy is the same as version {current[0]}; differential-privacy noise is keyed "
        "by the policy version, so every DP cell asked again is drawn afresh and charged again"
    ]


def _indexes(con, table: str) -> list[tuple[str, str]]:
    return con.execute(
        "SELECT index_name, sql FROM duckdb_indexes() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND lower(table_name) = ?",
        [table],
    ).fetchall()


def _nullable(con, table: str, column: str) -> bool:
    row = one(
        con,
        "SELECT is_nullable FROM information_schema.columns WHERE table_schema = 'main' "
        "AND table_catalog = current_database() AND lower(table_name) = ? "
        "AND lower(column_name) = ?",
        [table, column],
    )
    return row is not None and row[0] == "YES"


def _needs_alter(con, table) -> bool:
    columns = {r[0].lower() for r in con.execute(f'DESCRIBE "{table.name}"').fetchall()}
    return keys.RKEY not in columns or _nullable(con, table.name, table.privacy_unit)


@contextmanager
def _indexes_set_aside(con, table: str, needed: bool):
    """DuckDB cannot alter a table that has indexes: drop them for the change, then rebuild
    the user's indexes (sqlsdc's own unit index is rebuilt by ``_index_unit``)."""
    if not needed:
        yield
        return
    saved = _indexes(con, table)
    for name, _sql in saved:
        con.execute(f'DROP INDEX "{name}"')
    yield
    for name, sql in saved:
        if not name.startswith(UNIT_INDEX_PREFIX):
            con.execute(sql)


def _set_not_null(con, table: str, unit: str) -> None:
    if _nullable(con, table, unit):
        con.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{unit}" SET NOT NULL')


def _drop_stale_unit_indexes(con, table: str, unit: str) -> None:
    for name, _sql in _indexes(con, table):
        if name.startswith(UNIT_INDEX_PREFIX) and name != unit_index_name(table, unit):
            con.execute(f'DROP INDEX "{name}"')


def _index_unit(con, table: str, unit: str) -> bool:
    """A unique index on the unit when each row is its own unit; True if there is one."""
    index = unit_index_name(table, unit)
    if any(name == index for name, _sql in _indexes(con, table)):
        return True
    total, distinct = one(con, f'SELECT count(*), count(DISTINCT "{unit}") FROM "{table}"')
    if total != distinct:
        return False
    con.execute(f'CREATE UNIQUE INDEX "{index}" ON "{table}" ("{unit}")')
    return True


def _index_key(con, table: str, key: str) -> None:
    """A unique index on a public table's key, so the engine keeps it unique from now on."""
    index = f"{KEY_INDEX_PREFIX}{table}__{key}"
    if not any(name == index for name, _sql in _indexes(con, table)):
        con.execute(f'CREATE UNIQUE INDEX "{index}" ON "{table}" ("{key}")')


def unique_columns(con, *, constraints: bool = True) -> dict[str, frozenset[str]]:
    """Columns of main tables that the engine keeps unique (single-column unique index,
    PRIMARY KEY or UNIQUE constraint), by lower-case table name; NULLs never join.
    ``constraints`` False: the caller knows no table of interest has a PRIMARY KEY or UNIQUE
    constraint (``DESCRIBE`` showed no key), and the engine's listing of constraints (which
    first builds every system view of a newly opened database, ~7 ms) is not read."""
    found: dict[str, set[str]] = {}
    rows = con.execute(
        "SELECT lower(table_name), expressions FROM duckdb_indexes() "
        "WHERE database_name = current_database() AND schema_name = 'main' AND is_unique"
    ).fetchall()
    for table, expressions in rows:
        column = expressions.strip("[]").strip().strip("'").strip('"')  # ['"name"'] for keywords
        if column and "," not in column and column.replace("_", "").isalnum():
            found.setdefault(table, set()).add(column.lower())
    rows = (
        con.execute(
            "SELECT lower(table_name), constraint_column_names FROM duckdb_constraints() "
            "WHERE database_name = current_database() AND schema_name = 'main' "
            "AND constraint_type IN ('PRIMARY KEY', 'UNIQUE')"
        ).fetchall()
        if constraints
        else []
    )
    for table, columns in rows:
        if len(columns) == 1:
            found.setdefault(table, set()).add(columns[0].lower())
    return {table: frozenset(columns) for table, columns in found.items()}


def init(
    db_path, policy, *, checks: Sequence[PolicyCheck], applied_by: str | None = None
) -> ApplyReport:
    """Create or upgrade the catalog of ``db_path`` and apply ``policy`` (path, text or dict),
    running ``checks`` as :func:`apply_policy` does (the public form: :func:`sqlsdc.init`).

    Only an admin applies a policy: ``applied_by`` must have role admin in the policy in force
    when the database has one, else in the new ``policy``, so that the version history always
    names a real administrator. By default it is that policy's only admin; with several, naming
    one is required (:func:`_acting_admin`, as the CLI's ``--as``)."""
    if not isinstance(policy, Policy):
        policy = load_policy(policy)
    created = not Path(db_path).exists()
    con = engine.open_database(db_path)
    try:
        current = store.current_policy(con)
        in_force = policy if current is None else load_policy(current[1], name=current[2])
        if applied_by is None:
            applied_by = _acting_admin(in_force)
        _require_admin(in_force, applied_by, new=current is None)
        return apply_policy(con, policy, applied_by, checks=checks)
    except BaseException:
        con.close()
        if created:  # a failed init leaves no empty database (nor its lock) behind
            _remove_new_database(Path(db_path))
        raise
    finally:
        con.close()


def _remove_new_database(path: Path) -> None:
    for leftover in (path, path.with_name(f"{path.name}.wal"), file_lock.lock_path(path)):
        leftover.unlink(missing_ok=True)


def _acting_admin(policy: Policy) -> str:
    """The only admin of ``policy``: whom ``init`` acts as when not told, as the CLI
    (``cli/admin.py`` ``acting_admin``) does; with several, ``applied_by=`` (``--as``) must
    name one, or the version history would name whichever admin the file lists first."""
    names = store.admin_names(policy)
    if len(names) == 1:
        return names[0]
    if not names:
        raise AccessDenied("the policy declares no admin: declare one under `users:` with role "
                           "admin")  # fmt: skip
    raise AccessDenied(
        f"the policy has {len(names)} admins ({', '.join(names)}): name the acting one with "
        f"applied_by= (sqlsdc.init(db, policy, applied_by={names[0]!r}); --as on the command "
        "line)"
    )


def _require_admin(policy: Policy, user: str, *, new: bool) -> None:
    declared = policy.user(user)
    if declared is None or declared.role is not UserRole.ADMIN:
        which = "the policy being applied to this new database" if new else "the policy in force"
        admins = ", ".join(store.admin_names(policy))
        raise AccessDenied(
            f"user {user!r} is not an admin in {which}; only an admin applies a policy "
            f"(admins: {admins}); name one with --as"
        )
