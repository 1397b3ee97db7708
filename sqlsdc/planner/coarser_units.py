"""Refuse a cell-key count of one table's rows in cells that another confidential table's
columns define, when that table's units hold many of the counted ones (red team s43a).

Over ``persons ⋈ households`` the count of persons is protected as a count of persons (noise of
at most D), but grouped or filtered by the household's ``size`` every household of the cell adds
exactly ``size`` persons: the count is ``size·n_h ± D``, and for sizes above 2·D/size one n_h
fits. One query told 48 municipality x size household counts exactly, 46 of them 1 or 2
households that the households' own ``COUNT(*)`` hides (js 2), and a second, with ``h.tenure``,
the tenure of every household so isolated. The same number as the households' ``SUM(size)`` is
a magnitude under the mean floor counted by households; as a count of persons it had neither.
The cell's contributors are then the coarser table's units, each with a multiplicity: its rows
in the cell. Under the cell key method the common shape (plain counts only, one coarser table
joined once and inner, a plain GROUP BY) is protected as that magnitude (s43j,
:func:`_protect_as_sums`, built by :mod:`sqlsdc.rewrite.ckm`); every other shape below is
refused, fail closed, with what to write instead.

Counts rounded to a base (:mod:`sqlsdc.rewrite.round`) have the same flaw: on the demo with
counts rounded to 5, persons by municipality and ``h.size`` told 31 exact household counts
that the households' own rounded counts hide (size 7: 30 persons is 4 households, not 5).
A rounded sum is its mean times that rounded count (``SUM(p.age) ... WHERE p.age = 40`` is
R(40·n̂)), so under rounding sums of R's rows are refused as well. A cell-key sum is its mean
times n̂ too, but under the mean floor (n̂ < 18) it is one contribution that tells nothing of
n̂, and above it its noise leaves n̂ ± 1 of a count ± D: left answered.

What is refused, in an aggregation protected by the cell key method or rounding that reads two
or more confidential tables: a count of the rows of a table R (``COUNT(*)``, ``COUNT(x)``, a
``COUNT(DISTINCT x)`` not of another table's units) and an ``AVG`` (its published sum over its
protected count gives the count: ``SUM/AVG``), when a column other than an identifier of another
confidential table X is read anywhere in the aggregation (keys, ``WHERE``, ``JOIN ... ON``,
``HAVING``, arguments, the row-level derived tables and CTEs it reads) and X is not finer than
R (no identifier of X references R's unit: households are not finer than persons, persons are
finer than households). Counting X's own units (``COUNT(DISTINCT h.household_id)``, keyed by
the households' record keys, :mod:`sqlsdc.rewrite.counted_units`) stays answered: each
household counts once, whatever its size. A join that reads no such column (persons by region
joined to their households) counts the same persons with the same noise, and stays answered.

Which groups appear is such a count as well (CKM shows a group whose protected count of R's
units is positive): where the aggregation reads such a column, the group appears by a CKM count
of units the cell's columns do not outnumber (``COUNT(DISTINCT h.household_id)``, set as
``CellPlan.presence``), and without one the aggregation is refused (red team s43k).
"""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp
from sqlglot.optimizer.scope import Scope

from sqlsdc.errors import PolicyViolation
from sqlsdc.planner.scopes import Analysis, Kind, own_nodes
from sqlsdc.policy import AggregateKind, ColumnRole, Method, Policy

KEYED = (Method.CKM, Method.ROUND)
"""The methods whose published count of a cell is near its true count whatever the units: the
threshold rule publishes only cells of k units of every joined table, exact by design."""


def refuse_counts_in_coarser_cells(plan, analysis: Analysis, policy: Policy) -> None:
    """Refuse the aggregates of ``plan`` (a :class:`~sqlsdc.planner.plan.CellPlan`) described
    in the module docstring; nothing else is changed."""
    tables = sorted(set(plan.tables))
    if plan.mechanism not in KEYED or len(tables) < 2 or plan.scope is None:
        return
    read = _columns_read(plan.scope, analysis, policy)
    row_table = plan.tables[plan.row_source] if plan.row_source is not None else None
    counts: list[tuple[str, str | None]] = [
        (spec.node.sql("duckdb")[:80], spec.counted.table if spec.counted else row_table)
        for spec in plan.aggregates
        if spec.rule.method in KEYED
        and (
            spec.kind is AggregateKind.COUNTS
            or isinstance(spec.node, exp.Avg)
            or spec.rule.method is Method.ROUND  # R(S·n̂/n): a pinned sum is v times the count
        )
    ]
    if plan.mechanism is Method.CKM and plan.group_min_frequency is not None:
        # the groups' presence is a protected count of the rows against k (rounding's counts
        # the units of every joined table)
        counts.append(("the groups' presence", row_table))
    if plan.mechanism is Method.CKM and _protect_as_sums(plan, read, analysis, policy, row_table):
        return
    for what, counted in counts:
        coarser = _coarser(read, counted, policy)
        if not coarser:
            continue
        _refuse(what, counted or "the joined rows", coarser, plan, policy)
    if plan.mechanism is Method.CKM and _coarser(read, row_table, policy):
        _decide_presence_by_coarser_units(plan, read, row_table, policy)


