"""Differential privacy in the query path: bounded exact cells in SQL, noise on the cells.

Under ``method: dp`` an aggregation is split in two stages. The engine computes the *exact,
bounded* cells (:func:`_stage`); :mod:`sqlsdc.guard.dp_release` draws the noise, charges
the budget and registers the noisy cells as a relation; the query's projection, HAVING, ORDER BY
and LIMIT then run over that relation (the ``__cells`` frame of :mod:`sqlsdc.rewrite.cells`), so
they only ever see noisy values.

Bounding (Wilson, Zhang, Lam, Desfontaines, Simmons-Marengo, Gipson, "Differentially Private SQL
with Bounded User Contribution", PoPETs 2020, §3): after the query's FROM, joins and WHERE, each
privacy unit contributes to at most ``max_groups`` groups and at most ``max_rows`` rows' worth
per group; measures are clamped to their declared bounds and rounded to the grid
``granularity``. The choice is keyed and deterministic, never ``RANDOM()``: a unit keeps the
groups of smallest ``hash(__rkey, keys)``, where ``__rkey`` is its secret record key
(:mod:`sqlsdc.catalog.keys`), and in a group where it has more than ``max_rows`` rows it counts
``max_rows`` rows of its mean value (quantile histograms keep ``max_rows`` rows ranked by
``hash(__rkey, value)``). A unit's contribution depends on its own rows only, so adding or
removing a unit changes at most ``max_groups`` cells by at most the per-cell bounds the
accountant (:mod:`sqlsdc.mechanisms.accountant`) calibrates the noise with. A table with one row
per unit (enforced at apply time) and no join needs no bounding beyond clamping. The SQL of
these caps is :mod:`sqlsdc.rewrite.dp_bounding`.

Supported: one confidential table (joins with public tables are bounded after the join), read
directly or through row-level derived tables and CTEs (their SQL travels with the exact cells),
GROUP BY over dimension keys, any WHERE the guard allows, and COUNT(*), COUNT(column),
COUNT(DISTINCT unit), COUNT(DISTINCT column) (distinct values, at most ``max_rows`` per unit and
cell), SUM, AVG, VAR_SAMP/VAR_POP/VARIANCE, STDDEV_SAMP/STDDEV_POP/STDDEV and
MEDIAN/QUANTILE_CONT/QUANTILE_DISC of a measure column with declared bounds. Refused: ROLLUP,
CUBE and GROUPING SETS (each grouping set would be a further release), measures without
bounds or transformed on the way (also inside a derived table), mixing DP with other methods
in one aggregation, joins of confidential tables.

With ``dp.bounding_report`` the exact cells also carry the bounding report
(:mod:`sqlsdc.rewrite.dp_report`): per cell, the input rows the caps dropped, kept but clamped, and
kept, each row weighted 1/(its unit's rows), noised once as one vector of sensitivity 1
(:func:`sqlsdc.mechanisms.accountant.calibrate_report`) and released as the shares of input
dropped and clamped next to each cell's noise interval.

Cells are named by their canonical identity (:mod:`sqlsdc.planner.identity`): the population
with every predicate (derived tables and CTEs included), the keys and the measures on base
columns, never aliases or output names; that identity seeds the noise and keys the cache and
the ledger.

This module builds the stage (:func:`_stage`, a sequence of named steps) and the frame over its
noisy cells; the parts live beside it: :mod:`sqlsdc.rewrite.dp_aggregates` (each aggregate and
key read against the policy, refusals from the policy alone), :mod:`sqlsdc.rewrite.dp_statistics`
(the noisy statistics and how each output is computed from them),
:mod:`sqlsdc.rewrite.dp_bounding` and :mod:`sqlsdc.rewrite.dp_report` (the exact cells' SQL) and
:mod:`sqlsdc.rewrite.dp_sql` (in-place tree builders).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction

from sqlglot import exp

from sqlsdc.engines.trees import copy_tree
from sqlsdc.errors import PolicyViolation
from sqlsdc.mechanisms.accountant import (
    REPORT_PARTS,
    Bounding,
    PrivacyCost,
    Statistic,
    calibrate_report,
    compose,
)
from sqlsdc.mechanisms.partition import PartitionSelection
from sqlsdc.planner.identity import Population, aggregation_identity, canonical_expression
from sqlsdc.policy import GroupKeys, Method, Policy
from sqlsdc.rewrite.cells import CELLS, Cells, Frame, cell_column
from sqlsdc.rewrite.dp_aggregates import INTERVALLED, describe_aggregate, key_domain, refuse
from sqlsdc.rewrite.dp_bounding import (
    Hashed,
    bounded_pairs,
    histogram_cells,
    unit_row_cap,
    unit_rows,
)
from sqlsdc.rewrite.dp_report import bounding_report, join_report
from sqlsdc.rewrite.dp_sql import UNIT, from_, named_table, new_select, sub
from sqlsdc.rewrite.dp_statistics import (
    DpOutput,
    DpStatistic,
    Spec,
    Statistics,
    plan_outputs,
    selection_count,
    unit_counts,
)
from sqlsdc.rewrite.key_size import key_size, too_long
from sqlsdc.rewrite.order import analyst_scopes_in_order
from sqlsdc.rewrite.sql import copy_clause

MECHANISM = "dp"
RELATION_PREFIX = "__sqlsdc_dp_cells_"
MAX_DOMAIN_CELLS = 1_000_000
REPORT_MEASURE = "bounding report:"  # prefix of the canonical measures of the bounding report


@dataclass(frozen=True)
class DpStage:
    """Everything the release step needs for one aggregation (pure data, no connection)."""

    relation: str  # the noisy cells are registered under this name
    sql: str  # exact bounded cells: __g<j> keys, statistic columns
    histograms: tuple[tuple[str, str], ...]  # QUANTILE: (statistic column, histogram SQL)
    table: str
    keys: tuple[str, ...]  # canonical key names, one per __g<j>
    scope: str  # canonical population (FROM, joins, WHERE)
    statistics: tuple[DpStatistic, ...]
    outputs: tuple[DpOutput, ...]  # one per aggregate i: released as __a<i>
    domains: tuple[tuple | str, ...] | None  # per key: declared values or SQL of a public
    # table's values; None: private partition selection
    selection: PartitionSelection | None
    units: str | None  # column of the noisy unit count (selection and min_frequency)
    min_frequency: int | None  # None: no cell withheld (none set, or no value to withhold)
    delta: Fraction = Fraction(0)  # of private selection, spent with its noisy unit counts
    # the bounding report's statistics (dropped, clamped, kept: accountant.REPORT_PARTS; dropped
    # is None where nothing can be dropped: one row per unit), or None: no report
    report: tuple[str | None, str, str] | None = None
    # a report is asked but its shares are public constants (one row per unit: nothing
    # dropped; no measure clamped): both are 0 exactly, and no report is drawn nor charged
    shares_zero: bool = False
    # the tables (lower-case names) the exact cells read: a cell's identity names the data
    # version of each declared one (dp_pricing.data_versions_of); found once, by the check
    reads: frozenset[str] = frozenset()
    # the trees behind ``sql`` (key None) and each histogram's SQL (by name), for engines that
    # run trees rather than DuckDB's text (Spark)
    trees: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def cost(self) -> PrivacyCost:
        """The most the stage can cost (every cell new, private selection's delta included);
        cached cells cost nothing."""
        return compose(s.calibration.cost for s in self.statistics) + PrivacyCost(delta=self.delta)


def dp_frame(policy: Policy, stages: dict[int, DpStage], to_sql,
             populations: Mapping[int, Population] | None = None):  # fmt: skip
    """Frame builder for aggregations protected by DP; records each aggregation's stage in
    ``stages`` under the id of its (original) select; ``to_sql`` renders the stage's SQL;
    ``populations`` are those the check has described already, by id of their scope."""

    def build(cells: Cells, twin) -> Frame:
        known = (populations or {}).get(id(cells.plan.scope))
        stage = _stage(cells, twin, policy, f"{RELATION_PREFIX}{len(stages)}", to_sql, known)
        stages[id(cells.plan.select)] = stage
        source = from_(new_select(exp.Star()), named_table(stage.relation))
        return Frame(
            sub(source, CELLS),
            value=lambda i: cell_column(f"__a{i}"),
            published=lambda i: cell_column(f"__p{i}"),
            accuracy=lambda i: (
                cell_column(f"__sd{i}"),
                cell_column(f"__hw{i}"),
                cell_column(f"__dr{i}"),
                cell_column(f"__cl{i}"),
            ),  # fmt: skip
        )

    return build


def _stage(cells: Cells, twin, policy: Policy, relation: str, to_sql,
           population: Population | None = None) -> DpStage:  # fmt: skip
    """The DP stage of one aggregation, in the order that keeps refusals before any SQL and
    numbers the statistics' columns in the order they are first asked: check the query's shape
    against the table's DP settings, name the cells, find the public domains, plan each
    aggregate's noisy statistics and the unit counts of partition selection, then build the
    exact bounded cells (with the bounding report) and their identity."""
    plan, select = cells.plan, cells.select
    table = _check_shape(cells, policy)
    settings = table.dp
    identity = aggregation_identity(plan.scope, plan.keys, [a.node for a in plan.aggregates],
                                    population)  # fmt: skip
    keys = identity.keys
    if len(set(keys)) != len(keys):
        raise refuse(select, "the same group key appears twice")
    domains = _public_domains(cells, table, policy, to_sql)
    asked = Statistics(cells, twin, _rows_select(cells, plan.units[0], plan.rkeys[0]))
    described = [describe_aggregate(i, node, plan, table, settings, select)
                 for i, node in enumerate(cells.aggregates)]  # fmt: skip
    fused = selection_count(described, settings, table, plan.one_row_per_unit)
    outputs = plan_outputs(asked, described, fused, table, select)
    units_column, selection, delta = unit_counts(asked, described, fused, outputs, table, select)

    n_keys, one_row = len(cells.keys), plan.one_row_per_unit
    order = Hashed.of(keys, asked.measures, chosen=settings.groups is GroupKeys.PRIVATE)
    report, names, shares_zero = _report(asked, n_keys, table, one_row, outputs, order, select)
    exact_tree, histogram_trees = _exact_trees(asked, n_keys, settings, one_row, order, report,
                                               select)  # fmt: skip
    # the rows kept are chosen by hashes of the query's measures (the unit row cap over all
    # cells, a quantile's rows within a cell), so the cells' identity names them
    ranked = tuple(sorted(asked.measures))
    capped = settings.max_rows_per_unit is not None and not one_row
    return DpStage(
        relation=relation,
        sql=to_sql(exact_tree),
        histograms=tuple((name, to_sql(tree)) for name, tree in histogram_trees),
        table=table.name,
        keys=keys,
        scope=(
            _rows_chosen_by(identity.population.text, ranked)
            if capped and ranked
            else identity.population.text
        ),
        statistics=tuple(
            _quantile_rows_chosen_by(s, ranked) if not one_row and len(ranked) > 1 else s
            for s in asked.statistics.values()
        ),
        outputs=tuple(outputs),
        domains=domains,
        selection=selection,
        units=units_column,
        min_frequency=settings.min_frequency if units_column is not None else None,
        delta=delta,
        report=tuple(names) if report is not None else None,
        shares_zero=shares_zero,
        reads=frozenset(t.name.lower() for t in exact_tree.find_all(exp.Table)),
        trees={None: exact_tree, **dict(histogram_trees)},
    )


def _check_shape(cells: Cells, policy: Policy):
    """The policy table of an aggregation that DP can protect; refuses mixed methods, more than
    one confidential table or unit, ROLLUP, CUBE and GROUPING SETS, GROUPING(), and private
    group keys too long to compute for every row of the population."""
    plan, select = cells.plan, cells.select
    methods = {a.rule.method for a in plan.aggregates}
    if methods - {Method.DP}:
        raise refuse(
            select,
            "this aggregation mixes differential privacy with "
            + ", ".join(sorted(m.value for m in methods - {Method.DP})),
            "ask the counts and the magnitudes in separate queries",
        )
    if len(set(plan.tables)) != 1 or not plan.units or len(plan.units) != 1:
        raise refuse(
            select,
            "differential privacy covers one confidential table per aggregation",
            "aggregate each confidential table in its own query (joins with public tables are "
            "allowed)",
        )
    table = policy.table(plan.tables[0])
    settings = table.dp
    group = select.args.get("group")
    levels = ("rollup", "cube", "grouping_sets")
    if group is not None and (
        group.find(exp.Rollup, exp.Cube, exp.GroupingSets) or any(group.args.get(k) for k in levels)
    ):
        raise refuse(
            select,
            "ROLLUP, CUBE and GROUPING SETS are not available under differential privacy (each "
            "level would be a further release of every unit)",
            "ask each level as its own GROUP BY query",
        )
    if cells.groupings:
        raise refuse(select, "GROUPING() is not available under differential privacy")
    if settings.groups is GroupKeys.PRIVATE and plan.keys:
        refusal = too_long(key_size(list(plan.keys), plan.scope))
        if refusal is not None:
            raise refuse(
                select,
                f"the group keys of private groups are computed for every row of the "
                f"population, and {refusal}: their running time would tell how many rows it has",
                "group by the columns themselves or short labels (a CASE with short branches)",
            )
    return table


def _public_domains(cells: Cells, table, policy: Policy, to_sql) -> tuple[tuple | str, ...] | None:
    """Per group key, its declared values or the SQL of a public table's values, when the table
    releases the groups of public domains (None: private partition selection). Refuses more
    than :data:`MAX_DOMAIN_CELLS` cells: every one of them is released."""
    if table.dp.groups is not GroupKeys.PUBLIC:
        return None
    plan, select = cells.plan, cells.select
    domains = tuple(
        key_domain(canonical_expression(plan.scope, k), table, select, policy, to_sql)
        for k in plan.keys
    )
    size = 1
    for d in domains:
        size *= len(d) if isinstance(d, tuple) else 1
    if size > MAX_DOMAIN_CELLS:
        raise refuse(
            select,
            f"the public domains of the group keys give {size:,} cells (more than "
            f"{MAX_DOMAIN_CELLS:,})",
            "group by fewer or coarser dimensions, or filter the result",
        )
    return domains


def _report(
    asked: Statistics,
    n_keys: int,
    table,
    one_row: bool,
    outputs: list,
    order: Hashed,
    select: exp.Select,
) -> tuple[exp.Select | None, list, bool]:
    """The bounding report's SQL (None: not asked, not shown or zero), the columns of its parts
    and whether its shares are zero as a public fact. Reads the rows before any cap."""
    settings = table.dp
    # the report is shown next to the intervals of COUNT, SUM and AVG (cursor.cell_accuracy);
    # a query of groups alone, or of VAR, STDDEV and quantiles only, would pay for it unseen
    shown = any(o is not None and o.aggregate in INTERVALLED for o in outputs)
    # one row per unit and no measure clamped (counts only): nothing can be dropped or clamped,
    # so the shares are 0 whatever the data, a public fact not worth a noisy report
    shares_zero = settings.bounding_report is not None and shown and one_row and not asked.clamps
    if settings.bounding_report is None or not shown or shares_zero:
        return None, [], shares_zero
    # one row per unit and no join: no cap removes anything (a public fact), so D is 0
    # and not released; only C and K are, at the same total cost
    parts = REPORT_PARTS[1:] if one_row else REPORT_PARTS
    try:
        calibration = calibrate_report(Bounding(settings.max_groups, settings.max_rows,
                                                max_unit_rows=settings.max_rows_per_unit),
                                       settings.bounding_report, len(parts))  # fmt: skip
    except ValueError as e:
        raise refuse(select, f"dp.bounding_report of {table.name}: {e}") from None
    bounds = ";".join(sorted(f"{m} in {b.describe()}" for m, b in asked.clamps.values()))
    names = [] if parts == REPORT_PARTS else [None]
    for part in parts:  # the measures clamped are part of what is released
        names.append(asked.reported(calibration, f"{REPORT_MEASURE}{part}:{bounds}"))
    clamps = {c: b for c, (_m, b) in asked.clamps.items()}
    return bounding_report(asked.rows, n_keys, settings, clamps, names, order), names, False


def _exact_trees(asked: Statistics, n_keys: int, settings, one_row: bool, order: Hashed,
                 report: exp.Select | None, select: exp.Select):  # fmt: skip
    """The trees of the exact bounded cells (joined with the bounding report) and of each
    quantile's histogram, with the CTEs their rows read; refused if they read protected
    cells. Uses up the stage's rows (the unit row cap places them)."""
    rows, specs = asked.rows, asked.specs
    if settings.max_rows_per_unit is not None and not one_row:
        rows = unit_row_cap(rows, settings.max_rows_per_unit, order, settings.max_rows)
    if not specs and not n_keys:  # only quantiles: the one global cell still needs a row
        specs.append(Spec("__rows", None, None))  # a row count never noised nor released
    exact = (unit_rows(rows, n_keys, specs) if one_row
             else bounded_pairs(rows, n_keys, specs, settings, order))  # fmt: skip
    if report is not None:
        exact = join_report(exact, report, n_keys)
    ctes = _visible_ctes(select)
    exact_tree = _with_ctes(exact, rows, ctes)
    histogram_trees = tuple(
        (
            name,
            _with_ctes(
                histogram_cells(rows, n_keys, b, settings, order, ranked=not one_row), rows, ctes
            ),
        )
        for name, b in asked.histograms
    )
    _refuse_reading_cells(select, [exact_tree, *(tree for _name, tree in histogram_trees)])
    for tree in (exact_tree, *(tree for _name, tree in histogram_trees)):
        try:  # their SQL is rendered below
            analyst_scopes_in_order(tree, None)
        except PolicyViolation as refusal:  # the aggregation's SQL, printed for refusals only
            refusal.sql = refusal.sql or select.sql("duckdb")  # (0.2-0.3 ms a stage)
            raise
    return exact_tree, histogram_trees


def _refuse_reading_cells(select: exp.Select, trees: list[exp.Select]) -> None:
    """Refuse a stage whose exact cells would read protected cells: the engine computes them
    before any noisy cells are registered, so such a statement failed after its charge, and
    rows chosen by released values are a population the budget does not account for. Checked
    on the stage's own SQL, so that every way its rows reach cells counts: FROM, joins, WHERE,
    group keys and aggregates' arguments (``COUNT(CASE WHEN x > (SELECT AVG(x) ...) THEN 1
    END)``, red team s35) and the CTEs they read (``WITH c AS (SELECT COUNT(*) AS n FROM t)
    ... WHERE age < (SELECT n FROM c)``, red team s36b)."""
    if any(s.alias == CELLS for tree in trees for s in tree.find_all(exp.Subquery)):
        raise refuse(
            select,
            "a differentially private aggregation cannot read the results of another "
            "aggregation (a subquery, derived table or CTE of protected cells in FROM, JOIN, "
            "WHERE, a group key or an aggregate's argument): its rows would depend on released "
            "values the budget does not account for",
            "filter the rows with conditions on their own columns, or ask the other "
            "aggregation in its own query",
        )


def _rows_chosen_by(scope: str, ranked: tuple[str, ...]) -> str:
    """The population of a stage whose unit row cap keeps each unit's rows of smallest
    ``hash(record key, keys, measures)`` (:func:`unit_row_cap`): the measures (canonical, in
    the order hashed) are part of which rows every cell counts. ``COUNT(*)`` asked alone and
    next to ``SUM(m)`` keeps other rows, so its two exact values must not share one noise: the
    difference of the two releases would be the exact difference of the two counts."""
    return json.dumps({"population": json.loads(scope), "rows chosen by": list(ranked)},
                      sort_keys=True)  # fmt: skip


def _quantile_rows_chosen_by(statistic: DpStatistic, ranked: tuple[str, ...]) -> DpStatistic:
    """A quantile's statistic named with the measures whose hash chooses the ``max_rows`` rows
    a unit keeps in a cell (:func:`histogram_cells`): ``MEDIAN(m)`` asked with another
    measure ranks other rows, so its histogram is another exact input to the keyed draw."""
    if statistic.calibration.statistic is not Statistic.QUANTILE:
        return statistic
    return replace(statistic, measure=f"{statistic.measure}; rows chosen by {', '.join(ranked)}")


def _rows_select(cells: Cells, unit: exp.Expr, rkey: exp.Expr) -> exp.Select:
    """The rows after FROM, joins and WHERE: unit, record key, keys (measures added later)."""
    rows = exp.Select()
    for key in ("from_", "joins", "where"):
        value = cells.select.args.get(key)
        if value is not None:
            rows.set(key, copy_clause(value))
    rows.append("expressions", exp.alias_(copy_tree(unit), UNIT, copy=False))
    rows.append("expressions", exp.alias_(copy_tree(rkey), "__rk", copy=False))
    for j, key in enumerate(cells.keys):
        rows.append("expressions", exp.alias_(copy_tree(key), f"__g{j}", copy=False))
    return rows


def _visible_ctes(select: exp.Select) -> dict[str, exp.CTE]:
    """The CTEs visible from ``select`` by name (an inner definition hides an outer one), in
    an order where every CTE comes after those it can read: outer WITHs first, each in its
    order of definition."""
    levels: list[list[exp.CTE]] = []
    node = select
    while node is not None:
        with_ = node.args.get("with_") if isinstance(node, exp.Query) else None
        if with_ is not None:
            levels.append(list(with_.expressions))
        node = node.parent
    found: dict[str, exp.CTE] = {}
    for level in reversed(levels):
        for cte in level:
            found.pop(cte.alias_or_name, None)
            found[cte.alias_or_name] = cte
    return found


def _with_ctes(query: exp.Select, rows: exp.Select, ctes: dict[str, exp.CTE]) -> exp.Select:
    """``query`` with the CTEs that ``rows`` reads (directly or through other CTEs) in front of
    its own, in their order of definition: the exact cells run as a statement of their own."""
    needed: dict[str, exp.CTE] = {}

    def visit(node: exp.Expr) -> None:
        for table in node.find_all(exp.Table):
            name = table.name
            if not table.args.get("db") and name in ctes and name not in needed:
                needed[name] = ctes[name]
                visit(ctes[name].this)

    visit(rows)
    if not needed:
        return query
    order = list(ctes)
    chosen = [copy_tree(needed[n]) for n in sorted(needed, key=order.index)]
    own = query.args.get("with_")  # ``query`` is the stage's own tree: changed in place
    query.set("with_", exp.With(expressions=chosen + (own.expressions if own else [])))
    return query
