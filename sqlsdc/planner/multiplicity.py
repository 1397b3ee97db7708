"""Multiplicity: prove that no join repeats a confidential row, or refuse the query.

Cell key noise depends on *which* units are in a cell, a threshold on *how many*; neither
survives a join that repeats rows. Joining a public table twice on an always-true condition
multiplies every count by the square of its size while the noise stays the same, and a
self-join on a non-unique column repeats each person once per housemate. So every scope that
reads confidential rows must have a **driver**: one source whose rows are confidential rows,
such that every other source is reached from it through an equality on a column proven unique
in that source. Each driver row then meets at most one row of every other source, the rows of
the scope are the driver's rows (each at most once), and the other sources only add attributes
(a person's household tenure, a region's name).

A column is unique in a source when

* it has a single-column unique index or constraint in the database (the privacy unit of a
  table with one row per unit, the ``key`` a policy declares for a public table — both indexed
  when the policy is applied, so the engine enforces them);
* it is a derived table's only GROUP BY key (or only DISTINCT column), passed through; or
* it passes a unique column of a derived table's driver through unchanged.

A source of at most one row (an aggregation without GROUP BY) is reached without condition.

Rows of the other confidential sources repeat (a household once per member), so their
measures cannot be summed or averaged in that scope; they can be counted as units with
``COUNT(DISTINCT unit)``, grouped by and filtered on. RIGHT, FULL and CROSS joins of
confidential rows are refused, and so is a LEFT join whose preserved side is not the driver's.

The distinct values of a dimension are counted in the driver's own column only: the cell key
method keys that count by the rows that hold a value, and which row of another source a driver
row meets is the analyst's expression (``JOIN regions r ON r.region = CASE ... END``), so two
counts of one column over the same rows, and one noise, could differ by one person (red team
s35c).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlglot import exp
from sqlglot.optimizer.scope import Scope

from sqlsdc.errors import PolicyViolation
from sqlsdc.planner.normal_form import STATISTIC
from sqlsdc.planner.scopes import Analysis, Kind, ScopeInfo, own_nodes, reads_public_only
from sqlsdc.policy import Policy

DIALECT = "duckdb"
JOIN_HINT = (
    "join other tables on a unique key so that each confidential row appears once: a "
    "confidential table on its privacy unit (e.g. JOIN households h ON p.household_id = "
    "h.household_id), a public table on the key its policy declares (e.g. JOIN regions r ON "
    "p.region = r.region), or a derived table on its only GROUP BY column"
)


@dataclass(frozen=True)
class SourceShape:
    """What the multiplicity proof knows of one source of a scope."""

    confidential: bool  # its rows are confidential rows
    unique: frozenset[str] = frozenset()  # columns unique in it
    single_row: bool = False
    repeated: frozenset[str] = frozenset()  # columns that come from repeated rows
    # columns whose value is a stored column of the source's own rows (None: every column, a
    # table's); a derived table's are the plain columns of its driver's own that it passes on
    own: frozenset[str] | None = None


@dataclass
class Multiplicity:
    """The proof for every scope that reads confidential rows: its driver's alias."""

    drivers: dict[int, str] = field(default_factory=dict)  # id(select) -> driver alias
    shapes: dict[int, SourceShape] = field(default_factory=dict)  # id(select) -> as a source


def prove_multiplicity(
    analysis: Analysis, policy: Policy, unique_columns: Mapping[str, frozenset[str]], sql: str
) -> Multiplicity:
    """Find the driver of every scope over confidential rows; refuse joins that may repeat."""
    proof = Multiplicity()
    prover = _Prover(analysis, policy, unique_columns, sql, proof)
    for info in analysis.order:
        prover.prove(info)
    return proof


