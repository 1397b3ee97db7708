"""How much SQL text one user's statements may put in the audit log a minute.

An accepted statement is logged whole (it is what was released), up to the policy's
``max_statement_characters`` (default 1,000,000). A comment or a string literal the check
never evaluates costs the engine nothing, so an analyst sending ``SELECT COUNT(*) FROM
persons /* 990,000 random characters */`` in a loop grew the database by 11 MB in 2.9 s of
CPU (3.8 MB a CPU second; red team s44e), more than the refusals the audit's rate bounds
(:mod:`sqlsdc.catalog.refusal_rate`). So a user's statements may add up to
:data:`CHARACTERS_PER_MINUTE` characters a minute (UTC minutes); a statement beyond is
refused before anything is run or charged, saying what to do. A statement's parameters count
with it: the audit log keeps them on a line after its text
(:mod:`sqlsdc.guard.audited_parameters`), and that whole text is what is counted.

Every statement counts, however short. Statements of up to 4,096 characters were not
counted: the same statement of 4,096 characters (its check cached) ran at 427,000
characters a CPU second, 25 MB of log a minute from one core where the rate allows 4 MiB,
and as much again from every other process or server session of the user (red team s46g);
any length left free is sent that way, the shorter the more statements a second.

The minute is counted from the audit log itself (the characters of the user's entries
logged since the minute began), so every process of the user shares it: counted in the
process alone, three processes each took the whole minute, 12 statements of 999,000
characters a minute where 4 were allowed, and a process per statement (the CLI) was never
refused (red team s45h). The process's own count is kept beside it, for its connections'
statements still running (a server's sessions): not yet logged, but taken. The log's count
is one indexed-by-time scan of its newest entries (0.44 ms of CPU on 100,000 entries): a
process reads it for its first statement of a minute, for a statement of more than
:data:`SLACK` characters, and once its own statements since the last reading add up to
:data:`SLACK`; in between it counts on from the last reading. So a short statement costs a
scan once in hundreds, and each other process of the user may have taken at most
:data:`SLACK` characters (1.6 % of the minute) that a refusal did not see yet.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime

from sqlsdc.catalog.schema import CATALOG_SCHEMA
from sqlsdc.engines.duckdb import one, parsed
from sqlsdc.errors import PolicyViolation

__all__ = ["CHARACTERS_PER_MINUTE", "SLACK", "check"]

CHARACTERS_PER_MINUTE = 4 * 2**20
"""Characters of one user's statements taken a minute (4 MiB: four of the longest a default
policy accepts)."""
SLACK = 65_536
"""Characters a process counts on from its last reading of the audit log's minute."""

_LOGGED = (
    f"SELECT coalesce(sum(length(sql_text)), 0) "
    f"FROM {CATALOG_SCHEMA}.audit WHERE logged_at >= ? AND user_name = ?"
)

_lock = threading.Lock()
# (database, user) -> (minute, characters taken, characters taken at the last log reading)
_taken: dict[tuple[str, str], tuple[int, int, int]] = {}


def check(con, database: str, user: str, sql: str) -> None:
    """Count ``sql`` against ``user``'s minute on ``database`` (open as ``con``), or refuse it
    (nothing counted) when it would take the minute over :data:`CHARACTERS_PER_MINUTE`: the
    larger of what the audit log holds of the minute (every process; read again as the
    module says) and what this process took (its statements not yet logged too)."""
    minute, key = int(time.time() // 60), (os.path.realpath(database), user)
    with _lock:
        at, taken, read = _taken.get(key, (None, 0, 0))
        if at != minute:
            taken, read = 0, None
        if read is None or taken - read + len(sql) > SLACK:
            began = datetime.fromtimestamp(minute * 60, UTC).replace(tzinfo=None)  # as logged_at
            (logged,) = one(con, parsed(_LOGGED), [began, user])
            taken = read = max(taken, logged)
        if taken + len(sql) > CHARACTERS_PER_MINUTE:
            _taken[key] = (minute, taken, read)
            raise PolicyViolation(
                f"user {user!r} has sent {taken:,} characters of statements this minute; "
                f"this one's {len(sql):,} would take it over {CHARACTERS_PER_MINUTE:,}, the "
                "most the audit log takes from one user",
                "send it again in the next minute, or shorten it (comments, long literals and "
                "parameters count)",
            )
        _taken[key] = (minute, taken + len(sql), read)
