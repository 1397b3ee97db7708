"""The guarded connection: a PEP 249 connection whose every query is checked and protected.

Threat model: the guard protects SQL-only users (analysts, the CLI, BI tools through a server).
It is not a boundary against code running in the same Python process, which can open the file
itself; real isolation means the confidential file belongs to another OS user or process.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from pathlib import Path

import pyarrow as pa
from sqlglot import exp
from sqlglot.errors import ParseError

from sqlsdc.catalog import store
from sqlsdc.catalog.budget import (
    BudgetState,
    BudgetStatus,
    Charge,
    PolicyChanged,
    budget_status,
    charge,
    check_policy,
    has_charge,
    is_conflict,
    policy_limits,
)
from sqlsdc.catalog.budget_tables import ensure_budget_catalog, remember_budget_tables
from sqlsdc.catalog.dp_cache import cache_cells, cached_cells, released_groups
from sqlsdc.catalog.ptables import load_ptables
from sqlsdc.catalog.setup import unique_columns, unit_index_name
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines import duckdb_schema, duckdb_sql, waiters, watchdog
from sqlsdc.errors import (
    AccessDenied,
    AnswerTooLarge,
    BudgetExhausted,
    Error,
    InterfaceError,
    NotFoundError,
    NotSupportedError,
    OperationalError,
    PolicyViolation,
    ProgrammingError,
    QueryCanceled,
)
from sqlsdc.guard.answer_bound import answer_rows
from sqlsdc.guard.check_cache import CHARACTERS as KEPT_CHARACTERS
from sqlsdc.guard.check_cache import checked, context_fingerprint, is_kept
from sqlsdc.guard.cursor import Cursor
from sqlsdc.guard.dp_release import (
    MAX_PRIVATE_GROUPS,
    DpRelease,
    check_private_keys,
    check_sizes,
    data_versions_of,
    no_rows,
    prefetching,
    price,
    release,
    resolve_domains,
    stage_cells,
)
from sqlsdc.guard.listed_cells import listed
from sqlsdc.guard.pipeline import GuardContext, ProtectedQuery, protect
from sqlsdc.guard.postprocess import (
    check_faults,
    record_release,
    values_of,
)
from sqlsdc.guard.releases import attach_releases, available_releases, with_releases
from sqlsdc.guard.resolve import analyst_schema, readable
from sqlsdc.guard.summable import Checked, check_summable
from sqlsdc.guard.turns import ProcessTurns
from sqlsdc.guard.validate import check_engine_tables
from sqlsdc.jobs.patterns import ensure_patterns
from sqlsdc.policy import Policy, UserRole, load_policy

apilevel = "2.0"
threadsafety = 2  # threads may share a connection: its statements run one after the other
paramstyle = "qmark"

IDLE_RELEASE_SECONDS = 1.0  # a connection idle this long lets other processes open the file
MAX_HOLD_SECONDS = 0.5  # a busy connection that others wait for releases it after this hold
TURN_SECONDS = 0.06  # ... and waits this long before opening it again: other processes' turn
MAX_TURN_SECONDS = 2.0  # ... and after this hold even with no waiter known (one may not have
# been able to mark itself: something else at <db>.waiting); a reopen costs about 15 ms
EARLY_CHECKS = 3  # checks of a statement before the file is taken, when admins apply policies
# meanwhile (the last policy applied is checked under the file if it changed after the last)
RECORD_RETRIES = 20  # a query's recording transaction, when a concurrent one cached a cell first
KEPT_CONSTANT_CHARACTERS = 4096  # longer constants are evaluated each time (_context)
ENGINE_CHECKED_TEXTS = 1024  # protected SQL texts whose engine reads are known, per opening
MAX_ANSWER_ROWS = 1_000_000  # rows one statement may return (a public table's cross join could
MAX_ANSWER_BYTES = 64 * 2**20  # otherwise fill the memory of a process shared by many sessions,
# such as `sqlsdc serve`); the bytes are Arrow's, read batch by batch

_TURNS = ProcessTurns(hold=MAX_HOLD_SECONDS, turn=TURN_SECONDS)  # the whole process's turns
_DATABASE_LOCKS: dict[str, threading.Lock] = {}
_DATABASE_LOCKS_GUARD = threading.Lock()


def _database_lock(path: Path) -> threading.Lock:
    """The lock that serialises this process's writes to the state of one database (catalog
    upgrades on connect, budget charges), so that concurrent connections of the process wait
    for each other instead of failing on the engine's write conflicts."""
    key = str(path.resolve())
    with _DATABASE_LOCKS_GUARD:
        return _DATABASE_LOCKS.setdefault(key, threading.Lock())


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
    """A PEP 249 connection that answers only protected aggregate queries.

    A connection may be shared between threads: its statements then run one at a time (a
    lock around every use of the engine connection). Threads that should run in parallel
    open a connection each."""

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
        self.user = user
        self.path = str(path)
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

    def _open(self) -> None:
        """Open the database file (waiting while another process writes it), and load the
        policy in force, again only when an admin applied a new version since the last open."""
        path = Path(self.path)
        time.sleep(max(0.0, self._turn_until - time.monotonic()))
        key = str(path.resolve())
        _TURNS.wait(key, partial(waiters.others_waiting, path), self._turn_bound())
        con = engine.open_database(path, wait=engine.LOCK_WAIT_SECONDS, writes_data=False,
                                   first=False)  # fmt: skip
        try:
            _TURNS.held(key, con)
            writers = engine.data_writers(path)  # before the policy is read: see _release_dp
            engine.harden(con)
            current = store.current_policy(con, in_transaction=False)
            if current is None:
                raise store.no_catalog(path, con)
            version, document, source = current
            changed = self._context is None or self._context.policy_version != version
            base = load_policy(document, name=source) if changed else self._base_policy
            releases = available_releases(con, base)  # checked on every opening
            attach_releases(con, releases)
            if changed or releases != self._releases:
                self._load_policy(con, version, with_releases(base, releases), releases)
                self._base_policy, self._releases = base, releases
            else:
                remember_budget_tables(con)  # as _load_policy found or made them
        except engine.EngineError:
            con.close()
            _TURNS.closed(key, con)
            raise OperationalError(
                f"cannot open {path.name}: the engine failed while reading the sqlsdc "
                "catalog; the engine's message is withheld; an admin can check the database "
                "with `sqlsdc policy show`"
            ) from None
        except BaseException:
            con.close()
            _TURNS.closed(key, con)
            raise
        self._db, self._turn_key = con, key  # the key closes as it opened (a chdir since)
        self._held_since = time.monotonic()
        self._data_versions: dict[str, str] = {}  # the data may have changed while released
        self._engine_checked: set[str] = set()  # ... and the catalog (_check_engine_reads)
        self._key_types: dict = {}  # of DP stages run on this opening (dp_release.release)
        self._summable: Checked = {}  # columns scanned on this opening (_check_summable)
        self._summable_writers: int | None = None  # engine.data_writers when they were scanned
        # engine.data_writers when the policy in force was read (just now: the opening's
        # first DP query need not read it again) and the data versions
        self._writers: int | None = writers
        self._prf_key: bytes | None = None  # read when a DP query needs it (_secret)
        self._budget = BudgetState()  # what its last charge read of the budget tables

    def _load_policy(self, con, version: int, policy: Policy, releases=None) -> None:
        declared = policy.user(self.user)
        if declared is None:
            raise AccessDenied(
                f"user {self.user!r} is not declared in the policy of {Path(self.path).name}; "
                "ask an admin to add it under `users:`"
            )
        timeout = _statement_timeout(policy, self._asked_timeout)
        context = _context(con, policy, version, timeout, Path(self.path), releases or {})
        with _database_lock(Path(self.path)):
            ensure_budget_catalog(con)  # brings a cache of DP cells from older versions
            store.ensure_mix_keys(con)  # catalogs made before statistic keys were secret
        self._timeout, self._context = timeout, context
        self.policy, self.role = policy, declared.role
        if self.role is not UserRole.ADMIN:
            self._dp_noise = True

    @property
    def _con(self):
        """The engine connection, opening the file again if it was released while idle."""
        with self._lock:
            self._check_open()
            if self._db is None:
                self._open()
            return self._db

    @contextmanager
    def _holding(self):
        """Use the engine connection alone (other threads wait), then schedule its release.
        Nested uses (the Spark path explains and charges while it holds the connection) leave
        that to the outermost: a turn given in between would close the engine connection the
        outer use still runs on."""
        with self._lock:
            self._depth += 1
            try:
                yield self._con
            finally:
                self._depth -= 1
                if not self._depth:
                    self._schedule_release()

    def _schedule_release(self) -> None:
        """Release the file ``idle_release`` seconds after the last statement, so that other
        processes and admin commands can open it while this connection is idle. Called with
        the lock held. One watchdog alarm per connection looks at the time of the last
        statement when it comes due (:meth:`_release_if_idle`), so a statement only notes its
        time and sets no timer of its own."""
        self._last_use = time.monotonic()
        if self._reopen and self._db is not None:
            self._reopen = False
            self._close_engine()  # the next statement opens the file and reads the new policy
            return
        if self._idle_release is None or self._closed:
            return
        held = self._last_use - self._held_since if self._db is not None else 0.0
        if self._db is not None and (
            held > MAX_TURN_SECONDS
            or (held > MAX_HOLD_SECONDS and waiters.others_waiting(self.path))
            or waiters.others_waiting(self.path, first=True)
        ):  # busy for long, or for a while with others waiting, or an admin waits: a turn
            self._close_engine()
            self._turn_until = time.monotonic() + TURN_SECONDS
            return
        if self._alarm is None:
            self._alarm = watchdog.after(self._idle_release,
                                         partial(_release_idle, weakref.ref(self)))  # fmt: skip

    def _release_if_idle(self) -> None:
        """The idle alarm's action, on the watchdog thread: close the engine connection if no
        statement ran for ``idle_release`` seconds, else look again when that many will have
        passed. It never waits for the lock (the watchdog also interrupts statements): while
        a statement holds it, it looks again later."""
        again = partial(_release_idle, weakref.ref(self))
        if not self._lock.acquire(blocking=False):
            self._alarm = watchdog.after(self._idle_release, again)
            return
        try:
            idle = time.monotonic() - self._last_use
            if self._closed or self._db is None:
                self._alarm = None
            elif idle >= self._idle_release:
                self._close_engine()
                self._alarm = None
            else:
                self._alarm = watchdog.after(self._idle_release - idle, again)
        finally:
            self._lock.release()

    def _turn_bound(self) -> float:
        """How long an opening waits for the process's turn (:mod:`sqlsdc.guard.turns`): a
        statement timeout, within which the process's running statements end."""
        return min(self._timeout or engine.LOCK_WAIT_SECONDS, engine.LOCK_WAIT_SECONDS)

    def _close_engine(self) -> None:
        """Close the engine connection (the lock held); what was read for this opening only,
        the PRF key among it, is dropped with it. The process's turns hear of it once the file
        is let go: a turn counted from the start of a close (DuckDB's checkpoint, slower than
        the turn on a busy machine) ended before the file was free (red team s37)."""
        db, self._db, self._prf_key = self._db, None, None
        try:
            db.close()
        finally:
            _TURNS.closed(self._turn_key, db)

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
        """``{table: {column: type}}`` as the guard resolves names: the policy's view."""
        return {table: dict(columns) for table, columns in self._context.schema.items()}

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
                raise _engine_failure(failure, None) from None
        if self.role is UserRole.ADMIN:
            return stored
        return {
            name: {c: kind for c, kind in columns.items() if not c.startswith("__")}
            for name, columns in stored.items()
            if readable(self.policy, exp.table_(name, db=schema))
        }

    def remaining_budget(self) -> list[BudgetStatus]:
        """The privacy budgets that apply to this user: limit, spent and remaining."""
        with self._holding() as con:
            try:
                return budget_status(con, policy_limits(self.policy), user=self.user)
            except engine.EngineError as failure:
                raise _engine_failure(failure, None) from None

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
        sql = _statement_text(sql)
        with self._holding():
            try:
                query = self._protect(sql, parameters)
                self._check_engine_texts(query)  # what running it would refuse, explain refuses
                return query.detached()
            except engine.EngineError as failure:
                raise _engine_failure(failure, None) from None

    def verify(self, sql: str, *, mode: str | None = None, epsilon=None):
        """Compare an aggregate or OLS query on a released synthetic output with the
        confidential data (McClure and Reiter's verification server, :mod:`sqlsdc.synth.verify`):
        a noisy fidelity measure charged ``epsilon`` per cell to this user's budget (``noisy``,
        analysts' only mode), or its decile interval (``interval``, admins only, their
        default). Audited and cached like any query."""
        from sqlsdc.synth.verify import verify

        sql, mode = _statement_text(sql), _built_in_text(mode)  # a str subclass's __eq__ chose
        with self._holding() as con:  # interval mode past the analysts' check, free
            try:
                return verify(con, sql, user=self.user, policy=self.policy,
                              policy_version=self.policy_version, secret=self._secret(), mode=mode,
                              epsilon=epsilon, lock=_database_lock(Path(self.path)),
                              timeout=self.timeout)  # fmt: skip
            except engine.EngineError as failure:
                raise _engine_failure(failure, self._record_failure(sql, failure)) from None

    def pram_counts(self, sql: str):
        """Unbiased counts from a released anonymised output whose group key was PRAMmed:
        ``SELECT keys..., COUNT(*) FROM output [WHERE ...] GROUP BY keys...`` answered with
        each observed count weighted by the inverse of the stored PRAM matrix
        (:mod:`sqlsdc.microdata.pram_estimate`); the rewritten query runs through the guard
        like any other. Returns a cursor."""
        import json

        import sqlglot

        from sqlsdc.microdata.pram_estimate import corrected_counts, pram_matrices

        sql = _statement_text(sql)
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

    def _protect(
        self, sql: str, params, early: _Early | None = None, interrupts: int | None = None
    ) -> ProtectedQuery:
        """``protect``, shared with every connection of the process that sees the same policy
        version, schema and catalog (``check_cache``). The statement timeout starts here, less
        the time ``early`` (:meth:`_check_early`) took: the check counts against it and stops
        at the first pass that begins after it, and the engine gets what is left
        (:meth:`_time_left`). ``early``'s outcome stands if it was reached under the context
        in force now; otherwise (an admin applied another policy meanwhile) the statement is
        checked again. ``interrupts``: the connection's count of :meth:`interrupt` calls when
        the statement began; one since (during its early check, or while it waited for the
        file or the lock) stops it."""
        context = self._context
        self._deadline = time.monotonic() + self.timeout - (early.took if early else 0.0)
        if interrupts is not None and interrupts != self._interrupts:
            self._deadline = 0.0  # cancelled before it took the file
        if early is not None and early.context is context:
            query = early.outcome()
        else:
            query = self._checked(sql, params, context, self._time_left)
        self._time_left()
        return query

    def _checked(self, sql: str, params, context: GuardContext, time_left) -> ProtectedQuery:
        """``protect``, through the check cache when the parameters can key it; ``time_left()``
        says how many seconds the statement has left, and raises when none are (it stops the
        check between passes, and bounds the evaluation of each constant)."""
        frozen = _frozen(params)
        token = _TIME_LEFT.set(time_left)
        try:
            if frozen is _UNCACHEABLE:
                return protect(sql, params, context, time_left)
            return checked(sql, params, frozen, context, time_left)
        finally:
            _TIME_LEFT.reset(token)

    def _in_force(self, context: GuardContext) -> bool:
        """Whether ``context`` is the one in force, the file opened to know it (an opening
        reads a policy applied since). When it is not, the file is let go again, so that the
        statement is checked anew under the new policy as it was under the old one: while no
        other process or thread waits for this connection (red team s37: a check under the
        file after each apply kept every other process waiting for it)."""
        with self._lock:
            self._con  # noqa: B018 - opens the file if it was let go, reading the policy
            if self._context is context:
                return True
            if not self._depth:
                self._close_engine()
            return False

    def _check_early(self, sql: str, params, interrupts: int, took: float = 0.0) -> _Early | None:
        """The statement checked before the connection takes the database file or its own
        lock, under the context of the last opening, so that no other process or thread
        waits while a statement is parsed and checked (constants are evaluated apart from the
        file, :func:`~sqlsdc.engines.duckdb.evaluate_constant`). A refusal is kept, to be
        audited under the file. Nothing is done for a statement the check cache holds, nor on
        a closed connection. An :meth:`interrupt` after ``interrupts`` of them stops it.
        ``took``: seconds the statement's earlier checks took (under a policy replaced since),
        which count against its timeout too."""
        context, started = self._context, time.monotonic() - took
        if context is None or self._closed:
            return None
        frozen = _frozen(params)
        if frozen is not _UNCACHEABLE and context.fingerprint and is_kept(sql, frozen, context):
            return None
        deadline = started + self.timeout

        def time_left() -> float:
            left = deadline - time.monotonic()
            if left <= 0 or self._interrupts != interrupts:
                raise _timeout_error("")
            return left

        try:
            query, refusal = self._checked(sql, params, context, time_left), None
        except Error as e:
            query, refusal = None, e
        return _Early(context, time.monotonic() - started, query, refusal)

    def _time_left(self) -> float:
        """Seconds left of the statement timeout; stops the statement when none are."""
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise _timeout_error("") from None  # like the engine's timeout: no context shown
        return left

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

    def audit_refusal(self, sql: str, refusal: Error) -> int | None:
        """Audit a refusal of ``sql`` decided beside :meth:`execute`, in the entry
        :meth:`execute` writes for its own: the server's catalog refusing a statement, or the
        guard's plan (:meth:`explain`, which audits nothing) refusing one at a protocol
        Describe; an analyst's every refusal leaves an entry (red team s35b). Returns the
        query id, or None on a closed connection (the refusal stands either way)."""
        sql = _statement_text(sql)
        if self._closed:
            return None
        try:
            with self._holding():
                return self._audit_refusal(None, sql, refusal)
        except InterfaceError:  # closed meanwhile, by the session's end
            return None
        except engine.EngineError as failure:
            raise _engine_failure(failure, None) from None

    def commit(self) -> None:
        """Queries are read-only and their audit entries are committed as they run."""

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

    def _audit_refusal(self, query_id: int | None, sql: str, refusal: Error) -> int:
        """Audit a refused statement under ``query_id`` (None: a new id); returns the id.

        A policy's refusal and an exhausted budget are logged as the analyst read them (the
        budget's began "BudgetExhausted: ", unlike every other refusal: new user s40j); other
        errors with their kind."""
        reason = (
            str(refusal)
            if isinstance(refusal, PolicyViolation | BudgetExhausted)
            else (f"{type(refusal).__name__}: {refusal}")
        )
        if getattr(refusal, "detail", None):
            reason += f" [{refusal.detail}]"
        return store.record_query(
            self._con,
            query_id,
            self.user,
            self._context.policy_version,
            "refused",
            sql,
            reason=reason,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the connection is closed")

    def _execute(self, sql: str, params):
        """``_run``, with every engine error that escapes it (an audit write, transaction
        control, a catalog read) turned into sqlsdc's own message; the engine's text goes to
        the audit log only, so what an analyst sees never depends on the engine's wording."""
        sql = _statement_text(sql)
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
                query_id = self._record_failure(sql, failure)
                raise _engine_failure(failure, query_id) from None

    def _record_failure(self, sql: str, failure: Exception) -> int | None:
        """Best effort: the audit entry of an engine failure outside a query's own recording:
        the outcome of the DP charge the statement made, if it has none yet, else a new
        entry."""
        try:
            self._con.execute("ROLLBACK")
        except engine.EngineError:
            pass  # no transaction was open
        try:
            query_id = self._query_id
            if query_id is not None and store.has_outcome(self._con, query_id):
                query_id = None
            reason = f"{type(failure).__name__}: {failure}"
            return store.record_query(self._con, query_id, self.user,
                                      self._context.policy_version, "failed", sql,
                                      reason=reason)  # fmt: skip
        except engine.EngineError:
            return None

    def _run(
        self, sql: str, params, early: _Early | None = None, interrupts: int | None = None
    ) -> tuple[pa.Table, ProtectedQuery, int, pa.Table]:
        """Protect, execute, record; results are returned only after they are recorded: the
        audit entry (which draws the query id) and the ledger rows commit in one transaction.
        Returns the values, the checked query, its id and the whole result (with the hidden
        status and accuracy columns, read when the cursor is asked for them).

        A DP query's charge commits first, with an audit entry that its outcome replaces
        (:func:`~sqlsdc.catalog.budget.charge`): whatever stops the statement after that (an
        error, the timeout, Ctrl-C, a kill), the charge has its entry, and the analyst is told
        that the statement was charged (asking it again is free)."""
        self._check_open()
        self._query_id = None  # a DP query's charge draws it, before the charge commits
        con, context = self._con, self._context
        try:
            query = self._protect(sql, params, early, interrupts)
            self._check_summable(query)
        except engine.EngineError as failure:
            query_id = store.record_query(con, None, self.user, context.policy_version,
                                          "failed", sql, reason=str(failure))  # fmt: skip
            raise _engine_failure(failure, query_id) from None
        except Error as refusal:  # refusals, guard bugs and bad parameters are all audited
            self._audit_refusal(None, sql, refusal)
            raise
        noisy, paid = None, None
        if query.dp_stages:
            try:
                noisy, paid = self._release_dp(query, None, sql)  # charged (committed) from here
            except engine.EngineError as failure:
                query_id = store.record_query(
                    con, self._query_id, self.user, context.policy_version, "failed", sql,
                    reason=str(failure), fingerprint=query.fingerprint,
                )  # fmt: skip
                raise self._said_paid(_engine_failure(failure, query_id), query_id) from None
            except Error as refusal:  # the timeout's check or a cancel among them
                self._audit_refusal(self._query_id, sql, refusal)
                self._said_paid(refusal, self._query_id)
                raise
            except BaseException as bug:  # paid (perhaps), Ctrl-C too: never unaudited
                self._audit_bug(self._query_id, sql, bug)
                self._said_paid(bug, self._query_id)
                raise
        return self._answer(sql, query, noisy, paid, self._query_id)

    def _answer(self, sql: str, query: ProtectedQuery, noisy: DpRelease | None,
                paid: Charge | None, query_id: int | None):  # fmt: skip
        """Run the protected SQL and record it in one transaction (``query_id`` None: the
        audit entry draws it): the answer, its audit entry, its ledger rows and the DP cells
        it drew (:meth:`_cache_cells`) commit together or not at all; a conflict on a cached
        cell runs the transaction again. An interrupt that arrives as the transaction commits
        leaves the answer recorded (and says so), never a second, "failed" entry."""
        con, context = self._con, self._context
        for attempt in range(RECORD_RETRIES):
            caching = False  # set once the analyst's SQL has run, when DP cells are cached
            drawn = query_id  # the audit entry's id, once known
            registered: list[str] = []  # the noisy cells' views, to let go after the end
            con.execute(engine.parsed("BEGIN TRANSACTION"))  # parsed once: 0.02 ms each
            try:
                if query.suppressed:
                    ensure_patterns(con, context.policy, context.policy_version, query.suppressed)
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
                record_release(con, result, query, drawn, self.user)
                con.execute(engine.parsed("COMMIT"))
                return values, query, drawn, result
            except engine.EngineError as failure:
                engine.rollback(con)
                if caching and _cell_conflict(failure) and attempt + 1 < RECORD_RETRIES:
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
                self._keep_released(noisy, query_id)
                raise self._said_paid(_engine_failure(failure, query_id), query_id) from None
            except Error as refusal:
                engine.rollback(con)
                self._keep_released(noisy, self._audit_refusal(query_id, sql, refusal))
                self._said_paid(refusal, query_id)
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

    def _keep_released(self, noisy: DpRelease | None, query_id: int | None) -> None:
        """Best effort, after an answer that failed once its DP cells were drawn (an answer
        over the byte cap, the timeout): cache the groups private selections released and
        their cells, which the answer's transaction did not keep. Their statistics are paid,
        and asked again the stage is answered from them without its exact cells: else an
        answer made to fail each time (a long literal beside the cells) computed them at
        every asking, timed for free (red team s37b). The values are those any asking draws
        (the noise is a function of the cell)."""
        if noisy is None or not noisy.releases or not self._dp_noise or query_id is None:
            return
        con = self._con
        try:
            con.execute(engine.parsed("BEGIN TRANSACTION"))
            cache_cells(con, user=self.user, policy_version=self._context.policy_version,
                        query_id=query_id, cells=noisy.cells, again=True,
                        releases=noisy.releases)  # fmt: skip
            con.execute(engine.parsed("COMMIT"))
        except engine.EngineError:
            engine.rollback(con)

    def _answered(self, query_id: int | None) -> bool:
        """Best effort: whether ``query_id``'s outcome is in the audit log (its recording
        committed)."""
        try:
            return query_id is not None and store.has_outcome(self._con, query_id)
        except engine.EngineError:
            return False

    def _paid(self, query_id: int | None) -> bool:
        """Best effort: whether ``query_id`` was charged (its charge committed)."""
        try:
            return query_id is not None and has_charge(self._con, query_id)
        except engine.EngineError:
            return False

    def _said_paid(self, stopped: BaseException, query_id: int | None) -> BaseException:
        """``stopped`` (an error, Ctrl-C: changed in place), saying that its statement was
        charged if it was: sqlsdc's errors in their message (what the CLI and a server's
        client show), others in a note."""
        if self._paid(query_id):
            said = f"query {query_id} {_PAID}"
            if isinstance(stopped, Error) and len(stopped.args) == 1:
                stopped.args = (f"{stopped.args[0]}; {said}",)
            else:
                stopped.add_note(said)
        return stopped

    def _audit_bug(self, query_id: int | None, sql: str, bug: BaseException) -> None:
        """Best effort: a ``failed`` audit entry for an error sqlsdc did not foresee (a bug)
        or an interrupt (Ctrl-C), so that no query, and no paid DP query above all, goes
        unrecorded."""
        try:
            store.record_query(self._con, query_id, self.user, self._context.policy_version,
                               "failed", sql, reason=store.audit_reason(bug))  # fmt: skip
        except engine.EngineError:
            pass

    def _check_engine_texts(self, query: ProtectedQuery) -> None:
        """:meth:`_check_engine_reads` of every text the query runs: its DP stages' and its
        answer's."""
        for text in (*(stage.sql for stage in query.dp_stages), query.sql):
            self._check_engine_reads(text, query)

    def _check_engine_reads(self, sql: str, query: ProtectedQuery) -> None:
        """Defence in depth: the tables DuckDB says ``sql`` reads are declared in the policy
        (:func:`~sqlsdc.guard.validate.check_engine_tables`). DuckDB's answer depends on the
        text and on the catalog (it expands views), so a text that passed is not asked again
        while the file stays open: no other process can change the catalog meanwhile, and
        every opening starts afresh (:meth:`_open`).

        DuckDB may refuse the text there (its binding of constants alone: ``age BETWEEN '3'
        AND 5``, which running the statement would bind): no data is read, so whatever the
        data hold the statement is refused, with sqlsdc's own message (the engine's text goes
        to the audit log only)."""
        if sql in self._engine_checked:
            return
        try:
            read = duckdb_schema.tables_read_by(self._con, sql)
        except engine.TextRefusal as refusal:
            violation = (
                PolicyViolation(
                    "DuckDB refuses the text of this statement before reading any data: its "
                    "expressions nest deeper than DuckDB's limit (max_expression_depth), so it "
                    "is refused whatever the data hold",
                    "join fewer tables or nest fewer expressions in one statement",
                    sql,
                )
                if "expression depth" in str(refusal)
                else PolicyViolation(
                    "DuckDB refuses the text of this statement before reading any data (its "
                    "constants cannot be bound together, e.g. the bounds of age BETWEEN '3' "
                    "AND 5 are written in two types), so it is refused whatever the data hold",
                    "write the values of one comparison in one type, e.g. age BETWEEN 3 AND 5",
                    sql,
                )
            )
            violation.detail = f"{type(refusal).__name__}: {refusal}"
            raise violation from None
        check_engine_tables(read, query.tree, self.policy)
        if len(sql) > KEPT_CHARACTERS // 64:
            return  # asked again each time, like the check cache (not kept: memory)
        if len(self._engine_checked) >= ENGINE_CHECKED_TEXTS:
            self._engine_checked.clear()
        self._engine_checked.add(sql)

    def _check_summable(self, query: ProtectedQuery) -> None:
        """Refuse a query that sums a floating-point column holding NaN, infinities or huge
        values (:mod:`sqlsdc.guard.summable`), before anything is charged or run. The scan's
        answer is kept while the data cannot have changed: for this opening of the file, while
        no connection of this process that may write data has opened it (as data versions)."""
        if not query.summed:
            return
        writers = engine.data_writers(self.path)
        if writers is None or writers != self._summable_writers:
            self._summable.clear()
            self._summable_writers = writers
        con, to_sql = self._con, self._context.to_sql

        def run(tree: exp.Select) -> pa.Table:
            return engine.run(con, to_sql(tree), timeout=self._time_left())

        check_summable(query.summed, self._summable, run)

    def _release_dp(
        self, query: ProtectedQuery, query_id: int | None, sql: str, *, run=None,
        data_version=None,
    ) -> tuple[DpRelease, Charge | None]:  # fmt: skip
        """Noisy cells of the query's DP aggregations, their cost charged to the ledger first,
        and the charge (None when every statistic was paid before). ``query_id`` None: the
        charge draws it (left in ``_query_id`` for the audit entry before the charge commits,
        so also when this raises, Ctrl-C included), or else the audit entry. The charge writes
        the query's audit entry (``sql``) with its ledger row, which the outcome replaces.
        The drawn cells are cached by :meth:`_cache_cells`.

        Order matters (ISSUE16 must-have 6): the statistics not paid before are charged and
        committed *before* any exact cell is computed, so a query that then fails, is
        interrupted or times out has paid; only the public domains and the tables' data
        versions are read before. Whatever the query, the policy and the public domains decide
        is decided before the charge, so that no refusal comes after it: DuckDB's reading of
        every text (the answer's too), the size of quantiles
        (:func:`~sqlsdc.guard.dp_release.check_sizes`), the most rows the answer can have
        (:meth:`_check_answer_rows`) and the types of private group keys
        (:func:`~sqlsdc.guard.dp_release.check_private_keys`, from the cells' SQL with no
        row). The drawn cells are cached afterwards (free), with the answer. The noise is
        drawn under the statement's timeout (a quantile's draw included, which the engine's
        interrupt does not reach): stopped there, the query has paid, as one stopped while
        the engine computed its exact cells.

        ``run`` (SQL text -> Arrow) and ``data_version`` (table -> version) default to this
        connection's DuckDB; the Spark path passes its engine's (:mod:`sqlsdc.guard.spark`)."""
        con, context = self._con, self._context
        self._check_engine_texts(query)  # the answer's text too: refused unpaid
        version = context.policy_version
        writers = engine.data_writers(self.path)
        if writers is None or writers != self._writers:  # written in this process, perhaps
            try:  # a policy applied there: its cache answers nothing at the old version
                check_policy(con, version)
            except PolicyChanged:
                self._reopen = True
                raise
            self._data_versions.clear()
            self._key_types.clear()
            self._writers = writers

        key_types = None  # known for DuckDB's stages (Spark's types are its own)
        if run is None:
            key_types = self._key_types
            if len(key_types) >= ENGINE_CHECKED_TEXTS:
                key_types.clear()

            def run(text: str):
                return engine.run(con, text, timeout=self._time_left())

        data_version = data_version or self._data_version

        declared = context.policy.table
        data_versions = data_versions_of(query.dp_stages, data_version,
                                         lambda name: declared(name) is not None)  # fmt: skip
        domains = resolve_domains(query.dp_stages, run)  # public values only
        check_sizes(query.dp_stages, domains)  # decided before the charge, never after
        self._check_answer_rows(query, domains, run)
        check_private_keys(query.dp_stages, lambda stage: run(context.to_sql(no_rows(stage))),
                           key_types)  # fmt: skip
        cached = prefetching(lambda digests: cached_cells(con, self.user, version, digests),
                             query.dp_stages, data_versions=data_versions,
                             domains=domains)  # fmt: skip
        lock = _database_lock(Path(self.path))  # charges of this process wait for each other
        paid = None
        if self._dp_noise:
            with lock:  # priced under it too: threads asking the same statistic pay it once
                cost = price(query.dp_stages, data_versions=data_versions, domains=domains,
                             paid=cached)  # fmt: skip
                try:
                    paid = charge(con, user=self.user, tables=query.tables, cost=cost.cost,
                                  query_id=query_id, limits=policy_limits(context.policy),
                                  cells=cost.statistics, policy_version=version,
                                  state=self._budget, sql=sql, fingerprint=query.fingerprint,
                                  drawn=partial(setattr, self, "_query_id"))  # fmt: skip
                except PolicyChanged:  # applied by this process: the file stays open
                    self._reopen = True
                    raise
        noisy = release(query.dp_stages, run, secret=self._secret(), policy_version=version,
                        data_versions=data_versions, cached=cached, noise=self._dp_noise,
                        domains=domains, key_types=key_types, time_left=self._time_left,
                        released=lambda digest: released_groups(con, self.user, version,
                                                                digest),
                        describe=lambda stage: run(context.to_sql(no_rows(stage))))  # fmt: skip
        return noisy, paid

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
            "join the cells on their group keys, or add a LIMIT"
        )

    def _cache_cells(
        self, noisy: DpRelease | None, paid: Charge | None, query_id: int, *, again=False
    ) -> None:
        """Cache the cells a DP query drew (and count them on its charge), in the transaction
        that records its answer (:func:`~sqlsdc.catalog.dp_cache.cache_cells`)."""
        if noisy is None or not self._dp_noise or not (noisy.cells or noisy.releases or paid):
            return
        cache_cells(self._con, user=self.user, policy_version=self._context.policy_version,
                    query_id=query_id, cells=noisy.cells, paid_by=paid, again=again,
                    releases=noisy.releases)  # fmt: skip

    def _secret(self) -> bytes:
        """The PRF key, read once per opening of the file (kept in memory only, as the
        engine's own pages hold it; never logged)."""
        if self._prf_key is None:
            self._prf_key = _secret(self._con)
        return self._prf_key

    def _data_version(self, table: str) -> str:
        """A fingerprint of the table's rows, part of every DP cell's identity: the same cell
        over changed data gets fresh noise (and a new charge), never the old noise on a new
        value. Computed once per opening of the file (while it is open, DuckDB locks it against
        other processes' writers), and again after a connection of this process that may write
        data opened it (:meth:`_release_dp`)."""
        if table not in self._data_versions:
            self._data_versions[table] = duckdb_schema.data_version(self._con, table)
        return self._data_versions[table]


