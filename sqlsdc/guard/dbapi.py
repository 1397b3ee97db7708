"""PEP 249 module globals: type objects and constructors of the guarded connection.

Type objects compare equal to the type codes in ``Cursor.description`` (Arrow type names such
as ``int64``, ``double``, ``string``, ``timestamp[us]``), so ``desc[1] == sqlsdc.NUMBER`` works.
"""

from __future__ import annotations

import datetime as dt
import time


class DBAPITypeObject:
    """A PEP 249 type object: equal to every type code of its family."""

    def __init__(self, name: str, *prefixes: str):
        self.name = name
        self._prefixes = prefixes

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DBAPITypeObject):
            return other is self
        return isinstance(other, str) and other.lower().startswith(self._prefixes)

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"sqlsdc.{self.name}"


STRING = DBAPITypeObject("STRING", "string", "large_string", "dictionary")
BINARY = DBAPITypeObject("BINARY", "binary", "large_binary", "fixed_size_binary")
NUMBER = DBAPITypeObject("NUMBER", "int", "uint", "float", "double", "halffloat", "decimal", "bool")
DATETIME = DBAPITypeObject("DATETIME", "date", "time", "timestamp", "duration")
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
