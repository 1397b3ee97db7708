"""The guarded connection: a PEP 249 connection whose every query is checked and protected.

Threat model: the guard protects SQL-only users (analysts, the CLI, BI tools through a server).
It is not a boundary against code running in the same Python process, which can open the file
itself; real isolation means the confidential file belongs to another OS user or process.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from statistics import NormalDist

import pandas as pd
import pyarrow as pa
from sqlglot import exp

from sqlsdc.catalog import store
from sqlsdc.catalog.budget import (
    BudgetStatus,
    budget_status,
    cached_cells,
    charge,
    ensure_budget_catalog,
    policy_limits,
    record_cells,
)
from sqlsdc.catalog.ptables import load_ptables
from sqlsdc.catalog.setup import unique_columns, unit_index_name
from sqlsdc.engines import duckdb as engine
from sqlsdc.errors import (
    AccessDenied,
    Error,
    InterfaceError,
    NotSupportedError,
    OperationalError,
    PolicyViolation,
    ProgrammingError,
)
from sqlsdc.guard.check_cache import checked, context_fingerprint
from sqlsdc.guard.dp_release import DpRelease, price, release, resolve_domains
from sqlsdc.guard.pipeline import GuardContext, ProtectedQuery, protect
from sqlsdc.guard.postprocess import (
    accuracy,
    cell_status,
    check_faults,
    dp_accuracy,
    record_release,
    values_of,
)
from sqlsdc.guard.resolve import analyst_schema
from sqlsdc.guard.validate import check_engine_tables
from sqlsdc.jobs.patterns import ensure_patterns
from sqlsdc.policy import Policy, UserRole, load_policy

apilevel = "2.0"
threadsafety = 1
paramstyle = "qmark"


def connect(path: str | Path, user: str, *, timeout: float | None = None) -> Connection:
    """Open a guarded connection to a database initialised with ``sqlsdc init``.

    Every statement is stopped after the policy's ``limits.statement_timeout_seconds`` (300 s
    by default), so that one analyst cannot occupy a shared engine nor learn anything from
    how long a statement may run. ``timeout`` (seconds) may ask for a shorter limit on this
    connection, never a longer one.

    Example:
        >>> con = sqlsdc.connect("sqlsdc-demo.duckdb", user="analyst")  # doctest: +SKIP
        >>> con.execute("SELECT COUNT(*) FROM persons").fetchall()  # doctest: +SKIP
    """
    return Connection(path, user, timeout=timeout)


class Connection:
    """A PEP 249 connection that answers only protected aggregate queries."""

    def __init__(self, path: str | Path, user: str, *, timeout: float | None = None):
        self._con = None
        if not Path(path).is_file():
            raise Error(
                f"database {path} does not exist; create it with `sqlsdc init` or `sqlsdc demo`"
            )
        con = engine.open_database(path)
        try:
            engine.harden(con)
            current = store.current_policy(con)
            if current is None:
                raise Error(f"{path} has no sqlsdc catalog; run `sqlsdc init {path} --policy FILE`")
            version, document, source = current
            policy = load_policy(document, name=source)
            if policy.user(user) is None:
                raise AccessDenied(
                    f"user {user!r} is not declared in the policy of {Path(path).name}; "
                    "ask an admin to add it under `users:`"
                )
            self._timeout = _statement_timeout(policy, timeout)
            self._context = _context(con, policy, version, self._timeout, Path(path))
            ensure_budget_catalog(con)  # brings a cache of DP cells from older versions along
            store.ensure_mix_keys(con)  # catalogs made before statistic keys were secret
        except engine.EngineError:
            con.close()
            raise OperationalError(
                f"cannot open {Path(path).name}: the engine failed while reading the sqlsdc "
                "catalog; the engine's message is withheld; an admin can check the database "
                "with `sqlsdc policy show`"
            ) from None
        except BaseException:
            con.close()
            raise
        self._con = con
        self._data_versions: dict[str, str] = {}
        self._dp_noise = True
        self.user = user
        self.role = policy.user(user).role
        self.policy = policy
        self.path = str(path)

    @property
    def timeout(self) -> float:
        """Seconds after which a statement is stopped: the policy's limit, or less if asked."""
        return self._timeout

    @property
    def policy_version(self) -> int:
        return self._context.policy_version

    @property
    def dp_noise(self) -> bool:
        """Whether DP results carry noise (always, except in an admin's semantics mode)."""
        return self._dp_noise

    def remaining_budget(self) -> list[BudgetStatus]:
        """The privacy budgets that apply to this user: limit, spent and remaining."""
        self._check_open()
        try:
            return budget_status(self._con, policy_limits(self.policy), user=self.user)
        except engine.EngineError as failure:
            raise _engine_failure(failure, None) from None

    def set_dp_noise(self, enabled: bool) -> None:
        """Admins only: ``False`` turns DP noise off (epsilon -> infinity) on this connection,
        to test what bounding, clamping, NULLs and empty groups do to a query. Results are the
        exact bounded values; nothing is charged or cached, and the audit log marks them."""
        self._check_open()
        if not enabled and self.role is not UserRole.ADMIN:
            raise AccessDenied(
                f"user {self.user!r} is an analyst; only admins may turn differential-privacy "
                "noise off"
            )
        self._dp_noise = bool(enabled)

    def cursor(self) -> Cursor:
        self._check_open()
        return Cursor(self)

    def execute(self, sql: str, params=None) -> Cursor:
        return self.cursor().execute(sql, params)

    def explain(self, sql: str, params=None) -> ProtectedQuery:
        """The protected SQL and the mechanism of every output column, without reading data."""
        self._check_open()
        try:
            return self._protect(sql, params)
        except engine.EngineError as failure:
            raise _engine_failure(failure, None) from None

    def _protect(self, sql: str, params) -> ProtectedQuery:
        """``protect``, shared with every connection of the process that sees the same policy
        version, schema and catalog (``check_cache``)."""
        try:
            frozen = _freeze(params)
            hash(frozen)
        except TypeError:
            return protect(sql, params, self._context)
        return checked(sql, params, frozen, self._context)

    def commit(self) -> None:
        """Queries are read-only and their audit entries are committed as they run."""

    def rollback(self) -> None:
        raise NotSupportedError("guarded connections have no transactions to roll back")

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _audit_refusal(self, query_id: int, sql: str, refusal: Error) -> None:
        reason = (
            str(refusal)
            if isinstance(refusal, PolicyViolation)
            else (f"{type(refusal).__name__}: {refusal}")
        )
        if getattr(refusal, "detail", None):
            reason += f" [{refusal.detail}]"
        store.record_query(
            self._con,
            query_id,
            self.user,
            self._context.policy_version,
            "refused",
            sql,
            reason=reason,
        )

    def _check_open(self) -> None:
        if self._con is None:
            raise InterfaceError("the connection is closed")

    def _execute(self, sql: str, params):
        """``_run``, with every engine error that escapes it (an audit write, transaction
        control, a catalog read) turned into sqlsdc's own message; the engine's text goes to
        the audit log only, so what an analyst sees never depends on the engine's wording."""
        try:
            return self._run(sql, params)
        except engine.EngineError as failure:
            query_id = self._record_failure(sql, failure)
            raise _engine_failure(failure, query_id) from None

    def _record_failure(self, sql: str, failure: Exception) -> int | None:
        """Best effort: a new audit entry for an engine failure outside a query's own entry."""
        try:
            self._con.execute("ROLLBACK")
        except engine.EngineError:
            pass  # no transaction was open
        try:
            query_id = store.next_query_id(self._con)
            reason = f"{type(failure).__name__}: {failure}"
            store.record_query(self._con, query_id, self.user, self._context.policy_version,
                               "failed", sql, reason=reason)  # fmt: skip
            return query_id
        except engine.EngineError:
            return None

    def _run(self, sql: str, params) -> tuple[pa.Table, ProtectedQuery, int, pd.DataFrame]:
        """Protect, execute, record; results are returned only after they are recorded."""
        self._check_open()
        con, context = self._con, self._context
        query_id = store.next_query_id(con)
        try:
            query = self._protect(sql, params)
        except Error as refusal:  # refusals, guard bugs and bad parameters are all audited
            self._audit_refusal(query_id, sql, refusal)
            raise
        noisy = None
        if query.dp_stages:
            try:
                noisy = self._release_dp(query, query_id)  # charged (committed) from here on
            except engine.EngineError as failure:
                store.record_query(
                    con, query_id, self.user, context.policy_version, "failed", sql,
                    reason=str(failure), fingerprint=query.fingerprint,
                )  # fmt: skip
                raise _engine_failure(failure, query_id) from None
            except Error as refusal:
                self._audit_refusal(query_id, sql, refusal)
                raise
        con.execute("BEGIN TRANSACTION")
        try:
            if query.suppressed:
                ensure_patterns(con, context.policy, context.policy_version, query.suppressed)
            tables_read = engine.tables_read_by(con, query.sql)
            check_engine_tables(tables_read, query.tree, context.policy)
            result = _run_over(con, query.sql, noisy, self.timeout)
            check_faults(result, query)
            values = values_of(result, query)
            record_release(con, result, query, query_id, self.user)
            status = cell_status(result, query)
            store.record_query(
                con,
                query_id,
                self.user,
                context.policy_version,
                "accepted",
                sql,
                reason=None if self._dp_noise or noisy is None else _NOISE_OFF,
                fingerprint=query.fingerprint,
                rows=values.num_rows,
            )
            con.execute("COMMIT")
        except engine.EngineError as failure:
            con.execute("ROLLBACK")
            store.record_query(
                con,
                query_id,
                self.user,
                context.policy_version,
                "failed",
                sql,
                reason=str(failure),
                fingerprint=query.fingerprint,
            )
            raise _engine_failure(failure, query_id) from None
        except Error as refusal:
            con.execute("ROLLBACK")
            self._audit_refusal(query_id, sql, refusal)
            raise
        except BaseException:
            con.execute("ROLLBACK")
            raise
        return values, query, query_id, status, dp_accuracy(result, query)

    def _release_dp(self, query: ProtectedQuery, query_id: int) -> DpRelease:
        """Noisy cells of the query's DP aggregations, their cost charged to the ledger first.

        Order matters (ISSUE16 must-have 6): the statistics not paid before are charged and
        committed *before* any exact cell is computed, so a query that then fails, is
        interrupted or times out has paid; only the public domains and the tables' data
        versions are read before. The drawn cells are cached afterwards (free)."""
        con, context = self._con, self._context
        for stage in query.dp_stages:
            tables = engine.tables_read_by(con, stage.sql)
            check_engine_tables(tables, query.tree, context.policy)
        version = context.policy_version

        def run(text: str):
            return engine.run(con, text, timeout=self.timeout)

        def cached(digests):
            return cached_cells(con, self.user, version, digests)

        data_versions = {s.table: self._data_version(s.table) for s in query.dp_stages}
        domains = resolve_domains(query.dp_stages, run)  # public values only
        paid = None
        if self._dp_noise:
            cost = price(query.dp_stages, data_versions=data_versions, domains=domains,
                         paid=cached)  # fmt: skip
            paid = charge(con, user=self.user, tables=query.tables, cost=cost.cost,
                          query_id=query_id, limits=policy_limits(context.policy),
                          cells=cost.statistics, policy_version=version)  # fmt: skip
        noisy = release(query.dp_stages, run, secret=_secret(con), policy_version=version,
                        data_versions=data_versions, cached=cached, noise=self._dp_noise,
                        domains=domains)  # fmt: skip
        if self._dp_noise:
            record_cells(con, user=self.user, policy_version=version, query_id=query_id,
                         cells=noisy.cells, paid_by=paid)  # fmt: skip
        return noisy

    def _data_version(self, table: str) -> str:
        """A fingerprint of the table's rows, part of every DP cell's identity: the same cell
        over changed data gets fresh noise (and a new charge), never the old noise on a new
        value. Computed once per connection (DuckDB locks the file against other writers)."""
        if table not in self._data_versions:
            rows, digest = engine.one(
                self._con, f'SELECT count(*), bit_xor(hash("{table}")) FROM "{table}"'
            )
            self._data_versions[table] = f"{rows}:{digest}"
        return self._data_versions[table]