def _release_idle(connection: weakref.ref) -> None:
    """The idle alarm's action; the alarm holds the connection weakly, so that a connection
    the program dropped is closed by the garbage collector as before."""
    alive = connection()
    if alive is not None:
        alive._release_if_idle()


_NOISE_OFF = "dp noise off (admin semantics mode): exact bounded values, not charged"


def _secret(con) -> bytes:
    row = engine.one(con, f"SELECT material FROM {store.S}.secrets WHERE name = 'prf'")
    if row is None:
        raise Error("this database has no PRF secret; an admin must re-apply the policy")
    return bytes(row[0])


def _run_over(con, sql: str, noisy: DpRelease | None, timeout: float, registered: list[str],
              check: Callable[[str], None]) -> pa.Table:  # fmt: skip
    """Run the protected SQL over the noisy cells of its DP aggregations, at most
    :data:`MAX_ANSWER_ROWS` rows and :data:`MAX_ANSWER_BYTES` bytes. A few cells of plain
    types go as list parameters (:mod:`~sqlsdc.guard.listed_cells`), that text checked as
    every text is (``check``: :meth:`Connection._check_engine_reads`, with NULL lists in place
    of the parameters, which DuckDB refuses there); others are registered under their
    relations' names, and the names added to ``registered``: the caller unregisters them once
    its transaction has ended (inside a transaction an engine error aborted, DuckDB refuses
    it, and that refusal would replace the error the audit log must keep)."""
    params = None
    relations = noisy.relations if noisy is not None else {}
    over = listed(sql, relations) if relations else None
    if over is not None:
        sql, checked_text, params = over
        check(checked_text)
    else:
        for name, cells in relations.items():
            engine.register(con, name, cells)  # a DP SUM of integers as HUGEINT
            registered.append(name)
    return engine.run(con, sql, timeout=timeout, max_rows=MAX_ANSWER_ROWS,
                      max_bytes=MAX_ANSWER_BYTES, params=params)  # fmt: skip


