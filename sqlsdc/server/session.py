"""One client of ``sqlsdc serve``: startup, authentication, then the simple and extended query
protocols (PostgreSQL documentation, chapter 55 "Frontend/Backend Protocol", 55.2 "Message
Flow"), every statement answered by the session catalog or by the user's guarded connection.

:class:`Session` holds the protocol state and runs the message loop, the simple Query and what
every session keeps (its portals' answers, counted for its user); its parts are modules of
their own: start-up and authentication (:mod:`sqlsdc.server.startup`), the extended protocol
(:mod:`sqlsdc.server.extended`), SQL cursors (:mod:`sqlsdc.server.declared_cursors`),
``COPY (query) TO STDOUT`` (:mod:`sqlsdc.server.copy_out`),
statements and portals (:mod:`sqlsdc.server.portals`), running a statement
(:mod:`sqlsdc.server.running`), answers as messages (:mod:`sqlsdc.server.rows`), errors
(:mod:`sqlsdc.server.sqlstate`) and bounds (:mod:`sqlsdc.server.limits`).

Statements run in the server's bounded thread pool (a guarded connection is synchronous); the
event loop only reads, parses and writes messages. Errors become ErrorResponses with SQLSTATE
codes (:func:`~sqlsdc.server.sqlstate.error_fields`); an engine's own text never reaches a
client (the guard withholds it), and an unexpected failure is reported as XX000 with no
detail.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time

from sqlsdc.errors import Error
from sqlsdc.server import codec, cursors
from sqlsdc.server.catalog import CatalogAnswer, SessionCatalog
from sqlsdc.server.codec import ProtocolError
from sqlsdc.server.copy_out import (
    COPY_DONE,
    CopyOut,
    copy_data,
    copy_header,
    copy_out,
    copy_response,
)
from sqlsdc.server.declared_cursors import DeclaredCursors
from sqlsdc.server.extended import ExtendedProtocol
from sqlsdc.server.limits import AUTH_TIMEOUT, INLINE_ROWS, MAX_HELD_BYTES, ROWS_PER_WRITE
from sqlsdc.server.login_rate import peer_of
from sqlsdc.server.portals import Portal, Statement
from sqlsdc.server.rows import data_rows, description
from sqlsdc.server.running import run
from sqlsdc.server.sqlstate import Fatal, StatementError, WriteTimeout, error_fields
from sqlsdc.server.startup import Startup
from sqlsdc.server.statement_text import BLANK, NOT_IN_TRANSACTION, tag_of

log = logging.getLogger("sqlsdc.server")
timing = logging.getLogger("sqlsdc.server.timing")
"""Per-statement timings at DEBUG level, for benchmarks/server/bench_server.py only: off unless
``sqlsdc serve`` runs with ``SQLSDC_SERVER_TIMING=1``; a line holds two durations, never a
statement, a user or a value."""


class Session(Startup, ExtendedProtocol, DeclaredCursors):
    """The protocol state of one client connection."""

    def __init__(self, server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.server, self.reader, self.writer = server, reader, writer
        self.pid, self.secret = server.register(self)
        self.opened = time.monotonic()
        self.peer = peer_of(writer)  # whose handshakes give way first (Server._client)
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
                await self._handle(handler, body)
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

    async def _handle(self, handler, body: codec.Reader) -> None:
        """Run ``handler`` on ``body``; a string of it that is not UTF-8 fails the statement
        as in PostgreSQL (ERROR 22021, a transaction block aborted), not the session: the
        message was read whole (red team s49e: a Query of invalid UTF-8 ended the session
        with FATAL 08P01)."""
        try:
            await handler(body)
        except codec.InvalidEncoding as e:
            if self.status == "T":
                self.status = "E"
            raise StatementError("22021", str(e)) from None

    async def _answer(self, sql: str, params: tuple) -> CatalogAnswer:
        """The catalog's answer or the guard's result, run in the thread pool."""
        if self.status == "E" and tag_of(sql) not in NOT_IN_TRANSACTION:
            raise StatementError("25P02", "current transaction is aborted, commands ignored "
                                 "until end of transaction block", "send ROLLBACK")  # fmt: skip
        cursor = cursors.cursor_text(sql)
        self.running, self.cancelled = True, False
        try:
            if cursor is not None:
                answer = await self._cursor(cursor, params)
            else:
                answer, guarded = await self.server.in_pool(
                    run, self.catalog, self.connection, sql, params, user=self.user
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
        elif answer.tag in NOT_IN_TRANSACTION:
            self.status = "I"
            for name in [name for name, kept in self.cursors.items() if not kept.hold]:
                del self.cursors[name]  # a cursor WITHOUT HOLD ends with its block
                self._recount("C", name)
        return answer

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
        if BLANK.match(sql):
            self._send(codec.EMPTY_QUERY)
        else:
            if tag_of(sql) not in NOT_IN_TRANSACTION:  # a client that does not read keeps
                self._check_held()  # its answer in the server: counted like a portal's
            copy = await self._copy(sql) if tag_of(sql) == "COPY" else None
            answer = await self._answer(sql if copy is None else copy.query, ())
            if answer.tag in NOT_IN_TRANSACTION:
                self._close_portals()  # as PostgreSQL closes them at the end of the transaction
            if copy is not None:
                await self._copy_rows(copy, answer)
            elif answer.table is not None:
                self.sending = answer.table.nbytes
                try:
                    await self._rows(answer, (), text_only=False, position=0, limit=0,
                                     header=True)  # fmt: skip
                finally:
                    self.sending = 0
            else:
                self._send(codec.command_complete(answer.tag))
        await self._ready()

    async def _copy(self, sql: str) -> CopyOut | None:
        """The ``COPY (query) TO STDOUT`` statement ``sql`` (:mod:`sqlsdc.server.copy_out`),
        None for another COPY (the guard refuses it); an option not supported is refused and
        audited as the guard audits its refusals."""
        try:
            return copy_out(sql)
        except Error as refusal:
            await self.server.in_pool(self.connection.audit_refusal, sql, refusal,
                                      user=self.user)  # fmt: skip
            raise error_fields(refusal) from None

    async def _copy_rows(self, copy: CopyOut, answer: CatalogAnswer) -> None:
        """The answer of a COPY's query as CopyOutResponse, CopyData and CopyDone, then
        ``COPY n``; encoded and written :data:`ROWS_PER_WRITE` rows at a time (in the pool when
        long), counted as a Query's answer while it is written. Encoded at once, an answer of
        262,144 rows raised the server's peak memory by 130 MB, against 40 MB for the same
        SELECT, while its user's sessions were counted 10 MB (red team s49k)."""
        table = answer.table
        if table is None:
            raise StatementError("42601", f"COPY takes a query that returns rows; {answer.tag} "
                                 "returns none", "COPY (SELECT ...) TO STDOUT")  # fmt: skip
        self.sending = table.nbytes
        try:
            self._send(copy_response(table))
            if copy.header:
                self._send(copy_header(copy, table))
            for start in range(0, table.num_rows, ROWS_PER_WRITE):  # as _rows writes DataRows
                chunk = table.slice(start, ROWS_PER_WRITE)
                if chunk.num_rows <= INLINE_ROWS:
                    self._send(copy_data(copy, chunk))
                else:
                    self._send(await self.server.in_pool(copy_data, copy, chunk))
                await self._drain()
            self._send(COPY_DONE)
        finally:
            self.sending = 0
        self._send(codec.command_complete(f"COPY {table.num_rows}"))

    async def _rows(self, answer: CatalogAnswer, formats, text_only: bool, position: int,
                    limit: int, header: bool = False) -> int:  # fmt: skip
        """Send DataRows from ``position`` (at most ``limit``, 0 = all), then PortalSuspended
        or CommandComplete; returns the new position."""
        table = answer.table
        if header:
            self._send(description(table, formats, text_only))
        end = table.num_rows if limit == 0 else min(table.num_rows, position + limit)
        for start in range(position, end, ROWS_PER_WRITE):
            chunk = table.slice(start, min(ROWS_PER_WRITE, end - start))
            if chunk.num_rows <= INLINE_ROWS:  # microseconds: a thread hand-off costs more
                self._send(data_rows(chunk, formats, text_only))
            else:  # encoded in the pool: the event loop serves others meanwhile
                self._send(await self.server.in_pool(data_rows, chunk, formats, text_only))
            await self._drain()
        if end < table.num_rows:
            self._send(codec.PORTAL_SUSPENDED)
        else:
            tag = answer.tag if not answer.tag.startswith("SELECT") else f"SELECT {end - position}"
            self._send(codec.command_complete(tag))
        return end

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
