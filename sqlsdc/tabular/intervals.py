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

    For every sensitive cell, with original ``o``, adjusted ``a``, ``d = |o − a|`` and
    ``b = 10^⌊log10 d⌋``, both bounds are multiples of ``b`` and the interval holds ``o`` and
    ``a``.

    ``cover_levels=False`` is the paper's construction (digest §4.1, the "implementable
    reading"): ``lo = ⌊min(o, a)/b⌋·b``, ``hi = ⌈max(o, a)/b⌉·b``, and with probability ½ the
    bound on the original's side moves out by one more ``b``. That bound lies within ``2b`` of
    the original, which it tells to within ``2b`` (often less than ``d``).

    ``cover_levels=True`` (default; what ``protect --method cta --intervals`` publishes) also
    holds ``[o − lpl, o + upl]``, and its bounds are a function of ``a`` and ``b`` alone:
    ``lo = ⌊(a − S)/b⌋·b`` and ``hi = ⌈(a + S)/b⌉·b`` with ``S = 20b`` (doubled until it
    reaches ``d + max(upl, lpl)``, which only happens when a level exceeds ``d``). A bound that
    followed the original or the levels would give the original away: an LP puts a sensitive
    cell at exactly ``a = o ± level``, so a bound ``⌊(o − level)/b⌋·b`` (this function before
    red team s33b) and ``a`` are two equations in ``o`` and the level, and their solution
    ``(a + lo)/2`` held the original to within ``b/2`` — on the demo's turnover table the true
    value of 95 of 97 sensitive cells, in intervals 9 % of the value wide, where the published
    ones were 170 % wide. Symmetric around ``a``, the interval does not say either in which
    direction the cell moved; what it tells is ``b``, the order of magnitude of the
    adjustment, as the paper's intervals do.

    Other cells get no interval (``lo = hi = adjusted``): an interval around an adjusted
    *non-sensitive* cell holds its original value too, and with the published cells of its
    equation it would bound a sensitive cell's original (a row total's interval [27, 30] with a
    published 25 beside the sensitive cell pins it to [2, 5]). Giessing & Dittrich's proposed
    last step — auditing the release with the intervals as constraints — still applies when
    intervals are published for more cells than these.

    Args:
        adjusted: :func:`cta`'s output (``value``, ``adjusted``, ``sensitive``, ``upl``, ``lpl``).
        seed: key of the coin flips of ``cover_levels=False`` (one per cell, in row order; keep
            it secret in production).
        cover_levels: intervals that cover the protection range and follow ``a`` and ``b``
            only (above); False: the paper's construction.
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
        [[2.0, 0.0, 22.0]]
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
    if cover_levels:
        upl = adjusted["upl"].to_numpy(np.float64)
        lpl = adjusted["lpl"].to_numpy(np.float64)
        need = np.where(sens, d + np.maximum(upl, lpl), 0.0)
        if not np.all(np.isfinite(need)):
            raise TabularError("a sensitive cell has no finite protection level")
        span = 20.0 * safe_b
        while np.any(span < need):
            span = np.where(span < need, 2.0 * span, span)
        lo = np.floor((a - span) / safe_b) * safe_b
        hi = np.ceil((a + span) / safe_b) * safe_b
    else:
        lo = np.floor(np.minimum(o, a) / safe_b) * safe_b
        hi = np.ceil(np.maximum(o, a) / safe_b) * safe_b
        widen = np.random.default_rng(seed).random(o.size) < 0.5
        below = o < a  # the original's side: the lower bound when the cell moved up
        lo = np.where(widen & below, lo - safe_b, lo)
        hi = np.where(widen & ~below, hi + safe_b, hi)
    if lower is not None:
        lo = np.maximum(lo, np.minimum(lower, o))
    if cover_levels:  # by construction; checked, as nothing uncovered may be published
        floor = o - lpl if lower is None else np.maximum(o - lpl, np.minimum(lower, o))
        low_ok = lo <= np.minimum(np.minimum(o, a), floor)
        if np.any(sens & ~(low_ok & (hi >= np.maximum(np.maximum(o, a), o + upl)))):
            raise TabularError("an interval does not cover its cell's protection range")
    out = adjusted.copy()
    out["lo"] = np.where(changed, lo, a)
    out["hi"] = np.where(changed, hi, a)
    out["unit"] = b
    return out