@dataclass(frozen=True)
class _Early:
    """A statement checked under ``context`` before the database file was taken, in ``took``
    seconds: its checked query, or the refusal its check raised."""

    context: GuardContext
    took: float
    query: ProtectedQuery | None
    refusal: Error | None

    def outcome(self) -> ProtectedQuery:
        """The checked query; raises the check's refusal."""
        if self.refusal is not None:
            raise self.refusal
        return self.query


def _statement_text(sql) -> str:
    """The statement as a built-in str (:func:`_built_in_text`); anything else is the
    caller's mistake, said as such (PEP 249's ProgrammingError), not an internal error."""
    if not isinstance(sql, str):
        raise ProgrammingError(
            f"a statement must be a str, not {type(sql).__name__}: pass the SQL text "
            "(bytes: decode them first)"
        )
    return _built_in_text(sql)


def _built_in_text(sql):
    """A statement given as a str subclass, as a built-in str: the subclass's own ``__eq__``
    and ``__hash__`` made the check cache answer it with another statement's check, so the
    audit log recorded one text beside another statement's answer."""
    return str.__str__(sql) if isinstance(sql, str) else sql


_TIME_LEFT: ContextVar[Callable[[], float]] = ContextVar("sqlsdc_check_time_left")
"""Seconds the statement being checked (in this thread) has left; raises when none are."""

