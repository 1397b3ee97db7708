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

from sqlglot import exp
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.scope import Scope, traverse_scope

from sqlsdc.engines.trees import nodes, of_kind
from sqlsdc.errors import InternalError, PolicyViolation
from sqlsdc.planner.aggregates import AggregateChecks
from sqlsdc.planner.allowlist import (
    ALLOWED,
    describe,
)
from sqlsdc.planner.breaks import check_classed_comparisons, check_classed_positions
from sqlsdc.planner.distinct_rows import distinct_as_groups
from sqlsdc.planner.identity import canonical_expression
from sqlsdc.planner.inlining import Inlining
from sqlsdc.planner.repeated_columns import RepeatedColumns
from sqlsdc.planner.repeated_keys import RepeatedKeys
from sqlsdc.planner.scopes import (
    DIALECT,
    NESTED,
    ROW_ROLES,
    SET_OPERATIONS,
    Analysis,
    ConstantCheck,
    Kind,
    Lineage,
    ScopeInfo,
    contains_aggregate,
    names,
    own_nodes,
    role_text,
    scope_aggregates,
    unwrap,
)
from sqlsdc.planner.total_checks import TotalityChecks
from sqlsdc.policy import AggregateKind, ColumnRole, GroupKeys, Method, Policy
from sqlsdc.written import spelled_sql


def _name(name: str) -> str:
    """``name`` as SQL text, quoted where DuckDB needs it."""
    return exp.to_identifier(name).sql(DIALECT)


def aggregate_example(table) -> str:
    """A query of ``table`` by one dimension, with a count and a measure's mean (its sum where
    the table's magnitudes are rounded or suppressed: a rounded AVG is refused, a suppressed
    one is published only when every unit has a value), that the table's rules answer: under
    suppression the dimension is the universe's first, under DP with public groups the first
    with a declared ``domain`` (none: no GROUP BY); else the top of the first hierarchy, or
    the first dimension by name. Hints gave ``GROUP BY founded`` for a table suppressed over
    (nace, region), which the guard then refused (new user s38)."""
    columns = table.columns.values()
    candidates = [c for c in columns if c.role is ColumnRole.DIMENSION]
    tops = [levels[0] for levels in table.hierarchies.values() if levels]
    if table.suppression is not None:
        named = (table.hierarchies.get(d, (d,))[0] for d in table.suppression.dimensions)
        candidates = list(filter(None, map(table.column, named)))
    elif table.rule(AggregateKind.COUNTS).method is Method.DP:
        public_groups = table.dp is None or table.dp.groups is GroupKeys.PUBLIC
        candidates = [c for c in candidates if c.domain or not public_groups]
    else:
        candidates = [*filter(None, map(table.column, tops)), *candidates]
    dimension = candidates[0].name if candidates else None
    measure = next((c.name for c in columns if c.role is ColumnRole.MEASURE), None)
    summed = table.rule(AggregateKind.MAGNITUDES).method in (Method.ROUND, Method.SUPPRESS)
    keys = f"{_name(dimension)}, " if dimension else ""
    value = f", {'SUM' if summed else 'AVG'}({_name(measure)})" if measure else ""
    grouping = f" GROUP BY {_name(dimension)}" if dimension else ""
    return f"SELECT {keys}COUNT(*){value} FROM {_name(table.name)}{grouping}"


