"""One client of ``sqlsdc serve``: startup, authentication, then the simple and extended query
protocols (PostgreSQL documentation, chapter 55 "Frontend/Backend Protocol", 55.2 "Message
Flow"), every statement answered by the session catalog or by the user's guarded connection.

SQL cursors (``DECLARE``/``FETCH``/``MOVE``/``CLOSE``, :mod:`sqlsdc.server.cursors`) are
portals named by the client, kept apart from the protocol's (Sync does not close them).

Statements run in the server's bounded thread pool (a guarded connection is synchronous); the
event loop only reads, parses and writes messages. Errors become ErrorResponses with SQLSTATE
codes (:func:`error_fields`); an engine's own text never reaches a client (the guard withholds
it), and an unexpected failure is reported as XX000 with no detail.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import struct
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pyarrow as pa

from sqlsdc.errors import (
    AccessDenied,
    AnswerTooLarge,
    BudgetExhausted,
    Error,
    InternalError,
    NotSupportedError,
    OperationalError,
    PolicyViolation,
    ProgrammingError,
    QueryCanceled,
    SqlSyntaxError,
)
from sqlsdc.server import arrays, codec, cursors, types
from sqlsdc.server.auth import MECHANISM, AuthenticationFailed, ScramExchange
from sqlsdc.server.catalog import CatalogAnswer, SessionCatalog
from sqlsdc.server.codec import ProtocolError
from sqlsdc.server.colnames import postgres_names
from sqlsdc.server.qualified import unqualified
from sqlsdc.server.shadow import SERVER_VERSION

log = logging.getLogger("sqlsdc.server")
timing = logging.getLogger("sqlsdc.server.timing")
"""Per-statement timings at DEBUG level, for benchmarks/server/bench_server.py only: off unless
``sqlsdc serve`` runs with ``SQLSDC_SERVER_TIMING=1``; a line holds two durations, never a
statement, a user or a value."""

MAX_PARAMETERS = 65_535  # PostgreSQL's limit: ParameterDescription counts them in 16 bits
MAX_PREPARED = 1_000  # named statements (and portals) one session may keep
MAX_PREPARED_BYTES = 32 * 1024 * 1024  # their text, together: one analyst cannot fill memory
MAX_HELD_BYTES = 64 * 1024 * 1024  # answers kept for portals and described statements by all
# sessions of one user; beyond, none of them runs a further statement to keep until some are
# closed (so a user keeps less than this plus one answer per statement running at once)
ROWS_PER_WRITE = 1000  # DataRows encoded and written at a time
INLINE_ROWS = 100  # DataRows encoded on the event loop (tens of microseconds), not in the pool
INLINE_TEXT = 65_536  # characters of a Parse (bytes of a Bind's values) read on the event loop
AUTH_TIMEOUT = 15.0  # seconds from the first byte to the end of authentication
BUDGET_EXHAUSTED = "53S01"  # class 53 "insufficient resources", an implementation-defined code
_BLANK = re.compile(r"(?:\s|;|--[^\n]*+(?:\n|\Z)|/\*.*?\*/)*+\Z", re.S)
"""Spaces, semicolons and comments only (matched from the start), each comment the shortest: the
repetition is possessive, so a statement that is not blank fails once. It backtracked through
every way of reading ``/**//**/`` as one comment or two: 40 empty comments before ``SELECT 1``
(a 170-byte Query) held the event loop, and every session of every user, for about a day
(red team s35b)."""
_PARAMETER = re.compile(r"\$(\d{1,5})")
_NOT_CODE = re.compile(
    r"'(?:[^']|'')*+(?:'|\Z)|\"(?:[^\"]|\"\")*+(?:\"|\Z)|--[^\n]*+|/\*(?:.*?\*/|.*)", re.S
)
"""String literals, quoted names and comments, an unclosed one to the end (so that a text of
many unclosed ``/*`` is read once, not once per ``/*``): a ``$1`` inside them is no parameter."""
_CAST = re.compile(
    r"\$(\d{1,5})\s*::\s*([a-z0-9_]+)(\s*\[\s*\])?"
    r"|cast\s*\(\s*\$(\d{1,5})\s+as\s+([a-z0-9_]+)(\s*\[\s*\])?",
    re.I,
)
"""``$n::type`` and ``CAST($n AS type)``, ``type[]`` an array of it (a list for ``= ANY``)."""
_ANY = re.compile(r"=\s*+any\s*+\(\s*+\$(\d{1,5})\s*+\)", re.I)
"""``= ANY($n)``: PostgreSQL types an untyped ``$n`` there as an array of text, as psycopg
sends a list of str (``col = ANY(%s)``)."""
_NOT_IN_TRANSACTION = ("COMMIT", "ROLLBACK")


class StatementError(Exception):
    """An error that ends one statement (ERROR severity); the session goes on."""

    def __init__(self, code: str, text: str, hint: str = ""):
        super().__init__(text)
        self.code, self.text, self.hint = code, text, hint


class WriteTimeout(Exception):
    """The client read nothing of what the session wrote for the server's write timeout."""


class Fatal(Exception):
    """An error that ends the session (FATAL severity)."""

    def __init__(self, code: str, text: str, hint: str = ""):
        super().__init__(text)
        self.code, self.text, self.hint = code, text, hint


def error_fields(error: BaseException, cancelled: bool = False) -> StatementError:
    """The SQLSTATE, message and hint of an error raised by the guard or the catalog."""
    if isinstance(error, StatementError):
        return error
    if isinstance(error, SqlSyntaxError):
        return StatementError("42601", error.reason, error.hint)
    if isinstance(error, PolicyViolation):
        return StatementError("42501", error.reason, error.hint)
    if isinstance(error, BudgetExhausted):
        return StatementError(BUDGET_EXHAUSTED, str(error))
    if isinstance(error, QueryCanceled) or (cancelled and isinstance(error, OperationalError)):
        # a cancel that lands in the ledger write fails it (OperationalError): still a cancel
        return StatementError("57014", "canceling statement due to user request"
                              if cancelled else str(error))  # fmt: skip
    if isinstance(error, AccessDenied):
        return StatementError("42501", str(error))
    if isinstance(error, NotSupportedError):
        return StatementError("0A000", str(error))
    if isinstance(error, ProgrammingError):
        return StatementError("08P01", str(error))
    if isinstance(error, types.ParameterError):
        return StatementError("22P02", str(error))
    if isinstance(error, InternalError) or not isinstance(error, Error):
        log.error("internal error: %s", type(error).__name__)
        return StatementError("XX000", "internal error in sqlsdc; the server log names it")
    if isinstance(error, AnswerTooLarge):
        return StatementError("54000", str(error))  # program_limit_exceeded
    if isinstance(error, OperationalError):
        return StatementError("58000", str(error))
    return StatementError("XX000", str(error))  # sqlsdc's own words, never the engine's


@dataclass
class Statement:
    sql: str
    param_types: tuple[int, ...]
    described: CatalogAnswer | None = None  # run by Describe (no parameters), for the Execute
    text_only: bool = False  # described before its parameters were known: columns as text
    schema: pa.Schema | None = None  # a catalog statement's, described with NULL parameters

    @property
    def nbytes(self) -> int:
        """Bytes it keeps: the answer of its Describe, not yet taken by a Bind."""
        return _answer_bytes(self.described)


@dataclass
class Portal:
    statement: Statement
    params: tuple
    formats: tuple[int, ...]
    result: CatalogAnswer | None = None
    position: int = 0
    text_only: bool = False
    encoded: list | None = field(default=None, repr=False)
    size: int = 0  # bytes of the parameter values of its Bind, which it keeps
    hold: bool = False  # a cursor declared WITH HOLD: kept after its transaction block

    @property
    def nbytes(self) -> int:
        """Bytes it keeps: its answer and the parameter values of its Bind."""
        return self.size + _answer_bytes(self.result)


def _answer_bytes(answer: CatalogAnswer | None) -> int:
    return 0 if answer is None or answer.table is None else answer.table.nbytes


def parameter_types(sql: str, given: tuple[int, ...]) -> tuple[int, ...]:
    """Types of ``$1 .. $n``: as the client gave them, else from a cast in the statement
    (``$1::int``, ``CAST($1 AS date)``, ``$1::text[]`` an array of text), else an array of
    text in ``= ANY($n)``, else text (the guard converts text as DuckDB does)."""
    sql = _NOT_CODE.sub(" ", sql)  # WHERE code <> '$2' takes no parameter
    count = max([len(given), *(int(n) for n in _PARAMETER.findall(sql))])
    if count > MAX_PARAMETERS:
        raise ValueError(f"{count} parameters")
    cast = {}
    for match in _CAST.finditer(sql):
        number, name, array = match.group(1, 2, 3) if match.group(1) else match.group(4, 5, 6)
        oid = types.NAMES.get(name.lower(), types.TEXT)
        cast.setdefault(int(number), arrays.ARRAY_OF.get(oid, arrays.TEXT_ARRAY) if array else oid)
    for match in _ANY.finditer(sql):
        cast.setdefault(int(match.group(1)), arrays.TEXT_ARRAY)
    return tuple(
        (given[i] if i < len(given) and given[i] else cast.get(i + 1, types.TEXT))
        for i in range(count)
    )


class Session:
    """The protocol state of one client connection."""

    def __init__(self, server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.server, self.reader, self.writer = server, reader, writer
        self.pid, self.secret = server.register(self)
        self.opened = time.monotonic()
        self.user_connected = False  # authenticated, counted against max_connections
        self.tls = False
        self.user = ""
        self.connection = None
        self.catalog: SessionCatalog | None = None
        self.status = "I"  # ReadyForQuery: I idle, T in a transaction block, E failed block
        self.statements: dict[str, Statement] = {}
        self.portals: dict[str, Portal] = {}
        self.cursors: dict[str, Portal] = {}  # SQL cursors (DECLARE), by name: not closed by Sync
        self._kept_bytes: dict[tuple[str, str], int] = {}  # ("S"|"P"|"C", name) -> its nbytes
        self._kept_total = 0  # their sum: what held() reads without walking every portal
        self.skipping = False  # after an error in the extended protocol, until Sync
        self.running = False
        self.cancelled = False
        self.sending = 0  # bytes of a simple Query's answer still being written to the client
        self.received: float | None = None  # first message since the last ReadyForQuery
        self.guard_seconds = 0.0  # time in the guarded connection since then

    # --- lifecycle --------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            if await asyncio.wait_for(self._startup(), AUTH_TIMEOUT):
                await self._serve()
        except Fatal as e:
            self._send(codec.error_response("FATAL", e.code, e.text, hint=e.hint))
        except ProtocolError as e:
            self._send(codec.error_response("FATAL", "08P01", str(e)))
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        except WriteTimeout:  # nothing more can reach the client: no message, the socket reset
            log.info("session %d closed: its client read nothing for %g s", self.pid,
                     self.server.settings.write_timeout)  # fmt: skip
            self._abort()
        except Exception as e:  # noqa: BLE001 - a session never takes the server down
            log.error("session %d ended by an internal error: %s", self.pid, type(e).__name__)
            self._send(codec.error_response("FATAL", "XX000", "internal error in sqlsdc"))
        finally:
            await self._close()

    async def _close(self) -> None:
        """Let go of everything the session holds: its place and what it keeps (no longer
        counted for its user), its portals and statements, its catalog, the statement it runs
        (interrupted) and its guarded connection (with the database file). What it wrote is
        given a second to reach the client; a client that does not read it gets a reset: a
        plain close waits for the write buffer to empty, which kept it, and the socket, for as
        long as the client would not read."""
        self.server.unregister(self.pid)
        self.statements.clear()
        self.cursors.clear()
        self._close_portals()
        self._kept_bytes.clear()
        self._kept_total = self.sending = 0
        try:
            await asyncio.wait_for(self.writer.drain(), 1.0)
            self.writer.close()
        except (ConnectionError, TimeoutError, RuntimeError):
            self._abort()
        if self.catalog is not None:
            self.catalog.close()
        if self.connection is not None:
            if self.running:
                self.connection.interrupt()
            await self.server.in_pool(self.connection.close)

    def evict(self) -> None:
        """End a handshake that has not authenticated (the server needs its place), saying
        why: a client that was logging in got only "server closed the connection
        unexpectedly"."""
        self._send(codec.error_response(
            "FATAL", "53300", "too many connections are logging in at once",
            hint="try again; --max-connections bounds the handshakes in progress",
        ))  # fmt: skip
        self.writer.close()

    def terminate(self) -> None:
        """End the session because the server stops: say so, interrupt its statement."""
        self._send(codec.error_response(
            "FATAL", "57P01", "terminating connection: the server is shutting down"
        ))  # fmt: skip
        self.cancel()
        self.writer.close()

    def cancel(self) -> None:
        """A CancelRequest for this session: stop the running statement, if any."""
        if self.running and self.connection is not None:
            self.cancelled = True
            self.connection.interrupt()

    def _send(self, data: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.write(data)

    async def _drain(self) -> None:
        """Wait until what was written drains below the transport's mark, at most the server's
        write timeout; then the session ends (:class:`WriteTimeout`). A client that stopped
        reading kept its session waiting here for ever, with its place, what it keeps counted
        against its user, its guarded connection and the write buffer (red team s35b)."""
        try:
            await asyncio.wait_for(self.writer.drain(), self.server.settings.write_timeout)
        except TimeoutError:
            raise WriteTimeout from None

    def _abort(self) -> None:
        """Drop the connection at once, with what is left to write: a reset (``SO_LINGER``
        0), so that neither this process nor the kernel keeps trying to send it."""
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass  # already closed
        self.writer.transport.abort()

    # --- startup and authentication ----------------------------------------------------------

    async def _startup(self) -> bool:
        for _ in range(3):  # an SSLRequest and a GSSENCRequest may come before the startup
            code, body = await codec.read_startup(self.reader)
            if code == codec.SSL_REQUEST:
                body.end()
                if self.server.ssl_context is not None and not self.tls:
                    if self.reader._buffer:  # noqa: SLF001 - asyncio has no public way to ask
                        # bytes sent in clear before our answer would be read as if they came
                        # through TLS (PostgreSQL's CVE-2021-23214)
                        raise ProtocolError("received unencrypted data after SSL request")
                    self.writer.write(b"S")
                    await self.writer.drain()
                    await self.writer.start_tls(self.server.ssl_context)
                    self.tls = True
                else:
                    self.writer.write(b"N")
                continue
            if code == codec.GSSENC_REQUEST:
                self.writer.write(b"N")
                continue
            if code == codec.CANCEL_REQUEST:
                pid, secret = body.int32(), body.int32()
                self.server.cancel(pid, secret)
                return False
            if code >> 16 == 3:
                return await self._authenticate(code, codec.parse_startup(body))
            raise ProtocolError(f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}; "
                                "this server speaks 3.0")  # fmt: skip
        raise ProtocolError("too many negotiation requests before the startup message")

    async def _authenticate(self, code: int, params: dict[str, str]) -> bool:
        options = [k for k in params if k.startswith("_pq_.")]
        if code & 0xFFFF or options:
            self._send(codec.negotiate_protocol_version(0, options))
        if not self.tls and not self.server.insecure:
            raise Fatal("28000", "this server accepts only TLS connections",
                        "connect with sslmode=require")  # fmt: skip
        self.user = params.get("user", "")
        if not self.user:
            raise Fatal("28000", "no user name in the startup message")
        keys = await self.server.in_pool(self.server.users.keys, self.user)
        exchange = ScramExchange(self.user, keys, self.server.decoy_secret)
        self._send(codec.sasl_mechanisms(MECHANISM))
        await self.writer.drain()
        failed = Fatal("28P01", f'password authentication failed for user "{self.user}"')
        mechanism, first = codec.parse_sasl_initial(await self._expect_password())
        if mechanism != MECHANISM:
            raise Fatal("28000", f"SASL mechanism {mechanism!r} is not offered; use {MECHANISM}")
        try:
            self._send(codec.authentication(codec.AUTH_SASL_CONTINUE, exchange.first(first)))
            await self.writer.drain()
            final = exchange.final((await self._expect_password()).rest())
        except AuthenticationFailed:
            raise failed from None
        if self.server.logged_in() >= self.server.settings.max_connections:
            raise Fatal("53300", "sorry, too many clients already")
        if self.server.logged_in(self.user) >= self.server.settings.user_connections:
            raise Fatal("53300", f'too many connections for role "{self.user}"',
                        f"one user may hold {self.server.settings.user_connections} sessions "
                        "(--max-connections-per-user); close some")  # fmt: skip
        self.user_connected = True
        self._send(codec.authentication(codec.AUTH_SASL_FINAL, final))
        self._send(codec.authentication(codec.AUTH_OK))
        try:
            self.connection = await self.server.in_pool(
                self.server.connect, self.server.db, self.user
            )
        except Error as e:
            fields = error_fields(e)
            raise Fatal("28000" if isinstance(e, AccessDenied) else fields.code,
                        fields.text, fields.hint) from None  # fmt: skip
        self.catalog = SessionCatalog(self.connection)
        for name, value in self._parameters(params.get("application_name", "")):
            self._send(codec.parameter_status(name, value))
        self._send(codec.backend_key_data(self.pid, self.secret))
        self._send(codec.ready_for_query(self.status))
        await self.writer.drain()
        return True

    async def _expect_password(self) -> codec.Reader:
        kind, body = await codec.read_message(self.reader, limit=10_000)
        if kind != b"p":
            raise ProtocolError("expected a SASL response during authentication")
        return body

    def _parameters(self, application: str) -> list[tuple[str, str]]:
        return [("server_version", SERVER_VERSION), ("server_encoding", "UTF8"),
                ("client_encoding", "UTF8"), ("DateStyle", "ISO, MDY"), ("TimeZone", "UTC"),
                ("IntervalStyle", "postgres"), ("integer_datetimes", "on"),
                ("standard_conforming_strings", "on"), ("is_superuser", "off"),
                ("session_authorization", self.user), ("application_name", application),
                ("default_transaction_read_only", "on"), ("in_hot_standby", "off")]  # fmt: skip

    # --- the query loop ----------------------------------------------------------------------

    async def _serve(self) -> None:
        handlers = {b"Q": self._query, b"P": self._parse, b"B": self._bind,
                    b"D": self._describe, b"E": self._execute, b"C": self._close_message,
                    b"S": self._sync, b"H": self._flush}  # fmt: skip
        while True:
            try:
                kind, body = await asyncio.wait_for(
                    codec.read_message(self.reader), self.server.idle_timeout
                )
            except TimeoutError:
                raise Fatal("57P05", "terminating connection due to idle-session timeout") from None
            if self.received is None:
                self.received = time.perf_counter()
            if kind == b"X":
                return
            handler = handlers.get(kind)
            if handler is None:
                raise ProtocolError(f"unexpected message type {kind!r}")
            if self.skipping and kind != b"S":
                continue  # the extended protocol discards messages after an error until Sync
            try:
                await handler(body)
            except StatementError as e:
                self._send(codec.error_response("ERROR", e.code, e.text, hint=e.hint))
                if kind != b"Q":
                    self.skipping = True
                if kind == b"Q":
                    await self._ready()
            # what a message wrote waits for the client to read it before the next message is
            # read: a client that pipelines messages and reads nothing back otherwise grows the
            # server's write buffer without bound (8-byte Describes of a statement with 32,767
            # parameters each wrote 128 KB: 32 KB sent held 420 MB; red team s35b)
            await self._drain()
            # and the other sessions get their turn: reading a message already in the buffer
            # does not return to the event loop, so a client that sent thousands of messages in
            # one go had them all handled before any other session's (10 sessions of one
            # analyst, 20,000 Binds each, made another user's SELECT 1 wait 5 s)
            await asyncio.sleep(0)

    async def _answer(self, sql: str, params: tuple) -> CatalogAnswer:
        """The catalog's answer or the guard's result, run in the thread pool."""
        if self.status == "E" and _tag_of(sql) not in _NOT_IN_TRANSACTION:
            raise StatementError("25P02", "current transaction is aborted, commands ignored "
                                 "until end of transaction block", "send ROLLBACK")  # fmt: skip
        cursor = cursors.cursor_text(sql)
        self.running, self.cancelled = True, False
        try:
            if cursor is not None:
                answer = await self._cursor(cursor, params)
            else:
                answer, guarded = await self.server.in_pool(
                    _run, self.catalog, self.connection, sql, params, user=self.user
                )
                self.guard_seconds += guarded
        except Exception as e:  # noqa: BLE001 - mapped to an SQLSTATE by error_fields
            if self.status == "T":
                self.status = "E"
            raise error_fields(e, self.cancelled) from None
        finally:
            self.running = False
        if answer.tag == "BEGIN":
            self.status = "T"
        elif answer.tag in _NOT_IN_TRANSACTION:
            self.status = "I"
            for name in [name for name, kept in self.cursors.items() if not kept.hold]:
                del self.cursors[name]  # a cursor WITHOUT HOLD ends with its block
                self._recount("C", name)
        return answer

    async def _cursor(self, text: str, params: tuple) -> CatalogAnswer:
        """A cursor statement (:mod:`sqlsdc.server.cursors`): DECLARE runs its query through
        the catalog or the guard, as any statement, and keeps the answer under the cursor's
        name (counted against the user's bound, as a portal's); FETCH and MOVE hand out or
        skip its rows forward; CLOSE lets it go. An unreadable or unsupported one is audited
        as a refusal."""
        try:
            statement = cursors.read(text)
        except Error as refusal:
            await self.server.in_pool(self.connection.audit_refusal, text, refusal,
                                      user=self.user)  # fmt: skip
            raise
        if isinstance(statement, cursors.Declare):
            return await self._declare(statement, params)
        if isinstance(statement, cursors.Close):
            names = list(self.cursors) if statement.name is None else [statement.name]
            for name in names:
                self._cursor_named(name)
                del self.cursors[name]
                self._recount("C", name)
            return CatalogAnswer(None, "CLOSE CURSOR" + (" ALL" if statement.name is None else ""))
        kept = self._cursor_named(statement.name)
        table, start = kept.result.table, kept.position
        rest = table.num_rows - start
        taken = rest if statement.count == cursors.ALL else min(rest, statement.count)
        kept.position = start + taken
        if not statement.fetch:
            return CatalogAnswer(None, f"MOVE {taken}")
        return CatalogAnswer(table.slice(start, taken), f"FETCH {taken}")

    async def _declare(self, statement: cursors.Declare, params: tuple) -> CatalogAnswer:
        if statement.name in self.cursors or statement.name in self.portals:
            raise StatementError("42P03", f'cursor "{statement.name}" already exists')
        if not statement.hold and self.status != "T":
            raise StatementError("25P01", "DECLARE CURSOR can only be used in transaction "
                                 "blocks", "send BEGIN first, or declare it WITH HOLD")  # fmt: skip
        if len(self.cursors) >= MAX_PREPARED:
            raise StatementError("53400", f"this session keeps {MAX_PREPARED} open cursors, the "
                                 "most it may", "close cursors it no longer needs")  # fmt: skip
        self._check_held()
        answer, guarded = await self.server.in_pool(
            _run, self.catalog, self.connection, statement.query, params, user=self.user
        )
        self.guard_seconds += guarded
        if answer.table is None:
            raise StatementError("42601", f"a cursor is declared for a query; "
                                 f"{answer.tag} returns no rows", "DECLARE name CURSOR FOR "
                                 "SELECT ...")  # fmt: skip
        self.cursors[statement.name] = Portal(Statement(statement.query, ()), params, (),
                                              result=answer, hold=statement.hold)  # fmt: skip
        self._recount("C", statement.name)
        return CatalogAnswer(None, "DECLARE CURSOR")

    def _cursor_named(self, name: str) -> Portal:
        if name not in self.cursors:
            raise StatementError("34000", f'cursor "{name}" does not exist')
        return self.cursors[name]

    def _close_portals(self) -> None:
        """Close every portal, letting go of their answers and parameters: at Sync outside a
        transaction block, and at COMMIT and ROLLBACK sent as a simple Query (which left them
        open until the next Sync, counted against the user's 64 MB: red team s32c, closed in
        s35b). An extended-protocol COMMIT closes them at its Sync: its own portal may still be
        described, then executed."""
        self.portals.clear()
        for key in [key for key in self._kept_bytes if key[0] == "P"]:
            self._kept_total -= self._kept_bytes.pop(key)

    def held(self) -> int:
        """Bytes this session keeps for its portals (answers and bound parameter values),
        described statements (answers) and the simple Query whose answer it is writing.

        Kept as a running sum (:meth:`_recount`), not summed over the portals: every statement
        of every session of a user reads it, and walking 50 sessions' thousand portals and
        statements for each of a client's pipelined Binds held the event loop, so every other
        user's session waited (20,000 Binds from 10 sessions: 25 s; red team s35b)."""
        return self._kept_total + self.sending

    def _recount(self, kind: str, name: str) -> None:
        """Update the running sum of :meth:`held` after statement (``kind`` "S") or portal
        ("P") ``name`` was added, changed or removed: every such change calls this."""
        holder = {"S": self.statements, "P": self.portals, "C": self.cursors}[kind].get(name)
        now = 0 if holder is None else holder.nbytes
        self._kept_total += now - self._kept_bytes.pop((kind, name), 0)
        if now:
            self._kept_bytes[(kind, name)] = now

    def _check_held(self, more: int = 0) -> None:
        """Refuse (53400) to keep anything more while the sessions of this user keep
        :data:`MAX_HELD_BYTES` together (or would, with ``more`` bytes): a thousand suspended
        portals of 20 MB each would otherwise hold 20 GB of the server's memory
        (tests/security/test_redteam_s30.py), and so would 50 sessions of one user keeping
        64 MB each, a thousand portals bound with 4 MB parameters, or 50 sessions that never
        read the answers of their queries (test_redteam_s32c.py)."""
        held = self.server.held(self.user)
        if held + more >= MAX_HELD_BYTES:
            raise StatementError("53400", f"the sessions of user {self.user} keep "
                                 f"{held // 2**20} MB of answers and parameters in open portals "
                                 f"and described statements ({MAX_HELD_BYTES // 2**20} MB at "
                                 "most)", "close portals and statements they no longer need, "
                                 "or end the transaction blocks")  # fmt: skip

    async def _kept(self, sql: str, params: tuple) -> CatalogAnswer:
        """:meth:`_answer` for an answer the session keeps (a portal's, a described
        statement's), refused while what its user's sessions keep is at the bound."""
        self._check_held()
        return await self._answer(sql, params)

    async def _query(self, body: codec.Reader) -> None:
        sql = codec.parse_query(body)
        if _BLANK.match(sql):
            self._send(codec.EMPTY_QUERY)
        else:
            if _tag_of(sql) not in _NOT_IN_TRANSACTION:  # a client that does not read keeps
                self._check_held()  # its answer in the server: counted like a portal's
            answer = await self._answer(sql, ())
            if answer.tag in _NOT_IN_TRANSACTION:
                self._close_portals()  # as PostgreSQL closes them at the end of the transaction
            if answer.table is not None:
                self.sending = answer.table.nbytes
                try:
                    await self._rows(answer, (), text_only=False, position=0, limit=0,
                                     header=True)  # fmt: skip
                finally:
                    self.sending = 0
            else:
                self._send(codec.command_complete(answer.tag))
        await self._ready()

    async def _parse(self, body: codec.Reader) -> None:
        message = codec.parse_parse(body)
        if message.name and message.name in self.statements:
            raise StatementError("42P05", f'prepared statement "{message.name}" already exists')
        kept = [st for name, st in self.statements.items() if name != message.name]
        if len(kept) >= MAX_PREPARED or (
            sum(len(st.sql) for st in kept) + len(message.sql) > MAX_PREPARED_BYTES
        ):
            raise StatementError("53400", f"this session keeps {len(kept)} prepared statements "
                                 f"({MAX_PREPARED} or {MAX_PREPARED_BYTES // 2**20} MB of text "
                                 "at most)", "close (DEALLOCATE) statements it no longer "
                                 "needs")  # fmt: skip
        try:
            if len(message.sql) <= INLINE_TEXT:
                kinds = parameter_types(message.sql, message.param_types)
            else:  # a long one in the pool, within the user's share: 0.4 s for 4 MB on the event
                # loop made every other session wait (red team s35b: 6 sessions of one analyst
                # parsing 4 MB statements made another user's SELECT 1 take up to 3.4 s)
                kinds = await self.server.in_pool(parameter_types, message.sql,
                                                  message.param_types, user=self.user)  # fmt: skip
        except ValueError:
            raise StatementError("08P01", "parameter numbers must be between 1 and 65535") from None
        _forget_answer(self.statements.get(message.name))
        self.statements[message.name] = Statement(message.sql, kinds)
        self._recount("S", message.name)
        self._send(codec.PARSE_COMPLETE)

    async def _bind(self, body: codec.Reader) -> None:
        message = codec.parse_bind(body)
        statement = self._statement(message.statement)
        if len(message.params) != len(statement.param_types):
            raise StatementError("08P01", f"bind message supplies {len(message.params)} "
                                 f"parameters, but prepared statement requires "
                                 f"{len(statement.param_types)}")  # fmt: skip
        size = sum(len(value) for value in message.params if value is not None)
        try:  # a value the server cannot read fails this statement (22P02), not the session
            if size <= INLINE_TEXT:
                params = _parameters(message, statement.param_types)
            else:  # in the pool, within the user's share: a 4 MB Bind of 63 binary numerics
                # took 1.6 s of the event loop, which every session shares (red team s35b)
                params = await self.server.in_pool(_parameters, message, statement.param_types,
                                                   user=self.user)  # fmt: skip
        except types.ParameterError as e:
            raise error_fields(e) from None
        if message.portal and message.portal in self.portals:
            raise StatementError("42P03", f'portal "{message.portal}" already exists')
        if len(self.portals) >= MAX_PREPARED:
            raise StatementError("53400", f"this session keeps {MAX_PREPARED} open portals, the "
                                 "most it may", "close portals it no longer needs")  # fmt: skip
        self._check_held(size)
        portal = Portal(statement, params, message.result_formats, text_only=statement.text_only,
                        size=size)  # fmt: skip
        if statement.described is not None and not params:
            portal.result, statement.described = statement.described, None
        self.portals[message.portal] = portal
        self._recount("S", message.statement)
        self._recount("P", message.portal)
        self._send(codec.BIND_COMPLETE)

    async def _describe(self, body: codec.Reader) -> None:
        message = codec.parse_describe(body)
        if message.kind == "S":
            statement = self._statement(message.name)
            self._send(codec.parameter_description(statement.param_types))
            if _BLANK.match(statement.sql):
                self._send(codec.NO_DATA)
            elif statement.param_types:  # columns without running: names only, typed as text
                shape = await self._shape(statement)
                if isinstance(shape, pa.Schema):  # the catalog's, typed (no data read)
                    statement.schema = shape
                    self._send(_description(shape.empty_table(), (), text_only=False))
                else:
                    statement.text_only = True
                    self._send(_description(shape, (), text_only=True) if shape
                               else codec.NO_DATA)  # fmt: skip
            else:
                statement.described = await self._kept(statement.sql, ())
                self._recount("S", message.name)
                self._send(_description(statement.described.table, (), text_only=False)
                           if statement.described.table is not None else codec.NO_DATA)  # fmt: skip
            return
        portal = self._portal(message.name)
        if _BLANK.match(portal.statement.sql):
            self._send(codec.NO_DATA)
            return
        await self._portal_result(portal, message.name)
        table = portal.result.table
        self._send(codec.NO_DATA if table is None
                   else _description(table, portal.formats, portal.text_only))  # fmt: skip

    async def _portal_result(self, portal: Portal, name: str) -> None:
        """Run the portal's statement, once, and keep its answer (as its Describe typed it)."""
        if portal.result is None:
            answer = await self._kept(portal.statement.sql, portal.params)
            portal.result = _as_described(answer, portal.statement.schema)
            self._recount("P", name)

    async def _shape(self, statement: Statement) -> list[str] | pa.Schema:
        """Columns of a parameterised statement, without running it, with every parameter
        NULL (an array's a list of one NULL: ``= ANY($1)`` takes a list; nothing is read or
        charged): the catalog's answer, typed (asyncpg reads the oids of its type
        introspection as integers), or the names of the guard's plan."""
        nulls = tuple([None] if t in arrays.ELEMENTS else None for t in statement.param_types)

        if cursors.cursor_text(statement.sql) is not None:
            return []  # DECLARE answers no rows; FETCH, MOVE and CLOSE take no parameters

        def names():
            answer = _catalog_answer(self.catalog, self.connection, statement.sql, nulls)
            if answer is not None:
                return [] if answer.table is None else _named(statement.sql, answer).table.schema
            sql = unqualified(statement.sql, _database(self.connection))
            try:
                names = [c.name for c in self.connection.explain(sql, nulls).columns]
            except Error as refusal:  # explain audits nothing: audited here, as execute would
                self.connection.audit_refusal(sql, refusal)
                raise
            return postgres_names(sql, names)

        try:
            return await self.server.in_pool(names, user=self.user)  # the guard plans: a share
        except Exception as e:  # noqa: BLE001 - mapped to an SQLSTATE by error_fields
            raise error_fields(e) from None

    async def _execute(self, body: codec.Reader) -> None:
        message = codec.parse_execute(body)
        portal = self._portal(message.portal)
        if _BLANK.match(portal.statement.sql):
            self._send(codec.EMPTY_QUERY)
            return
        await self._portal_result(portal, message.portal)
        if portal.result.table is None:
            self._send(codec.command_complete(portal.result.tag))
            return
        portal.position = await self._rows(portal.result, portal.formats, portal.text_only,
                                           portal.position, message.max_rows)  # fmt: skip

    async def _rows(self, answer: CatalogAnswer, formats, text_only: bool, position: int,
                    limit: int, header: bool = False) -> int:  # fmt: skip
        """Send DataRows from ``position`` (at most ``limit``, 0 = all), then PortalSuspended
        or CommandComplete; returns the new position."""
        table = answer.table
        if header:
            self._send(_description(table, formats, text_only))
        end = table.num_rows if limit == 0 else min(table.num_rows, position + limit)
        for start in range(position, end, ROWS_PER_WRITE):
            chunk = table.slice(start, min(ROWS_PER_WRITE, end - start))
            if chunk.num_rows <= INLINE_ROWS:  # microseconds: a thread hand-off costs more
                self._send(_data_rows(chunk, formats, text_only))
            else:  # encoded in the pool: the event loop serves others meanwhile
                self._send(await self.server.in_pool(_data_rows, chunk, formats, text_only))
            await self._drain()
        if end < table.num_rows:
            self._send(codec.PORTAL_SUSPENDED)
        else:
            tag = answer.tag if not answer.tag.startswith("SELECT") else f"SELECT {end - position}"
            self._send(codec.command_complete(tag))
        return end

    async def _close_message(self, body: codec.Reader) -> None:
        message = codec.parse_close(body)
        closed = (self.statements if message.kind == "S" else self.portals).pop(message.name, None)
        if message.kind == "S":
            _forget_answer(closed)
        self._recount(message.kind, message.name)
        self._send(codec.CLOSE_COMPLETE)

    async def _sync(self, body: codec.Reader) -> None:
        """Sync ends the implicit transaction: outside a transaction block, every portal is
        closed, as in PostgreSQL (section 55.2.3), and its answer freed."""
        body.end()
        self.skipping = False
        if self.status == "I":
            self._close_portals()
        await self._ready()

    async def _ready(self) -> None:
        """ReadyForQuery, written out; then the timing line of what it ends (when enabled):
        from the first message received to the last byte written, and the guard's share."""
        self._send(codec.ready_for_query(self.status))
        await self._drain()
        if self.received is not None and timing.isEnabledFor(logging.DEBUG):
            total = time.perf_counter() - self.received
            timing.debug("timing guard_ms=%.3f total_ms=%.3f", self.guard_seconds * 1000,
                         total * 1000)  # fmt: skip
        self.received, self.guard_seconds = None, 0.0

    async def _flush(self, body: codec.Reader) -> None:
        body.end()
        await self._drain()

    def _statement(self, name: str) -> Statement:
        if name not in self.statements:
            raise StatementError("26000", f'prepared statement "{name}" does not exist')
        return self.statements[name]

    def _portal(self, name: str) -> Portal:
        """The portal ``name``, or the SQL cursor of that name (psycopg describes the portal
        of a cursor it declared, as PostgreSQL's cursors are portals)."""
        if name in self.portals:
            return self.portals[name]
        if name in self.cursors:
            return self.cursors[name]
        raise StatementError("34000", f'portal "{name}" does not exist')


def _parameters(message: codec.Bind, param_types: tuple[int, ...]) -> tuple:
    """The values of a Bind's parameters, each read as its type in its format.

    Raises:
        types.ParameterError: a value that is not one of its type.
    """
    formats = message.param_formats or (0,)
    return tuple(
        types.read_parameter(value, oid, (formats[i] if len(formats) > 1 else formats[0]) == 1)
        for i, (value, oid) in enumerate(zip(message.params, param_types, strict=True))
    )


def _as_described(answer: CatalogAnswer, schema: pa.Schema | None) -> CatalogAnswer:
    """A catalog answer with the column types its statement's Describe sent (``schema``, run
    with NULL parameters): rows encoded as other types than described would be misread.

    Raises:
        StatementError: 42804 for an answer whose columns cannot take those types.
    """
    if schema is None or answer.table is None or answer.table.schema.equals(schema):
        return answer
    try:
        return CatalogAnswer(answer.table.cast(schema), answer.tag)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        raise StatementError("42804", "the answer's columns are not of the types the "
                             "statement's Describe gave", "cast the parameters in the "
                             "statement (such as $1::int)") from None  # fmt: skip


def _forget_answer(statement: Statement | None) -> None:
    """A statement closed or replaced lets go of the answer of its Describe: the portals bound
    to it still hold the statement, and through it that answer, which no count saw any more
    (Parse, Bind, Describe, Close, repeated in a transaction block, kept 18 MB a round
    uncounted past the 64 MB bound; red team s35b)."""
    if statement is not None:
        statement.described = None


def _run(catalog: SessionCatalog, connection, sql: str, params: tuple):
    """In the thread pool: the session catalog first, then the guard (``public.t`` written
    ``t``; unaliased function columns named as PostgreSQL names them). Returns the answer and
    the seconds spent in the guarded connection (what an embedded connection would spend)."""
    answer = _catalog_answer(catalog, connection, sql, params or None)
    if answer is not None:
        return _named(sql, answer), 0.0
    sql = unqualified(sql, _database(connection))
    started = time.perf_counter()
    table = connection.execute(sql, params or None).arrow()
    guarded = time.perf_counter() - started
    names = postgres_names(sql, table.column_names)
    if names != table.column_names:
        table = table.rename_columns(names)
    return CatalogAnswer(table, f"SELECT {table.num_rows}"), guarded


def _catalog_answer(catalog: SessionCatalog, connection, sql: str, params):
    """The catalog's answer (None: a statement for the guard); a statement the catalog
    refuses (one mixing ``pg_catalog`` and data tables, ``SET ROLE``, ``LISTEN``...) is audited
    as the guard audits its refusals, under the user's connection: they went unrecorded (red
    team s35b). The guard audits its own; a statement reaches one or the other, so no
    refusal is recorded twice. Describe's refusal ends the client's messages until Sync, so an
    Execute refused again is a second attempt, audited as one."""
    try:
        return catalog.answer(sql, params)
    except Error as refusal:
        connection.audit_refusal(sql, refusal)
        raise


def _named(sql: str, answer: CatalogAnswer) -> CatalogAnswer:
    """A catalog answer with its unaliased function columns named as PostgreSQL names them
    (``SELECT version()``: ``version``, not DuckDB's ``"version"()``)."""
    if answer.table is None:
        return answer
    names = postgres_names(sql, answer.table.column_names)
    if names == answer.table.column_names:
        return answer
    return CatalogAnswer(answer.table.rename_columns(names), answer.tag)


def _database(connection) -> str:
    """The database's name as the catalog shows it (``current_database()``)."""
    return Path(connection.path).stem


def _tag_of(sql: str) -> str:
    word = (sql.strip().split(None, 1) or [""])[0].rstrip(";").upper()
    return {"ABORT": "ROLLBACK", "END": "COMMIT"}.get(word, word)


def _column_formats(formats, count: int) -> list[int]:
    if not formats:
        return [0] * count
    if len(formats) == 1:
        return [formats[0]] * count
    if len(formats) != count:
        raise StatementError("08P01", f"{len(formats)} result formats for {count} columns")
    return list(formats)


def _description(table_or_names, formats, text_only: bool) -> bytes:
    if isinstance(table_or_names, pa.Table):
        schema = table_or_names.schema
        names, oids = schema.names, [types.oid_of(f.type) for f in schema]
    else:
        names, oids = list(table_or_names), [types.TEXT] * len(table_or_names)
    if text_only:
        oids = [types.TEXT] * len(names)
    codes = _column_formats(formats, len(names))
    return codec.row_description([(n, o, types.size_of(o), c)
                                  for n, o, c in zip(names, oids, codes, strict=True)])  # fmt: skip


def _data_rows(table: pa.Table, formats, text_only: bool) -> bytes:
    """The DataRow messages of ``table``, one after the other (run in the thread pool).

    Raises:
        StatementError: 22008 for a value the encoders cannot write (a date or timestamp
            outside years 1-9999 or infinite: Python's datetime cannot hold it); the statement
            fails, the session goes on (an OverflowError here used to end it as FATAL XX000).
    """
    try:
        return b"".join(codec.data_row(row) for row in _encode(table, formats, text_only))
    except (OverflowError, ValueError):
        raise StatementError(
            "22008", "a value of the answer cannot be sent: dates and timestamps must lie in "
            "years 1 to 9999 (infinity and BC dates are not supported)",
            "cast the column to text, or filter such values out",
        ) from None  # fmt: skip


def _encode(table: pa.Table, formats, text_only: bool):
    """The DataRow values of ``table``, column by column, in each column's format."""
    codes = _column_formats(formats, table.num_columns)
    columns = []
    for column, code in zip(table.columns, codes, strict=True):
        oid = types.TEXT if text_only else types.oid_of(column.type)
        encode = partial(types.binary_value if code == 1 else types.text_value, oid=oid)
        if text_only:
            real = types.oid_of(column.type)
            encode = partial(lambda v, real: types.text_value(v, real), real=real)
        columns.append([None if v is None else encode(v) for v in column.to_pylist()])
    return zip(*columns, strict=True) if columns else iter(())
