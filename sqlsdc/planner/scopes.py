"""What the planner knows of each scope of a query: its kind, the lineage of its columns, and
helpers to walk the nodes that belong to one scope (nested subqueries are scopes of their own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum

from sqlglot import exp
from sqlglot.optimizer.scope import Scope

from sqlsdc.policy import ColumnRole

DIALECT = "duckdb"
ROW_ROLES = {ColumnRole.DIMENSION, ColumnRole.MEASURE, ColumnRole.WEIGHT}
SET_OPERATIONS = (exp.Union, exp.Intersect, exp.Except)
NESTED = (exp.Subquery, exp.Select, *SET_OPERATIONS)  # nodes that open a scope of their own


class Kind(Enum):
    SAFE = "safe"
    ROW = "row"
    AGGREGATE = "aggregate"


@dataclass(frozen=True)
class Lineage:
    """Where a value comes from: confidential row values (with their roles) or safe values."""

    row: bool = False
    roles: frozenset = frozenset()
    sources: frozenset = frozenset()  # {(table, column)} of confidential base columns
    protected: bool = False  # derived from a protected aggregate cell

    def __or__(self, other: Lineage) -> Lineage:
        return Lineage(
            self.row or other.row,
            self.roles | other.roles,
            self.sources | other.sources,
            self.protected or other.protected,
        )


@dataclass
class ScopeInfo:
    """A scope's kind and the lineage of its outputs: by name (``outputs``, what an outer scope
    reads as ``q.name``) and by position (``columns``): the result's own outputs may repeat a
    name (``SELECT a.n, b.n``), and each is still a column of its own."""

    scope: Scope
    kind: Kind
    outputs: dict[str, Lineage] = field(default_factory=dict)
    aggregates: list[exp.AggFunc] = field(default_factory=list)
    columns: list[Lineage] = field(default_factory=list)


@dataclass
class Analysis:
    """The result of classification: one ScopeInfo per scope, children before parents."""

    tree: exp.Expr
    infos: dict[int, ScopeInfo]
    order: list[ScopeInfo]

    @property
    def root(self) -> ScopeInfo:
        return self.order[-1]

    def info(self, node: exp.Expr) -> ScopeInfo:
        return self.infos[id(unwrap(node))]


ConstantCheck = Callable[[exp.Expr], exp.DataType | None]
"""Evaluates a constant (an expression that reads no column) once, apart from the query: the
engine's type of its value, or None if it raises (the guard's ``constant_type``)."""


def unwrap(node: exp.Expr) -> exp.Expr:
    while isinstance(node, (exp.Subquery, exp.Paren)):
        node = node.this
    return node


def own_nodes(node: exp.Expr) -> list[exp.Expr]:
    """Nodes of ``node`` that belong to its scope (nested subqueries are not entered), depth
    first in argument order; a list (faster to build than to yield, node by node)."""
    Expr = exp.Expr
    found = []
    stack = [node]
    push, pop, extend = stack.append, stack.pop, stack.extend
    while stack:
        current = pop()
        found.append(current)
        # the children not nested, last first: popped in argument order (``iter_expressions``
        # written out, three times faster)
        for value in reversed(current.args.values()):
            if isinstance(value, Expr):
                if not isinstance(value, NESTED):
                    push(value)
            elif isinstance(value, list):
                extend([v for v in reversed(value) if isinstance(v, Expr)
                        and not isinstance(v, NESTED)])  # fmt: skip
    return found


def scope_aggregates(node: exp.Expr, walked: list[exp.Expr] | None = None) -> list[exp.AggFunc]:
    """Aggregate calls of the scope, outermost first; window functions are not aggregates.
    ``walked``: ``own_nodes(node)``, when the caller has it."""
    found = []
    for n in own_nodes(node) if walked is None else walked:
        if isinstance(n, exp.AggFunc) and not isinstance(n.parent, exp.Window):
            if not any(
                isinstance(a, exp.AggFunc) and a is not n and not isinstance(a.parent, exp.Window)
                for a in _ancestors(n, node)
            ):
                found.append(n)
    return found


def _ancestors(node: exp.Expr, stop: exp.Expr) -> Iterator[exp.Expr]:
    current = node.parent
    while current is not None and current is not stop:
        yield current
        current = current.parent


def contains_aggregate(node: exp.Expr) -> bool:
    return bool(scope_aggregates(node))


def names(lineage: Lineage) -> str:
    return ", ".join(f"{t}.{c}" for t, c in sorted(lineage.sources)) or "(none)"


def role_text(roles) -> str:
    order = [
        ColumnRole.IDENTIFIER,
        ColumnRole.HIDDEN,
        ColumnRole.MEASURE,
        ColumnRole.WEIGHT,
        ColumnRole.DIMENSION,
    ]
    for role in order:
        if role in roles:
            return {
                "identifier": "identifier",
                "hidden": "hidden column",
                "measure": "measure",
                "weight": "weight",
                "dimension": "dimension",
            }[role.value]
    return "value"


def reads_public_only(source, infos) -> bool:
    """Whether a source of a scope that reads no confidential table reads public tables only:
    a table there is public, a derived table must read no confidential row and no cell."""
    if isinstance(source, exp.Table):
        return True
    if not isinstance(source, Scope):
        return False
    info = infos.get(id(source.expression))
    if info is None or info.kind is not Kind.SAFE:
        return False
    inner = [*source.sources.values(), *source.set_operation_scopes]
    return all(reads_public_only(s, infos) for s in inner)
