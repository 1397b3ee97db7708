"""How much SQL text one user's statements may put in the audit log a minute.

An accepted statement is logged whole (it is what was released), up to the policy's
``max_statement_characters`` (default 1,000,000). A comment or a string literal the check
never evaluates costs the engine nothing, so an analyst sending ``SELECT COUNT(*) FROM
persons /* 990,000 random characters */`` in a loop grew the database by 11 MB in 2.9 s of
CPU (3.8 MB a CPU second; red team s44e), more than the refusals the audit's rate bounds
(:mod:`sqlsdc.catalog.refusal_rate`). So a user's statements longer than :data:`FREE`
characters may add up to :data:`CHARACTERS_PER_MINUTE` a minute (UTC minutes); a statement
beyond is refused before anything is run or charged, saying what to do. A statement's
parameters count with it: the audit log keeps them on a line after its text
(:mod:`sqlsdc.guard.audited_parameters`), and that whole text is what is counted.

:data:`FREE` was 4,096 characters: statements of 4,096 characters, uncounted, ran one after
another at 427,000 characters a CPU second (the same text, its check cached), 25 MB of log a
minute from one core against the 4 MiB the rate allows, and as much again from every other
process or server session of the user (red team s46g). Now it is 256: a statement that short
adds to its audit entry no more than the entry's own columns (times, user, fingerprint,
reason: 100-200 bytes), so what no rate counts grows no faster than entries do, and most
statements (a hundred characters or so) still skip the log's count.

The minute is counted from the audit log itself (the characters of the user's entries
longer than :data:`FREE` logged since the minute began), so every process of the user shares
it: counted in the process alone, three processes each took the whole minute, 12 statements
of 999,000 characters a minute where 4 were allowed, and a process per statement (the CLI)
was never refused (red team s45h). The process's own count is kept beside it, for its
connections' statements still running (a server's sessions): not yet logged, but taken.
The log's count costs a statement longer than :data:`FREE` one indexed-by-time scan of the
audit log's newest entries (0.6 ms of CPU on 100,000 entries, 0.5 on a new one).
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime

from sqlsdc.catalog.schema import CATALOG_SCHEMA
from sqlsdc.engines.duckdb import one, parsed
from sqlsdc.errors import PolicyViolation

__all__ = ["CHARACTERS_PER_MINUTE", "FREE", "check"]

FREE = 256
"""Statements (with their parameters' line) up to this many characters are not counted."""
CHARACTERS_PER_MINUTE = 4 * 2**20
"""Characters of one user's longer statements taken a minute (4 MiB: four of the longest a
default policy accepts)."""

# the length filtered in the aggregate, not in WHERE: there it was evaluated on every entry's
# text before the time's filter, 7.5 ms of CPU on 100,000 entries against 0.6 ms
_LOGGED = (
    f"SELECT coalesce(sum(length(sql_text)) FILTER (WHERE length(sql_text) > {FREE}), 0) "
    f"FROM {CATALOG_SCHEMA}.audit WHERE logged_at >= ? AND user_name = ?"
)

_lock = threading.Lock()
_taken: dict[tuple[str, str], tuple[int, int]] = {}  # (database, user) -> (minute, characters)


def check(con, database: str, user: str, sql: str) -> None:
    """Count ``sql`` against ``user``'s minute on ``database`` (open as ``con``), or refuse it
    (nothing counted) when it would take the minute over :data:`CHARACTERS_PER_MINUTE`: the
    larger of what the audit log holds of the minute (every process) and what this process
    took (its statements not yet logged too)."""
    if len(sql) <= FREE:
        return
    minute, key = int(time.time() // 60), (os.path.realpath(database), user)
    began = datetime.fromtimestamp(minute * 60, UTC).replace(tzinfo=None)  # as logged_at
    with _lock:
        at, taken = _taken.get(key, (minute, 0))
        taken = taken if at == minute else 0
        (logged,) = one(con, parsed(_LOGGED), [began, user])
        taken = max(taken, logged)
        if taken + len(sql) > CHARACTERS_PER_MINUTE:
            raise PolicyViolation(
                f"user {user!r} has sent {taken:,} characters of statements longer than "
                f"{FREE:,} this minute; this one's {len(sql):,} would take it over "
                f"{CHARACTERS_PER_MINUTE:,}, the most the audit log takes from one user",
                "send it again in the next minute, or shorten it (comments and long literals "
                "count)",
            )
        _taken[key] = (minute, taken + len(sql))
