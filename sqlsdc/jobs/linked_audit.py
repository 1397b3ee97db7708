"""The attacker LP over a suppression job's table and the suppression outputs of the same rows.

Suppression jobs over the same rows of one table keep the cells such outputs hid suppressed
and those they published published, where they find the cells both tables hold
(:func:`sqlsdc.jobs.earlier_suppressions.earlier_suppressions`, by dimension names), and
audit their own pattern. But their tables are linked: every cell of either is a sum of the same
cross-classification of all their dimensions (the cover table), so an attacker who reads both
solves one LP, and cells held under other names (a region table's cells are a geography
table's region subtotals) are not matched by name. Red team s36c: region x education next to
geography x education (``age >= 80``) left primaries narrower than their levels in either
order; before shared cells were kept published, municipality x education and then
municipality x sex left counts of 9 at [1, 11] and of 7 at [1, 9] (the 30 % level asks
for 11.7 and 9.1), each at [1, 237] alone.

:func:`audit_linked` runs that LP (:func:`~sqlsdc.tabular.attacker.audit_intervals`) over
every combination of the codes of the dimensions (non-negative for non-negative tables; a
combination outside a listed inner cell of one table is empty, as its reader knows), with
every published cell of every table known and every listed cell of a count table at least 1,
and refuses the job when one of its primary cells is narrower than its levels; a lower level
asks no more than the listings alone leave open (the LP with every cell hidden). Earlier
outputs whose published values no longer match the data (stored before it changed) are left
out: they are no sums of today's cover table.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import sparse
from sqlglot import exp

from sqlsdc.errors import TabularError
from sqlsdc.jobs.tabulation import job_source, measure_sum
from sqlsdc.tabular.attacker import audit_check, audit_intervals
from sqlsdc.tabular.model import TOTAL

MAX_COVER = 200_000  # combinations of codes the linked audit models (one LP variable each)


def audit_linked(
    con,
    spec,
    levels: dict[str, tuple[str, ...]],
    mine: pd.DataFrame,
    earlier: Sequence[tuple[str, pd.DataFrame]],
    *,
    values: np.ndarray,
    suppressed: np.ndarray,
    primary: np.ndarray,
    upl: np.ndarray,
    lpl: np.ndarray,
    lower: np.ndarray,
    time_limit: float,
    upper: np.ndarray | None = None,
) -> None:
    """Refuse the job when its pattern, read with the ``earlier`` outputs, leaves a primary cell
    narrower than its levels.

    ``mine``: the job's cells (its stored dimension columns, codes as text, ``Total`` at
    totals) in the order of ``values``; ``earlier``: ``(name, stored rows)`` with the same
    dimension coding, a ``value`` column (NULL where suppressed) and ``status``; ``levels``
    maps a stored dimension to the table columns it codes (a hierarchy's levels, coarse to
    fine; a plain column to itself); ``lower`` and ``upper``: the job's cells' a-priori
    bounds (``upper`` None: unbounded; a sum job passes the policy's measure bounds, as to
    :func:`~sqlsdc.tabular.verify.verify_suppression`: red team s44o, s44q).
    """
    frames = [mine, *(f for _n, f in earlier)]
    used = list(dict.fromkeys(d for frame in frames for d in frame.columns if d in levels))
    cover, truth = _cover(con, spec, [levels[d] for d in used])
    blocks = [_members(mine, levels, cover)]
    if not np.allclose(blocks[0] @ truth, values, rtol=1e-9, atol=1e-6):
        raise TabularError(
            "the job's cells could not be matched with the cross-classification of its "
            "dimensions and those of the outputs it shares cells with (NULL codes?); the "
            "pattern cannot be audited together with them"
        )
    n = len(truth)
    nonnegative = bool((truth >= 0).all())
    count = spec.measure is None
    read = [mine]  # the frames audited, in the order of blocks
    known_values = [values]
    known_suppressed = [np.asarray(suppressed, dtype=bool)]
    bounds = [np.asarray(lower, dtype=np.float64)]
    for _name, frame in earlier:
        member = _members(frame, levels, cover)
        theirs = member @ truth
        shown = frame["status"].to_numpy() == "published"
        published = frame["value"].to_numpy(np.float64)
        if not np.allclose(theirs[shown], published[shown], rtol=1e-9, atol=1e-6):
            continue  # stored before the data changed: not a projection of today's cells
        read.append(frame)
        blocks.append(member)
        known_values.append(theirs)
        known_suppressed.append(~shown)
        listed = _inner(frame, levels) & count  # a listed count is at least 1
        bounds.append(np.where(listed, 1.0, 0.0 if nonnegative else -np.inf))
    # a cover cell outside every listed inner cell of one table is empty, as its reader knows
    empty = np.zeros(n, dtype=bool)
    for member, frame in zip(blocks, read, strict=True):
        empty |= np.asarray(member[np.flatnonzero(_inner(frame, levels))].sum(axis=0)).ravel() == 0
    member = sparse.vstack(blocks).tocsr()
    A = sparse.hstack([-member, sparse.identity(member.shape[0], format="csr")]).tocsr()
    cells = np.concatenate([truth, *known_values])
    hidden = np.concatenate([np.ones(n, dtype=bool), *known_suppressed])
    floor = np.concatenate([np.zeros(n) if nonnegative else np.full(n, -np.inf), *bounds])
    floor = np.minimum(floor, cells)  # a bound never above the truth (checked by the LP)
    ceiling = np.concatenate([np.where(empty, 0.0, np.inf), np.full(len(cells) - n, np.inf)])
    at = slice(n, n + len(values))
    if upper is not None:  # never below the truth (checked by the LP)
        ceiling[at] = np.maximum(np.asarray(upper, dtype=np.float64), values)
    # what the listings alone tell (every cell hidden): no protection is asked below that
    known = audit_intervals(A, cells, np.ones(len(cells), dtype=bool), lower=floor,
                            upper=ceiling, time_limit=time_limit)  # fmt: skip
    result = audit_intervals(A, cells, hidden, lower=floor, upper=ceiling,
                             integer=count and bool(np.all(cells == np.round(cells))),
                             time_limit=time_limit)  # fmt: skip
    lpl = np.minimum(lpl, np.maximum(values - known.lo[at], 0.0))
    upl = np.minimum(upl, np.maximum(known.hi[at] - values, 0.0))  # nor above (s44q)
    ok = audit_check(_part(result, at), values, primary, upl, lpl)
    failing = np.asarray(primary, dtype=bool) & np.asarray(suppressed, dtype=bool) & ~ok
    if failing.any():
        names = ", ".join(name for name, _f in earlier)
        example = mine.loc[failing].head(3).to_dict("records")
        raise TabularError(
            f"the job's suppression pattern, read together with {names} (the same rows by other "
            f"dimensions), leaves {int(failing.sum())} primary cell(s) narrower than their "
            f"protection levels, e.g. {example}: an attacker solves one LP over both tables. "
            "Protect these dimensions in one job (one table over all of them), or tabulate "
            "another population"
        )


def _cover(con, spec, groups: list[tuple[str, ...]]) -> tuple[pd.DataFrame, np.ndarray]:
    """The cover table: every combination of the codes of the used dimensions (a hierarchy's
    codes as the level tuples the table holds), as text, and its value from the job's rows
    (0 where no row is). Every combination, not only those the data holds: which are empty
    is what a reader does not know, beyond the cells the tables list."""
    raw = list(dict.fromkeys(c for group in groups for c in group))
    cover = None
    for group in sorted(dict.fromkeys(groups), key=len, reverse=True):  # hierarchies first
        codes = exp.select(*(exp.column(c) for c in group)).distinct().from_(spec.table)
        part = con.sql(codes.sql("duckdb")).df().astype(str)
        part = part[[c for c in part.columns if c not in (cover.columns if cover is not None
                                                              else ())]]  # fmt: skip
        if part.empty or not len(part.columns):
            continue
        part = part.drop_duplicates()
        cover = part if cover is None else cover.merge(part, how="cross")
        if len(cover) > MAX_COVER:
            raise TabularError(
                f"the job's table and the outputs it shares cells with span over {MAX_COVER:,} "
                "combinations of codes, too many to audit together; protect them in one job"
            )
    unit = exp.Count(this=exp.Distinct(expressions=[exp.column(spec.unit)]))
    value = unit if spec.measure is None else measure_sum(spec)
    select = exp.select(*(exp.column(c) for c in raw), exp.alias_(value, "__value"))
    select = job_source(select, spec).group_by(*(exp.column(c) for c in raw))
    if spec.where is not None:
        select = select.where(spec.where.copy())
    found = con.sql(select.sql("duckdb")).df()
    found[raw] = found[raw].astype(str)
    cover = cover[raw].merge(found, on=raw, how="left")
    values = cover.pop("__value").fillna(0).to_numpy(np.float64)
    return cover, values


def _members(frame: pd.DataFrame, levels: dict, cover: pd.DataFrame) -> sparse.csr_matrix:
    """Which cover cells add up to each row of ``frame``: a stored dimension at ``Total``
    takes every cover cell, a code the cover cells whose column of its level holds it (the
    level whose codes hold it). Rows are matched per grouping (which dimensions are at which
    level), each grouping by one merge with the cover table."""
    dims = [d for d in frame.columns if d in levels]
    codes = frame[dims].astype(str).reset_index(drop=True)
    at = pd.DataFrame(index=codes.index)
    for d in dims:
        level = pd.Series(TOTAL, index=codes.index, dtype=object)
        for column in levels[d]:  # coarse to fine: the finest level holding the code
            level = level.mask((codes[d] != TOTAL) & codes[d].isin(set(cover[column])), column)
        at[d] = level
    rows, cols = [], []
    numbered = cover.assign(__cover=np.arange(len(cover)))
    for grouping, members in at.groupby(dims, sort=False):
        keyed = dict(zip(dims, grouping if isinstance(grouping, tuple) else (grouping,),
                         strict=True))  # fmt: skip
        used = {d: c for d, c in keyed.items() if c != TOTAL}
        left = codes.loc[members.index, list(used)].rename(columns=used)
        left = left.assign(__row=members.index.to_numpy())
        pairs = left.merge(numbered[[*used.values(), "__cover"]], on=list(used.values()),
                           how="inner") if used else left.merge(numbered[["__cover"]],
                                                                how="cross")  # fmt: skip
        rows.append(pairs["__row"].to_numpy())
        cols.append(pairs["__cover"].to_numpy())
    data = np.ones(sum(r.size for r in rows))
    return sparse.csr_matrix((data, (np.concatenate(rows), np.concatenate(cols))),
                             shape=(len(frame), len(cover)))  # fmt: skip


def _inner(frame: pd.DataFrame, levels: dict) -> np.ndarray:
    """The rows of ``frame`` that are inner cells (no dimension at its total)."""
    return (frame[[d for d in frame.columns if d in levels]] != TOTAL).all(axis=1).to_numpy()


def _part(result, at: slice):
    """The audit result of the cells in ``at``."""
    return type(result)(result.lo[at], result.hi[at], result.exact[at])
