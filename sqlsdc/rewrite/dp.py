"""Differential privacy in the query path: bounded exact cells in SQL, noise on the cells.

Under ``method: dp`` an aggregation is split in two stages. The engine computes the *exact,
bounded* cells (:func:`bounded_cells`); :mod:`sqlsdc.guard.dp_release` draws the noise, charges
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
per unit (enforced at apply time) and no join needs no bounding beyond clamping.

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
(:func:`bounding_report`): per cell, the input rows the caps dropped, kept but clamped, and
kept, each row weighted 1/(its unit's rows), noised once as one vector of sensitivity 1
(:func:`sqlsdc.mechanisms.accountant.calibrate_report`) and released as the shares of input
dropped and clamped next to each cell's noise interval.

Cells are named by their canonical identity (:mod:`sqlsdc.planner.identity`): the population
with every predicate (derived tables and CTEs included), the keys and the measures on base
columns, never aliases or output names; that identity seeds the noise and keys the cache and
the ledger.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import NamedTuple

from sqlglot import exp

from sqlsdc.engines.trees import copy_tree
from sqlsdc.errors import PolicyViolation
from sqlsdc.mechanisms.accountant import (
    REPORT_PARTS,
    Aggregate,
    AggregatePlan,
    Bounding,
    Calibration,
    PrivacyCost,
    Statistic,
    calibrate,
    calibrate_report,
    compose,
    plan_aggregate,
)
from sqlsdc.mechanisms.partition import (
    PartitionSelection,
    laplace_partition_selection,
    optimal_partition_selection,
)
from sqlsdc.planner.identity import Population, aggregation_identity, canonical_expression
from sqlsdc.planner.linear import exact_number
from sqlsdc.policy import AggregateKind, GroupKeys, Method, Policy
from sqlsdc.rewrite.cells import CELLS, Cells, Frame, cell_column
from sqlsdc.rewrite.dp_bounding import (
    Hashed,
    bounded_pairs,
    histogram_bins,
    histogram_cells,
    unit_row_cap,
    unit_rows,
)
from sqlsdc.rewrite.dp_report import bounding_report, join_report
from sqlsdc.rewrite.dp_sql import (
    DOUBLE,
    UNIT,
    cast,
    from_,
    named_table,
    new_select,
    number,
    sub,
)
from sqlsdc.rewrite.key_size import key_size, too_long
from sqlsdc.rewrite.order import analyst_scopes_in_order
from sqlsdc.rewrite.sql import copy_clause

MECHANISM = "dp"
RELATION_PREFIX = "__sqlsdc_dp_cells_"
MAX_DOMAIN_CELLS = 1_000_000
REPORT_MEASURE = "bounding report:"  # prefix of the canonical measures of the bounding report
DISTINCT = "DISTINCT "  # prefix of the canonical measure of COUNT(DISTINCT <not the unit>)
SHAPE = (
    "under differential privacy ask: SELECT <dimensions>, COUNT(*) | COUNT(DISTINCT unit) | "
    "SUM(m) | AVG(m) | VAR_SAMP(m) | STDDEV_SAMP(m) | MEDIAN(m) FROM <table> [JOIN <public "
    "table>] [WHERE ...] GROUP BY <dimensions>"
)

_AGGREGATES = {
    exp.Sum: Aggregate.SUM,
    exp.Avg: Aggregate.AVG,
    exp.Variance: Aggregate.VAR,
    exp.VariancePop: Aggregate.VAR,
    exp.Stddev: Aggregate.STDDEV,
    exp.StddevSamp: Aggregate.STDDEV,
    exp.StddevPop: Aggregate.STDDEV,
    exp.Median: Aggregate.QUANTILE,
    exp.Quantile: Aggregate.QUANTILE,
    exp.PercentileCont: Aggregate.QUANTILE,
    exp.PercentileDisc: Aggregate.QUANTILE,
}


class _Spec(NamedTuple):
    """One statistic column of the exact cells: its calibration (None: an unreleased row
    count), the column of rows it reads (None: rows or units), and whether it counts the
    distinct values of that column."""

    name: str
    calibration: object | None
    column: str | None
    distinct: bool = False


@dataclass(frozen=True)
class DpStatistic:
    """One noisy base statistic of the stage: its column in the exact cells and calibration."""

    column: str
    measure: str  # canonical measure: "*" for rows, the column name otherwise
    calibration: object  # accountant.Calibration


@dataclass(frozen=True)
class DpOutput:
    """How the released value ``__a<i>`` is post-processed from the noisy statistics."""

    aggregate: Aggregate
    statistics: tuple[str, ...]  # columns of the statistics, in accountant.components order
    plan: AggregatePlan
    ddof: int = 1  # VAR/STDDEV: 1 for the sample, 0 for the population
    histogram: str | None = None  # QUANTILE: the bin column of the stage's histogram query
    centre: Fraction = Fraction(0)  # AVG/VAR/STDDEV: the statistics are of (measure - centre)


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
    min_frequency: int | None
    delta: Fraction = Fraction(0)  # of private selection, spent with its noisy unit counts
    # the bounding report's statistics (dropped, clamped, kept: accountant.REPORT_PARTS; dropped
    # is None where nothing can be dropped: one row per unit), or None: no report
    report: tuple[str | None, str, str] | None = None
    # a report is asked but its shares are public constants (one row per unit: nothing
    # dropped; no measure clamped): both are 0 exactly, and no report is drawn nor charged
    shares_zero: bool = False
    # the tables (lower-case names) the exact cells read: a cell's identity names the data
    # version of each declared one (dp_release.data_versions_of); found once, by the check
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


def _refuse(select: exp.Select, reason: str, hint: str = SHAPE) -> PolicyViolation:
    return PolicyViolation(reason, hint, select.sql("duckdb"))


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
        raise _refuse(select, "the same group key appears twice")
    domains = _public_domains(cells, table, policy, to_sql)
    asked = _Statistics(cells, twin, _rows_select(cells, plan.units[0], plan.rkeys[0]))
    described = [_describe(i, node, plan, table, settings, select)
                 for i, node in enumerate(cells.aggregates)]  # fmt: skip
    fused = _selection_count(described, settings, table, plan.one_row_per_unit)
    outputs = _outputs(asked, described, fused, table, select)
    units_column, selection, delta = _unit_counts(asked, described, fused, outputs, table, select)

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
        min_frequency=settings.min_frequency,
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
        raise _refuse(
            select,
            "this aggregation mixes differential privacy with "
            + ", ".join(sorted(m.value for m in methods - {Method.DP})),
            "ask the counts and the magnitudes in separate queries",
        )
    if len(set(plan.tables)) != 1 or not plan.units or len(plan.units) != 1:
        raise _refuse(
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
        raise _refuse(
            select,
            "ROLLUP, CUBE and GROUPING SETS are not available under differential privacy (each "
            "level would be a further release of every unit)",
            "ask each level as its own GROUP BY query",
        )
    if cells.groupings:
        raise _refuse(select, "GROUPING() is not available under differential privacy")
    if settings.groups is GroupKeys.PRIVATE and plan.keys:
        refusal = too_long(key_size(list(plan.keys), plan.scope))
        if refusal is not None:
            raise _refuse(
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
        _domain(canonical_expression(plan.scope, k), table, select, policy, to_sql)
        for k in plan.keys
    )
    size = 1
    for d in domains:
        size *= len(d) if isinstance(d, tuple) else 1
    if size > MAX_DOMAIN_CELLS:
        raise _refuse(
            select,
            f"the public domains of the group keys give {size:,} cells (more than "
            f"{MAX_DOMAIN_CELLS:,})",
            "group by fewer or coarser dimensions, or filter the result",
        )
    return domains


class _Statistics:
    """The columns a stage computes, numbered in the order they are first asked: the rows'
    measures (``__x<i>``, one per canonical argument and centre, added to :attr:`rows`), the
    noisy statistics (``__s<k>``, one per calibration and canonical measure, so an aggregate
    asked twice is drawn once), the specs of the exact cells' columns, the quantiles'
    histograms and the bounded measures that are clamped (for the bounding report)."""

    def __init__(self, cells: Cells, twin, rows: exp.Select):
        self.cells, self.twin, self.rows = cells, twin, rows
        self.measures: dict[str, str] = {}  # canonical argument -> column of rows
        self.statistics: dict[tuple, DpStatistic] = {}
        self.specs: list[_Spec] = []
        self.histograms: list[tuple[str, exp.Expr]] = []
        self.clamps: dict[str, tuple[str, Bounding]] = {}  # rows column -> (measure, bounds)

    def column_of(self, text: str, i: int, centre: Fraction = Fraction(0)) -> str:
        """The rows column of aggregate ``i``'s argument, shifted by ``-centre`` (a DOUBLE)."""
        if text not in self.measures:
            self.measures[text] = f"__x{len(self.measures)}"
            argument = copy_tree(self.cells.argument(i, self.twin))
            if centre:  # on DOUBLE, as the grid reads it: INT_MIN - 50 raises on integers
                argument = exp.Sub(this=cast(argument, DOUBLE), expression=number(centre))
            self.rows.append("expressions", exp.alias_(argument, self.measures[text], copy=False))
        return self.measures[text]

    def statistic(self, calibration, measure: str, column: str | None, distinct: bool) -> str:
        """The column of the noisy statistic ``calibration`` of ``measure`` (read from the rows
        ``column``; None: rows or units), added on first use."""
        ident = (calibration.describe(), measure)
        if column is not None and calibration.bounding.bounded and not distinct:
            _check_grid(calibration, self.cells.select)
            self.clamps[column] = (measure, calibration.bounding)
        if ident not in self.statistics:
            name = f"__s{len(self.statistics)}"
            self.statistics[ident] = DpStatistic(name, measure, calibration)
            if calibration.statistic is not Statistic.QUANTILE:
                self.specs.append(_Spec(name, calibration, column, distinct))
            else:
                self.histograms.append((name, histogram_bins(calibration.bounding, column)))
        return self.statistics[ident].column

    def reported(self, calibration, measure: str) -> str:
        """The column of one part of the bounding report (computed by its own SQL, no spec)."""
        name = f"__s{len(self.statistics)}"
        self.statistics[(calibration.describe(), measure)] = DpStatistic(name, measure, calibration)
        return name


