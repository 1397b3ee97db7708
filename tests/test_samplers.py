"""The keyed PRF and the exact discrete samplers (CKS20 Algorithms 1-3).

Distribution tests can fail both ways (STYLE §12): each sampler passes a chi-square test against
its exact pmf at the claimed scale and is rejected at scale x 1.3 and / 1.3, and the chi-square
helper itself is checked on draws from the exact pmf. All randomness comes from fixed secrets and
contexts, so every test here gives the same answer on every run; the only exception is OpenDP's
sampler (OS entropy), compared at a stricter level.
"""

from __future__ import annotations

import copy
import hmac
import math
import pickle
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from sqlsdc.mechanisms.prf import LABEL, KeyedStream
from sqlsdc.mechanisms.samplers import (
    bernoulli_exp,
    discrete_gaussian,
    discrete_gaussian_interval,
    discrete_gaussian_pmf,
    discrete_gaussian_sigma2,
    discrete_gaussian_variance,
    discrete_laplace,
    discrete_laplace_interval,
    discrete_laplace_pmf,
    discrete_laplace_scale,
    discrete_laplace_variance,
    zcdp_delta,
    zcdp_to_approx_dp,
)

SECRET = b"sqlsdc test secret - not for production"
LEVEL = 1e-4  # significance of every seeded test; the seeded draws make them deterministic
N = 20_000
N_SMALL = 10_000  # where the effect is large (wrong scales: p-values below 1e-80)
OFF = Fraction(13, 10)  # the wrong scale the tests must detect


# --- chi-square helpers ----------------------------------------------------------------------


def _positive_groups(pmf: Callable[[int], float], n: int, min_expected: float) -> list[int]:
    """Start points of bins [s_i, s_{i+1} - 1] on x >= 1, the last one open, each expecting at
    least ``min_expected`` of ``n`` draws from the symmetric ``pmf``."""
    tail = (1.0 - pmf(0)) / 2  # P(X >= current start)
    starts, acc, x = [1], 0.0, 1
    if n * tail < 2 * min_expected:
        return starts
    while True:
        acc += pmf(x)
        x += 1
        if n * acc >= min_expected:
            if n * (tail - acc) < min_expected:
                return starts
            starts.append(x)
            tail -= acc
            acc = 0.0


def chi2_pvalue(
    samples: Sequence[int], pmf: Callable[[int], float], min_expected: float = 5.0
) -> float:
    """Chi-square goodness of fit of integer samples to a pmf symmetric about 0.

    Bins: {0}, then consecutive groups of positive values each expecting >= min_expected draws
    with an open last group, mirrored for the negative values.
    """
    n = len(samples)
    starts = _positive_groups(pmf, n, min_expected)
    expected = [pmf(0)]
    tail = (1.0 - pmf(0)) / 2
    for lo, hi in zip(starts, starts[1:], strict=False):
        mass = math.fsum(pmf(x) for x in range(lo, hi))
        expected.append(mass)
        tail -= mass
    expected.append(tail)
    k = len(starts)
    observed = [0] * (2 * k + 1)
    for value, count in Counter(samples).items():
        if value == 0:
            observed[0] += count
        else:
            group = bisect_right(starts, abs(value)) - 1
            observed[1 + group + (k if value < 0 else 0)] += count
    exp = np.array(expected + expected[1:]) * n
    obs = np.array(observed)
    statistic = float(((obs - exp) ** 2 / exp).sum())
    return float(stats.chi2.sf(statistic, len(obs) - 1))


def chi2_two_sample_pvalue(a: Sequence[int], b: Sequence[int], min_count: int = 20) -> float:
    """Chi-square test that two integer samples come from one distribution.

    Bins are runs of consecutive values holding at least ``min_count`` pooled draws; they depend
    only on the pooled sample, which under the null hypothesis does not know the labels.
    """
    ca, cb = Counter(a), Counter(b)
    values = sorted(set(ca) | set(cb))
    rows: list[list[int]] = []
    current = [0, 0]
    for v in values:
        current[0] += ca[v]
        current[1] += cb[v]
        if sum(current) >= min_count:
            rows.append(current)
            current = [0, 0]
    if rows:
        rows[-1] = [rows[-1][0] + current[0], rows[-1][1] + current[1]]
    return float(stats.chi2_contingency(np.array(rows).T, correction=False).pvalue)


