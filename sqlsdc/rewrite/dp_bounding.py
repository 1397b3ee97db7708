"""The exact cells of a DP stage with every unit's contribution bounded, as SQL trees.

Wilson, Zhang, Lam, Desfontaines, Simmons-Marengo, Gipson, "Differentially Private SQL with
Bounded User Contribution", PoPETs 2020, §3: after the query's FROM, joins and WHERE, each
privacy unit contributes to at most ``max_groups`` groups and at most ``max_rows`` rows' worth
per group; measures are clamped to their declared bounds and rounded to the grid
``granularity``. Every choice is keyed and deterministic, never ``RANDOM()``: by hashes of the
unit's secret record key (:class:`Hashed`), so a unit's contribution depends on its own rows
only and the accountant's sensitivity holds. A table with one row per unit and no join needs
no bounding beyond clamping (:func:`unit_rows`).

Pure functions from the stage's rows (:func:`sqlsdc.rewrite.dp._rows_select`) to trees; the
stage (:mod:`sqlsdc.rewrite.dp`) chooses which to build.
"""

from __future__ import annotations

from typing import NamedTuple

from sqlglot import exp

from sqlsdc.engines.trees import copy_tree
from sqlsdc.mechanisms.accountant import Bounding, Statistic
from sqlsdc.rewrite.dp_sql import (
    BIGINT,
    DOUBLE,
    HUGEINT,
    UNIT,
    cast,
    decimal,
    from_,
    func,
    integer,
    join_using,
    key_columns,
    named_table,
    new_select,
    sub,
    window,
    with_named,
)

RANK_GROUP, RANK_ROW = "__group_rank", "__row_rank"
CELL_RANK = "__cell_rank"  # a row's rank among its unit's rows in its cell


