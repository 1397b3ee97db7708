"""sqlsdc: statistical disclosure control in SQL.

Analysts send ordinary SQL through a guarded connection and get protected aggregate answers;
everything that could reveal a person or a business is refused.

Example:
    >>> import sqlsdc
    >>> con = sqlsdc.connect("sqlsdc-demo.duckdb", user="analyst")  # doctest: +SKIP
    >>> con.execute("SELECT region, COUNT(*) AS n FROM persons GROUP BY region").fetchall()
"""

from sqlsdc import admin
from sqlsdc.catalog import init
from sqlsdc.errors import (
    AccessDenied,
    BudgetExhausted,
    DatabaseError,
    Error,
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
from sqlsdc.guard.connection import Connection, Cursor, apilevel, connect, paramstyle, threadsafety
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
    "BudgetExhausted",
    "Connection",
    "Cursor",
    "DatabaseError",
    "Error",
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