def _draws(sampler, param, n: int, *context) -> list[int]:
    stream = KeyedStream(SECRET, "test_samplers", *context)
    return [sampler(param, stream) for _ in range(n)]


def _lap(t):
    return lambda x: discrete_laplace_pmf(x, t)


def _gauss(s2):
    return lambda x: discrete_gaussian_pmf(x, s2)


def _exact_draws(pmf, n: int, seed: int, support: int) -> list[int]:
    """n draws from pmf on [-support, support] with numpy (a test of the test helper)."""
    xs = np.arange(-support, support + 1)
    p = np.array([pmf(int(x)) for x in xs])
    return np.random.default_rng(seed).choice(xs, size=n, p=p / p.sum()).tolist()


# --- the helper can fail both ways -----------------------------------------------------------


@pytest.mark.parametrize("pmf", [_lap(Fraction(3)), _gauss(Fraction(9))], ids=["lap", "gauss"])
def test_chi2_helper_accepts_exact_draws_and_rejects_wrong_scale(pmf):
    draws = _exact_draws(pmf, N, seed=7, support=200)
    assert chi2_pvalue(draws, pmf) > LEVEL
    assert chi2_pvalue(_exact_draws(_lap(3 * OFF), N, seed=7, support=200), pmf) < LEVEL


def test_chi2_helper_pvalues_are_uniform_under_the_null():
    pmf = _lap(Fraction(2))
    pvalues = [chi2_pvalue(_exact_draws(pmf, 2_000, seed=s, support=80), pmf) for s in range(200)]
    assert 0.02 <= np.mean(np.array(pvalues) < 0.1) <= 0.2
    assert stats.kstest(pvalues, "uniform").pvalue > LEVEL


def test_two_sample_helper_both_ways():
    pmf = _gauss(Fraction(9))
    a = _exact_draws(pmf, N, seed=1, support=100)
    assert chi2_two_sample_pvalue(a, _exact_draws(pmf, N, seed=2, support=100)) > LEVEL
    other = _exact_draws(_gauss(9 * OFF**2), N, seed=2, support=100)
    assert chi2_two_sample_pvalue(a, other) < LEVEL


# --- KeyedStream -----------------------------------------------------------------------------


def test_same_secret_and_context_give_the_same_bits():
    a = KeyedStream(SECRET, "v1", "dp_count", "region=North", 7)
    b = KeyedStream(SECRET, "v1", "dp_count", "region=North", 7)
    assert [a.bits(64) for _ in range(20)] == [b.bits(64) for _ in range(20)]


def test_known_answer_pins_the_construction():
    # Recomputed from the documented construction; a change here changes every released value.
    context_encoding = b"\x02" + (2).to_bytes(8, "big") + b"v1" + b"\x03" + (1).to_bytes(8, "big")
    context_encoding += b"\x2a"
    block0 = hmac.new(SECRET, LABEL + context_encoding + b"\x00" + bytes(8), "sha256").digest()
    stream = KeyedStream(SECRET, "v1", 42)
    assert stream.bits(256) == int.from_bytes(block0, "big")
    assert KeyedStream(SECRET, "v1", 42).bits(64) == 0xB2619B33D98445F2


@pytest.mark.parametrize(
    ("left", "right"),
    [
        (("ab", "c"), ("a", "bc")),
        (("1",), (1,)),
        ((1,), (b"1",)),
        (("ab",), (b"ab",)),
        ((-1,), (255,)),
        ((0,), ()),
        (("",), ()),
        (("a", ""), ("a",)),
        (("a",), ("a", "")),
        ((2**64,), (0, 1)),
    ],
)
def test_contexts_are_separated(left, right):
    assert KeyedStream(SECRET, *left).bits(128) != KeyedStream(SECRET, *right).bits(128)


