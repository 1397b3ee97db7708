"""Safety zones and the scan of [MR] §5: every fidelity value an intruder's neighbour could show.

McClure and Reiter's server reports the decile interval of the fidelity measure (FM) over the
true data *and* every data set that differs from it in one record's value moved within its
safety zone (zone endpoints and P interior grid points, because FM is not monotone in the value;
[MR] Figs. 6 and 7). Grouping and filter columns of synthetic data are confidential too, so a
record may also leave or join the cell; we treat their zone as every level (the nominal zone
of [MR] §5, at its widest) [ours]: the scan includes removing each record of the cell and adding
each record (value) of the source to it.

The scans use closed forms (digest B.3, [ours; identities verified numerically]):

- mean, total and count cells depend on the records only through (Σy, Σy², n), so each
  neighbour costs O(1);
- an OLS coefficient under a change of the response uses β' = β + (XᵀX)⁻¹x_jδ and
  RSS' = RSS + 2δe_j + δ²(1 − h_jj) (digest T15); removing or adding a record uses the
  Sherman–Morrison rank-one update.

Zones (digest B.4): asymmetric, with a secret offset per value, (y − w·u, y + w·(1 − u)) with
u in [0.2, 0.8] from a keyed hash of the value, so that the midpoint does not reveal y, and width
w = max(10% of |y|, a quarter of the synthetic column's standard deviation, which is public).

Example:
    >>> a, b = np.array([0.5, 2.5]), np.array([3.0, 5.0])
    >>> zone_grid(a, b, interior=3)
    array([[0.5  , 1.125, 1.75 , 2.375, 3.   ],
           [2.5  , 3.125, 3.75 , 4.375, 5.   ]])
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from sqlsdc.synth.fidelity import fidelity_array

__all__ = [
    "INTERIOR_POINTS",
    "OlsFit",
    "aggregate_ci",
    "fit_ols",
    "ols_ci",
    "safety_zones",
    "scan_aggregate",
    "scan_ols",
    "zone_grid",
]

INTERIOR_POINTS = 9
"""P of [MR] §5 / digest B.4: interior grid points evaluated in every zone."""
ZONE_RELATIVE = 0.10
ZONE_SPREAD = 0.25
MAX_CANDIDATES = 5000
"""Most distinct values tried as a record joining a cell (more: quantiles incl. min and max)."""
_CHUNK = 50_000


def zone_offsets(values: np.ndarray, key: bytes) -> np.ndarray:
    """The secret offset u in [0.2, 0.8] of every value: a keyed BLAKE2b hash of the value, so
    equal values share a zone and nothing random needs storing (digest B.4)."""
    unique, inverse = np.unique(values, return_inverse=True)
    draws = np.array(
        [
            int.from_bytes(
                hashlib.blake2b(repr(float(v)).encode(), key=key, digest_size=8).digest(), "big"
            )
            for v in unique
        ],
        dtype=float,
    )
    return (0.2 + 0.6 * draws / 2.0**64)[inverse]


def safety_zones(values: np.ndarray, *, key: bytes, spread: float) -> tuple[np.ndarray, np.ndarray]:
    """Every value's safety zone (lower, upper), see the module docstring; ``spread`` is the
    synthetic (public) standard deviation of the column."""
    values = np.asarray(values, dtype=float)
    width = np.maximum(ZONE_RELATIVE * np.abs(values), ZONE_SPREAD * spread)
    u = zone_offsets(values, key)
    return values - width * u, values + width * (1 - u)


def zone_grid(low: np.ndarray, high: np.ndarray, interior: int = INTERIOR_POINTS) -> np.ndarray:
    """The zone endpoints and ``interior`` equally spaced points, one row per record."""
    steps = np.linspace(0.0, 1.0, interior + 2)
    return low[:, None] + (high - low)[:, None] * steps[None, :]


def aggregate_ci(kind: str, s1, s2, n, population: int) -> tuple[np.ndarray, np.ndarray]:
    """Estimate and standard error of a cell from its sums (vectorised).

    - ``avg``: ȳ = Σy/n, se² = s²/n with s² the sample variance of the cell;
    - ``sum``: the total Σ z_i over the N = ``population`` source rows, z_i = y_i in the cell
      and 0 outside, se² = N·s²_z (the usual variance of an estimated total);
    - ``count``: the same with y = 1 (s1 = s2 = n): se² = n(N − n)/(N − 1).
    """
    s1, s2, n = (np.asarray(x, dtype=float) for x in (s1, s2, n))
    with np.errstate(divide="ignore", invalid="ignore"):
        if kind == "avg":
            var = np.maximum(s2 - s1**2 / n, 0.0) / (n - 1)
            return s1 / n, np.sqrt(var / n)
        big_n = float(population)
        var_z = np.maximum(s2 - s1**2 / big_n, 0.0) / (big_n - 1)
        return s1, np.sqrt(big_n * var_z)


def _fm(estimate, se, synthetic: tuple[float, float], z: float) -> np.ndarray:
    return fidelity_array(estimate - z * se, estimate + z * se, *synthetic)


def _extremes(fm: np.ndarray, low: float, high: float) -> tuple[float, float]:
    if fm.size == 0:
        return low, high
    return min(low, float(fm.min())), max(high, float(fm.max()))


def candidates(values: np.ndarray) -> np.ndarray:
    """The values tried for a record joining a cell: all distinct ones, or at most
    :data:`MAX_CANDIDATES` quantiles including the minimum and maximum."""
    unique = np.unique(values)
    if unique.size <= MAX_CANDIDATES:
        return unique
    return np.quantile(unique, np.linspace(0, 1, MAX_CANDIDATES))


def scan_aggregate(
    kind: str,
    y: np.ndarray,
    *,
    population: int,
    synthetic: tuple[float, float],
    zones: tuple[np.ndarray, np.ndarray] | None,
    joiners: np.ndarray,
    z: float,
) -> tuple[float, float]:
    """Smallest and largest FM over the true cell ``y`` and its neighbours: every value moved
    to its zone grid (``zones``, None for a count), every record removed, every value of
    ``joiners`` added. Returns (min FM, max FM)."""
    y = np.asarray(y, dtype=float)
    s1, s2, n = y.sum(), (y * y).sum(), float(y.size)
    true = float(_fm(*aggregate_ci(kind, s1, s2, n, population), synthetic, z))
    low = high = true
    for start in range(0, y.size, _CHUNK):
        part = y[start : start + _CHUNK]
        if zones is not None:
            grid = zone_grid(zones[0][start : start + _CHUNK], zones[1][start : start + _CHUNK])
            d1 = grid - part[:, None]
            d2 = grid**2 - (part**2)[:, None]
            est, se = aggregate_ci(kind, s1 + d1, s2 + d2, n, population)
            low, high = _extremes(_fm(est, se, synthetic, z), low, high)
        est, se = aggregate_ci(kind, s1 - part, s2 - part**2, n - 1, population)
        low, high = _extremes(_fm(est, se, synthetic, z), low, high)
    joiners = np.asarray(joiners, dtype=float)
    est, se = aggregate_ci(kind, s1 + joiners, s2 + joiners**2, n + 1, population)
    return _extremes(_fm(est, se, synthetic, z), low, high)


@dataclass(frozen=True)
class OlsFit:
    """Least squares on one cell: coefficients, (XᵀX)⁻¹, residuals, leverages, RSS, n − p."""

    beta: np.ndarray
    inverse: np.ndarray
    residuals: np.ndarray
    leverage: np.ndarray
    rss: float
    dof: int


def fit_ols(x: np.ndarray, y: np.ndarray) -> OlsFit:
    """OLS by the normal equations; raises ``np.linalg.LinAlgError`` if XᵀX is singular or
    not finite, after the same work as a fit (red team s43b, on confidential records):

    - an infinite or NaN entry reached LAPACK's SVD (``cond``), which printed "On entry to
      DLASCL parameter number 4 had an illegal value" on the process's stderr: whether a
      regressor reached infinity on some record (``age + income * k * 1e-320``: the records
      with income >= 1.8e308 / k) was printed for the analyst to read;
    - a fit refused early skipped its O(n) work (20,000 rows: 0.13 against 5 ms of CPU), a
      time that told whether the regressors were collinear on the records (``income >= t``
      constant: nobody at or above t) or reached infinity."""
    with np.errstate(all="ignore"):
        gram = x.T @ x
        finite = bool(np.isfinite(gram).all())
        usable = finite and bool(np.linalg.cond(gram) <= 1e12)
        inverse = np.linalg.inv(gram) if usable else np.eye(gram.shape[0])  # the same work
        beta = inverse @ (x.T @ y)
        residuals = y - x @ beta
        leverage = np.einsum("ij,jk,ik->i", x, inverse, x)
        rss = float(residuals @ residuals)
    if not finite:
        raise np.linalg.LinAlgError("regressors not finite")
    if not usable:
        raise np.linalg.LinAlgError("collinear regressors")
    return OlsFit(beta, inverse, residuals, leverage, rss, x.shape[0] - x.shape[1])


def ols_ci(fit: OlsFit, k: int) -> tuple[float, float]:
    """Coefficient k and its standard error √(RSS/(n − p) · [(XᵀX)⁻¹]_kk)."""
    return float(fit.beta[k]), float(np.sqrt(fit.rss / fit.dof * fit.inverse[k, k]))


def scan_ols(
    fit: OlsFit,
    x: np.ndarray,
    k: int,
    *,
    synthetic: tuple[float, float],
    zones: tuple[np.ndarray, np.ndarray],
    y: np.ndarray,
    x_join: np.ndarray,
    y_join: np.ndarray,
    z: float,
) -> tuple[float, float]:
    """Smallest and largest FM of coefficient k over the true fit and its neighbours: each
    response moved over its zone grid (B.3 / T15), each record removed, each record of
    (``x_join``, ``y_join``) added (Sherman–Morrison)."""
    beta_k, akk = fit.beta[k], fit.inverse[k, k]
    true = float(_fm(*ols_ci(fit, k), synthetic, z))
    low = high = true
    g = x @ fit.inverse[:, k]  # (XᵀX)⁻¹x_j, coefficient k, for every record
    e, h = fit.residuals, fit.leverage
    for start in range(0, y.size, _CHUNK):
        part = slice(start, start + _CHUNK)
        delta = zone_grid(zones[0][part], zones[1][part]) - y[part, None]
        est = beta_k + g[part, None] * delta
        rss = fit.rss + 2 * delta * e[part, None] + delta**2 * (1 - h[part, None])
        se = np.sqrt(np.maximum(rss, 0.0) / fit.dof * akk)
        low, high = _extremes(_fm(est, se, synthetic, z), low, high)
        keep = 1 - h[part]
        est = beta_k - g[part] * e[part] / keep
        rss = fit.rss - e[part] ** 2 / keep
        se = np.sqrt(np.maximum(rss, 0.0) / (fit.dof - 1) * (akk + g[part] ** 2 / keep))
        low, high = _extremes(_fm(est, se, synthetic, z), low, high)
    if len(y_join):
        gj = x_join @ fit.inverse[:, k]
        hj = np.einsum("ij,jk,ik->i", x_join, fit.inverse, x_join)
        ej = y_join - x_join @ fit.beta
        est = beta_k + gj * ej / (1 + hj)
        rss = fit.rss + ej**2 / (1 + hj)
        se = np.sqrt(rss / (fit.dof + 1) * np.maximum(akk - gj**2 / (1 + hj), 0.0))
        low, high = _extremes(_fm(est, se, synthetic, z), low, high)
    return low, high
