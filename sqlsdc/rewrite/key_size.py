"""How long a private DP group key can be, bounded from the query alone, before the charge.

Private groups (``dp.groups: private``) take their keys from the data, so the analyst writes
the key expression, and the exact cells compute it for every row of the population, then hash,
group and sort it in several passes (:func:`sqlsdc.rewrite.dp._bounded_pairs`). The engine's
time grows with the key's length times the population's rows: a key carrying a literal of
900,000 characters took about 10 ms per row, and a private-group query, whose statistics are
paid once and whose exact cells are computed again at every asking, could be timed for free
as often as wished: the number of rows of any population the WHERE describes, down to 0 or
1, exactly, behind any epsilon (red team s37b).

So a private group key's value is bounded from the query: its literal characters and the
stored columns it concatenates (each column a value of the data, which no analyst writes),
followed through derived tables and CTEs, where a column built on itself doubles at every
step. A CASE is as long as its longest branch; its conditions, evaluated on every row of the
population too, count towards the characters of literals the keys may evaluate per row. A
function this module does not know is bounded by the sum of its arguments. Keys of public
domains are stored columns or declared values and need no bound.
"""

from __future__ import annotations

from typing import NamedTuple

from sqlglot import exp
from sqlglot.optimizer.scope import Scope

MAX_KEY_CHARACTERS = 1_024
"""The most characters of literals a private group's keys may hold in a value (a BI label is
a few dozen)."""
MAX_KEY_COLUMNS = 16
"""The most stored values a private group's keys may concatenate."""
MAX_KEY_WORK = 65_536
"""The most characters of literals the keys may evaluate per row, conditions included (a CASE
recoding a thousand codes to labels holds about 30,000)."""

_BRANCHES = (exp.Coalesce, exp.Nullif, exp.Greatest, exp.Least, exp.Min, exp.Max,
             exp.AnyValue, exp.FirstValue, exp.LastValue, exp.Lag, exp.Lead)  # fmt: skip
_SAME = (exp.Paren, exp.Alias, exp.Cast, exp.TryCast, exp.Upper, exp.Lower, exp.Trim,
         exp.Substring)  # fmt: skip


class Size(NamedTuple):
    """A bound of one value: literal characters and stored columns it can hold, and the
    characters of literals evaluated to compute it (``work``)."""

    characters: int = 0
    columns: int = 0
    work: int = 0

    def __add__(self, other: Size) -> Size:  # type: ignore[override]
        return Size(self.characters + other.characters, self.columns + other.columns,
                    self.work + other.work)  # fmt: skip

    def widest(self, other: Size) -> Size:
        """The larger value of two branches, both evaluated."""
        return Size(max(self.characters, other.characters), max(self.columns, other.columns),
                    self.work + other.work)  # fmt: skip

    def evaluated(self, condition: Size) -> Size:
        """This value, with ``condition`` evaluated too (its work only)."""
        return Size(self.characters, self.columns, self.work + condition.work)


def key_size(keys: list[exp.Expr], scope: Scope) -> Size:
    """The bound of the values of ``keys`` (expressions of ``scope``) together."""
    sizer = _Sizer()
    total = Size()
    for key in keys:
        total = total + sizer.size(key, scope)
    return total


def too_long(size: Size) -> str | None:
    """Why keys of ``size`` are refused, or None."""
    if size.characters > MAX_KEY_CHARACTERS:
        return (f"they can hold {size.characters:,} characters of literals (at most "
                f"{MAX_KEY_CHARACTERS:,})")  # fmt: skip
    if size.columns > MAX_KEY_COLUMNS:
        return (f"they can concatenate {size.columns:,} stored values (at most "
                f"{MAX_KEY_COLUMNS:,}; a column built on itself doubles at each step)")  # fmt: skip
    if size.work > MAX_KEY_WORK:
        return (f"they evaluate {size.work:,} characters of literals per row (at most "
                f"{MAX_KEY_WORK:,})")  # fmt: skip
    return None


class _Sizer:
    """Sizes of expressions; a derived column is sized once per scope (memo), so a CTE built
    on itself costs its depth, not its expansion."""

    def __init__(self) -> None:
        self.memo: dict[tuple[int, str], Size] = {}

    def size(self, node: exp.Expr, scope: Scope) -> Size:
        if isinstance(node, exp.Literal):
            n = len(node.this) if isinstance(node.this, str) else 0
            return Size(n, 0, n)
        if isinstance(node, exp.Column):
            return self._column(node, scope)
        if isinstance(node, (exp.Subquery, exp.Select, exp.SetOperation)):
            return self._subquery(node, scope)
        if isinstance(node, exp.Case):
            out = Size()
            for branch in node.args.get("ifs") or []:
                out = out.widest(self.size(branch.args["true"], scope)).evaluated(
                    self.size(branch.this, scope)
                )
            default = node.args.get("default")
            if node.this is not None:
                out = out.evaluated(self.size(node.this, scope))
            return out if default is None else out.widest(self.size(default, scope))
        if isinstance(node, exp.If):
            out = self.size(node.args["true"], scope).evaluated(self.size(node.this, scope))
            false = node.args.get("false")
            return out if false is None else out.widest(self.size(false, scope))
        children = [c for c in node.iter_expressions() if not isinstance(c, exp.DataType)]
        if isinstance(node, _SAME) and node.this is not None:
            out = self.size(node.this, scope)
            for child in children:
                if child is not node.this:
                    out = out.evaluated(self.size(child, scope))
            return out
        out = Size()
        for child in children:
            part = self.size(child, scope)
            out = out.widest(part) if isinstance(node, _BRANCHES) else out + part
        return out

    def _column(self, column: exp.Column, scope: Scope) -> Size:
        source = scope.sources.get(column.table) if column.table else None
        if not isinstance(source, Scope):
            return Size(0, 1, 0)  # a stored column (or one the guard resolves otherwise)
        memo = (id(source), column.name)
        if memo not in self.memo:
            self.memo[memo] = Size(0, 1, 0)  # while sizing it (no column reads itself)
            self.memo[memo] = self._projection(source, column.name)
        return self.memo[memo]

    def _projection(self, source: Scope, name: str) -> Size:
        """The size of the output ``name`` of a derived table or CTE (of a set operation, the
        widest of its parts' outputs at that position)."""
        query = source.expression
        if isinstance(query, exp.SetOperation):
            names = list(query.named_selects)
            if name not in names:
                return Size(0, 1, 0)
            position = names.index(name)
            out = Size()
            for part in source.set_operation_scopes:
                selects = part.expression.selects
                if position < len(selects):
                    out = out.widest(self._output(part, selects[position]))
            return out
        for projection in query.selects:
            if projection.alias_or_name == name:
                return self._output(source, projection)
        return Size(0, 1, 0)

    def _output(self, scope: Scope, projection: exp.Expr) -> Size:
        if isinstance(projection, exp.Star) or (
            isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star)
        ):
            return Size(0, 1, 0)
        return self.size(projection.unalias(), scope)

    def _subquery(self, node: exp.Expr, scope: Scope) -> Size:
        inner = node
        while isinstance(inner, exp.Subquery):
            inner = inner.this
        for sub in scope.subquery_scopes:
            if sub.expression is inner:
                selects = inner.selects
                return self._output(sub, selects[0]) if selects else Size()
        return Size(0, 1, 0)