class Hashed(NamedTuple):
    """The columns of the rows that the keyed choices hash, in the cells' canonical order: the
    ``__g<j>`` keys by canonical key name, the ``__x<i>`` measures by canonical measure.

    The identity names a cell by its keys and measures sorted (:mod:`sqlsdc.planner.identity`),
    so the rows a unit keeps must not depend on the order the query writes them in: with
    ``hash(record key, g, h)`` for ``GROUP BY g, h`` and ``hash(record key, h, g)`` for
    ``GROUP BY h, g``, one cell identity (one noise) covered two choices of groups, and two
    analysts differenced the exact effect out of their releases."""

    keys: tuple[str, ...]
    measures: tuple[str, ...]
    chosen: bool = False  # the analyst writes the key values (private groups): see group_order

    @classmethod
    def of(cls, keys: tuple[str, ...], measures: dict[str, str], *, chosen: bool) -> Hashed:
        by_name = sorted(range(len(keys)), key=lambda j: keys[j])
        return cls(tuple(f"__g{j}" for j in by_name),
                   tuple(measures[text] for text in sorted(measures)), chosen)  # fmt: skip

    def groups(self, first: exp.Expr) -> exp.Expr:
        """``hash(first, keys)``: the order of a unit's groups."""
        return func("hash", first, *(exp.column(k) for k in self.keys))

    def rows(self, *, keys: bool = True) -> exp.Expr:
        """``hash(__rk, [keys,] measures)``: the order of a unit's rows."""
        columns = [*(self.keys if keys else ()), *self.measures]
        return func("hash", exp.column("__rk"), *(exp.column(c) for c in columns))

    def row_order(self, *, keys: bool = True) -> list[exp.Expr]:
        """:meth:`rows`, then the keys and measures themselves: rows of one hash are ranked by
        their values, so a cap never keeps one of two rows of different values at random."""
        columns = [*(self.keys if keys else ()), *self.measures]
        return [self.rows(keys=keys), *(exp.column(c) for c in columns)]

    def capped_order(self, max_rows: int | None) -> list[exp.Expr]:
        """The order of a unit's rows under the unit row cap (:func:`capped_rank`): first the
        rows among the ``max_rows`` first of their cell (:data:`CELL_RANK`; None: no row is
        beyond, :func:`capped_rank`), then the cells in the order :func:`bounded_pairs` keeps
        them (``hash(record key, keys)``, then the keys), then :meth:`row_order`, then the
        record key (with ``max_rows``: the rank in the cell, which is that order).

        Ranked by the row hash alone, rows equal in (keys, measures) share one hash: a
        person's 48 rows of ``R02`` (one record key for all their rows, ``GROUP BY region``
        hashing only it and the region) were the 6 rows the cap kept, and ``max_rows: 3``
        then dropped 3 of them (red team s45j). A row the cell cap will drop now comes after
        every row it keeps, and the cells come in the order the group cap keeps them, so the
        cap keeps min(R, the rows of the unit's first cells up to max_rows each): all 6
        counted, 3 in each of its first two regions. Placing the ``k``-th copy of each row
        after the first of every row (one of each, then a second of each) fixed the example
        too, but spread a unit over more cells than ``max_groups`` keeps: 0.85% fewer rows
        counted by clinic on the 1M-row benchmark (max_groups 3). A unit whose record key is
        one for all its rows keeps the rows it kept before when it asks counts only and no
        cell holds more than max_rows of its rows (the row hash is then the cell's), or when
        the query has no group keys. The record key last makes the order total up to rows
        equal in every column of the stage's rows."""
        first: list[exp.Expr] = []
        if max_rows is not None:
            beyond = exp.GT(this=exp.column(CELL_RANK), expression=integer(max_rows))
            first.append(exp.Case(ifs=[exp.If(this=beyond, true=exp.Literal.number(1))],
                                  default=exp.Literal.number(0)))  # fmt: skip
        if self.keys:
            first += [self.groups(exp.column("__rk")), *(exp.column(k) for k in self.keys)]
        if max_rows is not None:  # the rank in the cell is already the rows' order in it
            return [*first, exp.column(CELL_RANK)]  # (7% less CPU than hashing them again)
        return [*first, *self.row_order(), exp.column("__rk")]

    def group_order(self, hashed: str) -> list[exp.Expr]:
        """The order of a unit's groups when their keys are :attr:`chosen`: their hash (the
        column ``hashed``), then their keys.

        Private groups' keys are the analyst's (``CASE WHEN clinic = 'a' THEN s1 ... END``),
        and DuckDB's string hash is no PRF: three strings of one hash, found in seconds, hash
        alike with every record key, and a cut on the hash alone (``hash <= the max_groups-th
        smallest``) kept all three groups of a unit whose max_groups is 2 (red team s35).
        Ranked with the keys after the hash, a unit keeps max_groups groups. Over public
        domains the keys are declared values or stored ones, which no analyst chooses, and the
        cut (an aggregate and a join, cheaper than this window) stays."""
        return [exp.Ordered(this=exp.column(hashed), nulls_first=False),
                *(exp.column(k) for k in self.keys)]  # fmt: skip


def unit_rows(rows: exp.Select, n_keys: int, specs) -> exp.Select:
    """The cells of a table with one row per unit and no join: a unit lies in one group with one
    row, so no unit exceeds any bound; values are clamped and put on the grid."""
    cells = from_(new_select(*key_columns(n_keys)), sub(copy_tree(rows), "__rows"))
    for name, calibration, column, distinct in specs:
        statistic = calibration.statistic if calibration else Statistic.COUNT
        if distinct:
            value = exp.Count(this=exp.Distinct(expressions=[exp.column(column)]))
        elif statistic is Statistic.COUNT:
            value = exp.Count(this=exp.Star() if column is None else exp.column(column))
        elif statistic is Statistic.COUNT_UNITS:
            value = exp.Count(this=exp.column(UNIT))  # units are never NULL (checked at apply)
        elif statistic is Statistic.SUM:
            value = exp.Sum(this=_grid_units(column, calibration.bounding))
        else:
            value = exp.Sum(this=_squared(_grid_units(column, calibration.bounding)))
        cells.append("expressions", exp.alias_(value, name, copy=False))
    return cells.group_by(*key_columns(n_keys), copy=False) if n_keys else cells


