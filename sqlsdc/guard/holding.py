"""Holding the database file: a guarded connection's engine connection, opened and let go.

A DuckDB file is open in one process at a time, and many processes share it (analysts, a
server, admin commands). A guarded connection therefore holds the file only while it runs
statements: it lets it go :data:`IDLE_RELEASE_SECONDS` after the last one, or, when others
wait, after :data:`MAX_HOLD_SECONDS` (after :data:`MAX_TURN_SECONDS` in any case), and then
waits :data:`TURN_SECONDS` before it opens the file again: the other processes' turn
(:mod:`sqlsdc.guard.turns`). Threads of one process that write the state of one database wait
for each other on :func:`database_lock`.

:class:`FileHolding` holds these methods of :class:`sqlsdc.guard.connection.Connection`, which
sets the state they read (``_db``, ``_lock``, ``_depth``, ``_alarm``, ``_last_use``,
``_turn_until``, ``_held_since``, ``_turn_key``, ``_reopen``, ``_idle_release``, ``_closed``,
``_timeout``, ``_prf_key``) and opens the file (``_open``).
"""

from __future__ import annotations

import threading
import time
import weakref
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from sqlsdc.engines import duckdb as engine
from sqlsdc.engines import waiters, watchdog
from sqlsdc.guard.turns import ProcessTurns

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
    """The engine connection of a guarded connection: used alone, let go while idle or when
    other processes wait, and closed with what was read for its opening."""

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