def analyze(
    tree: exp.Expr,
    policy: Policy,
    schema: dict,
    sql: str,
    constant_type: ConstantCheck,
    repeated: RepeatedColumns | None = None,
    walked: list[exp.Expr] | None = None,
    keys: RepeatedKeys | None = None,
) -> Analysis:
    """Classify every scope of a qualified tree and refuse whatever the policy does not allow.

    ``repeated``: the columns of long chains that sqlglot resolves and types once per group,
    still set aside by :func:`sqlsdc.guard.resolve.qualify_tree` (the others get copies of the
    result after type inference, before any check of the analysis reads them). ``walked``:
    ``nodes(tree)``, when the caller has it (:func:`sqlsdc.guard.resolve.qualify_tree` gives
    it). ``keys``: the group keys that name an output, typed as their outputs' expressions
    (:mod:`sqlsdc.planner.repeated_keys`)."""
    if _allowed_nodes(tree, sql, walked, repeated):
        _expand_by_all(tree)
    distinct_as_groups(tree, policy)  # BI tools' filter lists: SELECT DISTINCT region ...
    if keys is not None:
        keys.detach()
    annotate_types(tree, schema=schema, dialect=DIALECT)
    if keys is not None:
        keys.attach()
    if repeated is not None:
        repeated.attach()
    checker = _Checker(policy, sql, constant_type)
    infos: dict[int, ScopeInfo] = {}
    order = []
    inlining = Inlining(sql, checker.own)
    for scope in traverse_scope(tree):
        inlining.add(scope)  # refuses a query whose inlined size would swamp the next passes
        info = checker.classify(scope, infos)
        infos[id(scope.expression)] = info
        order.append(info)
    checker.reads_confidential = any(info.kind is not Kind.SAFE for info in order)
    if checker.reads_confidential:  # clauses outside every SELECT's scope too
        every = walked if walked is not None else nodes(tree)
        checker.check_limit_values(every)
        checker.check_outer_order(every)
        checker.check_set_operations(every)
    for info in order:
        checker.check(info, infos)
    return Analysis(tree, infos, order)


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


_INSTEAD = {  # what to write for a construct BI tools and notebooks send that is not allowed
    exp.Filter: "write the condition inside the aggregate: COUNT(CASE WHEN condition THEN 1 "
    "END), SUM(CASE WHEN condition THEN measure END), AVG(CASE WHEN condition THEN measure END)",
    exp.Any: "write column IN (value, ...), column = ANY(ARRAY[value, ...]) of constants, or "
    "column = ANY(?) with a list parameter (as psycopg writes a Python list: = ANY(%s)); each "
    "is read as that IN list",
}
_CLAUSE_CHECKED = (exp.Select, *SET_OPERATIONS, exp.With, exp.Distinct, exp.Group, exp.Ordered)


def _allowed_nodes(
    tree: exp.Expr, sql: str, walked: list[exp.Expr] | None, repeated: RepeatedColumns | None
) -> bool:
    """:func:`_check_nodes`, whose refusal quotes the statement with every column and value
    that ``repeated`` set aside put back (red team s34d: ``QUALIFY persons.age BETWEEN 0 AND 1
    OR  BETWEEN  AND ...`` and ``MD5(CAST(persons.age IN (0) AS TEXT))`` were quoted)."""
    try:
        return _check_nodes(tree, sql, walked)
    except PolicyViolation:
        if repeated is None or not (repeated.pairs or repeated.lists):
            raise
        repeated.attach()  # nothing else runs on the refused tree: its whole text, quoted
        _check_nodes(tree, sql)
        raise


def _check_nodes(tree: exp.Expr, sql: str, walked: list[exp.Expr] | None = None) -> bool:
    """Refuse any node outside the allowlist; True when some SELECT groups or orders BY ALL.
    ``walked``: ``nodes(tree)``, when the caller has it."""
    group_all = False
    plain: dict[type, bool] = {}  # allowed and none of the classes below, decided once per class
    for node in nodes(tree) if walked is None else walked:
        known = plain.get(node.__class__)
        if known is None:
            known = plain[node.__class__] = isinstance(node, ALLOWED) and not isinstance(
                node, _CLAUSE_CHECKED
            )
        if known:
            continue
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
                f"{describe(node)} is not allowed ({spelled_sql(node)})",
                _INSTEAD.get(
                    node.__class__,
                    "use plain SELECT queries with COUNT, SUM, AVG over the declared tables; "
                    "functions on files, settings, metadata or raw rows are never allowed",
                ),
                sql,
            )
        if isinstance(node, exp.With) and node.args.get("recursive"):
            raise PolicyViolation("WITH RECURSIVE is not allowed", "use non-recursive CTEs", sql)
        if isinstance(node, exp.Distinct) and node.args.get("on"):
            raise PolicyViolation("DISTINCT ON is not allowed", "use GROUP BY", sql)
        if isinstance(node, exp.Group) and node.args.get("all"):
            group_all = True
        if isinstance(node, exp.Ordered) and _is_all(node.this):
            group_all = True
    return group_all


