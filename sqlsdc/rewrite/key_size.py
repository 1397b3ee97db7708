"""How long a private DP group key can be, bounded from the query alone, before the charge.

Private groups (``dp.groups: private``) take their keys from the data, so the analyst writes
the key expression, and the exact cells compute it for every row of the population, then hash,
group and sort it in several passes (:func:`sqlsdc.rewrite.dp_bounding.bounded_pairs`). The engine's
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

The same holds outside DP, where nothing is paid at all: a CKM or threshold count grouped by
``region || '<900,000 characters>'`` was answered in time proportional to the population's
rows, as often as wished (red team s37b, s37e). Every aggregation that no DP stage computes
has its keys bounded too (:func:`refuse_long_keys`), each key's stored values apart (a
``GROUP BY`` of many dimensions is no long key) and their literals together.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from sqlglot import exp
from sqlglot.optimizer.scope import Scope

from sqlsdc.errors import PolicyViolation
from sqlsdc.planner.plan import CellPlan
from sqlsdc.policy import Method

MAX_KEY_CHARACTERS = 1_024
"""The most characters of literals a private group's keys may hold in a value (a BI label is
a few dozen)."""
MAX_KEY_COLUMNS = 16
"""The most stored values a private group's keys may concatenate."""
MAX_KEY_WORK = 65_536
"""The most characters of literals the keys may evaluate per row, conditions included (a CASE
recoding a thousand codes to labels holds about 30,000)."""
STORED_VALUE_WORK = 16
"""The characters of work an operation reading one stored value counts (its length is the
data's, unknown before the query runs; a dimension's code or label is a few to a few dozen):
``UPPER`` of a column doubled eight times through CTEs (1,024 values) reads 16,384."""
STRFTIME_EXPANSION = 16
"""The most characters ``STRFTIME`` prints per character of its format: ``%c`` prints 19
(``2020-09-30 23:59:59``), 9.5 a character, and ``%Z`` a time zone's name, up to 32.

Why: the format was sized as its own characters, so ``STRFTIME(CASE WHEN sex = 'F' AND age
= 58 THEN DATE '2020-01-01' END, '<1,000 x %c>')`` under 30 nested ``UPPER``/``LOWER`` was
counted 62,000 and processed 570,000 characters a row: the CKM count over the one woman of
58 in R03-M023 was slower than over none in 39 of 40 paired runs (median +0.7 ms, where the
same shape over a 2,000-character literal gave +0.1 ms, 26 of 40; red team s44n)."""
MAX_ROW_COLUMNS = 1_024
"""The most stored values one column that an aggregation's conditions and arguments read may
hold, derived columns expanded (a column doubled ten times through CTEs; a WHERE of a thousand
comparisons reads a thousand columns of one value each, written out)."""

_BRANCHES = (exp.Coalesce, exp.Nullif, exp.Greatest, exp.Least, exp.Min, exp.Max,
             exp.AnyValue, exp.FirstValue, exp.LastValue, exp.Lag, exp.Lead)  # fmt: skip
_PASSED = (exp.Literal, exp.Column, exp.Paren, exp.Alias, exp.Case, exp.If, exp.Subquery,
           exp.Select, exp.SetOperation)  # fmt: skip
"""Nodes that read no operand themselves: values, pass-throughs, branches (whose conditions
and values are sized as operations of their own) and queries (sized by their outputs)."""
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


def refuse_long_keys(cells: Iterable[CellPlan]) -> None:
    """Refuse an aggregation whose rows cost work an analyst chose: group keys that could be
    long (not for DP, whose stages bound their private keys themselves, ``rewrite.dp``: its
    keys' literals together and each key's stored values, as a private DP group's), or
    conditions and aggregated arguments, of the aggregation and of the derived tables and
    CTEs it reads, that evaluate more than :data:`MAX_KEY_WORK` characters of literals per
    row (``WHERE region = 'N' AND region || '<200,000 characters>' <> ''`` took a time
    proportional to the rows of region N, repeatable for free under CKM) or read a derived
    column of more than :data:`MAX_ROW_COLUMNS` stored values."""
    for cell in cells:
        if cell.scope is None:
            continue
        sizer = _Sizer()
        if cell.mechanism is not Method.DP and cell.keys:
            sizes = [sizer.size(key, cell.scope) for key in cell.keys]
            total = Size()
            for size in sizes:
                total = total + size
            refusal = too_long(total._replace(columns=max(s.columns for s in sizes)))
            if refusal is not None:
                raise _refusal(cell, "group keys", refusal)
        rows, widest = Size(), 1  # widest: the most stored values one column reference reads
        for scope, node in _per_row(_evaluated(cell)):
            rows = rows + sizer.size(node, scope)
            for column in node.find_all(exp.Column):
                if isinstance(scope.sources.get(column.table), Scope):  # else a stored value
                    widest = max(widest, sizer.size(column, scope).columns)
        why = None
        if rows.work > MAX_KEY_WORK:
            why = (f"they evaluate {rows.work:,} characters of literals per row (at most "
                   f"{MAX_KEY_WORK:,})")  # fmt: skip
        elif widest > MAX_ROW_COLUMNS:
            why = (
                f"a column they read holds {widest:,} stored values (at most "
                f"{MAX_ROW_COLUMNS:,}; a column built on itself doubles at each step)"
            )
        if why is not None:
            raise _refusal(cell, "conditions and arguments", why)