class _Prover:
    def __init__(self, analysis, policy, unique_columns, sql, proof: Multiplicity):
        self.analysis = analysis
        self.policy = policy
        self.unique_columns = unique_columns
        self.sql = sql
        self.proof = proof
        self.reads_confidential = any(i.kind is not Kind.SAFE for i in analysis.order)

    def _check_scalar_rows(self, query: exp.Expr, shapes: dict[str, SourceShape]) -> None:
        """In a statement that reads confidential rows, a scalar subquery returns at most one
        row by its form. DuckDB raises when one returns more, and whether it runs at all
        depends on the confidential rows (the plan parts their statistics prove empty are
        dropped): ``age > 98 AND code = (SELECT MIN(code) FROM codes GROUP BY label)`` failed
        and ``age > 99`` answered, the oldest person's age (red team s35d). ``query``: a
        subquery scope's SELECT or set operation; IN, EXISTS and derived tables pass."""
        wrapper = query.parent
        if not isinstance(wrapper, exp.Subquery) or isinstance(
            wrapper.parent, (exp.In, exp.From, exp.Join, exp.Lateral)
        ):
            return
        if _at_most_one_row(query, shapes):
            return
        raise PolicyViolation(
            f"the scalar subquery ({query.sql(DIALECT)[:80]}) may return more than one row: "
            "the error that would raise runs or not as the confidential rows say",
            "aggregate it without GROUP BY (e.g. SELECT MIN(code) FROM ...), add LIMIT 1, or "
            "select one row by a unique key (WHERE key = 'value')",
            self.sql,
        )

    def refuse(self, reason: str) -> PolicyViolation:
        return PolicyViolation(reason, JOIN_HINT, self.sql)

    def prove(self, info: ScopeInfo) -> None:
        select = info.scope.expression
        if not isinstance(select, exp.Select):
            if self.reads_confidential and info.scope.is_subquery:
                self._check_scalar_rows(select, {})
            return
        shapes = {alias: self.shape(source) for alias, (_n, source) in
                  info.scope.selected_sources.items()}  # fmt: skip
        if self.reads_confidential and info.scope.is_subquery:
            self._check_scalar_rows(select, shapes)
        if info.kind is Kind.SAFE and len(shapes) > 1 and self.reads_confidential:
            self._check_public_joins(info, shapes)
        if info.kind is Kind.SAFE or len(shapes) < 2:
            driver = next(iter(shapes), None)
            self.proof.drivers[id(select)] = driver
            self.proof.shapes[id(select)] = self._as_source(info, shapes, driver)
            self._check_repeated_measures(info, shapes, driver)
            if info.kind is not Kind.SAFE:
                self._check_distinct_values(info, shapes, driver)
            return
        joins = select.args.get("joins") or []
        for join in joins:
            side, kind = (join.args.get("side") or "").upper(), (join.args.get("kind") or "")
            if side in ("RIGHT", "FULL") or kind.upper() == "CROSS":
                raise self.refuse(
                    f"{side or kind.upper()} JOIN of confidential rows is not allowed (it can add "
                    "or repeat rows)"
                )
        left_joined = {j.this.alias_or_name for j in joins if (j.args.get("side") or "") == "LEFT"}
        candidates = [a for a, s in shapes.items() if s.confidential and a not in left_joined]
        for driver in candidates:
            if self._reach(select, shapes, driver, left_joined) == set(shapes):
                self.proof.drivers[id(select)] = driver
                self.proof.shapes[id(select)] = self._as_source(info, shapes, driver)
                self._check_repeated_measures(info, shapes, driver)
                self._check_distinct_values(info, shapes, driver)
                return
        unreached = self._explain_failure(select, shapes, candidates, left_joined)
        raise self.refuse(unreached)

    def _check_public_joins(self, info: ScopeInfo, shapes) -> None:
        """In a statement that reads confidential rows, public tables are joined on unique
        keys too: whether the engine joins them at all depends on the confidential rows (it
        skips a join whose other side is empty, and plan parts its statistics prove empty),
        so a join that multiplies public rows was a timer on one person (red team s35c:
        ``age = 91 AND region IN (SELECT ... FROM regions a, regions b, ...)`` ran out of
        the statement timeout when that person existed). Tied on unique keys, each public
        table adds at most one scan of its rows."""
        select = info.scope.expression
        public = {alias for alias, (_n, source) in info.scope.selected_sources.items()
                  if reads_public_only(source, self.analysis.infos)}  # fmt: skip
        if not public:
            return
        joins = select.args.get("joins") or []
        left_joined = {j.this.alias_or_name for j in joins if (j.args.get("side") or "") == "LEFT"}
        for driver in shapes:
            if public <= self._reach(select, shapes, driver, left_joined):
                return
        raise PolicyViolation(
            f"the join of {', '.join(sorted(public))} can multiply public rows: in a query "
            "that reads confidential rows, whether the engine does that work depends on them, "
            "and its time would tell them",
            JOIN_HINT,
            self.sql,
        )

    # ------------------------------------------------------------------ sources
    def shape(self, source) -> SourceShape:
        if isinstance(source, exp.Table):
            table = self.policy.table(source.name)
            unique = self.unique_columns.get(table.name, frozenset())
            return SourceShape(not table.is_public, frozenset(c.lower() for c in unique))
        if isinstance(source, Scope):
            known = self.proof.shapes.get(id(source.expression))
            if known is not None:
                return known
            info = self.analysis.infos.get(id(source.expression))
            return SourceShape(info is not None and info.kind is Kind.ROW, own=frozenset())
        return SourceShape(False, own=frozenset())

    def _as_source(self, info: ScopeInfo, shapes: dict[str, SourceShape], driver) -> SourceShape:
        """How this scope looks to a scope that reads it."""
        select = info.scope.expression
        group = select.args.get("group")
        if info.kind is not Kind.ROW:
            keys = _plain_group_columns(select)
            if keys is None:  # grouping sets, ROLLUP, CUBE: a key value can repeat
                return SourceShape(False)
            if not keys and not group and info.aggregates:
                return SourceShape(False, single_row=True, own=frozenset())
            unique = set()
            if len(keys) == 1:
                unique = {p.alias_or_name.lower() for p in select.expressions
                          if p.unalias() == keys[0]}  # fmt: skip
            return SourceShape(False, frozenset(unique), own=frozenset())
        unique, repeated, own = set(), set(), set()
        for projection in select.expressions:
            value, name = projection.unalias(), projection.alias_or_name.lower()
            if not isinstance(value, exp.Column):
                if any(self._is_repeated(c, shapes, driver) for c in value.find_all(exp.Column)):
                    repeated.add(name)
                continue
            if value.table == driver and value.name.lower() in shapes[driver].unique:
                unique.add(name)
            if self._is_repeated(value, shapes, driver):
                repeated.add(name)
            if self._is_own(value, shapes, driver):
                own.add(name)
        return SourceShape(
            True, frozenset(unique), repeated=frozenset(repeated), own=frozenset(own)
        )

    @staticmethod
    def _is_own(column: exp.Column, shapes: dict[str, SourceShape], driver) -> bool:
        """Whether ``column`` is a stored column of the driver's own rows."""
        shape = shapes.get(column.table)
        if column.table != driver or shape is None:
            return False
        return shape.own is None or column.name.lower() in shape.own

    @staticmethod
    def _is_repeated(column: exp.Column, shapes: dict[str, SourceShape], driver) -> bool:
        shape = shapes.get(column.table)
        if shape is None:
            return False
        if column.table != driver:
            return shape.confidential
        return column.name.lower() in shape.repeated

    # ------------------------------------------------------------------ reach
    def _reach(self, select, shapes, driver: str, left_joined: set[str]) -> set[str]:
        """Sources each row of ``driver`` meets at most once, through unique-key equalities."""
        reached = {driver} | {a for a, s in shapes.items() if s.single_row}
        edges = self._edges(select, left_joined)
        changed = True
        while changed:
            changed = False
            for target, column, other_side, allowed in edges:
                if target in reached or column not in shapes[target].unique:
                    continue
                if other_side <= reached and (allowed is None or other_side <= allowed):
                    reached.add(target)
                    changed = True
        return reached

    def _edges(self, select, left_joined: set[str]):
        """(target alias, unique column, aliases of the other side, allowed origins) of every
        top-level equality that can tie a source to the others."""
        edges = []
        clauses: list[tuple[exp.Expr, str | None]] = []
        where = select.args.get("where")
        if where is not None:
            clauses.append((where.this, None))
        seen = [select.args["from_"].this.alias_or_name]
        for join in select.args.get("joins") or []:
            alias = join.this.alias_or_name
            if join.args.get("on") is not None:
                clauses.append((join.args["on"], alias if alias in left_joined else None))
            seen.append(alias)
        order = {alias: i for i, alias in enumerate(seen)}
        for clause, only_target in clauses:
            for conjunct in clause.flatten() if isinstance(clause, exp.And) else [clause]:
                conjunct = _unparen(conjunct)
                if not isinstance(conjunct, exp.EQ):
                    continue
                for here, there in ((conjunct.left, conjunct.right),
                                    (conjunct.right, conjunct.left)):  # fmt: skip
                    here = _unparen(here)
                    if not isinstance(here, exp.Column) or not here.table:
                        continue
                    if only_target is not None and here.table != only_target:
                        continue
                    other = {c.table for c in there.find_all(exp.Column)}
                    if here.table in other:
                        continue
                    allowed = None
                    if only_target is not None:  # a LEFT join's ON ties it to earlier sources
                        allowed = {a for a, i in order.items() if i < order[only_target]}
                    edges.append((here.table, here.name.lower(), other, allowed))
        return edges

    def _explain_failure(self, select, shapes, candidates, left_joined) -> str:
        if not candidates:
            return (
                "a LEFT JOIN that preserves a public table adds rows to confidential ones; "
                "put the confidential table first (FROM persons p LEFT JOIN ...)"
            )
        driver = candidates[0]
        unreached = sorted(set(shapes) - self._reach(select, shapes, driver, left_joined))
        return (
            f"the join of {', '.join(unreached)} can repeat rows of {driver}: no equality ties "
            f"{'it' if len(unreached) == 1 else 'them'} on a unique key"
        )

    # ------------------------------------------------------------------ measures
    def _check_repeated_measures(self, info: ScopeInfo, shapes, driver: str) -> None:
        for aggregate in info.aggregates:
            if isinstance(aggregate, exp.Count):
                continue
            for column in own_nodes(aggregate):
                if isinstance(column, exp.Column) and self._is_repeated(column, shapes, driver):
                    raise PolicyViolation(
                        f"{aggregate.sql(DIALECT)[:80]} sums values of {column.table}, whose rows "
                        f"repeat once per matching row of {driver}",
                        f"aggregate {column.table} on its own (FROM its table, without the join), "
                        f"or count its units with COUNT(DISTINCT ...)",
                        self.sql,
                    )

    def _check_distinct_values(self, info: ScopeInfo, shapes, driver) -> None:
        """A distinct count of a dimension (not of units) counts a column of the driver's own
        rows (this module's docstring)."""
        for aggregate in info.aggregates:
            distinct = aggregate.this
            if not isinstance(distinct, exp.Distinct) or STATISTIC not in aggregate.meta:
                continue
            column = _unparen(distinct.expressions[0])
            if isinstance(column, exp.Column) and self._is_own(column, shapes, driver):
                continue
            raise PolicyViolation(
                f"{aggregate.sql(DIALECT)[:80]}: COUNT(DISTINCT ...) counts a dimension of the "
                f"confidential rows themselves ({driver}), not of a table joined to them: which "
                "row of it a confidential row meets is the query's choice, while the noise "
                "follows the rows",
                f"count the distinct values of a column of {driver}, or aggregate the joined "
                "table on its own",
                self.sql,
            )


