"""PEP 249 module globals: type objects and constructors of the guarded connection.

``Cursor.description`` gives DuckDB's type names as type codes, as DuckDB's own cursor does
(``BIGINT``, ``DOUBLE``, ``VARCHAR``, ``DECIMAL(18,3)``, ``TIMESTAMP WITH TIME ZONE``), and
the type objects compare equal to the type codes of their family, with DuckDB's families
(``duckdb.NUMBER`` etc.), so ``desc[1] == sqlsdc.NUMBER`` works.

>>> "DECIMAL(18,3)" == NUMBER, "VARCHAR" == STRING, "VARCHAR" == NUMBER
(True, True, False)
"""

from __future__ import annotations

import datetime as dt
import time


class DBAPITypeObject:
    """A PEP 249 type object: equal to every DuckDB type name of its family (a parametrised
    type by its base name: ``DECIMAL(18,3)`` is a ``DECIMAL``)."""

    def __init__(self, name: str, *types: str):
        self.name = name
        self._types = frozenset(types)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DBAPITypeObject):
            return other is self
        if not isinstance(other, str):
            return NotImplemented
        return other.upper().split("(", 1)[0].strip() in self._types

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"sqlsdc.{self.name}"


STRING = DBAPITypeObject("STRING", "VARCHAR", "JSON", "ENUM", "UUID")
BINARY = DBAPITypeObject("BINARY", "BLOB", "BIT")
NUMBER = DBAPITypeObject(
    "NUMBER", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
    "UINTEGER", "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "DECIMAL", "BIGNUM",
)  # fmt: skip
DATETIME = DBAPITypeObject(
    "DATETIME", "DATE", "TIME", "TIME_NS", "TIME WITH TIME ZONE", "TIMESTAMP", "TIMESTAMP_S",
    "TIMESTAMP_MS", "TIMESTAMP_NS", "TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ_NS",
)  # fmt: skip
ROWID = DBAPITypeObject("ROWID")  # guarded results never expose row identifiers

Date = dt.date
Time = dt.time
Timestamp = dt.datetime
Binary = bytes


def DateFromTicks(ticks: float) -> dt.date:  # noqa: N802 - PEP 249 name
    return Date(*time.localtime(ticks)[:3])


def TimeFromTicks(ticks: float) -> dt.time:  # noqa: N802 - PEP 249 name
    return Time(*time.localtime(ticks)[3:6])


def TimestampFromTicks(ticks: float) -> dt.datetime:  # noqa: N802 - PEP 249 name
    return Timestamp(*time.localtime(ticks)[:6])
