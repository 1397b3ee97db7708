"""The CTA models of :mod:`sqlsdc.tabular.cta` and their solver calls (private).

Equation numbers refer to :mod:`sqlsdc.tabular.cta`'s docstring (Castro 2006, *EJOR* 171;
digest ``shared/reference/seed_2006_tabular.md`` §0). Every model has the deviation block
``[z⁺ | z⁻]`` with the additivity rows (2) and the bounds (3):

* :func:`solve_lp` — directions fixed, so (4)–(5) are variable bounds: an LP.
* :func:`solve_lp_flipping` — the LP, with fallbacks when the fixed directions are infeasible
  (directions of the LP relaxation of (4)–(5), reversing the cells the elastic LP names, then
  the MILP on small tables).
* :func:`solve_milp` — free directions, one binary per sensitive cell, Big-M from the LP's
  objective (see the module docstring of ``cta``); the table is then the fixed-direction LP's
  at the MILP's directions (:func:`_polish`), whose levels are exact variable bounds.
* :func:`_shortfall` — the elastic copy that names the sensitive cells that cannot reach their
  levels, for :func:`infeasible`'s message.

Models are filled from sparse arrays through OR-Tools' ``model_builder`` and solved by HiGHS
(default), GLOP (LP, dual simplex) or SCIP (MILP), always with a time limit.

**Cost scaling.** The weights ``1/|a|`` of a table of turnovers are 10⁻¹¹…10⁻⁷, below the
solvers' dual feasibility tolerance (10⁻⁷): HiGHS then takes any feasible vertex for optimal
(on the demo's turnover table it moved 114 of 171 cells to 0 and called it optimal). So the
solvers see the costs divided by :attr:`Problem.cost_scale` (the geometric mean of the smallest
and largest positive weight, which centres them on 1); objectives and bounds are scaled back.

**Statuses** (:func:`_solve`) are the solver's, mapped one to one: ``optimal``; ``feasible`` (a
solution, not proven optimal: a limit was reached); ``infeasible``; ``unbounded``;
``time_limit`` (no solution, and the time limit was used up); ``error`` otherwise (the
solver's own status name in the message) — a timeout is reported only when one happened.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from sqlsdc.errors import InternalError, TabularError
from sqlsdc.tabular.model import Table

MILP_FALLBACK_SENSITIVE = 500  # the free-direction MILP solves this many binaries in seconds
LP_SOLVERS = {"highs": "output_flag=false", "glop": "use_dual_simplex: true"}
MILP_SOLVERS = {"highs": "output_flag=false\nmip_rel_gap=1e-9", "scip": "limits/gap = 1e-9"}
MILP_FALLBACK_GAP = 1e-4  # the LP heuristic's MILP fallback: a good table, not a proven optimum


@dataclass(eq=False)
class Problem:
    """A CTA instance: original values, sensitive cells, protection levels, weights and how far
    each cell may move (built by ``cta._problem``)."""

    table: Table
    values: np.ndarray
    sensitive: np.ndarray
    upl: np.ndarray
    lpl: np.ndarray
    weights: np.ndarray
    up_room: np.ndarray  # how far each cell may move up / down (bounds, caps, fixed cells)
    down_room: np.ndarray

    @property
    def cost_scale(self) -> float:
        """Costs are divided by this before a solver sees them (module docstring)."""
        w = self.weights[self.weights > 0]
        return float(np.sqrt(w.min() * w.max())) if w.size else 1.0

    def admissible(self) -> tuple[np.ndarray, np.ndarray]:
        """Per cell: the upward / downward requirement can be met within the cell's own room."""
        s = self.sensitive
        up = s & (self.upl > 0) & (self.upl <= self.up_room)
        down = s & (self.lpl > 0) & (self.lpl <= self.down_room)
        return up, down


# ----------------------------------------------------------------------------- models and solvers


@dataclass(eq=False)
class Run:
    status: str
    change: np.ndarray
    objective: float
    bound: float
    build_seconds: float
    solve_seconds: float


def _deviation_block(prob: Problem):
    """Variables [z⁺ | z⁻] with their bounds, objective and the additivity rows (2)."""
    A = sp.csr_matrix(prob.table.A)
    lb = np.zeros(2 * prob.values.size)
    ub = np.concatenate([prob.up_room, prob.down_room])
    w = prob.weights / prob.cost_scale
    return lb, ub, np.concatenate([w, w]), sp.hstack([A, -A]).tocsr()


