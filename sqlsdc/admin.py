"""Administrative operations behind the CLI: applying policies, reading the catalog.

Admin operations open the database directly (whoever can open the file administers it) and
check that the acting user has the admin role in the policy in force, so that the audit trail
names a real administrator.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sqlsdc.catalog import keys, setup, store
from sqlsdc.catalog.setup import ApplyReport, PolicyCheck, apply_policy
from sqlsdc.catalog.store import require_admin
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines import duckdb_schema
from sqlsdc.errors import Error, NotFoundError
from sqlsdc.mechanisms.ckm import utility_risk
from sqlsdc.policy import Policy, load_policy

if TYPE_CHECKING:
    import pandas as pd


def policy_checks() -> tuple[PolicyCheck, ...]:
    """What a policy may not release next to the outputs stored, checked before it is applied:
    a suppression universe of dimensions the pattern cannot code (an ENUM), a suppression
    pattern it switches on next to the exact tables and files stored (red team s38e: the
    pattern's cell less a stored file's gave 90 groups of 1-4 persons), two anonymised files
    its ``releases:`` lists that differ by a few units in a cell, and new keyed noise (ptable,
    rounding) for cells released under the old with the same keys."""
    from sqlsdc.catalog.keyed_changes import refuse_keyed_changes
    from sqlsdc.jobs.file_pairs import refuse_listed_files
    from sqlsdc.jobs.patterns import refuse_uncoded_types
    from sqlsdc.jobs.refusals import refuse_pattern_differences

    return (
        refuse_uncoded_types,
        refuse_pattern_differences,
        refuse_listed_files,
        refuse_keyed_changes,
    )


def admins(db: str | Path, *, policy: Policy | str | Path | None = None, con=None) -> list[str]:
    """The admins of the policy in force in ``db``: whom an admin command may act as (the CLI's
    ``--as``, by default the only one). A database without the catalog yet (``init``) has
    those of ``policy``, the policy about to be applied; without it, that is not-found.
    ``con``: a connection to ``db`` already open, read instead of opening another."""
    current = None
    if con is not None or Path(db).is_file():
        with _opened(db, con, read_only=True) as con:
            current = store.current_policy(con)
            if current is None and policy is None:
                raise store.no_catalog(db, con)
    elif policy is None:
        raise NotFoundError(f"database {db} does not exist")
    if current is not None:
        policy = load_policy(current[1], name=current[2])
    elif not isinstance(policy, Policy):
        policy = load_policy(policy)
    return store.admin_names(policy)


@contextmanager
def _opened(db: str | Path, con=None, *, read_only: bool) -> Iterator:
    """``con`` if given (its opener closes it), else a connection to ``db`` (read-only or
    read-write) closed on leaving: the CLI opens the database once, to find the acting admin
    and to answer or write."""
    if con is not None:
        yield con
        return
    con = engine.open_database(db, read_only=read_only)
    try:
        yield con
    finally:
        con.close()


def init(db_path, policy, *, applied_by: str | None = None) -> ApplyReport:
    """Create or upgrade the catalog of ``db_path`` and apply ``policy`` (path, text or dict),
    checked against the outputs already stored (:func:`policy_checks`).

    Only an admin applies a policy: ``applied_by`` must have role admin in the policy in force
    when the database has one, else in the new ``policy``, so that the version history always
    names a real administrator. By default it is that policy's only admin, as the CLI's
    ``--as``; with several, leaving it out raises :class:`~sqlsdc.errors.AccessDenied` naming
    them.

    Example:
        >>> import sqlsdc, duckdb, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "x.duckdb")
        >>> duckdb.connect(path).execute("CREATE TABLE t AS SELECT 1 AS id, 'a' AS g").close()
        >>> sqlsdc.init(path, {"tables": {"t": {"privacy_unit": "id", "columns": {
        ...     "id": {"role": "identifier"}, "g": {"role": "dimension"}}}},
        ...     "users": {"root": {"role": "admin"}}}).version
        1
    """
    return setup.init(db_path, policy, checks=policy_checks(), applied_by=applied_by)


def apply(db: str | Path, policy: Policy | str | Path, user: str, *, con=None) -> ApplyReport:
    """Apply a new policy version as ``user`` (who must be admin in the policy in force).
    ``con``: a read-write connection to ``db`` already open, written instead of opening
    another (its opener closes it)."""
    if not isinstance(policy, Policy):
        policy = load_policy(policy)
    with _opened(db, con, read_only=False) as con:
        require_admin(con, user)
        return apply_policy(con, policy, applied_by=user, checks=policy_checks())


def show(db: str | Path) -> tuple[int, dict, list[tuple]]:
    """The policy in force (version, document) and the history of applied versions."""
    con = engine.open_database(db, read_only=True)
    try:
        current = store.current_policy(con)
        if current is None:
            raise store.no_catalog(db, con)
        return current[0], current[1], store.policy_history(con)
    finally:
        con.close()


def audit(
    db: str | Path,
    user: str,
    *,
    who: str | None = None,
    decision: str | None = None,
    limit: int = 50,
    since: datetime | None = None,
    until: datetime | None = None,
    con=None,
) -> pd.DataFrame:
    """Audit entries, newest first in the order they were logged (read by an admin);
    ``since``/``until``: logged from (included) and before (excluded), in UTC.

    Columns: :data:`~sqlsdc.catalog.store.AUDIT_COLUMNS` and what the budget ledger charged
    each entry's query id (:data:`CHARGE_COLUMNS`: ε, ρ and δ as exact text, None where
    nothing was charged); ``con``: a connection to ``db`` already open (:func:`_opened`)."""
    with _opened(db, con, read_only=True) as con:
        require_admin(con, user)
        entries = store.audit_entries(
            con, user=who, decision=decision, limit=limit, since=since, until=until
        )
        return _with_charges(con, entries, store.AUDIT_COLUMNS)


CELL_LIMIT_COLUMNS = ("user_name", "table_name", "per", "cells", "granted", "used", "left",
                      "period_start", "resets_at", "ended")  # fmt: skip


def cell_limit_usage(db: str | Path, user: str, *, who: str | None = None,
                     con=None) -> pd.DataFrame:  # fmt: skip
    """What each user (``who``: one) used of the policy's cell limits in their current
    periods (read by an admin; :mod:`sqlsdc.catalog.cell_limits`): one row per limit and user
    it names (a limit of all users, ``*``, once, counting the distinct cells of everyone), with
    the cells an admin granted for the period (``sqlsdc budget DB cells grant``; the use
    counted from an admin's reset), and ``ended`` true where a refused query ended the user's
    period."""
    import pandas as pd

    from sqlsdc.catalog import cell_limits

    with _opened(db, con, read_only=True) as con:
        current = require_admin(con, user)
        policy = load_policy(current[1], name=current[2])
        names = [who] if who is not None else list(policy.users)
        rows, seen = [], set()
        present = duckdb_schema.table_columns(con, store.S, cell_limits.TABLE)
        for name in names:
            usage = cell_limits.usage(con, policy, name, store.now()) if present else []
            for u in usage:
                shown = u.limit.user if u.limit.user == "*" else name
                key = (shown, u.limit.table, u.limit.per, u.ended if shown != "*" else None)
                if shown == "*" and key in seen:
                    continue
                seen.add(key)
                left = max(u.limit.cells + u.granted - u.used, 0) if not u.ended else 0
                rows.append((shown, u.limit.table, u.limit.per, u.limit.cells, u.granted,
                             u.used, left, u.start, u.resets,
                             u.ended if shown != "*" else None))  # fmt: skip
        return pd.DataFrame(rows, columns=list(CELL_LIMIT_COLUMNS))


CHARGE_COLUMNS = ("epsilon", "rho", "delta")  # the budget an audit entry's query was charged
OUTPUT_COLUMNS = ("name", "method", "created_at", "created_by", "policy_version", "query_id",
                  "sql_text")  # fmt: skip


def outputs(db: str | Path, user: str, *, con=None) -> pd.DataFrame:
    """The outputs of protection, anonymisation and synthesis jobs registered in ``db``
    (``sqlsdc.outputs``), oldest first (read by an admin): name, method, when, by whom, under
    which policy version, the query id of the job's audit entry (None for outputs stored
    before jobs had one) and what the ledger charged it (:data:`CHARGE_COLUMNS`); ``con``: a
    connection to ``db`` already open (:func:`_opened`)."""
    with _opened(db, con, read_only=True) as con:
        require_admin(con, user)
        kept = duckdb_schema.table_columns(con, store.S, "outputs")  # no query_id in older catalogs
        columns = [c if c in kept else f"NULL AS {c}" for c in OUTPUT_COLUMNS]
        rows = con.execute(
            f"SELECT {', '.join(columns)} FROM {store.S}.outputs ORDER BY created_at, name"
        ).fetchall()
        entries = [dict(zip(OUTPUT_COLUMNS, row, strict=True)) for row in rows]
        return _with_charges(con, entries, OUTPUT_COLUMNS)


def _with_charges(con, entries: list[dict], columns) -> pd.DataFrame:
    """``entries`` with the ε, ρ and δ the ledger charged their query ids (exact text; None
    where nothing was charged), as a frame of ``columns`` and :data:`CHARGE_COLUMNS`."""
    import pandas as pd

    from sqlsdc.catalog.budget_admin import charged_by_query
    from sqlsdc.mechanisms.accountant import exact_text

    ids = [e["query_id"] for e in entries if e["query_id"] is not None]
    charged = charged_by_query(con, ids)
    for entry in entries:
        cost = charged.get(entry["query_id"])
        for kind in CHARGE_COLUMNS:
            entry[kind] = None if cost is None else exact_text(getattr(cost, kind))
    return pd.DataFrame(entries, columns=[*columns, *CHARGE_COLUMNS])


def rekey(
    db: str | Path, user: str, *, tables: list[str] | None = None, con=None
) -> dict[str, int]:
    """Give every unit of the confidential ``tables`` (default: all) a new record key.

    This changes the CKM noise of every cell, so values published before and after no longer
    match (and could be compared by a user who saw both): do it only when keys may have
    leaked. Every re-keying is recorded in ``sqlsdc.key_events``, and the cells released from
    the tables count as new against the policy's cell limits when asked again (each answer is a
    new draw). Returns rows re-keyed per table.
    ``con``: a read-write connection to ``db`` already open (its opener closes it).
    """
    from sqlsdc.catalog import cell_limits

    with _opened(db, con, read_only=False) as con:
        current = require_admin(con, user)
        policy = load_policy(current[1], name=current[2])
        names = tables or [t.name for t in policy.confidential_tables]
        public = [n for n in names if policy.declared(n).is_public]
        if public:
            raise Error(f"not a confidential table of the policy: {', '.join(public)} (public "
                        "tables have no record keys)")  # fmt: skip
        con.execute("BEGIN TRANSACTION")
        try:
            report = {}
            limited = duckdb_schema.table_columns(con, store.S, cell_limits.TABLE)
            for name in names:
                table = policy.table(name)
                report[table.name] = keys.rekey(con, table.name, table.privacy_unit)
                store.record_key_event(con, table.name, "rekeyed", report[table.name], user)
                if limited:  # every value asked again is a new draw: its cells are new too
                    cell_limits.retire_cells(con, table.name)
            con.execute("COMMIT")
        except BaseException:
            engine.rollback(con)
            raise
        return report


def ckm_measures(
    db: str | Path, user: str, sql: str, *, count: str, value: str | None = None
) -> dict[str, float]:
    """Utility and risk of the protected answer to ``sql`` against the original (admins only).

    ``count`` names the result column holding the cell counts and ``value`` an optional
    magnitude column; cells are matched on the key columns. See
    :func:`sqlsdc.mechanisms.ckm.utility_risk` for the measures (Geyer et al., PSD 2022).
    """
    from sqlsdc.guard.connection import connect

    with connect(db, user) as guarded:
        cursor = guarded.execute(sql)
        protected = cursor.df()
        keys = [c.name for c in cursor.explain().columns if not c.released]
    missing = [c for c in (count, value) if c and c not in protected.columns]
    if missing:  # before the unprotected query runs
        raise Error(f"no result column {', '.join(missing)}; its columns: "
                    f"{', '.join(map(str, protected.columns))}")  # fmt: skip
    grouped = [c for c in (count, value) if c in keys]
    if grouped:  # a key has no protected value to compare: say so, not a KeyError
        values = [str(c) for c in protected.columns if c not in keys]
        raise Error(f"{', '.join(grouped)} is a group key, not a protected value; name an "
                    f"aggregate column: {', '.join(values) or 'none'}")  # fmt: skip
    con = engine.open_database(db)
    try:
        require_admin(con, user)
        original = con.sql(sql).df()
    finally:
        con.close()
    # the same select list, named as the guard names it: DuckDB names a bare column as the
    # table spells it (NACE_Division), the guard as the query does (nace_division), and the
    # merge on the guard's names failed with a KeyError on a user's own mixed-case columns
    # (new user s48e)
    if len(original.columns) == len(protected.columns):
        original.columns = list(protected.columns)
    merged = original.merge(protected, on=keys, how="outer", suffixes=("", "_protected"))
    merged = merged.fillna({c: 0 for c in merged.columns if c not in keys})
    return utility_risk(
        merged[count],
        merged[f"{count}_protected"],
        None if value is None else merged[value],
        None if value is None else merged[f"{value}_protected"],
    )