def _outputs(asked: _Statistics, described, fused: int | None, table, select: exp.Select
             ) -> list[DpOutput | None]:  # fmt: skip
    """How each aggregate is released: COUNT, SUM and quantiles from their own statistics
    first, then AVG, VAR and STDDEV from sums and counts (:func:`_composite`, reusing those the
    query asks already). The aggregate ``fused`` with private selection is left None for
    :func:`_unit_counts`."""
    table_asked: dict[tuple[Statistic, str], tuple[str, Calibration]] = {}
    outputs: list[DpOutput | None] = [None] * len(described)
    for i, (aggregate, measure, bounding, alpha, ddof) in enumerate(described):
        if aggregate in COMPOSITE or i == fused:
            continue
        kind = AggregateKind.COUNTS if aggregate in COUNTS else AggregateKind.MAGNITUDES
        agg_plan = _plan(aggregate, bounding, table.rule(kind).spend, alpha, select)
        distinct = measure.startswith(DISTINCT)
        text = measure.removeprefix(DISTINCT)
        column = None if text == "*" else asked.column_of(text, i)
        names = [asked.statistic(c, measure, column, distinct) for c in agg_plan.components]
        _check_range(aggregate, agg_plan.components[0], select)
        if aggregate in (Aggregate.SUM, Aggregate.COUNT) and not distinct:
            table_asked[(agg_plan.components[0].statistic, measure)] = (
                names[0], agg_plan.components[0])  # fmt: skip
        histogram = names[0] if aggregate is Aggregate.QUANTILE else None
        outputs[i] = DpOutput(aggregate, tuple(names), agg_plan, ddof, histogram)
    for i, (aggregate, measure, bounding, _alpha, ddof) in enumerate(described):
        if aggregate in COMPOSITE:
            spend = table.rule(AggregateKind.MAGNITUDES).spend
            try:
                outputs[i] = _composite(aggregate, measure, bounding, ddof, spend, table_asked,
                                        asked.column_of, asked.statistic, i)  # fmt: skip
            except ValueError as e:
                raise _refuse(select, str(e), "declare bounds on the measure") from None
    return outputs