_UNCACHEABLE = object()  # parameters that cannot be a key of the check cache
_KEYED_PARAMETERS = (type(None), list, tuple, dict)


def _frozen(params):
    """``params`` as a hashable key of the check cache (:func:`_freeze`), or
    :data:`_UNCACHEABLE` (the check then binds them, and refuses what it cannot bind: a value
    whose ``repr`` fails, an int of more digits than Python writes out). Only a built-in
    list, tuple or dict is a key: a subclass may iterate over other values than it binds
    (``__getitem__``), and its check, kept under the key of the values it iterates, answered
    other connections of the process that bound those (cache poisoning)."""
    if type(params) not in _KEYED_PARAMETERS:
        return _UNCACHEABLE
    try:
        frozen = _freeze(params)
        hash(frozen)
    except Exception:  # noqa: BLE001 - the analyst's objects: any error makes no cache key
        return _UNCACHEABLE
    return frozen


def _freeze(params):
    """The parameters as a key of the check cache: each value with its type and spelling, as
    Python's equality would take ``1``, ``1.0``, ``True`` and ``Decimal('1.00')`` for one value
    and the cache would then run the statement checked with another literal
    (``CAST(? AS VARCHAR)`` is ``'1'``, ``'1.0'`` or ``'true'``)."""
    if params is None:
        return None
    if isinstance(params, dict):
        return tuple(sorted((k, type(v), repr(v)) for k, v in params.items()))
    return tuple((type(v), repr(v)) for v in params)


