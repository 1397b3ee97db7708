"""The most rows a DP statement's answer can have, known before the statement is charged.

A DP statement pays before its exact cells are computed (:mod:`sqlsdc.guard.dp_release`), and
its answer, the analyst's SQL over the noisy cells, is read only after that, under the cap of
rows a connection returns. How many rows it has depends on released values (HAVING, a join
or a filter on noisy values) and, with private groups, on the groups the selection keeps: an
answer stopped then as too large has paid for nothing, and nothing data-dependent may make a
refusal come before the charge instead. So the answer's size is bounded from facts that do
not depend on the confidential data, and a statement whose bound is over the cap is refused
before the charge; one within it can never be stopped for its rows after.

The facts: the cells of each DP stage (the product of its public domains; private groups: at
most :data:`sqlsdc.guard.dp_limits.MAX_PRIVATE_GROUPS`, the most a stage releases), the rows
of public tables, and the query's shape: a join multiplies, unless a side is unique on the
columns it is joined on (a stage's relation on its group keys, a public table on its declared
key, a grouped or DISTINCT select on its outputs, and any of these through joins that meet
one row per row, such as the cell key method's lookup of its p-table), a union adds, an
aggregate without GROUP BY is one row, each grouping set (ROLLUP, CUBE, GROUPING SETS) groups
the rows again, LIMIT caps. Whatever else the answer reads (another method's groups from
confidential rows, a table function, UNNEST, PIVOT) has no bound of its own:
joined to a DP stage on its unique keys it is bounded by the stage, otherwise a DP statement
reading it is refused before the charge.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlglot import exp

from sqlsdc.catalog.schema import CATALOG_SCHEMA

__all__ = ["answer_rows"]

_UNKNOWN = math.inf


_CATALOG_ONE_ROW = frozenset({(CATALOG_SCHEMA, "ckm_mix")})  # the cell key method's constants
_CATALOG_LOOKUPS = frozenset({(CATALOG_SCHEMA, "ptable_entries")})
"""Catalog tables the rewrite joins so that each row meets exactly one of theirs: a p-table's
entries tile the range of cell keys (checked when stored, :mod:`sqlsdc.catalog.ptables`), and
the cell key method joins one tile per cell. No analyst SQL reads them (the validator)."""


@dataclass(frozen=True)
class _Bound:
    """At most ``rows`` rows, unique on each set of output names in ``unique``; ``lookup``:
    a catalog table that each row joined to it meets once (:data:`_CATALOG_LOOKUPS`)."""

    rows: float
    unique: tuple[frozenset[str], ...] = ()
    lookup: bool = False

    def unique_on(self, names: set[str]) -> bool:
        return self.rows <= 1 or any(u <= names for u in self.unique)


def answer_rows(
    tree: exp.Expr,
    relations: Mapping[str, tuple[int, frozenset[str]]],
    public: Callable[[exp.Table], tuple[int, frozenset[str]] | None],
) -> float:
    """The most rows ``tree`` (a protected statement) can answer, ``math.inf`` when unknown.

    ``relations``: per noisy-cells relation name (lower case), its most cells and its key
    columns; ``public(table)``: a public table's rows and its unique key columns, or None for
    any other table."""
    return _Bounds(relations, public, _scan(tree)).query(tree, {}).rows


class _Bounds:
    def __init__(self, relations, public, levels: tuple[set[int], set[int]]):
        self.relations, self.public = relations, public
        self.aggregating, self.unnesting = levels

    def query(self, node: exp.Expr, ctes: dict[str, _Bound]) -> _Bound:
        """A query expression: a SELECT, a set operation, a subquery (its own CTEs first)."""
        with_ = node.args.get("with_") or node.args.get("with")
        if with_ is not None:
            if with_.args.get("recursive"):
                return _Bound(_UNKNOWN)
            ctes = dict(ctes)
            for cte in with_.expressions:
                ctes[cte.alias_or_name.lower()] = _renamed(cte, self.query(cte.this, ctes))
        if isinstance(node, exp.Subquery):
            inner = node.this
            joined = isinstance(inner, exp.Table) or (  # a parenthesised join: (a JOIN b)
                isinstance(inner, exp.Subquery) and inner.args.get("joins"))  # fmt: skip
            bound = self.source(inner, ctes) if joined else self.query(inner, ctes)
        elif isinstance(node, exp.Select):
            bound = self.select(node, ctes)
        elif isinstance(node, exp.SetOperation):
            left, right = self.query(node.left, ctes), self.query(node.right, ctes)
            if isinstance(node, exp.Union):
                bound = _Bound(left.rows + right.rows)
            elif isinstance(node, exp.Intersect):
                bound = _Bound(min(left.rows, right.rows))
            else:
                bound = _Bound(left.rows)
        elif isinstance(node, exp.Values):
            bound = _Bound(len(node.expressions))
        else:
            return _Bound(_UNKNOWN)
        return _limited(node, bound)

    def source(self, node: exp.Expr, ctes: dict[str, _Bound]) -> _Bound:
        """A FROM or JOIN source, with the joins it carries (``FROM a, b`` and ``(a JOIN b)``
        hang them on ``a``: red team s36d), under the names its alias gives its columns."""
        bound = _renamed(node, self.single(node, ctes))
        joins = node.args.get("joins")
        if not joins:
            return bound
        sources = {node.alias_or_name.lower(): bound}
        rows = bound.rows
        for join in joins:
            right = self.source(join.this, ctes)
            alias = join.this.alias_or_name.lower()
            rows, _one = _joined(join, rows, sources, alias, right, None)
            sources[alias] = right
        return _Bound(rows)  # its columns are the sources': no unique claim survives

    def single(self, node: exp.Expr, ctes: dict[str, _Bound]) -> _Bound:
        """A FROM or JOIN source without the joins it carries."""
        if node.args.get("pivots"):
            return _Bound(_UNKNOWN)  # PIVOT and UNPIVOT reshape rows (the validator refuses)
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier):
            name = node.name.lower()
            if not node.db and name in ctes:
                return ctes[name]
            if not node.db and name in self.relations:
                cells, keys = self.relations[name]
                return _Bound(cells, (keys,))
            if (node.db.lower(), name) in _CATALOG_ONE_ROW:
                return _Bound(1)
            if (node.db.lower(), name) in _CATALOG_LOOKUPS:
                return _Bound(_UNKNOWN, lookup=True)
            found = self.public(node)
            if found is None:
                return _Bound(_UNKNOWN)
            rows, key = found
            return _Bound(rows, (key,) if key else ())
        if isinstance(node, exp.Subquery | exp.Values):
            return self.query(node, ctes)
        return _Bound(_UNKNOWN)  # UNNEST, table functions, LATERAL, PIVOT: not bounded here

    def select(self, select: exp.Select, ctes: dict[str, _Bound]) -> _Bound:
        from_ = select.args.get("from_") or select.args.get("from")
        if from_ is None:
            rows, sources, base = 1.0, {}, None
        else:
            base = from_.this.alias_or_name.lower()
            sources = {base: self.source(from_.this, ctes)}
            rows = sources[base].rows
        for i, join in enumerate(select.args.get("joins") or ()):
            right = self.source(join.this, ctes)
            alias = join.this.alias_or_name.lower()
            rows, one = _joined(join, rows, sources, alias, right, base if i == 0 else None)
            base = base if one else None  # its rows met one row each: still unique
            sources[alias] = right
        if id(select) in self.unnesting:
            return _Bound(_UNKNOWN)  # UNNEST in the select list: rows per list element
        group = select.args.get("group")
        if id(select) in self.aggregating and not group:
            return _Bound(min(rows, 1))
        sets = _grouping_sets(group)
        if sets != 1:  # each grouping set groups the rows again (red team s36f)
            return _Bound(max(rows, 1) * sets)
        return _Bound(rows, _unique_outputs(select, sources, base))


def _grouping_sets(group: exp.Group | None) -> float:
    """How many grouping sets ``group`` has (1 for a plain GROUP BY): ROLLUP of n keys has
    n + 1, CUBE 2^n, GROUPING SETS the sum of its elements', and a list their product; a
    ROLLUP or CUBE nested in another's keys, or WITH TOTALS, is not counted (unknown)."""
    if group is None:
        return 1
    if any(group.args.get(k) for k in ("rollup", "cube", "grouping_sets", "totals")):
        return _UNKNOWN  # the arguments older sqlglot versions put them in

    def count(key: exp.Expr) -> float:
        if isinstance(key, exp.GroupingSets):
            return sum(count(k) for k in key.expressions)
        if isinstance(key, exp.Rollup | exp.Cube):
            if any(k.find(exp.Rollup, exp.Cube, exp.GroupingSets) for k in key.expressions):
                return _UNKNOWN
            n = len(key.expressions)
            return n + 1 if isinstance(key, exp.Rollup) else 2.0**n
        if key.find(exp.Rollup, exp.Cube, exp.GroupingSets):
            return _UNKNOWN  # inside another expression: not a shape read here
        return 1

    return math.prod(count(k) for k in group.expressions)


