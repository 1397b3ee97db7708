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

The bound per name let a guesser who rotates names go on: 10 guesses for each of 100 names
from one client were all checked in a minute (1,000 proofs, red team s46g), which tries a
common password against every account, or one account's passwords under spellings that
reach it. So an address also has :data:`ATTEMPTS_PER_ADDRESS` unsuccessful logins a minute,
all names together (``sqlsdc serve --max-failed-logins-per-address``); beyond, every login
from it is refused before its proof is read, whatever the name, until attempts expire (a
success is forgotten here too: an office behind one address logging in all day is never
refused). An IPv6 peer is counted by its /64 network, the block one host is given (RFC
4291's interface identifiers): a host that picks a new address of its block for each attempt
is still one address.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from sqlsdc.server.sqlstate import Fatal

if TYPE_CHECKING:
    import asyncio

__all__ = ["ATTEMPTS_PER_ADDRESS", "ATTEMPTS_PER_MINUTE", "LoginAttempts", "peer"]

ATTEMPTS_PER_MINUTE = 10
"""Logins of one user name from one address that may be unfinished or failed in a minute."""
ATTEMPTS_PER_ADDRESS = 30
"""Logins from one address (any names) that may be unfinished or failed in a minute."""
WINDOW = 60.0  # seconds
LOGGED_PER_MINUTE = 100
"""Failed logins logged one by one in a minute (all names and addresses together)."""
SHOWN_NAME = 64
"""Characters of a user name a log line shows."""

log = logging.getLogger("sqlsdc.server")


class LoginAttempts:
    """The unsuccessful login attempts of the last minute, by (user name, peer) and by peer
    (:func:`peer`: the address, an IPv6 one's /64)."""

    def __init__(self, limit: int = ATTEMPTS_PER_MINUTE, window: float = WINDOW,
                 per_address: int = ATTEMPTS_PER_ADDRESS):  # fmt: skip
        self.limit, self.window, self.per_address = limit, window, per_address
        self._attempts: dict[tuple[str, str], deque[float]] = {}
        self._by_address: dict[str, deque[float]] = {}
        self._pruned = (0.0, 0)  # when the last pruning was, and the keys it left
        self._logging = [-1, 0, 0]  # the minute of the log lines, lines logged, failures not

    def begin(self, user: str, host: str) -> tuple[tuple[str, str], float]:
        """Count an attempt of ``user`` from ``host``, or refuse it (Fatal 28000) when
        :attr:`limit` attempts of the name from the address, or :attr:`per_address` of any
        names from it, did not succeed in the last minute. Returns the attempt, for
        :meth:`succeeded`. Called on the event loop: no other attempt runs in between."""
        now, address = time.monotonic(), peer(host)
        key = (user, address)
        self._prune(now)
        begun = self._recent(self._attempts, key, now)
        from_address = self._recent(self._by_address, address, now)
        if len(from_address) >= self.per_address:
            raise Fatal("28000", "too many failed logins from this address",
                        f"at most {self.per_address} a minute from one address, whatever the "
                        "user names; try again in a minute")  # fmt: skip
        if len(begun) >= self.limit:
            raise Fatal("28000", f'too many failed logins for user "{user}" from this address',
                        f"at most {self.limit} a minute; try again in a minute")  # fmt: skip
        begun.append(now)
        from_address.append(now)
        return key, now

    def _recent(self, attempts: dict, key, now: float) -> deque[float]:
        """The attempts under ``key`` begun in the last minute (older ones dropped)."""
        begun = attempts.setdefault(key, deque())
        while begun and begun[0] <= now - self.window:
            begun.popleft()
        return begun

    def succeeded(self, attempt: tuple[tuple[str, str], float]) -> None:
        """Forget a successful attempt: a user's own logins never refuse the next, nor
        another user's from the same address."""
        key, at = attempt
        for attempts, under in ((self._attempts, key), (self._by_address, key[1])):
            begun = attempts.get(under)
            if begun is not None:
                try:
                    begun.remove(at)
                except ValueError:  # pruned as expired meanwhile
                    pass
                if not begun:
                    del attempts[under]

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
        held = len(self._attempts) + len(self._by_address)
        if now - at < self.window and held <= max(1024, 2 * left):
            return
        for attempts in (self._attempts, self._by_address):
            expired = [k for k, v in attempts.items() if not v or v[-1] <= now - self.window]
            for key in expired:
                del attempts[key]
        self._pruned = (now, len(self._attempts) + len(self._by_address))


def peer(host: str) -> str:
    """The address login attempts are counted under: ``host`` itself, an IPv6 address's /64
    network (an IPv4-mapped one's IPv4 address); a host that is no address (a Unix socket's
    empty name) as it is."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])  # a scope id: the same host
    except ValueError:
        return host
    if address.version == 6:
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def peer_of(writer: asyncio.StreamWriter) -> str:
    """The :func:`peer` a client's connection comes from."""
    return peer((writer.get_extra_info("peername") or ("",))[0])
