"""Reading and writing the ``sqlsdc`` catalog: policy versions, secrets, audit log and ledger.

All functions take a DuckDB connection owned by trusted sqlsdc code; none of them is reachable
from analyst SQL, which the guard confines to the tables declared in the policy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import lru_cache, partial

import pyarrow as pa
from sqlglot import exp

from sqlsdc.catalog import identity_text, refusal_rate
from sqlsdc.catalog.schema import CATALOG_SCHEMA, CATALOG_VERSION, CKM_MIX_DDL, DDL, DP_CELLS_DDL
from sqlsdc.engines.duckdb import EngineError, one, parsed, type_names
from sqlsdc.engines.duckdb_schema import described
from sqlsdc.errors import AccessDenied, Error, NotFoundError, PolicyViolation, interrupted_by_user
from sqlsdc.mechanisms.ckm import MixKeys
from sqlsdc.policy import UserRole, load_policy

S = CATALOG_SCHEMA
LEDGER_TABLE = "ledger"
RELEASE_VIEW = "__sqlsdc_release"
IDENTITY_COLUMN = "__sqlsdc_identity"  # of the ledger rows given as a parameter (ledger_insert)
SECRET_BYTES = 32
PATTERN_PREFIX = "suppressed__"


def pattern_table(table: str) -> exp.Table:
    """The catalog table holding a confidential table's protected suppression universe."""
    return exp.table_(f"{PATTERN_PREFIX}{table}", db=CATALOG_SCHEMA)


def no_catalog(db, con=None) -> NotFoundError:
    """The error for a DuckDB file without the sqlsdc catalog: no sqlsdc database was found
    at that path (the CLI's exit code 8). A release written by ``sqlsdc publish`` (``con``
    open on it) is named as one: the hint to initialise it sent users who had swapped the two
    files (``publish release.duckdb demo.duckdb``) to key their release as confidential data."""
    try:
        release = con is not None and one(
            con, "SELECT 1 FROM duckdb_tables() WHERE schema_name = 'main' AND "
            "table_name = 'release_contents'"
        ) is not None  # fmt: skip
    except EngineError:  # a failure to tell only loses the finer message
        release = False
    if release:
        return NotFoundError(f"{db} is a release database written by `sqlsdc publish` (protected "
                             "outputs, no catalog); name the confidential database")  # fmt: skip
    return NotFoundError(f"{db} has no sqlsdc catalog; run `sqlsdc init {db} --policy FILE`")


def admin_names(policy) -> list[str]:
    """The names of the admins a policy declares, in its order: whom ``--as`` may name, and
    the acting administrator by default when there is exactly one."""
    return [u.name for u in policy.users.values() if u.role is UserRole.ADMIN]


def require_admin(con, user: str) -> tuple[int, dict, str]:
    """``(version, document, source)`` of the policy in force, if ``user`` is an admin in it."""
    current = current_policy(con)
    if current is None:
        (path,) = one(con, "SELECT path FROM duckdb_databases() WHERE database_name = "
                      "current_database()")  # fmt: skip
        raise no_catalog(path, con)
    policy = load_policy(current[1], name=current[2])
    declared = policy.user(user)
    if declared is None or declared.role is not UserRole.ADMIN:
        admins = ", ".join(admin_names(policy))
        raise AccessDenied(
            f"user {user!r} is not an admin in the policy in force (admins: {admins}); "
            "name one with --as"
        )
    return current


def now() -> datetime:
    """The current time in UTC (stored as TIMESTAMP; all catalog times are UTC)."""
    return datetime.now(UTC).replace(tzinfo=None)


def has_catalog(con) -> bool:
    row = one(
        con,
        "SELECT 1 FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = ? AND table_name = 'policy_versions'",
        [S],
    )
    return row is not None


