"""The noisy statistics of a DP stage and how each released aggregate is computed from them.

A stage draws noise on base statistics of its exact cells — counts, sums and sums of squares
on the grid, quantile histograms, unit counts — each calibrated by the accountant
(:mod:`sqlsdc.mechanisms.accountant`) and named by its calibration and canonical measure, so a
statistic two aggregates need is drawn (and charged) once. COUNT, SUM and quantiles are
released from their own statistics; AVG, VAR and STDDEV are post-processing of sums and
counts (:func:`_composite`); with private partition selection the query's own unit count is
the count the selection thresholds (:func:`unit_counts`). The release step
(:mod:`sqlsdc.guard.dp_release`) reads :class:`DpStatistic` and :class:`DpOutput`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import NamedTuple

from sqlglot import exp

from sqlsdc.engines.trees import copy_tree
from sqlsdc.mechanisms.accountant import (
    Aggregate,
    AggregatePlan,
    Bounding,
    Calibration,
    PrivacyCost,
    Statistic,
    calibrate,
)
from sqlsdc.mechanisms.partition import (
    PartitionSelection,
    laplace_partition_selection,
    optimal_partition_selection,
)
from sqlsdc.policy import AggregateKind, GroupKeys
from sqlsdc.rewrite.cells import Cells
from sqlsdc.rewrite.dp_aggregates import (
    COMPOSITE,
    COUNTS,
    DISTINCT,
    aggregate_plan,
    check_grid,
    check_range,
    refuse,
)
from sqlsdc.rewrite.dp_bounding import histogram_bins
from sqlsdc.rewrite.dp_sql import DOUBLE, cast, number


class Spec(NamedTuple):
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


class Statistics:
    """The columns a stage computes, numbered in the order they are first asked: the rows'
    measures (``__x<i>``, one per canonical argument and centre, added to :attr:`rows`), the
    noisy statistics (``__s<k>``, one per calibration and canonical measure, so an aggregate
    asked twice is drawn once), the specs of the exact cells' columns, the quantiles'
    histograms and the bounded measures that are clamped (for the bounding report)."""

    def __init__(self, cells: Cells, twin, rows: exp.Select):
        self.cells, self.twin, self.rows = cells, twin, rows
        self.measures: dict[str, str] = {}  # canonical argument -> column of rows
        self.statistics: dict[tuple, DpStatistic] = {}
        self.specs: list[Spec] = []
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
            check_grid(calibration, self.cells.select)
            self.clamps[column] = (measure, calibration.bounding)
        if ident not in self.statistics:
            name = f"__s{len(self.statistics)}"
            self.statistics[ident] = DpStatistic(name, measure, calibration)
            if calibration.statistic is not Statistic.QUANTILE:
                self.specs.append(Spec(name, calibration, column, distinct))
            else:
                self.histograms.append((name, histogram_bins(calibration.bounding, column)))
        return self.statistics[ident].column

    def reported(self, calibration, measure: str) -> str:
        """The column of one part of the bounding report (computed by its own SQL, no spec)."""
        name = f"__s{len(self.statistics)}"
        self.statistics[(calibration.describe(), measure)] = DpStatistic(name, measure, calibration)
        return name


def plan_outputs(asked: Statistics, described, fused: int | None, table, select: exp.Select
                 ) -> list[DpOutput | None]:  # fmt: skip
    """How each aggregate is released: COUNT, SUM and quantiles from their own statistics
    first, then AVG, VAR and STDDEV from sums and counts (:func:`_composite`, reusing those the
    query asks already). The aggregate ``fused`` with private selection is left None for
    :func:`unit_counts`."""
    table_asked: dict[tuple[Statistic, str], tuple[str, Calibration]] = {}
    outputs: list[DpOutput | None] = [None] * len(described)
    for i, (aggregate, measure, bounding, alpha, ddof) in enumerate(described):
        if aggregate in COMPOSITE or i == fused:
            continue
        kind = AggregateKind.COUNTS if aggregate in COUNTS else AggregateKind.MAGNITUDES
        agg_plan = aggregate_plan(aggregate, bounding, table.rule(kind).spend, alpha, select)
        distinct = measure.startswith(DISTINCT)
        text = measure.removeprefix(DISTINCT)
        column = None if text == "*" else asked.column_of(text, i)
        names = [asked.statistic(c, measure, column, distinct) for c in agg_plan.components]
        check_range(aggregate, agg_plan.components[0], select)
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
                raise refuse(select, str(e), "declare bounds on the measure") from None
    return outputs


def unit_counts(
    asked: Statistics, described, fused: int | None, outputs: list, table, select: exp.Select
) -> tuple[str | None, PartitionSelection | None, Fraction]:
    """The noisy unit count per cell that private partition selection or ``min_frequency``
    thresholds: its column, the selection rule (None: public domains) and the selection's delta;
    (None, None, 0) when neither is asked. With private selection, the query's own unit count
    (``fused``) is that count, and its output is set here.

    Public groups draw it only to withhold the values of cells under ``min_frequency``
    (:func:`sqlsdc.guard.dp_cells_table._cells_table`): a query of no aggregate
    (``SELECT scheme FROM benefits GROUP BY scheme``) releases every group of the public
    domain and no value, so it draws none and pays nothing (s49c: it paid the counts' epsilon
    for a count it never used)."""
    settings = table.dp
    if settings.groups is not GroupKeys.PRIVATE and (settings.min_frequency is None or not outputs):
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
            raise refuse(
                select,
                f"{table.name} has dp.min_frequency but does not protect counts with dp",
                "declare `counts: {method: dp, spend: ...}` for the table",
            )
        calibration = calibrate(Statistic.COUNT_UNITS, base, spend)
    units_column = asked.statistic(calibration, "*", None, False)
    if fused is not None:
        aggregate = described[fused][0]
        check_range(aggregate, calibration, select)
        outputs[fused] = DpOutput(aggregate, (units_column,),
                                  AggregatePlan(aggregate, (calibration,)))  # fmt: skip
    return units_column, selection, delta


def selection_count(described, settings, table, one_row: bool) -> int | None:
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
