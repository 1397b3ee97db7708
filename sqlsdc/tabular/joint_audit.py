"""The attacker's LP over a universe's unit counts and one measure's sums together.

The query path protects the counts and each measure as tables of their own
(:func:`sqlsdc.tabular.universe_pattern.protect_universe`); a measure's audit knows the
counts only as a box per cell (at most ``hi`` times the largest count the published counts
allow, red team s44i). An analyst who reads the policy's ``bounds: [lo, hi]`` links the two
tables cell by cell: ``sum <= hi * count`` (and ``sum >= lo * count`` for ``lo <= 0``), with
the additivity of both over the same hierarchy. The box lets every hidden count sit at its own
maximum at once; the counts' margins do not. Red team s45g, 3 x 3 employees in [0, 50]: the
counts of (B, R2) and (C, R2) add up to 4 (published margin), so their employees to at most
200 where the box allowed 300, which put (A, R2)'s employees at 22 or more and (A, R1)'s, in
the same row, at 63 or less, short of the 83.3 its dominance rule asks; and the other way, a
sum's lower bound bounds its count from below (``count >= sum / hi``), which narrowed counts
of 2 firms to [1, 2]. :func:`widening` finds the primaries this joint LP leaves short and
picks cells whose hiding (count and sum) widens them again.

The LP is the attacker's relaxation; counts' bounds are rounded to integers (ceil/floor), as
an attacker would. A solver that stops without an optimum counts as a shortfall (fail closed).
The time limit is CPU time of this process (a loaded machine does not turn a pattern into a
refusal; each LP gets at least 2 s of wall time).
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
from ortools.linear_solver import pywraplp
from scipy import sparse
from scipy.optimize import linprog

from sqlsdc.errors import InternalError

_TOL = 1e-7


@dataclasses.dataclass(frozen=True)
class Side:
    """One aggregate of the universe as the joint audit reads it: cell values (true), which
    are hidden, the a-priori bounds its own audit used, and its primaries' protection levels
    (as that audit clipped them)."""

    values: np.ndarray
    hidden: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    primary: np.ndarray
    upl: np.ndarray
    lpl: np.ndarray


class JointLP:
    """The attacker's LP over counts ``x`` and sums ``y`` of the same cells (``A x = 0``,
    ``A y = 0``, published cells fixed, ``y <= hi' x`` and, for ``lo <= 0``, ``y >= lo' x``
    per cell, where ``hi'``/``lo'`` are the policy's bounds widened to each cell's true mean so
    that the data never contradict them: a unit of several rows may sum past ``hi``). Callers
    pass ``hi >= 0``: below 0, a unit without a value (adding 0, not ``hi``) breaks the link."""

    def __init__(self, A, counts: Side, sums: Side, bound: tuple[float, float]):
        self.counts, self.sums = counts, sums
        C = self.C = len(counts.values)
        lo, hi = bound
        units, total = counts.values.astype(float), sums.values.astype(float)
        # GLOP's tolerances are absolute: sums in units of a power of two near their largest
        # (a margin of float sums misses its cells' total by ~1e-7, infeasible unscaled)
        big = float(np.abs(total).max()) if len(total) else 1.0
        self.unit = 2.0 ** math.frexp(big)[1] if big > 1.0 else 1.0
        solver = pywraplp.Solver.CreateSolver("GLOP")
        if solver is None:  # pragma: no cover - OR-Tools ships GLOP
            raise InternalError("OR-Tools was built without GLOP")
        inf = solver.infinity()
        self.v = [solver.NumVar(-inf, inf, "") for _ in range(2 * C)]
        A = sparse.csr_matrix(A)
        for offset in (0, C):  # A x = 0, A y = 0
            for r in range(A.shape[0]):
                row = solver.Constraint(0.0, 0.0)
                part = slice(A.indptr[r], A.indptr[r + 1])
                for c, a in zip(A.indices[part].tolist(), A.data[part].tolist(), strict=True):
                    row.SetCoefficient(self.v[offset + c], a)
        some = units > 0
        mean = np.divide(total, units, out=np.zeros(C), where=some)
        for c in np.flatnonzero(some).tolist():
            link = solver.Constraint(-inf, 0.0)  # y_c - hi' x_c <= 0
            link.SetCoefficient(self.v[C + c], 1.0)
            link.SetCoefficient(self.v[c], -max(hi, mean[c]) / self.unit)
            if lo <= 0:  # lo' x_c - y_c <= 0 (for lo > 0, units without a value add nothing)
                floor = solver.Constraint(-inf, 0.0)
                floor.SetCoefficient(self.v[C + c], -1.0)
                floor.SetCoefficient(self.v[c], min(lo, mean[c]) / self.unit)
        self.solver, self.inf, self.last = solver, inf, None
        self.current = np.full((2 * C, 2), np.nan)

    def bounds(self, hidden_counts: np.ndarray, hidden_sums: np.ndarray) -> np.ndarray:
        """Variable bounds: published cells fixed to their values, hidden ones in their
        a-priori ranges (sums in the LP's unit)."""
        out = np.empty((2 * self.C, 2))
        pairs = ((self.counts, hidden_counts), (self.sums, hidden_sums))
        for k, (side, hidden) in enumerate(pairs):
            part = slice(k * self.C, (k + 1) * self.C)
            v = side.values.astype(float)
            scale = 1.0 if k == 0 else self.unit
            out[part, 0] = np.where(hidden, side.lower, v) / scale
            out[part, 1] = np.where(hidden, side.upper, v) / scale
        return out

    def extreme(self, var: int, sense: int, bounds: np.ndarray, time_limit: float) -> float | None:
        """min (sense 1) or max (sense -1) of one variable; inf when unbounded; None when the
        solver gave no optimum. The model is solved again from its last basis, only the
        objective and the bounds that changed set anew."""
        changed = np.flatnonzero(np.any(bounds != self.current, axis=1))
        for j in changed.tolist():
            low, high = bounds[j]
            self.v[j].SetBounds(-self.inf if np.isinf(low) else float(low),
                                self.inf if np.isinf(high) else float(high))  # fmt: skip
        self.current = bounds.copy()
        objective = self.solver.Objective()
        if self.last is not None and self.last != var:
            objective.SetCoefficient(self.v[self.last], 0.0)
        objective.SetCoefficient(self.v[var], 1.0)
        self.last = var
        if sense > 0:
            objective.SetMinimization()
        else:
            objective.SetMaximization()
        self.solver.SetTimeLimit(max(2000, int(time_limit * 1000)))
        status = self.solver.Solve()
        if status == pywraplp.Solver.UNBOUNDED:
            return math.inf * -sense
        if status != pywraplp.Solver.OPTIMAL:  # GLOP tells an unbounded LP apart not always
            return self._highs(var, sense, bounds, time_limit)
        return float(objective.Value()) * (1.0 if var < self.C else self.unit)

    def _highs(self, var: int, sense: int, bounds: np.ndarray, time_limit: float):
        """The same LP solved by HiGHS from scratch (status 3: unbounded), or None."""
        rows, cols, vals, lower, upper = [], [], [], [], []
        for r, con in enumerate(self.solver.constraints()):
            for j, v in enumerate(self.v):
                a = con.GetCoefficient(v)
                if a:
                    rows.append(r)
                    cols.append(j)
                    vals.append(a)
            lower.append(con.lb())
            upper.append(con.ub())
        matrix = sparse.csr_matrix((vals, (rows, cols)), shape=(len(lower), len(self.v)))
        lower, upper = np.array(lower), np.array(upper)
        lower[lower <= -self.inf], upper[upper >= self.inf] = -np.inf, np.inf
        c = np.zeros(len(self.v))
        c[var] = sense
        up, down = np.isfinite(upper), np.isfinite(lower)  # rows bounded above, below
        res = linprog(c, A_ub=sparse.vstack([matrix[up], -matrix[down]]),
                      b_ub=np.r_[upper[up], -lower[down]],
                      bounds=[(None if np.isinf(a) else a, None if np.isinf(b) else b)
                              for a, b in bounds],
                      method="highs", options={"time_limit": max(time_limit, 2.0)})  # fmt: skip
        if res.status == 3:
            return math.inf * -sense
        if res.status != 0:
            return None
        return float(sense * res.fun) * (1.0 if var < self.C else self.unit)


def _targets(lp: JointLP):
    """(variable, side, cell) of every hidden primary."""
    for k, side in enumerate((lp.counts, lp.sums)):
        for c in np.flatnonzero(side.primary & side.hidden):
            yield k * lp.C + c, side, c, k == 0


def _short(lp: JointLP, var, side, c, integer, bounds, deadline) -> float:
    """How far the joint LP leaves primary ``c`` short of its levels (0: protected; inf: no
    optimum in time)."""
    v = float(side.values[c])
    lo = lp.extreme(var, 1, bounds, deadline - time.process_time())
    hi = lp.extreme(var, -1, bounds, deadline - time.process_time())
    if lo is None or hi is None:
        return math.inf
    if integer:
        lo = math.ceil(lo - 1e-6) if math.isfinite(lo) else lo
        hi = math.floor(hi + 1e-6) if math.isfinite(hi) else hi
    tol = _TOL * max(1.0, abs(v) + side.upl[c] + side.lpl[c])
    short = max(0.0, v + side.upl[c] - tol - hi, lo - (v - side.lpl[c] + tol))
    return short if hi - lo > tol else max(short, tol + 1.0)


def widening(A, counts: Side, sums: Side, bound, forced: np.ndarray, cost: np.ndarray,
             time_limit: float) -> tuple[np.ndarray, bool]:  # fmt: skip
    """Cells to hide (count and sum) so that every primary the joint LP leaves short reaches
    its levels: for each short primary in turn, the cheapest published cell (``cost``, not
    ``forced``) whose hiding protects it, else the one that brings it closest (greedy, as the
    interval step of ``gauss`` visits published cells in cost order). Returns those cells
    (none when no primary is short) and whether a short primary found no cell that widens it
    (the caller then refuses). The caller protects both tables again with the cells kept
    hidden and checks again: hiding cells never narrows an interval."""
    lp = JointLP(A, counts, sums, bound)
    deadline = time.process_time() + time_limit
    hc, hs = counts.hidden.copy(), sums.hidden.copy()
    added = np.zeros(lp.C, dtype=bool)
    stuck = False
    for var, side, c, integer in list(_targets(lp)):
        if time.process_time() > deadline:
            return added, True  # out of time: the caller refuses (fail closed)
        gap = _short(lp, var, side, c, integer, lp.bounds(hc, hs), deadline)
        if gap == 0:
            continue
        order = sorted(np.flatnonzero((~hc | ~hs) & ~forced), key=lambda j: (cost[j], j))
        best = _cheapest(lp, (var, side, c, integer), hc, hs, [(j,) for j in order], gap, deadline)
        if best is None:  # a count the margins pin needs two cells hidden (s45g: C's row)
            pairs = [(a, b) for i, a in enumerate(order[:PAIRS]) for b in order[i + 1 : PAIRS]]
            best = _cheapest(lp, (var, side, c, integer), hc, hs, pairs, gap, deadline)
        if best is None:
            stuck = True  # nothing widens it: the caller refuses
            continue
        for j in best:
            added[j] = hc[j] = hs[j] = True
    return added, stuck


PAIRS = 40  # the cheapest cells tried two at a time when no one cell widens a primary


def _cheapest(lp, target, hc, hs, groups, gap, deadline):
    """The first group of cells (in the order given) whose hiding protects ``target``, else
    the one that narrows its shortfall most, else None."""
    var, side, c, integer = target
    best, best_gap = None, gap
    for group in groups:
        if time.process_time() > deadline:
            break
        tc, ts = hc.copy(), hs.copy()
        tc[list(group)] = ts[list(group)] = True
        g = _short(lp, var, side, c, integer, lp.bounds(tc, ts), deadline)
        if g < best_gap - _TOL:
            best, best_gap = group, g
            if g == 0:
                break
    return best