def _plain_group_columns(select: exp.Select) -> list[exp.Expr] | None:
    """The plain GROUP BY keys (or DISTINCT projections); None for ROLLUP/CUBE/GROUPING SETS."""
    group = select.args.get("group")
    if group is not None:
        if any(group.args.get(k) for k in ("rollup", "cube", "grouping_sets")):
            return None
        if any(isinstance(e, (exp.Rollup, exp.Cube, exp.GroupingSets)) for e in group.expressions):
            return None
        return list(group.expressions)
    if select.args.get("distinct") is not None:
        return [p.unalias() for p in select.expressions]
    return []


def _unparen(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _at_most_one_row(query: exp.Expr, shapes: dict[str, SourceShape]) -> bool:
    """Whether ``query`` returns at most one row by its form: LIMIT 0 or 1; a SELECT without
    FROM; one with an aggregate and no GROUP BY; or one of a single source, one row at most
    (an aggregate) or a unique column of which its WHERE equates to a literal."""
    limit = query.args.get("limit")
    count = limit.expression if isinstance(limit, exp.Limit) else None
    if isinstance(count, exp.Literal) and count.is_int and int(count.this) <= 1:
        return True
    if not isinstance(query, exp.Select) or query.args.get("group") is not None:
        return False
    if query.args.get("from_") is None:
        return True  # SELECT 'year': one row
    if any(isinstance(n, exp.AggFunc) and not isinstance(n.parent, exp.Window)
           for p in query.expressions for n in own_nodes(p)):  # fmt: skip
        return True
    if query.args.get("joins") or len(shapes) != 1:
        return False
    ((alias, shape),) = shapes.items()
    if shape.single_row:
        return True
    where = query.args.get("where")
    pinned = {
        side.name.lower()
        for eq in (_conjuncts(where.this) if where is not None else [])
        if isinstance(eq, exp.EQ)
        for side, other in ((eq.this, eq.expression), (eq.expression, eq.this))
        if isinstance(side, exp.Column) and side.table == alias and isinstance(other, exp.Literal)
    }
    return bool(pinned & shape.unique)


def _conjuncts(node: exp.Expr) -> list[exp.Expr]:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        return [*_conjuncts(node.this), *_conjuncts(node.expression)]
    return [node]
