"""Checking a statement on a guarded connection: early, through the check cache, in its time.

A statement is parsed and checked before its connection takes the database file or its own
lock (:meth:`Checking._check_early`), under the context of the last opening, so that no other
process or thread waits while it is checked; under the file, that check stands if the context
is still in force (:meth:`Checking._in_force`), else it is checked again. Checks are shared by
every connection of the process that sees the same policy version, schema and catalog
(:mod:`sqlsdc.guard.check_cache`). The statement timeout starts with the check and bounds it
(:meth:`Checking._time_left`).

:class:`Checking` holds these methods of :class:`sqlsdc.guard.connection.Connection`, which
sets the state they read (``_context``, ``_closed``, ``_lock``, ``_depth``, ``_deadline``,
``_interrupts``, ``timeout``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlsdc.errors import Error
from sqlsdc.guard.check_cache import checked, is_kept
from sqlsdc.guard.context import TIME_LEFT
from sqlsdc.guard.engine_failures import timeout_error
from sqlsdc.guard.pipeline import GuardContext, ProtectedQuery, protect
from sqlsdc.guard.statement import UNCACHEABLE, parameters_key
from sqlsdc.guard.unbound import is_describing


@dataclass(frozen=True)
class Early:
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


class Checking:
    """A statement checked before and under the file, within its timeout."""

    def _protect(
        self, sql: str, params, early: Early | None = None, interrupts: int | None = None
    ) -> ProtectedQuery:
        """``protect``, shared with every connection of the process and of its user that sees
        the same policy version, schema and catalog (``check_cache``). The statement timeout
        starts here, less the time ``early`` (:meth:`_check_early`) took: the check counts
        against it and stops at the first pass that begins after it, and the engine gets what
        is left (:meth:`_time_left`). ``early``'s outcome stands if it was reached under the context
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
        frozen = parameters_key(params)
        token = TIME_LEFT.set(time_left)
        try:
            if frozen is UNCACHEABLE or is_describing():  # a describe's check is never kept
                return protect(sql, params, context, time_left)
            return checked(sql, params, frozen, context, time_left, self.user)
        finally:
            TIME_LEFT.reset(token)

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

    def _check_early(self, sql: str, params, interrupts: int, took: float = 0.0) -> Early | None:
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
        frozen = parameters_key(params)
        if frozen is not UNCACHEABLE and context.fingerprint:
            if is_kept(sql, frozen, context, self.user):
                return None
        deadline = started + self.timeout

        def time_left() -> float:
            left = deadline - time.monotonic()
            if left <= 0 or self._interrupts != interrupts:
                raise timeout_error("")
            return left

        try:
            query, refusal = self._checked(sql, params, context, time_left), None
        except Error as e:
            query, refusal = None, e
        return Early(context, time.monotonic() - started, query, refusal)

    def _time_left(self) -> float:
        """Seconds left of the statement timeout; stops the statement when none are."""
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise timeout_error("") from None  # like the engine's timeout: no context shown
        return left
