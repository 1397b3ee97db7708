"""Perturbation and coding of microdata: noise, rank swapping, recoding, local suppression.

* :func:`add_noise` — correlated additive noise with exact moments (Oganian & Karr, PSD 2006,
  digest §1): X' = X + E, E with sample mean 0 and sample covariance exactly c·Σ.
* :func:`shuffle` — data shuffling (Muralidhar & Sarathy 2006; digest §6): values drawn from
  their conditional distribution given non-confidential variables, then replaced rank for rank
  by the original values.
* :func:`rank_swap` — rank swapping (Moore; digest §6 and T17) as sdcMicro's: the top and
  bottom 5 % coded to their means, the other values swapped only between ranks closer than
  p % of n.
* :func:`top_code`, :func:`recode` — top/bottom coding and global recoding into intervals.
* :func:`local_suppression` — set key values to missing until every key combination is shared
  by at least k records (as sdcMicro's ``localSuppression``: a missing value matches any value;
  the variable suppressed first is the one with the lowest ``importance`` rank).

Example:
    >>> import pandas as pd
    >>> top_code(pd.Series([1, 5, 9]), upper=6).tolist()
    [1, 5, 6]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from sqlsdc.errors import MicrodataError
from sqlsdc.microdata.risk import frequencies

__all__ = ["add_noise", "local_suppression", "rank_swap", "recode", "shuffle", "top_code"]


def add_noise(X, c: float, rng: np.random.Generator) -> np.ndarray:
    """X + E with E drawn N(0, c·Σ) and then made exact: centred, whitened by the Cholesky
    factor of its sample covariance and recoloured by that of c·Σ (Oganian & Karr §2; digest
    §1). So Cov(X') = (1 + c)·Σ exactly and the means are unchanged.
    """
    X = np.asarray(X, dtype=float)
    X = X.reshape(len(X), -1)
    if not c >= 0:  # also NaN
        raise MicrodataError(f"the noise level c must be ≥ 0, got {c}")
    n, d = X.shape
    if c == 0 or n < d + 2:
        return X.copy()
    E = rng.standard_normal((n, d))
    E -= E.mean(axis=0)
    jitter = 1e-12 * np.eye(d)
    with np.errstate(over="ignore", invalid="ignore"):
        S = np.atleast_2d(np.cov(X, rowvar=False))
        scaled = c * S
    if not np.isfinite(scaled).all():  # told here, not as NaN and inf further on
        raise MicrodataError(
            f"noise with c={c} cannot be drawn: the variance c·Σ of these values overflows; "
            "use a smaller c or rescale the values"
        )
    L_e = np.linalg.cholesky(np.atleast_2d(np.cov(E, rowvar=False)) + jitter)
    L_s = np.linalg.cholesky(scaled + jitter * max(1.0, np.abs(S).max()))
    E = E @ np.linalg.inv(L_e).T @ L_s.T
    return X + E


def _normal_scores(A: np.ndarray) -> np.ndarray:
    """Φ⁻¹((rank − ½)/n) per column (ties by order of appearance)."""
    from scipy.stats import norm

    ranks = np.argsort(np.argsort(A, axis=0, kind="stable"), axis=0)
    return norm.ppf((ranks + 0.5) / len(A))


LEAST_RESIDUAL = 1e-6  # a shuffled column's variance left given S, in normal scores


def shuffle(X, S, rng: np.random.Generator) -> np.ndarray:
    """Data shuffling of the confidential columns ``X`` given the non-confidential ``S``.

    In normal scores (digest §6 [ext]): y* = Σ_XS·Σ_SS⁻¹·s + e, e ~ N(0, Σ_XX − Σ_XS·Σ_SS⁻¹·Σ_SX);
    then each column of X is reverse-mapped: the record with the r-th smallest y*_j gets the
    r-th smallest x_j. Only original values are released, every marginal is exactly the
    original one, and rank correlations with S and within X are kept in expectation. ``S``
    may have no columns (then y* = e ~ N(0, Σ_XX)).

    A column of X whose normal scores the given columns determine (itself, a copy, any
    monotone function of it: a residual variance below :data:`LEAST_RESIDUAL`) would come back
    in its own order, every value where it was: refused, as a noise of c = 0 is (red team
    s48q: ``shuffle:weight:given=weight`` stored every weight as it was, and the file linked
    one to one with another file holding weight, 19,296 persons of the demo).
    """
    X = np.asarray(X, dtype=float)
    X = X.reshape(len(X), -1)
    S = np.asarray(S, dtype=float).reshape(len(X), -1)
    n, p = X.shape
    if n < 3:
        return X.copy()
    Zx = _normal_scores(X)
    if S.shape[1]:
        Zs = _normal_scores(S)
        C = np.atleast_2d(np.corrcoef(np.hstack([Zx, Zs]), rowvar=False))
        Cxx, Cxs, Css = C[:p, :p], C[:p, p:], C[p:, p:]
        B = Cxs @ np.linalg.pinv(Css)
        mean = Zs @ B.T
        cov = Cxx - B @ Cxs.T
    else:
        mean = np.zeros_like(Zx)
        cov = np.atleast_2d(np.corrcoef(Zx, rowvar=False))
    fixed = np.diag(cov) < LEAST_RESIDUAL
    if fixed.any():
        raise MicrodataError(
            "step shuffle moves nothing: the given columns determine the order of the "
            f"shuffled column(s) {', '.join(str(int(j) + 1) for j in np.flatnonzero(fixed))} "
            "of the step (the column itself, a copy or a monotone function of it), so each "
            "value would stay where it is; give other columns, or none"
        )
    vals, vecs = np.linalg.eigh((cov + cov.T) / 2)
    root = vecs * np.sqrt(np.clip(vals, 0, None))
    y = mean + rng.standard_normal((n, p)) @ root.T
    out = np.empty_like(X)
    for j in range(p):
        out[np.argsort(y[:, j], kind="stable"), j] = np.sort(X[:, j])
    return out


LEAST_CODED = 2
"""The fewest values rank swapping's top (bottom) share may code to their mean, as
microaggregation's least k: one value "coded" to its own mean is left as it is, and kept out
of the swap it stays on its own record (red team s49l: 22 persons aged 94+ of R01 with
``rankswap:income:p=10`` kept the largest income, 142,494.58, and the smallest exactly on the
persons who have them; below 20 values the default 5 % codes none)."""


def rank_swap(
    x, p: float, rng: np.random.Generator, *, top: float = 5.0, bottom: float = 5.0
) -> np.ndarray:
    """Rank swapping with parameter p (per cent), as sdcMicro's ``rankSwap``: first the
    ``top`` % largest and the ``bottom`` % smallest values (floor of the share of the values
    present) are each replaced by their mean and left out of the swapping (sdcMicro's
    ``TopPercent = 5, BottomPercent = 5``: R/rankSwap.R, src/RankSwapping.h @cf32510, "Top and
    bottom code Var_i and then flag as swapped"), so the file never holds the extreme values
    (a share of fewer than :data:`LEAST_CODED` values, which would code nothing, is refused);
    then walk the other ranks from the lowest: each unswapped rank i is swapped with an
    unswapped rank j drawn uniformly from i < j < i + p·n/100 (digest §6: |i − j| < P·N/100).
    Missing values stay where they are (sdcMicro flags them swapped). ``top = bottom = 0``
    gives a permutation of ``x``. Coding to the means keeps each variable's total.

    Still unlike sdcMicro: its walk starts at the highest rank and draws partners below
    ``floor(j + N'·P)`` with N' the values not coded, and without P it derives one from
    R0 = 0.95; here p is required and the window counts every record."""
    x = np.asarray(x)
    n = len(x)
    if not 0 < p <= 100:
        raise MicrodataError(f"the rank-swap parameter p must lie in (0, 100], got {p}")
    if not (0 <= top < 100 and 0 <= bottom < 100 and top + bottom < 100):
        raise MicrodataError(
            f"the rank-swap top and bottom percents must lie in [0, 100) and add up to less "
            f"than 100, got top={top:g}, bottom={bottom:g}"
        )
    present = np.flatnonzero(~pd.isna(x))
    m = len(present)
    order = present[np.argsort(x[present], kind="stable")]
    n_top, n_bottom = int(np.floor(m * top / 100)), int(np.floor(m * bottom / 100))
    for share, coded, end in ((top, n_top, "top"), (bottom, n_bottom, "bottom")):
        if m and share and coded < LEAST_CODED:
            raise MicrodataError(
                f"the rank-swap {end} {share:g} % of {m} values is {coded} value(s): coded to "
                f"the mean of fewer than {LEAST_CODED}, the {end} value would stay as it is, on "
                f"its own record; give {end} ≥ {100 * LEAST_CODED / m:.3g}, or {end}=0 to swap "
                "it with its neighbours as well"
            )
    sorted_x = x[order].copy()
    if n_top or n_bottom:
        sorted_x = sorted_x.astype(float)
        if n_bottom:
            sorted_x[:n_bottom] = sorted_x[:n_bottom].mean()
        if n_top:
            sorted_x[m - n_top :] = sorted_x[m - n_top :].mean()
    lo, hi_end = n_bottom, m - n_top  # the ranks swapped
    window = p * n / 100.0
    swapped = np.zeros(m, dtype=bool)
    for i in range(lo, hi_end):
        if swapped[i]:
            continue
        hi = min(hi_end, int(np.ceil(i + window)))
        free = np.flatnonzero(~swapped[i + 1 : hi]) + i + 1
        free = free[free - i < window]
        if len(free):
            j = free[rng.integers(len(free))]
            sorted_x[i], sorted_x[j] = sorted_x[j], sorted_x[i]
            swapped[j] = True
        swapped[i] = True
    out = x.copy() if sorted_x.dtype == x.dtype else np.full(n, np.nan)  # coded: floats
    out[order] = sorted_x
    return out


def top_code(x: pd.Series, *, upper=None, lower=None) -> pd.Series:
    """Values above ``upper`` become ``upper``, values below ``lower`` become ``lower``."""
    return x.clip(lower=lower, upper=upper)


def recode(x: pd.Series, breaks: Sequence[float]) -> pd.Series:
    """Global recoding into the intervals [b_i, b_(i+1)) labelled ``"b_i-b_(i+1)"``; the first
    and last are open (``"<b_0"``, ``">=b_last"``)."""
    b = sorted(float(v) for v in breaks)
    if not b:
        raise MicrodataError("recode needs at least one break")

    def label(v):
        if pd.isna(v):
            return None
        if v < b[0]:
            return f"<{b[0]:g}"
        for lo, hi in zip(b, b[1:], strict=False):
            if v < hi:
                return f"{lo:g}-{hi:g}"
        return f">={b[-1]:g}"

    try:
        labels = [label(v) for v in x]
    except TypeError:  # a text column: told, no internal error (test_redteam_s39b.py)
        raise MicrodataError(
            f"recode bands numbers at breaks; {x.name} holds values that are not numbers "
            "(recode a number column, or suppress or PRAM a category)"
        ) from None
    return pd.Series(labels, index=x.index, dtype=object)


def _violators(df: pd.DataFrame, keys: list[str], k: int) -> np.ndarray:
    """Records whose key matches fewer than k records, a missing value matching any value."""
    return frequencies(df, keys)["fk"].to_numpy() < k


def _blank_groups(df: pd.DataFrame, keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per record its group and per group its records: records that show the same key, a
    missing value counted as a value of its own (sdcMicro's ``freqCalc`` with ``alpha = 0``)."""
    codes = np.stack([pd.Categorical(df[c].astype("string")).codes for c in keys], axis=1)
    _, inverse, counts = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
    return inverse.ravel(), counts


def _blank_group_sizes(df: pd.DataFrame, keys: list[str]) -> np.ndarray:
    """Per record: how many records show its key exactly, blanks included."""
    inverse, counts = _blank_groups(df, keys)
    return counts[inverse]


def _fill_blank_group(out: pd.DataFrame, keys: list[str], k: int, counts: dict) -> None:
    """Blank every key of further records until the records blank in every key are none or k:
    the greedy pass leaves the last violators blank in every key, and fewer than k of those
    are a group of their own. They come from the largest group that keeps k without them,
    else a whole group (the smallest) joins; the loop ends as the blank group only grows."""
    while True:
        blank = out[keys].isna().all(axis=1).to_numpy()
        need = k - int(blank.sum())
        if not blank.any() or need <= 0:
            return
        inverse, sizes = _blank_groups(out, keys)
        sizes[inverse[blank]] = 0
        group = int(np.argmax(sizes)) if sizes.max() >= k + need else None
        if group is None:
            group = int(np.flatnonzero(sizes == sizes[sizes > 0].min())[0])
            need = int(sizes[group])
        rows = np.flatnonzero(inverse == group)[:need]
        for c in keys:
            counts[c] += int(out.iloc[rows][c].notna().sum())
            out.iloc[rows, out.columns.get_loc(c)] = None


def local_suppression(
    df: pd.DataFrame, keys: Sequence[str], k: int, importance: Sequence[int] | None = None
) -> tuple[pd.DataFrame, dict[str, int]]:
    """Suppress (set to missing) key values until every record's key, a missing value counted
    as a value of its own, is shown by at least k records.

    Greedy, as sdcMicro's ``localSuppression`` with ``importance``: repeatedly, for every
    record still violating k-anonymity, suppress its value of the least important key variable
    not yet suppressed in it (``importance``: 1 = most important; default: the variable with
    the most distinct values goes first). Returns the data and the suppressions per variable.

    sdcMicro counts a missing value as matching any value (``freqCalc``'s ``alpha = 1``), and
    stops when that count reaches k; an intruder who knows a person's key does not: the
    person's record is among the records that show the key or a blank where it differs, and
    the blanked ones are blanked because their keys were rare. One woman of R05 aged 85+ with
    tertiary education whose sex alone was blanked next to three men of that cell "matches" four
    records, but the intruder who knows her sex finds one record with a blank sex there: hers
    (red team s47i: 6 persons of the 20,000-person demo stood among 2 records at k = 3, 90 at
    k = 10). So a record counts as safe only when k records show exactly its key, blanks
    included (``alpha = 0``); every record the intruder cannot rule out then includes those
    k, and the frequencies with wildcards, which the risk report gives, are k or more too.
    The records left blank in every key are a group as well: fewer than k of them get records
    of a large group blanked beside them (:func:`_fill_blank_group`).
    """
    keys = list(keys)
    if k < 1:  # k = 0 or -3 would act as k = 1, which suppresses nothing (test_redteam_s39b.py)
        raise MicrodataError(f"k must be an integer ≥ 1, got {k!r}")
    if importance is None:
        importance = list(pd.Series({c: -df[c].nunique() for c in keys}).rank(method="first"))
    if len(importance) != len(keys):
        raise MicrodataError("give one importance per key variable")
    order = [keys[i] for i in np.argsort(importance, kind="stable")[::-1]]
    out = df.copy()
    for c in keys:
        out[c] = out[c].astype(object)
    counts = dict.fromkeys(keys, 0)
    if len(out) < k:
        raise MicrodataError(f"{len(out)} records cannot be {k}-anonymous")
    for variable in order:
        bad = _blank_group_sizes(out, keys) < k
        if not bad.any():
            break
        target = bad & out[variable].notna().to_numpy()
        out.loc[target, variable] = None
        counts[variable] += int(target.sum())
    _fill_blank_group(out, keys, k, counts)
    return out, counts