class Cursor:
    """PEP 249 cursor over a protected result, with ``df()``, ``arrow()`` and ``cell_status()``."""

    arraysize = 1

    def __init__(self, connection: Connection):
        self.connection = connection
        self._result: pa.Table | None = None
        self._status: pd.DataFrame | None = None
        self._position = 0
        self.query: ProtectedQuery | None = None
        self.query_id: int | None = None
        self._dp_accuracy: pd.DataFrame | None = None

    @property
    def description(self):
        if self._result is None:
            return None
        return [(f.name, str(f.type), None, None, None, None, True) for f in self._result.schema]

    @property
    def rowcount(self) -> int:
        return -1 if self._result is None else self._result.num_rows

    def execute(self, sql: str, params=None) -> Cursor:
        result, query, query_id, status, noise = self.connection._execute(sql, params)
        self._result, self.query, self.query_id, self._status = result, query, query_id, status
        self._dp_accuracy = noise
        self._position = 0
        return self

    def executemany(self, sql: str, seq_of_params) -> Cursor:
        for params in seq_of_params:
            self.execute(sql, params)
        return self

    def fetchone(self):
        rows = self.fetchmany(1)
        return rows[0] if rows else None

    def fetchmany(self, size: int | None = None) -> list[tuple]:
        table = self._require_result()
        size = self.arraysize if size is None else size
        chunk = table.slice(self._position, size)
        self._position += chunk.num_rows
        return _rows(chunk)

    def fetchall(self) -> list[tuple]:
        table = self._require_result()
        chunk = table.slice(self._position)
        self._position = table.num_rows
        return _rows(chunk)

    def df(self) -> pd.DataFrame:
        return self._require_result().to_pandas()

    def arrow(self) -> pa.Table:
        return self._require_result()

    def cell_status(self) -> pd.DataFrame:
        """Per result cell: ``published`` or ``suppressed`` for protected aggregates, ``key``
        for group keys, ``public`` for public values, ``derived`` for values computed from
        protected cells (suppressed when NULL)."""
        self._require_result()
        return self._status

    def cell_accuracy(self, level: float = 0.95) -> pd.DataFrame:
        """Accuracy of every noisy cell in the result, one row per cell.

        Columns: ``row``, ``column``, ``value`` (published), ``variance`` (of the noise),
        ``low``/``high``: an interval around the value that holds the true (bounded) value with
        probability ``level``.

        CKM counts: from the noise distribution of the ptable's general row (exact for true
        counts at or above its last row, conservative bounds ±D hold for all); CKM magnitude
        cells are not listed: their noise scales with the largest contribution, which must stay
        secret. DP cells: COUNT and SUM intervals are exact quantiles of the discrete Laplace or
        Gaussian noise at level 0.95 (other levels: normal approximation z·sd); AVG intervals
        are delta-method approximations; VAR, STDDEV and quantiles are not listed.
        """
        if not 0 < level < 1:
            raise ProgrammingError("level must be between 0 and 1, e.g. 0.95")
        ckm = accuracy(self._require_result(), self.query, level)
        if self._dp_accuracy is None or self._dp_accuracy.empty:
            return ckm
        dp = self._dp_accuracy.copy()
        if level != 0.95:
            dp["half_width"] = NormalDist().inv_cdf((1 + level) / 2) * dp["sd"]
        dp["variance"] = dp["sd"] ** 2
        dp["low"], dp["high"] = dp["value"] - dp["half_width"], dp["value"] + dp["half_width"]
        dp = dp[["row", "column", "value", "variance", "low", "high"]]
        return pd.concat([ckm, dp], ignore_index=True) if not ckm.empty else dp

    def explain(self) -> ProtectedQuery:
        if self.query is None:
            raise ProgrammingError("no query has been executed on this cursor")
        return self.query

    def setinputsizes(self, sizes) -> None:
        """PEP 249 no-op."""

    def setoutputsize(self, size, column=None) -> None:
        """PEP 249 no-op."""

    def close(self) -> None:
        self._result = None

    def __iter__(self):
        return iter(self.fetchall())

    def _require_result(self) -> pa.Table:
        if self._result is None:
            raise ProgrammingError("no result: call execute() first")
        return self._result


