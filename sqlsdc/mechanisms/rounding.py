"""Per-cell rounding rules of Cox & Kim: pure math on values and uniforms.

Cox & Kim, "Effects of Rounding on the Quality and Confidentiality of Statistical Data", PSD
2006, LNCS 4302, pp. 48-56 (digest ``seed_2006_tabular.md`` §5.1, errata §12.5). Write
x = qB + r with 0 <= r < B; adjacent rounding gives R(x) = qB + R(r), R(r) ∈ {0, B}:

1. conventional (:func:`round_conventional`): up iff 2r >= B (halves up);
2. modified conventional (:func:`round_modified_conventional`): as 1, but r = B/2 (even B
   only) rounds up or down with probability 1/2 each;
3. zero-restricted 50/50 (:func:`round_zero_restricted`): r = 0 stays, any other r rounds up
   or down with probability 1/2 each;
4. unbiased (:func:`round_unbiased`): up with probability r/B, so E[R(x) | x] = x.

The random rules take their uniforms from the caller, e.g. from the keyed PRF through
:func:`prf_uniforms`, so that the same cell always rounds the same way (ARCHITECTURE.md §3). They
are the reference implementations of the SQL rewrite in :mod:`sqlsdc.rewrite.round`, which takes
the uniform of a cell from its cell key instead. Controlled rounding of whole tables (additive
margins) is :func:`sqlsdc.tabular.rounding.controlled_round`.
"""

from __future__ import annotations

import numbers

import numpy as np

from sqlsdc.errors import TabularError

__all__ = [
    "RULES",
    "check_base",
    "prf_uniforms",
    "round_conventional",
    "round_modified_conventional",
    "round_unbiased",
    "round_zero_restricted",
]

#: The rule names of the policy (``rounding:``), in Cox & Kim's order.
RULES = ("conventional", "modified_conventional", "zero_restricted", "unbiased")


def round_conventional(values, base: int) -> np.ndarray:
    """Conventional rounding (Cox & Kim rule 1): to the nearest multiple of ``base``, with the
    remainder r = B/2 of an even base rounded up (x = qB + r, up iff 2r >= B).

    Not unbiased: E[R(r) | r] != r; for even B not even sum-unbiased (bias 1/2 under uniform r,
    Cox & Kim Table 1).

    Example:
        >>> round_conventional([0, 4, 5, 6, 14, 15, -5], 10).tolist()
        [0, 0, 10, 10, 10, 20, 0]
    """
    x, base = _values_and_base(values, base)
    low, r = _split(x, base)
    return low + np.where(2 * r >= base, base, 0)


def round_modified_conventional(values, base: int, uniforms) -> np.ndarray:
    """Modified conventional rounding (Cox & Kim rule 2): as conventional, but r = B/2 (even B
    only) rounds up or down with probability 1/2 each: up iff ``uniform < 1/2``. For odd B it is
    conventional rounding. Sum-unbiased under uniform r (Cox & Kim Table 1).

    Example:
        >>> round_modified_conventional([5, 5, 4, 6], 10, [0.2, 0.7, 0.0, 0.9]).tolist()
        [10, 0, 0, 10]
    """
    x, base = _values_and_base(values, base)
    u = _uniforms(uniforms, x.shape)
    low, r = _split(x, base)
    up = (2 * r > base) | ((2 * r == base) & (u < 0.5))
    return low + np.where(up, base, 0)


def round_zero_restricted(values, base: int, uniforms) -> np.ndarray:
    """Zero-restricted 50/50 rounding (Cox & Kim rule 3): multiples stay; any other value
    rounds up iff ``uniform < 1/2``. Its posteriors P[x | R(x)] are uniform over the non-zero
    confidential values (Cox & Kim §5, digest T1): the rule preferred for confidentiality.

    Example:
        >>> round_zero_restricted([10, 11, 19, 3], 10, [0.1, 0.1, 0.6, 0.6]).tolist()
        [10, 20, 10, 0]
    """
    x, base = _values_and_base(values, base)
    u = _uniforms(uniforms, x.shape)
    low, r = _split(x, base)
    return low + np.where((r > 0) & (u < 0.5), base, 0)


def round_unbiased(values, base: int, uniforms) -> np.ndarray:
    """Unbiased random rounding (Cox & Kim rule 4; Fellegi's random rounding in Salazar §3):
    round up with probability r/B (iff ``uniform < r/B``), down otherwise, so
    E[R(x) | x] = x. Multiples stay.

    Example:
        >>> round_unbiased([13, 13, 17, 20], 10, [0.29, 0.31, 0.71, 0.0]).tolist()
        [20, 10, 10, 20]
    """
    x, base = _values_and_base(values, base)
    u = _uniforms(uniforms, x.shape)
    low, r = _split(x, base)
    return low + np.where(u * base < r, base, 0)


def prf_uniforms(secret: bytes, identities, *context: str | int | bytes) -> np.ndarray:
    """Uniforms in [0, 1) for cells, from the keyed PRF (:mod:`sqlsdc.mechanisms.prf`).

    The uniform of a cell is the first 53 bits of ``KeyedStream(secret, "rounding", *context,
    *identity)`` divided by 2^53, so the same cell under the same secret and context always
    rounds the same way (ARCHITECTURE.md §3) and nobody without the secret can predict it.

    Args:
        secret: the server-side key (bytes, at least 16).
        identities: one identity per cell: a tuple of str/int/bytes (e.g. its codes) or one
            such item.
        context: what the rounding is for, e.g. policy version and table name.

    Example:
        >>> u = prf_uniforms(b"a server secret of 16+ bytes", [("North", "f"), ("North", "m")],
        ...                  "policy-v1", "persons")
        >>> bool(((u >= 0) & (u < 1)).all()), bool(u[0] != u[1])
        (True, True)
    """
    from sqlsdc.mechanisms.prf import KeyedStream

    root = KeyedStream(secret, "rounding", *context)
    out = np.empty(len(identities), dtype=np.float64)
    for i, identity in enumerate(identities):
        items = identity if isinstance(identity, tuple) else (identity,)
        out[i] = root.derive(*items).bits(53) / 2.0**53
    return out


def _values_and_base(values, base) -> tuple[np.ndarray, int]:
    base = check_base(base)
    x = np.asarray(values)
    if x.dtype.kind not in "iuf" or not np.all(np.isfinite(x)):
        raise TabularError("values to round must be finite numbers")
    return x, base


def _split(x: np.ndarray, base: int) -> tuple[np.ndarray, np.ndarray]:
    """x = low + r with low = qB the multiple below and 0 <= r < B."""
    low = np.floor_divide(x, base) * base
    return low, x - low


def _uniforms(uniforms, shape) -> np.ndarray:
    u = np.asarray(uniforms, dtype=np.float64)
    if u.shape != shape or not np.all((u >= 0) & (u < 1)):
        raise TabularError(
            f"uniforms must be one value in [0, 1) per cell (shape {shape}); got shape {u.shape}"
        )
    return u


def check_base(base) -> int:
    """``base`` as an int, or TabularError when it is not an integer >= 2."""
    if isinstance(base, bool) or not isinstance(base, numbers.Integral) or base < 2:
        raise TabularError(
            f"base must be an integer >= 2 (e.g. 3, 5 or 10); got {base!r}. Base 1 leaves "
            "integer tables unchanged; for non-integer data round to integers first"
        )
    return int(base)
