"""The sqlsdc error hierarchy.

``sqlsdc.Error`` is a PEP 249 ``DatabaseError``, so DB-API code that catches ``DatabaseError``
catches every sqlsdc error; sqlsdc code catches ``sqlsdc.Error``. Messages say what happened and
what to do. :class:`InternalError` marks a bug in sqlsdc, not a problem with the query or policy.
"""

from __future__ import annotations


class Warning(Exception):  # noqa: A001 - PEP 249 requires this name
    """PEP 249 warning (unused, present for DB-API completeness)."""


class DatabaseError(Exception):
    """PEP 249 ``DatabaseError``: errors related to the database."""


class Error(DatabaseError):
    """Root of every error sqlsdc raises."""


class InterfaceError(Error):
    """Misuse of the connection or cursor object (PEP 249)."""


class OperationalError(Error):
    """The engine failed while running a protected query.

    The message is sqlsdc's own and the same whatever the engine said; the engine's text, which
    could quote confidential values or name objects the policy hides, is kept in ``detail`` for
    the audit log and is never part of the message.
    """

    def __init__(self, message: str, detail: str | None = None):
        self.detail = detail
        super().__init__(message)


class QueryCanceled(OperationalError):
    """A statement was stopped: it ran longer than the statement timeout, or it was interrupted
    (:meth:`sqlsdc.Connection.interrupt`, a PostgreSQL CancelRequest to ``sqlsdc serve``)."""


class AnswerTooLarge(OperationalError):
    """A result had more rows than a connection returns (``MAX_ANSWER_ROWS``): it was stopped
    while being read, so that one statement cannot fill the memory of a shared process."""


class DataError(Error):
    """PEP 249 ``DataError`` (never raised: values are protected aggregates, not data written)."""


class IntegrityError(Error):
    """PEP 249 ``IntegrityError`` (never raised: a guarded connection writes no data)."""


class ProgrammingError(Error):
    """Wrong use of the API, e.g. fetching from a cursor that has no result."""


class NotSupportedError(Error):
    """A PEP 249 feature this connection does not offer (e.g. transactions)."""


class PolicyViolation(Error):
    """A query was refused because it is not provably safe under the policy.

    Attributes:
        reason: what was refused.
        hint: what would be allowed instead (may be empty).
        sql: the statement, for pointing at the offending part.
    """

    def __init__(self, reason: str, hint: str = "", sql: str | None = None):
        self.reason = reason
        self.hint = hint
        self.sql = sql
        super().__init__(f"{reason}. {hint}" if hint else reason)


class SqlSyntaxError(PolicyViolation):
    """The statement is not valid SQL, or too large or deeply nested to be checked; nothing
    about the policy was decided."""


class NotFoundError(Error):
    """A database, file or folder named by the user does not exist."""


class PolicyError(ValueError, Error):
    """A policy file or document is invalid; the message names file, path and problem."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class TabularError(ValueError, Error):
    """Input to a table-protection function (sqlsdc.tabular) is invalid, or a job cannot meet its
    protection requirements; the message names the input and what to change."""


class VerificationError(TabularError):
    """A protection method's result fails the independent check of its own constraints
    (:mod:`sqlsdc.tabular.verify`); nothing is stored. ``status`` is ``"verification_failed"``
    and ``problems`` lists every failed check."""

    status = "verification_failed"

    def __init__(self, method: str, problems: list[str]):
        self.method = method
        self.problems = list(problems)
        shown = "; ".join(self.problems[:5])
        more = f" (and {len(self.problems) - 5} more)" if len(self.problems) > 5 else ""
        super().__init__(
            f"the {method} result fails verification and is not stored: {shown}{more}; this is "
            "a solver or model fault, please report it with the job's SQL"
        )


class MicrodataError(ValueError, Error):
    """Input to a microdata method (sqlsdc.microdata) is invalid, e.g. k larger than the data."""


class SynthesisError(ValueError, Error):
    """A synthesis job's input is invalid (sqlsdc.synth), e.g. a numeric variable not binned for
    a DP method, or a full table above the cell cap."""


class AccessDenied(Error):
    """The user is unknown to the policy or lacks the role for an operation."""


class BudgetExhausted(Error):
    """A privacy budget would be exceeded (used by the DP mechanism)."""

    def __init__(self, message: str, requested=None, remaining=None):
        self.requested = requested
        self.remaining = remaining
        super().__init__(message)


class InternalError(Error):
    """A bug in sqlsdc: an invariant did not hold. Please report it."""

    def __init__(self, message: str):
        super().__init__(f"{message} (this is a bug in sqlsdc; please report it)")


def interrupted_by_user(error: BaseException) -> bool:
    """Whether ``error`` is DuckDB's answer to Ctrl-C (SIGINT) during a statement: DuckDB 2.0
    takes the signal itself and raises ``RuntimeError("Query interrupted")``, not
    ``KeyboardInterrupt`` (``connection.interrupt()``, the statement timeout's, raises its
    ``InterruptException`` instead); and a ``KeyboardInterrupt`` (Ctrl-C, or SIGTERM as the
    CLI turns it) raised while DuckDB ran Python code of its own, reading an Arrow or pandas
    object it scans, which DuckDB wraps in its error ("... failed: KeyboardInterrupt")."""
    if type(error) is RuntimeError and str(error) == "Query interrupted":
        return True
    engine = type(error).__module__.lstrip("_").startswith("duckdb")  # _duckdb's classes
    return engine and ": KeyboardInterrupt" in str(error)
