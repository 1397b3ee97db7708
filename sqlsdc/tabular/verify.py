"""Independent checks of a protected table against the constraints of the method that made it.

A solver can return a wrong answer with a good status (costs below its tolerances, a
numerically hard model, a misread solution). So every method's result is checked here, from
the table's own matrices and the original values, not from the solver's model, before it is
returned or stored; a failed check raises :class:`~sqlsdc.errors.VerificationError` (status
``"verification_failed"``), never a result.

* :func:`verify_cta` — CTA (Castro 2006, digest ``seed_2006_tabular.md`` §0): additivity
  ``A x = 0`` and, independently, every margin the sum of its inner cells (``X``); every cell
  within its bounds (``lower ≤ x ≤ upper``, fixed and zero cells unmoved); every sensitive cell
  at or beyond its protection range, ``x ≥ a + UPL`` or ``x ≤ a − LPL``, in the chosen
  direction; the reported cost equal to ``Σ w |x − a|`` recomputed.
* :func:`verify_rounding` — controlled rounding (Salazar González 2006, §3): every cell a
  multiple of the base, inner cells already multiples unchanged (zero restriction) and the
  others on an adjacent multiple (``|x − a| < β``), margins too unless reported as relaxed
  (then within ``β + max_excess``), additivity exact.
* :func:`verify_margins` — raking: every given margin matched within the reported tolerance,
  additivity, non-negativity.
* :func:`verify_suppression` — cell suppression (τ-ARGUS): every primary cell suppressed, and the
  attacker's LP (:mod:`sqlsdc.tabular.attacker`) run again on the pattern finds every primary
  cell's interval wide enough.

Tolerances: sums are compared up to ``RTOL · max(1, max|a|)`` (float rounding of sums of up to
10^6 cells), a cell's own requirement up to ``RTOL · max(1, |a_i|, level_i)``.

Example:
    >>> import pandas as pd
    >>> from sqlsdc.tabular.model import Table
    >>> t = Table.from_cells(pd.DataFrame({"g": ["a", "b"], "value": [4.0, 6.0], "n": [1, 1]}),
    ...                      ["g"])
    >>> verify_rounding(t, np.array([10.0, 5.0, 5.0]), 5).passed
    True
    >>> verify_rounding(t, np.array([10.0, 0.0, 5.0]), 5).problems[0]
    'additivity: 1 equation(s) off by up to 5 (tolerance 1e-08)'
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sqlsdc.errors import VerificationError
from sqlsdc.tabular.model import Table

RTOL = 1e-9


@dataclass(frozen=True)
class Verification:
    """The outcome of one method's checks: ``passed`` and, when not, one line per failed check;
    ``checks`` holds the largest violation (or the count) of every check, for the report."""

    method: str
    problems: tuple[str, ...] = ()
    checks: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.problems

    def require(self) -> Verification:
        """Raise :class:`VerificationError` unless every check passed; else return self."""
        if self.problems:
            raise VerificationError(self.method, list(self.problems))
        return self

    def to_dict(self) -> dict:
        return {"passed": self.passed, "problems": list(self.problems), **self.checks}


class _Checks:
    """Collects the failed checks of one verification."""

    def __init__(self, table: Table, method: str):
        self.table, self.method = table, method
        self.problems: list[str] = []
        self.checks: dict = {}

    def cells(self, name: str, bad: np.ndarray, excess: np.ndarray, what: str) -> None:
        """Fail ``name`` when any cell of ``bad`` holds; ``excess`` is the size per cell."""
        self.checks[name] = int(bad.sum())
        if bad.any():
            worst = float(np.max(np.where(bad, excess, -np.inf)))
            self.problems.append(
                f"{name}: {int(bad.sum())} cell(s) {what} by up to {worst:.6g}, e.g. "
                f"{_describe(self.table, bad)}"
            )

    def result(self) -> Verification:
        return Verification(self.method, tuple(self.problems), self.checks)

    def additivity(self, x: np.ndarray, values: np.ndarray) -> None:
        """``A x = 0`` and every margin the sum of its inner cells (``X``), independently."""
        tol = RTOL * max(1.0, float(np.abs(values).max(initial=0.0)))
        residual = np.abs(self.table.A @ x) if self.table.A.shape[0] else np.zeros(0)
        self.checks["max_additivity_error"] = float(residual.max(initial=0.0))
        if (residual > tol).any():
            self.problems.append(
                f"additivity: {int((residual > tol).sum())} equation(s) off by up to "
                f"{residual.max():.6g} (tolerance {tol:.3g})"
            )
        t = self.table
        if t.X is not None and not np.any(t.inner < 0):
            sums = np.asarray(t.X.T @ x[t.inner], dtype=np.float64).ravel()
            self.cells("margins", np.abs(sums - x) > tol, np.abs(sums - x),
                       "differ from the sum of their inner cells")  # fmt: skip

    def shaped_and_finite(self, x: np.ndarray, values: np.ndarray) -> bool:
        """One finite value per cell: else the problem is recorded and no other check can
        read ``x``."""
        if x.shape != values.shape:
            self.problems.append(f"shape: {x.size} values for {values.size} cells")
            return False
        return self.finite(x)

    def finite(self, x: np.ndarray) -> bool:
        bad = ~np.isfinite(x)
        if bad.any():
            self.problems.append(
                f"values: {int(bad.sum())} cell(s) are not finite, e.g. "
                f"{_describe(self.table, bad)}"
            )
        return not bad.any()


def verify_cta(
    table: Table,
    adjusted: np.ndarray,
    *,
    sensitive: np.ndarray,
    upl: np.ndarray,
    lpl: np.ndarray,
    up_room: np.ndarray | None = None,
    down_room: np.ndarray | None = None,
    directions: np.ndarray | None = None,
    weights: np.ndarray | None = None,
    objective: float | None = None,
    atol: float = 0.0,
    method: str = "cta",
) -> Verification:
    """Check an adjusted table against the CTA constraints (module docstring).

    ``up_room``/``down_room`` are how far each cell may move (bounds, caps, fixed and zero
    cells; default: a non-negative table stays non-negative, nothing else); ``directions``
    (+1/−1 per sensitive cell) the chosen directions, by default the sign of each move;
    ``weights`` and ``objective`` the cost (1) to recompute; ``atol`` an absolute tolerance
    added to every cell's (the convergence tolerance of an iterative method).
    """
    values = table.values
    x = np.asarray(adjusted, dtype=np.float64)
    c = _Checks(table, method)
    if not c.shaped_and_finite(x, values):
        return c.result()
    c.additivity(x, values)
    change = x - values
    if up_room is None:
        nonneg = not table.negative and bool((values >= 0).all())
        up_room = np.full(values.size, np.inf)
        down_room = values.copy() if nonneg else np.full(values.size, np.inf)
    tol = RTOL * np.maximum.reduce([np.ones_like(values), np.abs(values), upl, lpl]) + atol
    c.cells("bounds", change > up_room + tol, change - up_room, "move up beyond their bounds")
    c.cells("bounds", -change > down_room + tol, -change - down_room,
            "move down beyond their bounds")  # fmt: skip
    s = np.asarray(sensitive, dtype=bool)
    up = change > 0 if directions is None else np.asarray(directions) > 0
    short = np.where(up, values + upl - x, x - (values - lpl))
    c.cells("protection", s & (short > tol), short,
            "stay inside their protection range")  # fmt: skip
    if weights is not None and objective is not None:
        cost = float(np.sum(np.asarray(weights) * np.abs(change)))
        c.checks["cost"] = cost
        if not np.isclose(cost, objective, rtol=1e-6, atol=1e-9):
            c.problems.append(f"cost: reported {objective:.9g}, recomputed {cost:.9g}")
    return c.result()


def verify_rounding(
    table: Table,
    rounded: np.ndarray,
    base: int,
    *,
    relaxed: np.ndarray | None = None,
    max_excess: float = 0.0,
) -> Verification:
    """Check a controlled rounding to ``base`` (module docstring); ``relaxed`` marks the margins
    reported beyond their adjacent multiples, by at most ``max_excess``."""
    values = table.values
    x = np.asarray(rounded, dtype=np.float64)
    c = _Checks(table, "round")
    if not c.shaped_and_finite(x, values):
        return c.result()
    c.additivity(x, values)
    scale = np.maximum(1.0, np.abs(values))
    off = np.abs(x / base - np.round(x / base)) * base
    c.cells("multiples", off > RTOL * scale, off, f"are not multiples of {base}")
    inner = table.cells["is_inner"].to_numpy(bool)
    on_multiple = np.abs(values / base - np.round(values / base)) * base <= RTOL * scale
    moved = np.abs(x - values)
    c.cells("zero restriction", inner & on_multiple & (moved > RTOL * scale), moved,
            f"were multiples of {base} and moved")  # fmt: skip
    relaxed = np.zeros(values.size, dtype=bool) if relaxed is None else np.asarray(relaxed)
    limit = np.where(relaxed & ~inner, base + max_excess, base)
    c.cells("distance", moved >= limit - RTOL * scale, moved,
            f"moved a base ({base}) or more from the original")  # fmt: skip
    c.checks["max_distance"] = float(moved.max(initial=0.0))
    return c.result()


def verify_margins(
    table: Table,
    published: np.ndarray,
    given: np.ndarray,
    targets: np.ndarray,
    *,
    tolerance: float,
) -> Verification:
    """Check a raked table: the ``given`` cells (positions) equal their ``targets`` within
    ``tolerance``, the table is additive and, for a non-negative table, non-negative."""
    values = table.values
    x = np.asarray(published, dtype=np.float64)
    c = _Checks(table, "ipf")
    if not c.finite(x):
        return c.result()
    c.additivity(x, values)
    error = np.zeros(values.size)
    error[given] = np.abs(x[given] - targets)
    c.checks["max_margin_error"] = float(error.max(initial=0.0))
    c.cells("margins given", error > tolerance, error,
            f"miss their given value (tolerance {tolerance:g})")  # fmt: skip
    if not table.negative and bool((values >= 0).all()):
        c.cells("non-negative", x < -RTOL * max(1.0, float(values.max(initial=0.0))), -x,
                "are negative")  # fmt: skip
    return c.result()


def verify_suppression(
    table: Table,
    suppressed: np.ndarray,
    *,
    primary: np.ndarray,
    upl: np.ndarray,
    lpl: np.ndarray,
    time_limit: float = 60.0,
    lower: np.ndarray | None = None,
    upper: np.ndarray | None = None,
) -> Verification:
    """Check a suppression pattern: every primary cell suppressed, and the attacker's LP on the
    published cells leaves every primary cell an exact interval reaching its levels. ``lower``
    and ``upper``: what the attacker knows of each cell a priori (default [0, inf) for
    non-negative tables; a sum job passes the policy's measure bounds, red team s44o)."""
    from sqlsdc.tabular.attacker import audit_check, audit_intervals

    values = table.values
    c = _Checks(table, "suppress")
    suppressed = np.asarray(suppressed, dtype=bool)
    primary = np.asarray(primary, dtype=bool)
    c.cells("primary published", primary & ~suppressed, np.abs(values),
            "are primary but published")  # fmt: skip
    nonneg = not table.negative and bool((values >= 0).all())
    if lower is None:
        lower = np.zeros_like(values) if nonneg else np.full_like(values, -np.inf)
    else:  # no protection below what is known (as sqlsdc.tabular.protect clips the levels)
        lpl = np.minimum(lpl, values - lower)
    if upper is None:
        upper = np.full_like(values, np.inf)
    else:  # no protection above what is known either
        upl = np.minimum(upl, upper - values)
    integer = bool(table.count and not table.weighted and np.all(values == np.round(values)))
    result = audit_intervals(table.A, values, suppressed, lower=lower, upper=upper,
                             integer=integer,
                             time_limit=time_limit)  # fmt: skip
    ok = np.asarray(audit_check(result, values, primary, upl, lpl), dtype=bool)
    failing = primary & suppressed & ~(ok & np.asarray(result.exact, dtype=bool))
    c.cells("audit", failing, np.maximum(upl, lpl),
            "have an attacker interval narrower than their protection levels")  # fmt: skip
    return c.result()


def _describe(table: Table, mask: np.ndarray) -> str:
    rows = table.cells.loc[mask, list(table.dims)].head(3)
    return "; ".join(str(r) for r in rows.astype(str).to_dict("records"))