def test_different_secrets_give_different_streams():
    assert KeyedStream(SECRET, "c").bits(128) != KeyedStream(SECRET + b"!", "c").bits(128)


def test_derive_equals_the_full_context_whatever_was_read():
    parent = KeyedStream(SECRET, "v1", "dp_count")
    parent.bits(1000)
    assert parent.derive("cell", 3).bits(512) == KeyedStream(
        SECRET, "v1", "dp_count", "cell", 3
    ).bits(512)
    assert parent.derive("cell", 3).context == ("v1", "dp_count", "cell", 3)


def test_derive_many_gives_the_streams_derive_gives():
    """The streams of a result's cells, derived in one call, are those of one call per cell:
    text (any code point, lone surrogates too), and other items through ``derive``."""
    parent = KeyedStream(SECRET, 3, "cells")
    items = ["", "a", "é 日本 \U0001f600", "\ud800", '{"keys":[["r","s:N"]]}', 7, b"\x00"]
    many = parent.derive_many(items)
    assert [s.context for s in many] == [parent.derive(i).context for i in items]
    assert [s.bits(300) for s in many] == [parent.derive(i).bits(300) for i in items]
    assert parent.derive_many([]) == []


def test_the_stream_is_one_bit_string():
    whole, parts = KeyedStream(SECRET, "s"), KeyedStream(SECRET, "s")
    assert whole.bits(300) == sum(parts.bits(3) << (297 - 3 * i) for i in range(100))
    assert parts.bits(0) == 0


@pytest.mark.parametrize("before", [0, 3, 8, 256, 300])
def test_read_bytes_reads_the_bits_bits_reads(before):
    for size in (0, 1, 5, 32, 33, 1000):
        fast, slow = KeyedStream(SECRET, "bytes"), KeyedStream(SECRET, "bytes")
        fast.bits(before), slow.bits(before)
        assert fast.read_bytes(size) == slow.bits(8 * size).to_bytes(size, "big")
        assert fast.bits(77) == slow.bits(77)  # and leaves the stream where bits() does
    with pytest.raises(ValueError, match="must be >= 0"):
        fast.read_bytes(-1)


@pytest.mark.parametrize("n", [2, 6, 10, 192, 1000])
def test_uniform_int_is_uniform(n):
    stream = KeyedStream(SECRET, "uniform", n)
    draws = [stream.uniform_int(n) for _ in range(50 * n if n > 100 else N)]
    counts = np.bincount(draws, minlength=n)
    assert len(counts) == n
    assert stats.chisquare(counts).pvalue > LEVEL


def test_uniformity_check_rejects_modulo_bias():
    # 8 bits mod 192 makes 0..63 twice as likely: the same check must catch it.
    stream = KeyedStream(SECRET, "uniform", 192)
    counts = np.bincount([stream.bits(8) % 192 for _ in range(9600)], minlength=192)
    assert stats.chisquare(counts).pvalue < LEVEL


def test_bits_are_unbiased():
    stream = KeyedStream(SECRET, "bits")
    ones = stream.bits(200_000).bit_count()
    assert stats.binomtest(ones, 200_000, 0.5).pvalue > LEVEL
    counts = np.bincount([stream.bits(8) for _ in range(51_200)], minlength=256)
    assert stats.chisquare(counts).pvalue > LEVEL


@pytest.mark.parametrize("p", [Fraction(1, 3), Fraction(999, 1000), Fraction(1, 7)])
def test_bernoulli_is_exact(p):
    stream = KeyedStream(SECRET, "bernoulli", str(p))
    hits = sum(stream.bernoulli(p) for _ in range(N))
    assert stats.binomtest(hits, N, float(p)).pvalue > LEVEL
    assert stats.binomtest(hits, N, float(p) * 1.1 if p < 0.9 else 0.99).pvalue < LEVEL


