"""Classify and check steps: what every scope of the query reads, and whether that is allowed.

Each scope (SELECT, CTE, derived table, subquery, set operation) gets a :class:`Kind`:

* ``ROW``: reads confidential rows without aggregating them. Allowed only as the input of an
  aggregation (a CTE or derived table); never as output, scalar/IN/EXISTS subquery or set branch.
* ``AGGREGATE``: aggregates confidential rows. Its cells are protected by the rewrite step.
* ``SAFE``: reads only public tables or already protected cells; anything allowlisted goes.

Lineage follows every column from its base table through the scopes, so the rules about roles
(identifier, dimension, measure, weight) apply wherever a value ends up: outputs, filters, groups,
joins and aggregate arguments. Expressions evaluated on confidential rows must be *total*: an
error raised for some rows but not others is a side channel, so only operations that cannot
raise for any input of their type are allowed there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum

from sqlglot import exp
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.scope import Scope, traverse_scope

from sqlsdc.errors import InternalError, PolicyViolation
from sqlsdc.planner.allowlist import (
    ALLOWED,
    DP_AGGREGATES,
    PROTECTED_AGGREGATES,
    describe,
)
from sqlsdc.planner.identity import canonical_expression
from sqlsdc.planner.linear import LinearForm, NotLinear, is_constant, linear_form
from sqlsdc.planner.normal_form import STATISTIC, normal_form
from sqlsdc.planner.signatures import literal_refusal
from sqlsdc.planner.totality import NUMERIC, TOTALITY_HINT, family, partiality
from sqlsdc.policy import AggregateKind, ColumnRole, Method, Policy

DIALECT = "duckdb"
ROW_ROLES = {ColumnRole.DIMENSION, ColumnRole.MEASURE, ColumnRole.WEIGHT}
SET_OPERATIONS = (exp.Union, exp.Intersect, exp.Except)


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
    scope: Scope
    kind: Kind
    outputs: dict[str, Lineage] = field(default_factory=dict)
    aggregates: list[exp.AggFunc] = field(default_factory=list)


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
        return self.infos[id(_unwrap(node))]


ConstantCheck = Callable[[exp.Expr], bool]


def analyze(
    tree: exp.Expr, policy: Policy, schema: dict, sql: str, constant_is_safe: ConstantCheck
) -> Analysis:
    """Classify every scope of a qualified tree and refuse whatever the policy does not allow."""
    _check_nodes(tree, sql)
    _expand_group_by_all(tree)
    annotate_types(tree, schema=schema, dialect=DIALECT)
    checker = _Checker(policy, sql, constant_is_safe)
    infos: dict[int, ScopeInfo] = {}
    order = []
    for scope in traverse_scope(tree):
        info = checker.classify(scope, infos)
        infos[id(scope.expression)] = info
        order.append(info)
    for info in order:
        checker.check(info, infos)
    return Analysis(tree, infos, order)


def _unwrap(node: exp.Expr) -> exp.Expr:
    while isinstance(node, (exp.Subquery, exp.Paren)):
        node = node.this
    return node


SELECT_CLAUSES = {
    "with_",
    "expressions",
    "distinct",
    "from_",
    "joins",
    "where",
    "group",
    "having",
    "order",
    "limit",
    "offset",
    "qualify",
}
SET_OPERATION_CLAUSES = {
    "with_",
    "this",
    "expression",
    "distinct",
    "order",
    "limit",
    "offset",
    "by_name",
    "side",
    "kind",
    "on",
}


def _check_nodes(tree: exp.Expr, sql: str) -> None:
    for node in tree.walk():
        if isinstance(node, (exp.Select, *SET_OPERATIONS)):
            allowed = SELECT_CLAUSES if isinstance(node, exp.Select) else SET_OPERATION_CLAUSES
            extra = [
                k for k, v in node.args.items() if v not in (None, [], False) and k not in allowed
            ]
            if extra or node.args.get("by_name") or node.args.get("side") or node.args.get("on"):
                clause = ", ".join(extra) or "BY NAME / side"
                raise PolicyViolation(
                    f"the clause(s) {clause} of {node.key.upper()} are not allowed",
                    "use SELECT ... FROM ... WHERE ... GROUP BY ... HAVING ... ORDER BY ... LIMIT",
                    sql,
                )
        if not isinstance(node, ALLOWED):
            raise PolicyViolation(
                f"{describe(node)} is not allowed ({node.sql(DIALECT)[:80]})",
                "use plain SELECT queries with COUNT, SUM, AVG over the declared tables; "
                "functions on files, settings, metadata or raw rows are never allowed",
                sql,
            )
        if isinstance(node, exp.With) and node.args.get("recursive"):
            raise PolicyViolation("WITH RECURSIVE is not allowed", "use non-recursive CTEs", sql)
        if isinstance(node, exp.Distinct) and node.args.get("on"):
            raise PolicyViolation("DISTINCT ON is not allowed", "use GROUP BY", sql)


def _expand_group_by_all(tree: exp.Expr) -> None:
    """Replace DuckDB's GROUP BY ALL by its non-aggregate projections (changes the tree)."""
    for select in tree.find_all(exp.Select):
        group = select.args.get("group")
        if group is None or not group.args.get("all"):
            continue
        keys = [p.unalias().copy() for p in select.expressions if not _contains_aggregate(p)]
        select.set("group", exp.Group(expressions=keys) if keys else None)