_NOISE_OFF = "dp noise off (admin semantics mode): exact bounded values, not charged"


def _secret(con) -> bytes:
    row = engine.one(con, f"SELECT material FROM {store.S}.secrets WHERE name = 'prf'")
    if row is None:
        raise Error("this database has no PRF secret; an admin must re-apply the policy")
    return bytes(row[0])


def _run_over(con, sql: str, noisy: DpRelease | None, timeout: float) -> pa.Table:
    """Run the protected SQL, over the registered noisy cells of its DP aggregations."""
    names = list(noisy.relations) if noisy is not None else []
    for name in names:
        con.register(name, noisy.relations[name])
    try:
        return engine.run(con, sql, timeout=timeout)
    finally:
        for name in names:
            con.unregister(name)


def _freeze(params):
    if params is None:
        return None
    if isinstance(params, dict):
        return tuple(sorted(params.items()))
    return tuple(params)


def _rows(table: pa.Table) -> list[tuple]:
    columns = [c.to_pylist() for c in table.columns]
    return list(zip(*columns, strict=True)) if columns else []


def _statement_timeout(policy: Policy, asked: float | None) -> float:
    """The policy's statement timeout, or a shorter one asked for by the connection."""
    limit = policy.statement_timeout
    if asked is None:
        return limit
    if isinstance(asked, bool) or not isinstance(asked, (int, float)) or not asked > 0:
        raise ProgrammingError(f"timeout must be a positive number of seconds, got {asked!r}")
    if asked > limit:
        raise AccessDenied(
            f"timeout {asked!r} s is above the policy's statement timeout of {limit:g} s; a "
            "connection may only shorten it (an admin sets `limits: {statement_timeout_seconds: "
            "..}` in the policy)"
        )
    return float(asked)


