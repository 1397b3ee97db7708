"""The bounding report of a DP stage as SQL: per cell, the input rows the caps dropped, kept
but clamped, and kept.

With ``dp.bounding_report`` the exact cells also carry these three sums, each row weighted
1/(its unit's rows), which :func:`sqlsdc.mechanisms.accountant.calibrate_report` noises once
as one vector of sensitivity 1 and the cursor releases as the shares of input dropped and
clamped next to each cell's noise interval. The choices of which rows are dropped are those of
:mod:`sqlsdc.rewrite.dp_bounding`, repeated here on the rows before any cap.
"""

from __future__ import annotations

from fractions import Fraction

from sqlglot import exp

from sqlsdc.engines.trees import copy_tree
from sqlsdc.mechanisms.accountant import REPORT_GRID, Bounding
from sqlsdc.rewrite.dp_bounding import Hashed, capped_rank, grid_rounded
from sqlsdc.rewrite.dp_sql import (
    BIGINT,
    UNIT,
    cast,
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


def bounding_report(rows: exp.Select, n_keys: int, settings, clamps: dict[str, Bounding],
                    names: list[str], order: Hashed) -> exp.Select:  # fmt: skip
    """Per cell, how much of its input the bounding removed or clamped: the exact statistics of
    the bounding report (:func:`sqlsdc.mechanisms.accountant.calibrate_report`).

    ``rows`` are the query's rows before any cap. A row of unit u is *dropped* when the caps
    remove it — the per-unit row cap (the same keyed choice as :func:`.unit_row_cap`), the
    groups beyond ``max_groups`` (the same choice by ``hash(record key, keys)`` as
    :func:`.bounded_pairs`) or the rows beyond ``max_rows`` in a group (a unit with c > R rows
    there keeps R rows' worth, so c - R are dropped) — *clamped* when it is kept and one of the
    aggregation's bounded measures lies outside its bounds on the grid (in a group with c > R
    rows, R/c of its clamped rows), and *kept* otherwise. Each row weighs
    ``REPORT_GRID / n_u`` (n_u: the unit's rows in the query), each (unit, cell) sum rounded
    down, so a unit adds at most ``REPORT_GRID`` over all cells and parts: the report's
    sensitivity. The three sums are the columns ``names``, in :data:`REPORT_PARTS` order (a
    None name: that sum is left out).
    """
    kept = exp.true()
    if settings.max_rows_per_unit is not None:
        cap = settings.max_rows_per_unit
        source, rank = capped_rank(copy_tree(rows), order, cap, settings.max_rows)
        kept = exp.LTE(this=rank, expression=integer(cap))
    else:
        source = copy_tree(rows)
    outside = [
        exp.or_(
            exp.LT(this=grid_rounded(column, b), expression=integer(b.lower / b.granularity)),
            exp.GT(this=grid_rounded(column, b), expression=integer(b.upper / b.granularity)),
            copy=False,
        )
        for column, b in clamps.items()
    ]
    clamped = (func("COALESCE", exp.or_(*outside, copy=False), exp.false()) if outside
               else exp.false())  # fmt: skip
    flagged = new_select(exp.column(UNIT), exp.column("__rk"), *key_columns(n_keys),
                         exp.alias_(kept, "__keep", copy=False),
                         exp.alias_(clamped, "__clamp", copy=False))  # fmt: skip
    flagged = from_(flagged, sub(source, "__rows"))

    def count_if(condition: exp.Expr) -> exp.Expr:
        return exp.Sum(this=exp.Case(ifs=[exp.If(this=condition, true=exp.Literal.number(1))],
                                     default=exp.Literal.number(0)))  # fmt: skip

    def keep() -> exp.Expr:
        return exp.column("__keep")

    both = exp.and_(keep(), exp.column("__clamp"), copy=False)
    pairs = new_select(exp.column(UNIT), *key_columns(n_keys),
                       exp.alias_(exp.Count(this=exp.Star()), "__a", copy=False),
                       exp.alias_(count_if(keep()), "__c", copy=False),
                       exp.alias_(count_if(both), "__cl", copy=False))  # fmt: skip
    if n_keys:
        first = func("MIN", exp.Case(ifs=[exp.If(this=keep(), true=exp.column("__rk"))]))
        hashed = exp.Case(ifs=[exp.If(this=exp.GT(this=count_if(keep()), expression=integer(0)),
                                      true=order.groups(first))])  # fmt: skip
        pairs.append("expressions", exp.alias_(hashed, "__h", copy=False))
    pairs = from_(pairs, sub(flagged, "__flagged"))
    pairs = pairs.group_by(exp.column(UNIT), *key_columns(n_keys), copy=False)
    units = new_select(exp.column(UNIT),
                       exp.alias_(exp.Sum(this=exp.column("__a")), "__n", copy=False))  # fmt: skip
    if n_keys and not order.chosen:
        cut = func("LIST_MAX", func("MIN", exp.column("__h"), integer(settings.max_groups)))
        units.append("expressions", exp.alias_(cut, "__cut", copy=False))
    units = from_(units, named_table("__report_pairs")).group_by(exp.column(UNIT), copy=False)
    capped = func("LEAST", exp.column("__c"), integer(settings.max_rows))
    if n_keys:  # the groups bounded_pairs keeps
        within = exp.LTE(this=exp.column("__h"), expression=exp.column("__cut"))
        if order.chosen:  # ranked by hash, then keys
            rank = window("ROW_NUMBER", [exp.column(UNIT)], order.group_order("__h"))
            within = exp.and_(exp.column("__h").is_(exp.null()).not_(),
                              exp.LTE(this=rank, expression=integer(settings.max_groups)),
                              copy=False)  # fmt: skip
        capped = exp.Case(ifs=[exp.If(this=within, true=capped)], default=integer(0))
    g = integer(Fraction(REPORT_GRID))
    a, c, cl, n = (exp.column(x) for x in ("__a", "__c", "__cl", "__n"))
    held = exp.column("__kept")

    def floor_div(top: exp.Expr, bottom: exp.Expr) -> exp.Expr:
        return exp.IntDiv(this=cast(top, BIGINT), expression=cast(bottom, BIGINT))

    def per_kept(part: exp.Expr) -> exp.Expr:  # G * kept * part / (c n), 0 when c = 0
        share = floor_div(
            exp.Mul(this=exp.Mul(this=g.copy(), expression=held.copy()), expression=part),
            exp.Mul(this=c.copy(), expression=n.copy()),
        )
        return exp.Case(ifs=[exp.If(this=exp.GT(this=c.copy(), expression=integer(0)), true=share)],
                        default=integer(0))  # fmt: skip

    dropped = floor_div(exp.Mul(this=g.copy(), expression=exp.paren(exp.Sub(
        this=a.copy(), expression=held.copy()), copy=False)), n)  # fmt: skip
    unclamped = exp.paren(exp.Sub(this=c.copy(), expression=cl.copy()), copy=False)
    parts = (dropped, per_kept(cl.copy()), per_kept(unclamped))
    counts = (exp.column(c) for c in ("__a", "__c", "__cl", "__n"))
    weighed = new_select(*key_columns(n_keys), *counts,
                         exp.alias_(capped, "__kept", copy=False))  # fmt: skip
    weighed = from_(weighed, named_table("__report_pairs"))
    weighed.append("joins", join_using(named_table("__report_units"), UNIT))
    sums = [exp.alias_(exp.Sum(this=p), n, copy=False)
            for p, n in zip(parts, names, strict=True) if n]  # fmt: skip
    report = from_(new_select(*key_columns(n_keys), *sums), sub(weighed, "__weighed"))
    if n_keys:
        report = report.group_by(*key_columns(n_keys), copy=False)
    return with_named(report, ("__report_pairs", pairs), ("__report_units", units))


def join_report(exact: exp.Select, report: exp.Select, n_keys: int) -> exp.Select:
    """The exact cells with the bounding report's columns, matched on every key (NULL = NULL):
    both have one row per group present in the rows."""
    names = [e.alias_or_name for e in report.expressions[n_keys:]]
    joined = new_select(exp.Column(this=exp.Star(), table=exp.to_identifier("__exact")),
                        *(exp.column(n, "__report") for n in names))  # fmt: skip
    joined = from_(joined, sub(exact, "__exact"))
    if not n_keys:
        joined.append("joins", exp.Join(this=sub(report, "__report"), kind="CROSS"))
        return joined
    on = exp.and_(*(
        exp.NullSafeEQ(this=exp.column(f"__g{j}", "__exact"),
                       expression=exp.column(f"__g{j}", "__report"))
        for j in range(n_keys)
    ), copy=False)  # fmt: skip
    joined.append("joins", exp.Join(this=sub(report, "__report"), side="LEFT", on=on))
    return joined