def _unit_counts(
    asked: _Statistics, described, fused: int | None, outputs: list, table, select: exp.Select
) -> tuple[str | None, PartitionSelection | None, Fraction]:
    """The noisy unit count per cell that private partition selection or ``min_frequency``
    thresholds: its column, the selection rule (None: public domains) and the selection's delta;
    (None, None, 0) when neither is asked. With private selection, the query's own unit count
    (``fused``) is that count, and its output is set here."""
    settings = table.dp
    if settings.groups is not GroupKeys.PRIVATE and settings.min_frequency is None:
        return None, None, Fraction(0)
    selection, delta = None, Fraction(0)
    base = Bounding(settings.max_groups, settings.max_rows,
                    max_unit_rows=settings.max_rows_per_unit)  # fmt: skip
    if settings.groups is GroupKeys.PRIVATE and fused is not None:
        # the query's own unit count, drawn once with its spend and the selection's, is
        # thresholded and released: one noisy count at the sum of both epsilons
        count = table.rule(AggregateKind.COUNTS).spend.epsilon
        selection = laplace_partition_selection(settings.selection_epsilon + count,
                                                settings.selection_delta,
                                                settings.max_groups)  # fmt: skip
        calibration, delta = selection.calibration, settings.selection_delta
    elif settings.groups is GroupKeys.PRIVATE:
        # without min_frequency no noisy unit count is needed: the optimal rule keeps
        # more small groups at the same cost; with it, thresholding's noisy counts serve both
        rule = (
            laplace_partition_selection if settings.min_frequency else optimal_partition_selection
        )
        selection = rule(settings.selection_epsilon, settings.selection_delta,
                         settings.max_groups)  # fmt: skip
        calibration, delta = selection.calibration, settings.selection_delta
    else:
        spend = table.rule(AggregateKind.COUNTS).spend
        if spend is None:
            raise _refuse(
                select,
                f"{table.name} has dp.min_frequency but does not protect counts with dp",
                "declare `counts: {method: dp, spend: ...}` for the table",
            )
        calibration = calibrate(Statistic.COUNT_UNITS, base, spend)
    units_column = asked.statistic(calibration, "*", None, False)
    if fused is not None:
        aggregate = described[fused][0]
        _check_range(aggregate, calibration, select)
        outputs[fused] = DpOutput(aggregate, (units_column,),
                                  AggregatePlan(aggregate, (calibration,)))  # fmt: skip
    return units_column, selection, delta


