"""Holding the database file: a guarded connection's engine connection, opened and let go.

A DuckDB file is open in one process at a time, and many processes share it (analysts, a
server, admin commands). A guarded connection therefore holds the file only while it runs
statements: it lets it go :data:`IDLE_RELEASE_SECONDS` after the last one, or, when others
wait, after :data:`MAX_HOLD_SECONDS` (after :data:`MAX_TURN_SECONDS` in any case), and then
waits :data:`TURN_SECONDS` before it opens the file again: the other processes' turn
(:mod:`sqlsdc.guard.turns`). Threads of one process that write the state of one database wait
for each other on :func:`database_lock`. Each opening (:meth:`FileHolding._open`) reads the
policy in force again when an admin applied another version, and the released outputs, and
starts afresh what is known only while the file stays open (data versions, engine reads).

:class:`FileHolding` holds these methods of :class:`sqlsdc.guard.connection.Connection`, which
sets the state they read (``_db``, ``_lock``, ``_depth``, ``_alarm``, ``_last_use``,
``_turn_until``, ``_reopen``, ``_idle_release``, ``_closed``, ``_context``, ``_base_policy``,
``_releases``, ``_asked_timeout``, ``user``, ``path``).
"""

from __future__ import annotations

import threading
import time
import weakref
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from sqlsdc.catalog import cell_limits, store
from sqlsdc.catalog.budget import BudgetState
from sqlsdc.catalog.budget_tables import ensure_budget_catalog, remember_budget_tables
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines import waiters, watchdog
from sqlsdc.errors import AccessDenied, OperationalError
from sqlsdc.guard.context import guard_context, statement_timeout
from sqlsdc.guard.releases import attach_releases, available_releases, with_releases
from sqlsdc.guard.summable import Checked
from sqlsdc.guard.turns import ProcessTurns
from sqlsdc.policy import Policy, UserRole, load_policy

IDLE_RELEASE_SECONDS = 1.0  # a connection idle this long lets other processes open the file
MAX_HOLD_SECONDS = 0.5  # a busy connection that others wait for releases it after this hold
TURN_SECONDS = 0.06  # ... and waits this long before opening it again: other processes' turn
MAX_TURN_SECONDS = 2.0  # ... and after this hold even with no waiter known (one may not have
# been able to mark itself: something else at <db>.waiting); a reopen costs about 15 ms

TURNS = ProcessTurns(hold=MAX_HOLD_SECONDS, turn=TURN_SECONDS)  # the whole process's turns
_DATABASE_LOCKS: dict[str, threading.Lock] = {}
_DATABASE_LOCKS_GUARD = threading.Lock()


def database_lock(path: Path) -> threading.Lock:
    """The lock that serialises this process's writes to the state of one database (catalog
    upgrades on connect, budget charges), so that concurrent connections of the process wait
    for each other instead of failing on the engine's write conflicts."""
    key = str(path.resolve())
    with _DATABASE_LOCKS_GUARD:
        return _DATABASE_LOCKS.setdefault(key, threading.Lock())


def _release_idle(connection: weakref.ref) -> None:
    """The idle alarm's action; the alarm holds the connection weakly, so that a connection
    the program dropped is closed by the garbage collector as before."""
    alive = connection()
    if alive is not None:
        alive._release_if_idle()


class FileHolding:
    """The engine connection of a guarded connection: opened with the policy in force, used
    alone, let go while idle or when other processes wait, and closed with what was read for
    its opening."""

    def _open(self) -> None:
        """Open the database file (waiting while another process writes it), and load the
        policy in force, again only when an admin applied a new version since the last open."""
        path = Path(self.path)
        time.sleep(max(0.0, self._turn_until - time.monotonic()))
        key = str(path.resolve())
        TURNS.wait(key, partial(waiters.others_waiting, path), self._turn_bound())
        con = engine.open_database(path, wait=engine.LOCK_WAIT_SECONDS, writes_data=False,
                                   first=False)  # fmt: skip
        try:
            TURNS.held(key, con)
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
            TURNS.closed(key, con)
            raise OperationalError(
                f"cannot open {path.name}: the engine failed while reading the sqlsdc "
                "catalog; the engine's message is withheld; an admin can check the database "
                "with `sqlsdc policy show`"
            ) from None
        except BaseException:
            con.close()
            TURNS.closed(key, con)
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
        self._versions_writers: int | None = writers  # ... the cell limits' (_current_data_version)
        self._prf_key: bytes | None = None  # read when a DP query needs it (_secret)
        self._budget = BudgetState()  # what its last charge read of the budget tables
        self._cells_known = cell_limits.Known(writers)  # what the cell limits saw committed

    def _known_cells(self) -> cell_limits.Known:
        """What the cell limits saw committed on this opening, forgotten when a connection of
        this process that may write the file opened it since (an admin's ``rekey`` retires the
        cells it knew: :func:`sqlsdc.catalog.cell_limits.retire_cells`)."""
        writers = engine.data_writers(self.path)
        if writers is None or writers != self._cells_known.writers:
            self._cells_known = cell_limits.Known(writers)
        return self._cells_known

    def _load_policy(self, con, version: int, policy: Policy, releases=None) -> None:
        declared = policy.user(self.user)
        if declared is None:
            raise AccessDenied(
                f"user {self.user!r} is not declared in the policy of {Path(self.path).name}; "
                "ask an admin to add it under `users:`"
            )
        timeout = statement_timeout(policy, self._asked_timeout)
        context = guard_context(con, policy, version, timeout, Path(self.path), releases or {})
        with database_lock(Path(self.path)):
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
            TURNS.closed(self._turn_key, db)