def ensure_catalog(con) -> None:
    """Create the catalog schema if needed, check its version and bring older layouts up to
    date.

    A ``CREATE ... IF NOT EXISTS`` of a table or sequence the catalog has is a no-op: one read
    of the catalog's tables and sequences skips those, and one of its columns serves the
    layout checks (every job and admin command opens the catalog: 13.5 ms of CPU before,
    ~4 ms on an up-to-date catalog; session 44)."""
    present = {name.lower() for (name,) in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = ? UNION ALL SELECT sequence_name FROM duckdb_sequences() WHERE "
        "database_name = current_database() AND schema_name = ?", [S, S]).fetchall()}  # fmt: skip
    for statement in DDL:
        if _created(statement) not in present:
            con.execute(statement)
    columns = set(con.execute(
        "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = "
        "current_database() AND schema_name = ?", [S]).fetchall())  # fmt: skip
    _key_dp_cells(con, columns)
    _add_delta_columns(con, columns)
    _allow_set_events(con)
    row = one(con, f"SELECT value FROM {S}.meta WHERE key = 'catalog_version'")
    if row is None:
        con.execute(f"INSERT INTO {S}.meta VALUES ('catalog_version', ?)", [str(CATALOG_VERSION)])
    elif int(row[0]) > CATALOG_VERSION:
        raise Error(
            f"this database has catalog version {row[0]}, newer than this sqlsdc "
            f"({CATALOG_VERSION}); upgrade sqlsdc"
        )


def dp_cell_entry(user: str, policy_version: int, cell_hash: str) -> bytes:
    """The key of a cached DP cell in ``dp_cells`` (the same as the SQL of :func:`_key_dp_cells`:
    ``cell_hash`` is hex and the version digits, so the text is unambiguous)."""
    return hashlib.sha256(f"{user}|{policy_version}|{cell_hash}".encode()).digest()


def _created(statement: str) -> str | None:
    """The table or sequence ``CREATE TABLE|SEQUENCE IF NOT EXISTS sqlsdc.<name>`` creates
    (lower-cased), None for any other statement (always run)."""
    words = statement.split(None, 6)
    if len(words) < 6 or words[1].upper() not in ("TABLE", "SEQUENCE") or words[2:5] != [
        "IF", "NOT", "EXISTS"
    ]:  # fmt: skip
        return None
    schema, _, name = words[5].partition(".")
    return name.split("(")[0].strip().lower() if schema == S and name else None


def _key_dp_cells(con, columns: set[tuple[str, str]]) -> None:
    """Catalogs made before ``dp_cells`` had its one-column key ``entry``: rebuild the table
    with the same rows (callers run :func:`ensure_catalog` in a transaction). ``columns``:
    the catalog's ``(table, column)`` pairs."""
    if ("dp_cells", "entry") in columns:
        return
    con.execute(f"ALTER TABLE {S}.dp_cells RENAME TO dp_cells_unkeyed")
    con.execute(DP_CELLS_DDL)
    con.execute(
        f"""INSERT INTO {S}.dp_cells SELECT unhex(sha256(user_name || '|' ||
        CAST(policy_version AS VARCHAR) || '|' || cell_hash)), user_name, policy_version,
        cell_hash, cell, column_name, statistic, value, query_id, released_at
        FROM {S}.dp_cells_unkeyed"""
    )
    con.execute(f"DROP TABLE {S}.dp_cells_unkeyed")


def _add_delta_columns(con, columns: set[tuple[str, str]]) -> None:
    """Catalogs made before delta was accounted: add the ledger's and the events' ``delta``
    column (earlier charges spent no delta: '0'; earlier events granted none: NULL); before job
    outputs were recorded: their ``query_id`` (NULL: no ledger rows). ``columns``: the
    catalog's ``(table, column)`` pairs."""
    for table, column in (
        ("budget_spend", "delta VARCHAR NOT NULL DEFAULT '0'"),
        ("budget_events", "delta VARCHAR"),
        ("outputs", "query_id BIGINT"),
    ):
        if (table, column.split()[0]) not in columns:
            con.execute(f"ALTER TABLE {S}.{table} ADD COLUMN {column}")


