"""Plan step: for every aggregation over confidential rows, decide how its cells are protected.

A :class:`CellPlan` names the group keys, each protected aggregate with its aggregate kind and
minimum frequency, and how the units behind a cell are counted: with ``COUNT(*)`` when every
row is its own unit (one confidential table, no join, unit enforced unique at init), otherwise
with ``COUNT(DISTINCT unit)`` per confidential table, the unit columns being passed up through
row-level CTEs and derived tables. Planning does not change the tree; the rewrite does.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sqlglot import exp
from sqlglot.optimizer.scope import Scope

from sqlsdc.catalog.keys import RKEY
from sqlsdc.errors import PolicyViolation
from sqlsdc.planner.coarser_units import refuse_counts_in_coarser_cells
from sqlsdc.planner.multiplicity import Multiplicity
from sqlsdc.planner.scopes import Analysis, Kind, ScopeInfo, own_nodes
from sqlsdc.policy import AggregateKind, Method, Policy, ProtectionRule

COUNTED_UNITS = "sqlsdc_counted_units"  # meta key of a COUNT(DISTINCT unit): its CountedUnits


@dataclass(frozen=True)
class CountedUnits:
    """The units a ``COUNT(DISTINCT identifier)`` counts: those of ``table``, whose privacy unit
    is ``column``, read from that column itself (``referenced`` False) or from a column that
    declares a reference to it (``persons.household_id`` counts households). The cell key
    method keys the count by these units' own record keys, however the query reaches them;
    ``unique``: the table has one row per unit (the planner's knowledge of the catalog)."""

    table: str
    column: str
    referenced: bool
    unique: bool = False


@dataclass(frozen=True)
class ProtectedAggregate:
    node: exp.AggFunc
    kind: AggregateKind
    min_frequency: int
    argument: exp.Expr | None  # rows contribute where this is not NULL; None: every row
    rule: ProtectionRule
    counted: CountedUnits | None = None  # COUNT(DISTINCT unit): whose units it counts


@dataclass(frozen=True)
class UnitExposure:
    """Add ``expression AS alias`` to a row-level child so the aggregation can count units."""

    select: exp.Select
    expression: exp.Expr
    alias: str


@dataclass
class CellPlan:
    select: exp.Select
    keys: list[exp.Expr]
    groupings: list[exp.Grouping]
    aggregates: list[ProtectedAggregate]
    units: list[exp.Expr] | None  # None: one row per unit, count rows
    tables: list[str]
    rkeys: list[exp.Expr]  # the record key of every confidential row source, as units
    with_status: bool
    group_min_frequency: int | None = None  # groups with fewer units are dropped
    row_source: int | None = None  # position in units of the table whose rows the join's are
    one_row_per_unit: bool = False  # one confidential table, no join, unit unique (enforced)
    mechanism: Method = Method.THRESHOLD  # the one method that builds these cells
    rows_are_units: bool = False  # the rows are the driver's, each its own unit (COUNT(*))
    scope: Scope | None = None  # the aggregation's scope (canonical identity: guard.identity)
    # aggregate -> position in units of the coarser table whose units contribute each their
    # rows of the cell: a count protected as a magnitude sum over those units (coarser_units)
    per_unit_counts: dict[int, int] = field(default_factory=dict)
    presence: int | None = None  # CKM: the count of units deciding a group appears (coarser_units)


@dataclass
class QueryPlan:
    cells: list[CellPlan]
    exposures: list[UnitExposure] = field(default_factory=list)


def plan_query(
    analysis: Analysis,
    policy: Policy,
    unit_per_row: dict[str, bool],
    multiplicity: Multiplicity,
) -> QueryPlan:
    """The cell model of an analysed query whose joins ``multiplicity`` has proven."""
    planner = _Planner(analysis, policy, unit_per_row, multiplicity)
    cells = [planner.plan_cells(info) for info in analysis.order if info.kind is Kind.AGGREGATE]
    return QueryPlan(cells, planner.exposures)


PRECEDENCE = (Method.DP, Method.SUPPRESS, Method.ROUND, Method.CKM)
# groups without aggregates: perturbed counts (CKM) hide more than rounding's frequency rule
GROUP_PRECEDENCE = (Method.DP, Method.SUPPRESS, Method.CKM, Method.ROUND)


def choose_mechanism(aggregates: list[ProtectedAggregate], count_methods: set[Method]) -> Method:
    """The single place where an aggregation's protection method is decided.

    The aggregates carry their table's rule for their kind (counts or magnitudes). The first
    method of ``PRECEDENCE`` any of them uses builds all the cells: DP, suppression and
    rounding refuse aggregates of another method (rounding takes threshold ones), CKM protects
    threshold ones with its own frame. An aggregation without aggregates releases its groups
    with its tables' count method: by DP's group release, or by CKM's perturbed counts (a count
    whose value is hidden), by the suppression pattern's cells (whose shape then applies: a
    group-only query must not test filters a count could not), by rounding's frequency rule (the
    groups whose counts it publishes: the threshold rule's noisy guard told more, red team
    s39a); otherwise by the threshold rule.
    """
    if aggregates:
        methods = {a.rule.method for a in aggregates}
        return next((m for m in PRECEDENCE if m in methods), Method.THRESHOLD)
    return next((m for m in GROUP_PRECEDENCE if m in count_methods), Method.THRESHOLD)


# A magnitude's method that would reveal the counts of a table whose counts use another one:
# the count method, the magnitude methods it refuses, what the counts are and why, the remedy
_COUNTS_REVEALED_BY = (
    # red team s36b: beside DP counts the threshold rule's SUM and AVG are exact, so COUNT =
    # SUM / AVG and two overlapping populations give one person's value for no budget; the
    # cell key method's are keyed, not charged, so their differences average
    (Method.DP, frozenset(Method) - {Method.DP}, "use differential privacy",
     "an exact or merely perturbed SUM or AVG reveals those counts (COUNT = SUM / AVG) and "
     "single persons' values without charging the privacy budget",
     "protects", "with method dp too (protection.magnitudes: {method: dp, spend: ...})"),
    # red team s37d: beside rounded counts the threshold rule's SUM/AVG, and the cell key
    # method's sum (its published mean times the count), give the exact count: `SUM(income) /
    # AVG(income) ... AND NOT age = 43` gave 112 where COUNT(*) showed 115
    (Method.ROUND, frozenset({Method.THRESHOLD, Method.CKM}), "are rounded",
     "its SUM over its AVG is the exact count of contributors",
     "rounds", "too (protection.magnitudes: {method: round, base: ...})"),
    # red teams s37d and s38a: beside CKM counts a sum of values a query pins is v·n, exact
    # (threshold) or rounded to a base below v, so `SUM(age) ... WHERE age = 94` told the count
    # the noise hides (and the threshold rule's SUM / AVG is that count); a rounded sum is
    # published over a rounded count (sqlsdc.rewrite.round), and there is none beside CKM
    (Method.CKM, frozenset({Method.THRESHOLD, Method.ROUND}), "are protected by the cell key "
     "method", "a SUM of values the query pins (SUM(age) ... WHERE age = 94) is v·n, exact or "
     "rounded, which tells the count n the noise hides", "protects",
     "with method ckm too (protection.magnitudes: {method: ckm, ...})"),
)  # fmt: skip


def _refuse_counts_revealed(node, kind, tables, rule, policy: Policy, select) -> None:
    """Refuse a magnitude (SUM, AVG) whose method would publish the exact or merely perturbed
    count of contributors of a table whose counts another method protects
    (:data:`_COUNTS_REVEALED_BY`): a policy that declares the counts' method alone leaves
    magnitudes to the default, the threshold rule."""
    if kind is not AggregateKind.MAGNITUDES:
        return
    for counts, refused, said, why, verb, remedy in _COUNTS_REVEALED_BY:
        if rule.method not in refused:
            continue
        by_counts = {
            t for t in tables if policy.table(t).rule(AggregateKind.COUNTS).method is counts
        }
        if named := sorted(by_counts):
            raise PolicyViolation(
                f"{node.sql('duckdb')[:80]} would be released with method {rule.method.value}, "
                f"but the counts of {', '.join(named)} {said}: {why}",
                f"ask counts only, or an admin {verb} the magnitudes of {', '.join(named)} "
                f"{remedy}",
                select.sql("duckdb"),
            )


def status_scopes(analysis: Analysis) -> set[int]:
    """ids of the aggregation selects whose rows are the query's result rows."""
    root = analysis.root
    node = root.scope.expression
    if root.kind is Kind.AGGREGATE:
        return {id(node)}
    branches: list[exp.Expr] = []
    stack = [node]
    while stack:
        current = stack.pop()
        while isinstance(current, (exp.Subquery, exp.Paren)):
            current = current.this
        if isinstance(current, (exp.Union, exp.Intersect, exp.Except)):
            stack += [current.left, current.right]
        else:
            branches.append(current)
    infos = [analysis.infos.get(id(b)) for b in branches]
    if all(i is not None and i.kind is Kind.AGGREGATE for i in infos) and len(infos) > 1:
        return {id(b) for b in branches}
    return set()


def group_keys(select: exp.Select) -> list[exp.Expr]:
    """Distinct key expressions of GROUP BY, ROLLUP, CUBE and GROUPING SETS."""
    group = select.args.get("group")
    keys: list[exp.Expr] = []
    pending = [*group.expressions] if group else []
    for key in ("rollup", "cube", "grouping_sets"):
        pending += group.args.get(key) or [] if group else []
    stack = pending[::-1]  # depth first, in order (a loop: a recursive closure is a cycle)
    while stack:
        node = stack.pop()
        if isinstance(node, (exp.Rollup, exp.Cube, exp.GroupingSets, exp.Tuple)):
            stack.extend(reversed(node.expressions))
        elif isinstance(node, exp.Paren):
            stack.append(node.this)
        elif node not in keys:
            keys.append(node)
    return keys


class _Planner:
    def __init__(self, analysis, policy, unit_per_row, multiplicity: Multiplicity):
        self.analysis = analysis
        self.multiplicity = multiplicity
        self.policy = policy
        self.unit_per_row = unit_per_row
        self.exposures: list[UnitExposure] = []
        self._exposed: dict[tuple[int, str], str] = {}
        self._status = status_scopes(analysis)

    def plan_cells(self, info: ScopeInfo) -> CellPlan:
        select = info.scope.expression
        units, rkeys, tables, instances = self._units(info.scope, with_rkeys=False)
        keyed = self._keyed_methods(info, tables)
        groups_released = not info.aggregates or id(select) not in self._status
        if keyed or groups_released:  # a released group's presence is keyed noise too
            units, rkeys, tables, instances = self._units(info.scope, with_rkeys=True)
        one_per_row = instances == 1 and len(tables) == 1 and self.unit_per_row.get(tables[0])
        # joined with public tables (or protected cells) only, each on a unique key, with that
        # table as the driver: the rows are still its rows, each once (planner/multiplicity)
        driven = (
            not one_per_row
            and len(tables) == 1
            and self.unit_per_row.get(tables[0], False)
            and self._row_source(info.scope) == 0
        )
        if (one_per_row or driven) and Method.DP not in keyed:  # DP bounds contributions per unit
            units = None
        aggregates = [self._aggregate(node, tables, select) for node in info.aggregates]
        group_k = None
        if groups_released:
            # The group's existence is the release when there is no value to suppress, and
            # when an outer query can count, join or test the rows (IN, EXISTS, COUNT(*)):
            # then groups whose protected count (CKM) or keyed noisy count (threshold) is
            # below k are dropped, not shown with NULL values.
            group_k = max(
                self.policy.table(t).rule(AggregateKind.COUNTS).min_frequency for t in tables
            )
        count_methods = {self.policy.table(t).rule(AggregateKind.COUNTS).method for t in tables}
        row_source = self._row_source(info.scope) if units is not None else None
        groupings = [
            n
            for part in (*select.expressions, select.args.get("having"), select.args.get("order"))
            if part is not None
            for n in own_nodes(part)
            if isinstance(n, exp.Grouping)
        ]
        plan = CellPlan(
            select,
            group_keys(select),
            groupings,
            aggregates,
            units,
            tables,
            rkeys,
            id(select) in self._status,
            group_k,
            row_source,
            bool(one_per_row),
            choose_mechanism(aggregates, count_methods),
            rows_are_units=bool(one_per_row or driven)
            or (row_source is not None and self.unit_per_row.get(tables[row_source], False)),
            scope=info.scope,
        )
        refuse_counts_in_coarser_cells(plan, self.analysis, self.policy)
        return plan

    def _aggregate(self, node: exp.AggFunc, tables: list[str], select) -> ProtectedAggregate:
        kind = AggregateKind.COUNTS if isinstance(node, exp.Count) else AggregateKind.MAGNITUDES
        counted = node.meta.get(COUNTED_UNITS)
        joined = ", ".join(sorted(set(tables)))
        if counted is not None and counted.table not in tables:
            # keyed by the counted table's record keys (counted_units): under another rule, one
            # key would draw two coupled noises of one set of units (red team s30c)
            tables = [*tables, counted.table]
        rules = [self.policy.table(t).rule(kind) for t in tables]
        if len({(r.method, r.ptable, r.magnitude, r.base, r.rounding) for r in rules}) > 1:
            if joined != ", ".join(sorted(set(tables))):
                raise PolicyViolation(
                    f"{node.sql('duckdb')[:80]} counts units of {counted.table}, whose "
                    f"{kind.value} are protected with another method or parameters than those "
                    f"of {joined}",
                    f"count them in their own table (COUNT(*) FROM {counted.table}), or give the "
                    "tables the same protection rule",
                    select.sql("duckdb"),
                )
            raise PolicyViolation(
                f"the joined tables {joined} protect {kind.value} "
                "with different methods or parameters",
                "aggregate each table on its own, or give the tables the same protection rule",
                select.sql("duckdb"),
            )
        _refuse_counts_revealed(node, kind, tables, rules[0], self.policy, select)
        k = max(r.min_frequency for r in rules)
        argument = node.this
        if isinstance(argument, exp.Distinct):
            argument = argument.expressions[0]
        if isinstance(argument, exp.Star):
            argument = None
        if counted is not None:
            counted = replace(counted, unique=self.unit_per_row.get(counted.table, False))
        return ProtectedAggregate(node, kind, k, argument, rules[0], counted)

    def _keyed_methods(self, info: ScopeInfo, tables: list[str]) -> set[Method]:
        """The methods among this aggregation's that need record keys (CKM, DP, ROUND)."""
        kinds = {
            AggregateKind.COUNTS if isinstance(n, exp.Count) else AggregateKind.MAGNITUDES
            for n in info.aggregates
        } or {AggregateKind.COUNTS}  # no aggregates: the groups are the release
        methods = {self.policy.table(t).rule(kind).method for t in tables for kind in kinds}
        return methods & {Method.CKM, Method.DP, Method.ROUND}

    def _units(
        self, scope: Scope, *, with_rkeys: bool
    ) -> tuple[list[exp.Expr], list[exp.Expr], list[str], int]:
        """Unit and (if asked) record-key expressions visible in ``scope``, confidential tables,
        and the number of row sources joined."""
        units: list[exp.Expr] = []
        rkeys: list[exp.Expr] = []
        tables: list[str] = []
        instances = 0
        for alias, (_node, source) in scope.selected_sources.items():
            if isinstance(source, exp.Table):
                instances += 1
                table = self.policy.table(source.name)
                if not table.is_public:
                    units.append(exp.column(table.privacy_unit, alias))
                    if with_rkeys:
                        rkeys.append(exp.column(RKEY, alias))
                    tables.append(table.name)
                continue
            child = self.analysis.infos[id(source.expression)]
            if child.kind is not Kind.ROW:
                instances += 1
                continue
            child_units, child_rkeys, child_tables, child_instances = self._units(
                source, with_rkeys=with_rkeys
            )
            instances += child_instances
            tables += child_tables
            for expression in child_units:
                units.append(exp.column(self._expose(source.expression, expression), alias))
            for expression in child_rkeys:
                rkeys.append(exp.column(self._expose(source.expression, expression), alias))
        return units, rkeys, tables, instances

    def _row_source(self, scope: Scope) -> int | None:
        """Position in this scope's units of the confidential table whose rows the scope's rows
        are, each at most once: the driver of the multiplicity proof
        (:mod:`sqlsdc.planner.multiplicity`), followed through derived tables. Record keys of
        that table need no DISTINCT, and a cell's key is theirs alone: joining other tables
        (a LEFT self-join, a household's attributes) leaves the key, and so the noise, as is."""
        driver = self.multiplicity.drivers.get(id(scope.expression))
        position = 0
        for alias, (_node, source) in scope.selected_sources.items():
            if isinstance(source, exp.Table):
                if self.policy.table(source.name).is_public:
                    continue
                if alias == driver:
                    return position
                position += 1
                continue
            if self.analysis.infos[id(source.expression)].kind is not Kind.ROW:
                continue
            if alias == driver:
                inner = self._row_source(source)
                return None if inner is None else position + inner
            position += len(self._units(source, with_rkeys=False)[0])
        return None

    def _expose(self, select: exp.Select, expression: exp.Expr) -> str:
        key = (id(select), expression.sql())
        if key not in self._exposed:
            alias = f"__u{len(self._exposed)}"
            self._exposed[key] = alias
            self.exposures.append(UnitExposure(select, expression, alias))
        return self._exposed[key]