def _is_all(node: exp.Expr) -> bool:
    """DuckDB's ``ALL`` of ``ORDER BY ALL`` (sqlglot reads it as a variable)."""
    return isinstance(node, exp.Var) and node.name.upper() == "ALL"


def _drop_empty_grouping(select: exp.Select, group: exp.Group) -> None:
    """Drop the empty grouping sets ``()`` listed as plain keys of ``group`` (changes the
    tree): ``GROUP BY ()`` is the grand total, what DuckDB answers with no GROUP BY (one row,
    also over no rows), and ``GROUP BY (), region`` is ``GROUP BY region``. It was refused as
    "the expression GROUP BY () raises an error" (the clause was evaluated as a value; s44a).
    An empty set inside ROLLUP, CUBE or GROUPING SETS is theirs, left as written."""
    keys = group.expressions
    kept = [k for k in keys if not (type(k) is exp.Tuple and not k.expressions)]
    if len(kept) == len(keys):
        return
    group.set("expressions", kept)
    if not kept and not any(group.args.get(k) for k in ("grouping_sets", "cube", "rollup")):
        select.set("group", None)


def _expand_by_all(tree: exp.Expr) -> None:
    """Replace DuckDB's GROUP BY ALL by its non-aggregate projections, and ORDER BY ALL by
    the positions of every output column, left to right, each with the clause's direction
    and NULLS order (changes the tree). Both are what DuckDB means by them; the checks and
    rewrites then see the keys and positions they already know (``ORDER BY ALL`` was refused
    as a constant that "raises an error", as BI tools and notebooks write it). Empty grouping
    sets among the plain keys are dropped (:func:`_drop_empty_grouping`).

    Breadth first like ``tree.find_all``, each SELECT expanded before its children are
    visited (the copies of its projections too), without ``walk``'s generators."""
    queue, i = [tree], 0
    while i < len(queue):
        select = queue[i]
        i += 1
        group = select.args.get("group") if isinstance(select, exp.Select) else None
        if group is not None and group.args.get("all"):
            keys = [p.unalias().copy() for p in select.expressions if not contains_aggregate(p)]
            select.set("group", exp.Group(expressions=keys) if keys else None)
        elif group is not None:
            _drop_empty_grouping(select, group)
        if isinstance(select, (exp.Select, *SET_OPERATIONS)):
            _expand_order_by_all(select)
        for value in select.args.values():
            if isinstance(value, list):
                queue.extend(v for v in value if isinstance(v, exp.Expr))
            elif isinstance(value, exp.Expr):
                queue.append(value)


def _expand_order_by_all(query: exp.Query) -> None:
    """``ORDER BY ALL [DESC] [NULLS FIRST|LAST]`` as every output, left to right, with that
    direction, each named by its alias as sqlglot's qualification names an ordinal
    (``ORDER BY 1``). Left as it is (and refused later) beside other terms or over an
    unexpanded ``*``, whose width is not known here."""
    order = query.args.get("order")
    terms = order.expressions if order is not None else []
    if len(terms) != 1 or not isinstance(terms[0], exp.Ordered) or not _is_all(terms[0].this):
        return
    outputs = query.selects
    if not outputs or any(o.is_star for o in outputs):
        return
    ordered = terms[0]
    keys = [
        exp.column(o.args["alias"].copy()) if isinstance(o, exp.Alias) else o.copy()
        for o in outputs
    ]
    order.set(
        "expressions",
        [
            exp.Ordered(
                this=key, desc=ordered.args.get("desc"), nulls_first=ordered.args.get("nulls_first")
            )
            for key in keys
        ],
    )


def _clauses(select: exp.Select, *keys: str) -> list[exp.Expr]:
    nodes = []
    for key in keys:
        value = select.args.get(key)
        if isinstance(value, list):
            nodes.extend(value)
        elif value is not None:
            nodes.append(value)
    return nodes


