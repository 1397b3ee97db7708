"""Exact samplers for the discrete Laplace and discrete Gaussian, and the facts a DP engine needs.

Sampling follows Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential Privacy",
NeurIPS 2020, arXiv:2004.00010 (CKS20), Algorithms 1-3, with integers only: every probability is
a ratio of Python integers and every coin is :meth:`KeyedStream.uniform_int`. No floating-point
number enters a sampler, so the output distribution is exactly the stated one (Mironov's 2012
attack on floating-point Laplace noise does not apply) and the same stream gives the same value
on every platform.

- ``bernoulli_exp(gamma, stream)``: Bernoulli(exp(-gamma)), CKS20 Algorithm 1.
- ``discrete_laplace(scale, stream)``: P(x) proportional to exp(-|x|/t), CKS20 Algorithm 2.
- ``discrete_gaussian(sigma2, stream)``: P(x) proportional to exp(-x^2/(2 sigma^2)), CKS20
  Algorithm 3.

Alongside are the accuracy facts used for reporting (pmf, variance, two-sided interval
half-width; floating point is fine there because nothing random depends on it) and the small
calibration and conversion helpers: ``t = Delta/epsilon`` for epsilon-DP, ``sigma^2 =
Delta^2/(2 rho)`` for rho-zCDP, and rho-zCDP to (epsilon, delta)-DP.

Scales are ``int`` or :class:`fractions.Fraction`; floats are refused, because ``0.1`` is not
one tenth and a budget of ``0.1`` silently spent as 0.1000000000000000055 is a real overspend.

Side channel: the number of loop iterations, hence the running time, depends on the value drawn.
sqlsdc draws noise for aggregated cells inside the server, many cells per query, so an analyst
cannot time a single draw; code that exposes one draw per request should not rely on that.

Example:
    >>> from sqlsdc.mechanisms.prf import KeyedStream
    >>> stream = KeyedStream(b"a server secret of 16+ bytes", "policy-v3", "dp_count", "North")
    >>> scale = discrete_laplace_scale(sensitivity=1, epsilon=Fraction(1, 2))
    >>> scale, discrete_laplace(scale, stream)
    (Fraction(2, 1), 2)
    >>> discrete_laplace_interval(scale, alpha=0.05)
    6
"""

from __future__ import annotations

import math
import numbers
from decimal import ROUND_CEILING, Decimal, localcontext
from fractions import Fraction
from functools import lru_cache
from typing import Protocol

__all__ = [
    "RandomSource",
    "bernoulli_exp",
    "discrete_gaussian",
    "discrete_gaussian_interval",
    "discrete_gaussian_pmf",
    "discrete_gaussian_sigma2",
    "discrete_gaussian_variance",
    "discrete_laplace",
    "discrete_laplace_interval",
    "discrete_laplace_pmf",
    "discrete_laplace_scale",
    "discrete_laplace_variance",
    "zcdp_delta",
    "zcdp_to_approx_dp",
]


class RandomSource(Protocol):
    """What the samplers need: exactly uniform integers (e.g. :class:`KeyedStream`)."""

    def uniform_int(self, n: int) -> int:
        """A uniform integer in ``[0, n)``."""


# --- argument checks -------------------------------------------------------------------------


def _rational(value: object, name: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, numbers.Rational):
        raise TypeError(
            f"{name} must be an int or fractions.Fraction so the arithmetic stays exact, got "
            f"{type(value).__name__} {value!r}; write Fraction('0.1') rather than 0.1"
        )
    return Fraction(value)


def _positive(value: object, name: str) -> Fraction:
    r = _rational(value, name)
    if r <= 0:
        raise ValueError(f"{name} must be positive, got {r}")
    return r


def _alpha(alpha: float | Fraction, smallest: float = 0.0) -> Fraction:
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"alpha must be a number in (0, 1), got {type(alpha).__name__}")
    a = Fraction(alpha)
    if not smallest <= a < 1 or a == 0:
        low = f"{smallest:g}" if smallest else "0"
        raise ValueError(f"alpha must be in ({low}, 1), got {float(a):g}")
    return a


# --- CKS20 Algorithms 1-3 --------------------------------------------------------------------


