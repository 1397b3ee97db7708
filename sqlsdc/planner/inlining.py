"""The size of a query once its CTEs, derived tables and output columns are inlined.

Every later pass reads a query inlined: the cell identity replaces a column of a derived table
or CTE by the expression it stands for (:mod:`sqlsdc.planner.identity`), the planner gives
every reading of a confidential table its units, and DuckDB plans each reference of a CTE.
Written size does not bound inlined size: ``c1 AS (SELECT s || s AS s FROM c0)``,
``c2 AS (SELECT s || s AS s FROM c1)``... doubles the inlined expression (and the string each
row computes) at every step, and ``c1 AS (SELECT a.* FROM c0 a JOIN c0 b ON ...)`` doubles
the readings of the table: a statement of one kilobyte kept the check busy for hours under the
database file, past any timeout (the check stops only between its passes), or exhausted the
process' memory (red team, session 31). :class:`Inlining` measures both sizes scope by scope,
children first, in one walk of each scope's own nodes, and refuses a query whose inlined size
is more than :data:`FACTOR` times its written size (or :data:`FLOOR`, whichever is larger):
what a statement may cost grows with what it writes, not exponentially.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp
from sqlglot.optimizer.scope import Scope

from sqlsdc.engines.trees import of_kind
from sqlsdc.errors import PolicyViolation
from sqlsdc.planner.scopes import own_nodes

FACTOR = 4  # inlined size per written size: a CTE read a few times, a column used twice
FLOOR_NODES = 100_000  # inlined expression nodes any statement may have
FLOOR_READINGS = 256  # inlined readings of tables any statement may have


class Inlining:
    """Written and inlined sizes (expression nodes, table readings) of the scopes added."""

    def __init__(self, sql: str, own: Callable[[exp.Expr], list[exp.Expr]] = own_nodes):
        """``own``: :func:`~sqlsdc.planner.scopes.own_nodes`, or a function that gives the
        same lists (the checker's, which walks each clause once for all its checks)."""
        self.sql = sql
        self.own = own
        self.columns: dict[tuple[int, str], int] = {}  # inlined nodes of a scope's output
        self.sizes: dict[int, tuple[int, int]] = {}  # inlined (nodes, readings) of a scope
        self.written = [0, 0]  # nodes and readings as written

    def add(self, scope: Scope) -> None:
        """Measure ``scope``; the scopes it reads must have been added (``traverse_scope``
        order). Refuses as soon as the inlined size is too large."""
        node = scope.expression
        nodes, readings = 0, 0
        if scope.set_operation_scopes:
            for part in scope.set_operation_scopes:
                part_nodes, part_readings = self.sizes.get(id(part.expression), (1, 0))
                nodes, readings = nodes + part_nodes, readings + part_readings
            names = [p.alias_or_name for p in node.selects]
            for position, name in enumerate(names):
                self.columns[(id(node), name)] = sum(
                    self._output(part, position) for part in scope.set_operation_scopes
                )
        else:
            for _node, source in scope.selected_sources.values():
                if isinstance(source, Scope):
                    source_nodes, source_readings = self.sizes.get(id(source.expression), (1, 0))
                    nodes, readings = nodes + source_nodes, readings + source_readings
                else:
                    readings += 1
                    self.written[1] += 1
            for sub in scope.subquery_scopes:
                sub_nodes, sub_readings = self.sizes.get(id(sub.expression), (1, 0))
                nodes, readings = nodes + sub_nodes, readings + sub_readings
            for projection in node.expressions:
                weight = self._weight(projection, scope)
                self.columns[(id(node), projection.alias_or_name)] = weight
                nodes += weight
            for part in _clauses(node):
                nodes += self._weight(part, scope)
        self.sizes[id(node)] = (nodes, readings)
        self._check(nodes, readings)

    def _output(self, scope: Scope, position: int) -> int:
        selects = scope.expression.selects
        if position >= len(selects):
            return 1
        return self.columns.get((id(scope.expression), selects[position].alias_or_name), 1)

    def _weight(self, node: exp.Expr, scope: Scope) -> int:
        """Inlined nodes of ``node``: a column of a derived table or CTE counts as the
        expression it stands for."""
        walked = self.own(node)
        self.written[0] += len(walked)
        total = len(walked)  # a node counts 1, a column of a derived table what it stands for
        if not any(isinstance(source, Scope) for source in scope.sources.values()):
            return total  # tables alone: every column counts 1
        for n in of_kind(walked, exp.Column):
            source = scope.sources.get(n.table)
            if isinstance(source, Scope):
                total += self.columns.get((id(source.expression), n.name), 1) - 1
        return total

    def _check(self, nodes: int, readings: int) -> None:
        written_nodes, written_readings = self.written
        if nodes > max(FLOOR_NODES, FACTOR * written_nodes) or readings > max(
            FLOOR_READINGS, FACTOR * written_readings
        ):
            raise PolicyViolation(
                f"the query is too large once its CTEs and derived tables are inlined "
                f"({nodes:,} expression nodes and {readings:,} table readings, from "
                f"{written_nodes:,} and {written_readings:,} written): a column or CTE built "
                "on itself again and again doubles at every step",
                "read each derived column and CTE fewer times, or split the query",
                self.sql,
            )


def _clauses(node: exp.Expr) -> list[exp.Expr]:
    """The clauses of a SELECT, besides its projections, that hold its own expressions."""
    parts = []
    for key in ("joins", "where", "group", "having", "qualify", "order"):
        value = node.args.get(key)
        if isinstance(value, list):
            parts.extend(v for v in value if isinstance(v, exp.Expr))
        elif isinstance(value, exp.Expr):
            parts.append(value)
    return parts