def _decide_presence_by_coarser_units(plan, read, row_table, policy: Policy) -> None:
    """Under CKM a group appears when a protected count of the row table's units is positive
    (:meth:`sqlsdc.rewrite.ckm._Builder._presence_column`): of persons, in cells a household
    column defines. Grouped by municipality and ``h.size`` with ``COUNT(DISTINCT
    h.household_id)`` or ``SUM(p.income)``, 158 groups of the CLI demo appeared (the count
    shown as 0) that the households' own table leaves out, 140 of them of 1 or 2 households
    (red team s43k). The group's presence is then decided by a cell-key count of units that
    the cell's columns do not outnumber (``COUNT(DISTINCT h.household_id)``, keyed like the
    households' own count, so the same groups appear); without one, refused."""
    for i, spec in enumerate(plan.aggregates):
        if (
            spec.rule.method is Method.CKM
            and spec.kind is AggregateKind.COUNTS
            and spec.counted is not None
            and not _coarser(read, spec.counted.table, policy)
        ):
            plan.presence = i
            return
    coarser = _coarser(read, row_table, policy)
    other = coarser[0].split(".", 1)[0]
    unit = _units(other, plan, policy)
    raise PolicyViolation(
        f"which groups appear is decided by a protected count of {row_table} in cells defined "
        f"by {', '.join(coarser[:3])}, where each unit of {other} adds all its rows at once, "
        f"so groups of one or two units of {other} that their own table hides would appear",
        f"add COUNT(DISTINCT {unit}) to the query (its groups then appear as in {other} "
        f"alone), or drop the columns of {other} from the query",
        plan.select.sql("duckdb"),
    )


def _coarser(read, counted: str | None, policy: Policy) -> list[str]:
    """The columns read of tables other than ``counted`` and not finer than it."""
    return sorted(
        f"{t}.{c}"
        for t, c in read
        if t != counted and (counted is None or not _finer(policy, t, counted))
    )


def _refuse(what: str, whose: str, coarser: list[str], plan, policy: Policy) -> None:
    """Refuse ``what``, a count of ``whose`` rows in cells that ``coarser`` columns define."""
    other, column = coarser[0].split(".", 1)
    unit = _units(other, plan, policy)
    raise PolicyViolation(
        f"{what} counts {whose} in cells defined by "
        f"{', '.join(coarser[:3])}: each unit of {other} adds all its rows of the cell "
        "at once (a count of persons by household size is size times the households), "
        "which the count's protection does not hide",
        f"count the units of {other} in their own table (e.g. SELECT {column}, COUNT(*) "
        f"FROM {other} GROUP BY {column}) or through the join with COUNT(DISTINCT "
        f"{unit}), or drop the columns of {other} from the query",
        plan.select.sql("duckdb"),
    )


def _units(other: str, plan, policy: Policy) -> str:
    """``other``'s unit column as the query names it (``e.unit_id``): the counted table often
    has a column of the same name, its reference to ``other`` (events of enterprises, both
    ``unit_id``), and the hint's bare ``COUNT(DISTINCT unit_id)``, written with the counted
    table's alias, was refused again (new user s48e). Hints used the demo's names before."""
    unit = policy.table(other).privacy_unit
    for table in plan.select.find_all(exp.Table):
        if table.name.lower() == other:
            return f"{table.alias_or_name}.{unit}"
    return f"{other}.{unit}"