def _joined(join: exp.Join, rows: float, sources: dict[str, _Bound], alias: str, right: _Bound,
            first: str | None) -> tuple[float, bool]:  # fmt: skip
    """The most rows after ``join`` (of ``right``, as ``alias``), and whether each left row
    is in at most one of them. A left row meets at most one right row when the right side is
    unique on the columns the join equates (or is a catalog lookup); an inner join of the
    ``first`` source alone, unique on its own equated columns, has at most the right side's
    rows."""
    kind, side = (join.args.get("kind") or "").upper(), (join.args.get("side") or "").upper()
    if kind in ("SEMI", "ANTI"):
        return rows, True
    if (join.args.get("method") or "").upper() == "POSITIONAL":
        return max(rows, right.rows), False
    matched = _equated(join, alias, set(sources))
    one = (right.unique_on(matched) or kind == "ASOF"  # ASOF: one match per left row at most
           or (right.lookup and join.args.get("on") is not None))  # fmt: skip
    inner = rows * (1 if one else right.rows)
    if side == "RIGHT":  # the pairs, and the right rows without one
        return inner + right.rows, False
    if side in ("LEFT", "FULL"):  # each left row once at least, in its pairs or alone
        return max(inner, rows) + (right.rows if side == "FULL" else 0), one and side == "LEFT"
    if first is not None and sources[first].unique_on(_equated(join, first, {alias})):
        inner = min(inner, right.rows)
    return inner, one