def _refusal(cell: CellPlan, what: str, why: str) -> PolicyViolation:
    return PolicyViolation(
        f"the {what} of this aggregation are computed for every row of the population, and "
        f"{why}: their running time would tell how many rows it has",
        "group by the columns themselves or short labels, and filter on columns against short "
        "values",
        cell.select.sql("duckdb"),
    )


def _evaluated(cell: CellPlan):
    """(scope, expression) of what the engine evaluates per row of ``cell``: the aggregated
    arguments, its HAVING (per group), and the WHERE and ON conditions of its scope and every
    scope it reads."""
    for aggregate in cell.aggregates:
        for child in aggregate.node.iter_expressions():
            yield cell.scope, child
    having = cell.select.args.get("having")
    if having is not None:  # per group, suppressed ones too
        yield cell.scope, having.this
    seen, pending = set(), [cell.scope]
    while pending:
        scope = pending.pop()
        if id(scope) in seen:
            continue
        seen.add(id(scope))
        query = scope.expression
        if isinstance(query, exp.Select):
            where = query.args.get("where")
            if where is not None:
                yield scope, where.this
            for join in query.args.get("joins") or []:
                if join.args.get("on") is not None:
                    yield scope, join.args["on"]
        pending += [s for s in scope.sources.values() if isinstance(s, Scope)]
        pending += list(scope.subquery_scopes) + list(scope.set_operation_scopes)


def _per_row(evaluated):
    """The parts of conditions and arguments evaluated per row: a connector's operands that
    read no column are constants, which the engine folds once before it reads a row (a
    constant compared with a column still counts in full, inside that comparison)."""
    for scope, node in evaluated:
        for part in node.flatten() if isinstance(node, exp.Connector) else [node]:
            if any(isinstance(n, (exp.Column, exp.Subquery, exp.Select)) for n in part.walk()):
                yield scope, part


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


def _matching(text: Size, pattern: Size) -> int:
    """The work of matching ``text`` against a LIKE ``pattern``: their lengths multiplied.

    Why: DuckDB matches a pattern holding both ``%`` and ``_`` by trying the rest of the
    pattern at every position of the text after each ``%``, a time of the text's length
    times the pattern's, not their sum. ``municipality || '<27,000 a>' LIKE '%a_a_...b'``
    (a pattern of 10,801 characters: 64,817 characters of work counted as a sum, under the
    65,536 allowed) took 175 ms a row: under CKM, for free and as often as wished, the
    query over one woman of 58 in R03-M023 took 183 ms and over none 6 ms, 5 of 5 paired
    runs (red team s44n): whether she exists, and any small count, exactly."""
    return _characters(text) * _characters(pattern)


def _characters(size: Size) -> int:
    """The characters a value of ``size`` can hold (16 per stored value)."""
    return size.characters + size.columns * STORED_VALUE_WORK


