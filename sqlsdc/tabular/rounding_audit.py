"""The attacker's view of a controlled rounding: how far each sensitive cell can be placed.

A reader of a table published by :func:`~sqlsdc.tabular.rounding.controlled_round` (every cell,
margins included, at an adjacent multiple of the base b, zero-restricted) knows of every cell j
its published R_j and that the original x_j lies strictly within b of it (Salazar González, PSD
2006, eqs. 2-3: ``⌊a_j⌋ ≤ k_j ≤ ⌈a_j⌉``, digest ``seed_2006_tabular.md`` §3; a margin the
relaxation moved beyond its adjacent multiples within ``b + max_excess``), that the originals
add up (``A x = 0``) and the public bounds: ``x ≥ 0`` in a table without negative contributions
(counts, and sums of non-negative values), whole numbers where every value is one (the window
is then ``R ± (b − 1)``), the exact value of cells known otherwise (``known``), and 0 for an
empty cell (it is no cell of the :class:`~sqlsdc.tabular.model.Table`: a zero everybody knows).
The cell's interval is ``[min x_i, max x_i]`` over that polytope, an LP (two solves per
sensitive cell, GLOP warm-started), the attacker of :mod:`sqlsdc.tabular.attacker` with every
cell "suppressed" within its window: :class:`~sqlsdc.tabular.attacker.ProtectionCheck`
decides whether each sensitive cell's interval reaches its upper and lower protection levels
(Giessing & Dittrich's criterion, PSD 2006; the LP stops as soon as a feasible table reaches a
level, the true table being one).

**What additivity adds.** For a table whose cells are all published, additivity never narrows a
window beyond ``[max(R − b, public lower bound), R + b]``: raising (lowering) the inner cell i
and every margin above it by b keeps every equation ``margin = Σ children`` (each holds exactly
one cell of the chain on each side) and stays within every window, and a margin above i has
``R ≥ R_i`` in a non-negative table, so it can go down as far as i. So the per-cell check
(``jobs.adjust``'s before s42) missed only the public bounds — a cell rounded to 0 lies in
``[0, b)``, not ``(−b, b)``; whole numbers lie within b − 1 — and the margins the relaxation
moved, which it skipped. The chain's table is integral when the windows are, so for whole
numbers the LP bound is attained by an integer table and is the integer attacker's too (no gap
of Onn's kind, PSD 2006): the audit solves LPs only (with ``integer``, CP-SAT on a 10^4-cell
3-D table of whole numbers ran out of time on every cell). With ``known`` cells the LP bound
is an outer bound of the integer attacker's. The LP audit is still what decides: it reads the
table as the attacker does, so it holds for known cells, linked tables and any later change of
what is published, which the per-cell reasoning would have to be re-proven for.

**What it does not model.** A reader who knows the job minimised the distance (most cells go
to the nearer multiple) can bet that ``|x − R| ≤ b/2`` for most cells; that is a probability,
not a bound, and no interval can hold it. A larger base, or CTA / suppression, is the remedy.
Contributions of both signs change nothing here: the windows are of the published multiples of
an integer base, with no noise lattice in their bits (the CKM side's
:func:`~sqlsdc.mechanisms.ptable_build.narrowest_window` is where both signs matter).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from sqlsdc.errors import TabularError
from sqlsdc.tabular.attacker import ProtectionCheck
from sqlsdc.tabular.model import Table

__all__ = ["RoundingAudit", "audit_rounding", "rounding_windows"]


@dataclass(frozen=True)
class RoundingAudit:
    """Which sensitive cells a rounded table leaves protected.

    Attributes:
        protected: bool[C], per cell: ``False`` for a sensitive cell whose attacker's interval
            misses a protection level (or was not decided within the time limit); ``True`` for
            every other cell.
        timed_out: the time limit decided some cell (as not protected).
        cpu_seconds: CPU time of the audit (``time.process_time``).
    """

    protected: np.ndarray
    timed_out: bool
    cpu_seconds: float

    @property
    def exposed(self) -> np.ndarray:
        """Positions of the sensitive cells not protected."""
        return np.flatnonzero(~self.protected)


def rounding_windows(
    table: Table,
    rounded: np.ndarray,
    base: int,
    *,
    relaxed: np.ndarray | None = None,
    max_excess: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Each cell's bounds as a reader of the rounded table knows them: ``(lower, upper,
    integer)``.

    ``R ± b`` (``R ± (b + max_excess)`` on the ``relaxed`` margins), within ``[0, ∞)`` when
    the table has no negative contribution; ``R ± (b − 1)`` and ``integer`` when every original
    and every published value is a whole number (an original strictly within b of R: a
    multiple of b is published as itself, the zero restriction). The open bounds of non-integer
    values are their suprema: the attacker's interval reaches them in the limit.
    """
    values = table.values
    r = np.asarray(rounded, dtype=np.float64)
    if r.shape != values.shape:
        raise TabularError(f"rounded must hold {values.size} values in table order")
    inner = table.cells["is_inner"].to_numpy(bool)
    relaxed = np.zeros(r.size, dtype=bool) if relaxed is None else np.asarray(relaxed, bool)
    width = np.where(relaxed & ~inner, base + float(max_excess), float(base))
    integer = bool(
        np.all(values == np.round(values))
        and np.all(width == np.round(width))
        and np.all(r == np.round(r))
    )
    if integer:
        width = width - 1.0
    lower, upper = r - width, r + width
    if not table.negative:
        lower = np.maximum(lower, 0.0)
    return lower, upper, integer


