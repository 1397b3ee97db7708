"""The attacker: feasibility intervals of suppressed cells, and the protection check.

An attacker who sees the published cells of a table, knows that the table adds up (``A @ v == 0``)
and knows a-priori bounds ``lower <= v <= upper`` can narrow every suppressed cell down to the
interval ``[min v_c, max v_c]`` over all tables consistent with that knowledge. These are the
feasibility intervals of τ-ARGUS's audit and of GaussSuppression's ``ComputeIntervals``; the
primary cell is protected when the interval reaches ``upl`` above and ``lpl`` below its true value
(Giessing & Dittrich, PSD 2006, §0 and §4 of ../shared/reference/seed_2006_tabular.md).

How it is computed (all exact to the solver's tolerance, or flagged):

* Published cells are constants: each constraint row becomes ``Σ a_rc v_c = rhs_r`` over the
  suppressed cells only.
* The suppressed cells split into connected components (cells linked by a shared constraint row);
  each component is an independent LP, usually small after GaussSuppression. Large audits can
  solve them in worker processes (``processes``), with the same results.
* Each component is one GLOP model (``pywraplp``, ``use_preprocessing: false``) re-solved with only
  the objective changed, so the simplex warm-starts from the previous optimal basis. GLOP rather
  than HiGHS because OR-Tools' HiGHS interface rebuilds and re-solves the model from scratch on
  every call (about 9 ms per solve against 0.4 ms for GLOP on a 1,100-variable table, measured).
* Every optimal vertex is a feasible table: a cell whose value there reaches its outer bound (its
  a-priori bound, or the single-row bound derived from them) has that bound as its exact min/max,
  and is not solved again. Vertices have many cells at their bounds, so most minima come free.
* GLOP's tolerances are absolute (``1e-8``), so a component with values beyond 2**20 is solved
  in units of a power of two near its largest value (exact in binary floating point): turnover
  tables of 10^10 otherwise end in ``ABNORMAL``.
* ``integer=True`` (count tables): LP bounds can mislead for integer tables (Onn, PSD 2006: the
  LP can certify an entry as uncertain when only one integer table exists). A cell's LP bound is
  exact for integers when the LP optimum is attained at an integral vertex (always in 2-D tables,
  whose matrices are totally unimodular); otherwise CP-SAT minimises / maximises the cell over the
  integer tables, its domain bounded by the LP intervals.
* Everything runs under one wall-clock ``time_limit``. A bound that was not proven optimal in time
  is reported as the best *outer* bound known (valid but possibly too wide) with ``exact = False``;
  :func:`audit_check` never counts such a cell as protected.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from ortools.linear_solver import linear_solver_pb2, pywraplp
from ortools.sat.python import cp_model
from scipy import sparse
from scipy.sparse.csgraph import connected_components

from sqlsdc.errors import InternalError, TabularError

__all__ = ["AuditResult", "ProtectionCheck", "audit_check", "audit_intervals"]

_TOL = 1e-9
_PARALLEL_FROM_CELLS = 20_000  # fewer suppressed cells are audited without worker processes
_LP_UNSCALED = 2.0**20  # largest |value| solved in the table's own units


@dataclass(frozen=True)
class AuditResult:
    """Feasibility intervals per cell: published cells have ``lo = hi = value``.

    Attributes:
        lo, hi: float64[C], the attacker's minimum and maximum of each cell (may be ±inf).
        exact: bool[C], both bounds proven optimal (LP, or CP-SAT when ``integer``); ``False``
            means the bounds are valid outer bounds only, because a time limit stopped the search.
    """

    lo: np.ndarray
    hi: np.ndarray
    exact: np.ndarray


def audit_intervals(
    A,
    values,
    suppressed,
    *,
    lower,
    upper,
    integer: bool = False,
    time_limit: float = 60.0,
    cells=None,
    processes: int = 1,
) -> AuditResult:
    """Feasibility intervals of the suppressed cells, as an attacker computes them.

    For every suppressed cell: the minimum and maximum of its value over all tables ``v`` with the
    published cells at their values, ``A @ v == 0`` and ``lower <= v <= upper``.

    Args:
        A: constraint matrix (R×C), one row per additivity equation.
        values: float64[C], the true cell values (published ones are known to the attacker).
        suppressed: bool[C].
        lower, upper: float64[C], a-priori bounds (``-inf`` / ``inf`` allowed); the true value
            of every suppressed cell must lie within them.
        integer: the cells are counts: bounds over integer tables (CP-SAT where the LP bound is
            not attained at an integral vertex). Needs integral ``A``, values and bounds.
        time_limit: seconds for the whole audit (LP and CP-SAT together).
        cells: bool[C] or None; when given, only these suppressed cells are solved (the
            components without one are skipped); the other suppressed cells keep their
            single-row outer bounds with ``exact = False``.
        processes: worker processes for the components (independent LPs), largest first, when
            they hold at least 20,000 suppressed cells (starting workers costs about 2 s); the
            result is the same as with 1, which solves them in this process. Workers are
            spawned, so a script that uses ``processes > 1`` must guard its top level with
            ``if __name__ == "__main__":``.

    Returns:
        AuditResult with ``lo``, ``hi`` and ``exact`` for every cell.

    Raises:
        TabularError: wrong shapes, a suppressed value outside its a-priori bounds, non-integral
            data with ``integer=True``, or published values that contradict the constraints.

    Example:
        Row r = a + b is published as 10 with a = 3 and b = 7 suppressed:

        >>> A = sparse.csr_matrix(np.array([[-1.0, -1.0, 1.0]]))
        >>> res = audit_intervals(A, np.array([3.0, 7.0, 10.0]), np.array([True, True, False]),
        ...                       lower=np.zeros(3), upper=np.full(3, np.inf))
        >>> res.lo.tolist(), res.hi.tolist(), res.exact.tolist()
        ([0.0, 0.0, 10.0], [10.0, 10.0, 10.0], [True, True, True])
    """
    A, values, sup, lower, upper = _check(A, values, suppressed, lower, upper, integer)
    deadline = time.monotonic() + max(float(time_limit), 0.0)
    lo, hi = values.copy(), values.copy()
    exact = np.ones(len(values), dtype=bool)
    wanted = sup if cells is None else sup & _mask(cells, len(values), "cells")
    cells = np.flatnonzero(sup)
    if cells.size == 0:
        return AuditResult(lo, hi, exact)
    wanted = wanted[cells]
    A_s = A[:, cells].tocsr()
    rhs = -(A[:, ~sup] @ values[~sup])
    active = np.flatnonzero(np.diff(A_s.indptr) > 0)
    A_s, rhs = A_s[active], rhs[active]
    lo[cells], hi[cells] = lower[cells], upper[cells]
    exact[cells] = False
    places, jobs = [], []
    for rows, cols in _components(A_s):
        if not wanted[cols].any():
            continue
        glob = cells[cols]
        places.append(glob)
        sub = A_s[rows][:, cols].tocsr()
        jobs.append((sub, rhs[rows], lower[glob], upper[glob], values[glob], integer, wanted[cols]))
    for glob, (lo_c, hi_c, ok) in zip(
        places, _solve_components(jobs, deadline, processes), strict=True
    ):
        lo[glob], hi[glob], exact[glob] = lo_c, hi_c, ok
    return AuditResult(lo, hi, exact)


def audit_check(result: AuditResult, values, primary, upl, lpl, spl=None) -> np.ndarray:
    """Which cells are protected: every primary cell's interval must be wide enough.

    A primary cell is protected iff its bounds are exact, ``hi >= value + upl``,
    ``lo <= value - lpl``, ``hi - lo >= spl`` and ``hi > lo`` (a cell whose value is known exactly
    is never protected, even with zero protection levels). Infinite bounds count as reaching any
    level. Non-primary cells need no protection and are reported ``True``.

    Args:
        result: from :func:`audit_intervals`.
        values: float64[C]. primary: bool[C]. upl, lpl: float64[C] >= 0.
        spl: float64[C] >= 0 or None (sliding protection level).

    Returns:
        bool[C].

    Example:
        >>> res = AuditResult(np.array([0.0, 4.0]), np.array([10.0, 4.0]), np.array([True, True]))
        >>> audit_check(res, np.array([3.0, 4.0]), np.array([True, True]),
        ...             upl=np.array([2.0, 0.0]), lpl=np.array([2.0, 0.0])).tolist()
        [True, False]
    """
    n = len(result.lo)
    values = _vector(values, n, "values")
    primary = np.asarray(primary, dtype=bool)
    upl, lpl = _vector(upl, n, "upl"), _vector(lpl, n, "lpl")
    spl = np.zeros(n) if spl is None else _vector(spl, n, "spl")
    if primary.shape != (n,):
        raise TabularError(f"primary must be a bool array of length {n}")
    lo, hi = result.lo, result.hi
    tol = _TOL * np.maximum(1.0, np.abs(values) + upl + lpl)
    with np.errstate(invalid="ignore"):
        width = hi - lo
        ok = (
            result.exact
            & (hi >= values + upl - tol)
            & (lo <= values - lpl + tol)
            & (width >= spl - tol)
            & (width > tol)
        )
    return np.where(primary, ok, True)


class ProtectionCheck:
    """Decides :func:`audit_check` for chosen cells under many suppression patterns of one table.

    The attacker is the one of :func:`audit_intervals`; the test is the one of
    :func:`audit_check` (levels reached, interval of positive width), but no interval is computed
    exactly: a bound is solved only while no feasible table seen so far reaches the level (the
    true table is one, every LP vertex another). A level beyond the single-row outer bound fails
    without an LP, an LP optimum short of it fails (the LP bound is an outer bound for integer
    tables too), and with ``integer`` a level reached only at a fractional vertex is settled by
    :func:`audit_intervals`. A time limit counts as not protected.

    One GLOP model of the whole table is kept: a published cell is a variable fixed at its value,
    so a new pattern only changes the bounds of the cells whose status changed and the simplex
    warm-starts from the last basis (``fix_risky_intervals`` asks about hundreds of patterns that
    differ by a cell or two).

    Example:
        >>> A = sparse.csr_matrix(np.array([[-1.0, -1.0, 1.0]]))
        >>> check = ProtectionCheck(A, np.array([3.0, 7.0, 10.0]), np.array([7.0, 4.0, 0]),
        ...     np.array([1.0, 1, 0]), lower=np.zeros(3), upper=np.full(3, np.inf))
        >>> check.met(np.array([True, True, False]), [0, 1]).tolist()
        [True, False]
    """

    def __init__(self, A, values, upl, lpl, *, lower, upper, integer: bool = False):
        none = np.zeros(A.shape[1] if sparse.issparse(A) else 0, dtype=bool)
        self.A, self.values, _, self.lower, self.upper = _check(
            A, values, none, lower, upper, integer
        )
        n = len(self.values)
        self.upl, self.lpl = _vector(upl, n, "upl"), _vector(lpl, n, "lpl")
        self.integer = integer
        self.tol = _TOL * np.maximum(1.0, np.abs(self.values) + self.upl + self.lpl)
        self.lp = _ComponentLP(self.A, np.zeros(self.A.shape[0]), self.values, self.values)
        self.known = np.ones(n, dtype=bool)  # every cell starts fixed at its value
        self.timed_out = False

    def met(self, suppressed, targets, *, time_limit: float = 60.0, stop_early: bool = False):
        """bool[T]: is each target protected when the ``suppressed`` cells are hidden?

        With ``stop_early`` the search ends at the first unprotected target; the targets not
        decided by then read ``False``. ``timed_out`` tells afterwards whether the time limit
        decided a target (as unprotected).
        """
        self.timed_out = False
        deadline = time.monotonic() + max(float(time_limit), 0.0)
        v, n = self.values, len(self.values)
        sup = _mask(suppressed, n, "suppressed")
        targets = np.asarray(targets, dtype=np.int64)
        if not sup[targets].all():
            raise TabularError("ProtectionCheck.met() targets must be suppressed cells")
        changed = np.flatnonzero(sup == self.known)
        self.lp.set_bounds(
            changed,
            np.where(sup[changed], self.lower[changed], v[changed]),
            np.where(sup[changed], self.upper[changed], v[changed]),
        )
        self.known = ~sup
        out_lo, out_hi = v.copy(), v.copy()
        cells = np.flatnonzero(sup)
        A_s = self.A[:, cells].tocsr()
        active = np.diff(A_s.indptr) > 0
        rhs = -(self.A[:, ~sup] @ v[~sup])
        out_lo[cells], out_hi[cells] = _row_bounds(
            A_s[active], rhs[active], self.lower[cells], self.upper[cells]
        )
        goal_hi, goal_lo, tol = v + self.upl, v - self.lpl, self.tol
        reach_lo, reach_hi = v.copy(), v.copy()  # extremes over the feasible tables seen
        failed = (out_hi < goal_hi - tol) | (out_lo > goal_lo + tol) | (out_hi - out_lo <= tol)
        fractional = np.zeros(n, dtype=bool)
        for j in targets.tolist():
            for sense in (+1, -1):
                if failed[j]:
                    break
                if sense > 0:
                    done = reach_hi[j] >= goal_hi[j] - tol[j]
                else:
                    done = reach_lo[j] <= goal_lo[j] + tol[j]
                if done and reach_hi[j] - reach_lo[j] > tol[j]:
                    continue
                if time.monotonic() >= deadline:
                    failed[j] = self.timed_out = True
                    break
                status, val, x = self.lp.optimise(j, sense, deadline)
                if status == "unbounded":
                    if sense > 0:
                        reach_hi[j] = math.inf
                    else:
                        reach_lo[j] = -math.inf
                    continue
                self.timed_out |= status == "limit"
                short = status == "optimal" and (
                    val < goal_hi[j] - tol[j] if sense > 0 else val > goal_lo[j] + tol[j]
                )
                if status != "optimal" or short:
                    failed[j] = True  # the LP optimum is an outer bound: the level is out of reach
                    break
                if self.integer and not np.all(np.abs(x - np.round(x)) <= 1e-7 * (1 + abs(x))):
                    fractional[j] = True  # reached only by a fractional table: CP-SAT decides
                    break
                np.maximum(reach_hi, x, out=reach_hi)
                np.minimum(reach_lo, x, out=reach_lo)
            if failed[j] and stop_early:
                break
        met = ~failed & ~fractional
        met &= (
            (reach_hi >= goal_hi - tol) & (reach_lo <= goal_lo + tol) & (reach_hi - reach_lo > tol)
        )
        fractional &= ~failed
        if fractional.any() and not (stop_early and failed[targets].any()):
            res = audit_intervals(
                self.A,
                v,
                sup,
                lower=self.lower,
                upper=self.upper,
                integer=True,
                time_limit=deadline - time.monotonic(),
                cells=fractional,
            )
            met[fractional] = audit_check(res, v, fractional, self.upl, self.lpl)[fractional]
            self.timed_out |= not res.exact[fractional].all()
        return met[targets]


# --- components --------------------------------------------------------------------------------


def _components(A_s: sparse.csr_matrix):
    """(rows, cols) of each connected component of suppressed cells linked by constraint rows."""
    m, k = A_s.shape
    B = sparse.csr_matrix((np.ones(A_s.nnz), A_s.indices, A_s.indptr), shape=(m, k))
    graph = sparse.bmat([[None, B], [B.T, None]], format="csr")
    n_comp, label = connected_components(graph, directed=False)
    row_lab, col_lab = label[:m], label[m:]
    rows_by = np.argsort(row_lab, kind="stable")
    cols_by = np.argsort(col_lab, kind="stable")
    r_start = np.searchsorted(row_lab[rows_by], np.arange(n_comp + 1))
    c_start = np.searchsorted(col_lab[cols_by], np.arange(n_comp + 1))
    for g in range(n_comp):
        cols = cols_by[c_start[g] : c_start[g + 1]]
        if cols.size:
            yield rows_by[r_start[g] : r_start[g + 1]], cols


def _row_bounds(sub: sparse.csr_matrix, rhs, lower, upper):
    """Outer bounds from each single row: a_j x_j = rhs - Σ_{k≠j} a_k x_k over the box."""
    lo, hi = lower.copy(), upper.copy()
    coo = sub.tocoo()
    r, c, a = coo.row, coo.col, coo.data
    with np.errstate(invalid="ignore"):
        tmin = np.where(a > 0, a * lower[c], a * upper[c])  # min of a_k x_k
        tmax = np.where(a > 0, a * upper[c], a * lower[c])
    m = sub.shape[0]
    # sums of finite parts and counts of infinite parts, per row
    fmin, fmax = np.where(np.isinf(tmin), 0.0, tmin), np.where(np.isinf(tmax), 0.0, tmax)
    smin, smax = np.bincount(r, fmin, m), np.bincount(r, fmax, m)
    nmin, nmax = np.bincount(r, np.isinf(tmin), m), np.bincount(r, np.isinf(tmax), m)
    # others' min sum excluding the term itself
    omin = np.where(nmin[r] - np.isinf(tmin) > 0, -np.inf, smin[r] - fmin)  # Σ_{k≠j} min a_k x_k
    omax = np.where(nmax[r] - np.isinf(tmax) > 0, np.inf, smax[r] - fmax)
    with np.errstate(invalid="ignore", divide="ignore"):
        lo_t = np.where(a > 0, (rhs[r] - omax) / a, (rhs[r] - omin) / a)  # a x_j >= rhs - omax
        hi_t = np.where(a > 0, (rhs[r] - omin) / a, (rhs[r] - omax) / a)
    np.maximum.at(lo, c, np.where(np.isnan(lo_t), -np.inf, lo_t))
    np.minimum.at(hi, c, np.where(np.isnan(hi_t), np.inf, hi_t))
    return lo, hi


def _solve_components(jobs, deadline: float, processes: int):
    """:func:`_solve_component` of each job (its arguments but the deadline), in job order.

    With ``processes > 1`` the jobs go to that many spawned worker processes, largest first so
    that the last ones to finish are small. Each component is solved by its own LP model either
    way, so the results do not depend on where or in which order it was solved; only the time
    limit, shared as a wall-clock deadline, may cut a different set of bounds short.
    """
    if processes <= 1 or len(jobs) < 2 or sum(len(j[2]) for j in jobs) < _PARALLEL_FROM_CELLS:
        return (_solve_job(job, deadline) for job in jobs)
    wall_deadline = time.time() + (deadline - time.monotonic())
    order = sorted(range(len(jobs)), key=lambda i: -len(jobs[i][2]))  # cells per component
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(processes, len(jobs)), mp_context=context) as pool:
        futures = {i: pool.submit(_solve_job, jobs[i], wall_deadline, True) for i in order}
        try:
            return [futures[i].result() for i in range(len(jobs))]
        except BaseException:
            pool.shutdown(cancel_futures=True)  # a component failed: do not wait for the rest
            raise


def _solve_job(job, deadline: float, wall_clock: bool = False):
    """:func:`_solve_component` of one job; a worker process gets a wall-clock deadline."""
    if wall_clock:
        deadline = time.monotonic() + (deadline - time.time())
    sub, rhs, lower, upper, truth, integer, wanted = job
    return _solve_component(sub, rhs, lower, upper, truth, integer, deadline, wanted)


# --- one component -----------------------------------------------------------------------------


def _solve_component(sub, rhs, lower, upper, truth, integer, deadline, wanted):
    out_lo, out_hi = _row_bounds(sub, rhs, lower, upper)
    with np.errstate(over="ignore", invalid="ignore"):
        if np.any(out_lo > out_hi + _TOL * np.maximum(1.0, np.abs(out_hi))):
            _inconsistent()
    k = len(lower)
    if k == 1:  # one cell: its rows pin it (or nothing does), exactly as the row bounds say
        if integer:
            out_lo, out_hi = np.ceil(out_lo - 1e-7), np.floor(out_hi + 1e-7)
        return out_lo, out_hi, np.ones(1, dtype=bool)
    integral_data = bool(np.all(sub.data == np.round(sub.data)) and np.all(rhs == np.round(rhs)))
    lp = _ComponentLP(sub, rhs, lower, upper)
    lo, hi = out_lo.copy(), out_hi.copy()
    lo_ok, hi_ok = np.zeros(k, dtype=bool), np.zeros(k, dtype=bool)
    lo_int, hi_int = np.zeros(k, dtype=bool), np.zeros(k, dtype=bool)  # attained at integers

    def attained(x, is_integral):
        # a feasible table at a cell's (outer or proven) bound proves that bound exact
        tol = _TOL * np.maximum(1.0, np.abs(x)) + 1e-9
        at_lo, at_hi = x <= lo + tol, x >= hi - tol
        lo_int[at_lo] |= is_integral
        hi_int[at_hi] |= is_integral
        lo_ok[at_lo] = True
        hi_ok[at_hi] = True

    for j, sense in [(j, s) for j in np.flatnonzero(wanted).tolist() for s in (+1, -1)]:
        bound, ok, integral_at = (hi, hi_ok, hi_int) if sense > 0 else (lo, lo_ok, lo_int)
        if ok[j]:
            continue
        if time.monotonic() >= deadline:
            break
        status, val, x = lp.optimise(j, sense, deadline)
        if status == "unbounded":  # an unbounded LP ray is rational, so integers follow it too
            bound[j], ok[j], integral_at[j] = sense * math.inf, True, True
        elif status == "optimal":
            integral = bool(np.all(np.abs(x - np.round(x)) <= 1e-7 * np.maximum(1, np.abs(x))))
            if integral_data and abs(val - round(val)) <= _TOL * max(1.0, abs(val)):
                val = float(round(val))  # float noise around an integral vertex value
            bound[j], ok[j], integral_at[j] = val, True, integral
            attained(x, integral)
        # otherwise the time limit hit: the outer bound stays, not exact
    if integer:
        lo, hi, lo_ok, hi_ok = _integer_bounds(
            sub, rhs, lower, upper, lo, hi, lo_ok, hi_ok, lo_int, hi_int, truth, deadline, wanted
        )
    if np.any(lo > truth + 1e-6 * np.maximum(1, np.abs(truth))) or np.any(
        hi < truth - 1e-6 * np.maximum(1, np.abs(truth))
    ):
        raise InternalError("an audit interval does not contain the true value")
    return lo, hi, lo_ok & hi_ok


class _ComponentLP:
    """One GLOP model per component, re-solved with only the objective changed (warm start)."""

    def __init__(self, sub, rhs, lower, upper):
        finite = np.concatenate([np.abs(rhs), np.abs(lower), np.abs(upper)])
        finite = finite[np.isfinite(finite)]
        big = float(finite.max()) if finite.size else 1.0
        # GLOP's tolerances are absolute: solve big tables in units of a power of two
        self.unit = 2.0 ** math.frexp(big)[1] if big > _LP_UNSCALED else 1.0
        rhs, lower, upper = rhs / self.unit, lower / self.unit, upper / self.unit
        s = pywraplp.Solver.CreateSolver("GLOP")
        if s is None:
            raise InternalError("OR-Tools was built without GLOP")
        s.SetSolverSpecificParametersAsString("use_preprocessing: false")
        inf = self.inf = s.infinity()
        self.x = [
            s.NumVar(-inf if math.isinf(lo) else lo, inf if math.isinf(up) else up, "")
            for lo, up in zip(lower.tolist(), upper.tolist(), strict=True)
        ]
        for r in range(sub.shape[0]):
            a, b = sub.indptr[r], sub.indptr[r + 1]
            con = s.Constraint(float(rhs[r]), float(rhs[r]))
            for c, v in zip(sub.indices[a:b].tolist(), sub.data[a:b].tolist(), strict=True):
                con.SetCoefficient(self.x[c], v)
        self.solver, self.obj, self.last = s, s.Objective(), None
        self.resp = linear_solver_pb2.MPSolutionResponse()

    def set_bounds(self, cells, lower, upper) -> None:
        inf = self.inf
        for c, lo, up in zip(cells.tolist(), lower.tolist(), upper.tolist(), strict=True):
            lo = -inf if math.isinf(lo) else lo / self.unit
            self.x[c].SetBounds(lo, inf if math.isinf(up) else up / self.unit)

    def optimise(self, j: int, sense: int, deadline: float):
        if self.last is not None and self.last != j:
            self.obj.SetCoefficient(self.x[self.last], 0.0)
        self.obj.SetCoefficient(self.x[j], 1.0)
        self.last = j
        if sense > 0:
            self.obj.SetMaximization()
        else:
            self.obj.SetMinimization()
        self.solver.SetTimeLimit(max(1, int((deadline - time.monotonic()) * 1000)))
        status = self.solver.Solve()
        if status == pywraplp.Solver.OPTIMAL:
            self.solver.FillSolutionResponseProto(self.resp)
            x = np.array(self.resp.variable_value) * self.unit
            return "optimal", self.obj.Value() * self.unit, x
        if status == pywraplp.Solver.UNBOUNDED:
            return "unbounded", None, None
        if status == pywraplp.Solver.INFEASIBLE:
            _inconsistent()
        return "limit", None, None


def _integer_bounds(
    sub, rhs, lower, upper, lo, hi, lo_ok, hi_ok, lo_int, hi_int, truth, deadline, wanted
):
    """Tighten LP bounds to integer bounds with CP-SAT where no integral vertex attains them."""
    lo_i = np.where(np.isinf(lo), lo, np.ceil(lo - 1e-7))
    hi_i = np.where(np.isinf(hi), hi, np.floor(hi + 1e-7))
    ok_lo = lo_ok & lo_int
    ok_hi = hi_ok & hi_int
    todo = [
        (j, s)
        for j in np.flatnonzero(wanted).tolist()
        for s in (+1, -1)
        if not (ok_hi if s > 0 else ok_lo)[j]
    ]
    if not todo:
        return lo_i, hi_i, ok_lo, ok_hi
    cap = float(np.abs(truth).sum() + np.abs(rhs).sum() + 1)
    dom_lo = np.where(np.isinf(lo_i), -cap, lo_i).astype(np.int64)
    dom_hi = np.where(np.isinf(hi_i), cap, hi_i).astype(np.int64)
    cap_lo, cap_hi = np.isinf(lo_i), np.isinf(hi_i)
    model = cp_model.CpModel()
    xs = [model.new_int_var(int(a), int(b), "") for a, b in zip(dom_lo, dom_hi, strict=True)]
    for r in range(sub.shape[0]):
        a, b = sub.indptr[r], sub.indptr[r + 1]
        coef = [int(v) for v in sub.data[a:b]]
        model.add(
            sum(c * xs[i] for c, i in zip(coef, sub.indices[a:b], strict=True)) == int(rhs[r])
        )
    for i, v in enumerate(truth.tolist()):
        model.add_hint(xs[i], int(v))
    for j, s in todo:
        if (ok_hi if s > 0 else ok_lo)[j]:
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if s > 0:
            model.maximize(xs[j])
        else:
            model.minimize(xs[j])
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = left
        solver.parameters.num_workers = 1
        status = solver.solve(model)
        if status == cp_model.OPTIMAL:
            sol = np.array([solver.value(x) for x in xs], dtype=np.float64)
            if np.any((cap_lo & (sol <= dom_lo)) | (cap_hi & (sol >= dom_hi))):
                continue  # an artificial cap may have cut the optimum: keep the LP bound
            val = float(solver.objective_value)
            if s > 0:
                hi_i[j], ok_hi[j] = val, True
            else:
                lo_i[j], ok_lo[j] = val, True
            ok_lo |= sol <= lo_i
            ok_hi |= sol >= hi_i
        elif status == cp_model.FEASIBLE:
            bound = float(solver.best_objective_bound)
            if s > 0:
                hi_i[j] = min(hi_i[j], math.floor(bound + 1e-9))
            else:
                lo_i[j] = max(lo_i[j], math.ceil(bound - 1e-9))
        elif status == cp_model.INFEASIBLE:
            _inconsistent()
    return lo_i, hi_i, ok_lo, ok_hi


# --- validation --------------------------------------------------------------------------------


def _inconsistent():
    raise TabularError(
        "no table satisfies the published values, the constraints A @ v == 0 and the a-priori "
        "bounds: the published table is not additive or the bounds exclude the true values; "
        "check A, values, lower and upper"
    )


def _vector(a, n: int, name: str) -> np.ndarray:
    arr = np.asarray(a, dtype=np.float64)
    if arr.shape != (n,):
        raise TabularError(f"{name} must have one entry per cell ({n}), got shape {arr.shape}")
    if np.isnan(arr).any():
        raise TabularError(f"{name} contains NaN at cell {int(np.flatnonzero(np.isnan(arr))[0])}")
    return arr


def _mask(a, n: int, name: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.shape != (n,) or arr.dtype != bool:
        raise TabularError(f"{name} must be a bool array of length {n}")
    return arr


def _check(A, values, suppressed, lower, upper, integer):
    if not sparse.issparse(A):
        raise TabularError(
            f"A must be a scipy.sparse matrix (R equations × C cells), got {type(A)}"
        )
    A = sparse.csr_matrix(A, dtype=np.float64, copy=True)
    A.eliminate_zeros()  # explicit zeros would read as "coefficient 0" in the row bounds
    n = A.shape[1]
    values = _vector(values, n, "values")
    lower, upper = _vector(lower, n, "lower"), _vector(upper, n, "upper")
    sup = _mask(suppressed, n, "suppressed")
    if not np.all(np.isfinite(values)):
        raise TabularError("values must be finite")
    out = sup & ((values < lower) | (values > upper))
    if out.any():
        c = int(np.flatnonzero(out)[0])
        raise TabularError(
            f"cell {c} has value {float(values[c])!r} outside its a-priori bounds "
            f"[{float(lower[c])!r}, {float(upper[c])!r}]; a-priori bounds must hold for the true "
            "values: widen them"
        )
    residual = A @ values
    bad = np.abs(residual) > 1e-9 * np.maximum(1.0, abs(A) @ np.abs(values))
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise TabularError(
            f"the table is not additive: constraint row {r} is off by {float(residual[r])!r} "
            "(A @ values must be 0); check the values or the constraint matrix"
        )
    if integer:
        finite = np.concatenate(
            [A.data, values, lower[np.isfinite(lower)], upper[np.isfinite(upper)]]
        )
        if not np.all(finite == np.round(finite)):
            raise TabularError(
                "integer=True needs integral A, values and bounds (a count table); "
                "use integer=False for magnitude tables"
            )
    return A, values, sup, lower, upper