def _bernoulli_exp_unit(stream: RandomSource, n: int, d: int) -> bool:
    """Bernoulli(exp(-n/d)) for 0 <= n/d <= 1: CKS20 Algorithm 1, first branch.

    Draw A_k ~ Bernoulli(gamma/k) for k = 1, 2, ... until one is 0; return whether that k is
    odd. P(K > k) = gamma^k/k!, so P(K odd) = sum_k (-gamma)^k/k! = exp(-gamma).
    """
    k = 1
    while stream.uniform_int(d * k) < n:  # Bernoulli(n / (d k))
        k += 1
    return k % 2 == 1


def _bernoulli_exp(stream: RandomSource, n: int, d: int) -> bool:
    """Bernoulli(exp(-n/d)) for n >= 0, d >= 1: CKS20 Algorithm 1.

    For gamma > 1, exp(-gamma) = exp(-1)^floor(gamma) * exp(-(gamma - floor(gamma))): floor(gamma)
    coins Bernoulli(exp(-1)), stopping at the first 0, then one coin for the fractional part.
    """
    if n > d:
        whole, rest = divmod(n, d)
        for _ in range(whole):
            if not _bernoulli_exp_unit(stream, 1, 1):
                return False
        return _bernoulli_exp_unit(stream, rest, d)
    return _bernoulli_exp_unit(stream, n, d)


def bernoulli_exp(gamma: Fraction | int, stream: RandomSource) -> bool:
    """True with probability exactly exp(-gamma) (CKS20 Algorithm 1).

    Args:
        gamma: a non-negative rational.
        stream: the source of uniform integers.

    Example:
        >>> from sqlsdc.mechanisms.prf import KeyedStream
        >>> stream = KeyedStream(b"a server secret of 16+ bytes", "example")
        >>> [bernoulli_exp(Fraction(1, 2), stream) for _ in range(5)]
        [False, True, False, True, True]
    """
    g = _rational(gamma, "gamma")
    if g < 0:
        raise ValueError(f"gamma must be >= 0, got {g}")
    return _bernoulli_exp(stream, g.numerator, g.denominator)


def _discrete_laplace(stream: RandomSource, t: int, s: int) -> int:
    """Discrete Laplace with scale t/s: CKS20 Algorithm 2, line by line.

    X = U + t V with U uniform on {0..t-1} kept with probability exp(-U/t) and V geometric with
    P(V = v) = (1 - 1/e) e^-v, so P(X = x) is proportional to exp(-x/t); Y = floor(X/s) is then
    geometric with ratio exp(-s/t), and a fair sign with the (-0) case rejected makes P(Z = z)
    proportional to exp(-|z| s/t).
    """
    while True:
        u = stream.uniform_int(t)
        if not _bernoulli_exp_unit(stream, u, t):
            continue
        v = 0
        while _bernoulli_exp_unit(stream, 1, 1):
            v += 1
        y = (u + t * v) // s
        negative = stream.uniform_int(2) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def discrete_laplace(scale: Fraction | int, stream: RandomSource) -> int:
    """One draw of the discrete Laplace: P(x) = tanh(1/(2t)) exp(-|x|/t) on the integers.

    CKS20 Algorithm 2 with ``t/s = scale`` in lowest terms. Adding it to an integer query of L1
    sensitivity Delta gives (Delta/t)-DP (the geometric mechanism of Ghosh, Roughgarden and
    Sundararajan 2012); see :func:`discrete_laplace_scale`.

    Args:
        scale: t > 0, an int or Fraction.
        stream: the source of uniform integers.

    Example:
        >>> from sqlsdc.mechanisms.prf import KeyedStream
        >>> stream = KeyedStream(b"a server secret of 16+ bytes", "example")
        >>> [discrete_laplace(Fraction(10), stream) for _ in range(5)]
        [10, -5, -24, 22, -1]
    """
    t = _positive(scale, "scale")
    return _discrete_laplace(stream, t.numerator, t.denominator)