def unit_row_cap(rows: exp.Select, cap: int, order: Hashed, max_rows: int) -> exp.Select:
    """The rows with each unit cut to its ``cap`` rows first in :meth:`Hashed.capped_order`
    over the whole query (the rows the cell caps keep first, by the cells' and the rows'
    keyed hashes): a keyed choice by the unit's secret key, reproducible, and independent of
    other units. It keeps min(cap, the unit's rows) rows, as the accountant's norms assume."""
    columns = [exp.column(e.alias_or_name) for e in rows.expressions]
    source, rank = capped_rank(rows, order, cap, max_rows)  # ``rows`` is used up here
    kept = from_(new_select(*columns), sub(source, "__all_rows"))
    return kept.qualify(exp.LTE(this=rank, expression=integer(cap)), copy=False)


def capped_rank(rows: exp.Select, order: Hashed, cap: int, max_rows: int
                ) -> tuple[exp.Select, exp.Window]:  # fmt: skip
    """The rows the unit row cap ranks and its rank (the cap keeps rank <= ``cap``), shared by
    :func:`unit_row_cap` and the bounding report (:mod:`sqlsdc.rewrite.dp_report`).

    Each row's rank among its unit's rows in its cell (:data:`CELL_RANK`, by
    :meth:`Hashed.row_order`, then the record key) is a second window over the rows (the
    exact cells of a count by clinic over 1M rows: about 500 → 850 ms of CPU), so it is
    computed only when it can move a row: with group keys (without, the first ``max_rows``
    rows of the one cell are the first in the cap's order anyway) and ``max_rows < cap``
    (else no cell can hold more than max_rows of the rows kept).

    Rows tie in that rank's order only when they are equal in every column of the stage's rows
    (the unit, record key, keys and measures of :func:`sqlsdc.rewrite.dp._rows_select`; NULLs
    equal), and which of them gets which rank is the engine's choice, one that may differ
    between runs and between DuckDB and Spark. It cannot change an answer: every choice gives
    the same multiset of (row, rank), and the cap, the cells and the bounding report are
    functions of that multiset; the same holds for the cap's own rank. The columns are named
    (not ``*``) so that Spark's port still knows each hashed column's stored DuckDB type
    (:func:`sqlsdc.engines.spark_semantics._hash`)."""
    if not order.keys or max_rows >= cap:
        return rows, window("ROW_NUMBER", [exp.column(UNIT)], order.capped_order(None))
    names = [e.alias_or_name for e in rows.expressions]
    cell = [exp.column(UNIT), *(exp.column(k) for k in order.keys)]
    in_cell = window("ROW_NUMBER", cell, [*order.row_order(), exp.column("__rk")])
    ranked = new_select(*(exp.column(n) for n in names), exp.alias_(in_cell, CELL_RANK, copy=False))
    ranked = from_(ranked, sub(rows, "__in_cells"))
    return ranked, window("ROW_NUMBER", [exp.column(UNIT)], order.capped_order(max_rows))


