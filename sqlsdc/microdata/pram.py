"""PRAM: the post-randomisation method for categorical variables (de Wolf, PSD 2006; digest §8).

Each record's category ξ = k is replaced by X = l with probability p_kl, row k of a Markov
matrix P, independently of the other records. Then E(T_X | ξ) = Pᵗ·T_ξ, and the unbiased
estimate of the original table is T̂_ξ = (P⁻¹)ᵗ·T_X (:func:`unbiased_counts`), with
Var(T̂) = (P⁻¹)ᵗ·Var(T_X|ξ)·P⁻¹, Var(T_X|ξ) = Σ_k T_ξ(k)·(diag(p_k·) − p_k·p_k·ᵗ).

Matrix builders (digest §8, test cases T1 and T3): :func:`matrix_e` nE(p), :func:`matrix_b`
nB(p; b), :func:`matrix_f` nF(p), and the invariant ones, for which Tᵗ·P = Tᵗ so that the
expected frequencies are the original ones: :func:`matrix_invariant` (Gouweleeuw et al.) and
:func:`make_invariant` (the two-stage R = P·Q, Q the backward matrix of P).

Draws (:func:`apply`) take a NumPy generator; the anonymisation job keys it from the database's
PRF secret (:func:`sqlsdc.microdata.steps.generator`), so the same seed and secret give the
same output.

Example:
    >>> matrix_b(0.6, 2, 4).round(2).tolist()[1]
    [0.2, 0.6, 0.2, 0.0]
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sqlsdc.errors import MicrodataError

__all__ = [
    "apply",
    "make_invariant",
    "matrix_b",
    "matrix_e",
    "matrix_f",
    "matrix_invariant",
    "pram_risk",
    "unbiased_counts",
    "unbiased_variance",
]


def _check_p(p: float) -> float:
    if not 0 < p <= 1:
        raise MicrodataError(f"the diagonal probability p must lie in (0, 1], got {p}")
    return float(p)


def matrix_e(p: float, n: int) -> np.ndarray:
    """nE(p): p on the diagonal, (1 − p)/(n − 1) everywhere else (digest §8)."""
    p = _check_p(p)
    if n == 1:
        return np.ones((1, 1))
    P = np.full((n, n), (1 - p) / (n - 1))
    np.fill_diagonal(P, p)
    return P


def matrix_b(p: float, b: int, n: int) -> np.ndarray:
    """nB(p; b): p on the diagonal, 1 − p spread evenly over the entries with 0 < |k − l| < b
    (neighbouring categories of an ordinal variable; digest §8, T3: 4B(0.6; 2))."""
    p = _check_p(p)
    row, col = np.indices((n, n))
    near = (np.abs(row - col) < b) & (row != col)
    P = np.where(near, (1 - p) / np.maximum(near.sum(axis=1, keepdims=True), 1), 0.0)
    np.fill_diagonal(P, p)
    P[near.sum(axis=1) == 0] = np.eye(n)[near.sum(axis=1) == 0]
    return P


def matrix_f(p: float, counts) -> np.ndarray:
    """nF(p), frequency-based (n ≥ 3): p_kl = (1 − p)(N − T_k − T_l) / ((n − 2)(N − T_k))
    (de Wolf eq. 18; digest T1: T = (5576, 24, 632), p = 0.6). Rows sum to 1; not invariant."""
    p = _check_p(p)
    T = np.asarray(counts, dtype=float)
    n, N = len(T), T.sum()
    if n < 3:
        raise MicrodataError("nF needs at least 3 categories")
    P = (1 - p) * (N - T[:, None] - T[None, :]) / ((n - 2) * (N - T[:, None]))
    np.fill_diagonal(P, p)
    return P


def matrix_invariant(counts, theta: float) -> np.ndarray:
    """Invariant PRAM of Gouweleeuw et al.: p_kk = 1 − θ·T_min/T_k, p_kl = θ·T_min/((K−1)·T_k)
    (digest §8 and T3: T = (500, 300, 200), θ = .5). Tᵗ·P = Tᵗ."""
    T = np.asarray(counts, dtype=float)
    if (T <= 0).any():
        raise MicrodataError("invariant PRAM needs every category present (counts > 0)")
    if not 0 < theta <= 1:
        raise MicrodataError(f"theta must lie in (0, 1], got {theta}")
    K = len(T)
    if K == 1:
        return np.ones((1, 1))
    off = theta * T.min() / ((K - 1) * T)
    P = np.repeat(off[:, None], K, axis=1)
    np.fill_diagonal(P, 1 - theta * T.min() / T)
    return P


def make_invariant(P, counts) -> np.ndarray:
    """Two-stage invariant matrix R = P·Q, Q the backward matrix q_lk = p_kl·T_k / Σ_m p_ml·T_m
    (digest §8, T3). Tᵗ·R = Tᵗ; a rare category may keep a tiny diagonal (check it)."""
    P = np.asarray(P, dtype=float)
    T = np.asarray(counts, dtype=float)
    joint = P * T[:, None]  # joint[k, l] = T_k p_kl
    Q = (joint / joint.sum(axis=0, keepdims=True)).T
    return P @ Q


def _check_matrix(P: np.ndarray, n: int) -> None:
    if P.shape != (n, n) or (P < -1e-12).any() or not np.allclose(P.sum(axis=1), 1):
        raise MicrodataError(f"a PRAM matrix is {n} × {n} with rows of probabilities summing to 1")


def apply(values: pd.Series, P, categories, rng: np.random.Generator) -> pd.Series:
    """Redraw each value of ``values`` from the row of ``P`` of its category.

    ``categories`` orders the rows and columns of P; values outside them (and missing values)
    are left unchanged. Inverse-CDF draws with one uniform per record.
    """
    P = np.asarray(P, dtype=float)
    categories = list(categories)
    _check_matrix(P, len(categories))
    position = {c: i for i, c in enumerate(categories)}
    codes = np.array([position.get(v, -1) if not pd.isna(v) else -1 for v in values])
    inside = codes >= 0
    cdf = np.cumsum(P, axis=1)
    cdf[:, -1] = 1.0
    u = rng.random(len(values))
    drawn = (u[:, None] >= cdf[np.maximum(codes, 0)]).sum(axis=1)
    out = values.copy().astype(object)
    out[inside] = np.asarray(categories, dtype=object)[drawn[inside]]
    return out.astype(values.dtype) if values.dtype != object else out


def unbiased_counts(released_counts, P) -> np.ndarray:
    """T̂_ξ = (P⁻¹)ᵗ·T_X, the unbiased estimate of the original counts (digest §8, T2)."""
    return np.linalg.solve(np.asarray(P, dtype=float).T, np.asarray(released_counts, float))


def unbiased_variance(original_counts, P) -> np.ndarray:
    """Var(T̂_ξ) = (P⁻¹)ᵗ·V·P⁻¹, V = Σ_k T_ξ(k)·(diag(p_k·) − p_k·p_k·ᵗ) (digest §8)."""
    P = np.asarray(P, dtype=float)
    T = np.asarray(original_counts, dtype=float)
    V = sum(t * (np.diag(row) - np.outer(row, row)) for t, row in zip(T, P, strict=True))
    inv = np.linalg.inv(P)
    return inv.T @ V @ inv


def pram_risk(original_counts, P) -> np.ndarray:
    """R_PRAM(k) = P(ξ = k | X = k) = p_kk·T_ξ(k) / Σ_l p_lk·T_ξ(l) (de Wolf; digest §8, T2)."""
    P = np.asarray(P, dtype=float)
    T = np.asarray(original_counts, dtype=float)
    return np.diag(P) * T / (P.T @ T)
