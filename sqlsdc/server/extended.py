"""The extended query protocol of a server session: Parse, Bind, Describe, Execute and Close
(PostgreSQL documentation 55.2.3), with the bounds on what a session keeps
(:mod:`sqlsdc.server.limits`)."""

from __future__ import annotations

import pyarrow as pa

from sqlsdc.errors import Error
from sqlsdc.guard.unbound import UNBOUND
from sqlsdc.server import arrays, codec, cursors, types
from sqlsdc.server.colnames import postgres_names
from sqlsdc.server.limits import INLINE_TEXT, MAX_PREPARED, MAX_PREPARED_BYTES
from sqlsdc.server.list_types import list_types, scalar_types
from sqlsdc.server.portals import (
    Portal,
    Statement,
    as_described,
    bind_values,
    forget_answer,
    within_name_limit,
)
from sqlsdc.server.qualified import unqualified
from sqlsdc.server.rows import description
from sqlsdc.server.running import catalog_answer, database_name, named
from sqlsdc.server.sqlstate import StatementError, error_fields
from sqlsdc.server.statement_text import BLANK, tag_of, typed_parameters, untyped_parameters


class ExtendedProtocol:
    """The extended protocol's messages of :class:`sqlsdc.server.session.Session` (a mixin: it
    reads and sets the session's state)."""

    async def _parse(self, body: codec.Reader) -> None:
        message = codec.parse_parse(body)
        within_name_limit(message.name, "prepared statement")
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
                kinds, lists = typed_parameters(message.sql, message.param_types)
            else:  # a long one in the pool, within the user's share: 0.4 s for 4 MB on the event
                # loop made every other session wait (red team s35b: 6 sessions of one analyst
                # parsing 4 MB statements made another user's SELECT 1 take up to 3.4 s)
                kinds, lists = await self.server.in_pool(typed_parameters, message.sql,
                                                         message.param_types,
                                                         user=self.user)  # fmt: skip
        except ValueError:
            raise StatementError("08P01", "parameter numbers must be between 1 and 65535") from None
        if lists:  # untyped `column = ANY($n)`: an array of the column's type (parsed: the pool)
            try:
                kinds = await self.server.in_pool(self._list_types, message.sql, kinds, lists,
                                                  user=self.user)  # fmt: skip
            except Exception as e:  # noqa: BLE001 - mapped to an SQLSTATE by error_fields
                raise error_fields(e) from None
        forget_answer(self.statements.get(message.name))
        self.statements[message.name] = Statement(message.sql, kinds, given=message.param_types)
        self._recount("S", message.name)
        self._send(codec.PARSE_COMPLETE)

    def _list_types(self, sql: str, kinds: tuple[int, ...], lists: set[int]) -> tuple[int, ...]:
        """``kinds`` with each untyped ``column = ANY($n)`` typed an array of its column's type
        where the statement names it plainly (:func:`~sqlsdc.server.list_types.list_types`)."""
        found = list_types(sql, lists, self.connection.analyst_schema, self._longest())
        return tuple(found.get(i + 1, kind) for i, kind in enumerate(kinds))

    def _longest(self) -> int:
        """The policy's ``max_statement_characters``: a longer statement is refused by the
        guard unparsed, so its parameters are not typed either (a parse of megabytes)."""
        return self.connection.policy.max_statement_characters

    def _scalar_types(self, statement: Statement) -> tuple[int, ...]:
        """The statement's parameter types with each untyped ``$n`` typed where it stands, as
        PostgreSQL types it (:func:`~sqlsdc.server.list_types.scalar_types`): ``age > $1`` an
        ``int4``, ``LIMIT $1`` an ``int8``. Done when a client describes the statement, as
        asyncpg, pg8000 and pgjdbc do to learn how to send their values (asyncpg refused the
        integer 40 for ``age > $1``, described as text: red team s49e); clients that send
        their own types (psycopg) never pay for the parse."""
        kinds = statement.param_types
        numbers = untyped_parameters(statement.sql, statement.given)
        if not numbers:
            return kinds
        found = scalar_types(statement.sql, numbers, self.connection.analyst_schema,
                             self._longest())  # fmt: skip
        return tuple(found.get(i + 1, kind) for i, kind in enumerate(kinds))

    async def _bind(self, body: codec.Reader) -> None:
        message = codec.parse_bind(body)
        if (wrong := codec.bind_formats_error(message)) is not None:
            raise StatementError("08P01", wrong)
        within_name_limit(message.portal, "portal")
        statement = self._statement(message.statement)
        if len(message.params) != len(statement.param_types):
            raise StatementError("08P01", f"bind message supplies {len(message.params)} "
                                 f"parameters, but prepared statement requires "
                                 f"{len(statement.param_types)}")  # fmt: skip
        size = sum(len(value) for value in message.params if value is not None)
        try:  # a value the server cannot read fails this statement (22P02), not the session
            if size <= INLINE_TEXT:
                params = bind_values(message, statement.param_types)
            else:  # in the pool, within the user's share: a 4 MB Bind of 63 binary numerics
                # took 1.6 s of the event loop, which every session shares (red team s35b)
                params = await self.server.in_pool(bind_values, message, statement.param_types,
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
            if tag_of(statement.sql) == "COPY":  # no row description, as in PostgreSQL
                self._send(codec.parameter_description(statement.param_types))
                self._send(codec.NO_DATA)
                return
            if not statement.inferred and types.TEXT in statement.param_types:
                try:  # parsed: in the pool, within the user's share
                    statement.param_types = await self.server.in_pool(
                        self._scalar_types, statement, user=self.user
                    )
                except Exception as e:  # noqa: BLE001 - mapped to an SQLSTATE by error_fields
                    raise error_fields(e) from None
            statement.inferred = True
            self._send(codec.parameter_description(statement.param_types))
            if BLANK.match(statement.sql):
                self._send(codec.NO_DATA)
            elif statement.param_types:  # columns without running: typed where binding can
                shape = await self._shape(statement)
                if isinstance(shape, pa.Schema):  # bound, typed (no data read)
                    statement.schema = shape
                    self._send(description(shape.empty_table(), (), text_only=False))
                else:
                    statement.text_only = True
                    self._send(description(shape, (), text_only=True) if shape
                               else codec.NO_DATA)  # fmt: skip
            else:
                statement.described = await self._kept(statement.sql, ())
                self._recount("S", message.name)
                self._send(description(statement.described.table, (), text_only=False)
                           if statement.described.table is not None else codec.NO_DATA)  # fmt: skip
            return
        portal = self._portal(message.name)
        if BLANK.match(portal.statement.sql) or tag_of(portal.statement.sql) == "COPY":
            self._send(codec.NO_DATA)
            return
        await self._portal_result(portal, message.name)
        table = portal.result.table
        self._send(codec.NO_DATA if table is None
                   else description(table, portal.formats, portal.text_only))  # fmt: skip

    async def _portal_result(self, portal: Portal, name: str) -> None:
        """Run the portal's statement, once, and keep its answer (as its Describe typed it)."""
        if portal.result is None:
            answer = await self._kept(portal.statement.sql, portal.params)
            portal.result = as_described(answer, portal.statement.schema)
            self._recount("P", name)

    async def _shape(self, statement: Statement) -> list[str] | pa.Schema:
        """Columns of a parameterised statement, without running it, with every parameter
        NULL (an array's a list of one NULL: ``= ANY($1)`` takes a list; nothing is read or
        charged): the catalog's answer, typed (asyncpg reads the oids of its type
        introspection as integers), or the guard's plan, typed from binding its protected SQL
        (:meth:`~sqlsdc.guard.connection.Connection.describe`: asyncpg's ``COUNT(*)`` came back
        as the string ``'6373'``), or named only where binding cannot type it (DP cells,
        suppression patterns: text). The answer is cast to the types described
        (:func:`~sqlsdc.server.portals.as_described`)."""
        nulls = tuple([None] if t in arrays.ELEMENTS else None for t in statement.param_types)

        if cursors.cursor_text(statement.sql) is not None:
            return []  # DECLARE answers no rows; FETCH, MOVE and CLOSE take no parameters

        def names():
            answer = catalog_answer(
                self.catalog, self.connection, statement.sql, nulls, described=True
            )
            if answer is not None:
                return [] if answer.table is None else named(statement.sql, answer).table.schema
            sql = unqualified(statement.sql, database_name(self.connection))
            unbound = tuple(UNBOUND if v is None else [UNBOUND] for v in nulls)  # not sent yet
            try:
                query, schema = self.connection.describe(sql, unbound)
            except Error as refusal:  # explain audits nothing: audited here, as execute would
                self.connection.audit_refusal(sql, refusal)
                raise
            names = postgres_names(sql, [c.name for c in query.columns])
            if schema is None:  # DP cells, a suppression pattern: named, typed as text
                return names
            return pa.schema(f.with_name(n) for f, n in zip(schema, names, strict=True))

        try:
            return await self.server.in_pool(names, user=self.user)  # the guard plans: a share
        except Exception as e:  # noqa: BLE001 - mapped to an SQLSTATE by error_fields
            raise error_fields(e) from None

    async def _execute(self, body: codec.Reader) -> None:
        message = codec.parse_execute(body)
        portal = self._portal(message.portal)
        if BLANK.match(portal.statement.sql):
            self._send(codec.EMPTY_QUERY)
            return
        if tag_of(portal.statement.sql) == "COPY":  # pg8000 sends every statement this way
            await self._copy_portal(portal)
            return
        await self._portal_result(portal, message.portal)
        if portal.result.table is None:
            self._send(codec.command_complete(portal.result.tag))
            return
        portal.position = await self._rows(portal.result, portal.formats, portal.text_only,
                                           portal.position, message.max_rows)  # fmt: skip

    async def _copy_portal(self, portal: Portal) -> None:
        """Execute of a ``COPY (query) TO STDOUT`` portal: its query's answer, with the
        portal's parameters, written as the simple protocol writes it (CopyOutResponse,
        CopyData, CopyDone, ``COPY n``), whatever row limit the Execute names (PostgreSQL
        sends a COPY's rows whole). It was refused as COPY (pg8000 sends every statement
        through Parse, Bind and Execute)."""
        copy = await self._copy(portal.statement.sql)
        if copy is None:  # COPY table, COPY ... FROM: the guard refuses them, audited
            await self._kept(portal.statement.sql, portal.params)
            return
        await self._copy_rows(copy, await self._kept(copy.query, portal.params))

    async def _close_message(self, body: codec.Reader) -> None:
        message = codec.parse_close(body)
        closed = (self.statements if message.kind == "S" else self.portals).pop(message.name, None)
        if message.kind == "S":
            forget_answer(closed)
        self._recount(message.kind, message.name)
        self._send(codec.CLOSE_COMPLETE)

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
