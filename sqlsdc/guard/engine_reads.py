"""Checks of what the engine will read, asked of the engine itself before a statement runs.

Defence in depth after the guard's own checks: the tables DuckDB says a protected text reads
are declared in the policy (:meth:`EngineReads._check_engine_reads`, kept per text while the
file stays open), and the floating-point columns a query sums hold no NaN, infinities or huge
values (:meth:`EngineReads._check_summable`, :mod:`sqlsdc.guard.summable`). Both refuse before
anything is charged or run.

:class:`EngineReads` holds these methods of :class:`sqlsdc.guard.connection.Connection`, which
sets the state they read (``_con``, ``_context``, ``policy``, ``path``, ``_engine_checked``,
``_summable``, ``_summable_writers``) and gives ``_time_left``.
"""

from __future__ import annotations

import pyarrow as pa
from sqlglot import exp

from sqlsdc.engines import duckdb as engine
from sqlsdc.engines import duckdb_schema
from sqlsdc.errors import PolicyViolation
from sqlsdc.guard.check_cache import CHARACTERS as KEPT_CHARACTERS
from sqlsdc.guard.pipeline import ProtectedQuery
from sqlsdc.guard.summable import check_summable
from sqlsdc.guard.validate import check_engine_tables

ENGINE_CHECKED_TEXTS = 1024  # protected SQL texts whose engine reads are known, per opening


class EngineReads:
    """The engine's reading of a statement's texts and of the columns it sums, checked."""

    def _check_engine_texts(self, query: ProtectedQuery) -> None:
        """:meth:`_check_engine_reads` of every text the query runs: its DP stages' and its
        answer's."""
        for text in (*(stage.sql for stage in query.dp_stages), query.sql):
            self._check_engine_reads(text, query)

    def _check_engine_reads(self, sql: str, query: ProtectedQuery) -> None:
        """Defence in depth: the tables DuckDB says ``sql`` reads are declared in the policy
        (:func:`~sqlsdc.guard.validate.check_engine_tables`). DuckDB's answer depends on the
        text and on the catalog (it expands views), so a text that passed is not asked again
        while the file stays open: no other process can change the catalog meanwhile, and
        every opening starts afresh (:meth:`_open`).

        DuckDB may refuse the text there (its binding of constants alone: ``age BETWEEN '3'
        AND 5``, which running the statement would bind): no data is read, so whatever the
        data hold the statement is refused, with sqlsdc's own message (the engine's text goes
        to the audit log only)."""
        if sql in self._engine_checked:
            return
        try:
            read = duckdb_schema.tables_read_by(self._con, sql)
        except engine.TextRefusal as refusal:
            violation = (
                PolicyViolation(
                    "DuckDB refuses the text of this statement before reading any data: its "
                    "expressions nest deeper than DuckDB's limit (max_expression_depth), so it "
                    "is refused whatever the data hold",
                    "join fewer tables or nest fewer expressions in one statement",
                    sql,
                )
                if "expression depth" in str(refusal)
                else PolicyViolation(
                    "DuckDB refuses the text of this statement before reading any data (its "
                    "constants cannot be bound together, e.g. the bounds of age BETWEEN '3' "
                    "AND 5 are written in two types), so it is refused whatever the data hold",
                    "write the values of one comparison in one type, e.g. age BETWEEN 3 AND 5",
                    sql,
                )
            )
            violation.detail = f"{type(refusal).__name__}: {refusal}"
            raise violation from None
        check_engine_tables(read, query.tree, self.policy, query.tables)
        if len(sql) > KEPT_CHARACTERS // 64:
            return  # asked again each time, like the check cache (not kept: memory)
        if len(self._engine_checked) >= ENGINE_CHECKED_TEXTS:
            self._engine_checked.clear()
        self._engine_checked.add(sql)

    def _check_summable(self, query: ProtectedQuery) -> None:
        """Refuse a query that sums a floating-point column holding NaN, infinities or huge
        values (:mod:`sqlsdc.guard.summable`), before anything is charged or run. The scan's
        answer is kept while the data cannot have changed: for this opening of the file, while
        no connection of this process that may write data has opened it (as data versions)."""
        if not query.summed:
            return
        writers = engine.data_writers(self.path)
        if writers is None or writers != self._summable_writers:
            self._summable.clear()
            self._summable_writers = writers
        con, to_sql = self._con, self._context.to_sql

        def run(tree: exp.Select) -> pa.Table:
            return engine.run(con, to_sql(tree), timeout=self._time_left())

        check_summable(query.summed, self._summable, run)
