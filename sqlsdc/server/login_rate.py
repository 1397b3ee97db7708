"""How many password attempts the server answers for one user name from one address a minute.

SCRAM costs the server two HMACs an attempt (the client computes the 4,096 PBKDF2 rounds):
one client tried 300 passwords for ``admin`` in 2.1 s, the last one right, and nothing was
refused or logged (red team s45h) — an online dictionary attack at 140 guesses a second per
client, unseen, against any server user (an analyst logging in as another spends that user's
budget; as an admin, reaches the admin's role).

So a user name may begin :data:`ATTEMPTS_PER_MINUTE` logins from one address (the peer's
host) that did not succeed in the last minute; one more is refused before its proof is read,
whatever the password, saying to wait. An attempt counts from its start (a client opening
many handshakes at once gets no more proofs checked), and is forgotten when it succeeds. A
name's attempts from other addresses are not affected (another client cannot lock a user out
everywhere), and an unknown name counts like a known one (the refusal tells nothing about
which names exist). PostgreSQL leaves this to its ``auth_delay`` module and logs each failed
attempt; each failure is logged here too (the name quoted and cut at :data:`SHOWN_NAME`
characters, never the password), up to :data:`LOGGED_PER_MINUTE` a minute: beyond, they are
counted in one line (a client failing logins with new names of 10,000 characters in a loop
would otherwise fill the server's log as fast as it connects).
"""

from __future__ import annotations

import logging
import time
from collections import deque

from sqlsdc.server.sqlstate import Fatal

__all__ = ["ATTEMPTS_PER_MINUTE", "LoginAttempts"]

ATTEMPTS_PER_MINUTE = 10
"""Logins of one user name from one address that may be unfinished or failed in a minute."""
WINDOW = 60.0  # seconds
LOGGED_PER_MINUTE = 100
"""Failed logins logged one by one in a minute (all names and addresses together)."""
SHOWN_NAME = 64
"""Characters of a user name a log line shows."""

log = logging.getLogger("sqlsdc.server")


class LoginAttempts:
    """The unsuccessful login attempts of the last minute, by (user name, peer host)."""

    def __init__(self, limit: int = ATTEMPTS_PER_MINUTE, window: float = WINDOW):
        self.limit, self.window = limit, window
        self._attempts: dict[tuple[str, str], deque[float]] = {}
        self._pruned = (0.0, 0)  # when the last pruning was, and the keys it left
        self._logging = [-1, 0, 0]  # the minute of the log lines, lines logged, failures not

    def begin(self, user: str, host: str) -> tuple[tuple[str, str], float]:
        """Count an attempt of ``user`` from ``host``, or refuse it (Fatal 28000) when
        :attr:`limit` attempts of the last minute did not succeed. Returns the attempt, for
        :meth:`succeeded`. Called on the event loop: no other attempt runs in between."""
        now, key = time.monotonic(), (user, host)
        self._prune(now)
        begun = self._attempts.setdefault(key, deque())
        while begun and begun[0] <= now - self.window:
            begun.popleft()
        if len(begun) >= self.limit:
            raise Fatal("28000", f'too many failed logins for user "{user}" from this address',
                        f"at most {self.limit} a minute; try again in a minute")  # fmt: skip
        begun.append(now)
        return key, now

    def succeeded(self, attempt: tuple[tuple[str, str], float]) -> None:
        """Forget a successful attempt: a user's own logins never refuse the next."""
        key, at = attempt
        begun = self._attempts.get(key)
        if begun is not None:
            try:
                begun.remove(at)
            except ValueError:  # pruned as expired meanwhile
                pass
            if not begun:
                del self._attempts[key]

    def failed(self, user: str, host: str) -> None:
        """Log a failed login, or count it once :data:`LOGGED_PER_MINUTE` were logged this
        minute (the count is logged with the next minute's first failure)."""
        minute = int(time.monotonic() // 60)
        if minute != self._logging[0]:
            if self._logging[2]:
                log.warning("%d more failed logins in an earlier minute, not logged one by one",
                            self._logging[2])  # fmt: skip
            self._logging = [minute, 0, 0]
        if self._logging[1] >= LOGGED_PER_MINUTE:
            self._logging[2] += 1
            return
        self._logging[1] += 1
        shown = (
            user
            if len(user) <= SHOWN_NAME
            else f"{user[:SHOWN_NAME]}... ({len(user):,} characters)"
        )
        log.warning("password authentication failed for user %r from %s", shown, host)

    def _prune(self, now: float) -> None:
        """Drop the keys whose attempts all expired, once a minute or when their number
        doubled since the last pruning (a flood of new names costs O(1) an attempt)."""
        at, left = self._pruned
        if now - at < self.window and len(self._attempts) <= max(1024, 2 * left):
            return
        expired = [k for k, v in self._attempts.items() if not v or v[-1] <= now - self.window]
        for key in expired:
            del self._attempts[key]
        self._pruned = (now, len(self._attempts))