def bounded_pairs(rows: exp.Select, n_keys: int, specs, settings, hashed: Hashed
                  ) -> exp.Select:  # fmt: skip
    """The cells with each unit bounded to ``max_groups`` groups and ``max_rows`` rows' worth
    per group (WZL+20 §3), aggregated per (unit, group) first, so no window runs over rows.

    A unit keeps the groups of smallest ``hash(record key, keys)`` (a keyed choice by the
    unit's secret key, independent of other units; groups of one hash, whose keys only an
    analyst can make collide, are ranked by their keys: :meth:`Hashed.group_order`). In a
    group where it has
    c > max_rows rows (R), it contributes R rows to counts and R times its mean clamped grid
    value to sums and sums of squares, rounded: the same bound (R rows of at most
    max(|lower|, |upper|)) as keeping R of its rows, without the bias to averages that clamping
    its total would cause.

    Distinct values (COUNT(DISTINCT x) of a column other than the unit): a unit keeps at most
    ``max_rows`` of its distinct non-NULL values per group (the smallest: a choice that depends
    on its own rows only), and a cell counts the distinct values of the union over its units.
    Adding or removing a unit then changes at most ``max_groups`` cells by at most
    ``max_rows`` values each, the sensitivity of a bounded row count.
    """
    r = integer(settings.max_rows)
    order = hashed.groups(func("MIN", exp.column("__rk"))) if n_keys else None
    pairs = new_select(exp.column(UNIT), *key_columns(n_keys),
                       exp.alias_(exp.Count(this=exp.Star()), "__c", copy=False))  # fmt: skip
    if order is not None:
        pairs.append("expressions", exp.alias_(order, "__h", copy=False))
    outer = new_select(*key_columns(n_keys))
    done: set[str] = set()
    for name, calibration, column, distinct in specs:
        statistic = calibration.statistic if calibration else Statistic.COUNT
        count = "__c" if column is None else f"__c{column}"
        if column is not None and count not in done:
            counted = exp.Count(this=exp.column(column))
            pairs.append("expressions", exp.alias_(counted, count, copy=False))
            done.add(count)
        if distinct:
            kept = f"__d{column}"
            if kept not in done:
                pairs.append("expressions", exp.alias_(_kept_values(column, r), kept, copy=False))
                done.add(kept)
            value = func("LEN", func("LIST_DISTINCT", func(
                "FLATTEN", exp.ArrayAgg(this=exp.column(kept)))))  # fmt: skip
        elif statistic is Statistic.COUNT:
            value = exp.Sum(this=_at_most(exp.column(count), r))
        elif statistic is Statistic.COUNT_UNITS:
            value = exp.Count(this=exp.Star())  # one pair per unit and group
        else:
            total = f"__{'s' if statistic is Statistic.SUM else 'q'}{column}"
            if total not in done:
                units = _grid_units(column, calibration.bounding)
                units = units if statistic is Statistic.SUM else _squared(units)
                pairs.append("expressions", exp.alias_(exp.Sum(this=units), total, copy=False))
                done.add(total)
            value = exp.Sum(this=_scaled(exp.column(total), exp.column(count), r))
        outer.append("expressions", exp.alias_(value, name, copy=False))
    pairs = from_(pairs, sub(copy_tree(rows), "__rows"))
    pairs = pairs.group_by(exp.column(UNIT), *key_columns(n_keys), copy=False)
    if not n_keys:
        return from_(outer, sub(pairs, "__pairs"))
    if hashed.chosen:  # ranked by hash, then keys (Hashed.group_order): max_groups exactly
        rank = window("ROW_NUMBER", [exp.column(UNIT)], hashed.group_order("__h"))
        ranked = new_select(exp.Star(), exp.alias_(rank, "__gr", copy=False))
        within = exp.LTE(this=exp.column("__gr"), expression=integer(settings.max_groups))
        bounded = from_(outer, sub(from_(ranked, named_table("__pairs")), "__ranked"))
        bounded = bounded.where(within, copy=False).group_by(*key_columns(n_keys), copy=False)
        return with_named(bounded, ("__pairs", pairs))
    # the max_groups-th smallest group hash of each unit: its groups up to it are kept
    cut = func("LIST_MAX", func("MIN", exp.column("__h"), integer(settings.max_groups)))
    units = from_(new_select(exp.column(UNIT), exp.alias_(cut, "__cut", copy=False)),
                  named_table("__pairs"))  # fmt: skip
    units = units.group_by(exp.column(UNIT), copy=False)
    within = exp.LTE(this=exp.column("__h"), expression=exp.column("__cut"))
    bounded = from_(outer, named_table("__pairs"))
    bounded.append("joins", join_using(sub(units, "__units"), UNIT))
    bounded = bounded.where(within, copy=False).group_by(*key_columns(n_keys), copy=False)
    return with_named(bounded, ("__pairs", pairs))


def _kept_values(column: str, r: exp.Literal) -> exp.Expr:
    """The at most ``r`` smallest distinct non-NULL values of ``column`` in a (unit, group)."""
    values = func("LIST_DISTINCT", exp.ArrayAgg(this=exp.column(column)))
    return func("LIST_SLICE", func("LIST_SORT", values), exp.Literal.number(1), r.copy())


