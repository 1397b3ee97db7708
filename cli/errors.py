"""Exit codes of the ``sqlsdc`` command: one per class of failure, decided in this one place.

No traceback reaches a user: :func:`classify` turns every exception a command raises into one
message and one exit code. The table is shown in ``sqlsdc --help`` and the README.
"""

from __future__ import annotations

import errno

from sqlsdc.errors import (
    AccessDenied,
    BudgetExhausted,
    Error,
    InternalError,
    NotFoundError,
    OperationalError,
    PolicyError,
    PolicyViolation,
    SqlSyntaxError,
)

OK, ERROR, USAGE, REFUSED, INVALID_POLICY, DENIED = 0, 1, 2, 3, 4, 5
SYNTAX, BUDGET, NOT_FOUND, OPERATIONAL, INTERNAL = 6, 7, 8, 9, 70

EXIT_CODES = (  # (code, meaning) as documented
    (OK, "success"),
    (ERROR, "other error (e.g. an existing output file without --force, a value a job cannot use)"),
    (USAGE, "usage error: unknown command or option, missing argument, malformed value"),
    (REFUSED, "query refused by the policy"),
    (INVALID_POLICY, "invalid policy file"),
    (DENIED, "access denied: unknown user or missing role"),
    (SYNTAX, "SQL syntax error, or a statement too deeply nested to check"),
    (BUDGET, "privacy budget exhausted"),
    (
        NOT_FOUND,
        "not found: database (or no sqlsdc database at that path), file or folder, "
        "output, undeclared table",
    ),
    (OPERATIONAL, "engine or file-system failure (timeout, lock, read-only, disk full)"),
    (INTERNAL, "internal error: a bug in sqlsdc (please report it)"),
)

# most specific first: SqlSyntaxError is a PolicyViolation
_CLASSES = (
    (SqlSyntaxError, SYNTAX, "syntax error"),
    (PolicyViolation, REFUSED, "refused"),
    (PolicyError, INVALID_POLICY, "invalid policy:\n"),
    (AccessDenied, DENIED, "access denied"),
    (BudgetExhausted, BUDGET, "budget exhausted"),
    (NotFoundError, NOT_FOUND, "not found"),
    (OperationalError, OPERATIONAL, "failed"),
    (InternalError, INTERNAL, "internal error"),
    (Error, ERROR, ""),
)


def classify(error: BaseException) -> tuple[str, int]:
    """The message and exit code for an exception that ended a command."""
    for kind, code, label in _CLASSES:
        if isinstance(error, kind):
            return _join(label, str(error)), code
    if isinstance(error, FileNotFoundError):
        return _join("not found", _os_text(error)), NOT_FOUND
    if isinstance(error, FileExistsError):
        return f"{_os_text(error)}; pass --force to overwrite it", ERROR
    if isinstance(error, OSError):
        return _join("failed", _os_text(error)), OPERATIONAL
    if isinstance(error, MemoryError):  # a job or demo too large for this machine
        detail = f" ({error})" if str(error) else ""
        return f"failed: out of memory{detail}; use a smaller input", OPERATIONAL
    if isinstance(error, RecursionError):
        return "syntax error: the input is nested too deeply to be handled", SYNTAX
    return (
        f"internal error: {type(error).__name__}: {error} "
        "(this is a bug in sqlsdc; please report it)",
        INTERNAL,
    )


def epilog() -> str:
    """The exit-code table for ``sqlsdc --help``."""
    rows = "\n".join(f"  {code:>2}  {meaning}" for code, meaning in EXIT_CODES)
    return f"\b\nExit codes:\n{rows}"


def _join(label: str, text: str) -> str:
    """``label: text``, or the text alone where it says the label already ("privacy budget
    exhausted for ...")."""
    if not label or label.strip() in " ".join(text.lower().split()[:3]):
        return text
    return f"{label}{text}" if label.endswith("\n") else f"{label}: {text}"


def _os_text(error: OSError) -> str:
    what = error.strerror or errno.errorcode.get(error.errno or 0, "") or type(error).__name__
    where = f"{error.filename}: " if error.filename else ""
    return f"{where}{what.lower()}"