def test_bernoulli_edges():
    stream = KeyedStream(SECRET, "edges")
    assert not any(stream.bernoulli(0) for _ in range(200))
    assert all(stream.bernoulli(1) for _ in range(200))
    assert all(stream.uniform_int(1) == 0 for _ in range(200))


def test_the_secret_is_never_shown():
    stream = KeyedStream(SECRET, "v1", "cell")
    text = repr(stream) + str(stream)
    assert "secret" not in text and SECRET.hex() not in text and "v1" in text
    for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="cannot be pickled or copied") as info:
            attempt(stream)
        assert "test secret" not in str(info.value)
    with pytest.raises(
        TypeError, match="context item 1 must be str, int or bytes, got float"
    ) as info:
        KeyedStream(SECRET, "v1", 1.5)
    assert "test secret" not in str(info.value)
    assert not any(isinstance(v, bytes) and SECRET in v for v in _slot_values(stream))


def _slot_values(stream):
    return [getattr(stream, name) for name in type(stream).__slots__]


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="secret must be bytes, got str"):
        KeyedStream("a text secret of sixteen+ chars", "c")
    with pytest.raises(ValueError, match="at least 16 bytes, got 5"):
        KeyedStream(b"short", "c")
    with pytest.raises(TypeError, match="context item 0 must be str, int or bytes, got bool"):
        KeyedStream(SECRET, True)
    with pytest.raises(TypeError, match="got NoneType"):
        KeyedStream(SECRET, "a", None)
    stream = KeyedStream(SECRET, "c")
    with pytest.raises(ValueError, match="integer n >= 1, got 0"):
        stream.uniform_int(0)
    with pytest.raises(ValueError, match=r"number of bits must be >= 0, got -1"):
        stream.bits(-1)
    with pytest.raises(TypeError, match=r"Fraction\('0.1'\) rather than 0.1"):
        stream.bernoulli(0.5)
    with pytest.raises(ValueError, match=r"probability must be in \[0, 1\], got 3/2"):
        stream.bernoulli(Fraction(3, 2))


# --- Algorithm 1: Bernoulli(exp(-gamma)) -----------------------------------------------------


@pytest.mark.parametrize("gamma", [Fraction(1, 2), Fraction(1), Fraction(5, 2), Fraction(7, 3)])
def test_bernoulli_exp_has_probability_exp_minus_gamma(gamma):
    stream = KeyedStream(SECRET, "bernoulli_exp", str(gamma))
    hits = sum(bernoulli_exp(gamma, stream) for _ in range(N))
    assert stats.binomtest(hits, N, math.exp(-gamma)).pvalue > LEVEL
    assert stats.binomtest(hits, N, math.exp(-gamma * OFF)).pvalue < LEVEL
    assert stats.binomtest(hits, N, math.exp(-gamma / OFF)).pvalue < LEVEL


def test_bernoulli_exp_edges():
    stream = KeyedStream(SECRET, "bernoulli_exp", "edges")
    assert all(bernoulli_exp(0, stream) for _ in range(200))
    assert sum(bernoulli_exp(40, stream) for _ in range(2_000)) == 0
    with pytest.raises(ValueError, match="gamma must be >= 0, got -1/2"):
        bernoulli_exp(Fraction(-1, 2), stream)


# --- Algorithms 2 and 3: distribution tests --------------------------------------------------

LAPLACE_SCALES = [Fraction(1, 3), Fraction(1), Fraction(7, 2), Fraction(40)]
GAUSS_SIGMA2 = [Fraction(1, 4), Fraction(1), Fraction(10), Fraction(2500)]


@pytest.mark.parametrize("t", LAPLACE_SCALES, ids=str)
def test_discrete_laplace_matches_its_pmf(t):
    assert chi2_pvalue(_draws(discrete_laplace, t, N, "lap", str(t)), _lap(t)) > LEVEL