def solve_lp_flipping(prob, dirs, solver, time_limit, rounds: int = 3) -> Run:
    """The fixed-direction LP; when infeasible, change the directions and retry.

    A fixed rule can send a cell and its parent in a hierarchy opposite ways with too little
    room between them. Then the directions of the LP relaxation of (4)–(5) are tried
    (:func:`_relaxed_directions`); if that fails too, the directions of the cells the elastic
    LP names as short are reversed, up to ``rounds`` times (a few LPs of milliseconds). Only
    then do tables with at most ``MILP_FALLBACK_SENSITIVE`` sensitive cells take their
    directions from the MILP (which either finds feasible directions or proves there are
    none), stopped at a small gap (``MILP_FALLBACK_GAP``): it only stands in for the LP
    heuristic. s48p, on the demo's turnover tables (101-114 of 132-135 cells sensitive on
    20,000 persons, 12-14 of 171 on 1,000,000): the fixed and relaxed directions failed for 31
    of 99 secrets; the MILP (gap 1e-9) then took 3-26 s of CPU (past the 60 s wall-time
    limit on a loaded machine) or, with levels of 1e10 and a Big-M of 3e11, was called
    infeasible by HiGHS; one or two reversal rounds met every level in under 0.1 s.
    """
    dirs = dirs.copy()
    can_up, can_down = prob.admissible()
    run = solve_lp(prob, dirs, solver, time_limit)
    if run is not None:
        return run
    relaxed = _relaxed_directions(prob, dirs, time_limit)  # the convex relaxation's directions
    if relaxed is not None and np.any(relaxed != dirs):
        dirs = relaxed
        run = solve_lp(prob, dirs, solver, time_limit)
        if run is not None:
            return run
    for _ in range(rounds):
        bad = _shortfall(prob, dirs, time_limit)
        flip = bad & np.where(dirs > 0, can_down, can_up)
        if not flip.any():
            break
        dirs[flip] = -dirs[flip]
        run = solve_lp(prob, dirs, solver, time_limit)
        if run is not None:
            return run
    if prob.sensitive.sum() <= MILP_FALLBACK_SENSITIVE:  # free directions, small table
        return solve_milp(prob, None, "highs", time_limit, gap=MILP_FALLBACK_GAP)
    raise infeasible(prob, _shortfall(prob, dirs, time_limit), "lp")


def _relaxed_directions(prob, dirs, time_limit) -> np.ndarray | None:
    """Directions from the LP relaxation of (4)–(5): ``z⁺_s/UPL_s + z⁻_s/LPL_s ≥ 1``.

    The relaxation is feasible whenever the MILP is; each sensitive cell takes the sign of its
    net move (ties keep the given direction). None when even the relaxation is infeasible.
    """
    C = prob.values.size
    lb, ub, obj, M = _deviation_block(prob)
    can_up, can_down = prob.admissible()
    s = np.flatnonzero(prob.sensitive)
    ub[:C][s[~can_up[s]]] = np.minimum(ub[:C][s[~can_up[s]]], 0.0)
    ub[C:][s[~can_down[s]]] = np.minimum(ub[C:][s[~can_down[s]]], 0.0)
    k = np.arange(s.size)
    inv_u = np.where(can_up[s], 1.0 / np.where(can_up[s], prob.upl[s], 1.0), 0.0)
    inv_d = np.where(can_down[s], 1.0 / np.where(can_down[s], prob.lpl[s], 1.0), 0.0)
    req = sp.csr_matrix(
        (np.concatenate([inv_u, inv_d]), (np.concatenate([k, k]), np.concatenate([s, C + s]))),
        shape=(s.size, 2 * C),
    )
    zeros = np.zeros(M.shape[0])
    model = _model(
        lb,
        ub,
        obj,
        np.concatenate([zeros, np.ones(s.size)]),
        np.concatenate([zeros, np.full(s.size, np.inf)]),
        sp.vstack([M, req]).tocsr(),
    )
    _, x, _, _ = _solve(model, "highs", LP_SOLVERS["highs"], time_limit)
    if x is None:
        return None
    net = x[:C] - x[C:]
    out = dirs.copy()
    out[s] = np.where(net[s] > 0, 1.0, np.where(net[s] < 0, -1.0, dirs[s]))
    return out


