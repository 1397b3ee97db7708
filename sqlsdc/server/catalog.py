"""Session statements answered by the server itself, not by the guard.

STAND-IN: this minimal module (branch h-pgwire) answers only what the server's own tests need;
the policy-generated ``pg_catalog``/``information_schema`` module of branch h-pgcat replaces it
at merge with the same interface (``SessionCatalog(connection).answer(sql, params)``).

Transaction control (``BEGIN``, ``COMMIT``, ``ROLLBACK``), ``SET``/``RESET``/``DISCARD``/
``DEALLOCATE`` are acknowledged and change nothing (guarded connections are read-only and have
no session settings a client may change); ``SHOW`` and ``SELECT version()`` answer constants.
Everything else returns None and goes to the guard.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

SERVER_VERSION = "16.0"
_SETTINGS = {
    "server_version": SERVER_VERSION,
    "transaction_isolation": "serializable",
    "transaction isolation level": "serializable",
    "standard_conforming_strings": "on",
    "client_encoding": "UTF8",
    "timezone": "UTC",
    "datestyle": "ISO, MDY",
}
_ACKNOWLEDGED = {
    "begin": "BEGIN", "start": "BEGIN", "commit": "COMMIT", "end": "COMMIT",
    "rollback": "ROLLBACK", "abort": "ROLLBACK", "set": "SET", "reset": "RESET",
    "discard": "DISCARD ALL", "deallocate": "DEALLOCATE",
}  # fmt: skip
_COMMENTS = re.compile(r"^(\s|--[^\n]*(\n|$)|/\*.*?\*/)*", re.S)
_VERSION = re.compile(r"^select\s+(pg_catalog\.)?version\(\)\s*;?\s*$", re.I)


@dataclass
class CatalogAnswer:
    table: pa.Table | None
    tag: str


class SessionCatalog:
    """Answers the session statements of PostgreSQL clients for one guarded connection."""

    def __init__(self, connection):
        self.connection = connection

    def answer(self, sql: str, params: tuple | None = None) -> CatalogAnswer | None:
        text = _COMMENTS.sub("", sql).strip().rstrip(";").strip()
        words = text.split(None, 1)
        if not words:
            return None
        first = words[0].lower()
        if first in _ACKNOWLEDGED and not (first == "set" and "=" not in text and " to " not in
                                            text.lower()):  # fmt: skip
            return CatalogAnswer(None, _ACKNOWLEDGED[first])
        if first == "show" and len(words) == 2:
            name = words[1].strip().lower()
            if name in _SETTINGS:
                return _one(name.split()[-1], _SETTINGS[name], "SHOW")
        if _VERSION.match(text):
            return _one("version", f"PostgreSQL {SERVER_VERSION} (sqlsdc guarded server)")
        return None


def _one(column: str, value: str, tag: str = "SELECT 1") -> CatalogAnswer:
    return CatalogAnswer(pa.table({column: pa.array([value], pa.string())}), tag)
