"""Errors of a server session and their SQLSTATE codes (PostgreSQL documentation, appendix A
"PostgreSQL Error Codes").

A :class:`StatementError` ends one statement (an ErrorResponse of severity ERROR), a
:class:`Fatal` the session; :func:`error_fields` maps the guard's and the catalog's errors to
their code, message and hint. An engine's own text never reaches a client (the guard withholds
it), and an unexpected failure is reported as XX000 with no detail.
"""

from __future__ import annotations

import logging

from sqlsdc.errors import (
    AccessDenied,
    AnswerTooLarge,
    BudgetExhausted,
    Error,
    InternalError,
    NotSupportedError,
    OperationalError,
    PolicyViolation,
    ProgrammingError,
    QueryCanceled,
    SqlSyntaxError,
)
from sqlsdc.server import types

log = logging.getLogger("sqlsdc.server")

BUDGET_EXHAUSTED = "53S01"  # class 53 "insufficient resources", an implementation-defined code


class StatementError(Exception):
    """An error that ends one statement (ERROR severity); the session goes on."""

    def __init__(self, code: str, text: str, hint: str = ""):
        super().__init__(text)
        self.code, self.text, self.hint = code, text, hint


class WriteTimeout(Exception):
    """The client read nothing of what the session wrote for the server's write timeout."""


class Fatal(Exception):
    """An error that ends the session (FATAL severity)."""

    def __init__(self, code: str, text: str, hint: str = ""):
        super().__init__(text)
        self.code, self.text, self.hint = code, text, hint


def error_fields(error: BaseException, cancelled: bool = False) -> StatementError:
    """The SQLSTATE, message and hint of an error raised by the guard or the catalog."""
    if isinstance(error, StatementError):
        return error
    if isinstance(error, SqlSyntaxError):
        return StatementError("42601", error.reason, error.hint)
    if isinstance(error, PolicyViolation):
        return StatementError("42501", error.reason, error.hint)
    if isinstance(error, BudgetExhausted):
        return StatementError(BUDGET_EXHAUSTED, str(error))
    if isinstance(error, QueryCanceled) or (cancelled and isinstance(error, OperationalError)):
        # a cancel that lands in the ledger write fails it (OperationalError): still a cancel
        return StatementError("57014", "canceling statement due to user request"
                              if cancelled else str(error))  # fmt: skip
    if isinstance(error, AccessDenied):
        return StatementError("42501", str(error))
    if isinstance(error, NotSupportedError):
        return StatementError("0A000", str(error))
    if isinstance(error, ProgrammingError):
        return StatementError("08P01", str(error))
    if isinstance(error, types.ParameterError):
        return StatementError("22P02", str(error))
    if isinstance(error, InternalError) or not isinstance(error, Error):
        log.error("internal error: %s", type(error).__name__)
        return StatementError("XX000", "internal error in sqlsdc; the server log names it")
    if isinstance(error, AnswerTooLarge):
        return StatementError("54000", str(error))  # program_limit_exceeded
    if isinstance(error, OperationalError):
        return StatementError("58000", str(error))
    return StatementError("XX000", str(error))  # sqlsdc's own words, never the engine's