def solve_lp(prob, dirs, solver, time_limit) -> Run | None:
    """The fixed-direction LP; None when it is infeasible."""
    start = time.perf_counter()
    C = prob.values.size
    lb, ub, obj, M = _deviation_block(prob)
    up, down = dirs > 0, dirs < 0
    lb[:C][up], ub[C:][up] = prob.upl[up], 0.0
    lb[C:][down], ub[:C][down] = prob.lpl[down], 0.0
    rows = np.zeros(M.shape[0])
    model = _model(lb, ub, obj, rows, rows, M)
    built = time.perf_counter() - start
    status, x, objective, bound = _solve(model, solver, LP_SOLVERS[solver], time_limit)
    solved = time.perf_counter() - start - built
    if status == "infeasible":
        return None
    if x is None:
        raise no_solution("LP", solver, status, time_limit)
    objective, bound = objective * prob.cost_scale, bound * prob.cost_scale
    return Run(
        status,
        x[:C] - x[C:],
        objective,
        bound if status == "feasible" else objective,
        built,
        solved,
    )


def no_solution(model: str, solver: str, status: str, time_limit: float) -> TabularError:
    """The error for a solver that returned no solution, saying truthfully why."""
    if status == "time_limit":
        return TabularError(
            f"the CTA {model} found no solution within time_limit={time_limit:g}s ({solver}); "
            "raise --time-limit"
        )
    if status == "unbounded":
        return TabularError(
            f"the CTA {model} is unbounded ({solver}); the table's bounds leave a cell free to "
            "move without cost: give weights > 0 or finite bounds"
        )
    return TabularError(
        f"the CTA {model} solver {solver} stopped without a solution ({status}); try another "
        "solver (--cta-method milp, or solver='highs'/'glop')"
    )


def _milp_rows(prob, big_m, elastic):
    """Rows (4)–(5) for the sensitive cells: variables [z⁺ | z⁻ | b (| t)]."""
    C = prob.values.size
    s = np.flatnonzero(prob.sensitive)
    k = np.arange(s.size)
    zp, zm, b, t = s, C + s, 2 * C + k, 2 * C + s.size + k
    upl, lpl, mu, md = prob.upl[s], prob.lpl[s], big_m[s], big_m[s]
    mu, md = np.minimum(mu, prob.up_room[s]), np.minimum(md, prob.down_room[s])
    r = [
        k,
        k,
        s.size + k,
        s.size + k,
        2 * s.size + k,
        2 * s.size + k,
        3 * s.size + k,
        3 * s.size + k,
    ]
    c = [zp, b, zm, b, zp, b, zm, b]
    d = [np.ones(s.size), -upl, np.ones(s.size), lpl, np.ones(s.size), -mu, np.ones(s.size), md]
    lo = np.concatenate([np.zeros(s.size), lpl, np.full(2 * s.size, -np.inf)])
    hi = np.concatenate([np.full(2 * s.size, np.inf), np.zeros(s.size), md])
    if elastic:  # requirement rows may fall short by level·t
        r += [k, s.size + k]
        c += [t, t]
        d += [upl, lpl]
    n_var = 2 * C + s.size * (2 if elastic else 1)
    rows = sp.csr_matrix(
        (np.concatenate(d), (np.concatenate(r), np.concatenate(c))), shape=(4 * s.size, n_var)
    )
    return rows, lo, hi


def _milp_model(prob, big_m, *, elastic: bool):
    C = prob.values.size
    S = int(prob.sensitive.sum())
    lb, ub, obj, M = _deviation_block(prob)
    can_up, can_down = prob.admissible()
    s = np.flatnonzero(prob.sensitive)
    b_lb = np.where(can_down[s], 0.0, 1.0)  # a cell that cannot go down must go up, and back
    b_ub = np.where(can_up[s], 1.0, 0.0)
    lb, ub = np.concatenate([lb, b_lb]), np.concatenate([ub, b_ub])
    obj = np.concatenate([obj, np.zeros(S)])
    if elastic:
        lb, ub = np.concatenate([lb, np.zeros(S)]), np.concatenate([ub, np.ones(S)])
        obj = np.concatenate([np.zeros(2 * C + S), np.ones(S)])
    rows, lo, hi = _milp_rows(prob, big_m, elastic)
    n_var = lb.size
    M = sp.vstack([sp.hstack([M, sp.csr_matrix((M.shape[0], n_var - 2 * C))]), rows]).tocsr()
    zeros = np.zeros(prob.table.A.shape[0])
    model = _model(lb, ub, obj, np.concatenate([zeros, lo]), np.concatenate([zeros, hi]), M)
    for j in range(2 * C, 2 * C + S):
        model.helper.set_var_integrality(j, True)
    return model


