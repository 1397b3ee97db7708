"""The interval of each suppressed sum a reader of a suppression job's table can derive.

A suppression job stores, beside every suppressed cell, ``lower_bound``/``upper_bound``: the
interval an attacker derives from the published cells, released with the table (``sqlsdc
publish``, ``releases:``). The pattern's own audit computes intervals too, but with a-priori
bounds the protection may assume and a reader does not know: a sum's box is ``hi`` times the
cell's *true* unit count ``n`` (:func:`sqlsdc.jobs.sum_counts.measure_bounds`), which is right
for deciding the pattern (it protects against more, never less) and wrong to publish: where
that cap binds, ``upper_bound / hi`` is the hidden ``n``. Red team s47j: turnover in [0, 1000],
8 of 8 hidden inner cells showed ``upper_bound = 1000 n``, among them a count of 2 firms that
``freq:3`` hides and a single firm (and the lower bounds followed from those caps).

Here the interval is the reader's own: one LP over the table's unit counts and sums together
(:class:`sqlsdc.tabular.joint_audit.JointLP`), the published ``n`` and sums fixed, every
listed inner cell at least one unit, ``sum <= hi * n`` per cell, a sum at least 0 when the
measure's ``lo`` is (its floor ``lo * n`` otherwise) — nothing taken from a hidden cell's
data. An unbounded side is stored as infinite; a bound the solver does not reach as NULL
(unknown), never as the audit's.
"""

from __future__ import annotations

import math

import numpy as np

from sqlsdc.tabular.model import Table


def reader_intervals(
    table: Table,
    sum_hidden: np.ndarray,
    n_hidden: np.ndarray,
    listed: np.ndarray,
    bound: tuple[float, float],
    time_limit: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``(lower, upper)`` of every cell of a sum job's ``table``, NaN where the sum is shown.

    ``sum_hidden``/``n_hidden``: cells whose sum / unit count the output hides; ``listed``:
    each cell's least unit count a reader knows (the inner cells it adds up); ``bound``: the
    policy's ``[lo, hi]`` of the measure (without a finite ``hi >= 0``, or when a cell breaks
    the link, the margins and the bounds' signs only: :func:`_box_intervals`)."""
    lo, hi = bound
    units = np.asarray(table.n, dtype=float)
    values = table.values.astype(float)
    if not 0 <= hi < math.inf or not _linked(values, units, lo, hi):
        return _box_intervals(table, sum_hidden, lo, hi, time_limit)
    from sqlsdc.tabular.joint_audit import JointLP, Side

    C = len(table.cells)
    none = np.zeros(C, dtype=bool)
    zero = np.zeros(C)
    # the hidden cells as the reader sees them: no value (1 unit, sum 0 give the LP's link
    # the policy's hi, not the cell's true mean), only their a-priori ranges
    counts = Side(values=np.where(n_hidden, 1.0, units), hidden=n_hidden,
                  lower=np.asarray(listed, dtype=float), upper=np.full(C, np.inf),
                  primary=none, upl=zero, lpl=zero)  # fmt: skip
    sums = Side(values=np.where(sum_hidden, 0.0, values), hidden=sum_hidden,
                lower=np.full(C, 0.0 if lo >= 0 else -np.inf), upper=np.full(C, np.inf),
                primary=none, upl=zero, lpl=zero)  # fmt: skip
    lp = JointLP(table.A, counts, sums, bound)
    box = lp.bounds(n_hidden, sum_hidden)
    lower, upper = np.full(C, np.nan), np.full(C, np.nan)
    for c in np.flatnonzero(sum_hidden).tolist():
        low = lp.extreme(C + c, 1, box, time_limit)
        high = lp.extreme(C + c, -1, box, time_limit)
        lower[c] = np.nan if low is None else low  # -inf, inf: unbounded; NULL: no optimum
        upper[c] = np.nan if high is None else high
    return lower, upper


def _linked(values: np.ndarray, units: np.ndarray, lo: float, hi: float) -> bool:
    """Whether every cell keeps ``sum <= hi * n`` (and ``sum >= lo * n`` for ``lo <= 0``),
    the link the reader's LP assumes. A unit of several rows may sum past ``hi``; then the
    link would put the interval beside the truth, and the margins alone give it (one fact
    about the whole table, never a cell's value)."""
    slack = 1e-9 * np.maximum(1.0, np.abs(values))
    if np.any(values > hi * units + slack):
        return False
    return lo > 0 or not np.any(values < lo * units - slack)


def _box_intervals(table: Table, sum_hidden: np.ndarray, lo: float, hi: float, time_limit: float):
    """The attacker's intervals from the published sums and the signs the bounds give every
    sum (at least 0 for ``lo >= 0``, at most 0 for ``hi <= 0``), for bounds without a finite
    ``hi >= 0`` (no ``sum <= hi * n`` link)."""
    from sqlsdc.tabular.attacker import audit_intervals

    C = len(table.cells)
    found = audit_intervals(table.A, table.values.astype(float), sum_hidden,
                            lower=np.full(C, 0.0 if lo >= 0 else -np.inf),
                            upper=np.full(C, 0.0 if hi <= 0 else np.inf),
                            time_limit=time_limit)  # fmt: skip
    return np.where(sum_hidden, found.lo, np.nan), np.where(sum_hidden, found.hi, np.nan)
