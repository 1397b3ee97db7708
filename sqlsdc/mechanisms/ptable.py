"""Maximum-entropy perturbation tables (ptables) for the Cell Key Method (CKM).

A ptable says, for each original value class ``i``, how likely each noise ``v = j - i`` is: row
``i`` cuts the cell-key range [0, 1) into consecutive intervals ``[p_int_lb, p_int_ub)`` of width
``p``, one per target ``j``, and the cell key picks one. Counts ``n >= max_i`` use row ``max_i``;
magnitude tables interpolate between their classes ``icat``.

This is a port of the R package **ptable** 1.0 (sdcTools; T. Enderle, S. Giessing, J. Peter), the
generator behind the cellKey package and τ-ARGUS: ``pt_create_pParams`` (checks),
``pt_create_pTable`` (rows, pstay relaxation, rounding), ``pt_optim_entropy`` (the programme
below), ``create_cnt_ptable`` / ``create_num_ptable`` and ``pt_export``. The method is Deliverable
D4.2 of the ESS SGA "Open source tools for perturbative confidentiality methods" and Giessing
(2016), "Computational issues in the design of transition probabilities and disclosure risk
estimation for additive noise", PSD 2016, LNCS 9867, 237-251.

Each positive class ``i`` solves, over the targets ``j = max(i-D, 0), ..., i+D`` in steps of
``1/step`` without the blocked counts ``1..js``::

    maximise  -sum p log p
    subject to sum p = 1,  sum v p = 0,  sum v^2 p <= V (optim 1-3) or = V (optim 4),
               1e-8 <= p <= 1,  p(v=0) >= pstay,
               p non-decreasing from the leftmost target up to v = 0 (mono; the right is free)

All constraints are linear and the objective strictly concave, so the optimum is unique: R
approximates it with nloptr's SLSQP (``xtol_rel = 1e-7``), this module solves it exactly through
its dual (``_max_entropy``), and the two agree to R's tolerance. optim 1, 2 and 3 only restate the
bounds in R: one programme. While ``round(var, 3) != V`` R lowers the bound on p(v=0) by 0.05 and
solves again, at most 20 times; rows near 0 whose targets cannot spread that far keep a smaller
variance (``create_cnt_ptable(D=2, V=1)`` has 0.932 in row 1). Intervals are rounded to 8
decimals and ``p`` is redefined as ``p_int_ub - p_int_lb``, as in R.

Example:
    >>> [round(r.p, 4) for r in count_ptable(D=2, V=0.9).row(1)]
    [0.3625, 0.3625, 0.1875, 0.0875]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from itertools import groupby
from typing import TYPE_CHECKING

import numpy as np

from sqlsdc.errors import Error

if TYPE_CHECKING:
    import pandas as pd

EPSILON = 1e-8  # smallest probability of a target (R: epsilon <- 1 / 10^ndigits)
NDIGITS = 8  # decimals of the intervals (R: ndigits <- 8)
MAX_ITER, PSTAY_STEP = 20, 0.05  # R's pstay relaxation loop
COLUMNS = ("i", "j", "p", "v", "p_int_lb", "p_int_ub", "type")


class PTableError(ValueError, Error):
    """Invalid ptable parameters, an infeasible row, or a malformed ptable file."""


# The ranges a policy's ptable allows (schemas/policy.schema.json); beyond them a table is
# never practical, and 10**20 overflowed numpy as a bug in sqlsdc.
MAX_D = MAX_JS = MAX_STEP = 100


def _is_int(x) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


@dataclass(frozen=True)
class PTableParams:
    """Parameters of ``pt_create_pParams``; ``pstay``, ``optim`` and ``mono`` may be per row.

    D is the largest noise, V the noise variance, js blocks the targets 1..js (counts), pstay is a
    lower bound on p(v=0) (None: the maximum-entropy value), step gives the noise grid 1/step and
    icat the classes of a magnitude table (default (1, D); R requires them), type labels the rows
    ('small_cells' is cellKey's label for the separate small-cell table).
    """

    D: int
    V: float
    js: int = 0
    pstay: float | tuple[float | None, ...] | None = None
    optim: int | tuple[int, ...] = 1
    mono: bool | tuple[bool, ...] = True
    table: str = "cnts"
    step: int = 1
    icat: tuple[int, ...] | None = None
    type: str = "all"

    def __post_init__(self):
        def check(ok, message):
            if not ok:
                raise PTableError(message)

        check(self.table in ("cnts", "nums"), f"table must be 'cnts' or 'nums'; got {self.table!r}")
        check(
            _is_int(self.D) and 1 <= self.D <= MAX_D,
            f"D (largest noise) must be an integer >= 1 and <= {MAX_D}; got {self.D!r}",
        )
        check(
            isinstance(self.V, int | float) and not isinstance(self.V, bool) and self.V > 0,
            f"V (noise variance) must be a number > 0; got {self.V!r}",
        )
        check(
            _is_int(self.js) and 0 <= self.js <= MAX_JS,
            f"js must be an integer >= 0 and <= {MAX_JS}; got {self.js!r}",
        )
        check(
            _is_int(self.step) and 1 <= self.step <= MAX_STEP,
            f"step must be an integer >= 1 and <= {MAX_STEP}; got {self.step!r}",
        )
        if self.table == "cnts":
            check(
                self.step == 1 and self.icat is None,
                "step and icat apply to magnitude tables only: table 'nums' (--table nums)",
            )
            check(self.type == "all", f"count tables have type 'all'; got {self.type!r}")
        else:
            check(
                self.js == 0 and self.pstay is None,
                "js and pstay do not apply to magnitude tables (R's ptable ignores them); "
                "leave js=0 and pstay=None",
            )
            icat = (1, self.D) if self.icat is None else tuple(self.icat)
            check(
                all(_is_int(c) and 1 <= c <= self.D for c in icat) and {1, self.D} <= set(icat),
                f"icat must hold integers in 1..D that include 1 and D={self.D}, e.g. "
                f"(1, {self.D}); got {icat!r}",
            )
            object.__setattr__(self, "icat", tuple(sorted(set(icat))))
            check(
                self.D * self.step < 50,
                f"D*step must be below 50 (R's limit); got D={self.D}, step={self.step}",
            )
            check(
                self.type in ("all", "even", "odd", "small_cells"),
                f"type must be 'all', 'even', 'odd' or 'small_cells'; got {self.type!r}",
            )
        n = len(self.classes)
        for name in ("pstay", "optim", "mono"):
            value = getattr(self, name)
            if not isinstance(value, list | tuple):
                value = (value,) * n
            check(
                len(value) == n,
                f"{name} has {len(value)} values but the table has {n} rows with positive i "
                f"{self.classes}; give one value per row or a single value",
            )
            object.__setattr__(self, name, tuple(value))
        check(
            all(p is None or 0 < p < 1 for p in self.pstay),
            f"pstay must lie strictly between 0 and 1 (None: no bound); got {_one(self.pstay)}",
        )
        check(
            all(o in (1, 2, 3, 4) for o in self.optim),
            f"optim must be 1, 2, 3 (variance <= V) or 4 (variance = V); got {_one(self.optim)}",
        )
        check(
            all(isinstance(m, bool | np.bool_) for m in self.mono),
            f"mono must be True or False; got {self.mono}",
        )
        # The last row is symmetric (targets i-D..i+D): V must be reachable there.
        v2 = self.noise(self.classes[-1]) ** 2
        grid = f"-{self.D}..{self.D}" + (f" in steps of 1/{self.step}" if self.step > 1 else "")
        check(
            self.V > EPSILON * v2.sum(),
            f"V={self.V} is too small: every target keeps probability >= 1e-8, so the variance "
            f"on {grid} is at least {EPSILON * v2.sum():.3g}",
        )
        check(
            self.optim[-1] == 4 or self.V <= v2.mean() + 1e-12,
            f"V={self.V} is unreachable with variance <= V (optim {self.optim[-1]}): the most "
            f"spread noise on {grid} is uniform, variance {v2.mean():.4g}; lower V, raise D, "
            "or use optim=4 (variance = V)",
        )

    @property
    def classes(self) -> tuple[int, ...]:
        """Rows with positive i (R's icat): 1..D (js = 0) or 1..D+js+1 for counts, else icat."""
        if self.table == "nums":
            return self.icat
        return tuple(range(1, self.D + 1 + (self.js + 1 if self.js else 0)))

    def targets(self, i: int) -> np.ndarray:
        """R's ``seq(max(i-D, 0), i+D, by = 1/step)``, rounded to 4 decimals, minus 1..js."""
        lo = max(i - self.D, 0)
        j = [round(lo + k / self.step, 4) for k in range(round((i + self.D - lo) * self.step) + 1)]
        return np.array([t for t in j if not 1 <= t <= self.js], dtype=float)

    def noise(self, i: int) -> np.ndarray:
        return np.round(self.targets(i) - i, 4)


def _one(values: tuple):
    """A per-row setting as it was given: one value repeated on every row is shown once (a
    single --pstay 2 was echoed as "(2.0, 2.0, 2.0, 2.0, 2.0)")."""
    return values[0] if len(set(values)) == 1 else values


def _mono_matrix(v: np.ndarray) -> np.ndarray | None:
    """Rows of ``x[k] - x[k+1] <= 0`` left of v = 0 (R's ``eval_g_mono``), or None."""
    zero = np.flatnonzero(v == 0)
    if not zero.size or zero[0] == 0:
        return None
    k = np.arange(zero[0])
    m = np.zeros((zero[0], v.size))
    m[k, k], m[k, k + 1] = 1.0, -1.0
    return m


def _pooled(theta: np.ndarray, lb: np.ndarray, chain: int):
    """Minimise ``sum x log x - theta x`` over ``x >= lb`` with ``x[0] <= ... <= x[chain-1]``.

    Separable and convex, so pooling adjacent violators (PAVA) is exact: a pooled block takes
    ``max(max lb, exp(mean theta - 1))``. Returns x and the groups (start, stop) off their bounds.
    """
    x = np.maximum(lb, np.exp(np.minimum(theta - 1.0, 50.0)))
    stack: list[list] = []  # pooled blocks of the chain: [start, stop, sum theta, max lb, value]
    for k in range(chain):
        block = [k, k + 1, theta[k], lb[k], x[k]]
        while stack and stack[-1][4] > block[4]:
            s = stack.pop()
            t, m = s[2] + block[2], max(s[3], block[3])
            block = [s[0], k + 1, t, m, max(m, np.exp(min(t / (k + 1 - s[0]) - 1.0, 50.0)))]
        stack.append(block)
    for start, stop, _, _, value in stack:
        x[start:stop] = value
    groups = [(b[0], b[1]) for b in stack] + [(k, k + 1) for k in range(chain, x.size)]
    return x, [(s, e) for s, e in groups if x[s] > lb[s:e].max()]


def _dual_newton(a, b, lb, chain, lam=None):
    """Maximise the concave dual ``q(lam) = min_x sum x log x - (lam a) x + lam b`` by Newton.

    ``a x = b`` are the equalities (sum, mean, variance); bounds and monotony stay in the inner
    minimisation (``_pooled``). Backtracking keeps q rising, or the residual falling where q is
    flat to rounding. Returns x(lam) and lam; an infeasible row leaves a residual.
    """
    lam = np.r_[1.0 - np.log(a.shape[1]), np.zeros(len(b) - 1)] if lam is None else lam

    def at(lam):
        theta = lam @ a
        x, free = _pooled(theta, lb, chain)
        return float(x @ np.log(x) - theta @ x + lam @ b), x, free

    with np.errstate(over="ignore", invalid="ignore"):
        q, x, free = at(lam)
        for _ in range(200):
            g = b - a @ x
            if not np.all(np.isfinite(g)) or np.abs(g).max() <= 1e-13 * np.abs(a).max():
                break
            h = np.zeros((len(b), len(b)))
            for s, e in free:
                col = a[:, s:e].sum(axis=1)
                h += x[s] / (e - s) * np.outer(col, col)
            d = np.linalg.lstsq(h, g, rcond=None)[0]
            d = d if d @ g > 0 else g
            step = 1.0
            while step > 1e-12:
                q_new, x_new, free_new = at(lam + step * d)
                if q_new >= q + 1e-4 * step * (g @ d) or (
                    q_new >= q - 1e-12 * abs(q) and np.abs(b - a @ x_new).max() < np.abs(g).max()
                ):
                    break
                step /= 2
            else:
                break
            lam, q, x, free = lam + step * d, q_new, x_new, free_new
    return x, lam


def _max_entropy(v: np.ndarray, V: float, lb: np.ndarray, mono: bool, optim: int) -> np.ndarray:
    """One row of ``pt_optim_entropy``, solved exactly through its dual.

    R hands the programme to nloptr's SLSQP; the optimum is unique, so any exact method gives the
    same row. The dual has 2-3 variables (the multipliers of sum, mean, variance): Newton on it
    meets the constraints to ~1e-15, where scipy's SLSQP stops at ~1e-10 and ~1e-7 from the
    optimum and, through multi-threaded BLAS, stalls 10-30x on a busy machine. With variance <= V
    (optim 1-3) the row either has variance < V without that constraint, or exactly V.
    """
    zero = np.flatnonzero(v == 0)
    chain = int(zero[0]) + 1 if mono and zero.size else 0
    a, b = np.vstack([np.ones_like(v), v, v * v]), np.array([1.0, 0.0, V])
    if optim == 4:
        return _dual_newton(a, b, lb, chain)[0]
    x, lam = _dual_newton(a[:2], b[:2], lb, chain)
    if x @ (v * v) > V:
        x = _dual_newton(a, b, lb, chain, np.append(lam, 0.0))[0]
    return x


def _variance_range(v: np.ndarray, lb: np.ndarray, mono: bool) -> tuple[float, float]:
    """The smallest and largest variance a row's targets allow (two LPs; for error messages)."""
    from scipy.optimize import linprog  # 0.4 s to import, and only a failed build needs it

    m = _mono_matrix(v) if mono else None
    kw = dict(A_eq=np.vstack([np.ones_like(v), v]), b_eq=[1.0, 0.0], bounds=[(b, 1.0) for b in lb])
    kw |= {} if m is None else dict(A_ub=m, b_ub=np.zeros(len(m)))
    low, high = linprog(v * v, **kw), linprog(-v * v, **kw)
    return (low.fun, -high.fun) if low.status == high.status == 0 else (np.nan, np.nan)


def _solve_class(params: PTableParams, r: int, i: int) -> tuple[np.ndarray, int]:
    """Row ``i`` with R's loop: lower the pstay bound by 0.05 until round(var, 3) == V."""
    v = params.noise(i)
    lb = np.full(v.size, EPSILON)
    lb[v == 0] = max(params.pstay[r] or 0.0, EPSILON)
    it, feasible = 0, False
    while it < MAX_ITER:
        it += 1
        p = _max_entropy(v, params.V, lb, params.mono[r], params.optim[r])
        var = float(p @ (v * v))
        var_ok = var <= params.V + 1e-6 and (params.optim[r] != 4 or var >= params.V - 1e-6)
        feasible = round(float(p.sum()), 10) == 1 and abs(p @ v) <= 1e-8 and var_ok
        if feasible and (round(var, 3) == params.V or 1 <= i <= params.js):
            break
        if lb[v == 0].max(initial=0.0) <= EPSILON:  # nothing left to relax
            it = MAX_ITER  # R solves the same programme again until iteration 20
            break
        lb[v == 0] = max(lb[v == 0][0] - PSTAY_STEP, EPSILON)
    if not feasible:
        low, high = _variance_range(v, lb, params.mono[r])
        if np.isnan(low):  # no distribution at all: "variances nan..nan" said nothing
            reach = ", ".join(f"{t:g}" for t in params.targets(i))
            raise PTableError(
                f"the ptable can't be calculated: row i={i} may only move to {reach} (noise at "
                f"most D={params.D}, and js={params.js} blocks 1..{params.js}), so no noise "
                "has mean 0; lower js or raise D"
            )
        raise PTableError(
            f"the ptable can't be calculated without violating its constraints in row i={i} "
            f"(D={params.D}, V={params.V}, js={params.js}, pstay={params.pstay[r]}): its "
            f"targets allow variances {low:.4g}..{high:.4g}; change V (enough in most "
            "cases), js, mono or optim"
        )
    return p, it


@dataclass(frozen=True)
class PTableRow:
    """One lookup entry: class i, target j, probability p, noise v = j - i, key interval, type."""

    i: int
    j: float
    p: float
    v: float
    p_int_lb: float
    p_int_ub: float
    type: str = "all"


def entries(i, js, vs, ubs, type_, integral) -> list[PTableRow]:
    """Chain the intervals (lb = previous ub) and set p = ub - lb, as ``pt_create_pTable``."""
    num = int if integral else float
    lbs = [0.0, *ubs[:-1]]
    return [
        PTableRow(int(i), num(j), ub - lb, num(v), lb, ub, type_)
        for j, v, lb, ub in zip(js, vs, lbs, ubs, strict=True)
    ]


@dataclass(frozen=True)
class PTable:
    """A ptable: the rows of R's ``ptable@pTable``, 'cnts' or 'nums', and (if generated) params.

    ``iterations`` is R's ``empResults$iter`` per class (20: V was not reached in that row).
    """

    rows: tuple[PTableRow, ...]
    table: str = "cnts"
    params: PTableParams | None = None
    iterations: tuple[int, ...] = field(default=(), compare=False)

    def __post_init__(self):
        if not self.rows or self.rows[0].i != 0:
            raise PTableError("a ptable starts with the row for i=0 (zero stays zero)")
        for i, entries in self._groups.items():
            ubs = [0.0] + [e.p_int_ub for e in entries]
            if [e.p_int_lb for e in entries] != ubs[:-1] or ubs[-1] != 1 or sorted(ubs) != ubs:
                raise PTableError(f"row i={i} does not cut [0, 1) into consecutive intervals")
        if self.params and (self.params.table, (0, *self.params.classes)) != (
            self.table,
            self.classes,
        ):
            raise PTableError(
                f"rows {self.classes} of a {self.table!r} table do not match the parameters "
                f"(rows {(0, *self.params.classes)} of a {self.params.table!r} table)"
            )

    @cached_property
    def _groups(self) -> dict[int, tuple[PTableRow, ...]]:
        runs = [(i, tuple(g)) for i, g in groupby(self.rows, key=lambda e: e.i)]
        if [i for i, _ in runs] != sorted({e.i for e in self.rows}):
            raise PTableError("the entries of a ptable must be grouped by i in ascending order")
        return dict(runs)

    @property
    def classes(self) -> tuple[int, ...]:
        return tuple(self._groups)

    @property
    def max_i(self) -> int:
        """The largest class; every original value >= max_i uses its row."""
        return self.classes[-1]

    @property
    def ncat(self) -> int:
        """Number of positive classes (R's ``ncat``)."""
        return len(self.classes) - 1

    @property
    def type(self) -> str:
        return self.rows[0].type

    def row(self, i: int) -> tuple[PTableRow, ...]:
        """The entries for original value ``i``: row ``min(i, max_i)``."""
        if i < 0 or min(i, self.max_i) not in self._groups:
            raise PTableError(
                f"no row for i={i}: the classes are {self.classes}, values >= {self.max_i} use "
                "the last (magnitude tables interpolate between classes)"
            )
        return self._groups[min(i, self.max_i)]

    def mean(self, i: int) -> float:
        return float(sum(e.p * e.v for e in self.row(i)))

    def variance(self, i: int) -> float:
        return float(sum(e.p * e.v * e.v for e in self.row(i)))

    def key_bounds(self, bits: int = 32) -> tuple[np.ndarray, np.ndarray]:
        """Integer key intervals ``[lo, hi)`` on ``[0, 2**bits)``, aligned with ``rows``.

        ``lo = rint(p_int_lb * 2**bits)`` and ``hi = rint(p_int_ub * 2**bits)``, rounding half to
        even (scaling by a power of two is exact). Each lb *is* the previous ub, so hi of one entry
        equals lo of the next and every row covers exactly ``[0, 2**bits)``; row i=0 is one entry
        (v=0) covering all. An entry narrower than ``2**-bits`` may get ``lo == hi``. cellKey takes
        the first entry with ``key <= ub``; ``lo <= key < hi`` differs only on the boundaries.
        """
        if not 1 <= bits <= 62:
            raise PTableError(f"bits must be between 1 and 62; got {bits}")
        scale = float(2**bits)
        lo = np.rint(np.array([e.p_int_lb for e in self.rows]) * scale).astype(np.int64)
        hi = np.rint(np.array([e.p_int_ub for e in self.rows]) * scale).astype(np.int64)
        return lo, hi

    def to_frame(self) -> pd.DataFrame:
        """R's ``pTable``: columns i, j, p, v, p_int_lb, p_int_ub, type."""
        import pandas as pd

        return pd.DataFrame([[getattr(e, c) for c in COLUMNS] for e in self.rows], columns=COLUMNS)

    def self_check(self, tol: float = 1e-6) -> pd.DataFrame:
        """R's ``empResults`` plus rule checks, one row per class; PTableError on a violation.

        Columns: i, p_mean (must be 0), p_var, p_sum (must be 1), p_stay, iter, var_rule ('<=' for
        optim 1-3, '=' for optim 4, None without params), var_reached, js_ok (no target in
        1..js), mono_ok. Tolerances are ``tol`` plus what rounding the intervals to 8 decimals can
        move (1e-8 per entry times |v| or v^2). ``var < V`` under '<=' is no violation: rows near
        0 cannot spread that far, and R keeps them (iter = 20).
        """
        import pandas as pd

        out, bad, pr = [], [], self.params
        for r, (i, entries) in enumerate(self._groups.items()):
            p, v, j = (np.array([getattr(e, c) for e in entries]) for c in "pvj")
            mean, var, total = float(p @ v), float(p @ (v * v)), float(p.sum())
            var_tol = tol + 1e-8 * float(v @ v)
            rule, reached, js_ok, mono_ok, var_ok = None, None, True, True, True
            if pr is not None and i > 0:
                rule = "=" if pr.optim[r - 1] == 4 else "<="
                reached = abs(var - pr.V) <= var_tol
                var_ok = var <= pr.V + var_tol and (rule == "<=" or reached)
                js_ok = not np.any((j >= 1) & (j <= pr.js))
                m = _mono_matrix(v) if pr.mono[r - 1] else None
                mono_ok = m is None or bool(np.all(m @ p <= 2e-8))
            for failed, what in (
                (abs(mean) > tol + 1e-8 * np.abs(v).sum(), f"mean {mean:.3g} is not 0"),
                (abs(total - 1) > 1e-9, f"probabilities sum to {total:.12g}"),
                (not var_ok, f"variance {var:.6g} breaks variance {rule} V"),
                (not js_ok, "a target in the blocked 1..js"),
                (not mono_ok, "probabilities do not rise up to v=0 (mono)"),
            ):
                if failed:
                    bad.append(f"i={i}: {what}")
            it = self.iterations[r] if self.iterations else None
            out.append(
                (i, mean, var, total, float(p[v == 0].sum()), it, rule, reached, js_ok, mono_ok)
            )
        if bad:
            raise PTableError("ptable violates its rules: " + "; ".join(bad))
        names = "i p_mean p_var p_sum p_stay iter var_rule var_reached js_ok mono_ok".split()
        return pd.DataFrame(out, columns=names)


def create_ptable(params: PTableParams) -> PTable:
    """``pt_create_pTable``: solve every class, chain the intervals, round them to 8 decimals."""
    integral = params.table == "cnts"
    rows, iterations = entries(0, [0], [0], [1.0], params.type, integral), [0]
    for r, i in enumerate(params.classes):
        p, it = _solve_class(params, r, i)
        ubs = [round(float(c), NDIGITS) for c in np.cumsum(p)]
        rows += entries(i, params.targets(i), params.noise(i), ubs, params.type, integral)
        iterations.append(it)
    return PTable(tuple(rows), params.table, params, tuple(iterations))


def count_ptable(D, V, js=0, pstay=None, optim=1, mono=True) -> PTable:
    """``create_cnt_ptable(D, V, js, pstay, optim, mono)``: a ptable for frequency counts."""
    return create_ptable(PTableParams(D, V, js, pstay, optim, mono))


def magnitude_ptable(
    D, V, js=0, pstay=None, optim=1, mono=True, step=1, icat=None, type="all"
) -> PTable:
    """``create_num_ptable``: noise on a 1/step grid for the classes icat (R's step default: 2)."""
    return create_ptable(PTableParams(D, V, js, pstay, optim, mono, "nums", step, icat, type))


def exact_difference_probability(table: PTable) -> float:
    """The largest chance, over the rows i >= 1, that two cells draw the same noise: Σ_v p(v)².

    Differencing (Geyer et al., PSD 2022, §6.4): two cells whose populations differ by one unit
    and share their largest contributor have the same amplitude x_δ; with independent cell keys
    their noises x_δ·v_A and x_δ·v_B are equal with probability Σ p(v)² of the row used, and then
    the difference of the published sums is that unit's exact value. (Both cells unchanged is
    the part p(0)² of it.) A magnitude ptable on the integer grid (step 1) with V = 1 has
    p(0) ≈ 0.40 and Σ p² ≈ 0.28 (0.31 in row 1); on a grid of 1/step the mass spreads over step
    times as many values and Σ p² falls roughly like 1/(2·√(π·V)·step): D 4, V 1, step 12 gives
    0.024 in its last row (p(0) = 0.033) and 0.038 in row 1.
    """
    return max(sum(r.p**2 for r in table.row(i)) for i in table.classes if i > 0)


def small_cells_ptable() -> PTable:
    """The separation ptable of ``pt_ex_nums(separation = TRUE)``, labelled as cellKey does."""
    return magnitude_ptable(5, 1, optim=(4, 1, 1), step=5, icat=(1, 3, 5), type="small_cells")
