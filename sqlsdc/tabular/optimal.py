"""Optimal secondary cell suppression: one time-limited MILP over the whole table.

The classic cell suppression problem (CSP) in the compact ("attacker sub-problems written out")
form of Kelly, Golden & Assad (1992, *Networks* 22) and Fischetti & Salazar-González (1999,
*Math. Programming* 84; 2001, *Management Science* 47), the model behind τ-ARGUS ``OPT`` and
sdcTable ``OPT``. With constraint matrix ``A`` (``A @ values == 0``), a-priori bounds
``lower <= x <= upper`` and protection levels ``upl``/``lpl`` of the primary cells:

- ``y_c`` binary: cell ``c`` is suppressed (``y_p = 1`` for primaries, ``y_c = 0`` for forced).
- For every primary ``p`` and direction (up with ``upl_p > 0``, down with ``lpl_p > 0``) a
  deviation vector ``z`` (the attacker's alternative table is ``values + z``)::

      A z = 0
      -min(v_c - lower_c, M) * y_c  <=  z_c  <=  min(upper_c - v_c, M) * y_c
      z_p >= upl_p   (up)      or      z_p <= -lpl_p   (down)

- minimise ``sum(cost * y)``.

A feasible ``z`` is a consistent table that agrees with every published cell and moves ``p`` by
its protection level, so the attacker's LP range of ``p`` covers ``[v_p - lpl_p, v_p + upl_p]``.

**Big-M.** An infinite ``upper`` (or ``lower``) is capped at ``M = max|values| + max(upl, lpl)``
(the table's largest cell, usually the grand total, plus the largest protection level). Every
cap only shrinks the defender's witnesses, so it can cost extra suppressions but never
protection. ``M`` is exact when ``lower = 0`` for all cells and the grand total is published (no
cell of a consistent non-negative table exceeds the total); otherwise it is a generous heuristic.

**Tight caps.** If ``A`` is totally unimodular (Heller-Tompkins test; 2-D tables without
hierarchy, 1-D hierarchies) every witness can be scaled so that no cell moves by more than the
protection level, so the caps ``min(room_c, upl_p)`` (resp. ``lpl_p``) lose nothing and give a
far stronger LP relaxation; this model is solved alone and its optimum is exact. Other matrices
(hierarchical 2-D, 3-D) have circuits that move a cell by twice the primary's move or more, so
there the tight model is only a restriction: it is solved first with half the time limit (its
solutions are safe, possibly dearer), then the big-M model with the rest of the time; the cheaper
pattern is returned, ``"optimal"`` only when the big-M model proves it, and the gap is measured
against the big-M model's bound. In every model a primary's equations each need one more
suppressed cell (cover rows; implied by the tight caps, added to the big-M model).

**Size reduction.** Forced cells and cells whose a-priori range is a single point never move;
each attacker sub-problem keeps only the connected component of its primary in the bipartite
graph "cell -- equation" over the movable cells, and the equations touching it.

**Units.** Solver tolerances are absolute, so turnover tables of 10^10 with fractional levels came
out "infeasible": for SCIP/HiGHS/CBC each witness ``z`` is measured in units of its own protection
level (the model is homogeneous in lengths) and the costs in units of a power of two near the
largest.

**CP-SAT** needs integers: all lengths (ranges, protection levels) are multiplied by ``10**k`` with
the smallest ``k`` in 0..6 that makes them integral (smaller when magnitudes would pass 2**40) and
rounded inwards (ranges down, protection levels up); the tight caps, which only restrict the
witnesses, round outwards (a cap equal to a level would otherwise fall below it); ``z`` is
integer. The roundings of ranges and levels only shrink the witnesses, so the result stays safe;
with integral data and a totally unimodular ``A`` (2-D tables without hierarchy) it is exact.
Costs are scaled the same way and rounded (a positive cost at least 1): with non-integral costs
the optimum is optimal for rounded costs.

Every solution is re-checked with an independent LP (scipy/HiGHS) of the attacker over the
published table before it is returned.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog
from scipy.sparse.csgraph import connected_components

from sqlsdc.errors import InternalError, TabularError

MIP_SOLVERS = ("SCIP", "HIGHS", "CBC")
CPSAT_SOLVERS = ("CP-SAT", "CP_SAT", "CPSAT")
SOLVERS = MIP_SOLVERS + ("CP-SAT",)
#: Relative tolerance of the independent LP check of a returned pattern.
CHECK_TOLERANCE = 1e-6
#: CP-SAT's full portfolio needs about 8 workers; fewer often finds no useful lower bound.
CPSAT_WORKERS = 8
_MAX_SCALED = 2.0**40
#: Relative float noise forgiven when rounding lengths to integers (far below one unit at 2**40).
_FLOAT_NOISE = 1e-12


@dataclass(frozen=True, eq=False)
class SuppressionResult:
    """Outcome of a secondary-suppression job.

    Attributes:
        suppressed: bool[C], primary and secondary suppressions. For status ``"infeasible"`` or
            ``"timeout"`` no protecting pattern was found and this is the fail-closed pattern
            (every cell that is not forced); do not treat it as a solution.
        cost: ``sum(cost[suppressed])`` (primaries included).
        status: ``"optimal"`` (proven), ``"feasible"`` (a protecting pattern, not proven optimal;
            ``gap`` bounds how far from optimal when known), ``"infeasible"`` (no pattern can
            protect every primary) or ``"timeout"`` (time limit hit before any pattern was found).
        gap: relative gap ``(cost - bound) / cost`` of the secondary cost against the best
            proven lower bound (1.0 when none beyond 0 is known); 0.0 when optimal, None when
            there is no pattern.
    """

    suppressed: np.ndarray
    cost: float
    status: str
    gap: float | None


def optimal_suppress(
    A,
    values,
    primary,
    upl,
    lpl,
    cost,
    *,
    lower,
    upper,
    forced=None,
    solver: str = "SCIP",
    time_limit: float = 60.0,
) -> SuppressionResult:
    """Minimum-cost secondary suppression by the compact cell suppression MILP.

    Protects every primary cell ``p`` so that an attacker who knows the published cells, the
    additivity equations ``A x = 0`` and the a-priori bounds cannot narrow ``p`` to less than
    ``[values[p] - lpl[p], values[p] + upl[p]]`` (Fischetti & Salazar-González 2001; Kelly,
    Golden & Assad 1992; see the module docstring for the model, big-M and scaling choices).
    Meant for small and medium tables: the model has one deviation vector per primary and
    direction. Measured on 2 shared cores within 60 s: 2-D tables without hierarchy up to about
    20 x 20 inner cells (441 cells, 39 primaries) with SCIP and 25 x 25 (676 cells, 48 primaries)
    with HiGHS, 15 x 15 with CP-SAT; hierarchical 2-D tables up to a few hundred cells (441 cells,
    9 primaries: 6 s). Beyond that use :func:`sqlsdc.tabular.hitas.hitas_suppress`. CBC may
    overrun the time limit inside its root LP.

    Args:
        A: constraint matrix, shape (R, C), entries +1/-1 (scipy sparse or dense).
        values: float[C] cell values with ``A @ values == 0``.
        primary: bool[C] cells to protect (always suppressed).
        upl: float[C] >= 0 upper protection levels (0 outside primaries).
        lpl: float[C] >= 0 lower protection levels.
        cost: float[C] >= 0 cost of suppressing each cell (value, frequency or 1).
        lower: float[C] (or scalar) a-priori lower bounds known to the attacker, may be -inf.
        upper: float[C] (or scalar) a-priori upper bounds, may be +inf.
        forced: bool[C] cells that must stay published, or None.
        solver: "SCIP", "HIGHS", "CBC" (OR-Tools MPSolver) or "CP-SAT".
        time_limit: seconds for the solver (model building and the final LP check come on top).

    Returns:
        SuppressionResult; ``status`` says whether optimality was proven.

    Raises:
        TabularError: invalid input (shapes, bounds, a table that does not add up, a cell both
            primary and forced, an unknown solver).

    Example:
        >>> import numpy as np, scipy.sparse as sp
        >>> # 2 x 2 table with margins; cells r1c1 r1c2 r1T r2c1 r2c2 r2T Tc1 Tc2 TT
        >>> v = np.array([5., 7, 12, 3, 9, 12, 8, 16, 24])
        >>> rows = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 3, 6], [1, 4, 7], [2, 5, 8]]
        >>> A = sp.lil_matrix((6, 9))
        >>> for i, (a, b, t) in enumerate(rows):
        ...     A[i, a], A[i, b], A[i, t] = 1, 1, -1
        >>> p = np.zeros(9, bool); p[0] = True
        >>> pl = np.where(p, 2.0, 0.0)
        >>> r = optimal_suppress(A, v, p, pl, pl, v, lower=0.0, upper=np.inf)  # cost = value
        >>> r.status, r.cost, np.flatnonzero(r.suppressed).tolist()
        ('optimal', 24.0, [0, 1, 3, 4])
    """
    data = _validated(A, values, primary, upl, lpl, cost, lower, upper, forced)
    solver = _solver_name(solver)
    if not (isinstance(time_limit, numbers.Real) and math.isfinite(time_limit) and time_limit > 0):
        raise TabularError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
    time_limit = float(time_limit)
    A, values, primary, upl, lpl, cost, lower, upper, forced = data
    fail_closed = ~forced

    def result(suppressed, status, gap):
        return SuppressionResult(suppressed, float(cost[suppressed].sum()), status, gap)

    if not ((upl > 0) | (lpl > 0))[primary].any():
        return result(primary.copy(), "optimal", 0.0)
    start = time.monotonic()
    args = (A, values, primary, upl, lpl, cost, lower, upper, forced)
    exact = _totally_unimodular(A[:, ~forced])
    per_level = solver != "CP-SAT"  # CP-SAT scales lengths to integers itself
    tight = _build_model(*args, tight=True, per_level=per_level)
    if tight is None:  # a protection level exceeds the primary's own a-priori range
        return result(fail_closed, "infeasible", None)
    if exact:
        run = _solve(tight, solver, time_limit)
    else:
        # two stages: the tight model (fast, strong relaxation, every solution safe but maybe
        # dearer) gives an incumbent; the big-M model may improve on it and proves the bound.
        first = _solve(tight, solver, time_limit / 2)
        remaining = time_limit - (time.monotonic() - start)
        run = first
        if remaining > 0.01 * time_limit:
            big_m = _build_model(*args, tight=False, per_level=per_level)
            second = _solve(big_m, solver, remaining)
            run = _combine(first, second)
    if run.y is None:
        return result(fail_closed, run.status, None)
    suppressed = primary.copy()
    suppressed[tight.y_cells[run.y > 0.5]] = True
    if not _protects(A, values, suppressed, primary, upl, lpl, lower, upper):
        # MIP tolerances: a y within integrality tolerance of 0 may carry a witness; suppress it.
        suppressed[tight.y_cells[run.y > 1e-9]] = True
        if not _protects(A, values, suppressed, primary, upl, lpl, lower, upper):
            raise InternalError(
                f"the {solver} solution does not protect every primary in the LP check; "
                "retry with solver='CP-SAT', which solves the model in exact integers"
            )
    gap = 0.0 if run.status == "optimal" else _relative_gap(run.objective, run.bound)
    return result(suppressed, run.status, gap)


@dataclass(frozen=True, eq=False)
class _Run:
    status: str
    y: np.ndarray | None = None
    objective: float | None = None
    bound: float | None = None


def _solve(model, solver: str, time_limit: float) -> _Run:
    if solver == "CP-SAT":
        return _solve_cpsat(model, time_limit)
    return _solve_mip(model, solver, time_limit)


def _combine(first: _Run, second: _Run) -> _Run:
    """Best of the tight run (a restriction) and the big-M run (bound and proof)."""
    if second.status == "optimal" or (second.status == "infeasible" and first.y is None):
        return second
    found = [r for r in (first, second) if r.y is not None]
    if not found:
        return _Run("timeout")
    best = min(found, key=lambda r: r.objective)
    return _Run("feasible", best.y, best.objective, second.bound)


# ----------------------------------------------------------------------------- validation


def _validated(A, values, primary, upl, lpl, cost, lower, upper, forced):
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1 or not np.isfinite(values).all():
        raise TabularError("values must be a 1-D array of finite numbers (one per cell)")
    C = values.size
    A = sp.csr_matrix(A, dtype=np.float64)
    if A.shape[1] != C:
        raise TabularError(
            f"A has {A.shape[1]} columns but there are {C} values; A must be (equations, cells)"
        )

    def vector(name, x, kind=np.float64):
        try:
            return np.array(np.broadcast_to(np.asarray(x, dtype=kind), (C,)))
        except ValueError:
            raise TabularError(
                f"{name} must be a scalar or have one entry per cell ({C}), got shape {np.shape(x)}"
            ) from None

    primary = vector("primary", primary, bool)
    forced = np.zeros(C, bool) if forced is None else vector("forced", forced, bool)
    upl, lpl, cost = vector("upl", upl), vector("lpl", lpl), vector("cost", cost)
    lower, upper = vector("lower", lower), vector("upper", upper)
    for name, x in (("upl", upl), ("lpl", lpl), ("cost", cost)):
        bad = ~np.isfinite(x) | (x < 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise TabularError(f"{name} must be finite and >= 0; cell {i} has {x[i]!r}")
    bad = np.isnan(lower) | np.isnan(upper) | (lower > values) | (values > upper)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TabularError(
            f"a-priori bounds must satisfy lower <= value <= upper; cell {i} has "
            f"lower={lower[i]!r}, value={values[i]!r}, upper={upper[i]!r}"
        )
    both = primary & forced
    if both.any():
        raise TabularError(
            f"cells {np.flatnonzero(both)[:10].tolist()} are both primary and forced; a "
            "sensitive cell cannot be published: drop it from forced"
        )
    residual = np.abs(A @ values)
    scale = abs(A) @ np.abs(values) + 1.0
    if (residual > 1e-9 * scale).any():
        i = int(np.argmax(residual / scale))
        raise TabularError(
            f"the table does not add up: equation {i} of A gives {A[i] @ values!r} instead of "
            "0; pass the cell totals of one consistent table"
        )
    return A, values, primary, upl, lpl, cost, lower, upper, forced


def _solver_name(solver) -> str:
    name = str(solver).upper()
    if name in CPSAT_SOLVERS:
        return "CP-SAT"
    if name in MIP_SOLVERS:
        return name
    raise TabularError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")


# ----------------------------------------------------------------------------- the model


@dataclass(frozen=True, eq=False)
class _Model:
    """Solver-neutral MILP: variables [y | z...], rows lo <= M x <= hi."""

    y_cells: np.ndarray  # cell index of each y variable
    y_cost: np.ndarray
    var_lb: np.ndarray
    var_ub: np.ndarray
    room_lb: np.ndarray  # var_lb/var_ub without the tight caps (rooms and protection levels)
    room_ub: np.ndarray
    con_lb: np.ndarray
    con_ub: np.ndarray
    matrix: sp.csr_matrix


def _movable_components(A, movable):
    """Component label per cell (-1 if not movable) of the bipartite cell/equation graph."""
    cols = np.flatnonzero(movable)
    Am = A[:, cols]
    graph = sp.bmat([[None, Am], [Am.T, None]]).tocsr()
    _, labels = connected_components(graph, directed=False)
    out = np.full(A.shape[1], -1, dtype=np.int64)
    out[cols] = labels[A.shape[0] :]
    return out


def _build_model(
    A, values, primary, upl, lpl, cost, lower, upper, forced, *, tight: bool, per_level: bool
):
    """The compact MILP (module docstring), or None if a primary cannot move far enough.

    ``per_level``: each witness ``z`` is measured in units of its own protection level (the
    model is homogeneous in lengths, so this changes nothing but the numbers the solver sees).
    """
    cap = float(np.abs(values).max() + max(upl[primary].max(), lpl[primary].max()))
    up_room = np.minimum(upper - values, cap)
    dn_room = np.minimum(values - lower, cap)
    if ((upl > up_room) | (lpl > dn_room))[primary].any():
        return None
    movable = ~forced & ((up_room > 0) | (dn_room > 0))
    label = _movable_components(A, movable)
    tasks = [(p, +1.0, upl[p]) for p in np.flatnonzero(primary & (upl > 0))]
    tasks += [(p, -1.0, lpl[p]) for p in np.flatnonzero(primary & (lpl > 0))]
    used = np.isin(label, np.unique(label[[p for p, _, _ in tasks]]))
    y_cells = np.flatnonzero(used & ~primary)
    y_index = np.full(values.size, -1, dtype=np.int64)
    y_index[y_cells] = np.arange(y_cells.size)
    con_lb, con_ub, coo = [], [], []  # coo: (row, col, coef) arrays
    n_row = 0
    if not tight:  # cover rows: in every equation of a primary, another cell must move
        protected = primary & ((upl > 0) | (lpl > 0))
        eqs = np.flatnonzero(A[:, protected].getnnz(axis=1) > 0)
        sub = A[eqs][:, movable].tocsr()
        cols = np.flatnonzero(movable)
        for k in range(eqs.size):
            cells = cols[sub.indices[sub.indptr[k] : sub.indptr[k + 1]]]
            if primary[cells].sum() > 1:
                continue  # another primary moves with it
            free = y_index[cells[~primary[cells]]]
            if free.size == 0:
                return None
            coo.append((np.full(free.size, n_row), free, np.ones(free.size)))
            con_lb.append(np.ones(1))
            con_ub.append(np.full(1, np.inf))
            n_row += 1

    blocks = {}
    lbs, ubs = [np.zeros(y_cells.size)], [np.ones(y_cells.size)]
    room_lbs, room_ubs = [np.zeros(y_cells.size)], [np.ones(y_cells.size)]
    n_var = y_cells.size
    for p, direction, level in tasks:
        if label[p] not in blocks:
            cells = np.flatnonzero(label == label[p])
            sub = A[:, cells]
            blocks[label[p]] = (cells, sub[sub.getnnz(axis=1) > 0].tocoo())
        cells, eq = blocks[label[p]]
        unit = level if per_level else 1.0
        room_lb, room_ub = -dn_room[cells] / unit, up_room[cells] / unit
        at = np.searchsorted(cells, p)
        if direction > 0:
            room_lb[at] = level / unit
        else:
            room_ub[at] = -level / unit
        limit = level / unit if tight else np.inf  # see _totally_unimodular
        lb, ub = np.maximum(room_lb, -limit), np.minimum(room_ub, limit)
        lbs.append(lb)
        ubs.append(ub)
        room_lbs.append(room_lb)
        room_ubs.append(room_ub)
        coo.append((eq.row + n_row, eq.col + n_var, eq.data))
        con_lb.append(np.zeros(eq.shape[0]))
        con_ub.append(np.zeros(eq.shape[0]))
        n_row += eq.shape[0]
        # linking rows: z_c - up_room_c * y_c <= 0 and z_c + dn_room_c * y_c >= 0
        free = y_index[cells] >= 0
        for room, sign in ((ub, -1.0), (-lb, 1.0)):
            link = np.flatnonzero(free & (room > 0))
            rows = n_row + np.arange(link.size)
            coo.append((rows, n_var + link, np.ones(link.size)))
            coo.append((rows, y_index[cells[link]], sign * room[link]))
            con_lb.append(np.full(link.size, -np.inf if sign < 0 else 0.0))
            con_ub.append(np.full(link.size, 0.0 if sign < 0 else np.inf))
            n_row += link.size
        n_var += cells.size
    r, c, d = (np.concatenate(x) for x in zip(*coo, strict=True))
    return _Model(
        y_cells=y_cells,
        y_cost=cost[y_cells],
        var_lb=np.concatenate(lbs),
        var_ub=np.concatenate(ubs),
        room_lb=np.concatenate(room_lbs),
        room_ub=np.concatenate(room_ubs),
        con_lb=np.concatenate(con_lb),
        con_ub=np.concatenate(con_ub),
        matrix=sp.csr_matrix((d, (r, c)), shape=(n_row, n_var)),
    )


def _totally_unimodular(A) -> bool:
    """True if ``A`` passes the Heller-Tompkins test (so it is totally unimodular).

    Entries +-1, at most two per column, and rows split in two classes such that a column's two
    entries lie in different classes when they have the same sign and in the same class
    otherwise; 2-D tables without hierarchies and 1-D hierarchies pass. Then every circuit of
    ``ker A`` has entries in {0, +-1}, so any attacker witness decomposes conformally into
    circuits through the primary and can be scaled to ``|z_c| <= level`` for every cell: the
    cap ``min(room, level)`` loses no solution and gives a much stronger LP relaxation.
    """
    A = sp.csc_matrix(A, copy=True)
    A.eliminate_zeros()
    counts = np.diff(A.indptr)
    if A.nnz == 0:
        return True
    if counts.max() > 2 or not np.all(np.abs(A.data) == 1):
        return False
    two = np.flatnonzero(counts == 2)
    first, second = A.indptr[two], A.indptr[two] + 1
    r1, r2 = A.indices[first], A.indices[second]
    flip = (A.data[first] == A.data[second]).astype(np.int64)  # same sign: different classes
    R = A.shape[0]
    # parity graph on (row, class): consistent iff (r, 0) and (r, 1) never meet
    src = np.concatenate([r1, r1 + R])
    dst = np.concatenate([r2 + flip * R, r2 + (1 - flip) * R])
    graph = sp.coo_matrix((np.ones(src.size), (src, dst)), shape=(2 * R, 2 * R))
    _, label = connected_components(graph, directed=False)
    return bool(np.all(label[:R] != label[R:]))


# ----------------------------------------------------------------------------- solvers


def _solve_mip(model: _Model, solver: str, time_limit: float) -> _Run:
    """Solve with an OR-Tools MPSolver backend (SCIP, HiGHS, CBC), single-threaded."""
    from ortools.linear_solver import linear_solver_pb2, pywraplp
    from ortools.linear_solver.python import model_builder

    n_y = model.y_cells.size
    builder = model_builder.Model()
    objective = np.zeros(model.var_lb.size)
    # costs in units of a power of two near the largest (exact): solver tolerances are absolute
    top = float(model.y_cost.max()) if n_y else 1.0
    unit = 2.0 ** math.frexp(top)[1] if top > 1.0 else 1.0
    objective[:n_y] = model.y_cost / unit
    builder.helper.fill_model_from_sparse_data(
        model.var_lb, model.var_ub, objective, model.con_lb, model.con_ub, model.matrix
    )
    for i in range(n_y):
        builder.helper.set_var_integrality(i, True)
    mp = pywraplp.Solver.CreateSolver(solver)
    if mp is None:
        raise TabularError(f"OR-Tools was built without {solver}; use solver='CP-SAT'")
    error = mp.LoadModelFromProto(builder.export_to_proto())
    if error:
        raise InternalError(f"OR-Tools rejected the suppression model: {error}")
    mp.SuppressOutput()
    if solver == "HIGHS":  # HiGHS prints a banner to stdout unless told not to
        mp.SetSolverSpecificParametersAsString("output_flag=false")
    mp.SetNumThreads(1)
    mp.SetTimeLimit(max(1, int(time_limit * 1000)))
    params = pywraplp.MPSolverParameters()
    params.SetDoubleParam(params.RELATIVE_MIP_GAP, 1e-9)
    code = mp.Solve(params)
    if code == pywraplp.Solver.INFEASIBLE:
        return _Run("infeasible")
    if code == pywraplp.Solver.MODEL_INVALID:
        raise InternalError(f"{solver} found the suppression model invalid")
    response = linear_solver_pb2.MPSolutionResponse()
    mp.FillSolutionResponseProto(response)
    if code not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE) or not len(
        response.variable_value
    ):
        # NOT_SOLVED (SCIP, CBC) or an unknown status (HiGHS: 99) when the limit struck first
        return _Run("timeout", bound=_scaled(_field(response, "best_objective_bound"), unit))
    y = np.asarray(response.variable_value[:n_y], dtype=np.float64)
    status = "optimal" if code == pywraplp.Solver.OPTIMAL else "feasible"
    bound = _scaled(_field(response, "best_objective_bound"), unit)
    return _Run(status, y, response.objective_value * unit, bound)


def _field(message, name):
    return float(getattr(message, name)) if message.HasField(name) else None


def _scaled(x, unit):
    return None if x is None else x * unit


def _decimal_scale(x: np.ndarray, limit: float) -> float:
    """Smallest 10**k (k <= 6) making every entry integral, reduced while max|x|*10**k > limit."""
    x = np.abs(x[np.isfinite(x)])
    big = float(x.max()) if x.size else 0.0
    for k in range(7):
        if big * 10.0**k > limit:
            break
        scaled = x * 10.0**k
        if np.all(np.abs(scaled - np.round(scaled)) <= _FLOAT_NOISE * np.maximum(1.0, scaled)):
            return 10.0**k
    k = math.floor(math.log10(limit / big)) if big > 0 else 0
    return 10.0 ** min(k, 6)


def _solve_cpsat(model: _Model, time_limit: float) -> _Run:
    """Solve with CP-SAT after the conservative integer scaling of the module docstring."""
    from ortools.sat.python import cp_model

    n_y = model.y_cells.size
    room_lb, room_ub = model.room_lb[n_y:], model.room_ub[n_y:]
    m = model.matrix.tocsr()
    y_coef = m[:, :n_y]
    s = _decimal_scale(np.concatenate([room_lb, room_ub, y_coef.data]), _MAX_SCALED)
    eps = _FLOAT_NOISE

    def down(x):
        return np.floor(x * s + eps * np.maximum(1, abs(x * s)))

    def up(x):
        return np.ceil(x * s - eps * np.maximum(1, abs(x * s)))

    # rooms and protection levels round inwards (safe); the tight caps only restrict the
    # witnesses, so they round outwards, or a cap equal to a level would fall below it
    z_lb = np.maximum(up(room_lb), down(model.var_lb[n_y:]))
    z_ub = np.minimum(down(room_ub), up(model.var_ub[n_y:]))
    lb = np.concatenate([np.zeros(n_y), z_lb])
    ub = np.concatenate([np.ones(n_y), z_ub])
    if (lb > ub).any():  # rounding closed a primary's witness: conservative infeasible
        return _Run("infeasible")
    coef = m.copy()
    is_y = coef.indices < n_y
    if np.any(np.abs(coef.data[~is_y] - np.round(coef.data[~is_y])) > 0):
        raise TabularError("CP-SAT needs an integral constraint matrix A (entries +1/-1)")
    coef.data[is_y] = np.sign(coef.data[is_y]) * down(np.abs(coef.data[is_y]))
    # a linking row z_c -/+ room_c * y <= / >= 0 takes the rounded bound of its z_c
    row = np.repeat(np.arange(coef.shape[0]), np.diff(coef.indptr))
    z_of_row = np.full(coef.shape[0], -1)
    z_of_row[row[~is_y]] = coef.indices[~is_y]
    link = is_y & (z_of_row[row] >= 0)
    z = z_of_row[row[link]]
    coef.data[link] = np.where(coef.data[link] < 0, -ub[z], -lb[z])
    cost_scale = _decimal_scale(model.y_cost, 2.0**50 / max(1, n_y))
    cost = np.round(model.y_cost * cost_scale)
    cost[(model.y_cost > 0) & (cost < 1)] = 1

    cp = cp_model.CpModel()
    proto = cp.proto
    for lo, hi in zip(lb.astype(np.int64).tolist(), ub.astype(np.int64).tolist(), strict=True):
        proto.variables.add().domain.extend([lo, hi])
    big = cp_model.INT_MAX
    ptr, idx, dat = coef.indptr, coef.indices, coef.data.astype(np.int64)
    for r in range(coef.shape[0]):
        lo = -big if np.isneginf(model.con_lb[r]) else int(model.con_lb[r])
        hi = big if np.isposinf(model.con_ub[r]) else int(model.con_ub[r])
        linear = proto.constraints.add().linear
        linear.vars.extend(idx[ptr[r] : ptr[r + 1]].tolist())
        linear.coeffs.extend(dat[ptr[r] : ptr[r + 1]].tolist())
        linear.domain.extend([lo, hi])
    proto.objective.vars.extend(range(n_y))
    proto.objective.coeffs.extend(cost.astype(np.int64).tolist())
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = CPSAT_WORKERS
    solver.parameters.random_seed = 0
    code = solver.solve(cp)
    if code == cp_model.INFEASIBLE:
        return _Run("infeasible")
    if code == cp_model.UNKNOWN:
        return _Run("timeout", bound=solver.best_objective_bound)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise InternalError(f"CP-SAT returned {solver.status_name(code)} on the suppression model")
    y = np.asarray(list(solver.response_proto.solution), dtype=np.float64)[:n_y]
    status = "optimal" if code == cp_model.OPTIMAL else "feasible"
    return _Run(status, y, solver.objective_value, solver.best_objective_bound)


def _relative_gap(objective, bound) -> float | None:
    if objective is None or not math.isfinite(objective):
        return None
    bound = max(bound, 0.0) if bound is not None and math.isfinite(bound) else 0.0
    return 0.0 if objective <= 0 else max(0.0, (objective - bound) / objective)


# ----------------------------------------------------------------------------- LP check


def attacker_ranges(A, values, suppressed, lower, upper, targets):
    """LP range ``[lo, hi]`` of each target cell for an attacker who knows the published cells.

    Solves ``min/max x_t`` subject to ``A x = 0``, ``x_c = values_c`` for published cells and
    ``lower <= x <= upper`` (scipy ``linprog``/HiGHS), on the connected component of ``t``.
    Published targets get ``lo = hi = value``. Independent of the MILP; used to check it.

    Example:
        >>> import numpy as np, scipy.sparse as sp
        >>> A = sp.csr_matrix(np.array([[1.0, 1.0, -1.0]]))  # a + b = total
        >>> v = np.array([2.0, 3.0, 5.0])
        >>> lo, hi = attacker_ranges(A, v, np.array([True, True, False]), 0.0, np.inf, [0])
        >>> lo.tolist(), hi.tolist()
        ([0.0], [5.0])
    """
    A = sp.csr_matrix(A, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    suppressed = np.asarray(suppressed, dtype=bool)
    lower = np.broadcast_to(np.asarray(lower, dtype=np.float64), values.shape)
    upper = np.broadcast_to(np.asarray(upper, dtype=np.float64), values.shape)
    targets = np.atleast_1d(np.asarray(targets, dtype=np.int64))
    lo, hi = values[targets].copy(), values[targets].copy()
    rhs = -(A @ np.where(suppressed, 0.0, values))
    label = _movable_components(A, suppressed)
    for i, t in enumerate(targets):
        if not suppressed[t]:
            continue
        cells = np.flatnonzero(label == label[t])
        sub = A[:, cells]
        keep = sub.getnnz(axis=1) > 0
        bounds = np.column_stack([lower[cells], upper[cells]])
        objective = (cells == t).astype(np.float64)
        for sign in (1.0, -1.0):
            res = linprog(
                sign * objective, A_eq=sub[keep], b_eq=rhs[keep], bounds=bounds, method="highs"
            )
            if res.status == 3:
                value = -sign * np.inf
            elif res.status == 0:
                value = sign * res.fun
            else:
                raise InternalError(f"attacker LP for cell {t} failed: {res.message}")
            if sign > 0:
                lo[i] = value
            else:
                hi[i] = value
    return lo, hi


def _protects(A, values, suppressed, primary, upl, lpl, lower, upper) -> bool:
    targets = np.flatnonzero(primary & ((upl > 0) | (lpl > 0)))
    lo, hi = attacker_ranges(A, values, suppressed, lower, upper, targets)
    v = values[targets]
    tol = CHECK_TOLERANCE * np.maximum.reduce([np.ones_like(v), abs(v), upl[targets]])
    return bool(np.all(hi >= v + upl[targets] - tol) and np.all(lo <= v - lpl[targets] + tol))
