"""Controlled rounding of a whole table (the per-cell rules are in sqlsdc.mechanisms.rounding).

**Controlled rounding** (:func:`controlled_round`) is the relaxed 0-1 model of Salazar González,
"A New Approach to Round Tabular Data", PSD 2006, LNCS 4302, pp. 25-34 (digest §3). Every cell,
inner or margin, is replaced by a multiple of the base β and the rounded table is exactly
additive (``A @ rounded == 0`` on every equation, hierarchies and margins defined by several
equations included). In units of β, with ``⌊a⌋`` and ``⌈a⌉`` the adjacent multiples:

* inner cell i: ``k_i = ⌊a_i⌋ + x_i``, ``x_i ∈ {0, 1}``; ``x_i = 0`` when a_i is a multiple
  (the zero restriction, eq. 3);
* margin j: ``⌊a_j⌋ − y ≤ k_j ≤ ⌈a_j⌉ + y`` (eq. 2; the printed ``⌈a_i⌉`` is ``⌈a_j⌉``,
  digest errata 3) and ``A k = 0``;
* objective (eq. 1) ``|I|·y + Σ w_i x_i`` with ``w_i = ⌈a_i⌉ + ⌊a_i⌋ − 2a_i = β − 2r_i``, which
  is Σ |rounded − value| over the inner cells up to a constant: first the relaxation y (how far
  the worst margin lies beyond its adjacent multiples), then the distance.

y = 0 is a zero-restricted controlled rounding. When none exists (3-D tables, hierarchies: see
Salazar's Tables 1-3) the relaxation still returns an additive table and reports which margins
left their adjacent multiples and by how much. Salazar solves the model by branch-and-bound;
here CP-SAT solves it lexicographically instead of with the |I| weight: (1) minimise y,
(2) if y > 0, minimise the summed excess of the margins, so that as few and as little as
possible are relaxed, (3) minimise the distance, each stage keeping the optimum of the ones
before. A conventional rounding of the inner cells with margins recomputed is a feasible
solution of (1) (Salazar §3: "finding some feasible solution is trivial") and is the hint,
and the answer if the solver finds nothing better in time.

Large tables are solved by *partition* along a hierarchical dimension, top-down as in HiTaS and
τ-ARGUS's modular approach: first the sub-table of that dimension's total and top-level codes,
then for each parent code the sub-table of the parent and its children, with the parent's cells
fixed at their values rounded before. Each sub-table is Salazar's model with constants. The
partitioned rounding is additive, so it then starts the whole-table model, which improves it for
the time left (and may prove it optimal).

**Per-cell rules** (Cox & Kim 2006: conventional, modified conventional, 50/50, unbiased) live
in :mod:`sqlsdc.mechanisms.rounding`, as pure math shared with the SQL rewrite
:mod:`sqlsdc.rewrite.round`; they are re-exported here and from :mod:`sqlsdc.tabular`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import sparse

from sqlsdc.errors import InternalError, TabularError
from sqlsdc.mechanisms.rounding import (  # noqa: F401  (re-exported: the per-cell rules)
    check_base,
    prf_uniforms,
    round_conventional,
    round_modified_conventional,
    round_unbiased,
    round_zero_restricted,
)
from sqlsdc.tabular.model import Table

#: Tables with more cells are partitioned by ``partition="auto"`` when a dimension is
#: hierarchical (benchmarks/README.md: 12 s to the optimum of a whole 10^4-cell 2-D table; its
#: sub-tables give a zero-restricted rounding in under 2 s, improved as a whole after).
AUTO_PARTITION_CELLS = 5_000

#: CP-SAT workers, one per core of the 2-core machine (reference/ecosystem.md §6). One worker
#: found no zero-restricted rounding of a 9,261-cell 3-D table in 15 s where two found one;
#: interleaved (deterministic) workers found none either. Two workers return any of several
#: equally good roundings, so the objective carries seeded tie-breaks (see ``_problem``).
CPSAT_WORKERS = 2

_SNAP = 1e-9  # a value within this (relative) of a multiple of β is that multiple
_MAX_COST = 10**6  # largest objective coefficient after scaling non-integer weights


@dataclass(frozen=True)
class RoundingResult:
    """A controlled rounding of a table.

    Attributes:
        cells: one row per cell in table order: the dimensions (total code on margins),
            ``value``, ``rounded`` (a multiple of the base) and ``change = rounded - value``.
        status: ``"optimal"`` (lexicographic optimum proven), ``"feasible"`` (zero-restricted,
            optimum not proven within the time limit) or ``"near_feasible"`` (some margins lie
            beyond their adjacent multiples; see ``violations`` and ``excess_bound``).
        base: the rounding base β.
        max_excess: the relaxation y·β: how far the worst margin lies beyond its adjacent
            multiples (0 for a zero-restricted rounding).
        excess_bound: proven lower bound on ``max_excess`` over all roundings; equal to it when
            no better rounding exists (0 when nothing was proven).
        violations: the margins beyond their adjacent multiples: dimensions, ``value``,
            ``rounded``, ``lower``/``upper`` (the allowed multiples) and ``excess``.
        distance: Σ weight·|rounded - value| over the inner cells (the second objective).
        partition: the dimension the table was partitioned by, or ``None``.
        subtables: models solved: 1, or the sub-tables plus the whole-table improvement.
        seconds: wall time.
    """

    cells: pd.DataFrame = field(repr=False)
    status: str
    base: int
    max_excess: float
    excess_bound: float
    violations: pd.DataFrame = field(repr=False)
    distance: float
    partition: str | None
    subtables: int
    seconds: float


def controlled_round(
    cells_or_table: pd.DataFrame | Table,
    base: int,
    *,
    dims: Sequence[str] | None = None,
    value: str = "value",
    hierarchies: Mapping | None = None,
    zero_restricted: bool = True,
    weights: np.ndarray | Callable | None = None,
    time_limit: float = 30.0,
    partition: str | None = "auto",
    seed: int = 0,
    keep: np.ndarray | None = None,
    fixed: np.ndarray | None = None,
) -> RoundingResult:
    """Round every cell of a table to a multiple of ``base`` keeping the table additive.

    Salazar González (2006)'s relaxed controlled rounding, eqs. 1-4 (see the module docstring),
    solved with CP-SAT, lexicographically: first the largest excess of a margin beyond its
    adjacent multiples, then the summed excess, then the weighted distance to the original
    values over the inner cells.

    Args:
        cells_or_table: a :class:`Table`, or aggregated inner cells (margin rows optional) as
            :meth:`Table.from_cells` takes them.
        base: the rounding base β, an integer >= 2.
        dims, value, hierarchies: as in :meth:`Table.from_cells` (ignored for a ``Table``).
        zero_restricted: keep cells that are multiples of the base unchanged (Salazar eq. 3);
            ``False`` lets them move by one base (never across zero).
        weights: per-cell weights of |rounded - value| in the distance (only inner cells count):
            an array in table order or a function of the cells DataFrame; default 1
            (Salazar's ``w_i = β - 2r_i``).
        time_limit: seconds for the whole job (all stages and sub-tables).
        partition: ``"auto"`` partitions tables of more than ``AUTO_PARTITION_CELLS`` cells
            along their largest hierarchical dimension; a dimension name forces it; ``None``
            solves the whole table as one model. A partitioned rounding is then improved as a
            whole for the time left.
        seed: CP-SAT's random seed; the search is deterministic for a fixed seed when it ends
            before the time limit.
        keep: per cell in table order, the value an earlier rounding published (NaN where
            none): as many cells as can be are kept on it where it is still a multiple the
            cell may take, before the distance is minimised (a stage after the margins'
            excess). A count rounded down in one version and up in the next lies strictly
            between the two multiples (red team s41c: 7 of 29 unchanged cells of a table
            replaced after six one-person changes, 4 possible counts instead of 9).
        fixed: per cell in table order, the multiple it must take (NaN where the model
            decides), one of its adjacent multiples: a cell rounded beforehand by a per-cell
            rule (:func:`round_unbiased` of the small counts in a rounding job), which the
            model holds as a constant; the margins follow, relaxed if they must.

    Returns:
        A :class:`RoundingResult`.

    Raises:
        TabularError: a base that is not an integer >= 2, non-finite values or weights, an
            unknown or flat partition dimension, or a table with several equations per margin
            (linked tables) that has no rounding with all inner cells on adjacent multiples.

    Example:
        >>> df = pd.DataFrame({"r": ["I", "I", "II", "II"], "c": ["A", "B", "A", "B"],
        ...                    "value": [20, 8, 19, 22]})
        >>> out = controlled_round(df, 5, dims=["r", "c"])
        >>> out.status, out.cells[["r", "c", "value", "rounded"]].values.tolist()
        ('optimal', [['Total', 'Total', 69.0, 70], ['Total', 'A', 39.0, 40], \
['Total', 'B', 30.0, 30], ['I', 'Total', 28.0, 30], ['I', 'A', 20.0, 20], \
['I', 'B', 8.0, 10], ['II', 'Total', 41.0, 40], ['II', 'A', 19.0, 20], ['II', 'B', 22.0, 20]])
    """
    started = time.perf_counter()
    base = check_base(base)
    if not time_limit > 0:
        raise TabularError(f"time_limit must be > 0 seconds; got {time_limit!r}")
    table = _as_table(cells_or_table, dims, value, hierarchies)
    values = table.values
    if not np.all(np.isfinite(values)):
        raise TabularError("controlled_round() needs finite cell values; impute or drop NaN/inf")
    problem = _problem(table, values, base, zero_restricted, weights, seed, keep, fixed)
    deadline = started + float(time_limit)
    dim = _partition_dim(table, partition)
    solved = _solve_partitioned(table, dim, problem, deadline, seed) if dim else None
    if solved is not None:  # improve the whole table from the partitioned rounding, time left
        k, _, _, models = solved
        k, status, y_bound, _ = _solve(problem, deadline, seed, k, True)
        solved = (k, status, y_bound, models + 1)
    else:  # not partitioned, or a sub-table could not match its fixed margins
        dim = None
        hint, additive = _conventional_hint(table, problem)
        solved = _solve(problem, deadline, seed, hint, additive)
    k, status, y_bound, models = solved
    if k is None:
        raise TabularError(
            f"no additive rounding to multiples of {base} keeps every inner cell on an adjacent "
            f"multiple ({status}); this happens when a margin is defined by several equations "
            "(linked tables, Salazar's Fig. 1) — round the tables separately, pass "
            "zero_restricted=False, or raise time_limit"
        )
    return _result(table, problem, base, values, k, status, y_bound, dim, models, started)


# --- the model -------------------------------------------------------------------------------


@dataclass
class _Problem:
    """Salazar's model in units of β for a set of cells.

    ``low``/``high``: the allowed multiples (adjacent ones; ``low == high`` for a multiple
    under the zero restriction), ``center``: the multiple a movable multiple starts from,
    ``multiple``, ``inner``, ``cost``: integer cost of one base up (non-multiples, Salazar's
    β - 2r scaled) or of one base moved (movable multiples), ``tiebreak``/``tie_scale``: the
    distance objective is ``cost·tie_scale + tiebreak`` with ``tie_scale > Σ tiebreak``, so the
    seed's random tie-breaks only choose among roundings of equal distance, ``weight``: the user's
    weights,
    ``scaled``: value / β, ``A``: constraint rows, ``fixed``/``fixed_k``: cells rounded in an
    earlier sub-table, ``slack``: a bound on any margin's excess (the number of inner cells:
    each moves by less than one base), and ``kept``/``kept_k``: cells to keep, as far as they
    can be, on the multiple an earlier rounding published (``controlled_round``'s ``keep``).
    """

    scaled: np.ndarray
    low: np.ndarray
    high: np.ndarray
    center: np.ndarray
    multiple: np.ndarray
    inner: np.ndarray
    cost: np.ndarray
    tiebreak: np.ndarray
    tie_scale: int
    weight: np.ndarray
    A: sparse.csr_matrix
    fixed: np.ndarray
    fixed_k: np.ndarray
    slack: int
    kept: np.ndarray
    kept_k: np.ndarray

    def subset(self, cells, rows, fixed, fixed_k) -> _Problem:
        """The sub-table of ``cells`` with equations ``rows``, some cells fixed at ``fixed_k``."""
        return _Problem(
            self.scaled[cells],
            self.low[cells],
            self.high[cells],
            self.center[cells],
            self.multiple[cells],
            self.inner[cells],
            self.cost[cells],
            self.tiebreak[cells],
            self.tie_scale,
            self.weight[cells],
            self.A[rows][:, cells].tocsr(),
            fixed,
            fixed_k,
            self.slack,
            self.kept[cells],
            self.kept_k[cells],
        )

    @property
    def free(self) -> np.ndarray:
        """Cells with a decision: not fixed and not an inner multiple under zero restriction."""
        return ~self.fixed & ~(self.inner & (self.low == self.high))

    def constants(self) -> np.ndarray:
        return np.where(self.fixed, self.fixed_k, self.low)

    def excess(self, k: np.ndarray) -> np.ndarray:
        """How many bases each free margin lies beyond its allowed multiples."""
        e = np.maximum(0, np.maximum(self.low - k, k - self.high))
        return np.where(self.free & ~self.inner, e, 0)


@dataclass
class _Vars:
    model: object  # the CP-SAT model
    k: dict  # free cell -> rounded value in bases
    excess: dict  # free margin -> excess in bases
    moves: dict  # movable multiple -> |k - center|
    y: object  # largest excess
    held: bool = False  # the cells to keep are held as near as :func:`_keep` found


def _solve(problem: _Problem, deadline: float, seed: int, hint, hint_is_feasible: bool):
    """Solve the lexicographic stages; returns ``(k, status, y_bound, 1)``.

    First the zero-restricted model (margins on their adjacent multiples, Salazar's y = 0)
    with the distance objective: a solution settles stages 1-2 at once. Only when it is
    infeasible, or finds nothing in half the time, the relaxed stages run: (1) minimise y,
    (2) if y > 0 the summed excess, (3) the distance. ``status`` is "optimal" when every stage
    was proven, "feasible" otherwise, or the CP-SAT status name with ``k = None`` when there is
    no solution at all (only possible for margins with several equations).
    """
    from ortools.sat.python import cp_model

    best = hint if hint_is_feasible else None
    if best is not None and not problem.excess(best).any():
        return _minimise_distance(problem, _build(problem, relaxed=False), best, deadline, seed)
    tight = _build(problem, relaxed=False)
    if (problem.kept & problem.free).any():  # a rounding replaced: what it can keep first
        found = _keep(problem, tight, None, deadline, seed)
        if tight.held:
            return _minimise_distance(problem, tight, found, deadline, seed)
    _hint(tight, problem, hint)
    tight.model.minimize(_distance(problem, tight))
    code, sol = _run(tight.model, deadline, seed, share=0.5)
    if sol is not None:
        k = _values(sol, tight, problem)
        if code == cp_model.OPTIMAL:
            return k, "optimal", 0, 1
        return _minimise_distance(problem, tight, k, deadline, seed)
    y_bound = 1 if code == cp_model.INFEASIBLE else 0
    var = _build(problem, relaxed=True)
    proven = code == cp_model.INFEASIBLE
    _hint(var, problem, hint)
    var.model.minimize(var.y)  # stage 1: the largest excess of a margin
    code, sol = _run(var.model, deadline, seed, share=0.5)
    if sol is None:
        return best, cp_model.CpSolver().status_name(code) if best is None else "feasible", 0, 1
    proven &= code == cp_model.OPTIMAL
    y_star = round(sol.objective_value)
    y_bound = max(y_bound, round(sol.best_objective_bound))
    var.model.add(var.y <= y_star)
    best = _values(sol, var, problem)
    if y_star > 0:  # stage 2: relax as few margins by as little as possible
        _hint(var, problem, best)
        var.model.minimize(sum(var.excess.values()))
        code, sol = _run(var.model, deadline, seed, share=0.5)
        proven &= code == cp_model.OPTIMAL
        if sol is not None:
            best = _values(sol, var, problem)
        var.model.add(sum(var.excess.values()) <= int(problem.excess(best).sum()))
    k, status, _, _ = _minimise_distance(problem, var, best, deadline, seed)
    return k, "optimal" if proven and status == "optimal" else "feasible", y_bound, 1


def _minimise_distance(problem: _Problem, var: _Vars, start, deadline: float, seed: int):
    """Stage 3, Salazar's Σ w_i x_i, from the solution ``start`` (kept if nothing better),
    after the cells to keep are kept as far as they can be (:func:`_keep`)."""
    from ortools.sat.python import cp_model

    start = _keep(problem, var, start, deadline, seed)
    _hint(var, problem, start)
    var.model.minimize(_distance(problem, var))
    code, sol = _run(var.model, deadline, seed, share=1.0)
    if sol is None:
        return start, "feasible", 0, 1
    return _values(sol, var, problem), "optimal" if code == cp_model.OPTIMAL else "feasible", 0, 1


def _keep(problem: _Problem, var: _Vars, start, deadline: float, seed: int):
    """Minimise how far (in bases) the cells to keep lie from the multiples published before,
    hinted with those multiples, and hold the best found (or ``start``'s, a solution or None)
    for the stages after (``var.held``); returns that solution, or ``start`` when there is no
    cell to keep or nothing was found in time."""
    cells = [i for i in var.k if problem.kept[i]]
    if var.held or not cells:
        return start
    model = var.model
    far = []
    for i in cells:
        lo, hi = _domain(var.k[i])
        d = model.new_int_var(0, hi - lo, f"d{i}")
        model.add_abs_equality(d, var.k[i] - int(problem.kept_k[i]))
        far.append(d)
    guess = _nearest(problem) if start is None else start
    _hint(var, problem, np.where(problem.kept, problem.kept_k, guess))
    model.minimize(sum(far))
    _code, sol = _run(model, deadline, seed, share=0.5)
    if sol is not None:
        start = _values(sol, var, problem)
    if start is not None:
        model.add(sum(far) <= int(np.abs(start[cells] - problem.kept_k[cells]).sum()))
        var.held = True
    return start


def _build(problem: _Problem, *, relaxed: bool) -> _Vars:
    """CP-SAT model: an integer per free cell (in bases) and the equations; ``relaxed`` lets
    margins leave their adjacent multiples by an excess e <= y (else they stay on them)."""
    from ortools.sat.python import cp_model

    p = problem
    free = p.free
    slack = p.slack if relaxed else 0
    model = cp_model.CpModel()
    var = _Vars(model, {}, {}, {}, model.new_int_var(0, slack, "y"))
    for i in np.flatnonzero(free).tolist():
        lo, hi = int(p.low[i]), int(p.high[i])
        if p.inner[i]:
            k = var.k[i] = model.new_int_var(lo, hi, f"k{i}")
            if p.multiple[i]:  # a movable multiple pays per base moved
                m = var.moves[i] = model.new_int_var(0, 1, f"m{i}")
                model.add_abs_equality(m, k - int(p.center[i]))
            continue
        k = var.k[i] = model.new_int_var(lo - slack, hi + slack, f"k{i}")
        if relaxed:
            e = var.excess[i] = model.new_int_var(0, slack, f"e{i}")
            model.add(k + e >= lo)
            model.add(k - e <= hi)
            model.add(e <= var.y)
    const = p.constants()
    A = p.A
    for r in range(A.shape[0]):
        cols = A.indices[A.indptr[r] : A.indptr[r + 1]]
        coef = A.data[A.indptr[r] : A.indptr[r + 1]]
        on = free[cols]
        rhs = -int(np.dot(coef[~on], const[cols[~on]]))
        if not on.any():
            if rhs != 0:
                raise InternalError("a sub-table equation over fixed cells does not add up")
            continue
        terms = [var.k[c] for c in cols[on].tolist()]
        model.add(cp_model.LinearExpr.weighted_sum(terms, coef[on].tolist()) == rhs)
    return var


def _distance(problem: _Problem, var: _Vars):
    """Σ cost·k over free non-multiples (Σ w_i x_i up to a constant) + Σ cost·|moved|."""
    from ortools.sat.python import cp_model

    terms, coefs = [], []
    for i, k in var.k.items():
        if problem.inner[i] and not problem.multiple[i]:
            terms.append(k)
            coefs.append(int(problem.cost[i] * problem.tie_scale + problem.tiebreak[i]))
    for i, m in var.moves.items():
        terms.append(m)
        coefs.append(int(problem.cost[i] * problem.tie_scale + problem.tiebreak[i]))
    return cp_model.LinearExpr.weighted_sum(terms, coefs)


def _hint(var: _Vars, problem: _Problem, k) -> None:
    model = var.model
    model.clear_hints()
    if k is None:
        return
    e = problem.excess(k)
    for i, v in var.k.items():
        model.add_hint(v, int(np.clip(k[i], *_domain(v))))
    for i, v in var.excess.items():
        model.add_hint(v, int(e[i]))
    for i, v in var.moves.items():
        model.add_hint(v, abs(int(k[i] - problem.center[i])))
    model.add_hint(var.y, int(min(e.max(initial=0), _domain(var.y)[1])))


def _domain(v) -> tuple[int, int]:
    """A variable's bounds. Not ``domain[-1]``: OR-Tools 9.15's repeated field reads 0 there,
    which clipped every hint of a positive cell to 0."""
    domain = list(v.proto.domain)
    return int(domain[0]), int(domain[-1])


def _run(model, deadline: float, seed: int, share: float):
    """Solve with ``share`` of the time left; returns (status code, solver or None)."""
    from ortools.sat.python import cp_model

    left = deadline - time.perf_counter()
    if left <= 0.01:
        return cp_model.UNKNOWN, None
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = left * share
    solver.parameters.num_workers = CPSAT_WORKERS
    solver.parameters.random_seed = int(seed)
    code = solver.solve(model)
    if code == cp_model.MODEL_INVALID:
        raise InternalError(f"CP-SAT rejected the rounding model: {model.validate()}")
    return code, solver if code in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None


def _values(solver, var: _Vars, problem: _Problem) -> np.ndarray:
    k = problem.constants().copy()
    if var.k:
        cells = np.fromiter(var.k, dtype=np.int64, count=len(var.k))
        index = np.fromiter((v.index for v in var.k.values()), dtype=np.int64, count=len(cells))
        k[cells] = np.asarray(solver.response_proto.solution, dtype=np.int64)[index]
    return k


def _conventional_hint(table: Table, problem: _Problem) -> tuple[np.ndarray, bool]:
    """Inner cells rounded to the nearest allowed multiple and margins recomputed from them
    through X: additive, hence feasible for stage 1 (Salazar §3's trivial solution). Without a
    usable X (linked tables) margins are rounded on their own and the hint is not additive."""
    k = _nearest(problem)
    inner = np.flatnonzero(problem.inner)
    X, at = table.X, table.inner
    if X is None or len(at) != len(inner) or not np.array_equal(np.sort(at), inner):
        return k, False
    rounded = np.asarray(sparse.csc_matrix(X).T.astype(np.int64) @ k[at]).ravel()
    return rounded.astype(np.int64), True


def _nearest(problem: _Problem) -> np.ndarray:
    """Every cell on its nearest allowed multiple (fixed cells at their values)."""
    k = np.where(problem.scaled - problem.low >= 0.5, problem.high, problem.low)
    k = np.where(problem.multiple, problem.center, k)
    return np.where(problem.fixed, problem.fixed_k, k)


# --- partitioning ----------------------------------------------------------------------------


def _partition_dim(table: Table, partition) -> str | None:
    """The dimension to partition by: ``partition`` itself, or for "auto" the hierarchical
    dimension with most codes when the table has more than ``AUTO_PARTITION_CELLS`` cells."""
    deep = [
        d
        for d in table.dims
        if table.hierarchies.get(d) is not None and table.hierarchies[d].depth.max() >= 2
    ]
    if partition is None or partition is False:
        return None
    if partition == "auto":
        if len(table.cells) <= AUTO_PARTITION_CELLS or not deep:
            return None
        return max(deep, key=lambda d: len(table.hierarchies[d].codes))
    if partition not in table.dims:
        raise TabularError(
            f"partition must be None, 'auto' or a dimension of the table {list(table.dims)}; "
            f"got {partition!r}"
        )
    if partition not in deep:
        raise TabularError(
            f"cannot partition by {partition!r}: it has no level between its codes and the total "
            f"(sub-tables must share margins that exist in the table); use a hierarchical "
            f"dimension ({deep or 'none here'}) or partition=None"
        )
    return partition


def _solve_partitioned(table: Table, dim: str, problem: _Problem, deadline: float, seed: int):
    """Round the sub-tables of ``dim`` top-down, fixing the cells shared with those before.

    The first sub-table holds the cells whose ``dim`` code is the total or a top-level code;
    then, for each parent code in pre-order, the cells of its children with the parent's cells
    fixed. Each equation lies in exactly one sub-table (a ``dim`` equation in its parent's, the
    other dimensions' equations in that of their ``dim`` code), so the whole table is additive.
    Returns ``None`` when a sub-table cannot match its fixed cells (the caller then solves the
    whole table); the status is at best "feasible": sub-table optima need not be the table's.
    """
    h = table.hierarchies[dim]
    code = np.array([h.index[str(c)] for c in table.cells[dim]], dtype=np.int64)
    parent = np.asarray(h.parent_index, dtype=np.int64)
    owner = np.where(code == 0, 0, parent[code])  # the sub-table whose free cell this is
    support = abs(problem.A).astype(bool).astype(np.int64).tocsr()
    k = problem.constants().copy()
    left = np.ones(len(k), dtype=bool)  # cells not yet rounded
    parents = [g for g in range(len(h.codes)) if not h.is_leaf[g]]
    models = 0
    for g in parents:
        free = owner == g
        fixed = (code == g) & (g != 0)
        member = free | fixed
        cells = np.flatnonzero(member)
        outside = support @ (~member).astype(np.int64)
        touches = support @ free.astype(np.int64)
        rows = np.flatnonzero((outside == 0) & (touches > 0))
        sub = problem.subset(cells, rows, fixed[cells], k[cells])
        now = time.perf_counter()
        share = free.sum() / max(1, left.sum())
        sub_deadline = now + max(0.0, deadline - now) * share
        hint = _nearest(sub)
        k_sub, _, _, _ = _solve(sub, sub_deadline, seed, hint, False)
        models += 1
        if k_sub is None:
            return None
        k[cells] = k_sub
        left &= ~free
    return k, "feasible", 0, models


# --- inputs and result -----------------------------------------------------------------------


def _as_table(data, dims, value, hierarchies) -> Table:
    if isinstance(data, Table):
        return data
    if not isinstance(data, pd.DataFrame):
        raise TabularError(
            f"controlled_round() takes a Table or a DataFrame of cells; got {type(data).__name__}"
        )
    if dims is None:
        raise TabularError("controlled_round() needs `dims` for a DataFrame of cells")
    frame = data if "n" in data.columns else data.assign(n=1)
    return Table.from_cells(frame, dims, value=value, top=[], hierarchies=hierarchies)


def _problem(table: Table, values, base: int, zero_restricted: bool, weights, seed: int = 0,
             keep: np.ndarray | None = None, fixed: np.ndarray | None = None):  # fmt: skip
    """Adjacent multiples (in bases) and integer costs of every cell, and the cells whose
    ``keep`` value is a multiple they may take.

    With two CP-SAT workers, which of several equally good roundings is returned depends on
    thread timing; random tie-breaks drawn from ``seed`` (kept below one unit of the cost, so
    the lexicographic order is unchanged) make the optimum unique, hence reproducible."""
    scaled = values / base
    near = np.round(scaled)
    multiple = np.abs(scaled - near) <= _SNAP * np.maximum(1.0, np.abs(scaled))
    low = np.where(multiple, near, np.floor(scaled))
    high = np.where(multiple, near, low + 1)
    if not zero_restricted:  # a multiple may move one base; zeros stay (no sign change)
        movable = multiple & (near != 0)
        low = np.where(movable, near - 1, low)
        high = np.where(movable, near + 1, high)
    held, held_k = _fixed(fixed, base, low, high)
    low, high = np.where(held, held_k, low), np.where(held, held_k, high)
    near, multiple = np.where(held, held_k, near), multiple | held
    inner = table.cells["is_inner"].to_numpy(dtype=bool)
    w = _weights(weights, table)
    remainder = values - base * np.floor(scaled)
    raw = np.where(multiple, w * base, w * (base - 2.0 * remainder))
    decided = inner & (low != high)  # the inner cells in the distance objective
    raw = np.where(decided, raw, 0.0)
    A = sparse.csr_matrix(table.A)
    if A.nnz and np.any(A.data != np.round(A.data)):
        raise InternalError("the constraint matrix A must have integer entries")
    terms = max(1, int(decided.sum()))
    # the objective weighs k itself, a multiple of the base: a sum of incomes has k in the
    # millions, and coefficients scaled for counts would overflow CP-SAT's 64 bits ("CP-SAT
    # rejected the rounding model")
    reach = int(np.where(decided, np.maximum(np.abs(low), np.abs(high)), 0).max(initial=0))
    reach = max(1, reach)
    cost = _fit_costs(_integer_costs(raw), terms * terms * reach)
    room = 2**60 // (terms * terms * reach * max(1, int(np.abs(cost).max(initial=1))))
    ties = int(min(2**20, max(1, room)))
    tiebreak = np.random.default_rng(seed).integers(1, ties + 1, len(values))
    return _Problem(
        scaled=scaled,
        low=low.astype(np.int64),
        high=high.astype(np.int64),
        center=near.astype(np.int64),
        multiple=multiple,
        inner=inner,
        cost=cost,
        tiebreak=np.where(decided, tiebreak, 0).astype(np.int64),
        tie_scale=terms * ties + 1,
        weight=w,
        A=A.astype(np.int64),
        fixed=np.zeros(len(values), dtype=bool),
        fixed_k=np.zeros(len(values), dtype=np.int64),
        slack=max(1, int(inner.sum())),
        **_kept(keep, base, low, high),
    )


def _kept(keep, base: int, low: np.ndarray, high: np.ndarray) -> dict:
    """``kept``/``kept_k``: the cells whose ``keep`` value is a multiple of ``base`` within
    their allowed multiples ``low``..``high`` (in bases), and that multiple."""
    n = low.size
    if keep is None:
        return {"kept": np.zeros(n, dtype=bool), "kept_k": np.zeros(n, dtype=np.int64)}
    keep = np.asarray(keep, dtype=np.float64)
    if keep.shape != (n,):
        raise TabularError(f"keep must hold {n} values in table order; got shape {keep.shape}")
    k = np.where(np.isfinite(keep), np.round(keep / base), np.nan)
    kept = np.isfinite(k) & (np.abs(k * base - keep) <= _SNAP * np.maximum(1.0, np.abs(keep)))
    kept &= (k >= low) & (k <= high)
    return {"kept": kept, "kept_k": np.where(kept, k, 0).astype(np.int64)}


def _fixed(fixed, base: int, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cells ``fixed`` holds (finite) and their multiples in bases; each must be a multiple
    of ``base`` between the cell's adjacent multiples ``low``..``high``."""
    n = low.size
    if fixed is None:
        return np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64)
    fixed = np.asarray(fixed, dtype=np.float64)
    if fixed.shape != (n,):
        raise TabularError(f"fixed must hold {n} values in table order; got shape {fixed.shape}")
    held = np.isfinite(fixed)
    k = np.where(held, np.round(fixed / base), 0.0)
    on = np.abs(k * base - fixed) <= _SNAP * np.maximum(1.0, np.abs(fixed))
    if np.any(held & ~(on & (k >= low) & (k <= high))):
        raise TabularError("fixed values must be multiples of the base adjacent to their cells")
    return held, k.astype(np.int64)


def _weights(weights, table: Table) -> np.ndarray:
    n = len(table.cells)
    if weights is None:
        return np.ones(n)
    w = weights(table.cells) if callable(weights) else weights
    w = np.asarray(w, dtype=np.float64)
    if w.shape != (n,) or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise TabularError(
            f"weights must be {n} finite values >= 0 in table order (or a function of the "
            f"cells DataFrame returning them); got shape {w.shape}"
        )
    return w


def _fit_costs(cost: np.ndarray, factor: int) -> np.ndarray:
    """``cost`` scaled down, where needed, so that ``factor`` times its largest entry stays
    within 2^60 (CP-SAT refuses an objective that could pass 64 bits); a non-zero cost stays
    at least 1 in size, with its sign."""
    top = int(np.abs(cost).max(initial=0))
    if top == 0 or factor * top <= 2**60:
        return cost
    scaled = np.round(np.abs(cost) * (2**60 / (factor * top)))
    return (np.sign(cost) * np.where(cost != 0, np.maximum(1, scaled), 0)).astype(np.int64)


def _integer_costs(raw: np.ndarray) -> np.ndarray:
    """CP-SAT needs integers: keep integral costs, otherwise scale the largest to 10^6."""
    top = float(np.abs(raw).max(initial=0.0))
    integral = np.all(np.abs(raw - np.round(raw)) <= 1e-9 * np.maximum(1.0, np.abs(raw)))
    if integral and top * len(raw) < 2.0**52:
        return np.round(raw).astype(np.int64)
    return np.round(raw * (_MAX_COST / top)).astype(np.int64)


def _result(table, problem, base, values, k, status, y_bound, dim, models, started):
    k = np.asarray(k, dtype=np.int64)
    rounded = k * base
    dims = list(table.dims)
    cells = table.cells[dims].copy()
    cells["value"] = values
    cells["rounded"] = rounded
    cells["change"] = rounded - values
    cells = cells.reset_index(drop=True)
    cells.attrs["hierarchies"] = table.parents()
    cells.attrs["total"] = table.total
    excess = problem.excess(k)
    bad = excess > 0
    violations = cells.loc[bad, [*dims, "value", "rounded"]].copy()
    violations["lower"] = problem.low[bad] * base
    violations["upper"] = problem.high[bad] * base
    violations["excess"] = excess[bad] * base
    inner = problem.inner
    distance = float(np.sum(problem.weight[inner] * np.abs(rounded[inner] - values[inner])))
    max_excess = int(excess.max(initial=0))
    if max_excess > 0:
        status = "near_feasible"
    return RoundingResult(
        cells=cells,
        status=status,
        base=base,
        max_excess=float(max_excess * base),
        excess_bound=float(y_bound * base),
        violations=violations.reset_index(drop=True),
        distance=distance,
        partition=dim,
        subtables=models,
        seconds=time.perf_counter() - started,
    )