@pytest.mark.parametrize("s2", GAUSS_SIGMA2, ids=str)
def test_discrete_gaussian_matches_its_pmf(s2):
    assert chi2_pvalue(_draws(discrete_gaussian, s2, N, "gauss", str(s2)), _gauss(s2)) > LEVEL


@pytest.mark.parametrize("t", [Fraction(1), Fraction(7, 2)], ids=str)
@pytest.mark.parametrize("factor", [OFF, 1 / OFF], ids=["x1.3", "/1.3"])
def test_discrete_laplace_at_a_wrong_scale_is_rejected(t, factor):
    draws = _draws(discrete_laplace, t * factor, N_SMALL, "lap-off", str(t), str(factor))
    assert chi2_pvalue(draws, _lap(t)) < LEVEL


@pytest.mark.parametrize("s2", [Fraction(1), Fraction(10)], ids=str)
@pytest.mark.parametrize("factor", [OFF, 1 / OFF], ids=["x1.3", "/1.3"])
def test_discrete_gaussian_at_a_wrong_scale_is_rejected(s2, factor):
    draws = _draws(discrete_gaussian, s2 * factor**2, N_SMALL, "gauss-off", str(s2), str(factor))
    assert chi2_pvalue(draws, _gauss(s2)) < LEVEL


def test_one_draw_per_cell_matches_the_pmf_and_cells_are_independent():
    # How the DP engine uses it: each cell and mechanism has its own context and one draw.
    t, s2 = Fraction(3), Fraction(9)
    lap = [discrete_laplace(t, KeyedStream(SECRET, "v1", "lap", i)) for i in range(N_SMALL)]
    gauss = [discrete_gaussian(s2, KeyedStream(SECRET, "v1", "gauss", i)) for i in range(N_SMALL)]
    assert chi2_pvalue(lap, _lap(t)) > LEVEL
    assert chi2_pvalue(gauss, _gauss(s2)) > LEVEL
    table = np.zeros((5, 5))
    for x, y in zip(lap, gauss, strict=True):
        table[min(max(x, -2), 2) + 2, min(max(y, -2), 2) + 2] += 1
    assert stats.chi2_contingency(table).pvalue > LEVEL


def test_same_cell_same_noise_and_pinned_values():
    # Golden values: changing the PRF, the encoding or how an algorithm consumes randomness
    # changes previously released numbers, which must be a deliberate, versioned decision.
    a = KeyedStream(SECRET, "v1", "dp_count", "region=North")
    b = KeyedStream(SECRET, "v1", "dp_count", "region=North")
    assert [discrete_laplace(5, a) for _ in range(20)] == [
        discrete_laplace(5, b) for _ in range(20)
    ]
    lap = [discrete_laplace(Fraction(5), KeyedStream(SECRET, "golden", i)) for i in range(10)]
    gauss = [discrete_gaussian(Fraction(25), KeyedStream(SECRET, "golden", i)) for i in range(10)]
    assert lap == GOLDEN_LAPLACE
    assert gauss == GOLDEN_GAUSS


GOLDEN_LAPLACE = [-1, 1, -6, 12, 2, -7, 9, 0, -18, 1]
GOLDEN_GAUSS = [4, 1, -7, 3, -4, -2, 4, 6, -3, 1]


def test_samplers_refuse_floats_and_nonpositive_scales():
    stream = KeyedStream(SECRET, "args")
    with pytest.raises(TypeError, match=r"scale must be an int or fractions.Fraction .* got float"):
        discrete_laplace(2.5, stream)
    with pytest.raises(ValueError, match="scale must be positive, got 0"):
        discrete_laplace(0, stream)
    with pytest.raises(TypeError, match="sigma2 must be an int or fractions.Fraction"):
        discrete_gaussian(4.0, stream)
    with pytest.raises(ValueError, match="sigma2 must be positive, got -1"):
        discrete_gaussian(-1, stream)