def audit_rounding(
    table: Table,
    rounded: np.ndarray,
    base: int,
    sensitive: np.ndarray,
    upl: np.ndarray,
    lpl: np.ndarray,
    *,
    relaxed: np.ndarray | None = None,
    max_excess: float = 0.0,
    known: np.ndarray | None = None,
    time_limit: float = 60.0,
) -> RoundingAudit:
    """Check every ``sensitive`` cell of a rounded table against its protection levels, as the
    attacker of the module docstring sees the table (published windows, additivity, public
    bounds, ``known`` cells exactly).

    Args:
        table: the original table (its values are the truth the intervals must contain).
        rounded: the published values in table order. base: the rounding base.
        sensitive: bool[C]. upl, lpl: float64[C], the levels the rules set.
        relaxed, max_excess: margins the rounding moved beyond their adjacent multiples, and
            how far at most (:class:`~sqlsdc.tabular.rounding.RoundingResult`).
        known: bool[C] or None: cells whose original a reader knows exactly (public margins).
        time_limit: seconds for the whole audit; a cell not decided in time is not protected.

    Example:
        A row of two cells, 4 and 8, and its total 12, rounded to base 5 as 5, 10 and 15: the
        first lies in [1, 9] (whole numbers within 5 of 5), and so it does in the table; a
        reader who knows the second is 8 reads it from the total (at least 11) as at least 3,
        1 below its value, short of its lower protection level of 2:

        >>> from scipy import sparse
        >>> import pandas as pd
        >>> cells = pd.DataFrame({"is_inner": [False, True, True], "value": [12.0, 4.0, 8.0]})
        >>> A = sparse.csr_matrix(np.array([[1.0, -1.0, -1.0]]))
        >>> table = Table(cells, ("c",), {"c": None}, None, A, np.array([1, 2]))
        >>> levels = np.array([0.0, 2.0, 0.0])
        >>> audit_rounding(table, np.array([15, 5, 10]), 5, np.array([False, True, False]),
        ...                levels, levels).protected.tolist()
        [True, True, True]
        >>> audit_rounding(table, np.array([15, 5, 10]), 5, np.array([False, True, False]),
        ...                levels, levels, known=np.array([False, False, True])).exposed.tolist()
        [1]
    """
    started = time.process_time()
    n = len(table.cells)
    sensitive = np.asarray(sensitive, dtype=bool)
    protected = np.ones(n, dtype=bool)
    targets = np.flatnonzero(sensitive)
    if targets.size == 0:
        return RoundingAudit(protected, False, time.process_time() - started)
    lower, upper, _ = rounding_windows(table, rounded, base, relaxed=relaxed,
                                       max_excess=max_excess)  # fmt: skip
    values = table.values
    outside = (values < lower) | (values > upper)
    if outside.any():  # the rounding broke its own windows: verification should have refused
        raise TabularError(
            f"{int(outside.sum())} cell(s) lie outside the window of their published multiple; "
            "the rounding is not the one the audit reads"
        )
    hidden = np.ones(n, dtype=bool) if known is None else ~np.asarray(known, dtype=bool)
    check = ProtectionCheck(table.A, values, upl, lpl, lower=lower, upper=upper)
    met = np.zeros(targets.size, dtype=bool)
    open_ = hidden[targets]  # a known sensitive cell is exposed as it stands
    if open_.any():
        met[open_] = check.met(hidden, targets[open_], time_limit=time_limit)
    protected[targets] = met
    return RoundingAudit(protected, bool(check.timed_out), time.process_time() - started)
