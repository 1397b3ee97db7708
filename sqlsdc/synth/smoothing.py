"""synthpop's kernel smoothing of synthesised numeric values (``smoothing = "density"``).

synthpop 1.9-3 ``syn.cart`` draws every synthetic record's value from the donors of its leaf,
then smooths the whole synthetic vector at once (``syn.smooth(new, y, smoothing =
"density")``, R/functions.syn.r):

1. a value held by more than 70 % of the synthetic records is left as it is;
2. when the data look top-coded (the largest value more than ten times as frequent as the
   next one, ``10 * t[k-1] < t[k] - t[k-1]`` on the table of values), the records at the
   observed maximum are left as they are and the upper clip is the observed maximum;
3. the others move to N(value, h²), h = ``density(ysyn[ys], width = "SJ")$bw``: the
   Sheather-Jones "solve-the-equation" bandwidth of the values being smoothed, R's ``bw.SJ``
   (Sheather & Jones 1991, JRSS B 53, 683-690; Venables & Ripley, *Modern Applied
   Statistics with S*, §5.6), computed on R's 1000 bins as :func:`bw_sj` does;
4. results are clipped to [min(y), max(y) + h] (max(y) when top-coded) and rounded to the
   observed number of decimals.

Differs on purpose from R in two corner cases where R errs: R drops the records at the observed
maximum by *position* in the already reduced index (``ys[-which(ysyn == max(yobs))]``),
which drops other records when step 1 removed some, and drops every record when none is at the
maximum (``x[-integer(0)]`` is empty); here exactly the records at the maximum are left alone.
A sample whose bandwidth R cannot find ("sample is too sparse") is refused, as R refuses it.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import brentq

from sqlsdc.errors import SynthesisError

__all__ = ["SmoothingError", "bw_sj", "smooth_density"]


class SmoothingError(SynthesisError):
    """No bandwidth for the values to smooth (R's ``bw.SJ`` errors); the synthesis job refuses
    rather than store the original values (:mod:`sqlsdc.synth.measures`). ``column`` is set by
    the caller that knows it."""

    column: str | None = None


_DELMAX = 1000.0  # R's bandwidth.c: kernel terms past sqrt(DELMAX) sd are cut off
_SQRT_2PI = np.sqrt(2.0 * np.pi)


def _pair_counts(x: np.ndarray, nb: int) -> tuple[float, np.ndarray]:
    """R's ``bw_pair_cnts(x, nb, binned = n > nb/2)``: bin width d and, per bin distance k,
    the number of pairs of points k bins apart (R's ``bw_den`` / ``bw_den_binned``)."""
    n = len(x)
    d = (x.max() - x.min()) * 1.01 / nb
    if n > nb / 2:  # bin first: trunc(|x|/d)·sign(x), shifted to start at bin 1
        xx = np.trunc(np.abs(x) / d) * np.sign(x)
        xx = (xx - xx.min()).astype(np.int64)
        w = np.bincount(xx[xx < nb], minlength=nb).astype(np.float64)[:nb]
        cnt = np.correlate(w, w, mode="full")[nb - 1 :].copy()  # Σ_i w_i w_(i+k)
        cnt[0] = (w * (w - 1.0)).sum() / 2.0  # pairs inside a bin, none with itself
        return d, cnt
    bins = (x / d).astype(np.int64)  # C's (int) cast truncates towards zero
    diff = np.abs(bins[:, None] - bins[None, :])[np.triu_indices(n, 1)]
    return d, np.bincount(diff, minlength=nb).astype(np.float64)[:nb]


def _phi(n: int, d: float, cnt: np.ndarray, h: float, order: int) -> float:
    """R's ``bw_phi4`` (order 4) and ``bw_phi6`` (order 6): binned estimates of the density
    functionals ψ4 and ψ6 with a Gaussian kernel of bandwidth h."""
    delta = (np.arange(len(cnt)) * d / h) ** 2
    keep = delta < _DELMAX
    if not keep.all():  # R stops at the first bin past the cut-off
        keep[int(np.argmin(keep)) :] = False
    delta, c = delta[keep], cnt[keep]
    if order == 4:
        total = 2.0 * (np.exp(-delta / 2) * ((delta - 6) * delta + 3) * c).sum() + 3.0 * n
        return total / (n * (n - 1.0) * h**5) / _SQRT_2PI
    poly = ((delta - 15) * delta + 45) * delta - 15
    total = 2.0 * (np.exp(-delta / 2) * poly * c).sum() - 15.0 * n
    return total / (n * (n - 1.0) * h**7) / _SQRT_2PI


def bw_sj(x, nb: int = 1000) -> float:
    """R's ``bw.SJ(x)`` (method "ste"): the root h of (c1 / ψ4(α2 h^(5/7)))^(1/5) = h.

    With scale = min(sd, IQR/1.349), a = 1.24·scale·n^(-1/7), b = 1.23·scale·n^(-1/9),
    c1 = 1/(2√π n), TD = -ψ6(b), α2 = 1.357 (ψ4(a)/TD)^(1/7); the root is searched in
    [0.1 hmax, hmax], hmax = 1.144·scale·n^(-1/5), widened by 1.2 as R does, to R's tolerance
    0.1·lower (Brent's method, as R's ``uniroot``).

    Raises:
        SynthesisError: fewer than 2 values, or R's "sample is too sparse" cases.

    Example:
        >>> round(bw_sj(np.arange(1.0, 21.0)), 4)
        3.8749
    """
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    if n < 2 or not np.isfinite(x).all():
        raise SmoothingError("smoothing needs at least 2 finite values to find a bandwidth")
    q75, q25 = np.percentile(x, [75, 25])
    scale = min(float(np.std(x, ddof=1)), float(q75 - q25) / 1.349)
    if not scale > 0:  # checked before binning: a zero range made bins of width 0
        raise SmoothingError(
            "smoothing cannot find a bandwidth: the values are too concentrated (R's bw.SJ: "
            "sample is too sparse)"
        )
    d, cnt = _pair_counts(x, nb)
    a = 1.24 * scale * n ** (-1 / 7)
    b = 1.23 * scale * n ** (-1 / 9)
    c1 = 1.0 / (2.0 * np.sqrt(np.pi) * n)
    td = -_phi(n, d, cnt, b, 6)
    alph2 = 1.357 * (_phi(n, d, cnt, a, 4) / td) ** (1 / 7) if td > 0 else np.nan
    if not (np.isfinite(td) and td > 0 and np.isfinite(alph2)):
        raise SmoothingError("smoothing cannot find a bandwidth (R's bw.SJ: sample is too sparse)")

    def f(h):
        return (c1 / _phi(n, d, cnt, alph2 * h ** (5 / 7), 4)) ** 0.2 - h

    hmax = 1.144 * scale * n ** (-1 / 5)
    lower, upper = 0.1 * hmax, hmax
    tol = 0.1 * lower
    for tries in range(1, 100):
        if f(lower) * f(upper) <= 0:
            return float(brentq(f, lower, upper, xtol=tol))
        if tries % 2:
            upper *= 1.2
        else:
            lower /= 1.2
    raise SmoothingError("smoothing found no bandwidth (R's bw.SJ: no solution in range)")


def smooth_density(ysyn: np.ndarray, yobs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """synthpop's ``syn.smooth(ysyn, yobs, smoothing = "density")`` (see the module docstring).

    Args:
        ysyn: the synthetic values of one variable (no NaN). yobs: the observed values.
        rng: the random generator of the synthesis.
    """
    ysyn = np.asarray(ysyn, dtype=np.float64)
    yobs = np.asarray(yobs, dtype=np.float64)
    out = ysyn.copy()
    values, counts = np.unique(ysyn, return_counts=True)
    move = np.ones(len(ysyn), dtype=bool)
    top = counts.argmax()
    if counts[top] / len(ysyn) > 0.7:
        move &= ysyn != values[top]
    maxy = None
    if len(counts) >= 2 and 10 * counts[-2] < counts[-1] - counts[-2]:
        move &= ysyn != yobs.max()
        maxy = float(yobs.max())
    if not move.any():  # one value to move is R's "need at least 2 data points": refused
        return out
    h = bw_sj(ysyn[move])
    moved = rng.normal(ysyn[move], h)
    upper = float(yobs.max()) + h if maxy is None else maxy
    out[move] = np.clip(moved, yobs.min(), upper)
    return np.round(out, _decimals(yobs))


def _decimals(x: np.ndarray) -> int:
    """synthpop's ``max(sapply(yobs, decimalplaces))``, to 9 places."""
    for d in range(0, 9):
        if np.allclose(x, np.round(x, d), rtol=0, atol=1e-9):
            return d
    return 9
