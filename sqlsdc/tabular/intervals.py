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

    For every sensitive cell, with original ``o``, adjusted ``a`` and ``d = |o − a|``, the
    interval holds ``o`` and ``a``; in the paper's construction both bounds are multiples of
    ``b = 10^⌊log10 d⌋``.

    ``cover_levels=False`` is the paper's construction (digest §4.1, the "implementable
    reading"): ``lo = ⌊min(o, a)/b⌋·b``, ``hi = ⌈max(o, a)/b⌉·b``, and with probability ½ the
    bound on the original's side moves out by one more ``b``. That bound lies within ``2b`` of
    the original, which it tells to within ``2b`` (often less than ``d``).

    ``cover_levels=True`` (default; what ``protect --method cta --intervals`` publishes) also
    holds ``[o − lpl, o + upl]``, and its bounds are a function of ``a`` alone, given one
    number ``K`` for the whole table: ``lo = ⌊(a − K·|a|)/u⌋·u`` and ``hi = ⌈(a + K·|a|)/u⌉·u``,
    ``u`` the power of ten one below the span's, ``K`` the smallest power of two from 2 that
    reaches every sensitive cell's ``(d + max(upl, lpl)) / |a|`` (in ``attrs["span"]``). The
    direction of the adjustment (the cell's real protection: CTA publishes a value on one side
    of the original and the reader must not know which: Castro 2006, *EJOR* 171; Hundepool et
    al. 2012, *Statistical Disclosure Control*, ch. 4) is not a function of ``a``, so it does not
    tell it. Two earlier constructions did. Bounds that followed the original or the levels
    (this function before red team s33b): an LP puts a sensitive cell at exactly
    ``a = o ± level``, so ``⌊(o − level)/b⌋·b`` and ``a`` held the original to within ``b/2``,
    95 of 97 of the demo's turnover cells. Then ``a ± 20b`` with ``b`` the power of ten of
    the adjustment ``d`` (Giessing & Dittrich's unit): a level proportional to the original
    (the frequency rule's 30 %, enlarged by a factor in [1, 1.5)) puts ``d`` at 23-31 % of
    ``a`` upwards and 43-82 % downwards, and ``b``'s power of ten often fits one of them only
    (red team s43e: incomes by municipality x education and x occupation on the 20,000-person
    demo, ``freq:10``, 1,358 sensitive cells: the direction of 375 decided, 369 right; with it
    the original within the factor's ±6 %). Under the frequency and p% rules ``K`` is 2, the
    interval ``[0, 3a]`` of a non-negative table; a cell a dominance rule moved down by more
    than half its original makes every interval of the table wider (``K`` tells that such a
    cell exists, within a factor of 2, not which).

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
        cover_levels: intervals that cover the protection range and follow ``a`` and the
            table's ``K`` only (above); False: the paper's construction.
        lower: a-priori lower bound (0 for non-negative tables; ``None`` for none): widened
            bounds never go below it.

    Returns:
        A copy with ``lo``, ``hi`` (``lo = hi = adjusted`` for non-sensitive cells) and ``unit``
        (the bounds' unit: ``b``, or ``u`` with ``cover_levels``; 0 for non-sensitive cells).

    Example:
        >>> from sqlsdc.tabular.cta import cta
        >>> cells = pd.DataFrame({"r": ["a", "a", "b", "b"], "c": ["x", "y", "x", "y"],
        ...                       "value": [20.0, 30.0, 25.0, 5.0], "n": [9, 9, 9, 1]})
        >>> out = publish_intervals(cta(cells, dims=["r", "c"], rules=[],
        ...                             sensitive=lambda c: c["n"] == 1, protection=3.0))
        >>> out.loc[out["sensitive"], ["adjusted", "lo", "hi"]].values.tolist()
        [[2.0, 0.0, 10.0]]
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
        span, factor = _spans(np.abs(a), need, sens)
        b = np.where(changed, 10.0 ** (np.floor(np.log10(np.where(changed, span, 1.0))) - 1), 0.0)
        safe_b = np.where(changed, b, 1.0)
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
    if cover_levels:
        out.attrs["span"] = factor
    return out


SPAN = 2.0  # the smallest span, in multiples of the adjusted value


def _spans(scale: np.ndarray, need: np.ndarray, sensitive: np.ndarray) -> tuple[np.ndarray, float]:
    """Each sensitive cell's span ``K·|a|``, and ``K``: one power of two for the whole table,
    at least :data:`SPAN` and at least every cell's ``need / |a|``; a cell adjusted to 0 takes
    the power of ten at or above the largest need of such cells.

    Per cell a function of its adjusted value alone (given the table's ``K``): a span that
    followed the cell's own adjustment told its direction (red team s43e, see
    :func:`publish_intervals`). Under the frequency and p% rules ``K`` is 2 (a cell moved down
    by a level of ``0.3·1.5`` of its original needs ``1.64·|a|``); a cell moved down by more
    than half its original (a dominance rule's large level) doubles it for every cell."""
    zero = sensitive & (scale <= 1e-12 * np.maximum(1.0, need))
    rated = sensitive & ~zero
    k = SPAN
    if rated.any():
        ratio = float(np.max(need[rated] / scale[rated]))
        while k < ratio:
            k *= 2.0
    span = np.where(rated, k * scale, 0.0)
    if zero.any():
        span = np.where(zero, 10.0 ** np.ceil(np.log10(max(float(np.max(need[zero])), 1e-300))),
                        span)  # fmt: skip
    return span, k
