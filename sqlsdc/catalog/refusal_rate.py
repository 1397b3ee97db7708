"""The audit log's rate of refused statements: a flood is counted in one row, not logged whole.

A refused statement costs its sender milliseconds; logged whole (up to
:data:`sqlsdc.catalog.store.AUDITED_REFUSAL_CHARACTERS`) each one grew the database: a client
sending refusals of 16,000 characters in a loop added 2.6 MB a second (red team s43f). So a
user's refusals are logged one by one up to :data:`KEPT_PER_MINUTE` entries or
:data:`KEPT_CHARACTERS_PER_MINUTE` characters in a minute (UTC, counted from the audit log
itself: every connection and process of the user shares it); the rest of that minute are
counted in one summary entry (:data:`SUMMARY_TEXT`, its ``rows_returned`` the number it stands
for, its reason the first and last time), so the fact that they happened is kept and the log
grows by a bounded amount a minute per user. Only refusals are counted so: an accepted or
failed statement, and the outcome of a charged statement, are always logged one by one, so a
flood hides no later real query's record.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

from sqlsdc.catalog.schema import CATALOG_SCHEMA
from sqlsdc.engines.duckdb import EngineError, one, parsed

__all__ = [
    "KEPT_CHARACTERS_PER_MINUTE",
    "KEPT_PER_MINUTE",
    "SUMMARY_TEXT",
    "counted",
    "over",
    "turn",
]

KEPT_PER_MINUTE = 600
"""Refused statements of one user logged one by one in a minute."""
KEPT_CHARACTERS_PER_MINUTE = 262_144
"""Characters (statement and reason) of one user's refusals logged one by one in a minute."""
SUMMARY_TEXT = "[refused statements over the audit log's rate: counted here, their text not kept]"
"""The statement text of a summary entry, which alone has a count (``rows_returned``) among
refusals: an analyst's refused statement of this very text is an entry like any other."""

turn = threading.Lock()
"""Held by :func:`sqlsdc.catalog.store.record_query` around a refusal's count and entry: the
connections of one process (a server's sessions) logging refusals at once each counted the
others' uncommitted entries as absent (8 threads x 60 refusals of 15,000 characters kept
691,702 characters, 2.6 times the rate) and raced on the summary's count. Other processes
do not write the file meanwhile (it is held by one process at a time)."""

S = CATALOG_SCHEMA
_WINDOW = timedelta(minutes=1)
_LOGGED = (
    f"SELECT count(*), coalesce(sum(length(sql_text) + coalesce(length(reason), 0)), 0) "
    f"FROM {S}.audit WHERE user_name = ? AND decision = 'refused' AND logged_at >= ? "
    "AND NOT (sql_text = ? AND rows_returned IS NOT NULL)"
)
_SUMMARY = (
    f"SELECT query_id, rows_returned, logged_at FROM {S}.audit WHERE user_name = ? "
    "AND decision = 'refused' AND logged_at >= ? AND sql_text = ? AND rows_returned IS NOT NULL "
    "ORDER BY query_id DESC LIMIT 1"
)
_ADD = f"UPDATE {S}.audit SET rows_returned = rows_returned + 1, reason = ? WHERE query_id = ?"
_NEW = (
    f"INSERT INTO {S}.audit VALUES (nextval('{S}.query_ids'), ?, ?, ?, 'refused', ?, NULL, ?, 1) "
    "RETURNING query_id"
)
_RETRIES = 5


def _window(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def over(con, user: str, at: datetime, characters: int) -> bool:
    """Whether a refusal of ``user`` at ``at``, of ``characters`` (statement and reason), is
    over the rate: it is then :func:`counted`, not logged whole."""
    count, logged = one(con, parsed(_LOGGED), [user, _window(at), SUMMARY_TEXT])
    return count >= KEPT_PER_MINUTE or logged + characters > KEPT_CHARACTERS_PER_MINUTE


def counted(con, user: str, policy_version: int | None, at: datetime) -> int:
    """Count one more refusal of ``user`` at ``at`` in the minute's summary entry (made if
    there is none); returns its query id. A concurrent update of the same entry (another
    connection's refusal) is retried; should it keep conflicting, a summary entry of its own
    is made (still bounded: one per conflict, never a statement's text)."""
    window = _window(at)
    for attempt in range(_RETRIES):
        found = one(con, parsed(_SUMMARY), [user, window, SUMMARY_TEXT])
        if found is None:
            break
        query_id, _count, first = found
        try:  # the count in SQL: another process's count in between is never lost
            con.execute(parsed(_ADD), [_reason(first, at), query_id])
            return query_id
        except EngineError as failure:
            if "conflict" not in str(failure).lower():
                raise
            time.sleep(0.002 * (attempt + 1))
    (query_id,) = one(con, parsed(_NEW), [at, user, policy_version, _reason(at, at), SUMMARY_TEXT])
    return query_id


def _reason(first: datetime, last: datetime) -> str:
    return (
        f"refused statements of this user from {first:%Y-%m-%d %H:%M:%S} to {last:%H:%M:%S} "
        f"UTC over the audit log's rate ({KEPT_PER_MINUTE} refusals or "
        f"{KEPT_CHARACTERS_PER_MINUTE:,} characters a minute are logged one by one): "
        "rows_returned counts them; their text is not kept"
    )