def test_large_scales_are_fast_and_centred():
    import time

    stream = KeyedStream(SECRET, "large")
    start = time.perf_counter()
    lap = [discrete_laplace(10**6, stream) for _ in range(500)]
    gauss = [discrete_gaussian(10**12, stream) for _ in range(500)]
    per_draw = (time.perf_counter() - start) / 1000
    assert per_draw < 1e-3
    assert abs(np.mean(lap)) < 5 * math.sqrt(2e12 / 500)
    assert abs(np.mean(gauss)) < 5 * math.sqrt(1e12 / 500)
    assert 0.7 < np.std(gauss) / 1e6 < 1.3


# --- exact facts: pmf, variance, interval ----------------------------------------------------


@pytest.mark.parametrize("t", LAPLACE_SCALES + [Fraction(1000)], ids=str)
def test_discrete_laplace_pmf_and_variance(t):
    top = int(40 * t) + 60
    p = [discrete_laplace_pmf(x, t) for x in range(-top, top + 1)]
    assert math.fsum(p) == pytest.approx(1.0, abs=1e-12)
    assert discrete_laplace_pmf(3, t) / discrete_laplace_pmf(2, t) == pytest.approx(
        math.exp(-1 / t), rel=1e-12
    )
    second = math.fsum(x * x * discrete_laplace_pmf(x, t) for x in range(-top, top + 1))
    assert discrete_laplace_variance(t) == pytest.approx(second, rel=1e-10)


@pytest.mark.parametrize(
    "s2", GAUSS_SIGMA2 + [Fraction(10_000), Fraction(10_001), Fraction(10**6)], ids=str
)
def test_discrete_gaussian_pmf_and_variance(s2):
    sigma = math.sqrt(s2)
    top = int(40 * sigma) + 10
    weights = [math.exp(-x * x / (2 * float(s2))) for x in range(-top, top + 1)]
    z = math.fsum(weights)
    for x in (0, 1, int(sigma), int(3 * sigma)):
        assert discrete_gaussian_pmf(x, s2) == pytest.approx(weights[top + x] / z, rel=1e-12)
    second = math.fsum(w * (i - top) ** 2 for i, w in enumerate(weights)) / z
    assert discrete_gaussian_variance(s2) == pytest.approx(second, rel=1e-12)
    assert discrete_gaussian_variance(s2) <= s2
    if s2 <= 1:  # below double precision from sigma^2 = 2 on (CKS20: Var < sigma^2)
        assert discrete_gaussian_variance(s2) < s2


def _coverage(pmf, a: int) -> float:
    return math.fsum(pmf(x) for x in range(-a, a + 1))


@pytest.mark.parametrize(
    "t", [Fraction(1, 3), Fraction(1), Fraction(10), Fraction(333, 2)], ids=str
)
@pytest.mark.parametrize("alpha", [0.5, 0.05, Fraction(1, 100), 1e-6])
def test_discrete_laplace_interval_is_the_smallest(t, alpha):
    a = discrete_laplace_interval(t, alpha)
    assert _coverage(_lap(t), a) >= 1 - alpha
    assert a == 0 or _coverage(_lap(t), a - 1) < 1 - alpha


@pytest.mark.parametrize(
    "s2", [Fraction(1, 4), Fraction(2), Fraction(100), Fraction(10_000), Fraction(12_345)], ids=str
)
@pytest.mark.parametrize("alpha", [0.5, 0.05, Fraction(1, 100), 1e-6])
def test_discrete_gaussian_interval_is_the_smallest(s2, alpha):
    a = discrete_gaussian_interval(s2, alpha)
    assert _coverage(_gauss(s2), a) >= 1 - alpha - 1e-12
    assert a == 0 or _coverage(_gauss(s2), a - 1) < 1 - alpha