def _protect_as_sums(plan, read, analysis: Analysis, policy: Policy, row_table) -> bool:
    """Protect every count of the aggregation as a magnitude sum over the coarser table's units
    when all of them can be (marks :attr:`CellPlan.per_unit_counts` and gives each count the
    coarser table's magnitude rule); whether it did. The shape: cell-key counts (``COUNT(*)``,
    ``COUNT(x)``, not DISTINCT) of the rows of the join's row table R, every column read
    outside identifiers of R being of one other confidential table X that R is finer than
    (each row of R belongs to one unit of X), joined once and inner, plain ``GROUP BY`` (no
    grouping sets, no group-only release), and no other aggregate. Each unit of X then adds
    c_h = its counted rows of the cell, and the cell is published as X's own ``SUM`` of such
    values is: keyed by X's record keys, the c_h and the record keys of the rows counted, its
    largest c_h perturbed by X's magnitude ptable,
    under X's mean floor counted by X's units (:mod:`sqlsdc.rewrite.ckm`)."""
    if row_table is None or plan.row_source is None or plan.units is None:
        return False
    if plan.group_min_frequency is not None or plan.groupings or not plan.aggregates:
        return False
    group = plan.select.args.get("group")
    sets = (exp.Rollup, exp.Cube, exp.GroupingSets)
    if group is not None and (
        any(group.args.get(k) for k in ("rollup", "cube", "grouping_sets"))
        or any(isinstance(node, sets) for node in group.walk())
    ):
        return False  # a unit split over finer cells would be two contributions of one total
    if _outer_joins(plan.scope, analysis):
        return False
    others = {t for t, _c in read if t != row_table}
    if len(others) != 1:
        return False
    (other,) = others
    if plan.tables.count(other) != 1 or not _finer(policy, row_table, other):
        return False
    declared = policy.table(other)
    magnitude = declared.rule(AggregateKind.MAGNITUDES)
    units_rule = declared.rule(AggregateKind.COUNTS)
    if magnitude.method is not Method.CKM or units_rule.method is not Method.CKM:
        return False
    for spec in plan.aggregates:
        node = spec.node
        if (
            spec.rule.method is not Method.CKM
            or spec.kind is not AggregateKind.COUNTS
            or not isinstance(node, exp.Count)
            or isinstance(node.this, exp.Distinct)
            or (spec.counted is not None and spec.counted.table != row_table)
        ):
            return False
    position = plan.tables.index(other)
    for i, spec in enumerate(plan.aggregates):
        plan.aggregates[i] = replace(spec, kind=AggregateKind.MAGNITUDES, rule=magnitude)
        plan.per_unit_counts[i] = position
    return True


def _outer_joins(scope: Scope, analysis: Analysis) -> bool:
    """Whether the aggregation or a row-level source it reads joins other than inner: a row
    without its coarser unit would be no unit's contribution."""
    stack = [scope]
    while stack:
        current = stack.pop()
        for join in current.expression.args.get("joins") or []:
            if join.side or join.kind not in ("", "INNER"):
                return True
        for _alias, (_node, source) in current.selected_sources.items():
            if isinstance(source, Scope):
                info = analysis.infos.get(id(source.expression))
                if info is not None and info.kind is Kind.ROW:
                    stack.append(source)
    return False


def _finer(policy: Policy, table: str, than: str) -> bool:
    """Whether an identifier of ``table`` references the privacy unit of ``than``: each of
    ``table``'s rows then belongs to one unit of ``than`` (persons are finer than households)."""
    unit = policy.table(than).privacy_unit
    return any(c.references == (than, unit) for c in policy.table(table).columns.values())


def _columns_read(scope: Scope, analysis: Analysis, policy: Policy) -> set[tuple[str, str]]:
    """(table, column) of the confidential non-identifier base columns an aggregation reads:
    every column of its own clauses, and of the row-level sources it reads, their clauses
    other than the projection and the projections' lineage of what the parent reads."""
    found: set[tuple[str, str]] = set()
    stack: list[tuple[Scope, bool]] = [(scope, True)]
    while stack:
        current, whole = stack.pop()
        select = current.expression
        parts = (
            [select]
            if whole
            else [v for k, v in select.args.items() if k != "expressions" and v is not None]
        )
        for part in parts:
            for node in _nodes(part):
                if isinstance(node, exp.Column):
                    found |= _column_sources(node, current, analysis, policy)
        for _alias, (_node, source) in current.selected_sources.items():
            if isinstance(source, Scope):
                info = analysis.infos.get(id(source.expression))
                if info is not None and info.kind is Kind.ROW:
                    stack.append((source, False))
    return found


def _nodes(part) -> list[exp.Expr]:
    if isinstance(part, list):
        return [n for p in part if isinstance(p, exp.Expr) for n in own_nodes(p)]
    return own_nodes(part) if isinstance(part, exp.Expr) else []


def _column_sources(column: exp.Column, scope: Scope, analysis: Analysis, policy: Policy):
    entry = scope.selected_sources.get(column.table)
    if entry is None:
        return set()
    source = entry[1]
    if isinstance(source, exp.Table):
        pairs = {(source.name.lower(), column.name.lower())}
    else:
        info = analysis.infos.get(id(source.expression))
        lineage = info.outputs.get(column.name) if info is not None else None
        pairs = set(lineage.sources) if lineage is not None else set()
    kept = set()
    for table, name in pairs:
        declared = policy.table(table)
        if declared is None or declared.is_public:
            continue
        col = declared.column(name)
        if col is not None and col.role is ColumnRole.IDENTIFIER:
            continue
        kept.add((table, name))
    return kept
