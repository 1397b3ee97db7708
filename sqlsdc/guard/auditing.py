"""The audit trail of a guarded connection's statements that did not end as answers.

Every statement an analyst sends leaves an audit entry: a refusal as the analyst read it, an
engine failure with the engine's own text (for admins only, ``sqlsdc audit``), an error nobody
foresaw or a Ctrl-C as ``failed``. A DP statement's charge commits first with an entry its
outcome replaces (:func:`sqlsdc.catalog.budget.charge`), so a statement stopped after it is
recorded and the analyst is told that it was paid (:meth:`Auditing._said_paid`).

:class:`Auditing` holds these methods of :class:`sqlsdc.guard.connection.Connection`, which
sets the state they read (``_con``, ``user``, ``_context``, ``_query_id``).
"""

from __future__ import annotations

from sqlsdc.catalog import store
from sqlsdc.catalog.budget import has_charge
from sqlsdc.engines import duckdb as engine
from sqlsdc.errors import BudgetExhausted, Error, PolicyViolation
from sqlsdc.guard.engine_failures import KEPT, PAID


class Auditing:
    """Audit entries of refusals, failures and interrupts, and whether a statement paid."""

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

    def _said_paid(
        self, stopped: BaseException, query_id: int | None, kept: bool = False
    ) -> BaseException:
        """``stopped`` (an error, Ctrl-C: changed in place), saying that its statement was
        charged if it was, and whether its cells were ``kept`` (asking again is then free):
        sqlsdc's errors in their message (what the CLI and a server's client show), others in
        a note."""
        if self._paid(query_id):
            said = f"query {query_id} {KEPT if kept else PAID}"
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