def test_intervals_cover_sampled_noise():
    t, s2 = Fraction(7, 2), Fraction(10)
    a_lap, a_gauss = discrete_laplace_interval(t, 0.1), discrete_gaussian_interval(s2, 0.1)
    lap = _draws(discrete_laplace, t, N_SMALL, "lap", str(t))
    gauss = _draws(discrete_gaussian, s2, N_SMALL, "gauss", str(s2))
    for draws, a, pmf in ((lap, a_lap, _lap(t)), (gauss, a_gauss, _gauss(s2))):
        inside = sum(abs(x) <= a for x in draws)
        assert stats.binomtest(inside, N_SMALL, _coverage(pmf, a)).pvalue > LEVEL


def test_gaussian_tail_closed_form_matches_direct_sums_above_the_switch():
    # Above sigma^2 = 10^4 the tail is Euler-Maclaurin with erfc; check it against plain sums.
    from sqlsdc.mechanisms.samplers import _gauss_two_sided_tail

    for s2 in (Fraction(10_001), Fraction(40_000), Fraction(10**6)):
        sigma = math.sqrt(s2)
        top = int(40 * sigma)
        f = np.exp(-(np.arange(top + 1, dtype=float) ** 2) / (2 * float(s2)))
        z = f[0] + 2 * math.fsum(f[1:])
        for a in (0, int(sigma), int(2.5 * sigma), int(6 * sigma)):
            direct = 2 * math.fsum(f[a + 1 :]) / z
            assert _gauss_two_sided_tail(s2, a) == pytest.approx(direct, rel=1e-11)


def test_interval_arguments():
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\), got 1"):
        discrete_laplace_interval(1, 1.0)
    with pytest.raises(ValueError, match=r"alpha must be in \(1e-100, 1\), got 1e-200"):
        discrete_gaussian_interval(1, 1e-200)
    assert discrete_laplace_interval(Fraction(1, 100), 0.01) == 0
    assert discrete_gaussian_interval(Fraction(1, 100), 0.01) == 0


# --- calibration and accounting --------------------------------------------------------------


def test_calibration_formulas():
    assert discrete_laplace_scale(1, Fraction(1, 2)) == 2
    assert discrete_laplace_scale(3, Fraction("0.1")) == 30
    assert discrete_gaussian_sigma2(2, Fraction(1, 2)) == 4
    assert discrete_gaussian_sigma2(1, Fraction(1, 8)) == 4
    with pytest.raises(
        TypeError, match=r"epsilon must be an int or fractions.Fraction .*Fraction\('0.1'\)"
    ):
        discrete_laplace_scale(1, 0.1)
    with pytest.raises(ValueError, match="rho must be positive, got 0"):
        discrete_gaussian_sigma2(1, 0)


def _grid_delta(rho: float, eps: float) -> float:
    alpha = np.linspace(1.000001, 5 + (eps + 1) / rho, 400_000)
    with np.errstate(over="ignore"):
        log = (alpha - 1) * (alpha * rho - eps) + alpha * np.log1p(-1 / alpha) - np.log(alpha - 1)
    return float(min(1.0, np.exp(log.min())))


@pytest.mark.parametrize(
    ("rho", "eps"), [(0.5, 3.0), (0.025, 1.0), (Fraction(1, 200), 0.3), (2.0, 10.0)]
)
def test_zcdp_delta_is_the_cks20_infimum(rho, eps):
    assert zcdp_delta(rho, eps) == pytest.approx(_grid_delta(float(rho), eps), rel=1e-6)


