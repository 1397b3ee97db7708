"""Intervals published with a CTA-adjusted table (Giessing & Dittrich, PSD 2006, §4.1).

Digest ``shared/reference/seed_2006_tabular.md`` §4.1. Split from :mod:`sqlsdc.tabular.cta`,
which re-exports :func:`publish_intervals`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sqlsdc.errors import TabularError


def publish_intervals(
    adjusted: pd.DataFrame, *, seed: int = 0, cover_levels: bool = True, lower: float | None = 0.0
) -> pd.DataFrame:
    """Intervals to publish with the adjusted cells (Giessing & Dittrich, PSD 2006, §4.1).

    For every sensitive cell, with original ``o``, adjusted ``a``, ``d = |o − a|``,
    ``b = 10^⌊log10 d⌋``: ``lo = ⌊min(o, a)/b⌋·b`` and ``hi = ⌈max(o, a)/b⌉·b`` (both bounds
    multiples of the same power of ten, the interval holds ``o`` and ``a``); with probability ½
    the bound on the original's side moves out by one more ``b``, so that an intruder cannot
    tell whether that bound is the multiple next to the original (digest §4.1, the "implementable
    reading"). With ``cover_levels`` (default) a sensitive cell's interval is further widened,
    in steps of ``b``, until it holds ``[o − lpl, o + upl]``: the interval then reveals no more
    than the protection levels allow, on either side. Because ``a`` lies at least a protection
    level from ``o``, every sensitive interval is at least as wide as the requirement.

    Other cells get no interval (``lo = hi = adjusted``): an interval around an adjusted
    *non-sensitive* cell holds its original value too, and with the published cells of its
    equation it would bound a sensitive cell's original (a row total's interval [27, 30] with a
    published 25 beside the sensitive cell pins it to [2, 5]). Giessing & Dittrich's proposed
    last step — auditing the release with the intervals as constraints — still applies when
    intervals are published for more cells than these.

    Args:
        adjusted: :func:`cta`'s output (``value``, ``adjusted``, ``sensitive``, ``upl``, ``lpl``).
        seed: key of the coin flips (one per cell, in row order; keep it secret in production).
        cover_levels: widen sensitive intervals to the protection range.
        lower: a-priori lower bound (0 for non-negative tables; ``None`` for none): widened
            bounds never go below it.

    Returns:
        A copy with ``lo``, ``hi`` (``lo = hi = adjusted`` for non-sensitive cells) and ``unit``
        (``b``, 0 for non-sensitive cells).

    Example:
        >>> from sqlsdc.tabular.cta import cta
        >>> cells = pd.DataFrame({"r": ["a", "a", "b", "b"], "c": ["x", "y", "x", "y"],
        ...                       "value": [20.0, 30.0, 25.0, 5.0], "n": [9, 9, 9, 1]})
        >>> out = publish_intervals(cta(cells, dims=["r", "c"], rules=[],
        ...                             sensitive=lambda c: c["n"] == 1, protection=3.0))
        >>> out.loc[out["sensitive"], ["adjusted", "lo", "hi"]].values.tolist()
        [[2.0, 2.0, 8.0]]
    """
    for col in ("value", "adjusted", "sensitive", "upl", "lpl"):
        if col not in adjusted.columns:
            raise TabularError(f"publish_intervals() needs a {col!r} column; give cta()'s output")
    o = adjusted["value"].to_numpy(np.float64)
    a = adjusted["adjusted"].to_numpy(np.float64)
    sens = adjusted["sensitive"].to_numpy(bool)
    d = np.abs(a - o)
    moved = d > 1e-9 * np.maximum(1.0, np.abs(o))
    if np.any(sens & ~moved):
        raise TabularError("a sensitive cell was not adjusted; its interval would reveal it")
    changed = sens
    with np.errstate(divide="ignore"):
        b = np.where(changed, 10.0 ** np.floor(np.log10(np.where(changed, d, 1.0))), 0.0)
    safe_b = np.where(changed, b, 1.0)
    lo = np.floor(np.minimum(o, a) / safe_b) * safe_b
    hi = np.ceil(np.maximum(o, a) / safe_b) * safe_b
    widen = np.random.default_rng(seed).random(o.size) < 0.5
    below = o < a  # the original's side: the lower bound when the cell moved up
    lo = np.where(widen & below, lo - safe_b, lo)
    hi = np.where(widen & ~below, hi + safe_b, hi)
    if cover_levels:
        need_lo = o - adjusted["lpl"].to_numpy(np.float64)
        need_hi = o + adjusted["upl"].to_numpy(np.float64)
        lo = np.where(sens, np.minimum(lo, np.floor(need_lo / safe_b) * safe_b), lo)
        hi = np.where(sens, np.maximum(hi, np.ceil(need_hi / safe_b) * safe_b), hi)
    if lower is not None:
        lo = np.maximum(lo, np.minimum(lower, o))
    out = adjusted.copy()
    out["lo"] = np.where(changed, lo, a)
    out["hi"] = np.where(changed, hi, a)
    out["unit"] = b
    return out