def _report(
    asked: _Statistics,
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
        raise _refuse(select, f"dp.bounding_report of {table.name}: {e}") from None
    bounds = ";".join(sorted(f"{m} in {b.describe()}" for m, b in asked.clamps.values()))
    names = [] if parts == REPORT_PARTS else [None]
    for part in parts:  # the measures clamped are part of what is released
        names.append(asked.reported(calibration, f"{REPORT_MEASURE}{part}:{bounds}"))
    clamps = {c: b for c, (_m, b) in asked.clamps.items()}
    return bounding_report(asked.rows, n_keys, settings, clamps, names, order), names, False


def _exact_trees(asked: _Statistics, n_keys: int, settings, one_row: bool, order: Hashed,
                 report: exp.Select | None, select: exp.Select):  # fmt: skip
    """The trees of the exact bounded cells (joined with the bounding report) and of each
    quantile's histogram, with the CTEs their rows read; refused if they read protected
    cells. Uses up the stage's rows (the unit row cap places them)."""
    rows, specs = asked.rows, asked.specs
    if settings.max_rows_per_unit is not None and not one_row:
        rows = unit_row_cap(rows, settings.max_rows_per_unit, order)
    if not specs and not n_keys:  # only quantiles: the one global cell still needs a row
        specs.append(_Spec("__rows", None, None))  # a row count never noised nor released
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
        analyst_scopes_in_order(tree, select.sql("duckdb"))  # their SQL is rendered below
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
        raise _refuse(
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


COMPOSITE = (Aggregate.AVG, Aggregate.VAR, Aggregate.STDDEV)
INTERVALLED = (Aggregate.COUNT, Aggregate.COUNT_DISTINCT, Aggregate.SUM, Aggregate.AVG)
"""The aggregates released with a noise interval, and so with the bounding report's shares."""
COUNTS = (Aggregate.COUNT, Aggregate.COUNT_DISTINCT)


GRID_LIMIT = 2**62
"""The largest clamped value, in grid units, a sum or quantile reads as BIGINT (max |bound| / g;
for a quantile's bins also (upper - lower) / g)."""
SQUARES_GRID_LIMIT = 2**40
"""The same for a sum of squares, added up as HUGEINT: its squares stay under 2^80, so no
count of rows a database holds makes their sum overflow."""


def _check_grid(calibration: Calibration, select: exp.Select) -> None:
    """Refuse a statistic whose values on the grid the engine's integers cannot hold: the
    policy allows bounds to 1e15 and granularities to 1e-6, 1e21 grid units, and the cast to
    BIGINT of an unclamped value beyond 2^63 failed the query for the cells holding one, an
    exact existence oracle behind the noise (red team s35). Depends on the policy only."""
    b, kind = calibration.bounding, calibration.statistic
    largest = max(abs(b.lower), abs(b.upper)) / b.granularity
    if kind is Statistic.QUANTILE:  # its bins count from the lower bound
        largest = max(largest, (b.upper - b.lower) / b.granularity)
    squares = kind is Statistic.SUM_SQUARES
    if largest > (SQUARES_GRID_LIMIT if squares else GRID_LIMIT):
        what = {Statistic.SUM_SQUARES: "its squares (VAR, STDDEV)",
                Statistic.QUANTILE: "its quantile's bins"}.get(kind, "its sum")  # fmt: skip
        raise _refuse(
            select,
            f"the measure's bounds [{b.lower}, {b.upper}] on the grid {b.granularity} span "
            f"{float(largest):.3g} grid units, more than exact integer arithmetic holds for "
            f"{what}",
            "an admin declares narrower bounds or a coarser dp.granularity",
        )


INTEGER_RANGES = {Aggregate.COUNT: 2**63, Aggregate.COUNT_DISTINCT: 2**63, Aggregate.SUM: 10**38}
"""The released integers' ranges: counts are BIGINT, a SUM over an integral grid HUGEINT
(DECIMAL(38, 0) on Spark; :data:`sqlsdc.guard.dp_release.WIDE_INTEGER`). Exact values stay far
inside (a sum: at most 2^62 grid units of at most 10^6 per row, under 10^38 up to 10^13 rows)."""
NOISE_MARGIN = 10**8
"""Noise sd x this must stay inside the released integer's range: the noise then passes the
range with probability below e^-(10^7) (discrete Laplace and Gaussian tails alike)."""


def _check_range(aggregate: Aggregate, calibration: Calibration, select: exp.Select) -> None:
    """Refuse, from the policy alone, a COUNT or a SUM of integers whose noise could pass the
    range of its released type: the value could not be built after the query was charged
    (red team s35). Only a calibration whose noise drowns every cell comes near (a SUM's sd
    of 10^30)."""
    limit = INTEGER_RANGES.get(aggregate)
    if limit is None or calibration.unit.denominator != 1 or calibration.sd is None:
        return  # released as DOUBLE
    if calibration.sd * NOISE_MARGIN > limit:
        raise _refuse(
            select,
            f"the noise of this {aggregate.value} has sd {calibration.sd:.3g}: its values "
            f"could pass the range of the released integers (±{float(limit):.3g})",
            "an admin declares narrower bounds, smaller dp caps or a larger spend",
        )


def _plan(aggregate, bounding, spend, alpha, select) -> AggregatePlan:
    try:
        return plan_aggregate(aggregate, bounding, spend, alpha=alpha)
    except ValueError as e:
        raise _refuse(select, str(e), "declare bounds on the measure in the policy") from None


def _selection_count(described, settings, table, one_row: bool) -> int | None:
    """The position of an aggregate whose value is the group's unit count — COUNT(DISTINCT
    unit), or COUNT(*) when a unit is one row — that private selection can threshold and
    release as one noisy count (Laplace: its epsilon and the selection's add up), or None."""
    spend = table.rule(AggregateKind.COUNTS).spend
    if settings.groups is not GroupKeys.PRIVATE or spend is None or spend.rho or spend.delta:
        return None
    for i, (aggregate, measure, _bounding, _alpha, _ddof) in enumerate(described):
        units = aggregate is Aggregate.COUNT_DISTINCT or (
            aggregate is Aggregate.COUNT and measure == "*" and one_row and settings.max_rows == 1
        )
        if units:
            return i
    return None


def _composite(aggregate, measure, bounding, ddof, spend, asked, column_of, statistic, i):
    """AVG, VAR or STDDEV as post-processing of noisy sums and counts of the same cell.

    A component the aggregation already releases — ``SUM(m)`` or ``COUNT(m)`` next to
    ``AVG(m)`` — is reused: the aggregate adds no cost for it. The others share the aggregate's
    spend equally and are drawn over the values centred on the middle of the bounds,
    ``m - c`` with ``c`` the grid point nearest (lower + upper)/2, whose per-row bound
    max(|lower - c|, |upper - c|) is about half of max(|lower|, |upper|) for non-negative
    measures: the normalised sum of the DP mean (OpenDP ``make_mean``; Wilson et al. 2020
    §4.3 bound the sum by the largest magnitude). AVG = c + S_c / N and VAR is unchanged by the
    shift, so the released values estimate the same quantities with less noise.
    """
    reuse_sum = aggregate is Aggregate.AVG and (Statistic.SUM, measure) in asked
    g = bounding.granularity
    centre = Fraction(0) if reuse_sum else g * round((bounding.lower + bounding.upper) / (2 * g))
    shifted = replace(bounding, lower=bounding.lower - centre, upper=bounding.upper - centre)
    text = measure if not centre else f"({measure}) - {centre}"
    wanted = [Statistic.SUM, Statistic.COUNT]
    if aggregate is not Aggregate.AVG:
        wanted.insert(0, Statistic.SUM_SQUARES)
    reused = {
        s: asked[(s, measure)]
        for s in wanted
        if (s, measure) in asked and (s is Statistic.COUNT or reuse_sum)
    }
    missing = len([s for s in wanted if s not in reused])
    share = spend
    if missing:
        share = PrivacyCost(epsilon=spend.epsilon / missing, rho=spend.rho / missing,
                            delta=spend.delta / missing)  # fmt: skip
    names, parts = [], []
    for s in wanted:
        if s in reused:
            name, calibration = reused[s]
        else:
            calibration = calibrate(s, shifted, share)
            name = statistic(calibration, text, column_of(text, i, centre), False)
        names.append(name)
        parts.append(calibration)
    return DpOutput(aggregate, tuple(names), AggregatePlan(aggregate, tuple(parts)), ddof,
                    centre=centre)  # fmt: skip


def _describe(i: int, node, plan, table, settings, select):
    """(aggregate, canonical measure, bounding, alpha, ddof) of aggregate ``i``.

    The measure is the canonical argument on base columns (:mod:`sqlsdc.planner.identity`):
    ``"*"`` for rows and units, ``DISTINCT <arg>`` for distinct values, so a renamed or
    re-derived column is the same measure and another expression behind the same name is not.
    """
    rows = Bounding(settings.max_groups, settings.max_rows,
                    max_unit_rows=settings.max_rows_per_unit)  # fmt: skip
    spec = plan.aggregates[i].argument
    argument = None if spec is None else canonical_expression(plan.scope, spec)
    if isinstance(node, exp.Count):
        if argument is None:
            return Aggregate.COUNT, "*", rows, None, 1
        text = argument.sql("duckdb")
        if not isinstance(node.this, exp.Distinct):
            return Aggregate.COUNT, text, rows, None, 1
        if _is_column(argument, table.name, table.privacy_unit):
            return Aggregate.COUNT_DISTINCT, "*", rows, None, 1
        # Distinct values of another column: the SQL keeps at most max_rows values per unit
        # and cell, and a unit is in at most max_groups cells, so adding or removing a unit
        # changes at most max_groups cells by at most max_rows each: the sensitivity of a
        # bounded row count (WZL+20 §3 with values for rows).
        return Aggregate.COUNT, DISTINCT + text, rows, None, 1
    aggregate = _AGGREGATES.get(type(node))
    if aggregate is None:
        raise _refuse(select, f"{node.sql_name()} is not available under differential privacy")
    column = _measure_column(argument, table, select)
    lower, upper = (Fraction(str(b)) for b in column.bounds)
    bounding = Bounding(settings.max_groups, settings.max_rows, lower, upper,
                        settings.granularity, settings.max_rows_per_unit)  # fmt: skip
    alpha = None
    if aggregate is Aggregate.QUANTILE:
        alpha = _quantile_alpha(node, select)
    ddof = 0 if isinstance(node, (exp.VariancePop, exp.StddevPop)) else 1
    return aggregate, argument.sql("duckdb"), bounding, alpha, ddof


def _is_column(node: exp.Expr | None, table: str, column: str | None = None) -> bool:
    """Whether a canonical expression is a base column of ``table`` (``column`` if given)."""
    return (
        isinstance(node, exp.Column)
        and node.table == table
        and (column is None or node.name == column.lower())
    )


def _measure_column(argument: exp.Expr | None, table, select):
    """The declared, bounded measure that a canonical argument is (a bare column)."""
    if not _is_column(argument, table.name) or table.column(argument.name) is None:
        raise _refuse(
            select,
            "under differential privacy, SUM, AVG and the other magnitudes take one measure "
            "column with declared bounds",
            "aggregate a column, e.g. SUM(income); transformations have no declared bounds",
        )
    column = table.column(argument.name)
    if column.bounds is None:
        raise _refuse(
            select,
            f"measure {column.name!r} of {table.name} has no bounds, so one unit's influence "
            "on its sum is unbounded",
            f"an admin must declare `bounds: [lower, upper]` for {table.name}.{column.name}",
        )
    return column


def _quantile_alpha(node: exp.Expr, select) -> Fraction:
    if isinstance(node, exp.Median):
        return Fraction(1, 2)
    q = node.args.get("quantile") or node.args.get("expression") or node.expression
    if not isinstance(q, exp.Literal) or q.is_string:
        raise _refuse(select, "the quantile must be a number literal such as 0.9")
    try:
        alpha = exact_number(q.this)
    except ValueError:
        raise _refuse(select, f"quantile {q.this[:40]} is not a number between 0 and 1") from None
    if not 0 <= alpha <= 1:
        raise _refuse(select, f"quantile {q.this} is not between 0 and 1")
    return alpha


def _domain(key: exp.Expr, table, select, policy: Policy, to_sql) -> tuple | str:
    """The declared domain of a canonical key (a base column of the DP table), or the SQL of
    a public table's distinct values (a base column of a public table)."""
    source = policy.table(key.table) if isinstance(key, exp.Column) and key.table else None
    if source is not None and source.is_public:
        values = exp.select(exp.column(key.name)).distinct().from_(exp.to_table(source.name))
        return to_sql(values.where(exp.column(key.name).is_(exp.null()).not_()))
    column = table.column(key.name) if _is_column(key, table.name) else None
    if column is None or column.domain is None:
        raise _refuse(
            select,
            f"group key {key.sql('duckdb')} has no public domain, and {table.name} releases only "
            "the groups of declared domains (groups present in the data would reveal units)",
            "group by dimensions with a declared `domain`, or an admin sets "
            f"`dp: {{groups: private, selection: ...}}` for {table.name}",
        )
    return column.domain


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