@pytest.mark.parametrize("rho", [Fraction(1, 200), Fraction(1, 8), Fraction(1, 2), 3])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, Fraction(1, 10**10)])
def test_zcdp_to_approx_dp(rho, delta):
    standard = zcdp_to_approx_dp(rho, delta, tight=False)
    assert standard == pytest.approx(
        float(rho) + 2 * math.sqrt(float(rho) * math.log(1 / float(delta)))
    )
    tight = zcdp_to_approx_dp(rho, delta)
    assert tight < standard
    assert zcdp_delta(rho, tight) <= delta  # valid ...
    assert zcdp_delta(rho, tight * (1 - 1e-9)) > delta  # ... and the smallest
    # The Gaussian with sigma^2 = 1/(2 rho) is rho-zCDP, so its exact delta (Balle and Wang 2018)
    # cannot exceed the bound.
    sigma = 1 / math.sqrt(2 * float(rho))
    exact = stats.norm.cdf(0.5 / sigma - tight * sigma) - math.exp(tight) * stats.norm.cdf(
        -0.5 / sigma - tight * sigma
    )
    assert exact <= delta


def test_zcdp_boundaries():
    assert zcdp_to_approx_dp(0, 1e-6) == 0
    assert zcdp_delta(0, 1) == 0
    assert 0 < zcdp_delta(1, 0) < 1
    for bad in (0, 1, 1.5, -1e-9):
        with pytest.raises(ValueError, match=r"delta must be in \(0, 1\)"):
            zcdp_to_approx_dp(Fraction(1, 2), bad)
    with pytest.raises(ValueError, match="rho must be a number >= 0, got -1"):
        zcdp_delta(-1, 1)


# --- OpenDP as an oracle ---------------------------------------------------------------------

# OpenDP draws from OS entropy, so these comparisons are not seeded: the pass side uses a
# stricter level so a false alarm is a one-in-a-million event.
ORACLE_LEVEL = 1e-6


def _opendp_draws(kind: str, scale: float, n: int) -> list[int]:
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    domain = dp.vector_domain(dp.atom_domain(T=int))
    if kind == "laplace":
        measurement = dp.m.make_laplace(domain, dp.l1_distance(T=int), scale=scale)
    else:
        measurement = dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=scale)
    return measurement([0] * n)


@pytest.mark.parametrize(
    ("kind", "ours"),
    [
        ("laplace", lambda t, s: discrete_laplace(t, s)),
        ("gaussian", lambda t, s: discrete_gaussian(t * t, s)),
    ],
)
def test_agrees_with_opendp(kind, ours):
    scale = Fraction(3)
    theirs = _opendp_draws(kind, float(scale), N)
    mine = _draws(ours, scale, N, "opendp", kind)
    assert chi2_two_sample_pvalue(mine, theirs) > ORACLE_LEVEL
    off = _draws(ours, scale * OFF, N_SMALL, "opendp-off", kind)
    assert chi2_two_sample_pvalue(off, theirs) < ORACLE_LEVEL


# OpenDP 0.16 ``make_fix_delta(make_zCDP_to_approxDP(make_gaussian(..., scale)), delta)``
# (its cdp_epsilon, CKS20 Corollary 13 as here), for rho = 1/(2 scale^2): (rho, delta, epsilon).
OPENDP_ZCDP_TO_APPROX = [
    (0.01, 1e-05, 0.5457255482740025),
    (0.01, 1e-09, 0.8101744678675343),
    (0.09999999999999999, 1e-05, 1.914238832003598),
    (0.09999999999999999, 1e-09, 2.7154818867305024),
    (0.5, 1e-05, 4.728386984943315),
    (0.5, 1e-09, 6.474070020726487),
    (2.0, 1e-05, 10.724824112939174),
    (2.0, 1e-09, 14.150147553874598),
]


@pytest.mark.parametrize(("rho", "delta", "epsilon"), OPENDP_ZCDP_TO_APPROX)
def test_zcdp_to_approx_dp_is_opendp_s_conversion(rho, delta, epsilon):
    """The reported (epsilon, delta) of a rho-zCDP cost is OpenDP's to 1e-12 (measured 2e-16;
    Bun-Steinke's rho + 2 sqrt(rho ln 1/delta) is 5-20 % larger)."""
    assert zcdp_to_approx_dp(rho, delta) == pytest.approx(epsilon, rel=1e-12)
    assert zcdp_to_approx_dp(rho, delta, tight=False) > 1.05 * epsilon