def _allow_set_events(con) -> None:
    """Catalogs made before ``budget set``: rebuild ``budget_events`` with the same rows, so its
    action check admits 'set' (DuckDB cannot alter a CHECK constraint)."""
    (check,) = one(
        con,
        "SELECT string_agg(expression, ' ') FROM duckdb_constraints() WHERE "
        "database_name = current_database() AND schema_name = ? AND "
        "table_name = 'budget_events' AND constraint_type = 'CHECK'",
        [S],
    )
    if check is None or "'set'" in check:
        return
    columns = [row[0] for row in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() "
        "AND schema_name = ? AND table_name = 'budget_events' ORDER BY column_index", [S]
    ).fetchall()]  # fmt: skip
    con.execute(f"ALTER TABLE {S}.budget_events RENAME TO budget_events_before_set")
    con.execute(next(d for d in DDL if f"{S}.budget_events (" in d))
    names = ", ".join(columns)
    con.execute(f"INSERT INTO {S}.budget_events ({names}) "
                f"SELECT {names} FROM {S}.budget_events_before_set")  # fmt: skip
    con.execute(f"DROP TABLE {S}.budget_events_before_set")


def ensure_secret(con, name: str = "prf") -> bool:
    """Create the named secret from the OS CSPRNG if absent; True if it was created."""
    if one(con, f"SELECT 1 FROM {S}.secrets WHERE name = ?", [name]):
        return False
    con.execute(
        f"INSERT INTO {S}.secrets VALUES (?, ?, ?)", [name, os.urandom(SECRET_BYTES), now()]
    )
    return True


def ensure_mix_keys(con) -> None:
    """Store the cell key method's statistic-key constants, derived from the PRF secret, if
    absent (``sqlsdc.mechanisms.ckm.MixKeys``): protected SQL reads them from the catalog, so
    they never appear in its text."""
    con.execute(CKM_MIX_DDL)
    if one(con, f"SELECT 1 FROM {S}.ckm_mix"):
        return
    row = one(con, f"SELECT material FROM {S}.secrets WHERE name = 'prf'")
    if row is None:
        return
    keys = MixKeys.from_secret(bytes(row[0]))
    con.execute(
        f"INSERT INTO {S}.ckm_mix VALUES (?, ?, ?, ?)",
        [keys.square, keys.scale, keys.shift, keys.final],
    )


def record_key_event(con, table: str, action: str, rows: int, by: str) -> None:
    """Note a record-key generation or re-keying (re-keying changes every CKM noise value)."""
    con.execute(
        f"INSERT INTO {S}.key_events VALUES (?, ?, ?, ?, ?)", [now(), by, table, action, rows]
    )


def record_output(
    con,
    name: str,
    method: str,
    sql: str,
    by: str,
    policy_version: int,
    report: str,
    query_id: int | None = None,
) -> None:
    """Register a protected output table (a back-end job's result), replacing an older one;
    ``query_id`` is the job's audit entry, under which the ledger holds the table's cells.
    ``output_versions`` keeps every version's definition (:mod:`sqlsdc.jobs.output_history`:
    the readers of a replaced output keep it)."""
    con.execute(f"DELETE FROM {S}.outputs WHERE name = ?", [name])
    con.execute(
        f"INSERT INTO {S}.output_versions (query_id, name, method, sql_text, report) "
        "VALUES (?, ?, ?, ?, ?)",
        [query_id, name, method, sql, report],
    )
    con.execute(
        f"INSERT INTO {S}.outputs (name, method, sql_text, created_at, created_by, "
        "policy_version, report, query_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [name, method, sql, now(), by, policy_version, report, query_id],
    )


