"""``sqlsdc serve``: the asyncio server that accepts PostgreSQL clients.

One :class:`~sqlsdc.server.session.Session` per client; statements run in a bounded thread
pool (each session's guarded connection is synchronous). The server keeps the sessions by
process id for CancelRequests, which must carry the session's secret key (compared in constant
time), limits the number of clients, closes sessions idle longer than ``idle_timeout`` and
sessions whose client reads nothing of their answers for ``write_timeout``.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import os
import secrets
import signal
import ssl
import struct
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sqlsdc.errors import AccessDenied, Error, NotFoundError, OperationalError
from sqlsdc.server.auth import ServerUsers, decoy_secret
from sqlsdc.server.login_rate import ATTEMPTS_PER_ADDRESS, LoginAttempts, peer_of
from sqlsdc.server.session import Session

log = logging.getLogger("sqlsdc.server")


@dataclass(frozen=True)
class ServerSettings:
    """What ``sqlsdc serve`` was asked for (see its ``--help``)."""

    db: str
    host: str = "127.0.0.1"
    port: int = 5433
    tls_cert: str | None = None
    tls_key: str | None = None
    insecure: bool = False
    idle_timeout: float | None = None  # seconds; None: never
    statement_timeout: float | None = None  # seconds; None: the policy's
    max_connections: int = 100
    workers: int = 8
    max_connections_per_user: int | None = None  # None: half of max_connections, at least 1
    write_timeout: float = 60.0  # seconds a client may read nothing of what the server writes
    max_failed_logins_per_address: int = ATTEMPTS_PER_ADDRESS  # a minute, all names together

    @property
    def user_connections(self) -> int:
        """Logged-in sessions one user may hold: a share of ``max_connections``, so that one
        login (an analyst's idle sessions) cannot lock every other user out."""
        if self.max_connections_per_user is not None:
            return min(self.max_connections_per_user, self.max_connections)
        return max(1, self.max_connections // 2)


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server TLS context (TLS 1.2 or later) with the given certificate chain and key."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise Error(f"cannot load the TLS certificate {cert} and key {key}: "
                    f"{getattr(e, 'strerror', None) or e}") from None  # fmt: skip
    return context


def _check_catalog(db: str) -> None:
    """Refuse to serve a database without the sqlsdc catalog (a mistyped path, the release
    file): the server listened and refused every login."""
    from sqlsdc.catalog import store
    from sqlsdc.engines.duckdb import open_database

    con = open_database(db, writes_data=False)
    try:
        if store.current_policy(con) is None:
            raise store.no_catalog(db, con)
    finally:
        con.close()


class Server:
    """The listening server: settings, thread pool, sessions by process id."""

    def __init__(self, settings: ServerSettings):
        if not Path(settings.db).is_file():
            raise NotFoundError(f"database {settings.db} does not exist")
        _check_catalog(settings.db)
        if (settings.tls_cert is None) != (settings.tls_key is None):
            raise Error("give both --tls-cert and --tls-key, or neither")
        if settings.tls_cert is None and not settings.insecure:
            raise Error("no TLS certificate: give --tls-cert and --tls-key, or pass --insecure "
                        "to serve unencrypted connections (results and statements then cross "
                        "the network in clear)")  # fmt: skip
        self.settings = settings
        self.db = settings.db
        self.insecure = settings.insecure
        self.idle_timeout = settings.idle_timeout
        self.ssl_context = (tls_context(settings.tls_cert, settings.tls_key)
                            if settings.tls_cert else None)  # fmt: skip
        self.pool = ThreadPoolExecutor(settings.workers, thread_name_prefix="sqlsdc-session")
        self.users = ServerUsers(settings.db)
        self._shares: dict[str, asyncio.Semaphore] = {}  # per user: see in_pool
        self.decoy_secret = decoy_secret(settings.db)
        self.login_attempts = LoginAttempts(per_address=settings.max_failed_logins_per_address)
        self.sessions: dict[int, Session] = {}
        self._pids = itertools.count(os.getpid() % 100_000 * 10_000 + 1)
        self._secrets: dict[int, int] = {}
        self._server: asyncio.base_events.Server | None = None
        self._clients: set[asyncio.Task] = set()  # one task per connected client

    def connect(self, db: str, user: str):
        """A guarded connection for an authenticated session (called in the thread pool)."""
        from sqlsdc.guard.connection import connect

        asked = self.settings.statement_timeout
        if asked is None:
            return connect(db, user)
        try:
            return connect(db, user, timeout=asked)
        except AccessDenied:  # the policy's limit is shorter (or the user unknown: raised again)
            return connect(db, user)

    async def in_pool(self, function, *args, user: str | None = None):
        """Run ``function(*args)`` in the thread pool; with ``user``, wait first for one of that
        user's shares of the pool (half the workers, at least one), so that one user's slow
        statements never occupy every worker and make other users wait for them."""
        loop = asyncio.get_running_loop()
        if user is None:
            return await loop.run_in_executor(self.pool, function, *args)
        share = self._shares.setdefault(user, asyncio.Semaphore(max(1, self.settings.workers // 2)))
        async with share:
            return await loop.run_in_executor(self.pool, function, *args)

    def register(self, session: Session) -> tuple[int, int]:
        pid = next(self._pids) & 0x7FFFFFFF
        secret = struct.unpack("!i", secrets.token_bytes(4))[0]
        self.sessions[pid], self._secrets[pid] = session, secret
        return pid, secret

    def unregister(self, pid: int) -> None:
        self.sessions.pop(pid, None)
        self._secrets.pop(pid, None)

    def cancel(self, pid: int, secret: int) -> None:
        """A CancelRequest: only with the session's secret; nothing is said either way."""
        expected = self._secrets.get(pid)
        if expected is None:
            return
        if hmac.compare_digest(struct.pack("!i", expected), struct.pack("!i", secret)):
            self.sessions[pid].cancel()

    def logged_in(self, user: str | None = None) -> int:
        """Sessions past authentication (of ``user``, if given): what ``max_connections``
        (and ``user_connections``) bound."""
        return sum(1 for s in self.sessions.values()
                   if s.user_connected and (user is None or s.user == user))  # fmt: skip

    def held(self, user: str) -> int:
        """Bytes the logged-in sessions of ``user`` keep (answers and parameters of portals,
        answers of described statements): what ``MAX_HELD_BYTES`` bounds, for all together."""
        return sum(s.held() for s in self.sessions.values()
                   if s.user_connected and s.user == user)  # fmt: skip

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one client. Handshakes not yet authenticated are bounded apart (as many as
        ``max_connections``): when they are all taken, one gives way to the newcomer, the
        oldest of the address (:func:`~sqlsdc.server.login_rate.peer`) that holds the most
        of them, the newcomer counted. So sockets held open without logging in cannot lock
        real users out, and a flood of connects from one address drops its own handshakes,
        not those of users logging in from elsewhere (red team s47g: 500 connects a second
        dropped 1 of 12 logins, and a dropped login counts as a failed one)."""
        pending = [s for s in self.sessions.values() if not s.user_connected]
        if len(pending) >= self.settings.max_connections:
            held = Counter(s.peer for s in pending)
            held[peer_of(writer)] += 1
            most = max(held.values())
            crowded = [s for s in pending if held[s.peer] == most]
            min(crowded, key=lambda s: s.opened).evict()
        task = asyncio.current_task()
        self._clients.add(task)
        try:
            await Session(self, reader, writer).run()
        finally:
            self._clients.discard(task)

    async def start(self) -> asyncio.base_events.Server:
        host, port = self.settings.host, self.settings.port
        try:
            self._server = await asyncio.start_server(self._client, host, port, limit=2**16)
        except OSError as failure:  # a host that does not resolve said only "name or service
            reason = failure.strerror or str(failure)  # not known", not which
            if failure.errno and failure.errno > 0:  # asyncio words a bind's error its own way
                reason = os.strerror(failure.errno)
            raise OperationalError(f"cannot listen on {host}:{port}: {reason.lower()}") from None
        return self._server

    @property
    def address(self) -> tuple[str, int]:
        return self._server.sockets[0].getsockname()[:2]

    async def serve_forever(self, ready=None) -> None:
        """Serve until SIGINT or SIGTERM (Ctrl-C, ``kill``, a service manager), then end every
        session and return. Without this a stop with a session open printed asyncio's
        tracebacks of the sessions it cancelled."""
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for number in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(number, stop.set)
            except (NotImplementedError, RuntimeError, ValueError):
                # a server run in another thread (tests, an embedding application) gets no
                # signals: whoever started it stops it with shut_down()
                continue
        if ready is not None:
            ready(*self.address)
        async with self._server:
            await stop.wait()
            await self.shut_down()

    async def shut_down(self, grace: float = 5.0) -> None:
        """Stop listening, end every session as PostgreSQL ends them at a shutdown (FATAL
        57P01, running statements interrupted) and wait for them to close their connections."""
        self._server.close()
        for session in list(self.sessions.values()):
            session.terminate()
        if self._clients:
            await asyncio.wait(set(self._clients), timeout=grace)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