def _at_most(value: exp.Expr, r: exp.Literal) -> exp.Expr:
    return exp.Case(ifs=[exp.If(this=exp.GT(this=value, expression=r.copy()), true=r.copy())],
                    default=value.copy())  # fmt: skip


def _scaled(total: exp.Expr, count: exp.Expr, r: exp.Literal) -> exp.Expr:
    """``total`` when ``count <= R``, else ``round(total * R / count)``."""
    scaled = exp.Div(
        this=exp.Mul(this=cast(total.copy(), DOUBLE), expression=r.copy()),
        expression=count.copy(),
    )
    return exp.Case(
        ifs=[exp.If(this=exp.GT(this=count, expression=r.copy()),
                    true=cast(func("ROUND", scaled), HUGEINT))],
        default=total,
    )  # fmt: skip


def histogram_cells(rows: exp.Select, n_keys: int, bins: exp.Expr, settings, order: Hashed,
                    *, ranked: bool):  # fmt: skip
    """Quantile histograms: rows per (keys, bin), each unit bounded to ``max_groups`` groups and
    ``max_rows`` rows per group, chosen by keyed ranks (windows over rows)."""
    source = sub(copy_tree(rows), "__rows")
    hist = new_select(*key_columns(n_keys), exp.alias_(bins, "__bin", copy=False),
                      exp.alias_(exp.Count(this=exp.Star()), "__count", copy=False))  # fmt: skip
    if ranked:
        group_order = [order.groups(exp.column("__rk")), *(exp.column(k) for k in order.keys)
                       ] if n_keys else [exp.Literal.number(0)]  # fmt: skip
        row_order = order.row_order(keys=False)
        ranking = new_select(
            exp.Star(),
            exp.alias_(window("DENSE_RANK", [exp.column(UNIT)], group_order), RANK_GROUP,
                       copy=False),
            exp.alias_(window("ROW_NUMBER", [exp.column(UNIT), *key_columns(n_keys)], row_order),
                       RANK_ROW, copy=False),
        )  # fmt: skip
        ranking = from_(ranking, source)
        within = exp.and_(
            exp.LTE(this=exp.column(RANK_GROUP), expression=integer(settings.max_groups)),
            exp.LTE(this=exp.column(RANK_ROW), expression=integer(settings.max_rows)),
            copy=False,
        )
        hist = from_(hist, sub(ranking, "__ranked")).where(within, copy=False)
    else:
        hist = from_(hist, source)
    return hist.group_by(*key_columns(n_keys), exp.column("__bin"), copy=False)


def grid_rounded(column: str, bounding: Bounding) -> exp.Expr:
    """The value in grid units, round(x / g), before clamping."""
    g = bounding.granularity
    value = cast(exp.column(column), DOUBLE)
    if g != 1:
        value = exp.Div(this=value, expression=exp.Literal.number(decimal(g)))
    return func("ROUND", value)


def _grid_units(column: str, bounding: Bounding) -> exp.Expr:
    """The clamped value in integer grid units: round(x / g) clamped to [lower/g, upper/g]."""
    g = bounding.granularity
    rounded = grid_rounded(column, bounding)
    lo, hi = integer(bounding.lower / g), integer(bounding.upper / g)  # Bounding checks the grid
    clamped = exp.Case(
        ifs=[
            exp.If(this=exp.LT(this=rounded.copy(), expression=lo), true=lo.copy()),
            exp.If(this=exp.GT(this=rounded.copy(), expression=hi), true=hi.copy()),
        ],
        default=rounded,
    )
    return cast(clamped, BIGINT)


def _squared(units: exp.Expr) -> exp.Expr:
    return exp.Mul(this=cast(units, HUGEINT), expression=units.copy())


def histogram_bins(bounding: Bounding, column: str) -> exp.Expr:
    """The quantile bin j = clamped grid value - lower/g, in 0..(upper - lower)/g."""
    offset = bounding.lower / bounding.granularity
    return exp.Sub(this=_grid_units(column, bounding), expression=integer(offset))