class _Sizer:
    """Sizes of expressions; a derived column is sized once per scope (memo), so a CTE built
    on itself costs its depth, not its expansion."""

    def __init__(self) -> None:
        self.memo: dict[tuple[int, str], Size] = {}
        # sizes of nodes by node and scope (the node kept, so that its id names it alone)
        self._operands: dict[tuple[int, int], tuple[exp.Expr, Size]] = {}

    def size(self, node: exp.Expr, scope: Scope) -> Size:
        """The bound of ``node``'s value, with the work of every operation that reads a
        computed operand (:meth:`_reads`); sized once per node and scope."""
        key = (id(node), id(scope))
        entry = self._operands.get(key)
        if entry is not None and entry[0] is node:
            return entry[1]
        found = self._size(node, scope)
        if not isinstance(node, _PASSED):
            found = found._replace(work=found.work + self._reads(node, scope))
        self._operands[key] = (node, found)
        return found

    def _reads(self, node: exp.Expr, scope: Scope) -> int:
        """The characters of work that ``node`` does reading its computed operands: an
        operation on a value reads all of it (``UPPER``, ``LENGTH``, ``||``, ``=``, ``LIKE``
        each pass over their operands' characters), so ``UPPER(LOWER(UPPER(x)))`` does three
        times the work of ``x``. A literal operand is counted once already, as its own work;
        each stored value an operand holds counts as :data:`STORED_VALUE_WORK` characters.

        Why: the work per row counted a literal once wherever it was used, and functions of
        the same length (``UPPER``, ``LOWER``, ``TRIM``, ``CAST``) passed its size through
        for nothing: 34 nested ``UPPER``/``LOWER`` of ``scheme || '<65,000 characters>'``
        in a DP WHERE were answered, 2.2 million characters processed per row, and a paid
        query over one row of benefits took 55 ms longer (median) than over none, in 10 of
        10 paired runs; 30 of them over a column doubled eight times through CTEs (1,024
        stored values), 109 ms longer in 6 of 8 (red team s44b): whether one payment
        exists, told by the time, beyond the noise the charge paid for."""
        total = 0
        for child in node.iter_expressions():
            inner = child.unnest() if isinstance(child, exp.Paren) else child
            if isinstance(inner, (exp.Literal, exp.Null, exp.DataType)):
                continue
            operand = self.size(inner, scope)
            total += operand.characters + operand.columns * STORED_VALUE_WORK
        return total

    def _size(self, node: exp.Expr, scope: Scope) -> Size:
        if isinstance(node, exp.Literal):
            n = len(node.this) if isinstance(node.this, str) else 0
            return Size(n, 0, n)
        if isinstance(node, exp.Column):
            return self._column(node, scope)
        if isinstance(node, (exp.Subquery, exp.Select, exp.SetOperation)):
            return self._subquery(node, scope)
        size = self.size
        if isinstance(node, exp.Case):
            out = Size()
            for branch in node.args.get("ifs") or []:
                out = out.widest(size(branch.args["true"], scope)).evaluated(
                    size(branch.this, scope)
                )
            default = node.args.get("default")
            if node.this is not None:  # compared with every WHEN
                operand = size(node.this, scope)
                each = operand.characters + operand.columns * STORED_VALUE_WORK
                reads = each * len(node.args.get("ifs") or [])
                out = out.evaluated(operand._replace(work=operand.work + reads))
            return out if default is None else out.widest(size(default, scope))
        if isinstance(node, exp.In) and all(
            isinstance(e, (exp.Literal, exp.Null, exp.Neg)) for e in node.expressions
        ):  # a set of constants: DuckDB looks a row's value up, it does not scan the list
            return size(node.this, scope)
        if isinstance(node, (exp.Predicate, exp.Connector, exp.Not)):
            out = Size()  # a truth value: no characters or stored values of its own
            for child in node.iter_expressions():
                out = out.evaluated(size(child, scope))
            if isinstance(node, (exp.Like, exp.ILike)):
                matching = _matching(size(node.this, scope), size(node.expression, scope))
                out = out._replace(work=out.work + matching)
            return out
        if isinstance(node, exp.If):
            out = size(node.args["true"], scope).evaluated(size(node.this, scope))
            false = node.args.get("false")
            return out if false is None else out.widest(size(false, scope))
        children = [c for c in node.iter_expressions() if not isinstance(c, exp.DataType)]
        if isinstance(node, exp.TimeToStr):  # STRFTIME: each format character may print 16
            when, form = size(node.this, scope), size(node.args["format"], scope)
            return Size(when.characters + STRFTIME_EXPANSION * _characters(form), when.columns,
                        when.work + form.work)  # fmt: skip
        if isinstance(node, exp.Length):  # a number: its work, no characters nor values
            return Size(0, 0, sum((size(c, scope).work for c in children), 0))
        if isinstance(node, _SAME) and node.this is not None:
            out = size(node.this, scope)
            for child in children:
                if child is not node.this:
                    out = out.evaluated(size(child, scope))
            return out
        out = Size()
        for child in children:
            part = size(child, scope)
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