def discrete_gaussian(sigma2: Fraction | int, stream: RandomSource) -> int:
    """One draw of the discrete Gaussian N_Z(0, sigma^2): P(x) proportional to exp(-x^2/(2 s^2)).

    CKS20 Algorithm 3: with t = floor(sigma) + 1, draw Y from the discrete Laplace of scale t and
    keep it with probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)). With sigma^2 = p/q the
    exponent is the integer ratio (|Y| q t - p)^2 / (2 p q t^2), so no square root is taken
    (floor(sigma) = isqrt(floor(sigma^2))). Adding it to an integer query of sensitivity Delta
    gives (Delta^2/(2 sigma^2))-zCDP (CKS20); see :func:`discrete_gaussian_sigma2`.

    Args:
        sigma2: the parameter sigma^2 > 0, an int or Fraction. The variance is slightly below
            it (:func:`discrete_gaussian_variance`).
        stream: the source of uniform integers.

    Example:
        >>> from sqlsdc.mechanisms.prf import KeyedStream
        >>> stream = KeyedStream(b"a server secret of 16+ bytes", "example")
        >>> [discrete_gaussian(Fraction(100), stream) for _ in range(5)]
        [-10, 8, -3, 9, 22]
    """
    s2 = _positive(sigma2, "sigma2")
    p, q = s2.numerator, s2.denominator
    t = math.isqrt(p // q) + 1
    d = 2 * p * q * t * t
    while True:
        y = _discrete_laplace(stream, t, 1)
        if _bernoulli_exp(stream, (abs(y) * q * t - p) ** 2, d):
            return y


# --- accuracy facts (floating point: reporting only) ----------------------------------------


def discrete_laplace_pmf(x: int, scale: Fraction | int) -> float:
    """P(X = x) = (1 - q)/(1 + q) q^|x| with q = exp(-1/t); (1 - q)/(1 + q) = tanh(1/(2t))."""
    t = float(_positive(scale, "scale"))
    return math.tanh(0.5 / t) * math.exp(-abs(x) / t)


def discrete_laplace_variance(scale: Fraction | int) -> float:
    """Var X = 2q/(1 - q)^2 with q = exp(-1/t) (about 2 t^2 for large t, like the Laplace).

    Example:
        >>> round(discrete_laplace_variance(10), 3)
        199.833
    """
    t = float(_positive(scale, "scale"))
    qm1 = math.expm1(-1.0 / t)  # q - 1, accurate for large t
    return 2.0 * (1.0 + qm1) / (qm1 * qm1)


def discrete_laplace_interval(scale: Fraction | int, alpha: float | Fraction) -> int:
    """The smallest integer a >= 0 with P(|X| <= a) >= 1 - alpha.

    P(|X| > a) = 2 q^(a+1)/(1 + q), so a = ceil(t ln(2/(alpha (1 + q)))) - 1 (at least 0). The
    logarithm is taken in 60-digit decimal arithmetic; since q^(a+1) is transcendental for
    rational t, no rational alpha sits exactly on a boundary and the answer is exact.

    Example:
        >>> discrete_laplace_interval(10, alpha=Fraction(1, 20))
        30
    """
    t = _positive(scale, "scale")
    a = _alpha(alpha)
    with localcontext() as ctx:
        ctx.prec = 60
        td = Decimal(t.numerator) / Decimal(t.denominator)
        q = (-1 / td).exp()
        need = td * (2 / (Decimal(a.numerator) / Decimal(a.denominator) * (1 + q))).ln()
        half_width = int(need.to_integral_value(rounding=ROUND_CEILING)) - 1
    return max(half_width, 0)


# Up to this sigma^2 the discrete Gaussian's sums are taken term by term over |y| <= 24 sigma
# (what is left out is below exp(-288) of the total); above it, closed forms whose neglected
# terms are below double precision are used instead (see _gauss_tail_em).
_DIRECT_SIGMA2 = 10_000
_SMALLEST_GAUSS_ALPHA = 1e-100


@lru_cache(maxsize=32)
def _gauss_table(s2: Fraction) -> tuple[float, list[float], float]:
    """(Z, tails, M2) by direct summation: Z = sum_y f(y), tails[a] = sum_{y > a} f(y),
    M2 = sum_y y^2 f(y), with f(y) = exp(-y^2/(2 sigma^2)) and |y| <= 24 sigma + 2."""
    s2f = float(s2)
    top = math.isqrt(576 * s2.numerator // s2.denominator) + 2
    f = [math.exp(-y * y / (2.0 * s2f)) for y in range(top + 1)]
    tails = [0.0] * (top + 1)
    acc = 0.0
    for y in range(top, 0, -1):  # smallest terms first, so the partial sums stay accurate
        acc += f[y]
        tails[y - 1] = acc
    z = f[0] + 2.0 * tails[0]
    m2 = 2.0 * math.fsum(y * y * f[y] for y in range(1, top + 1))
    return z, tails, m2


def _gauss_tail_em(s2f: float, a: int) -> float:
    """sum_{y > a} exp(-y^2/(2 sigma^2)) by Euler-Maclaurin, for sigma > 100.

    With m = a + 1, u = m/sigma and f^(n)(m) = (-1/sigma)^n He_n(u) f(m):
    sum = integral_m^inf f + f(m)/2 - f'(m)/12 + f'''(m)/720 - f^(5)(m)/30240 + R, where
    |R| is of order f(m) sigma^-7: far below double precision for sigma > 100.
    """
    s = math.sqrt(s2f)
    u = (a + 1) / s
    fm = math.exp(-0.5 * u * u)
    integral = s * math.sqrt(math.pi / 2) * math.erfc(u / math.sqrt(2))
    d1 = -u / s * fm
    d3 = -(u**3 - 3 * u) / s**3 * fm
    d5 = -(u**5 - 10 * u**3 + 15 * u) / s**5 * fm
    return integral + fm / 2 - d1 / 12 + d3 / 720 - d5 / 30240


def _gauss_two_sided_tail(s2: Fraction, a: int) -> float:
    """P(|X| > a) for X ~ N_Z(0, sigma^2)."""
    if s2 <= _DIRECT_SIGMA2:
        z, tails, _ = _gauss_table(s2)
        return 2.0 * tails[min(a, len(tails) - 1)] / z
    s2f = float(s2)
    # Z = sigma sqrt(2 pi) (1 + 2 sum_k exp(-2 pi^2 sigma^2 k^2)) by Poisson summation; the
    # correction is below exp(-2e5) here.
    return 2.0 * _gauss_tail_em(s2f, a) / math.sqrt(2 * math.pi * s2f)


def discrete_gaussian_pmf(x: int, sigma2: Fraction | int) -> float:
    """P(X = x) = exp(-x^2/(2 sigma^2)) / Z, Z = sum over all integers y of exp(-y^2/(2 sigma^2)).

    Z is summed term by term up to sigma^2 = 10^4 and is sigma sqrt(2 pi) above (Poisson
    summation: the relative difference is 2 exp(-2 pi^2 sigma^2), below 1e-80000).
    """
    s2 = _positive(sigma2, "sigma2")
    s2f = float(s2)
    z = _gauss_table(s2)[0] if s2 <= _DIRECT_SIGMA2 else math.sqrt(2 * math.pi * s2f)
    return math.exp(-x * x / (2.0 * s2f)) / z


def discrete_gaussian_variance(sigma2: Fraction | int) -> float:
    """Var X for X ~ N_Z(0, sigma^2); always strictly less than sigma^2 (CKS20).

    Summed term by term over |y| <= 24 sigma + 2 for sigma^2 <= 10^4 (truncation below
    exp(-288) relative; rounding about 1e-15 relative), and capped at sigma^2. By Poisson
    summation Var = sigma^2 (1 - 8 pi^2 sigma^2 exp(-2 pi^2 sigma^2) + ...): the deficit is
    2e-7 relative at sigma^2 = 1 and below double precision from sigma^2 = 2 on, so above
    10^4 sigma^2 itself is returned.

    Example:
        >>> round(discrete_gaussian_variance(Fraction(1, 4)), 4)  # well below 1/4
        0.215
    """
    s2 = _positive(sigma2, "sigma2")
    if s2 <= _DIRECT_SIGMA2:
        z, _, m2 = _gauss_table(s2)
        return min(m2 / z, float(s2))
    return float(s2)


def discrete_gaussian_interval(sigma2: Fraction | int, alpha: float | Fraction) -> int:
    """The smallest integer a >= 0 with P(|X| <= a) >= 1 - alpha, for X ~ N_Z(0, sigma^2).

    The tail P(|X| > a) is summed term by term (sigma^2 <= 10^4) or by Euler-Maclaurin with
    erfc (above), both to about 1e-13 relative; a is then found by bisection. The answer is
    exact unless 1 - alpha lies within that relative distance of P(|X| <= a) for some a.
    alpha must be at least 1e-100.

    Example:
        >>> discrete_gaussian_interval(100, alpha=0.05)  # P(|X| <= a) is about P(|N| <= a + 1/2)
        20
    """
    s2 = _positive(sigma2, "sigma2")
    a = float(_alpha(alpha, _SMALLEST_GAUSS_ALPHA))
    if _gauss_two_sided_tail(s2, 0) <= a:
        return 0
    lo, hi = 0, 1  # invariant: tail(lo) > alpha >= tail(hi)
    while _gauss_two_sided_tail(s2, hi) > a:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _gauss_two_sided_tail(s2, mid) > a:
            lo = mid
        else:
            hi = mid
    return hi


# --- calibration and accounting --------------------------------------------------------------


def discrete_laplace_scale(sensitivity: Fraction | int, epsilon: Fraction | int) -> Fraction:
    """t = Delta/epsilon: discrete Laplace noise of scale t on a query of L1 sensitivity Delta is
    epsilon-DP (P(x)/P(x + Delta) <= exp(Delta/t)).

    Example:
        >>> discrete_laplace_scale(sensitivity=2, epsilon=Fraction("0.1"))
        Fraction(20, 1)
    """
    return _positive(sensitivity, "sensitivity") / _positive(epsilon, "epsilon")


def discrete_gaussian_sigma2(sensitivity: Fraction | int, rho: Fraction | int) -> Fraction:
    """sigma^2 = Delta^2/(2 rho): discrete Gaussian noise N_Z(0, sigma^2) on a query of L2
    sensitivity Delta is rho-zCDP (CKS20; the same guarantee as the continuous Gaussian).

    Example:
        >>> discrete_gaussian_sigma2(sensitivity=1, rho=Fraction(1, 8))
        Fraction(4, 1)
    """
    return _positive(sensitivity, "sensitivity") ** 2 / (2 * _positive(rho, "rho"))


def _nonneg_real(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    return float(value)


def zcdp_delta(rho: Fraction | float, epsilon: Fraction | float) -> float:
    """The smallest delta CKS20 proves for rho-zCDP => (epsilon, delta)-DP.

    delta = inf over alpha > 1 of exp((alpha - 1)(alpha rho - epsilon)) / (alpha - 1) *
    (1 - 1/alpha)^alpha (CKS20 §2.3, Corollary 13). The logarithm of the bracket is convex in
    alpha with derivative (2 alpha - 1) rho - epsilon + ln(1 - 1/alpha), found by bisection; any
    alpha gives a valid bound, so an inexact root only makes delta larger.

    Example:
        >>> f"{zcdp_delta(Fraction(1, 2), 3):.3g}"
        '0.00514'
    """
    r, e = _nonneg_real(rho, "rho"), _nonneg_real(epsilon, "epsilon")
    if r == 0:
        return 0.0
    lo, hi = 1.0, (e + 1) / (2 * r) + 2  # the derivative is < 0 near 1 and > 0 at hi
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid == lo or mid == hi:
            break
        if (2 * mid - 1) * r - e + math.log1p(-1 / mid) < 0:
            lo = mid
        else:
            hi = mid
    alpha = hi
    log_delta = (alpha - 1) * (alpha * r - e) + alpha * math.log1p(-1 / alpha)
    return min(1.0, math.exp(log_delta) / (alpha - 1))


def zcdp_to_approx_dp(
    rho: Fraction | float, delta: Fraction | float, *, tight: bool = True
) -> float:
    """The epsilon with rho-zCDP => (epsilon, delta)-DP.

    ``tight=False``: epsilon = rho + 2 sqrt(rho ln(1/delta)) (Bun and Steinke 2016, Prop. 1.3).
    ``tight=True`` (default): the smallest epsilon with :func:`zcdp_delta` <= delta (CKS20 §2.3,
    Corollary 13), found by bisection from above and never larger than the first.

    Example:
        >>> rho, delta = Fraction(1, 2), Fraction(1, 10**6)
        >>> round(zcdp_to_approx_dp(rho, delta, tight=False), 3)
        5.757
        >>> round(zcdp_to_approx_dp(rho, delta), 3)
        5.222
    """
    r = _nonneg_real(rho, "rho")
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    d = float(delta)
    standard = r + 2 * math.sqrt(r * math.log(1 / d))
    if not tight or r == 0:
        return standard
    if zcdp_delta(r, standard) > d:  # not expected (CKS20 improves on BS16); stay valid
        return standard
    lo, hi = 0.0, standard  # invariant: zcdp_delta(r, hi) <= d
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid == lo or mid == hi:
            break
        if zcdp_delta(r, mid) <= d:
            hi = mid
        else:
            lo = mid
    return hi