def _statement_timeout(policy: Policy, asked: float | None) -> float:
    """The policy's statement timeout, or a shorter one asked for by the connection."""
    limit = policy.statement_timeout
    if asked is None:
        return limit
    if isinstance(asked, bool) or not isinstance(asked, (int, float)):
        raise ProgrammingError(f"timeout must be a positive number of seconds, got {asked!r}")
    asked = float(asked)  # once: a subclass's comparisons and __float__ may disagree
    if not asked > 0:
        raise ProgrammingError(f"timeout must be a positive number of seconds, got {asked!r}")
    if asked > limit:
        raise AccessDenied(
            f"timeout {asked!r} s is above the policy's statement timeout of {limit:g} s; a "
            "connection may only shorten it (an admin sets `limits: {statement_timeout_seconds: "
            "..}` in the policy)"
        )
    return asked


def _context(
    con, policy: Policy, version: int, timeout: float, path: Path, releases=None
) -> GuardContext:
    """The guard's view of the database; ``releases``: the columns of the released outputs
    (:mod:`sqlsdc.guard.releases`).

    Constants are evaluated apart from the file
    (:func:`~sqlsdc.engines.duckdb.evaluate_constant`), so a check holds no file, and within
    the statement's time (:data:`_TIME_LEFT`): a check of many constants stops at its
    deadline instead of giving each constant the whole timeout. An evaluation the timeout
    (or a cancel) interrupted says nothing about the constant: the statement is stopped, and
    nothing is cached."""
    tables = duckdb_schema.described(con, [t.name for t in policy.tables.values()])
    stored = {
        table: {column.lower(): dtype for column, dtype, _key in columns}
        for table, columns in tables.items()
    }
    schema = analyst_schema(policy, {**stored, **(releases or {})})
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
    constrained = any(key for columns in tables.values() for _c, _t, key in columns)

    def evaluates(sql: str) -> str | None:
        if len(sql) > KEPT_CONSTANT_CHARACTERS:  # 1,024 constants of a megabyte: a gigabyte
            return evaluates_once(sql)
        return kept_evaluates(sql)

    def evaluates_once(sql: str) -> str | None:
        try:
            return engine.evaluate_constant(sql, _TIME_LEFT.get(lambda: timeout)())
        except engine.duckdb.InterruptException:
            raise _timeout_error("") from None
        except engine.EngineError:
            return None

    kept_evaluates = lru_cache(maxsize=1024)(evaluates_once)

    def constant_type(node: exp.Expr) -> exp.DataType | None:
        if node.find(exp.Subquery, exp.Select, exp.Table, exp.Column):
            # not a constant; its own scope is checked
            return node.type or exp.DataType.build("UNKNOWN")
        name = evaluates(duckdb_sql.to_sql(exp.select(node.copy())))
        return None if name is None else _engine_type(name)

    context = GuardContext(
        policy=policy,
        policy_version=version,
        schema=schema,
        unit_per_row=unit_per_row,
        unique_columns=unique_columns(con, constraints=constrained),
        constant_type=constant_type,
        to_sql=duckdb_sql.to_sql,
        ptables=load_ptables(con, policy),
    )
    fingerprint = context_fingerprint(str(path.resolve()), context, engine.duckdb.__version__)
    return replace(context, fingerprint=fingerprint)