def solve_milp(prob, lp: Run | None, solver, time_limit, gap: float | None = None) -> Run:
    """The free-direction MILP (1)–(5), polished (:func:`_polish`); ``gap``: a relative gap
    at which HiGHS may stop (default ``MILP_SOLVERS``'s 1e-9)."""
    start = time.perf_counter()
    C = prob.values.size
    if lp is not None:  # an optimal solution is no worse than the LP's: w_s |z_s| <= U
        big_m = (lp.objective * (1 + 1e-6) + 1e-9) / np.maximum(prob.weights, 1e-300)
    else:
        level = max(prob.upl.max(), prob.lpl.max())
        big_m = np.full(C, 2.0 * (np.abs(prob.values).max() + level))
    model = _milp_model(prob, big_m, elastic=False)
    built = time.perf_counter() - start
    params = MILP_SOLVERS[solver]
    if gap is not None and solver == "highs":
        params = params.replace("mip_rel_gap=1e-9", f"mip_rel_gap={gap:g}")
    status, x, objective, bound = _solve(model, solver, params, time_limit)
    objective, bound = objective * prob.cost_scale, bound * prob.cost_scale
    if status == "infeasible" and lp is None:
        raise infeasible(prob, _shortfall(prob, None, time_limit), "milp")
    if x is None or (lp is not None and objective > lp.objective):
        if lp is None:
            raise no_solution("MILP", solver, status, time_limit)
        if status not in ("optimal", "feasible", "time_limit", "infeasible"):
            raise no_solution("MILP", solver, status, time_limit)
        # the LP heuristic's directions are the incumbent: feasible for the MILP by
        # construction, so an "infeasible" MILP is its solver's tolerances (levels exactly at
        # a replaced version's distances, sqlsdc.jobs.replaced_sides, met that)
        status, x = "feasible", None
        bound = bound if np.isfinite(bound) else 0.0
    change = lp.change if x is None else x[:C] - x[C : 2 * C]
    objective = lp.objective if x is None else objective
    if x is not None:
        exact = _polish(prob, x, time_limit - (time.perf_counter() - start))
        if exact is not None:
            change, objective = exact.change, exact.objective
    solved = time.perf_counter() - start - built
    return Run(
        status, change, objective, bound if status != "optimal" else objective, built, solved
    )


def _polish(prob, x, time_left) -> Run | None:
    """The fixed-direction LP at the directions ``b`` of a MILP solution ``x``: the same
    optimum, with each level met exactly; None when that LP has no solution in the time left.

    A MILP solver meets its rows only to its feasibility tolerance (HiGHS: 10⁻⁶, integrality
    too): on a 2×2 table whose sensitive cell and row total must both fall by 6, HiGHS's
    "optimal" moved them by 5.999999 (``z⁻ = 5.9999995`` with ``z⁺ = 5·10⁻⁷`` under a
    direction ``b = 0``), which the verifier rightly refused. In the LP the levels are
    variable bounds, which the simplex method's solution meets exactly at its vertex.
    """
    C = prob.values.size
    s = np.flatnonzero(prob.sensitive)
    dirs = np.zeros(C)
    dirs[s] = np.where(x[2 * C : 2 * C + s.size] > 0.5, 1.0, -1.0)
    if time_left <= 0:
        return None
    try:
        return solve_lp(prob, dirs, "highs", time_left)
    except TabularError:  # no solution in the time left: the MILP's own, for the verifier
        return None


def _model(lb, ub, obj, row_lo, row_hi, M):
    from ortools.linear_solver.python import model_builder

    model = model_builder.Model()
    model.helper.fill_model_from_sparse_data(lb, ub, obj, row_lo, row_hi, M)
    return model


def _solve(model, solver, params, time_limit):
    """Solve with OR-Tools' model builder; (status, x or None, objective, bound).

    HiGHS's presolve sometimes ends without a status on a model it then solves with presolve
    off (UNKNOWN_STATUS well within the time limit, on about 1 in 20 of the demo's CTA LPs
    with randomised protection levels; GLOP and HiGHS's interior point agree on the optimum):
    such a run is repeated once without presolve, in the time left."""
    from ortools.linear_solver.python import model_builder_helper as mbh

    start = time.perf_counter()
    helper = mbh.ModelSolverHelper(solver)
    helper.set_solver_specific_parameters(params)
    helper.set_time_limit_in_seconds(float(time_limit))
    helper.solve(model.helper)
    code = mbh.SolveStatus(helper.status())
    left = float(time_limit) - (time.perf_counter() - start)
    retry = solver == "highs" and "presolve=off" not in params  # once
    if retry and code == mbh.SolveStatus.UNKNOWN_STATUS and left > 0.05 * time_limit:
        return _solve(model, solver, params + "\npresolve=off", left)
    if code == mbh.SolveStatus.INFEASIBLE:
        return "infeasible", None, np.inf, np.inf
    if code == mbh.SolveStatus.UNBOUNDED:
        return "unbounded", None, -np.inf, -np.inf
    if code in (mbh.SolveStatus.MODEL_INVALID, mbh.SolveStatus.INVALID_SOLVER_PARAMETERS):
        raise InternalError(f"{solver} rejected the CTA model: {helper.status_string()}")
    if code not in (mbh.SolveStatus.OPTIMAL, mbh.SolveStatus.FEASIBLE) or not helper.has_solution():
        # HiGHS stopped by its time limit reports UNKNOWN_STATUS: the clock tells
        timed_out = helper.wall_time() >= 0.95 * float(time_limit)
        status = "time_limit" if timed_out else f"error: {code.name}"
        return status, None, np.inf, _bound(helper)
    status = "optimal" if code == mbh.SolveStatus.OPTIMAL else "feasible"
    x = np.asarray(helper.variable_values(), dtype=np.float64).ravel()
    return status, x, float(helper.objective_value()), _bound(helper)


