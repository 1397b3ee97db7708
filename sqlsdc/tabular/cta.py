"""Controlled tabular adjustment (CTA): publish every cell, moved so that sensitive cells are safe.

Instead of suppressing sensitive cells, CTA publishes a nearby additive table in which each
sensitive cell lies at or beyond its protection range (Dandekar & Cox 2002; Cox, Kelly & Patil
2004; Castro 2006, *EJOR* 171). With original values ``a`` (all cells, margins included), the
constraint matrix ``A`` (``A a = 0``), deviations ``z⁺, z⁻ ≥ 0`` and adjusted values
``a + z⁺ − z⁻`` (digest ``shared/reference/seed_2006_tabular.md`` §0, "LP/MILP CTA")::

    minimise   Σ_i w_i (z⁺_i + z⁻_i)                                          (1)
    subject to A (z⁺ − z⁻) = 0                                                (2)
               lower_i ≤ a_i + z⁺_i − z⁻_i ≤ upper_i,  z± ≤ cap_i (non-sensitive)  (3)
               z⁺_s ≥ UPL_s·b_s,  z⁻_s ≥ LPL_s·(1 − b_s)                       (4)
               z⁺_s ≤ M_s·b_s,    z⁻_s ≤ M_s·(1 − b_s),   b_s ∈ {0, 1}         (5)

for every sensitive cell ``s``: it moves up by at least its upper protection level (``b_s = 1``)
or down by at least its lower one. ``method="milp"`` solves (1)–(5) with free directions (one
binary per sensitive cell). ``method="lp"`` fixes ``b`` beforehand — the LP heuristic the CTA
literature solves in seconds on large tables (Dandekar & Cox; Castro 2006 solves it by interior
point) — so (4)–(5) become variable bounds. The fixed directions follow a documented rule
(:func:`choose_directions`): sensitive cells in decreasing value alternate down, up, down, …, so
the forced changes roughly cancel in the margins they share.

``method="mdi"`` is the distribution-preserving CTA of Cox, Orelien & Shah (PSD 2006, digest §1):
margins stay fixed, sensitive cells go to their safe values ``L = a − LPL`` or ``U = a + UPL``
(directions from the fixed-direction LP), and the other inner cells are raked by IPF to the
margins, which gives the minimum-discrimination-information table (:func:`~sqlsdc.tabular.ipf.
mdi_adjust`, K = Σ A ln(A/O)).

Weights (1): ``"inverse"`` ``w = 1/|a|`` (Castro's usual choice: relative change), ``"sqrt"``
``1/√|a|``, ``"unit"`` 1, or an array; zero cells get the largest finite weight. By default a
non-negative table stays non-negative, zero cells stay zero (``keep_zeros``), and every cell may
move; ``fixed`` pins cells (e.g. published margins) and ``max_change`` caps non-sensitive moves
(Cox et al. suggest 2·SE).

**Big-M.** With the LP solution's objective U (directions fixed, so feasible for the MILP), any
MILP solution at least as good has ``w_s·|z_s| ≤ U``, so ``M_s = min(room_s, U/w_s)`` loses no
optimal solution. Without a feasible LP, ``M = 2·(max|a| + max level)`` is a heuristic cap.

**Infeasibility.** When the constraints cannot all hold, an elastic copy of the model (each
sensitive requirement may fall short by a slack ``t_s·level_s``, minimise Σ t_s) names the
sensitive cells that cannot reach their levels, and a :class:`~sqlsdc.errors.TabularError` says so.

Margins are recomputed from the adjusted inner cells (``X.T @ inner``), so the published table is
additive to float rounding, not just to the solver's tolerance. The result is then checked
independently (:func:`~sqlsdc.tabular.verify.verify_cta`: additivity, bounds, protection in the
chosen direction, the solver's objective against the cost recomputed from the table) and never
returned when a check fails; the reported objective is the recomputed cost.

The models and solver calls live in :mod:`sqlsdc.tabular._cta_model`; the intervals published
with an adjusted table in :mod:`sqlsdc.tabular.intervals` (re-exported here).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from sqlsdc.errors import TabularError
from sqlsdc.tabular._cta_model import (
    LP_SOLVERS,
    MILP_SOLVERS,
    Problem,
    describe,
    solve_lp,
    solve_lp_flipping,
    solve_milp,
)
from sqlsdc.tabular.intervals import publish_intervals
from sqlsdc.tabular.model import Table
from sqlsdc.tabular.rules import apply_rules, default_rules
from sqlsdc.tabular.verify import verify_cta

__all__ = ["CTAReport", "choose_directions", "cta", "publish_intervals"]

METHODS = ("lp", "milp", "mdi")
WEIGHTS = ("inverse", "sqrt", "unit")
DIRECTION_RULES = ("alternate", "random")


@dataclass(frozen=True)
class CTAReport:
    """How a CTA run went (``result.attrs["cta"]``).

    Attributes:
        method, solver: as requested. status: the solver's, ``"optimal"`` or ``"feasible"``
            (a limit hit with an incumbent; for ``milp`` possibly the LP heuristic's solution);
            a result that fails verification raises instead.
        objective: Σ w·|change| of the returned table (for ``mdi``: K, exact for the chosen
            directions). bound: best proven lower bound on (1) (``objective`` for an optimal
            LP). gap: (objective − bound)/objective.
        n_sensitive: sensitive cells. build_seconds, solve_seconds: model building and solver
            wall time. max_additivity_error: max |A @ adjusted| (float rounding only).
        mdi_k: Cox–Orelien–Shah K = Σ A ln(A/O) (``method="mdi"``), ipf_iterations likewise.
    """

    method: str
    solver: str
    status: str
    objective: float
    bound: float
    gap: float
    n_sensitive: int
    build_seconds: float
    solve_seconds: float
    max_additivity_error: float
    mdi_k: float | None = None
    ipf_iterations: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def cta(
    data: pd.DataFrame | Table,
    *,
    dims: Sequence[str] | None = None,
    rules: Sequence | None = None,
    sensitive: np.ndarray | Callable | None = None,
    protection: float | np.ndarray | tuple | None = None,
    method: str = "lp",
    directions: str | np.ndarray = "alternate",
    weights: str | np.ndarray = "inverse",
    bounds: tuple | None = None,
    keep_zeros: bool = True,
    fixed: np.ndarray | Callable | None = None,
    max_change: float | np.ndarray | None = None,
    solver: str = "highs",
    time_limit: float = 60.0,
    seed: int = 0,
) -> pd.DataFrame:
    """Adjust a table so that every sensitive cell is safe and the rest moves as little as possible.

    Args:
        data: a :class:`Table` or aggregated cells (``dims`` + ``value`` + ``n`` [+ ``top1..``])
            read with ``Table.from_cells``.
        dims: dimension columns (for a DataFrame).
        rules: primary rules (:mod:`sqlsdc.tabular.rules`) that find the sensitive cells and
            their protection levels; default as :func:`~sqlsdc.tabular.api.protect`.
        sensitive: instead of (or on top of) rules, a boolean mask over the cells in table
            order or a function of the cells DataFrame.
        protection: levels of the ``sensitive`` cells: a number or array (UPL = LPL) or an
            ``(upl, lpl)`` pair; default 10 % of the value (τ-ARGUS manual safety range).
        method: ``"lp"`` (fixed directions), ``"milp"`` (free directions, time-limited, gap
            reported) or ``"mdi"`` (Cox–Orelien–Shah: fixed margins, IPF on the other cells).
        directions: ``"alternate"``, ``"random"`` (keyed by ``seed``) or an array of +1/−1 per
            cell (see :func:`choose_directions`); ``milp`` starts from the LP's solution with
            them and chooses its own.
        weights: ``"inverse"``, ``"sqrt"``, ``"unit"`` or an array of per-cell weights.
        bounds: ``(lower, upper)`` scalars or arrays every adjusted cell must respect; default
            ``[0, inf)`` for non-negative tables, unbounded otherwise.
        keep_zeros: non-sensitive cells with value 0 stay 0.
        fixed: cells that must not move (mask or function of the cells).
        max_change: largest absolute change of a non-sensitive cell (scalar or array).
        solver: ``"highs"`` (default; LP and MILP), ``"glop"`` (LP, dual simplex) or ``"scip"``
            (MILP).
        time_limit: seconds per solver call. seed: key of ``directions="random"``.

    Returns:
        One row per cell: the dimensions, ``value`` (original), ``adjusted``, ``change``,
        ``sensitive``, ``direction`` (``"up"``/``"down"``/``""``), ``upl``, ``lpl``;
        ``attrs["cta"]`` is the :class:`CTAReport`. ``value``, ``upl`` and ``lpl`` are
        confidential: publish the dimensions and ``adjusted`` (or intervals from
        :func:`publish_intervals`).

    Raises:
        TabularError: invalid input, or no adjusted table meets the requirements (the message
            names the sensitive cells that cannot reach their levels).

    Example:
        >>> cells = pd.DataFrame({"r": ["a", "a", "b", "b"], "c": ["x", "y", "x", "y"],
        ...                       "value": [20.0, 30.0, 25.0, 5.0], "n": [9, 9, 9, 1]})
        >>> out = cta(cells, dims=["r", "c"], rules=[], sensitive=lambda c: c["n"] == 1,
        ...           protection=3.0)
        >>> out.loc[out["sensitive"], ["r", "c", "value", "adjusted"]].values.tolist()
        [['b', 'y', 5.0, 2.0]]
        >>> float(out["adjusted"].iloc[0]), out.attrs["cta"].status
        (77.0, 'optimal')
    """
    if method not in METHODS:
        raise TabularError(f"method must be one of {METHODS}; got {method!r}")
    table = _as_table(data, dims)
    prob = _problem(
        table,
        rules,
        sensitive,
        protection,
        weights,
        bounds,
        keep_zeros,
        fixed,
        max_change,
        fix_margins=method == "mdi",
    )
    if method == "milp":
        start = time.perf_counter()
        if solver not in MILP_SOLVERS:
            raise TabularError(f"milp solver must be one of {tuple(MILP_SOLVERS)}; got {solver!r}")
        dirs = choose_directions(prob, directions, seed)  # the LP's: the MILP's incumbent
        lp = solve_lp(prob, dirs, "highs", time_limit)
        run = solve_milp(prob, lp, solver, time_limit)
        run.build_seconds += lp.build_seconds if lp else 0.0
        run.solve_seconds = time.perf_counter() - start - run.build_seconds
    else:
        if solver not in LP_SOLVERS:
            raise TabularError(f"lp solver must be one of {tuple(LP_SOLVERS)}; got {solver!r}")
        dirs = choose_directions(prob, directions, seed)
        run = solve_lp_flipping(prob, dirs, solver, time_limit)
    adjusted = _repair(table, prob.values + run.change)
    cost = float(np.sum(prob.weights * np.abs(adjusted - prob.values)))
    verify_cta(
        table,
        adjusted,
        sensitive=prob.sensitive,
        upl=prob.upl,
        lpl=prob.lpl,
        up_room=prob.up_room,
        down_room=prob.down_room,
        weights=prob.weights,
        objective=float(run.objective),
        method=f"CTA ({method}, {solver})",
    ).require()
    run.objective = cost
    mdi_k = iterations = None
    if method == "mdi":
        from sqlsdc.tabular.ipf import mdi_adjust

        up = run.change > 0
        safe = np.where(up, prob.values + prob.upl, prob.values - prob.lpl)
        fit = mdi_adjust(table, prob.sensitive, safe[prob.sensitive])
        adjusted, mdi_k, iterations = fit.adjusted, fit.mdi_k, fit.iterations
        verify_cta(table, adjusted, sensitive=prob.sensitive, upl=prob.upl, lpl=prob.lpl,
                   up_room=prob.up_room, down_room=prob.down_room, directions=np.where(up, 1, -1),
                   atol=2e-9 * max(1.0, float(np.abs(prob.values).max())),  # IPF's tolerance
                   method="CTA (mdi)").require()  # fmt: skip
        run.objective = run.bound = mdi_k  # IPF's limit is the exact MDI table for these directions
    report = CTAReport(
        method=method,
        solver=solver,
        status=run.status,
        objective=float(run.objective),
        bound=float(run.bound),
        gap=_gap(run.objective, run.bound),
        n_sensitive=int(prob.sensitive.sum()),
        build_seconds=run.build_seconds,
        solve_seconds=run.solve_seconds,
        max_additivity_error=float(np.abs(table.A @ adjusted).max(initial=0.0)),
        mdi_k=mdi_k,
        ipf_iterations=iterations,
    )
    return _output(table, prob, adjusted, report)


def choose_directions(prob: Problem, rule: str | np.ndarray, seed: int = 0) -> np.ndarray:
    """Fixed directions (+1 up, −1 down, 0 not sensitive) for the LP heuristic.

    ``"alternate"``: sensitive cells sorted by decreasing value (ties: table order) go down, up,
    down, … — the largest first down, so that forced changes in a shared margin roughly cancel.
    ``"random"``: a fair coin per sensitive cell from ``numpy.random.default_rng(seed)`` in table
    order. An array gives the directions directly. A direction that cannot be met (level 0, or
    the bounds leave too little room) is turned round; a cell that can go neither way is an error.
    """
    s = np.flatnonzero(prob.sensitive)
    dirs = np.zeros(prob.values.size)
    if isinstance(rule, str):
        if rule == "alternate":
            order = s[np.lexsort((s, -prob.values[s]))]
            dirs[order] = np.where(np.arange(order.size) % 2 == 0, -1.0, 1.0)
        elif rule == "random":
            dirs[s] = np.random.default_rng(seed).choice([-1.0, 1.0], size=s.size)
        else:
            raise TabularError(
                f"directions must be one of {DIRECTION_RULES} or an array; got {rule!r}"
            )
    else:
        given = np.asarray(rule, dtype=np.float64)
        if given.shape != dirs.shape or not np.isin(given[s], (-1.0, 1.0)).all():
            raise TabularError(
                f"directions must be {dirs.size} values, +1 (up) or -1 (down) on every "
                "sensitive cell"
            )
        dirs[s] = given[s]
    can_up, can_down = prob.admissible()
    dirs[(dirs > 0) & ~can_up] = -1.0
    dirs[(dirs < 0) & ~can_down] = 1.0
    return dirs


def _as_table(data, dims) -> Table:
    if isinstance(data, Table):
        return data
    if not isinstance(data, pd.DataFrame):
        raise TabularError(f"cta() takes a Table or a cells DataFrame; got {type(data).__name__}")
    if dims is None:
        raise TabularError("cta() needs `dims` for a cells DataFrame")
    cells = data if "n" in data.columns else data.assign(n=1)
    return Table.from_cells(cells, dims)


def _problem(
    table,
    rules,
    sensitive,
    protection,
    weights,
    bounds,
    keep_zeros,
    fixed,
    max_change,
    *,
    fix_margins,
) -> Problem:
    values = table.values
    count = values.size
    rules = list(default_rules(table.count) if rules is None and sensitive is None else rules or [])
    found = apply_rules(table, rules) if rules else None
    sens = np.zeros(count, dtype=bool) if found is None else found.primary.copy()
    upl = np.zeros(count) if found is None else found.upl.copy()
    lpl = np.zeros(count) if found is None else found.lpl.copy()
    if sensitive is not None:
        mask = table.mask(sensitive, "sensitive")
        u, d = _levels(protection, table, mask)
        upl = np.where(mask, np.maximum(upl, u), upl)
        lpl = np.where(mask, np.maximum(lpl, d), lpl)
        sens |= mask
    elif protection is not None:
        raise TabularError(
            "`protection` sets the levels of `sensitive` cells; give `sensitive` too"
        )
    if not sens.any():
        raise TabularError(  # what to do instead, not only why (new user s39)
            "no cell is sensitive: there is nothing for CTA to protect. The primary rules "
            "flag none of these cells; give stricter rules (a higher freq:N, a lower K in "
            "nk:N,K, a higher P in p:P), or publish the table by suppression, which then "
            "hides no cell"
        )
    lower, upper = _bounds(table, bounds)
    w = _weights(weights, values)
    cap = np.full(count, np.inf)
    if max_change is not None:
        cap = np.broadcast_to(np.asarray(max_change, dtype=np.float64), values.shape).copy()
        if np.any(~(cap >= 0)):
            raise TabularError("max_change must be >= 0 for every cell")
    cap[sens] = np.inf
    pinned = table.mask(fixed, "fixed")
    if fix_margins:
        margins = ~table.cells["is_inner"].to_numpy(dtype=bool)
        if (sens & margins).any():
            raise TabularError(
                "method='mdi' keeps every margin at its original value (Cox-Orelien-Shah), but "
                f"sensitive margin cells exist ({describe(table, sens & margins)}); use "
                "method='lp' or 'milp'"
            )
        pinned = pinned | margins
    if (pinned & sens).any():
        raise TabularError(
            f"sensitive cells cannot be fixed: {describe(table, pinned & sens)}; drop them from "
            "`fixed`"
        )
    cap[pinned] = 0.0
    if keep_zeros:
        cap[(values == 0) & ~sens] = 0.0
    prob = Problem(
        table,
        values,
        sens,
        upl,
        lpl,
        w,
        np.minimum(upper - values, cap),
        np.minimum(values - lower, cap),
    )
    can_up, can_down = prob.admissible()
    stuck = sens & ~can_up & ~can_down
    if stuck.any():
        i = np.flatnonzero(stuck)[0]
        raise TabularError(
            f"{int(stuck.sum())} sensitive cell(s) cannot move far enough in either direction, "
            f"e.g. {describe(table, stuck)}: value {values[i]:g} needs +{upl[i]:g} or "
            f"-{lpl[i]:g} within bounds [{lower[i]:g}, {upper[i]:g}]; widen `bounds` or lower "
            "the protection levels"
        )
    return prob


def _levels(protection, table, mask):
    values = table.values
    if protection is None:  # τ-ARGUS manual safety range (10 %), at least 1 as apply_rules does
        level = np.maximum(np.abs(values) * 0.10, 1.0)
        return level, np.where(values != 0, level, 0.0)
    if isinstance(protection, tuple):
        if len(protection) != 2:
            raise TabularError("protection as a tuple must be (upl, lpl)")
        u, d = protection
    else:
        u = d = protection
    u = np.broadcast_to(np.asarray(u, dtype=np.float64), values.shape)
    d = np.broadcast_to(np.asarray(d, dtype=np.float64), values.shape)
    if np.any(~(u[mask] >= 0)) or np.any(~(d[mask] >= 0)):
        raise TabularError("protection levels must be >= 0")
    return u, d


def _bounds(table, bounds):
    values = table.values
    if bounds is None:
        nonneg = not table.negative and bool((values >= 0).all())
        lower = np.zeros_like(values) if nonneg else np.full_like(values, -np.inf)
        return lower, np.full_like(values, np.inf)
    try:
        lo, hi = bounds
    except (TypeError, ValueError):
        raise TabularError(f"bounds must be a (lower, upper) pair; got {bounds!r}") from None
    lower = np.broadcast_to(np.asarray(lo, dtype=np.float64), values.shape).copy()
    upper = np.broadcast_to(np.asarray(hi, dtype=np.float64), values.shape).copy()
    if np.any(lower > values) or np.any(upper < values):
        raise TabularError("bounds must satisfy lower <= value <= upper for every cell")
    return lower, upper


def _weights(weights, values):
    a = np.abs(values)
    if isinstance(weights, str):
        if weights not in WEIGHTS:
            raise TabularError(f"weights must be one of {WEIGHTS} or an array; got {weights!r}")
        if weights == "unit":
            return np.ones_like(a)
        base = a if weights == "inverse" else np.sqrt(a)
        smallest = base[base > 0].min() if (base > 0).any() else 1.0
        return 1.0 / np.where(base > 0, base, smallest)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != a.shape or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise TabularError(f"weights must be {a.size} finite values >= 0")
    return w


# ----------------------------------------------------------------------------- output


def _repair(table: Table, adjusted: np.ndarray) -> np.ndarray:
    """Recompute margins from the adjusted inner cells, so additivity holds to float rounding."""
    if table.X is None or np.any(table.inner < 0):
        return adjusted
    return np.asarray(table.X.T @ adjusted[table.inner], dtype=np.float64).ravel()


def _gap(objective: float, bound: float) -> float:
    if not np.isfinite(objective):
        return float("inf")
    return max(0.0, (objective - bound) / max(abs(objective), 1e-12))


def _output(table, prob, adjusted, report) -> pd.DataFrame:
    out = table.cells[[*table.dims]].copy()
    out["value"] = prob.values
    out["adjusted"] = adjusted
    out["change"] = adjusted - prob.values
    out["sensitive"] = prob.sensitive
    direction = np.where(out["change"].to_numpy() > 0, "up", "down")
    out["direction"] = np.where(prob.sensitive, direction, "")
    out["upl"], out["lpl"] = prob.upl, prob.lpl
    out.attrs["cta"] = report
    out.attrs["hierarchies"] = table.parents()
    out.attrs["total"] = table.total
    out.attrs["dims"] = list(table.dims)
    return out