@lru_cache(maxsize=256)
def _engine_data_type(name: str) -> exp.DataType:
    try:
        return exp.DataType.build(name, dialect="duckdb")
    except (ValueError, ParseError):  # a type sqlglot cannot read: no family, no shape
        return exp.DataType.build("UNKNOWN")


def _engine_type(name: str) -> exp.DataType:
    """sqlglot's type for the engine's type name of a constant (a copy: types are nodes)."""
    return _engine_data_type(name).copy()


def _timeout_error(where: str) -> QueryCanceled:
    """A statement stopped by its timeout or by :meth:`Connection.interrupt`: the engine stops
    both alike, and one interrupt stops every statement begun on a shared connection, so the
    message names both causes."""
    return QueryCanceled(
        f"the query was stopped because it ran longer than the statement timeout or was "
        f"cancelled{where}; if it timed out, narrow it, or ask an admin about the policy's "
        "`limits.statement_timeout_seconds`"
    )


def _cell_conflict(failure: Exception) -> bool:
    """Whether sqlsdc's own writes after the analyst's SQL failed because a concurrent query of
    the same user cached one of the same DP cells first (retrying is then safe): the cache's
    key, at its INSERT or at COMMIT. An error of the analyst's SQL is never run again."""
    kinds = (engine.duckdb.TransactionException, engine.duckdb.ConstraintException)
    return isinstance(failure, kinds) and is_conflict(failure)


def _engine_failure(failure: Exception, query_id: int | None) -> Error:
    """sqlsdc's message for an engine failure: whatever the engine said (a missing object, a
    constraint, a conversion), the analyst reads the same words; the engine's text is in the
    audit log for admins. Only a timeout is told apart, as the analyst can act on it."""
    where = f" (query {query_id})" if query_id is not None else ""
    if isinstance(failure, engine.duckdb.InterruptException):
        return _timeout_error(where)
    return OperationalError(
        f"the query failed in the engine{where}; the engine's message is withheld because it "
        "could reveal confidential values or objects; an admin can read it with `sqlsdc audit`"
    )


_PAID = (
    "was charged to the privacy budget before it stopped: its statistics are paid, and asking "
    "it again is not charged again"
)
