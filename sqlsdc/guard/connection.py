"""The guarded connection: a PEP 249 connection whose every query is checked and protected.

Threat model: the guard protects SQL-only users (analysts, the CLI, BI tools through a server).
It is not a boundary against code running in the same Python process, which can open the file
itself; real isolation means the confidential file belongs to another OS user or process.

This module holds the PEP 249 surface and a statement's path through the connection: checked
(early, without the file; then under it), run over the noisy cells, its answer recorded in one
transaction. Its parts are mixins :class:`Connection` inherits, each in its own module:
:class:`~sqlsdc.guard.holding.FileHolding` (the database file opened and let go),
:class:`~sqlsdc.guard.checking.Checking` (a statement's check, early, cached and timed),
:class:`~sqlsdc.guard.auditing.Auditing` (audit entries of unanswered statements),
:class:`~sqlsdc.guard.engine_reads.EngineReads` (DuckDB's reading of each text) and
:class:`~sqlsdc.guard.dp_charge.DpCharging` (the DP charge, draw and cache).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pyarrow as pa
from sqlglot import exp

from sqlsdc import errors
from sqlsdc.catalog import cell_limits, store
from sqlsdc.catalog.budget import BudgetStatus, Charge, budget_status, policy_limits
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines import duckdb_schema, duckdb_sql, watchdog
from sqlsdc.errors import (
    AccessDenied,
    AnswerTooLarge,
    Error,
    InterfaceError,
    NotFoundError,
    NotSupportedError,
    PolicyViolation,
    ProgrammingError,
    TabularError,
)
from sqlsdc.guard import statement_rate
from sqlsdc.guard.answer_bound import answer_rows
from sqlsdc.guard.audited_parameters import audited_text, snapshot
from sqlsdc.guard.auditing import Auditing
from sqlsdc.guard.checking import Checking, Early
from sqlsdc.guard.cursor import Cursor
from sqlsdc.guard.described import answer_schema, described_result
from sqlsdc.guard.dp_charge import DpCharging
from sqlsdc.guard.dp_limits import MAX_PRIVATE_GROUPS
from sqlsdc.guard.dp_pricing import stage_cells
from sqlsdc.guard.dp_release import DpRelease
from sqlsdc.guard.engine_failures import cell_conflict, engine_failure
from sqlsdc.guard.engine_reads import EngineReads
from sqlsdc.guard.hidden_cells import hidden_cells
from sqlsdc.guard.holding import IDLE_RELEASE_SECONDS, FileHolding, database_lock
from sqlsdc.guard.listed_cells import listed
from sqlsdc.guard.pipeline import GuardContext, ProtectedQuery
from sqlsdc.guard.postprocess import check_faults, record_release, values_of
from sqlsdc.guard.probes import answers_no_row
from sqlsdc.guard.resolve import readable
from sqlsdc.guard.statement import built_in_text, statement_text
from sqlsdc.guard.unbound import describing
from sqlsdc.jobs.patterns import ensure_patterns
from sqlsdc.policy import Policy, UserRole

apilevel = "2.0"
threadsafety = 2  # threads may share a connection: its statements run one after the other
paramstyle = "qmark"

EARLY_CHECKS = 3  # checks of a statement before the file is taken, when admins apply policies
# meanwhile (the last policy applied is checked under the file if it changed after the last)
RECORD_RETRIES = 20  # a query's recording transaction, when a concurrent one cached a cell first
MAX_ANSWER_ROWS = 1_000_000  # rows one statement may return (a public table's cross join could
MAX_ANSWER_BYTES = 64 * 2**20  # otherwise fill the memory of a process shared by many sessions,
# such as `sqlsdc serve`); the bytes are Arrow's, read batch by batch


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


class Connection(FileHolding, Checking, Auditing, EngineReads, DpCharging):
    """A PEP 249 connection that answers only protected aggregate queries.

    A connection may be shared between threads: its statements then run one at a time (a
    lock around every use of the engine connection). Threads that should run in parallel
    open a connection each."""

    # PEP 249 extension: the exceptions as attributes, for code that has only the connection
    # (con.Error raised AttributeError: new user s44g)
    Warning, Error, InterfaceError = errors.Warning, errors.Error, errors.InterfaceError
    DatabaseError, DataError = errors.DatabaseError, errors.DataError
    OperationalError, IntegrityError = errors.OperationalError, errors.IntegrityError
    InternalError, ProgrammingError = errors.InternalError, errors.ProgrammingError
    NotSupportedError = errors.NotSupportedError

    def __init__(
        self,
        path: str | Path,
        user: str,
        *,
        timeout: float | None = None,
        idle_release: float | None = IDLE_RELEASE_SECONDS,
    ):
        self._db = None  # the engine connection, while this connection holds the file
        self._closed = True
        self._lock = threading.RLock()
        self._depth = 0  # nested _holding uses in progress (under the lock)
        self._alarm: watchdog.Alarm | None = None  # the idle release, while one is planned
        self._last_use = 0.0
        self._turn_until = 0.0
        self._timeout: float | None = None  # the statement timeout, once the policy is read
        self._context: GuardContext | None = None
        self._base_policy: Policy | None = None  # the policy in force, before its releases
        self._releases: dict = {}  # released outputs readable now (sqlsdc.guard.releases)
        self._asked_timeout = timeout
        self._idle_release = idle_release
        self._dp_noise = True
        self._reopen = False  # an admin applied a policy in this process: read it (_open)
        self._deadline = 0.0  # of the statement running (monotonic clock)
        self._interrupts = 0  # interrupt() calls: one during an early check stops it too
        self._query_id: int | None = None  # of the DP statement running, once drawn
        self._settle = None  # lets waiters on its charged statistics go (dp_in_flight)
        self.user = user
        self.path = str(path)
        if self.path == "":  # Path("") is the current folder: "'' is a folder" misled
            raise NotFoundError("the database path is empty; name the .duckdb file")
        if Path(path).is_dir():
            raise NotFoundError(f"{path} is a folder, not a database file; name the .duckdb file")
        if not Path(path).is_file():
            raise NotFoundError(
                f"database {path} does not exist; create it with `sqlsdc init` or `sqlsdc demo`"
            )
        duckdb_sql.require_extensible_sqlglot()
        with self._lock:
            self._open()
            self._closed = False
            self._schedule_release()

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

    @property
    def analyst_schema(self) -> dict[str, dict[str, str]]:
        """``{table: {column: type}}`` as the guard resolves names: the policy's view, with
        types as :func:`~sqlsdc.engines.duckdb_schema.shown_type` shows them."""
        return {
            table: {column: duckdb_schema.shown_type(kind) for column, kind in columns.items()}
            for table, columns in self._context.schema.items()
        }

    def stored_schemas(self, schema: str) -> dict[str, dict[str, str]]:
        """``{table: {column: type}}`` of the tables of a schema of the database (e.g. the
        ``protected`` outputs of jobs). An admin gets every table and column; any other user
        only the tables the guard lets them read under that schema's name, without ``__``
        columns (:func:`sqlsdc.guard.resolve.readable`), so that no unreleased output, table
        outside the policy, record key or catalog table is named to them."""
        with self._holding() as con:
            try:
                stored = duckdb_schema.table_schemas(con, schema)
            except engine.EngineError as failure:
                raise engine_failure(failure, None) from None
        if self.role is UserRole.ADMIN:
            return stored
        return {
            name: {
                c: duckdb_schema.shown_type(kind)
                for c, kind in columns.items()
                if not c.startswith("__")
            }
            for name, columns in stored.items()
            if readable(self.policy, exp.table_(name, db=schema))
        }

    def remaining_budget(self) -> list[BudgetStatus]:
        """The privacy budgets that apply to this user: limit, spent and remaining."""
        with self._holding() as con:
            try:
                return budget_status(con, policy_limits(self.policy), user=self.user)
            except engine.EngineError as failure:
                raise engine_failure(failure, None) from None

    def set_dp_noise(self, enabled: bool) -> None:
        """Admins only: ``False`` turns DP noise off (epsilon -> infinity) on this connection,
        to test what bounding, clamping, NULLs and empty groups do to a query. Results are the
        exact bounded values; nothing is charged or cached, and the audit log marks them."""
        self._check_open()
        if not isinstance(enabled, bool):  # read once, as True or False: an object whose
            raise ProgrammingError(  # __bool__ said True to the check and False to the setting
                f"set_dp_noise takes True or False, got {type(enabled).__name__}"
            )  # turned an analyst's noise off
        if not enabled and self.role is not UserRole.ADMIN:
            raise AccessDenied(
                f"user {self.user!r} is an analyst; only admins may turn differential-privacy "
                "noise off"
            )
        self._dp_noise = enabled

    def cursor(self) -> Cursor:
        self._check_open()
        return Cursor(self)

    def execute(self, sql: str, parameters=None) -> Cursor:
        return self.cursor().execute(sql, parameters)

    def explain(self, sql: str, parameters=None) -> ProtectedQuery:
        """The protected SQL and the mechanism of every output column, without reading data
        (a copy: the checked query itself is shared, :meth:`ProtectedQuery.detached`)."""
        sql = statement_text(sql)
        with self._holding():
            try:
                query = self._protect(sql, parameters)
                self._check_engine_texts(query)  # what running it would refuse, explain refuses
                return query.detached()
            except engine.EngineError as failure:
                raise engine_failure(failure, None) from None

    def describe(self, sql: str, parameters=None) -> tuple[ProtectedQuery, pa.Schema | None]:
        """:meth:`explain`'s protected query and the types of its answer's columns, from
        binding its SQL without running it (None where binding cannot tell them:
        :mod:`~sqlsdc.guard.described`). A parameter may be :data:`~sqlsdc.guard.unbound.UNBOUND`,
        a value not sent yet: a condition on a measure at it is not judged (its Execute is)."""
        with describing():
            query = self.explain(sql, parameters)
        with self._holding() as con:
            return query, answer_schema(con, query)

    def verify(self, sql: str, *, mode: str | None = None, epsilon=None):
        """Compare an aggregate or OLS query on a released synthetic output with the
        confidential data (McClure and Reiter's verification server, :mod:`sqlsdc.synth.verify`):
        a noisy fidelity measure charged ``epsilon`` per cell to this user's budget (``noisy``,
        analysts' only mode), or its decile interval (``interval``, admins only, their
        default). Audited and cached like any query."""
        from sqlsdc.synth.verify import verify

        sql, mode = statement_text(sql), built_in_text(mode)  # a str subclass's __eq__ chose
        with self._holding() as con:  # interval mode past the analysts' check, free
            try:
                statement_rate.check(con, self.path, self.user, sql)  # the audit log's room
            except Error as refusal:
                self._audit_refusal(None, sql, refusal)
                raise
            try:
                return verify(con, sql, user=self.user, policy=self.policy,
                              policy_version=self.policy_version, secret=self._secret(), mode=mode,
                              epsilon=epsilon, lock=database_lock(Path(self.path)),
                              timeout=self.timeout)  # fmt: skip
            except engine.EngineError as failure:
                raise engine_failure(failure, self._record_failure(sql, failure)) from None

    def pram_counts(self, sql: str):
        """Unbiased counts from a released anonymised output whose group key was PRAMmed:
        ``SELECT keys..., COUNT(*) FROM output [WHERE ...] GROUP BY keys...`` answered with
        each observed count weighted by the inverse of the stored PRAM matrix
        (:mod:`sqlsdc.microdata.pram_estimate`); the rewritten query runs through the guard
        like any other. Returns a cursor."""
        import json

        import sqlglot

        from sqlsdc.microdata.pram_estimate import corrected_counts, pram_matrices

        sql = statement_text(sql)
        try:
            source = sqlglot.parse_one(sql, read="duckdb").find(exp.Table)
        except sqlglot.errors.ParseError:
            raise PolicyViolation("the query could not be parsed") from None
        name = source.name.lower() if source is not None else ""
        if name not in (r.lower() for r in self.policy.releases):
            raise PolicyViolation(
                f"{name or 'the query'} is not a released output of the policy",
                "PRAM estimates read an anonymised output listed under `releases:`",
            )
        with self._holding() as con:
            row = engine.one(con, "SELECT method, report FROM sqlsdc.outputs WHERE name = ?",
                             [f"protected.{name}"])  # fmt: skip
        matrices = pram_matrices(json.loads(row[1])) if row and row[0] == "anonymize" else {}
        if not matrices:
            raise PolicyViolation(f"{name} has no PRAMmed column to estimate counts for")
        return self.execute(corrected_counts(sql, source.name, matrices))

    def interrupt(self) -> None:
        """Stop the statement running on this connection, from another thread (the server's
        CancelRequest): it ends with :class:`~sqlsdc.errors.QueryCanceled` as if its timeout
        had passed. A connection with no statement running is not affected."""
        self._interrupts += 1
        self._deadline = 0.0
        db = self._db
        if db is not None:
            try:
                db.interrupt()
            except engine.EngineError:  # closed since read (the lock is not taken here): it
                pass  # runs nothing to stop; a server's CancelRequest got "internal error"

    def audit_refusal(self, sql: str, refusal: Error, params=None) -> int | None:
        """Audit a refusal of ``sql`` (with ``params``) decided beside :meth:`execute`, in the
        entry :meth:`execute` writes for its own: the server's catalog refusing a statement, or
        the guard's plan (:meth:`explain`, which audits nothing) refusing one at a protocol
        Describe; an analyst's every refusal leaves an entry (red team s35b). Returns the
        query id, or None on a closed connection (the refusal stands either way)."""
        sql = audited_text(statement_text(sql), snapshot(params))
        if self._closed:
            return None
        try:
            with self._holding():
                return self._audit_refusal(None, sql, refusal)
        except InterfaceError:  # closed meanwhile, by the session's end
            return None
        except engine.EngineError as failure:
            raise engine_failure(failure, None) from None

    def commit(self) -> None:
        """Queries are read-only and their audit entries are committed as they run: nothing
        to do, but on a closed connection an error, as PEP 249 asks of every operation after
        :meth:`close` (it returned silently, so a script could not tell it had closed it)."""
        self._check_open()

    def rollback(self) -> None:
        raise NotSupportedError("guarded connections have no transactions to roll back")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._alarm is not None:
                self._alarm.cancel()
            if self._db is not None:
                self._close_engine()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the connection is closed")

    def _execute(self, sql: str, params):
        """``_run``, with every engine error that escapes it (an audit write, transaction
        control, a catalog read) turned into sqlsdc's own message; the engine's text goes to
        the audit log only, so what an analyst sees never depends on the engine's wording."""
        sql, params = statement_text(sql), snapshot(params)  # read once: bound and audited
        interrupts = self._interrupts  # a cancel from here on stops this statement
        early = self._check_early(sql, params, interrupts)
        for _ in range(EARLY_CHECKS - 1):  # an admin applied a policy since: checked again
            if early is None or self._in_force(early.context):
                break
            early = self._check_early(sql, params, interrupts, took=early.took)
        with self._holding():
            try:
                return self._run(sql, params, early, interrupts)
            except engine.EngineError as failure:
                query_id = self._record_failure(audited_text(sql, params), failure)
                raise engine_failure(failure, query_id) from None

    def _run(
        self, sql: str, params, early: Early | None = None, interrupts: int | None = None
    ) -> tuple[pa.Table, ProtectedQuery, int, pa.Table]:
        """Protect, execute, record; results are returned only after they are recorded: the
        audit entry (which draws the query id) and the ledger rows commit in one transaction.
        Returns the values, the checked query, its id and the whole result (with the hidden
        status and accuracy columns, read when the cursor is asked for them).

        A DP query's charge commits first, with an audit entry that its outcome replaces
        (:func:`~sqlsdc.catalog.budget.charge`): whatever stops the statement after that (an
        error, the timeout, Ctrl-C, a kill), the charge has its entry, and the analyst is told
        that the statement was charged (asking it again is charged again, unless its drawn
        cells were kept: :meth:`_keep_released`)."""
        self._check_open()
        logged = audited_text(sql, params)  # what the audit log keeps: the text and its values
        self._query_id = None  # a DP query's charge draws it, before the charge commits
        con, context = self._con, self._context
        try:
            statement_rate.check(con, self.path, self.user, logged)  # the audit log's room
            query = self._protect(sql, params, early, interrupts)
            self._check_summable(query)
        except engine.EngineError as failure:
            query_id = store.record_query(con, None, self.user, context.policy_version,
                                          "failed", logged, reason=str(failure))  # fmt: skip
            raise engine_failure(failure, query_id) from None
        except Error as refusal:  # refusals, guard bugs and bad parameters are all audited
            self._audit_refusal(None, logged, refusal)
            raise
        noisy, paid = None, None
        if not query.dp_stages:
            probed = self._probe(logged, query)
            if probed is not None:
                return probed
            return self._answer(logged, query, noisy, paid, self._query_id)
        try:
            try:
                noisy, paid = self._release_dp(query, None, logged)  # charged (committed) from here
            except engine.EngineError as failure:
                query_id = store.record_query(
                    con, self._query_id, self.user, context.policy_version, "failed", logged,
                    reason=str(failure), fingerprint=query.fingerprint,
                )  # fmt: skip
                raise self._said_paid(engine_failure(failure, query_id), query_id) from None
            except Error as refusal:  # the timeout's check or a cancel among them
                self._audit_refusal(self._query_id, logged, refusal)
                self._said_paid(refusal, self._query_id)
                raise
            except BaseException as bug:  # paid (perhaps), Ctrl-C too: never unaudited
                self._audit_bug(self._query_id, logged, bug)
                self._said_paid(bug, self._query_id)
                raise
            return self._answer(logged, query, noisy, paid, self._query_id)
        finally:
            self._settle_charged()  # cached, or stopped: others asking them price again

    def _probe(self, sql: str, query: ProtectedQuery):
        """The answer of a schema probe (:mod:`~sqlsdc.guard.probes`: no row by its form),
        typed from binding the protected SQL and recorded as answered with 0 rows, without
        running it; None for any other statement, or a probe whose types binding cannot give
        (:mod:`~sqlsdc.guard.described`: run as any statement)."""
        if not answers_no_row(query.tree):
            return None
        whole = described_result(self._con, query)
        if whole is None:
            return None
        query_id = store.record_query(self._con, None, self.user, self._context.policy_version,
                                      "accepted", sql, fingerprint=query.fingerprint,
                                      rows=0)  # fmt: skip
        return values_of(whole, query), query, query_id, whole

    def _answer(self, sql: str, query: ProtectedQuery, noisy: DpRelease | None,
                paid: Charge | None, query_id: int | None):  # fmt: skip
        """Run the protected SQL and record it in one transaction (``query_id`` None: the
        audit entry draws it): the answer, its audit entry, its ledger rows and the DP cells
        it drew (:meth:`_cache_cells`) commit together or not at all; a conflict on a cached
        cell runs the transaction again. An interrupt that arrives as the transaction commits
        leaves the answer recorded (and says so), never a second, "failed" entry; a COMMIT
        that raised after DuckDB kept the transaction (an interrupt, a server's cancel, as it
        ends: 7 of 60 interrupted commits, red team s48b) is the answer recorded, returned as
        the log says it was: told "cancelled", its ledger row counted none of the cells the
        commit had cached (the best-effort caching after a failure set the count to the cells
        it added: 0)."""
        con, context = self._con, self._context
        for attempt in range(RECORD_RETRIES):
            caching = False  # set once the analyst's SQL has run, when DP cells are cached
            counting = False  # set as the cells are counted against the cell limits
            committing = False  # set as the COMMIT is sent
            drawn = query_id  # the audit entry's id, once known
            registered: list[str] = []  # the noisy cells' views, to let go after the end
            con.execute(engine.parsed("BEGIN TRANSACTION"))  # parsed once: 0.02 ms each
            try:
                if query.suppressed:
                    _suppression_patterns(con, context, query.suppressed)
                self._check_engine_reads(query.sql, query)
                result = _run_over(con, query.sql, noisy, self._time_left(), registered,
                                   partial(self._check_engine_reads, query=query))  # fmt: skip
                check_faults(result, query)
                values = values_of(result, query)
                drawn = store.record_query(
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
                caching = noisy is not None
                self._cache_cells(noisy, paid, drawn, again=attempt > 0)
                released = record_release(con, result, query, drawn, self.user)
                counting = True  # a cell of the same user counted first conflicts: run again
                cell_limits.charge_cells(
                    con, context.policy, user=self.user, tables=query.tables, query_id=drawn,
                    fingerprint=query.fingerprint, at=store.now(),
                    versions=self._current_data_version,
                    hidden=partial(hidden_cells, con, query.tree, context.to_sql,
                                   partial(_run_over, con, noisy=noisy,
                                           timeout=self._time_left(), registered=registered,
                                           check=partial(self._check_engine_reads,
                                                         query=query)),
                                   values.num_rows),
                    released=released, known=self._known_cells(),
                )  # fmt: skip
                committing = True
                con.execute(engine.parsed("COMMIT"))
                self._cells_known.add((), (self.user, query.fingerprint))  # answered, committed
                return values, query, drawn, result
            except engine.EngineError as failure:
                engine.rollback(con)
                if committing and self._answered(drawn):  # kept, then the COMMIT raised
                    return values, query, drawn, result
                if (
                    (caching or counting)
                    and cell_conflict(failure)
                    and attempt + 1 < RECORD_RETRIES
                ):
                    time.sleep(0.005 * (attempt + 1))  # a concurrent query cached a cell first
                    continue
                query_id = store.record_query(
                    con,
                    query_id,
                    self.user,
                    context.policy_version,
                    "failed",
                    sql,
                    reason=str(failure),
                    fingerprint=query.fingerprint,
                )
                kept = self._keep_released(noisy, query_id, paid)
                raise self._said_paid(engine_failure(failure, query_id), query_id, kept) from None
            except Error as refusal:
                engine.rollback(con)
                if isinstance(refusal, cell_limits.CellLimitReached):  # before its audit entry
                    cell_limits.end_periods(con, refusal, drawn, store.now())
                kept = self._keep_released(noisy, self._audit_refusal(query_id, sql, refusal),
                                           paid)  # fmt: skip
                self._said_paid(refusal, query_id, kept)
                raise
            except BaseException as bug:  # a bug, or Ctrl-C after a charge: audited all the same
                engine.rollback(con)
                if self._answered(drawn):  # committed just before the interrupt
                    bug.add_note(f"query {drawn} was answered and recorded (audited as "
                                 "accepted) just before the interrupt")  # fmt: skip
                else:
                    self._audit_bug(query_id, sql, bug)
                    self._said_paid(bug, query_id)
                raise
            finally:
                for name in registered:
                    con.unregister(name)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _check_answer_rows(self, query: ProtectedQuery, domains, run) -> None:
        """Refuse, before the charge, a DP statement whose answer may have more rows than a
        connection returns (:data:`MAX_ANSWER_ROWS`): bounded from the stages' cells, the
        public tables' rows and the query's shape (:mod:`~sqlsdc.guard.answer_bound`), never
        from the data, so that no answer is stopped for its rows once it has paid."""
        policy, to_sql = self._context.policy, self._context.to_sql

        def public(table: exp.Table):
            declared = policy.table(table.name)
            if declared is None or not declared.is_public or table.db.lower() not in ("", "main"):
                return None
            count = exp.select(exp.Count(this=exp.Star())).from_(exp.to_table(declared.name))
            rows = run(to_sql(count)).column(0)[0].as_py()
            return rows, frozenset([declared.key.lower()] if declared.key else [])

        cells = stage_cells(query.dp_stages, domains)
        rows = math.inf if query.tree is None else answer_rows(query.tree, cells, public)
        if rows <= MAX_ANSWER_ROWS:
            return
        if rows == math.inf:
            most = ("any number of rows (it reads rows that no bound known before the charge "
                    "covers: another method's cells, UNNEST, a table function)")  # fmt: skip
        else:
            most = (f"up to {int(rows):,} rows (bounded from the public domains, at most "
                    f"{MAX_PRIVATE_GROUPS:,} private groups per aggregation, the public "
                    "tables' rows and the query's joins)")  # fmt: skip
        raise AnswerTooLarge(
            f"the answer could have {most}, more than the {MAX_ANSWER_ROWS:,} a connection "
            "returns; it is refused before the privacy budget is charged: aggregate further, "
            "join the cells on their group keys, add a LIMIT, or ask the DP aggregate in a "
            "statement of its own"
        )


_NOISE_OFF = "dp noise off (admin semantics mode): exact bounded values, not charged"


def _suppression_patterns(con, context: GuardContext, tables) -> None:
    """Make the suppression patterns of ``tables`` match the data, or refuse the query without
    the reason (the administrator's ``sqlsdc publish`` shows it).

    Why: a pattern that cannot be made names the cells it cannot protect with their exact
    values (``{'nace': 'A', 'region': 'R1'} = 2 needs [0, 4] ...``, the solvers' diagnosis for
    an administrator), and the analyst whose query asked for it received that message: a count
    of 2 firms the rules hide, read from the refusal (red team s44n). The refusal is made
    outside the handler, so that no exception the analyst holds carries the diagnosis as its
    context."""
    try:
        ensure_patterns(con, context.policy, context.policy_version, tables)
        return
    except TabularError:
        pass
    raise PolicyViolation(
        f"the suppression pattern of {', '.join(sorted(tables))} cannot be made for the current "
        "data, so none of its cells is published",
        "ask an administrator: `sqlsdc publish` on the database says why",
    )


def _run_over(con, sql: str, noisy: DpRelease | None, timeout: float, registered: list[str],
              check: Callable[[str], None]) -> pa.Table:  # fmt: skip
    """Run the protected SQL over the noisy cells of its DP aggregations, at most
    :data:`MAX_ANSWER_ROWS` rows and :data:`MAX_ANSWER_BYTES` bytes. A few cells of plain
    types go as list parameters (:mod:`~sqlsdc.guard.listed_cells`), that text checked as
    every text is (``check``: :meth:`Connection._check_engine_reads`, with NULL lists in place
    of the parameters, which DuckDB refuses there); others are registered under their
    relations' names, and the names added to ``registered``: the caller unregisters them once
    its transaction has ended (inside a transaction an engine error aborted, DuckDB refuses
    it, and that refusal would replace the error the audit log must keep). The count of a
    cell limit's hidden cells (:func:`~sqlsdc.guard.hidden_cells.hidden_cells`) reads the
    cells through here too: run over unregistered relations, it failed in the engine after
    the charge for every DP query of a derived table, a LIMIT or a HAVING over few cells
    (``SELECT * FROM (SELECT region, COUNT(*) FROM benefits GROUP BY region) t LIMIT 0``,
    what BI tools send to learn the columns: red team s50e)."""
    params = None
    relations = noisy.relations if noisy is not None else {}
    over = listed(sql, relations) if relations else None
    if over is not None:
        sql, checked_text, params = over
        check(checked_text)
    else:
        for name, cells in relations.items():
            if name not in registered:  # the hidden cells' count after the answer: once
                engine.register(con, name, cells)  # a DP SUM of integers as HUGEINT
                registered.append(name)
    return engine.run(con, sql, timeout=timeout, max_rows=MAX_ANSWER_ROWS,
                      max_bytes=MAX_ANSWER_BYTES, params=params)  # fmt: skip
