"""Re-identification risk of microdata on key variables (quasi-identifiers).

A *key* is the combination of values of the key variables a record shows; an intruder who knows
them for a person links the person to the records with the same key.

* :func:`frequencies` — sample frequency f_k of each record's key and its population estimate
  F̂_k = Σ_{i∈k} w_i (Horvitz–Thompson with the sampling weights; F̂_k = f_k without weights).
* :func:`k_anonymity_violations` — records whose key is shared by fewer than k records, per k.
* :func:`individual_risk` — the Benedetti–Franconi risk r_k = E(1/F_k | f_k) used by μ-Argus and
  sdcMicro (Di Consiglio & Polettini, PSD 2006; digest 2006 §12 and test case T4).
* :func:`linkage_rate` — distance-based record linkage (DBRL) of masked numeric records back to
  the originals, Euclidean on standardised variables or Mahalanobis (digest 2006 §11, T13).
* :func:`household_risk` — the risk of a household: the probability that at least one of its
  members is re-identified, 1 − ∏(1 − r_i) (μ-Argus's household risk; Hundepool et al.,
  *Statistical Disclosure Control*, 2012, §3.3.6).
* :func:`interval_disclosure` — share of original numeric values lying in an interval around
  their masked value, by rank or by standard deviation (Domingo-Ferrer, Mateo-Sanz & Torra
  2001; digest 2006 §20).
* :func:`risk_summary` — global risk Σr/n, expected re-identifications Σr, records above a
  threshold, k-anonymity violations, and household risk when households are given.

A missing value in a key variable matches any value (sdcMicro's convention).

Example:
    >>> round(float(individual_risk([1], [10])[0]), 6)
    0.255843
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from numba import njit
from scipy.spatial import cKDTree

from sqlsdc.errors import MicrodataError
from sqlsdc.microdata.groups import unique_rows

__all__ = [
    "RiskSummary",
    "household_risk",
    "interval_disclosure",
    "linkage_rate",
    "mahalanobis_sq",
    "frequencies",
    "individual_risk",
    "k_anonymity_violations",
    "risk_summary",
]


def _check(df: pd.DataFrame, keys: Sequence[str], weights: str | None) -> None:
    missing = [c for c in [*keys, *([weights] if weights else [])] if c not in df.columns]
    if missing or not keys:
        raise MicrodataError(
            f"key variables {missing or list(keys)} not in the data; available: {list(df.columns)}"
        )


def frequencies(df: pd.DataFrame, keys: Sequence[str], weights: str | None = None) -> pd.DataFrame:
    """Per record: ``fk``, the number of records whose key matches its key, and ``Fk``, the
    estimated number of population units with it (the sum of the weights over those records;
    ``fk`` without weights). Indexed like ``df``.

    A missing value matches any value (sdcMicro's convention, so that local suppression lowers
    the risk): a record with region missing matches every record that agrees on the other keys.
    Only combinations with a missing value can match others, so the compatibility matrix is
    (combinations with a missing value) × (all combinations), built in blocks.

    Raises:
        MicrodataError: a key or weight column is missing, or a weight is negative or missing.
    """
    _check(df, keys, weights)
    if weights is None:
        w = np.ones(len(df))
    else:
        w = pd.to_numeric(df[weights], errors="coerce").to_numpy(dtype=float)
        if not np.isfinite(w).all() or (w < 0).any():
            raise MicrodataError(
                f"weights in {weights!r} must be finite and non-negative; fix or drop those rows"
            )
    if not len(df):
        return pd.DataFrame({"fk": np.zeros(0, dtype=np.int64), "Fk": np.zeros(0)}, index=df.index)
    codes = np.stack([pd.Categorical(df[c].astype("string")).codes for c in keys], axis=1).astype(
        np.int64
    )
    combos, inverse, counts = unique_rows(codes)
    sums = np.bincount(inverse, weights=w, minlength=len(combos))
    f, F = counts.astype(np.int64), sums.copy()
    wild = np.flatnonzero((combos < 0).any(axis=1))
    plain = ~(combos < 0).any(axis=1)
    f[wild], F[wild] = 0, 0.0
    step = max(1, 10**7 // max(1, len(combos) * len(keys)))
    for start in range(0, len(wild), step):
        block = wild[start : start + step]
        rows = combos[block]
        comp = (
            (rows[:, None, :] == combos[None, :, :]) | (rows[:, None, :] < 0) | (combos < 0)
        ).all(axis=2)  # block of combinations with a missing value × all combinations
        f[block], F[block] = comp @ counts, comp @ sums
        f[plain] += counts[block] @ comp[:, plain]
        F[plain] += sums[block] @ comp[:, plain]
    fk = f[inverse]
    Fk = fk.astype(float) if weights is None else F[inverse]
    return pd.DataFrame({"fk": fk, "Fk": Fk}, index=df.index)


def k_anonymity_violations(
    df: pd.DataFrame, keys: Sequence[str], ks: Sequence[int] = (2, 3, 5)
) -> dict[int, int]:
    """Number of records whose key is shared by fewer than k records (f_k < k), for each k."""
    fk = frequencies(df, keys)["fk"].to_numpy()
    return {int(k): int((fk < k).sum()) for k in ks}


def individual_risk(fk, Fk) -> np.ndarray:
    """Benedetti–Franconi individual risk r = E(1/F | f) (digest 2006 §12, test case T4).

    Model: F | π ~ Poisson(Nπ), f | F ~ Bin(F, p), prior ∝ 1/π, plug-in p = f/F̂. Then

        r(f, p) = (p^f / f) · ₂F₁(f, f; f + 1; 1 − p)

    which Euler's transformation ₂F₁(a, b; c; z) = (1 − z)^(c−a−b) ₂F₁(c − a, c − b; c; z)
    turns into the form evaluated here (:func:`_bf_risk`), free of the p^f underflow and ₂F₁
    overflow of large f:

        r(f, p) = (p / f) · ₂F₁(1, 1; f + 1; 1 − p).

    f = 1 gives p·ln(1/p)/(1 − p); p = 1 gives 1/f. F̂ below f (weights under 1) is clamped to
    f (digest §12: "Clamp F̂ ≥ f_k"), so r ≤ 1/f ≤ 1. This is μ-ARGUS 4.1's risk (its closed
    forms for f ≤ 3, its series beyond). sdcMicro's ``measure_risk`` (``compute_risk`` in
    Measure_Risk.h) differs: it lowers p by 0.0001 and takes p/(f − (1 − p)) from f = 3 on
    (f = 3, p = 0.3: 0.1304 against 0.1254 here).

    Args:
        fk: sample frequencies (≥ 1).
        Fk: estimated population frequencies.
    """
    f = np.asarray(fk, dtype=float)
    F = np.maximum(np.asarray(Fk, dtype=float), f)
    if (f < 1).any() or (f != np.round(f)).any():
        raise MicrodataError("sample frequencies must be whole numbers of at least 1")
    pairs, inverse = np.unique(np.stack([f, f / F]), axis=1, return_inverse=True)
    risk = _bf_risk(pairs[0].astype(np.int64), pairs[1])
    return risk[inverse.ravel()]


@njit(cache=True)
def _bf_risk(f, p):
    """r(f, p) = p · J_f with J_f = ∫₀¹ s^(f−1) / (p + q s) ds = ₂F₁(1, 1; f + 1; q) / f.

    (Euler's integral for ₂F₁.) For p < ½, the forward recurrence q·J_(f+1) + p·J_f = 1/f from
    J_1 = ln(1/p)/q, whose errors shrink by p/q per step; for p ≥ ½, the series
    ₂F₁(1, 1; f + 1; q) = Σ_n n! q^n / (f + 1)_n, whose terms shrink by at least q ≤ ½. (SciPy's
    ``hyp2f1`` returns NaN for large f near q = 1, e.g. (1, 1; 301; 0.99).)
    """
    out = np.empty(len(f))
    for i in range(len(f)):
        fi, pi = f[i], p[i]
        qi = 1.0 - pi
        if pi >= 1.0:
            out[i] = 1.0 / fi
        elif pi < 0.5:
            j = -np.log(pi) / qi
            for m in range(1, fi):
                j = (1.0 / m - pi * j) / qi
            out[i] = pi * j
        else:
            term, total, n = 1.0, 1.0, 0
            while term > 1e-17 * total:
                term *= (n + 1.0) / (fi + 1.0 + n) * qi
                total += term
                n += 1
            out[i] = pi * total / fi
    return out


@dataclass(frozen=True)
class RiskSummary:
    """Risk of a file on its key variables.

    Attributes:
        records: number of records.
        keys: the key variables.
        sample_uniques: records with f_k = 1.
        violations: records with f_k < k, per k.
        expected_reidentifications: Σ r_i, the expected number of records an intruder
            re-identifies (μ-Argus/sdcMicro "expected re-identifications").
        global_risk: Σ r_i / n.
        max_risk: the largest individual risk.
        above_threshold: records with r_i > ``threshold``.
        threshold: the individual-risk threshold used.
        households: the household figures when a household column was given — households,
            expected re-identified households Σ_h r_h, global household risk and the
            households with r_h above ``threshold``, and sdcMicro's per-record figures
            (``hier_risk_ER`` = Σ over records of r_h, the records re-identified with their
            household; ``hier_risk`` its mean over records) — else None.
    """

    records: int
    keys: tuple[str, ...]
    sample_uniques: int
    violations: dict[int, int]
    expected_reidentifications: float
    global_risk: float
    max_risk: float
    above_threshold: int
    threshold: float
    households: dict | None = None

    def to_dict(self) -> dict:
        """Plain JSON-ready values."""
        out = asdict(self)
        out["keys"] = list(self.keys)
        out["violations"] = {str(k): v for k, v in self.violations.items()}
        return out


def risk_summary(
    df: pd.DataFrame,
    keys: Sequence[str],
    *,
    weights: str | None = None,
    ks: Sequence[int] = (2, 3, 5),
    threshold: float = 0.1,
    household: str | None = None,
) -> RiskSummary:
    """Sample uniques, k-anonymity violations, and Benedetti–Franconi global risk of ``df``;
    with ``household`` (a household identifier column), the household risk too."""
    freq = frequencies(df, keys, weights)
    fk = freq["fk"].to_numpy()
    r = individual_risk(fk, freq["Fk"].to_numpy()) if len(df) else np.zeros(0)
    households = None
    if household is not None:
        if household not in df.columns:
            raise MicrodataError(f"household column {household!r} not in the data")
        rh = household_risk(r, df[household].to_numpy())
        first = ~df[household].duplicated().to_numpy()
        households = {
            "households": int(first.sum()),
            "expected_reidentifications": float(rh[first].sum()),
            "global_risk": float(rh[first].mean()) if first.any() else 0.0,
            "above_threshold": int((rh[first] > threshold).sum()),
            # sdcMicro's measure_risk (R/measure_risk.R @cf32510) counts per record:
            # hier_risk_ER = Σ over records of their household's risk, hier_risk its mean
            "records_expected_reidentified": float(rh.sum()),
            "records_global_risk": float(rh.mean()) if len(rh) else 0.0,
        }
    return RiskSummary(
        records=len(df),
        keys=tuple(keys),
        sample_uniques=int((fk == 1).sum()),
        violations={int(k): int((fk < k).sum()) for k in ks},
        expected_reidentifications=float(r.sum()),
        global_risk=float(r.mean()) if len(r) else 0.0,
        max_risk=float(r.max()) if len(r) else 0.0,
        above_threshold=int((r > threshold).sum()),
        threshold=float(threshold),
        households=households,
    )


def household_risk(risk, households) -> np.ndarray:
    """Per record, the risk of its household: r_h = 1 − ∏_{i∈h}(1 − r_i), the probability that
    at least one member is re-identified when members are re-identified independently (an
    intruder who identifies one member learns the whole household; μ-Argus, Hundepool et al.
    2012 §3.3.6). ``households`` holds each record's household identifier (missing values are
    refused: every record must belong to a household).

    Example: members with risks 0.5 and 0.2 give 1 − 0.5·0.8 = 0.6 for both.
    """
    r = np.asarray(risk, dtype=float)
    ids = pd.Series(households)
    if len(ids) != len(r):
        raise MicrodataError(f"{len(r)} risks but {len(ids)} household identifiers")
    if ids.isna().any():
        raise MicrodataError("household identifiers are missing for some records")
    if ((r < 0) | (r > 1)).any():
        raise MicrodataError("individual risks must lie in [0, 1]")
    codes, _ = pd.factorize(ids)
    with np.errstate(divide="ignore"):
        log_safe = np.bincount(codes, weights=np.log1p(-np.minimum(r, 1.0)))
    return 1.0 - np.exp(log_safe)[codes]


def interval_disclosure(original, masked, *, p: Sequence[float] = tuple(range(1, 11)),
                        method: str = "rank") -> dict:  # fmt: skip
    """Interval disclosure of masked numeric columns (Domingo-Ferrer, Mateo-Sanz & Torra 2001;
    digest 2006 §20): the percentage of original values that lie in an interval around their
    masked value, per column and averaged over columns, for each width p (per cent):

    * ``rank``: the interval spans the original values whose ranks lie within p % of n on
      either side of the masked value's rank among the originals;
    * ``sd``: masked value ± p % of the original column's standard deviation. This is not
      sdcMicro's ``dRisk`` (sdcTools/sdcMicro ``R/dRisk.R``, ``dRiskWORK``), which takes the
      standard deviation of the *masked* column and returns one record-level share: the records
      with at most one column strictly outside its interval. Here every column is scored alone
      and the shares are averaged, as the rank variant and Domingo-Ferrer et al. do.

    Row i of ``masked`` is the masked version of row i of ``original``. Returns
    ``{"method", "p", "per_column": {column: [% per p]}, "mean": [% per p], "overall"}`` where
    ``overall`` averages over the widths, the single figure usually quoted. Missing values
    count as not disclosed.
    """
    X = pd.DataFrame(original).reset_index(drop=True)
    Z = pd.DataFrame(masked).reset_index(drop=True)
    if list(X.columns) != list(Z.columns) or len(X) != len(Z) or not len(X):
        raise MicrodataError(f"original {X.shape} and masked {Z.shape} data must match")
    if method not in ("rank", "sd"):
        raise MicrodataError(f"unknown interval method {method!r}; use rank or sd")
    widths = [float(w) for w in p]
    if not widths or any(not 0 < w <= 100 for w in widths):
        raise MicrodataError("interval widths p are percentages in (0, 100]")
    per_column = {}
    for c in X.columns:
        x = pd.to_numeric(X[c], errors="coerce").to_numpy(float)
        z = pd.to_numeric(Z[c], errors="coerce").to_numpy(float)
        per_column[str(c)] = [100.0 * float(_within(x, z, w, method).mean()) for w in widths]
    mean = np.mean(list(per_column.values()), axis=0)
    return {"method": method, "p": widths, "per_column": per_column,
            "mean": [float(v) for v in mean], "overall": float(mean.mean())}  # fmt: skip


def _within(x: np.ndarray, z: np.ndarray, width: float, method: str) -> np.ndarray:
    """Whether each original x_i lies in the interval of width ``width`` % around z_i."""
    known = np.isfinite(x) & np.isfinite(z)
    if method == "sd":
        half = width / 100.0 * np.nanstd(x[np.isfinite(x)], ddof=1)
        return known & (np.abs(x - z) <= half)
    ordered = np.sort(x[np.isfinite(x)])
    n = len(ordered)
    if not n:
        return np.zeros(len(x), dtype=bool)
    reach = int(np.floor(width / 100.0 * n))
    rank = np.clip(np.searchsorted(ordered, np.where(known, z, 0.0)), 0, n - 1)
    lo = ordered[np.clip(rank - reach, 0, n - 1)]
    hi = ordered[np.clip(rank + reach, 0, n - 1)]
    return known & (x >= lo) & (x <= hi)


def mahalanobis_sq(diff, cov) -> np.ndarray:
    """d² = (a − b)ᵀ·C⁻¹·(a − b) for each row of ``diff`` (digest 2006 §11, T13: with
    C = Var(A) + Var(B) = [[2, 1.8], [1.8, 2]], (1, −1) gives 10.0 and (1, 1) 0.5263)."""
    diff = np.atleast_2d(np.asarray(diff, dtype=float))
    return np.einsum("ij,ij->i", diff, np.linalg.solve(np.asarray(cov, float), diff.T).T)


def linkage_rate(original, masked, *, metric: str = "euclidean") -> float:
    """Share of masked records whose nearest original record is their own (DBRL).

    ``euclidean``: on the variables standardised by the original standard deviations (DBRL1);
    ``mahalanobis``: with C = Var(original) + Var(masked) (DBRLM-COV; Torra, Abowd &
    Domingo-Ferrer, PSD 2006; digest §11). Rows correspond: row i of ``masked`` comes from row
    i of ``original``. A k-anonymous microaggregation links at most about 1/k of the records.
    """
    X = np.asarray(original, dtype=float)
    Z = np.asarray(masked, dtype=float)
    X, Z = X.reshape(len(X), -1), Z.reshape(len(Z), -1)
    if X.shape != Z.shape or not len(X):
        raise MicrodataError(f"original {X.shape} and masked {Z.shape} data must match")
    if metric == "euclidean":
        sd = X.std(axis=0, ddof=1) if len(X) > 1 else np.ones(X.shape[1])
        W = np.diag(1.0 / np.where(sd > 0, sd, 1.0))
    elif metric == "mahalanobis":
        C = np.atleast_2d(np.cov(X, rowvar=False) + np.cov(Z, rowvar=False))
        C += 1e-12 * np.trace(C) * np.eye(len(C))
        W = np.linalg.cholesky(np.linalg.inv(C))  # ‖Wᵀx‖² = xᵀC⁻¹x
    else:
        raise MicrodataError(f"unknown metric {metric!r}; use euclidean or mahalanobis")
    return float((_nearest(X @ W, Z @ W) == np.arange(len(X))).mean())


def _nearest(points: np.ndarray, queries: np.ndarray, chunk: int = 20_000) -> np.ndarray:
    """The index of each query's nearest point (``cKDTree.query``, the same answers). A
    query's answer is a function of the query point, so each distinct one is asked once (a
    microaggregated column repeats each value k times; the 1,000,000-person demo's zero
    incomes made one leaf of about 200,000 equal points that every zero query scanned: 45 s
    of CPU), in chunks, between which Ctrl-C stops it (one call did not return to Python)."""
    distinct, inverse = np.unique(queries, axis=0, return_inverse=True)
    tree = cKDTree(points)
    found = np.empty(len(distinct), dtype=np.intp)
    for start in range(0, len(distinct), chunk):
        found[start : start + chunk] = tree.query(distinct[start : start + chunk], k=1)[1]
    return found[inverse.ravel()]
