"""SQL cursors of a server session (``DECLARE``/``FETCH``/``MOVE``/``CLOSE``, read by
:mod:`sqlsdc.server.cursors`): portals named by the client, kept apart from the protocol's
(Sync does not close them), their answers counted as a portal's."""

from __future__ import annotations

from sqlsdc.errors import Error
from sqlsdc.server import cursors
from sqlsdc.server.catalog import CatalogAnswer
from sqlsdc.server.limits import MAX_PREPARED
from sqlsdc.server.portals import Portal, Statement, within_name_limit
from sqlsdc.server.running import run
from sqlsdc.server.sqlstate import StatementError


class DeclaredCursors:
    """The SQL cursors of :class:`sqlsdc.server.session.Session` (a mixin: it reads and sets
    the session's state)."""

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
        within_name_limit(statement.name, "cursor")
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
            run, self.catalog, self.connection, statement.query, params, user=self.user
        )
        self.guard_seconds += guarded
        if answer.table is None:
            raise StatementError("42601", f"a cursor is declared for a query; "
                                 f"{answer.tag} returns no rows", "DECLARE name CURSOR FOR "
                                 "SELECT ...")  # fmt: skip
        # its query text counts with its answer, or a thousand cursors of a megabyte of text
        # each would hold a gigabyte uncounted (test_redteam_s43f.py)
        self.cursors[statement.name] = Portal(Statement(statement.query, ()), params, (),
                                              result=answer, hold=statement.hold,
                                              size=len(statement.query))  # fmt: skip
        self._recount("C", statement.name)
        return CatalogAnswer(None, "DECLARE CURSOR")

    def _cursor_named(self, name: str) -> Portal:
        if name not in self.cursors:
            raise StatementError("34000", f'cursor "{name}" does not exist')
        return self.cursors[name]