def _context(con, policy: Policy, version: int, timeout: float, path: Path) -> GuardContext:
    schema = analyst_schema(policy, engine.table_schemas(con))
    indexes = {
        r[0]
        for r in con.execute(
            "SELECT index_name FROM duckdb_indexes() WHERE database_name = current_database()"
        ).fetchall()
    }
    unit_per_row = {
        t.name: unit_index_name(t.name, t.privacy_unit) in indexes
        for t in policy.confidential_tables
    }

    @lru_cache(maxsize=1024)
    def evaluates(sql: str) -> bool:
        try:
            engine.run(con, sql, timeout=timeout)
            return True
        except engine.EngineError:
            return False

    def constant_is_safe(node: exp.Expr) -> bool:
        if node.find(exp.Subquery, exp.Select, exp.Table, exp.Column):
            return True  # not a constant; its own scope is checked
        return evaluates(engine.to_sql(exp.select(node.copy())))

    context = GuardContext(
        policy=policy,
        policy_version=version,
        schema=schema,
        unit_per_row=unit_per_row,
        unique_columns=unique_columns(con),
        constant_is_safe=constant_is_safe,
        to_sql=engine.to_sql,
        ptables=load_ptables(con, policy),
    )
    fingerprint = context_fingerprint(str(path.resolve()), context, engine.duckdb.__version__)
    return replace(context, fingerprint=fingerprint)


def _engine_failure(failure: Exception, query_id: int | None) -> Error:
    """sqlsdc's message for an engine failure: whatever the engine said (a missing object, a
    constraint, a conversion), the analyst reads the same words; the engine's text is in the
    audit log for admins. Only a timeout is told apart, as the analyst can act on it."""
    where = f" (query {query_id})" if query_id is not None else ""
    if isinstance(failure, engine.duckdb.InterruptException):
        return OperationalError(
            f"the query was stopped because it ran longer than the statement timeout{where}; "
            "narrow it, or ask an admin about the policy's `limits.statement_timeout_seconds`"
        )
    return OperationalError(
        f"the query failed in the engine{where}; the engine's message is withheld because it "
        "could reveal confidential values or objects; an admin can read it with `sqlsdc audit`"
    )
