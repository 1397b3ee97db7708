"""Totality checks on a query's expressions: no error may depend on confidential values
(value arguments by :mod:`sqlsdc.planner.totality`, arguments that must be literals by
:mod:`sqlsdc.planner.signatures`), and released values are checked as they are computed."""

from __future__ import annotations

from collections.abc import Iterator

from sqlglot import exp
from sqlglot.optimizer.scope import Scope

from sqlsdc.planner.scopes import DIALECT, SET_OPERATIONS, own_nodes
from sqlsdc.planner.signatures import literal_refusal
from sqlsdc.planner.totality import TOTALITY_HINT, partiality


class TotalityChecks:
    """Mixed into the checker (:mod:`sqlsdc.planner.analyze`): ``self.refuse`` and
    ``self.constant_is_safe`` come from there."""

    def _check_released(self, select: exp.Select, scope: Scope) -> None:
        """Projections, HAVING and ORDER BY of an aggregation are evaluated on every cell."""
        having, order = select.args.get("having"), select.args.get("order")
        parts = [
            *select.expressions,
            *([having.this] if having else []),
            *(order.expressions if order else []),
        ]
        for part in parts:
            self._check_total(part, scope, released=True)

    def _check_total(self, node: exp.Expr, scope: Scope, released: bool = False) -> None:
        """Refuse ``node`` unless no confidential value can make it raise an error.

        Every function must be listed in :data:`sqlsdc.planner.signatures.SIGNATURES`, its
        literal arguments (date parts, formats, divisors, positions...) must be literals, and
        its value arguments must have types it is total on. ``released`` marks the projections,
        HAVING and ORDER BY of an aggregation: they run on every cell, published or not, so an
        error there would reveal which cells exist; aggregate results are released values there,
        and only the literal arguments are checked on what depends on them.
        """
        for n in _evaluated_nodes(node, released):
            refusal = literal_refusal(n, self.constant_is_safe)
            if refusal:
                raise self.refuse(refusal.reason, refusal.hint)
        for n in _evaluated_nodes(node, released):
            if released and _contains_released_value(n):
                continue
            if not any(isinstance(c, exp.Column) for c in own_nodes(n)):
                if not isinstance(n, _INERT) and not self.constant_is_safe(n):
                    raise self.refuse(
                        f"the expression {n.sql(DIALECT)} raises an error", "fix the expression"
                    )
                continue
            problem = partiality(n)
            if problem:
                raise self.refuse(
                    f"{n.sql(DIALECT)[:80]} could raise an error for some confidential values "
                    f"({problem}), which would reveal them",
                    TOTALITY_HINT,
                )


_INERT = (
    exp.Literal,
    exp.Null,
    exp.Boolean,
    exp.Star,
    exp.DataType,
    exp.Var,
    exp.Identifier,
    exp.DataTypeParam,
)


def _evaluated_nodes(node: exp.Expr, released: bool) -> Iterator[exp.Expr]:
    """The nodes of ``node`` in its scope, parents first; with ``released``, the arguments of
    aggregates are not entered (they are checked as aggregate arguments)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if released and _is_aggregate_call(current):
            continue
        children = [
            c
            for c in current.iter_expressions()
            if not isinstance(c, (exp.Subquery, exp.Select, *SET_OPERATIONS))
        ]
        stack.extend(reversed(children))


def _is_aggregate_call(node: exp.Expr) -> bool:
    return isinstance(node, exp.AggFunc) and not isinstance(node.parent, exp.Window)


def _contains_released_value(node: exp.Expr) -> bool:
    """Whether ``node`` computes on an aggregate result or is a window function over the cells."""
    if isinstance(node.parent, exp.Window) and node.arg_key == "this":
        return True
    return any(_is_aggregate_call(n) or isinstance(n, exp.Window) for n in own_nodes(node))