def _equated(join: exp.Join, alias: str, others: set[str]) -> set[str]:
    """The columns of ``alias`` that the join equates to columns of the ``others`` sources
    (``USING``, or equalities among the ON condition's conjuncts)."""
    using = join.args.get("using")
    if using:
        return {u.name.lower() for u in using}
    names: set[str] = set()
    if not alias:  # an unaliased derived table: its columns and others' alike unqualified,
        return names  # so ``ON q = w`` may equate two of its own (red team s36f)
    others = others - {""}
    on = join.args.get("on")
    for conjunct in on.flatten() if isinstance(on, exp.And) else [on] if on else []:
        if not isinstance(conjunct, exp.EQ):
            continue
        a, b = conjunct.this, conjunct.expression
        if not (isinstance(a, exp.Column) and isinstance(b, exp.Column)):
            continue
        for mine, other in ((a, b), (b, a)):
            if mine.table.lower() == alias and other.table.lower() in others:
                names.add(mine.name.lower())
    return names


def _renamed(node: exp.Expr, bound: _Bound) -> _Bound:
    """``bound`` of a source or CTE whose alias may list new names for its columns (``AS
    t(a, b)``): the unique sets name the columns as the query inside says them, and a list
    renames them by position, so ``(SELECT k, v ...) AS t(v, k)`` is not unique on its ``k``
    (red team s36d); none is claimed then."""
    alias = node.args.get("alias")
    if isinstance(alias, exp.TableAlias) and alias.columns:
        return _Bound(bound.rows, (), bound.lookup)
    return bound


_SOURCES = frozenset({"from_", "from", "joins", "with_", "with"})
_UNNESTING = frozenset({"generate_subscripts", "regexp_split_to_table", "inline_outer"})
"""DuckDB's macros over UNNEST and Spark's generators sqlglot does not name: in a select list,
rows per element (red team s36f)."""