def _bound(helper) -> float:
    try:
        bound = float(helper.best_objective_bound())
    except (TypeError, ValueError):
        return 0.0
    return bound if np.isfinite(bound) else 0.0


def _shortfall(prob, dirs, time_limit) -> np.ndarray:
    """Sensitive cells that cannot reach their levels (elastic model, module docstring).

    ``dirs`` None: free directions (the elastic MILP); else the fixed-direction elastic LP.
    """
    if dirs is None:  # free directions: the elastic MILP
        model = _milp_model(prob, np.full(prob.values.size, 2.0 * _scale(prob)), elastic=True)
    else:
        C = prob.values.size
        s = np.flatnonzero(prob.sensitive)
        lb, ub, _, M = _deviation_block(prob)
        up = dirs[s] > 0
        ub[:C][s[~up]], ub[C:][s[up]] = 0.0, 0.0
        level = np.where(up, prob.upl[s], prob.lpl[s])
        col = np.where(up, s, C + s)
        k = np.arange(s.size)
        req = sp.csr_matrix(
            (
                np.concatenate([np.ones(s.size), level]),
                (np.concatenate([k, k]), np.concatenate([col, 2 * C + k])),
            ),
            shape=(s.size, 2 * C + s.size),
        )
        M = sp.vstack([sp.hstack([M, sp.csr_matrix((M.shape[0], s.size))]), req]).tocsr()
        zeros = np.zeros(prob.table.A.shape[0])
        model = _model(
            np.concatenate([lb, np.zeros(s.size)]),
            np.concatenate([ub, np.ones(s.size)]),
            np.concatenate([np.zeros(2 * C), np.ones(s.size)]),
            np.concatenate([zeros, level]),
            np.concatenate([zeros, np.full(s.size, np.inf)]),
            M,
        )
    status, x, _, _ = _solve(model, "highs", MILP_SOLVERS["highs"], time_limit)
    if x is None:
        raise no_solution("elastic model", "highs", status, time_limit)
    C = prob.values.size
    s = np.flatnonzero(prob.sensitive)
    bad = np.zeros(C, dtype=bool)
    bad[s[x[-s.size :] > 1e-7]] = True
    return bad


def infeasible(prob, bad, method) -> TabularError:
    """The error for a model without solution; ``bad``: the sensitive cells the elastic copy
    (:func:`_shortfall`) finds short. None short means the elastic copy met every level, so
    the solver's "infeasible" was numerical (it read "0 cell(s) fall short, e.g. ;": new user
    s40j)."""
    if not bad.any():
        return TabularError(
            f"the CTA {method.upper()} solver reported that no additive adjusted table moves "
            "every sensitive cell by its protection level, yet a relaxed copy of the same model "
            "met every level: a numerical limit of the solver (a level at exactly the room a "
            "cell has within its bounds), not of the table; ask for "
            "protection levels a little different (another rule, e.g. p:14 for p:15) or other "
            "bounds"
        )
    hint = " or method='milp' (free directions)" if method == "lp" else ""
    return TabularError(
        f"no additive adjusted table within the bounds moves every sensitive cell by its "
        f"protection level: {int(bad.sum())} cell(s) fall short, e.g. {describe(prob.table, bad)}"
        f"; allow zero cells to move (keep_zeros=False), drop `fixed`/`max_change`, widen "
        f"`bounds`{hint}, or lower the protection levels"
    )


def _scale(prob) -> float:
    return float(np.abs(prob.values).max() + max(prob.upl.max(), prob.lpl.max()))


def describe(table, mask) -> str:
    """Up to three cells of ``mask`` by their codes, for error messages."""
    rows = table.cells.loc[mask, list(table.dims)].head(3)
    return "; ".join(str(r) for r in rows.astype(str).to_dict("records"))