def store_policy(con, document: dict, source: str, applied_by: str) -> int:
    """Append a policy version and return its number."""
    text = json.dumps(document, sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()
    (latest,) = one(con, f"SELECT coalesce(max(version), 0) FROM {S}.policy_versions")
    version = latest + 1
    con.execute(
        f"INSERT INTO {S}.policy_versions VALUES (?, ?, ?, ?, ?, ?)",
        [version, now(), applied_by, source, digest, text],
    )
    return version


def current_policy(con, *, in_transaction: bool = True) -> tuple[int, dict, str] | None:
    """``(version, document, source)`` of the policy in force, or None before init.

    ``in_transaction`` False (a connection just opened, in no transaction): whether the
    catalog exists is asked of the policy table itself rather than of the engine's listing of
    tables, which first builds every system view of a newly opened database (~7 ms of each
    opening of a guarded connection)."""
    exists = has_catalog(con) if in_transaction else bool(described(con, ["policy_versions"], S))
    if not exists:
        return None
    row = one(
        con,
        f"SELECT version, document, source FROM {S}.policy_versions ORDER BY version DESC LIMIT 1",
    )
    return None if row is None else (row[0], json.loads(row[1]), row[2])


def policy_history(con) -> list[tuple]:
    return con.execute(
        f"SELECT version, applied_at, applied_by, source, sha256 FROM {S}.policy_versions "
        "ORDER BY version"
    ).fetchall()


def next_query_id(con) -> int:
    return one(con, f"SELECT nextval('{S}.query_ids')")[0]


CHARGED_PENDING = (
    "charged; the process stopped before the outcome was recorded (killed, or it lost the "
    "database): nothing was returned"
)
"""The reason of the entry a budget charge writes with its ledger row, in the charge's
transaction (:func:`sqlsdc.catalog.budget.charge`): every charge has an audit entry, even
when the process is killed before the query ends. The query's outcome replaces it
(:func:`record_query`); one left in place is what a crash leaves."""


def has_outcome(con, query_id: int) -> bool:
    """Whether the audit log holds the outcome of ``query_id`` (an entry other than the one
    its charge left pending). A job, publication or query recorded as accepted just before a
    Ctrl-C or SIGTERM reached it must not get a second, "failed" outcome (the duplicate key
    ended as "a bug in sqlsdc"), and its caller tells the user it was recorded."""
    found = one(
        con,
        f"SELECT 1 FROM {S}.audit WHERE query_id = ? AND reason IS DISTINCT FROM ?",
        [query_id, CHARGED_PENDING],
    )
    return found is not None


# its result is the count of rows updated (0 or 1): a RETURNING clause costs DuckDB 0.2-0.3 ms
# of CPU more for the same answer (benchmarks/README.md, session 36)
_AUDIT_OUTCOME = (
    f"UPDATE {S}.audit SET logged_at = ?, policy_version = ?, decision = ?, reason = ?, "
    "fingerprint = coalesce(?, fingerprint), rows_returned = ? "
    "WHERE query_id = ? AND decision = 'failed' AND reason = ?"
)
# where nothing is recorded under the id yet; DuckDB's ON CONFLICT clauses cost 2-4 ms of CPU
# a statement against 0.7-1.4 ms for these two (benchmarks/README.md, session 35)
_AUDIT_INSERT = (
    f"INSERT INTO {S}.audit SELECT ?, ?, ?, ?, ?, ?, ?, ?, ? "
    f"WHERE NOT EXISTS (SELECT 1 FROM {S}.audit WHERE query_id = ?)"
)
_AUDIT_INSERT_NEW = f"INSERT INTO {S}.audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
_AUDIT_INSERT_DRAWING = (
    f"INSERT INTO {S}.audit VALUES (nextval('{S}.query_ids'), ?, ?, ?, ?, ?, ?, ?, ?) "
    "RETURNING query_id"
)


def record_query(
    con,
    query_id: int | None,
    user: str,
    policy_version: int | None,
    decision: str,
    sql: str,
    *,
    reason: str | None = None,
    fingerprint: str | None = None,
    rows: int | None = None,
    new_id: bool = False,
) -> int:
    """Append one entry to the audit log and return its query id; ``None`` draws the next id
    in the same statement (one round trip, and no commit of its own inside a transaction).

    The entry a budget charge left for ``query_id`` (:data:`CHARGED_PENDING`) is replaced by
    this outcome; an outcome recorded before stands (a later one under its id is dropped:
    see :func:`has_outcome`). ``new_id``: ``query_id`` was drawn from the sequence in the
    caller's open transaction (a charge's), so no entry can hold it: a plain INSERT, whose
    key makes the transaction fail should one all the same."""
    # undecodable bytes kept as lone surrogates are logged escaped: in the statement, and in
    # a reason that quotes what the analyst sent (a parameter's name)
    sql, reason = _escaped(sql), None if reason is None else _escaped(reason)
    if decision == "refused":
        sql = refused_text(sql)
        with refusal_rate.turn:  # the rate's count and this entry, one connection at a time
            values = [now(), user, policy_version, decision, reason, fingerprint, sql, rows]
            return _record(con, query_id, values, new_id)
    values = [now(), user, policy_version, decision, reason, fingerprint, sql, rows]
    return _record(con, query_id, values, new_id)


def pending_entry(user: str, policy_version: int | None, sql: str, fingerprint: str | None):
    """The row (``logged_at`` ... ``rows_returned``) of a charge's pending audit entry, as
    :func:`record_query` writes it (``failed``, :data:`CHARGED_PENDING`), for a charge that
    writes it in a statement of its own making (:func:`sqlsdc.catalog.budget.charge`)."""
    return [now(), user, policy_version, "failed", CHARGED_PENDING, fingerprint, _escaped(sql),
            None]  # fmt: skip


def _record(con, query_id: int | None, values: list, new_id: bool) -> int:
    """:func:`record_query`'s entry of row ``values`` (logged_at ... rows_returned)."""
    _at, user, policy_version, decision, reason, *_ = values
    if query_id is not None:
        if new_id:
            con.execute(parsed(_AUDIT_INSERT_NEW), [query_id, *values])
            return query_id
        outcome = not (decision == "failed" and reason == CHARGED_PENDING)
        if outcome and one(con, parsed(_AUDIT_OUTCOME), _replacing(values, query_id))[0]:
            return query_id  # a charge's outcome: always logged one by one
        if _counted_only(con, values):
            if one(con, f"SELECT 1 FROM {S}.audit WHERE query_id = ?", [query_id]):
                return query_id  # its outcome stands (as _AUDIT_INSERT would leave it)
            return refusal_rate.counted(con, user, policy_version, values[0])
        con.execute(parsed(_AUDIT_INSERT), [query_id, *values, query_id])
        return query_id
    if _counted_only(con, values):
        return refusal_rate.counted(con, user, policy_version, values[0])
    (drawn,) = one(
        con,
        parsed(_AUDIT_INSERT_DRAWING),
        values,
    )
    return drawn


AUDITED_REFUSAL_CHARACTERS = 16_384
"""Characters of a refused statement the audit log keeps; a longer one is kept as its start,
its length and its SHA-256. An analyst's refused statements cost milliseconds each, so logged
whole they would let anyone fill the disk: 40 refused statements of 990,000 random characters
grew the database file by 53 MB in 2.3 s (23 MB/s), 10 of 3.9 million characters, refused for
their length alone, by 48 MB (red team s43f); cut here, the same 40 add 1 MB. Refusals short
enough to be kept whole (16,000 characters: 2.6 MB/s, 400 in 4.9 s) are bounded by a rate too
(:mod:`sqlsdc.catalog.refusal_rate`, red team s44e). An accepted statement is logged whole (it
is what was released)."""


def _counted_only(con, values: list) -> bool:
    """Whether a refusal (``record_query``'s row ``values``) is over its user's rate
    (:mod:`sqlsdc.catalog.refusal_rate`): counted in a summary entry, not logged whole."""
    at, user, _version, decision, reason, _fingerprint, sql, _rows = values
    if decision != "refused":
        return False
    return refusal_rate.over(con, user, at, len(sql) + len(reason or ""))


def refused_text(sql: str) -> str:
    """What the audit log keeps of a refused statement ``sql``: all of it up to
    :data:`AUDITED_REFUSAL_CHARACTERS`, else its start and a note of its length and digest."""
    if len(sql) <= AUDITED_REFUSAL_CHARACTERS:
        return sql
    digest = hashlib.sha256(sql.encode("utf-8", "surrogatepass")).hexdigest()
    return (f"{sql[:AUDITED_REFUSAL_CHARACTERS]} ... [{len(sql):,} characters in all; the "
            f"audit log keeps the first {AUDITED_REFUSAL_CHARACTERS:,} of a refused statement; "
            f"SHA-256 of the whole: {digest}]")  # fmt: skip


def _replacing(values: list, query_id: int) -> list:
    """The parameters of :data:`_AUDIT_OUTCOME` from ``record_query``'s row values."""
    logged_at, _user, policy_version, decision, reason, fingerprint, _sql, rows = values
    row = [logged_at, policy_version, decision, reason, fingerprint, rows]
    return [*row, query_id, CHARGED_PENDING]


def _escaped(text: str) -> str:
    """``text`` with lone surrogates written as ``\\udcff`` escapes (the engine refuses them)."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


# A result of at most this many rows whose ledger columns are plain scalars is passed to the
# ledger INSERT as list parameters; registering it as an Arrow view (and unregistering it) cost
# more than half a millisecond of a CKM query's fixed cost (benchmarks/README.md).
PARAMETER_ROWS = 1024


@lru_cache(maxsize=512)
def ledger_insert(
    tables: tuple[str, ...],
    keys: tuple[tuple[str, int], ...],
    cells: tuple[tuple[str, int, str, int | None], ...],
    population: bool = False,
    parameter_types: tuple[tuple[int, str], ...] | None = None,
    identities: bool = False,
) -> str:
    """INSERT that turns a result (columns c0, c1, ...) into ledger rows, one per released
    cell; parameters: query id, time, user, fingerprint, and the population with
    ``population``. The result is the registered view ``__sqlsdc_release``, or, with
    ``parameter_types`` (``(position, DuckDB type)`` of every column read), one list parameter
    per such column after those, cast to its type so that identities read exactly as from the
    view. The text depends on the shape of the result only, so it is built once per shape.

    ``keys`` are ``(name, position)`` of the columns identifying a cell; ``cells`` are
    ``(name, position, mechanism, status position or None)`` of released values. Without a
    status column a NULL value counts as suppressed. The population, when there is one, is the
    canonical text of the predicate that selects the cell's rows (a job's WHERE); it becomes
    part of the identity, so that cells of different populations never share a ledger key.

    With ``identities`` (and ``parameter_types``) the identity of each row is not written by
    DuckDB but given, as the list parameter ``$5`` (:mod:`~sqlsdc.catalog.identity_text`: the
    same text), and no population parameter is taken; ``parameter_types`` then name the
    status and value columns only, from ``$6``.
    """
    if identities:
        source = _release_source(parameter_types, first=6, identities=True)
        return _ledger_rows(exp.column(IDENTITY_COLUMN), cells, source)
    scope = [exp.Literal.string("tables")]
    scope.append(
        exp.func("to_json", exp.Array(expressions=[exp.Literal.string(t) for t in tables]))
    )
    if population:
        scope += [exp.Literal.string("population"), exp.Placeholder(this="5")]
    identity = exp.func(
        "json_object",
        *scope,
        exp.Literal.string("keys"),
        exp.func(
            "json_object",
            *[a for name, i in keys for a in (exp.Literal.string(name), exp.column(f"c{i}"))],
        ),
    )
    source = _release_source(parameter_types, first=6 if population else 5)
    return _ledger_rows(exp.cast(identity, "VARCHAR"), cells, source)


def _ledger_rows(identity: exp.Expr, cells, source: exp.Expr) -> str:
    """:func:`ledger_insert`'s statement: a SELECT of ``source`` per released cell column.

    A subquery ``source`` (the list parameters' unnesting, as wide as the result) is written
    once, as a CTE that every SELECT reads by name, and the chain is built without copies:
    written per SELECT, the text grew with the cells times the columns, and a copy of the chain
    per cell with their cube (200 counts spent 37 s of a server's GIL here, after the answer,
    where no statement timeout reaches; red team s38a)."""
    parts = []
    for name, position, mechanism, status in cells:
        if status is None:
            value = exp.column(f"c{position}")
            status_expr = exp.Case(
                ifs=[
                    exp.If(
                        this=exp.Is(this=value, expression=exp.null()),
                        true=exp.Literal.string("suppressed"),
                    )
                ],
                default=exp.Literal.string("published"),
            )
        else:
            status_expr = exp.column(f"c{status}")
        parts.append(
            exp.select(
                exp.Placeholder(this="1"),
                exp.Placeholder(this="2"),
                exp.Placeholder(this="3"),
                exp.Placeholder(this="4"),
                identity.copy(),
                exp.Literal.string(name),
                exp.Literal.string(mechanism),
                status_expr,
            ).from_(exp.to_table(RELEASE_VIEW))
        )
    query = parts[0]
    for part in parts[1:]:
        query = exp.union(query, part, distinct=False, copy=False)
    if isinstance(source, exp.Subquery):
        query = query.with_(RELEASE_VIEW, as_=source.this, copy=False)
    return exp.insert(query, exp.table_(LEDGER_TABLE, db=S), copy=False).sql("duckdb")


def _release_source(
    parameter_types: tuple[tuple[int, str], ...] | None, first: int, identities: bool = False
) -> exp.Expr:
    """The registered view, or a subquery unnesting list parameters ``$first``, ... in
    parallel (with ``identities``, ``$first - 1`` too, as the TEXT column of the rows'
    identities)."""
    if parameter_types is None:
        return exp.to_table(RELEASE_VIEW)
    named = [
        exp.alias_(
            exp.func(
                "unnest",
                exp.cast(exp.Placeholder(this=str(first - 1)),
                         exp.DataType.build("TEXT[]", dialect="duckdb")),  # fmt: skip
            ),
            IDENTITY_COLUMN,
        )
    ] if identities else []  # fmt: skip
    columns = named + [
        exp.alias_(
            exp.func(
                "unnest",
                exp.cast(
                    exp.Placeholder(this=str(first + k)),
                    exp.DataType.build(f"{kind}[]", dialect="duckdb"),
                ),
            ),
            f"c{position}",
        )
        for k, (position, kind) in enumerate(parameter_types)
    ]
    return exp.select(*columns).subquery(RELEASE_VIEW)


def record_release(
    con,
    result: pa.Table,
    *,
    tables: Sequence[str],
    keys: Sequence[tuple[str, int]],
    cells: Sequence[tuple[str, int, str, int | None]],
    population: str | None = None,
    query_id: int,
    user: str,
    fingerprint: str,
) -> tuple[tuple[str, str, str], ...] | None:
    """Ledger rows for a protected result (:func:`ledger_insert`), in one statement. Returns
    the rows' ``(cell, column_name, mechanism)`` when their identities were written from
    Python (a small result: the cell limits need not read them back), else None."""
    if result.num_rows == 0:
        return ()
    statement = partial(ledger_insert, tuple(tables), tuple(keys), tuple(cells),
                        population is not None)  # fmt: skip
    values = [query_id, now(), user, fingerprint, *([population] if population is not None else [])]
    # the keys, and of each cell its status column, or its value when it has none (the
    # status then says whether it was suppressed): what the statement reads
    read = sorted({i for _, i in keys} | {c[1] if c[3] is None else c[3] for c in cells})
    columns = as_parameters(result, read)
    if columns is not None:
        given = identity_text.identities(tables, population, [name for name, _ in keys],
                           [columns[read.index(i)] for _, i in keys], result.num_rows)  # fmt: skip
        if given is not None:  # the same text as DuckDB's, 0.4 ms less (identity_text)
            shown = sorted({c[1] if c[3] is None else c[3] for c in cells})
            kinds = type_names(pa.schema([result.field(i) for i in shown]))
            sql = ledger_insert(tuple(tables), tuple(keys), tuple(cells), False,
                                tuple(zip(shown, kinds, strict=True)), True)  # fmt: skip
            con.execute(parsed(sql), [*values[:4], given, *(columns[read.index(i)] for i in shown)])
            return tuple((cell, name, mechanism) for name, _, mechanism, _ in cells
                         for cell in given)  # fmt: skip
        kinds = type_names(pa.schema([result.field(i) for i in read]))
        con.execute(parsed(statement(tuple(zip(read, kinds, strict=True)))), values + columns)
        return None
    con.register(RELEASE_VIEW, result.rename_columns([f"c{i}" for i in range(result.num_columns)]))
    try:
        con.execute(parsed(statement()), values)
    finally:
        # in a transaction the INSERT's failure aborted, DuckDB refuses this too: the INSERT's
        # own error is the one to raise (the next release replaces the registration)
        with contextlib.suppress(EngineError):
            con.unregister(RELEASE_VIEW)
    return None


def as_parameters(result: pa.Table, read: list[int]) -> list[list] | None:
    """The columns ``read`` as Python lists that bind back to the same DuckDB values, or None
    when the result is large or a value has no exact Python form (a date beyond year 9999)."""
    if result.num_rows > PARAMETER_ROWS or not all(_plain(result.field(i).type) for i in read):
        return None
    try:
        return [result.column(i).to_pylist() for i in read]
    except (OverflowError, ValueError):
        return None


def _plain(kind: pa.DataType) -> bool:
    """Arrow types whose Python values bind back to the same DuckDB values exactly (not
    nanosecond timestamps: Python's hold microseconds)."""
    return (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_decimal(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_date(kind)
        or (pa.types.is_timestamp(kind) and kind.tz is None and kind.unit != "ns")
    )


def record_cells(
    con,
    cells: pa.Table,
    *,
    tables: Sequence[str],
    keys: Sequence[str],
    values: Sequence[str],
    mechanism: str,
    status: str | None = None,
    population: str | None = None,
    query_id: int,
    user: str,
    fingerprint: str,
) -> None:
    """Ledger rows for the released cells of a job's table: one per row and ``values`` column.

    The identity is the one :func:`ledger_insert` gives guarded queries (``tables``, the key
    values by name, and the ``population`` predicate when there is one). ``status`` names a
    column holding ``published``/``suppressed``; without it a NULL value counts as suppressed.
    """
    names = cells.column_names
    record_release(
        con,
        cells,
        tables=tables,
        keys=[(k, names.index(k)) for k in keys],
        cells=[(v, names.index(v), mechanism, status and names.index(status)) for v in values],
        population=population,
        query_id=query_id,
        user=user,
        fingerprint=fingerprint,
    )


def copy_release(con, source_query_id: int, *, query_id: int, user: str, fingerprint: str) -> int:
    """Record again, under ``query_id``, every cell that ``source_query_id`` released (the same
    identities, columns, mechanisms and statuses), e.g. when a job's table is published;
    returns the number of ledger rows written."""
    (before,) = one(con, f"SELECT count(*) FROM {S}.{LEDGER_TABLE} WHERE query_id = ?",
                    [query_id])  # fmt: skip
    con.execute(
        f"INSERT INTO {S}.{LEDGER_TABLE} SELECT ?, ?, ?, ?, cell, column_name, mechanism, status "
        f"FROM {S}.{LEDGER_TABLE} WHERE query_id = ?",
        [query_id, now(), user, fingerprint, source_query_id],
    )
    (after,) = one(con, f"SELECT count(*) FROM {S}.{LEDGER_TABLE} WHERE query_id = ?",
                   [query_id])  # fmt: skip
    return after - before


def audit_reason(error: BaseException) -> str:
    """The audit log's text for a refusal or failure: sqlsdc's own policy messages as they are,
    anything else prefixed by its type, with the engine's withheld text (``detail``) appended
    (the log is for admins; analysts never read it)."""
    if isinstance(error, PolicyViolation):
        return str(error)
    if isinstance(error, KeyboardInterrupt) or interrupted_by_user(error):
        return "interrupted (Ctrl-C)"  # not "KeyboardInterrupt: ", an empty message
    reason = f"{type(error).__name__}: {error}"
    detail = getattr(error, "detail", None)
    return f"{reason} [{detail}]" if detail else reason


AUDIT_COLUMNS = (
    "query_id",
    "logged_at",
    "user_name",
    "policy_version",
    "decision",
    "reason",
    "fingerprint",
    "sql_text",
    "rows_returned",
)


def audit_entries(
    con,
    *,
    user: str | None = None,
    decision: str | None = None,
    limit: int = 50,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[dict]:
    """Newest audit entries first, optionally filtered: by user, decision, and the time they
    were logged (UTC), from ``since`` (included) to ``until`` (excluded).

    In the order they were logged, not of their ids: an id is drawn when a query, job or
    publication starts (its budget charges are recorded under it) and its entry is written
    when it ends, so a publication's entry comes after those of the queries it ran, whose ids
    are higher (listed by id, entry 27 of a publication came after 28 of its query and
    ``--since`` cut the listing out of order; new user s39)."""
    where, params = [], []
    if user:
        where.append("user_name = ?")
        params.append(user)
    if decision:
        where.append("decision = ?")
        params.append(decision)
    if since is not None:
        where.append("logged_at >= ?")
        params.append(since)
    if until is not None:
        where.append("logged_at < ?")
        params.append(until)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    rows = con.execute(
        f"SELECT {', '.join(AUDIT_COLUMNS)} FROM {S}.audit {clause} "
        "ORDER BY logged_at DESC, query_id DESC LIMIT ?",
        [*params, limit],
    ).fetchall()
    return [dict(zip(AUDIT_COLUMNS, row, strict=True)) for row in rows]
