"""What an analyst reads when the engine fails or a statement is stopped.

The engine's own text can name confidential values or objects, so it goes to the audit log
only; the analyst reads sqlsdc's words, the same whatever the engine said
(:func:`engine_failure`). A timeout and a cancel are told apart from other failures, as the
analyst can act on them (:func:`timeout_error`), and a statement stopped after its DP charge
committed says that it was paid, and whether asking it again is (:data:`PAID`,
:data:`KEPT`). Used by :mod:`sqlsdc.guard.connection` and :mod:`sqlsdc.guard.context`.
"""

from __future__ import annotations

from sqlsdc.catalog.budget import is_conflict
from sqlsdc.engines import duckdb as engine
from sqlsdc.errors import Error, OperationalError, QueryCanceled


def timeout_error(where: str) -> QueryCanceled:
    """A statement stopped by its timeout or by :meth:`Connection.interrupt`: the engine stops
    both alike, and one interrupt stops every statement begun on a shared connection, so the
    message names both causes."""
    return QueryCanceled(
        f"the query was stopped because it ran longer than the statement timeout or was "
        f"cancelled{where}; if it timed out, narrow it, or ask an admin about the policy's "
        "`limits.statement_timeout_seconds`"
    )


def cell_conflict(failure: Exception) -> bool:
    """Whether sqlsdc's own writes after the analyst's SQL failed because a concurrent query of
    the same user cached one of the same DP cells first (retrying is then safe): the cache's
    key, at its INSERT or at COMMIT. An error of the analyst's SQL is never run again."""
    kinds = (engine.duckdb.TransactionException, engine.duckdb.ConstraintException)
    return isinstance(failure, kinds) and is_conflict(failure)


def engine_failure(failure: Exception, query_id: int | None) -> Error:
    """sqlsdc's message for an engine failure: whatever the engine said (a missing object, a
    constraint, a conversion), the analyst reads the same words; the engine's text is in the
    audit log for admins. Only a timeout is told apart, as the analyst can act on it."""
    where = f" (query {query_id})" if query_id is not None else ""
    if isinstance(failure, engine.duckdb.InterruptException):
        return timeout_error(where)
    return OperationalError(
        f"the query failed in the engine{where}; the engine's message is withheld because it "
        "could reveal confidential values or objects; an admin can read it with `sqlsdc audit`"
    )


PAID = (
    "was charged to the privacy budget before it stopped, and its cells were not released: "
    "asking it again is charged again"
)
"""A statement stopped after its charge and before its cells were cached: a statistic counts
as paid for a later asking only once its cells are (else each asking computed them again for
free, a fresh timing of the engine's work: red team s41b)."""
KEPT = (
    "was charged to the privacy budget before it stopped, and its cells were kept: asking it "
    "again is not charged again"
)
"""A statement stopped after its cells were drawn, which were cached on their own."""