def _scan(tree: exp.Expr) -> tuple[set[int], set[int]]:
    """The selects (by ``id``) with an aggregate of their own level (not in a window, nor in a
    subquery: without GROUP BY, one row), and those with an UNNEST of their own (in the
    select list, rows per list element; elsewhere it is a source, unbounded anyway). One
    walk of the tree by its arguments: sqlglot's ``find_all`` over each select's expressions
    took most of the bound's time (hidden columns are large CASE expressions)."""
    aggregating: set[int] = set()
    unnesting: set[int] = set()
    # each node with the select whose level it is on, and that select again unless the node
    # is inside a window (whose aggregates are per row)
    stack: list[tuple[exp.Expr, exp.Expr | None, exp.Expr | None]] = [(tree, None, None)]
    while stack:
        node, level, grouping = stack.pop()
        if grouping is not None and isinstance(node, exp.AggFunc):
            aggregating.add(id(grouping))
        if level is not None and (
            isinstance(node, exp.Explode | exp.Unnest | exp.Inline | exp.Stack)
            or (isinstance(node, exp.Anonymous) and node.name.lower() in _UNNESTING)
        ):
            unnesting.add(id(level))
        if isinstance(node, exp.Select):
            level = grouping = node
        elif isinstance(node, exp.Window):
            grouping = None
        for key, value in node.args.items():
            # an aggregate in the select's sources (a PIVOT's) is not the select's: it does
            # not make its rows one (red team s36f)
            of = None if level is node and key in _SOURCES else grouping
            if isinstance(value, exp.Expr):
                stack.append((value, level, of))
            elif isinstance(value, list):
                stack.extend((v, level, of) for v in value if isinstance(v, exp.Expr))
    return aggregating, unnesting


def _unique_outputs(
    select: exp.Select, sources: dict[str, _Bound], base: str | None
) -> tuple[frozenset, ...]:
    """Sets of output names on which the select's rows are unique (none when a name repeats):
    its GROUP BY keys (no grouping sets), all its outputs under DISTINCT, or the unique
    columns of its source ``base`` (the first, when every join met one row of the others per
    row) passed through as they are (one plain ``*`` of a lone source or ``base.*``, whose
    names no other output takes; ``base.column``)."""
    outputs = {}
    for projection in select.expressions:
        inner = projection.this if isinstance(projection, exp.Alias) else projection
        outputs[projection.alias_or_name.lower()] = inner
    if len(outputs) < len(select.expressions):
        # a name given twice: the engine reads the first and renames the others (k, k_1),
        # and which column a unique set names is not known here (red team s36d)
        return ()
    group = select.args.get("group")
    found: list[frozenset[str]] = []
    if select.args.get("distinct") and not select.args["distinct"].args.get("on"):
        found.append(frozenset(outputs))
    levels = ("rollup", "cube", "grouping_sets", "all")
    if group and group.expressions and not any(group.args.get(k) for k in levels):
        names, positions = set(), list(outputs)
        for key in group.expressions:
            if isinstance(key, exp.Literal):  # GROUP BY 1: a position, never the literal 1
                at = int(key.this) if not key.is_string and key.this.isdigit() else 0
                name = positions[at - 1] if 0 < at <= len(positions) else None
            else:
                name = next((n for n, e in outputs.items() if e == key), None)
            if name is None:
                break
            names.add(name)
        else:
            found.append(frozenset(names))
    if base is None or group:
        return tuple(found)
    lone = len(sources) == 1

    def of_base(column: exp.Column) -> bool:
        return column.table.lower() == base or (lone and not column.table)

    stars = [p for p in select.expressions
             if isinstance(p, exp.Star) or (isinstance(p, exp.Column) and p.is_star)]  # fmt: skip
    if stars:
        # the base's columns under their names only from one plain star of it: the engine
        # names a column given twice by its first (``SELECT x AS k, *``, a star of another
        # source first), and REPLACE, RENAME and EXCLUDE change what a name holds (s36d)
        first = stars[0]
        star = first if isinstance(first, exp.Star) else first.this
        of_it = lone if isinstance(first, exp.Star) else of_base(first)
        modified = any(star.args.get(k) for k in ("except_", "replace", "rename"))
        if len(stars) > 1 or modified or not of_it:
            return tuple(found)
        named = set(outputs) - {"*"}
        return (*found, *(u for u in sources[base].unique if not u & named))
    passed = {}
    for name, inner in outputs.items():
        if isinstance(inner, exp.Column) and not inner.is_star and of_base(inner):
            passed[inner.name.lower()] = name
    found += [frozenset(passed[c] for c in u) for u in sources[base].unique
              if all(c in passed for c in u)]  # fmt: skip
    return tuple(found)


def _limited(node: exp.Expr, bound: _Bound) -> _Bound:
    """``bound`` under the node's own LIMIT (or FETCH) of a literal count."""
    limit = node.args.get("limit")
    count = None
    if isinstance(limit, exp.Limit):
        count = limit.expression
    elif isinstance(limit, exp.Fetch):
        count = limit.args.get("count")
    if isinstance(count, exp.Literal) and not count.is_string and count.this.isdigit():
        return _Bound(min(bound.rows, int(count.this)), bound.unique)
    return bound
