"""sqlsdc: statistical disclosure control in SQL.

Analysts send ordinary SQL through a guarded connection and get protected aggregate answers;
everything that could reveal a person or a business is refused.

Example:
    >>> import sqlsdc
    >>> con = sqlsdc.connect("sqlsdc-demo.duckdb", user="analyst")  # doctest: +SKIP
    >>> con.execute("SELECT COUNT(*) FROM persons").fetchall()  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from sqlsdc.errors import (
    AccessDenied,
    AnswerTooLarge,
    BudgetExhausted,
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    PolicyError,
    PolicyViolation,
    ProgrammingError,
    TabularError,
    Warning,
)

if TYPE_CHECKING:
    from sqlsdc import admin
    from sqlsdc.admin import init
    from sqlsdc.guard.connection import (
        Connection,
        apilevel,
        connect,
        paramstyle,
        threadsafety,
    )
    from sqlsdc.guard.cursor import Cursor
    from sqlsdc.guard.dbapi import (
        BINARY,
        DATETIME,
        NUMBER,
        ROWID,
        STRING,
        Binary,
        Date,
        DateFromTicks,
        Time,
        TimeFromTicks,
        Timestamp,
        TimestampFromTicks,
    )
    from sqlsdc.policy import load_policy

__version__ = "0.1.0"

# Imported on first use (PEP 562), so that ``sqlsdc --help`` and ``import sqlsdc.errors`` do not
# load duckdb, pandas, sqlglot or OR-Tools: name -> (module, attribute or None for the module).
_LAZY = {
    "admin": ("sqlsdc.admin", None),
    "init": ("sqlsdc.admin", "init"),
    "load_policy": ("sqlsdc.policy", "load_policy"),
    **{
        name: ("sqlsdc.guard.connection", name)
        for name in ("Connection", "apilevel", "connect", "paramstyle", "threadsafety")
    },
    "Cursor": ("sqlsdc.guard.cursor", "Cursor"),
    **{
        name: ("sqlsdc.guard.dbapi", name)
        for name in ("BINARY", "DATETIME", "NUMBER", "ROWID", "STRING", "Binary", "Date",
                     "DateFromTicks", "Time", "TimeFromTicks", "Timestamp", "TimestampFromTicks")
    },
}


def __getattr__(name: str):
    """Imports a public name of the API on first access and caches it in the module."""
    if name not in _LAZY:
        raise AttributeError(f"module 'sqlsdc' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BINARY",
    "DATETIME",
    "NUMBER",
    "ROWID",
    "STRING",
    "Binary",
    "Date",
    "DateFromTicks",
    "Time",
    "TimeFromTicks",
    "Timestamp",
    "TimestampFromTicks",
    "admin",
    "AccessDenied",
    "AnswerTooLarge",
    "BudgetExhausted",
    "Connection",
    "Cursor",
    "DatabaseError",
    "DataError",
    "Error",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "NotSupportedError",
    "OperationalError",
    "PolicyError",
    "PolicyViolation",
    "ProgrammingError",
    "TabularError",
    "Warning",
    "apilevel",
    "connect",
    "init",
    "load_policy",
    "paramstyle",
    "threadsafety",
]