class _Checker(AggregateChecks, TotalityChecks):
    def __init__(self, policy: Policy, sql: str, constant_type: ConstantCheck):
        self.policy = policy
        self.sql = sql
        self.constant_type = constant_type
        self._lineages: dict[tuple[int, str, str], tuple[Scope, Lineage]] = {}
        self._own: dict[int, tuple[exp.Expr, list[exp.Expr]]] = {}
        self.reads_confidential = False  # whether any scope of the statement does

    def own(self, node: exp.Expr) -> list[exp.Expr]:
        """``own_nodes(node)``, walked once while the tree does not change: the classification,
        the size check and the checks of a scope read the same clauses (a long WHERE is
        20,000 nodes). The walks are forgotten whenever the checker changes the tree
        (:meth:`forget_walks`). Callers must not change the list. The walk of a query is
        put together from its clauses' walks (the size check has walked most of them)."""
        known = self._own.get(id(node))
        if known is None or known[0] is not node:
            walked = self._own_of_query(node) if isinstance(node, NESTED) else own_nodes(node)
            known = self._own[id(node)] = (node, walked)
        return known[1]

    def _own_of_query(self, node: exp.Expr) -> list[exp.Expr]:
        """``own_nodes(node)`` as ``node`` and the walks of its children in argument order
        (own_nodes walks depth first, children in argument order, nested queries left out)."""
        found = [node]
        for value in node.args.values():
            if isinstance(value, exp.Expr):
                if not isinstance(value, NESTED):
                    found += self.own(value)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, exp.Expr) and not isinstance(item, NESTED):
                        found += self.own(item)
        return found

    def forget_walks(self) -> None:
        """The tree changed: walk again."""
        self._own.clear()

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
        self._check_distinct_outputs(scope)
        reads_rows = False
        for source in scope.sources.values():
            if isinstance(source, exp.Table):
                table = self.policy.table(source.name)
                if table is None:
                    raise InternalError(f"undeclared table {source.name} reached analysis")
                reads_rows |= not table.is_public
            elif isinstance(source, Scope):
                reads_rows |= infos[id(source.expression)].kind is Kind.ROW
        aggregates = scope_aggregates(node, self.own(node))
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
                lineage = Lineage(sources=lineage.sources, protected=contains_aggregate(projection))
            info.outputs[projection.alias_or_name] = lineage
            info.columns.append(lineage)
        return info

    def _check_distinct_outputs(self, scope: Scope) -> None:
        """Refuse a SELECT read by name (a derived table, CTE or subquery, or a part of a set
        operation that is one) with two outputs of one name. DuckDB renames the second ``x``
        to ``x_1`` (then ``x_1_1``...) while the lineage, the identity and sqlglot take ``q.x``
        and ``q.x_1`` as written: ``(SELECT income AS x, sex AS x, sex AS x_1 ...) q GROUP BY
        q.x_1`` was checked as a grouping by sex and ran as one by income."""
        outer = scope
        while outer.is_set_operation and outer.parent is not None:
            if unwrap(outer.parent.expression.this) is not outer.expression:
                return  # not the first part: its names name nothing
            outer = outer.parent
        if outer.is_root:
            return  # the result's own names: DuckDB's renaming only changes the headings
        seen = set()
        for projection in scope.expression.expressions:
            name = projection.alias_or_name.lower()
            if name in seen:
                raise self.refuse(
                    f"two outputs of a derived table, CTE or subquery are named {name!r}",
                    "give every output of a derived table or CTE its own name (DuckDB renames "
                    "a repeated name, so a reference to it would read another column)",
                )
            seen.add(name)

    def _classify_set_operation(self, node: exp.Expr, infos: dict[int, ScopeInfo]) -> ScopeInfo:
        left, right = infos[id(unwrap(node.left))], infos[id(unwrap(node.right))]
        if Kind.ROW in (left.kind, right.kind):
            raise self.refuse(
                f"{node.key.upper()} of confidential rows is not allowed",
                "aggregate each part (GROUP BY ... with COUNT/SUM/AVG) before combining them",
            )
        # by position: a part may repeat a name (only the first part's names name anything)
        columns = [a | b for a, b in zip(left.columns, right.columns, strict=False)]
        names = [p.alias_or_name for p in left.scope.expression.expressions]
        outputs = dict(zip(names, columns, strict=False))
        return ScopeInfo(left.scope, Kind.SAFE, outputs, columns=columns)

    def lineage(self, node: exp.Expr, scope: Scope, infos: dict[int, ScopeInfo]) -> Lineage:
        result = Lineage()
        for n in self.own(node):
            if isinstance(n, exp.Column):
                result = result | self.column_lineage(n, scope, infos)
        for subquery in of_kind(nodes(node), exp.Subquery):  # find_all's order
            inner = infos.get(id(unwrap(subquery)))
            if inner is not None:
                for lineage in inner.outputs.values():
                    result = result | lineage
        return result

    def column_lineage(self, column: exp.Column, scope: Scope, infos) -> Lineage:
        """The lineage of ``column`` of ``scope``: a function of the scope's sources and the
        column's qualifier and name, computed once per scope for each (a long condition
        names one column thousands of times; every check asks for each)."""
        key = (id(scope), column.table, column.name)
        known = self._lineages.get(key)
        if known is None or known[0] is not scope:
            known = self._lineages[key] = (scope, self._column_lineage(column, scope, infos))
        return known[1]

    def _column_lineage(self, column: exp.Column, scope: Scope, infos) -> Lineage:
        source = scope.sources.get(column.table)
        if isinstance(source, exp.Table):
            table = self.policy.table(source.name)
            if table.is_public:
                return Lineage()
            if isinstance(column.this, exp.Star):
                # ``p.*`` inside an expression (COUNT(p.*), p.* IS NULL, GROUP BY p.*) names no
                # one column: refused as a query shape, not raised as an internal error
                raise self.refuse(
                    f"{column.sql(DIALECT)} (every column of {column.table}) cannot be used "
                    "inside an expression",
                    "count rows with COUNT(*), or name the columns",
                )
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
                    f"aggregate it: e.g. {self._aggregate_example(scope)}",
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
        if info.kind is not Kind.SAFE:
            self._check_classes(info, infos)
        elif self.reads_confidential:
            self._check_public(info, infos)

    def _aggregate_example(self, scope: Scope) -> str:
        """An aggregate query of the first confidential table ``scope`` reads that the guard
        answers under the table's own rules: a hint in the analyst's own tables, not the
        demo's (:func:`aggregate_example`)."""
        for source in scope.expression.find_all(exp.Table):
            table = self.policy.table(source.name)
            if table is not None and not table.is_public:
                return aggregate_example(table)
        return "SELECT COUNT(*) FROM ... GROUP BY a dimension"

    def _check_classes(self, info: ScopeInfo, infos) -> None:
        """Row conditions compare measures and weights only with their class breaks."""
        scope = info.scope
        resolved: dict[tuple[str, str], object] = {}  # by qualifier and name, as the lineage

        def resolve(column: exp.Column):
            key = (column.table, column.name)
            if key not in resolved:
                resolved[key] = declared_column(column)
            return resolved[key]

        def declared_column(column: exp.Column):
            if not column.table or column.table not in scope.sources:
                return None  # an output alias (ORDER BY n) or a column of another scope
            lineage = self.column_lineage(column, scope, infos)
            if not lineage.row or len(lineage.sources) != 1:
                return None
            table, name = next(iter(lineage.sources))
            declared = self.policy.table(table)
            if all(declared.rule(kind).method is Method.DP for kind in AggregateKind):
                # fresh noise per population and a charge per question; not when counts use
                # another method: an exact or keyed COUNT(*) WHERE income > 49455 of a table
                # whose magnitudes use DP bisected one person's income (red team s36b)
                return None
            return declared.column(name)

        def plain(operand: exp.Expr) -> bool:
            return isinstance(canonical_expression(scope, operand), exp.Column)

        nodes = list(self.own(scope.expression))
        check_classed_positions(nodes, resolve, self.sql)
        check_classed_comparisons(nodes, resolve, plain, self.sql)

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
                    f"identifier column(s) {names(lineage)} can only be passed through unchanged",
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
            for n in of_kind(self.own(clause), exp.Column):
                if id(n) not in join_keys:
                    lineage = self.column_lineage(n, info.scope, infos)
                    bad = lineage.roles - ROW_ROLES
                    if bad:
                        raise self.refuse(
                            f"{role_text(bad)} {n.sql(DIALECT)} cannot be used in {label}",
                            "filter on dimensions or measures; identifiers may only appear in "
                            "equality joins along declared keys (e.g. p.household_id = "
                            "h.household_id)",
                        )
            condition = clause.this if isinstance(clause, exp.Where) else clause
            self._check_condition(condition, label)
            if isinstance(clause, exp.Where):  # its condition's walk is the WHERE's but one
                walked = self.own(clause)
                within = walked[1:] if len(walked) > 1 and walked[1] is condition else None
                self._check_total(condition, info.scope, walked=within)
            else:
                self._check_total(clause, info.scope, walked=self.own(clause))
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
            conjunct = unwrap(conjunct)
            if not isinstance(conjunct, exp.EQ):
                continue
            left, right = unwrap(conjunct.left), unwrap(conjunct.right)
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

    def _check_aggregate_scope(self, info: ScopeInfo, infos) -> None:
        select = info.scope.expression
        if select.args.get("qualify") is not None:
            raise self.refuse(
                "QUALIFY is not supported", "filter the aggregated result in an outer query"
            )
        group = select.args.get("group")
        for key in self.own(group) if group else []:  # a subquery's names are its own
            if not isinstance(key, exp.Column) or isinstance(key.parent, exp.Grouping):
                continue
            lineage = self.column_lineage(key, info.scope, infos)
            if lineage.roles & {ColumnRole.MEASURE, ColumnRole.WEIGHT}:
                role = role_text(lineage.roles)
                raise self.refuse(
                    f"column {key.name!r} is a {role} and cannot be grouped by",
                    "aggregate it with SUM or AVG, or group by a dimension: "
                    + self._dimensions(lineage),
                )
            if lineage.roles - {ColumnRole.DIMENSION}:
                raise self.refuse(
                    f"{role_text(lineage.roles)} {key.sql(DIALECT)} cannot be grouped by",
                    f"group by a dimension: {self._dimensions(lineage)}",
                )
        grouping_sets = (exp.Rollup, exp.Cube, exp.GroupingSets)
        for node in of_kind(nodes(group), grouping_sets) if group else []:  # find_all's order
            if any(isinstance(n, exp.Literal) for n in _grouping_elements(node)):
                raise self.refuse(
                    f"{node.sql(DIALECT)[:80]}: ROLLUP, CUBE and GROUPING SETS take columns, "
                    "not positions or constants",
                    "name the columns, e.g. GROUP BY ROLLUP (region, sex)",
                )
            if node.find(exp.Column) is None:  # was "... raises an error" (s44q)
                raise self.refuse(
                    f"{node.sql(DIALECT)[:80]} names no column: ROLLUP, CUBE and GROUPING SETS "
                    "take columns",
                    "for the grand total write no GROUP BY (or GROUP BY ()); else name the "
                    "columns, e.g. GROUP BY ROLLUP (region, sex)",
                )
        for aggregate in info.aggregates:
            if not isinstance(aggregate, exp.Grouping) and aggregate.find(exp.Grouping):
                raise self.refuse(
                    f"{aggregate.sql(DIALECT)[:80]}: GROUPING() cannot be used inside an aggregate",
                    "use it outside, e.g. CASE WHEN GROUPING(region) = 1 THEN 'Total' ELSE "
                    "region END",
                )
        if group:
            self._check_total(group, info.scope, walked=self.own(group))
        info.aggregates = [
            checked
            for aggregate in list(info.aggregates)
            for checked in self._check_aggregate(aggregate, info, infos)
        ]
        aggregate_ids = {id(n) for a in info.aggregates for n in nodes(a)}
        for part in _clauses(select, "expressions", "having", "order"):
            for n in self.own(part):
                if isinstance(n, exp.Column) and id(n) not in aggregate_ids and n.table:
                    lineage = self.column_lineage(n, info.scope, infos)
                    if lineage.roles - {ColumnRole.DIMENSION}:
                        raise self.refuse(
                            f"{role_text(lineage.roles)} {n.sql(DIALECT)} can only be used "
                            "inside COUNT, SUM or AVG",
                            "output dimensions you group by, and aggregates",
                        )
        self._check_filters(info, infos)

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


def _grouping_elements(node: exp.Expr):
    """The key expressions a ROLLUP, CUBE or GROUPING SETS lists (inside its tuples)."""
    for child in node.expressions:
        if isinstance(child, (exp.Tuple, exp.Paren)):
            yield from child.expressions if isinstance(child, exp.Tuple) else [child.this]
        else:
            yield child