def own_nodes(node: exp.Expr) -> Iterator[exp.Expr]:
    """Nodes of ``node`` that belong to its scope (nested subqueries are not entered)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        children = [
            c
            for c in current.iter_expressions()
            if not isinstance(c, (exp.Subquery, exp.Select, *SET_OPERATIONS))
        ]
        stack.extend(reversed(children))


def scope_aggregates(node: exp.Expr) -> list[exp.AggFunc]:
    """Aggregate calls of the scope, outermost first; window functions are not aggregates."""
    found = []
    for n in own_nodes(node):
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


def _contains_aggregate(node: exp.Expr) -> bool:
    return bool(scope_aggregates(node))


def _clauses(select: exp.Select, *keys: str) -> list[exp.Expr]:
    nodes = []
    for key in keys:
        value = select.args.get(key)
        if isinstance(value, list):
            nodes.extend(value)
        elif value is not None:
            nodes.append(value)
    return nodes


class _Checker:
    def __init__(self, policy: Policy, sql: str, constant_is_safe: ConstantCheck):
        self.policy = policy
        self.sql = sql
        self.constant_is_safe = constant_is_safe

    def refuse(self, reason: str, hint: str = "") -> PolicyViolation:
        return PolicyViolation(reason, hint, self.sql)

    # ---------------------------------------------------------------- classify
    def classify(self, scope: Scope, infos: dict[int, ScopeInfo]) -> ScopeInfo:
        node = scope.expression
        if scope.external_columns:
            names = ", ".join(sorted({c.sql(DIALECT) for c in scope.external_columns}))
            raise self.refuse(
                f"correlated subqueries are not allowed (the subquery refers to {names})",
                "join a derived table instead",
            )
        if isinstance(node, SET_OPERATIONS):
            return self._classify_set_operation(node, infos)
        if not isinstance(node, exp.Select):
            raise self.refuse(f"{describe(node)} is not allowed here")
        reads_rows = False
        for source in scope.sources.values():
            if isinstance(source, exp.Table):
                table = self.policy.table(source.name)
                if table is None:
                    raise InternalError(f"undeclared table {source.name} reached analysis")
                reads_rows |= not table.is_public
            elif isinstance(source, Scope):
                reads_rows |= infos[id(source.expression)].kind is Kind.ROW
        aggregates = scope_aggregates(node)
        if not reads_rows:
            kind = Kind.SAFE
        elif aggregates or node.args.get("group"):
            kind = Kind.AGGREGATE
        else:
            kind = Kind.ROW
        info = ScopeInfo(scope, kind, aggregates=aggregates)
        for projection in node.expressions:
            lineage = self.lineage(projection, scope, infos)
            if kind is Kind.AGGREGATE:
                lineage = Lineage(
                    sources=lineage.sources, protected=_contains_aggregate(projection)
                )
            info.outputs[projection.alias_or_name] = lineage
        return info

    def _classify_set_operation(self, node: exp.Expr, infos: dict[int, ScopeInfo]) -> ScopeInfo:
        left, right = infos[id(_unwrap(node.left))], infos[id(_unwrap(node.right))]
        if Kind.ROW in (left.kind, right.kind):
            raise self.refuse(
                f"{node.key.upper()} of confidential rows is not allowed",
                "aggregate each part (GROUP BY ... with COUNT/SUM/AVG) before combining them",
            )
        outputs = {}
        for (name, a), b in zip(left.outputs.items(), right.outputs.values(), strict=False):
            outputs[name] = a | b
        return ScopeInfo(left.scope, Kind.SAFE, outputs)

    def lineage(self, node: exp.Expr, scope: Scope, infos: dict[int, ScopeInfo]) -> Lineage:
        result = Lineage()
        for n in own_nodes(node):
            if isinstance(n, exp.Column):
                result = result | self.column_lineage(n, scope, infos)
        for subquery in node.find_all(exp.Subquery):
            inner = infos.get(id(_unwrap(subquery)))
            if inner is not None:
                for lineage in inner.outputs.values():
                    result = result | lineage
        return result

    def column_lineage(self, column: exp.Column, scope: Scope, infos) -> Lineage:
        source = scope.sources.get(column.table)
        if isinstance(source, exp.Table):
            table = self.policy.table(source.name)
            if table.is_public:
                return Lineage()
            declared = table.column(column.name)
            if declared is None:
                raise InternalError(f"column {column.sql()} resolved outside the policy")
            return Lineage(
                True, frozenset({declared.role}), frozenset({(table.name, declared.name)})
            )
        if isinstance(source, Scope):
            info = infos[id(source.expression)]
            if column.name in info.outputs:
                return info.outputs[column.name]
        raise self.refuse(f"column {column.sql(DIALECT)} could not be traced to a declared table")

    # ---------------------------------------------------------------- check
    def check(self, info: ScopeInfo, infos: dict[int, ScopeInfo]) -> None:
        scope = info.scope
        if info.kind is Kind.ROW:
            if scope.is_root:
                raise self.refuse(
                    "row-level output of confidential tables is not allowed",
                    "aggregate it: e.g. SELECT region, COUNT(*), AVG(income) FROM persons "
                    "GROUP BY region",
                )
            if scope.is_subquery:
                raise self.refuse(
                    "subqueries over confidential rows (IN, EXISTS, scalar) are not allowed",
                    "aggregate the subquery, or join a derived table and aggregate the result",
                )
            self._check_row_scope(info, infos)
        elif info.kind is Kind.AGGREGATE:
            self._check_aggregate_scope(info, infos)
            self._check_released(scope.expression, scope)

    def _check_row_scope(self, info: ScopeInfo, infos) -> None:
        select = info.scope.expression
        for key, what in (
            ("distinct", "DISTINCT"),
            ("order", "ORDER BY"),
            ("limit", "LIMIT"),
            ("offset", "OFFSET"),
            ("qualify", "QUALIFY"),
        ):
            if select.args.get(key) is not None:
                raise self.refuse(
                    f"{what} on confidential rows is not allowed",
                    "aggregate the rows with GROUP BY and COUNT/SUM/AVG; order and limit the "
                    "aggregated result",
                )
        if any(isinstance(n, exp.Window) for p in select.expressions for n in own_nodes(p)):
            raise self.refuse(
                "window functions over confidential values are not allowed",
                "aggregate first; window functions may then run over the protected cells",
            )
        for projection in select.expressions:
            value = projection.unalias()
            lineage = self.lineage(value, info.scope, infos)
            if ColumnRole.IDENTIFIER in lineage.roles and not isinstance(value, exp.Column):
                raise self.refuse(
                    f"identifier column(s) {_names(lineage)} can only be passed through unchanged",
                    "identifiers may only join declared keys or be counted with COUNT(DISTINCT)",
                )
            self._check_total(value, info.scope)
        self._check_filters(info, infos)

    def _check_filters(self, info: ScopeInfo, infos) -> None:
        select = info.scope.expression
        for clause, label in (
            (select.args.get("where"), "WHERE"),
            *((j.args.get("on"), "JOIN ON") for j in select.args.get("joins") or []),
        ):
            if clause is None:
                continue
            join_keys = self._join_key_columns(clause, info.scope, infos)
            for n in own_nodes(clause):
                if isinstance(n, exp.Column) and id(n) not in join_keys:
                    lineage = self.column_lineage(n, info.scope, infos)
                    bad = lineage.roles - ROW_ROLES
                    if bad:
                        raise self.refuse(
                            f"{_role_text(bad)} {n.sql(DIALECT)} cannot be used in {label}",
                            "filter on dimensions or measures; identifiers may only appear in "
                            "equality joins along declared keys (e.g. p.household_id = "
                            "h.household_id)",
                        )
            self._check_total(clause.this if isinstance(clause, exp.Where) else clause, info.scope)
        self._check_joins(info, infos)

    def _check_joins(self, info: ScopeInfo, infos) -> None:
        """Plain joins only; confidential relations join each other along declared keys.

        A join of two confidential relations without a key equality is a cartesian product:
        it multiplies rows (a denial of service on a shared engine) and matches people with
        people arbitrarily.
        """
        scope = info.scope
        select = scope.expression
        confidential = [
            alias
            for alias, (_node, source) in scope.selected_sources.items()
            if self._is_confidential_source(source, infos)
        ]
        for join in select.args.get("joins") or []:
            method, kind = join.args.get("method"), join.args.get("kind")
            if (
                join.args.get("using")
                or method
                or (kind and kind.upper() not in ("INNER", "CROSS", "OUTER"))
            ):
                what = "USING" if join.args.get("using") else (method or kind).upper()
                raise self.refuse(
                    f"{what} joins are not allowed",
                    "write [LEFT|RIGHT|FULL] JOIN ... ON with explicit conditions",
                )
            alias = join.this.alias_or_name
            if len(confidential) < 2 or alias not in confidential:
                continue
            on = join.args.get("on")
            if on is None or not self._join_key_columns(on, scope, infos):
                raise self.refuse(
                    f"the join of {alias} with other confidential data has no equality on "
                    "declared keys",
                    "join confidential tables on their privacy unit or declared references, e.g. "
                    "JOIN households h ON p.household_id = h.household_id",
                )

    def _is_confidential_source(self, source, infos) -> bool:
        if isinstance(source, exp.Table):
            return not self.policy.table(source.name).is_public
        return infos[id(source.expression)].kind is Kind.ROW

    def _join_key_columns(self, clause: exp.Expr, scope: Scope, infos) -> set[int]:
        """ids of identifier columns that appear in top-level equalities along declared keys."""
        allowed: set[int] = set()
        conjuncts = list(clause.flatten()) if isinstance(clause, exp.And) else [clause]
        for conjunct in conjuncts:
            conjunct = _unwrap(conjunct)
            if not isinstance(conjunct, exp.EQ):
                continue
            left, right = _unwrap(conjunct.left), _unwrap(conjunct.right)
            if not (isinstance(left, exp.Column) and isinstance(right, exp.Column)):
                continue
            a = self.column_lineage(left, scope, infos)
            b = self.column_lineage(right, scope, infos)
            if (
                a.roles == b.roles == {ColumnRole.IDENTIFIER}
                and len(a.sources) == len(b.sources) == 1
            ):
                if self._key_target(*next(iter(a.sources))) == self._key_target(
                    *next(iter(b.sources))
                ):
                    allowed |= {id(left), id(right)}
        return allowed

    def _key_target(self, table: str, column: str) -> tuple[str, str]:
        declared = self.policy.table(table).column(column)
        return declared.references or (table, column)

    def _check_plain_distinct(self, aggregate: exp.AggFunc, argument: exp.Expr, info) -> None:
        """COUNT(DISTINCT x) takes a stored column as it is. The distinct values of an
        expression are another statistic of the same column, whose noise would either repeat
        the column's (and their difference cancel it: ``COUNT(DISTINCT m) − COUNT(DISTINCT
        CASE WHEN m = 'a' THEN 'b' ELSE m END)`` tells whether 'a' holds anyone) or be drawn
        afresh for every spelling (and averaged away)."""
        if not isinstance(canonical_expression(info.scope, argument), exp.Column):
            raise self.refuse(
                f"{aggregate.sql(DIALECT)[:80]}: COUNT(DISTINCT ...) counts the values of one "
                "stored column, not of an expression",
                "count the distinct values of a dimension or unit as it is, e.g. "
                "COUNT(DISTINCT municipality), and filter rows with WHERE",
            )

    def _own_unit(self, lineage: Lineage) -> bool:
        """The identifier is the privacy unit of the table it is stored in (persons.person_id),
        so its distinct count is the count of the rows' own units."""
        table, column = next(iter(lineage.sources))
        return self.policy.table(table).privacy_unit == column

    def _is_unit(self, lineage: Lineage) -> bool:
        if lineage.roles != {ColumnRole.IDENTIFIER} or len(lineage.sources) != 1:
            return False
        table, column = self._key_target(*next(iter(lineage.sources)))
        target = self.policy.table(table)
        return target is not None and target.privacy_unit == column

    def _check_aggregate_scope(self, info: ScopeInfo, infos) -> None:
        select = info.scope.expression
        if select.args.get("qualify") is not None:
            raise self.refuse(
                "QUALIFY is not supported", "filter the aggregated result in an outer query"
            )
        group = select.args.get("group")
        for key in group.find_all(exp.Column) if group else []:
            if isinstance(key.parent, exp.Grouping):
                continue
            lineage = self.column_lineage(key, info.scope, infos)
            if lineage.roles & {ColumnRole.MEASURE, ColumnRole.WEIGHT}:
                role = _role_text(lineage.roles)
                raise self.refuse(
                    f"column {key.name!r} is a {role} and cannot be grouped by",
                    "aggregate it with SUM or AVG, or group by a dimension: "
                    + self._dimensions(lineage),
                )
            if lineage.roles - {ColumnRole.DIMENSION}:
                raise self.refuse(
                    f"{_role_text(lineage.roles)} {key.sql(DIALECT)} cannot be grouped by",
                    f"group by a dimension: {self._dimensions(lineage)}",
                )
        if group:
            self._check_total(group, info.scope)
        info.aggregates = [
            checked
            for aggregate in list(info.aggregates)
            for checked in self._check_aggregate(aggregate, info, infos)
        ]
        aggregate_ids = {id(n) for a in info.aggregates for n in a.walk()}
        for part in _clauses(select, "expressions", "having", "order"):
            for n in own_nodes(part):
                if isinstance(n, exp.Column) and id(n) not in aggregate_ids and n.table:
                    lineage = self.column_lineage(n, info.scope, infos)
                    if lineage.roles - {ColumnRole.DIMENSION}:
                        raise self.refuse(
                            f"{_role_text(lineage.roles)} {n.sql(DIALECT)} can only be used "
                            "inside COUNT, SUM or AVG",
                            "output dimensions you group by, and aggregates",
                        )
        self._check_filters(info, infos)

    def _check_aggregate(self, aggregate: exp.AggFunc, info: ScopeInfo, infos) -> list:
        """Check one aggregate; return the aggregates that replace it in the tree.

        SUM and AVG over confidential rows are normalised to their linear form first
        (:mod:`sqlsdc.planner.linear`): ``SUM(a·x + b)`` becomes ``a·SUM(x) + b·COUNT(x)``,
        ``AVG(a·x + b)`` becomes ``a·AVG(x) + b`` and an argument whose value does not depend on
        a measure (``1``, ``income * 0``, ``age - age``, ``CASE WHEN c THEN 1 END``) becomes the
        COUNT of the rows it is defined on, so that the mechanism only ever protects ``SUM(x)``
        and ``COUNT(x)`` of a column as it is stored, and the constants are applied to the
        protected values. Each protected aggregate gets its statistic's identity in
        ``meta[STATISTIC]`` (the base columns of its value), which the cell key method uses to
        give different statistics of the same rows independent noise.
        """
        name = aggregate.sql_name().upper()
        if isinstance(aggregate, DP_AGGREGATES) and self._dp_magnitudes(aggregate, info, infos):
            self._check_total(aggregate.this, info.scope)  # the aggregate itself is rewritten
            return [aggregate]
        if not isinstance(aggregate, PROTECTED_AGGREGATES):
            raise self.refuse(
                f"{name} over confidential values is not allowed (no protection mechanism "
                "covers it yet)",
                "use COUNT, SUM or AVG",
            )
        if isinstance(aggregate.parent, exp.Filter) or aggregate.find(exp.Filter):
            raise self.refuse(
                "FILTER (WHERE ...) on aggregates is not supported",
                "move the condition into a CASE WHEN inside the aggregate",
            )
        argument = aggregate.this
        distinct = isinstance(argument, exp.Distinct)
        if distinct:
            if len(argument.expressions) != 1:
                raise self.refuse(f"{name}(DISTINCT ...) takes exactly one column")
            argument = argument.expressions[0]
        if isinstance(argument, exp.Star):
            return [aggregate]
        lineage = self.lineage(argument, info.scope, infos)
        if isinstance(aggregate, exp.Count):
            if distinct:
                self._check_plain_distinct(aggregate, argument, info)
            if distinct and self._is_unit(lineage):
                own_unit = self._own_unit(lineage)
                if not own_unit:  # e.g. households counted through persons.household_id
                    aggregate.meta[STATISTIC] = "distinct:" + _names(lineage)
                return [aggregate]
            allowed = {ColumnRole.DIMENSION} if distinct else ROW_ROLES
            if lineage.roles - allowed:
                raise self.refuse(
                    f"{name}({'DISTINCT ' if distinct else ''}{argument.sql(DIALECT)}) uses "
                    f"{_role_text(lineage.roles - allowed)} {_names(lineage)}",
                    "count rows with COUNT(*), units with COUNT(DISTINCT <privacy unit>), or "
                    "distinct values of a dimension",
                )
            if distinct:
                aggregate.meta[STATISTIC] = "distinct:" + _names(lineage)
            self._check_total(argument, info.scope)
            return [aggregate]
        if distinct:
            raise self.refuse(f"{name}(DISTINCT ...) is not allowed", f"use {name}(...)")
        if lineage.roles - ROW_ROLES:
            raise self.refuse(
                f"{name} over {_role_text(lineage.roles - ROW_ROLES)} {_names(lineage)} "
                "is not allowed",
                "sum or average measures",
            )
        if not lineage.row and not is_constant(argument):
            raise self.refuse(
                f"{name}({argument.sql(DIALECT)[:80]}) does not depend on a confidential "
                "measure: it is a count of rows times a value",
                "count the rows with COUNT(*) and multiply the protected count",
            )
        self._check_total(argument, info.scope)  # fail closed even on what normalising drops
        problem = self._nonlinear(argument, info.scope, infos)
        if isinstance(problem, str):
            raise self.refuse(
                f"{name}({argument.sql(DIALECT)[:80]}) is not a linear sum of columns ({problem})",
                _LINEAR_HINT,
            )
        replacement, aggregates = normal_form(aggregate, problem)
        for new in aggregates:
            inner = new.this
            if isinstance(inner, exp.Star):
                continue
            new.meta[STATISTIC] = _names(self.lineage(inner, info.scope, infos))
            self._check_total(inner, info.scope)
        if replacement is not aggregate:
            aggregate.replace(replacement)
        return aggregates

    def _dp_magnitudes(self, aggregate: exp.AggFunc, info: ScopeInfo, infos) -> bool:
        """Whether ``aggregate`` reads only measures of tables whose magnitudes use DP (which
        releases variances and quantiles of bounded measures; sqlsdc.rewrite.dp checks the
        rest)."""
        lineage = self.lineage(aggregate.this, info.scope, infos)
        tables = {t for t, _c in lineage.sources}
        return bool(tables) and all(
            self.policy.table(t).rule(AggregateKind.MAGNITUDES).method is Method.DP for t in tables
        )

    def _nonlinear(self, node: exp.Expr, scope: Scope, infos) -> LinearForm | str:
        """The linear form ``a·x + b`` of a SUM/AVG argument, or why it has none.

        Sums of transformed values defeat the minimum frequency and the magnitude noise: a
        power mean ``SUM(POW(income, 50))`` reveals the largest income of any cell, zero padding
        (``CASE WHEN age > 90 THEN income ELSE 0 END``, ``COALESCE(income, 0)``) makes one
        person's value a cell of many contributors, and a scale (``income * 0.001``) moves
        every value under the flex function's threshold. So the argument must be built from one
        measure or numeric dimension column — stored as it is, not computed in a derived table
        — times constants, plus a constant, optionally times a weight, under single-branch
        ``CASE WHEN condition THEN ... END`` filters (other rows are NULL and do not count); see
        :func:`sqlsdc.planner.linear.linear_form`.
        """

        def kind(column: exp.Column) -> str:
            roles = self.column_lineage(column, scope, infos).roles
            if not self._stored(column, scope):
                raise NotLinear(
                    f"{column.sql(DIALECT)} is computed in a derived table; compute it inside "
                    "the aggregate instead"
                )
            if roles == {ColumnRole.WEIGHT}:
                return "weight"
            if roles and roles <= ROW_ROLES and family(column) in NUMERIC:
                return "value"
            raise NotLinear(f"{column.sql(DIALECT)} is not a numeric measure or dimension")

        try:
            return linear_form(node, kind)
        except NotLinear as problem:
            return str(problem)

    def _stored(self, column: exp.Column, scope: Scope) -> bool:
        """Whether ``column`` is a base table's column, passed unchanged through any derived
        tables and CTEs on the way (a value computed there would hide its scale)."""
        source = scope.sources.get(column.table)
        if isinstance(source, exp.Table):
            return True
        if not isinstance(source, Scope) or not isinstance(source.expression, exp.Select):
            return False
        for projection in source.expression.expressions:
            if projection.alias_or_name == column.name:
                inner = _unwrap(projection.unalias())
                return isinstance(inner, exp.Column) and self._stored(inner, source)
        return False

    def _dimensions(self, lineage: Lineage) -> str:
        tables = {t for t, _ in lineage.sources}
        dims = sorted(
            {
                c.name
                for t in tables
                for c in self.policy.table(t).columns.values()
                if c.role is ColumnRole.DIMENSION
            }
        )
        return ", ".join(dims) or "none declared"

    # ---------------------------------------------------------------- totality
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


_LINEAR_HINT = (
    "sum measures as they are, weighted (income * weight), scaled by constants, or filtered with "
    "WHERE or CASE WHEN condition THEN measure END; other transformations need a mechanism "
    "such as CKM or DP"
)


def _names(lineage: Lineage) -> str:
    return ", ".join(f"{t}.{c}" for t, c in sorted(lineage.sources)) or "(none)"


def _role_text(roles) -> str:
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
