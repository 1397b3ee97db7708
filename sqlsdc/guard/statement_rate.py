"""How much SQL text one user's statements may put in the audit log a minute.

An accepted statement is logged whole (it is what was released), up to the policy's
``max_statement_characters`` (default 1,000,000). A comment or a string literal the check
never evaluates costs the engine nothing, so an analyst sending ``SELECT COUNT(*) FROM
persons /* 990,000 random characters */`` in a loop grew the database by 11 MB in 2.9 s of
CPU (3.8 MB a CPU second; red team s44e), more than the refusals the audit's rate bounds
(:mod:`sqlsdc.catalog.refusal_rate`). So a user's statements longer than :data:`FREE`
characters may add up to :data:`CHARACTERS_PER_MINUTE` a minute (UTC minutes, counted in
this process: a server's sessions share it); a statement beyond is refused before anything
is run or charged, saying what to do. Shorter statements are not counted: their log grows
no faster than queries run.
"""

from __future__ import annotations

import os
import threading
import time

from sqlsdc.errors import PolicyViolation

__all__ = ["CHARACTERS_PER_MINUTE", "FREE", "check"]

FREE = 4_096
"""Statements up to this many characters are not counted."""
CHARACTERS_PER_MINUTE = 4 * 2**20
"""Characters of one user's longer statements taken a minute (4 MiB: four of the longest a
default policy accepts)."""

_lock = threading.Lock()
_taken: dict[tuple[str, str], tuple[int, int]] = {}  # (database, user) -> (minute, characters)


def check(database: str, user: str, sql: str) -> None:
    """Count ``sql`` against ``user``'s minute on ``database``, or refuse it (nothing counted)
    when it would take the minute over :data:`CHARACTERS_PER_MINUTE`."""
    if len(sql) <= FREE:
        return
    minute, key = int(time.time() // 60), (os.path.realpath(database), user)
    with _lock:
        at, taken = _taken.get(key, (minute, 0))
        taken = taken if at == minute else 0
        if taken + len(sql) > CHARACTERS_PER_MINUTE:
            raise PolicyViolation(
                f"user {user!r} has sent {taken:,} characters of statements longer than "
                f"{FREE:,} this minute; this one's {len(sql):,} would take it over "
                f"{CHARACTERS_PER_MINUTE:,}, the most the audit log takes from one user",
                "send it again in the next minute, or shorten it (comments and long literals "
                "count)",
            )
        _taken[key] = (minute, taken + len(sql))
