"""Noise on aggregated cells: deterministic per cell, exact distributions, post-processing and
quantiles. Every draw comes from fixed secrets, so each test gives the same answer every run;
distribution tests pass at the claimed scale and fail at a wrong one (STYLE §12)."""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from sqlsdc.mechanisms.accountant import (
    Aggregate,
    Bounding,
    PrivacyCost,
    Statistic,
    calibrate,
    plan_aggregate,
)
from sqlsdc.mechanisms.dp_cells import (
    CellMechanism,
    CellSpace,
    add_noise,
    average,
    cell_identity,
    encode_key_value,
    noisy_quantiles,
    permute_and_flip,
    quantile_scores,
    stddev,
    variance,
)
from sqlsdc.mechanisms.prf import KeyedStream
from sqlsdc.mechanisms.samplers import discrete_gaussian_pmf, discrete_laplace_pmf

SECRET = b"sqlsdc test secret - dp cells 0001"
OTHER = b"sqlsdc test secret - dp cells 0002"
LEVEL = 1e-4
COUNT = CellMechanism("*", calibrate(Statistic.COUNT, Bounding(), PrivacyCost(epsilon=1)))


def _cells(n: int) -> pd.DataFrame:
    return pd.DataFrame({"g": np.arange(n), "n": np.full(n, 50)})


def _noise(result, frame, column="n") -> np.ndarray:
    released = np.array([float(v) for v in result.values[column]])
    return released - frame[column].to_numpy(dtype=float)


def chi2_pvalue(draws, pmf, min_expected: float = 10.0) -> float:
    """Chi-square fit of integer draws to a pmf: bins are values with enough expected draws,
    plus one bin for everything else."""
    draws = np.asarray(draws, dtype=np.int64)
    n = len(draws)
    support = range(int(draws.min()) - 5, int(draws.max()) + 6)
    kept = [x for x in support if n * pmf(x) >= min_expected]
    probs = np.array([pmf(x) for x in kept])
    counts = np.array([(draws == x).sum() for x in kept])
    rest_p, rest_n = 1.0 - probs.sum(), n - counts.sum()
    if n * rest_p >= 1:
        probs, counts = np.append(probs, rest_p), np.append(counts, rest_n)
    return stats.chisquare(counts, n * probs / probs.sum()).pvalue


# --- identity --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, text",
    [
        (None, "null"),
        (float("nan"), "null"),
        (pd.NA, "null"),
        (True, "b:true"),
        (np.int64(7), "i:7"),
        (7, "i:7"),
        (7.0, "f:7.0"),
        (np.float32(0.5), "f:0.5"),
        (Decimal("1.50"), "d:1.5"),
        ("7", "s:7"),
        (dt.date(2024, 2, 29), "date:2024-02-29"),
        (pd.Timestamp("2024-02-29 12:00"), "ts:2024-02-29T12:00:00"),
        (dt.time(8, 30), "time:08:30:00"),
        (b"\x00\xff", "x:00ff"),
    ],
)
def test_key_values_are_typed(value, text):
    assert encode_key_value(value) == text


def test_unencodable_key_values_are_refused():
    with pytest.raises(TypeError, match="has no canonical encoding"):
        encode_key_value([1, 2])


def test_identity_ignores_aliases_and_column_order_but_not_what_defines_the_cell():
    a = cell_identity(CellSpace.of("persons", {"r": "region", "s": "sex"}), COUNT,
                      {"r": "N", "s": "F"})  # fmt: skip
    b = cell_identity(
        CellSpace.of("persons", ["sex", "region"]), COUNT, {"region": "N", "sex": "F"}
    )
    assert a == b and len(a.digest) == 64 and "N" not in repr(a)
    different = [
        cell_identity(CellSpace.of("persons", ["sex", "region"]), COUNT,
                      {"region": "S", "sex": "F"}),
        cell_identity(CellSpace.of("households", ["sex", "region"]), COUNT,
                      {"region": "N", "sex": "F"}),
        cell_identity(CellSpace.of("persons", ["sex", "region"], scope="age > 30"), COUNT,
                      {"region": "N", "sex": "F"}),
        cell_identity(CellSpace.of("persons", ["sex", "region"], data_version="load-2"), COUNT,
                      {"region": "N", "sex": "F"}),
        cell_identity(CellSpace.of("persons", ["sex", "region"]),
                      CellMechanism("*", calibrate(Statistic.COUNT, Bounding(max_rows=2),
                                                   PrivacyCost(epsilon=1))),
                      {"region": "N", "sex": "F"}),
    ]  # fmt: skip
    assert len({a.digest, *(d.digest for d in different)}) == 6
    with pytest.raises(ValueError, match="canonical key names must be distinct"):
        CellSpace.of("persons", {"a": "region", "b": "region"})


def test_the_identities_of_a_result_are_those_of_its_cells_one_by_one():
    """``add_noise`` builds the identities of a result's cells a column at a time (plain
    strings and integers in one pass); each is the one :func:`cell_identity` gives the cell
    alone, whatever the values: NULLs, text to escape in JSON, bools beside integers, dates,
    decimals, floats and bytes."""
    region = ["N", None, 'a "quoted" \\ back', "é\n\t\x01", "\u2028", "S", "", "N"]
    columns = {
        "region": region,
        "age": [1, None, -3, 2**70, 0, 5, 6, 7],
        "mixed": [True, 1, False, 0, None, 2.5, Decimal("1.10"), dt.date(2024, 2, 29)],
        "blob": [b"\x00", b"", None, b"\xff", b"a", b"b", b"c", b"d"],
    }
    frame = pd.DataFrame({**columns, "n": [10] * 8})
    for keys in (["region"], ["age"], ["mixed"], ["region", "age", "mixed", "blob"], []):
        space = CellSpace.of("persons", {k: f"'persons'.{k}" for k in keys}, scope="s",
                             data_version="d")  # fmt: skip
        out = add_noise(frame, space, {"n": COUNT}, secret=SECRET, policy_version=1)
        alone = [cell_identity(space, COUNT, {k: columns[k][row] for k in keys})
                 for row in range(8)]  # fmt: skip
        assert [c.identity for c in out.new_cells] == alone


# --- determinism -----------------------------------------------------------------------------


def test_same_cell_same_noise_whatever_the_query_looks_like():
    frame = pd.DataFrame({"region": ["N", "S", "E"], "sex": ["F", "M", "F"], "n": [10, 20, 30]})
    space = CellSpace.of("persons", ["region", "sex"])
    first = add_noise(frame, space, {"n": COUNT}, secret=SECRET, policy_version=1)
    # rephrased: other aliases, other column order, other row order
    again = frame.rename(columns={"region": "r"})[["n", "sex", "r"]].iloc[::-1]
    second = add_noise(again, CellSpace.of("persons", {"r": "region", "sex": "sex"}),
                       {"n": COUNT}, secret=SECRET, policy_version=1)  # fmt: skip
    assert first.values["n"] == second.values["n"][::-1]
    assert [c.identity for c in first.new_cells] == [c.identity for c in second.new_cells][::-1]
    other_secret = add_noise(frame, space, {"n": COUNT}, secret=OTHER, policy_version=1)
    other_version = add_noise(frame, space, {"n": COUNT}, secret=SECRET, policy_version=2)
    assert first.values["n"] != other_secret.values["n"]
    assert first.values["n"] != other_version.values["n"]
    assert list(first.frame.columns) == ["region", "sex", "n"]
    assert first.frame["n"].dtype == np.int64


def test_cached_cells_are_returned_as_they_are_and_not_drawn_again():
    frame = _cells(4)
    space = CellSpace.of("t", ["g"])
    fresh = add_noise(frame, space, {"n": COUNT}, secret=SECRET, policy_version=1)
    known = {fresh.new_cells[1].identity.digest: Fraction(999)}
    seen = []

    def lookup(digests):
        seen.append(digests)
        return known

    again = add_noise(frame, space, {"n": COUNT}, secret=SECRET, policy_version=1, cached=lookup)
    assert len(seen) == 1 and len(seen[0]) == 4  # one lookup with every digest
    assert again.values["n"][1] == 999 and again.reused == 1 and len(again.new_cells) == 3
    assert again.values["n"][0] == fresh.values["n"][0]


def test_errors_name_the_missing_columns():
    with pytest.raises(ValueError, match=r"key columns \['x'\] are not in the frame"):
        add_noise(_cells(1), CellSpace.of("t", ["x"]), {"n": COUNT}, secret=SECRET,
                  policy_version=1)  # fmt: skip
    with pytest.raises(ValueError, match="value column 'm' is not in the frame"):
        add_noise(_cells(1), CellSpace.of("t", ["g"]), {"m": COUNT}, secret=SECRET,
                  policy_version=1)  # fmt: skip
    quantile = CellMechanism("x", calibrate(Statistic.QUANTILE, Bounding(lower=0, upper=9),
                                            PrivacyCost(epsilon=1)))  # fmt: skip
    with pytest.raises(ValueError, match="use noisy_quantiles"):
        add_noise(_cells(1), CellSpace.of("t", ["g"]), {"n": quantile}, secret=SECRET,
                  policy_version=1)  # fmt: skip


def test_the_secret_never_shows():
    out = add_noise(_cells(2), CellSpace.of("t", ["g"]), {"n": COUNT}, secret=SECRET,
                    policy_version=1)  # fmt: skip
    text = repr(out) + repr(out.new_cells) + out.frame.to_string()
    assert SECRET.decode() not in text and SECRET.hex() not in text


# --- distributions ---------------------------------------------------------------------------


@pytest.mark.parametrize("factor, passes", [(1, True), (Fraction(13, 10), False),
                                            (Fraction(10, 13), False)])  # fmt: skip
def test_count_noise_is_discrete_laplace_of_the_claimed_scale(factor, passes):
    cal = calibrate(Statistic.COUNT, Bounding(max_groups=2), PrivacyCost(epsilon=Fraction(1, 2)))
    assert cal.scale == 4
    frame = _cells(8000)
    out = add_noise(frame, CellSpace.of("t", ["g"]), {"n": CellMechanism("*", cal)},
                    secret=SECRET, policy_version=1)  # fmt: skip
    p = chi2_pvalue(_noise(out, frame), lambda x: discrete_laplace_pmf(x, cal.scale * factor))
    assert bool(p > LEVEL) is passes


def test_sum_noise_is_discrete_gaussian_on_the_grid():
    b = Bounding(lower=0, upper=Fraction(5, 2), granularity=Fraction(1, 2))
    cal = calibrate(Statistic.SUM, b, PrivacyCost(rho=Fraction(1, 2)))
    assert cal.sigma2 == 25
    frame = pd.DataFrame({"g": np.arange(6000), "s": np.full(6000, 1234.5)})
    out = add_noise(frame, CellSpace.of("t", ["g"]), {"s": CellMechanism("x", cal)},
                    secret=SECRET, policy_version=1)  # fmt: skip
    assert all((v * 2).denominator == 1 for v in out.values["s"])  # multiples of the grid
    assert out.frame["s"].dtype == np.float64
    units = (_noise(out, frame, "s") * 2).round().astype(int)
    assert chi2_pvalue(units, lambda x: discrete_gaussian_pmf(x, 25)) > LEVEL
    assert chi2_pvalue(units, lambda x: discrete_gaussian_pmf(x, 36)) < LEVEL
    assert chi2_pvalue(units, lambda x: discrete_gaussian_pmf(x, 16)) < LEVEL


def test_reported_intervals_cover_95_percent():
    cal = calibrate(Statistic.COUNT, Bounding(), PrivacyCost(epsilon=Fraction(1, 5)))
    frame = _cells(4000)
    out = add_noise(frame, CellSpace.of("t", ["g"]), {"n": CellMechanism("*", cal)},
                    secret=SECRET, policy_version=1)  # fmt: skip
    noise = _noise(out, frame)
    covered = int((np.abs(noise) <= cal.half_width).sum())
    # P(|Z| <= half_width) is >= 0.95 and P(|Z| <= half_width - 1) < 0.95: two one-sided tests
    assert stats.binomtest(covered, len(noise), 0.95, alternative="less").pvalue > LEVEL
    assert abs(noise.std() - cal.sd) / cal.sd < 0.05


def test_exact_inputs_and_nulls():
    cal = calibrate(Statistic.SUM, Bounding(lower=0, upper=10), PrivacyCost(epsilon=10**6))
    frame = pd.DataFrame({"g": [1, 2, 3, 4], "s": [None, Decimal("7"), Fraction(9), 2.9999999]})
    out = add_noise(frame.astype(object), CellSpace.of("t", ["g"]), {"s": CellMechanism("x", cal)},
                    secret=SECRET, policy_version=1)  # fmt: skip
    assert out.values["s"] == [0, 7, 9, 3]  # noise ~0 at epsilon 10^6; NULL sum is 0
    with pytest.raises(TypeError, match="is not a number"):
        add_noise(pd.DataFrame({"g": [1], "s": ["x"]}), CellSpace.of("t", ["g"]),
                  {"s": CellMechanism("x", cal)}, secret=SECRET, policy_version=1)  # fmt: skip


# --- post-processing -------------------------------------------------------------------------


def test_average_variance_stddev_from_exact_components():
    rng = np.random.default_rng(5)
    x = rng.integers(0, 100, size=50)
    n, s, s2 = len(x), x.sum(), (x.astype(float) ** 2).sum()
    assert average([s], [n], 0, 100)[0] == pytest.approx(x.mean())
    assert variance([s2], [s], [n], 0, 100)[0] == pytest.approx(x.var(ddof=1))
    assert variance([s2], [s], [n], 0, 100, ddof=0)[0] == pytest.approx(x.var())
    assert stddev([s2], [s], [n], 0, 100)[0] == pytest.approx(x.std(ddof=1))


def test_post_processing_stays_in_the_domain():
    assert average([500, -5, 7], [2, 3, 0], 0, 100).tolist() == [100, 0, 7]  # count floored at 1
    assert variance([10**9, -50], [10, 10], [2, 2], 0, 10).tolist() == [25, 0]


def test_avg_plan_releases_sum_and_count_cells():
    b = Bounding(lower=0, upper=100)
    plan = plan_aggregate(Aggregate.AVG, b, PrivacyCost(epsilon=10**6))
    frame = pd.DataFrame({"g": ["a", "b"], "s": [300, 50], "n": [4, 1]})
    mechanisms = {"s": CellMechanism("income", plan.component(Statistic.SUM)),
                  "n": CellMechanism("*", plan.component(Statistic.COUNT))}  # fmt: skip
    out = add_noise(frame, CellSpace.of("t", ["g"]), mechanisms, secret=SECRET, policy_version=1)
    assert average(out.frame["s"], out.frame["n"], 0, 100).tolist() == [75, 50]


# --- quantiles -------------------------------------------------------------------------------


def test_quantile_scores_are_exact():
    # candidates 0..4 with rows at 1, 1, 3
    assert quantile_scores([0, 2, 0, 1, 0], Fraction(1, 2)).tolist() == [3, 1, 1, 2, 3]
    assert quantile_scores([0, 2, 0, 1, 0], Fraction(1, 4)).tolist() == [3, 1, 5, 6, 9]
    with pytest.raises(ValueError, match="must be >= 0"):
        quantile_scores([1, -1], Fraction(1, 2))


def _pf_probabilities(scores, rate: float) -> np.ndarray:
    """Exact permute-and-flip output distribution, by enumerating every order."""
    best = min(scores)
    p = [math.exp(-rate * (s - best)) for s in scores]
    out = np.zeros(len(scores))
    orders = list(itertools.permutations(range(len(scores))))
    for order in orders:
        reach = 1.0
        for r in order:
            out[r] += reach * p[r] / len(orders)
            reach *= 1 - p[r]
    return out


@functools.cache
def _pf_draws_at_one_half() -> tuple[int, ...]:
    """20,000 permute-and-flip draws at rate 1/2 from one keyed stream: the same draws for both
    cases below (the stream is a function of its key), so they are drawn once, not twice."""
    stream = KeyedStream(SECRET, "pf-test")
    return tuple(permute_and_flip(PF_SCORES, Fraction(1, 2), stream) for _ in range(20_000))


PF_SCORES = [0, 1, 2, 4]


@pytest.mark.parametrize("rate, passes", [(Fraction(1, 2), True), (Fraction(3, 4), False)])
def test_permute_and_flip_has_its_exact_distribution(rate, passes):
    """The draws at rate 1/2 pass the chi-square test against the distribution at rate 1/2 and
    fail it against the one at rate 3/4 (the test can tell them apart)."""
    scores = PF_SCORES
    draws = _pf_draws_at_one_half()
    counts = np.bincount(draws, minlength=4)
    expected = _pf_probabilities(scores, float(rate)) * len(draws)
    assert bool(stats.chisquare(counts, expected).pvalue > LEVEL) is passes


@pytest.mark.parametrize(
    "scores, rate",
    [
        ([0, 3, 1, 5, 2], Fraction(7, 10)),  # acceptance exponents with integer parts
        ([2, 0, 9, 1, 1], Fraction(13, 9)),  # ties, and one candidate at exp(-13)
        ([0, 1, 2, 4], Fraction(2**65 + 1, 2**66)),  # a rate's terms beyond int64
    ],
)
def test_permute_and_flip_is_exact_for_every_kind_of_rate(scores, rate):
    stream = KeyedStream(SECRET, "pf-rates")
    draws = [permute_and_flip(scores, rate, stream) for _ in range(10_000)]
    counts = np.bincount(draws, minlength=len(scores))
    expected = _pf_probabilities(scores, float(rate)) * len(draws)
    seen = expected > 0.5
    assert counts[~seen].sum() <= 1
    assert stats.chisquare(counts[seen], expected[seen] * counts[seen].sum() / expected[seen].sum()
                           ).pvalue > LEVEL  # fmt: skip


class _Counted(KeyedStream):
    """A keyed stream that counts the PRF blocks read from it."""

    __slots__ = ("blocks",)

    def block(self, index: int) -> bytes:
        self.blocks = getattr(self, "blocks", 0) + 1
        return super().block(index)


def test_permute_and_flip_reads_as_much_randomness_whatever_the_cell():
    """(Red team s40c, s41h.) The draw stopped at the first accepted candidate of a random
    order: one visit for a median of 12 rows over [0, 3000] at epsilon = 1/5, about a hundred
    for 12,000 rows, so its running time told the cell's size. It now makes the same draws on
    the same stream whatever the scores; only the final choice among the accepted candidates
    may read one block more."""
    rng = np.random.default_rng(5)
    small, large = (quantile_scores(np.bincount(rng.integers(0, 3001, rows), minlength=3001),
                                    Fraction(1, 2)) for rows in (12, 12_000))  # fmt: skip
    for cell in range(5):
        used = []
        for scores in (small, large):
            stream = _Counted(SECRET, "pf-cost", cell)
            permute_and_flip(scores, Fraction(1, 10), stream)
            used.append(stream.blocks)
        assert abs(used[0] - used[1]) <= 1 and min(used) > 500  # ~ 3,001 x 80 bits


def test_permute_and_flip_edges():
    stream = KeyedStream(SECRET, "pf-edges")
    assert {permute_and_flip([5, 0, 5], Fraction(10**6), stream) for _ in range(50)} == {1}
    assert permute_and_flip([3], Fraction(1), stream) == 0
    with pytest.raises(ValueError, match="at least one candidate"):
        permute_and_flip([], Fraction(1), stream)


def test_noisy_median_per_cell():
    b = Bounding(lower=0, upper=Fraction(99, 10), granularity=Fraction(1, 10))  # 100 candidates
    sharp = CellMechanism("age", calibrate(Statistic.QUANTILE, b, PrivacyCost(epsilon=10**4)))
    hist = pd.DataFrame({
        "region": ["N", "N", "N", "S", "S", "E"],
        "bin": [10, 20, 90, 5, 7, 0],
        "count": [30, 41, 30, 3, 0, 0],
    })  # fmt: skip
    space = CellSpace.of("persons", ["region"])
    out = noisy_quantiles(hist, space, sharp, secret=SECRET, policy_version=1, column="median")
    medians = dict(zip(out.frame["region"], out.frame["median"], strict=True))
    assert medians["N"] == 2.0 and medians["S"] == 0.5  # exact at a huge epsilon
    assert 0 <= medians["E"] <= 9.9  # no data: any candidate
    assert out.values["median"][0] == Fraction(2) and len(out.new_cells) == 3
    again = noisy_quantiles(hist.iloc[::-1], space, sharp, secret=SECRET, policy_version=1,
                            column="median",
                            cached={out.new_cells[0].identity.digest: Fraction(7)})  # fmt: skip
    assert dict(zip(again.frame["region"], again.values["median"], strict=True)) == {
        "N": 7, "S": Fraction(1, 2), "E": out.values["median"][2]}  # fmt: skip
    with pytest.raises(ValueError, match="bin must be in 0..99"):
        noisy_quantiles(hist.assign(bin=100), space, sharp, secret=SECRET, policy_version=1)
    with pytest.raises(ValueError, match="needs a QUANTILE calibration"):
        noisy_quantiles(hist, space, COUNT, secret=SECRET, policy_version=1)


def test_noisy_median_error_within_the_reported_rank_bound():
    b = Bounding(lower=0, upper=99)
    cal = calibrate(Statistic.QUANTILE, b, PrivacyCost(epsilon=1))
    rows = []
    for cell in range(200):  # 1000 rows per cell, uniform over 0..99: true median rank 500
        rows += [{"cell": cell, "bin": j, "count": 10} for j in range(100)]
    out = noisy_quantiles(pd.DataFrame(rows), CellSpace.of("t", ["cell"]),
                          CellMechanism("x", cal), secret=SECRET, policy_version=1)  # fmt: skip
    # score_j / b = |lt_j - (lt_j + gt_j)/2| = |10 j - 495|: the rank error of candidate j
    rank_error = np.abs(out.frame["quantile"].to_numpy() * 10 - 495)
    assert (rank_error <= cal.rank_error95).mean() >= 0.95


# --- privacy checks on neighbouring inputs ---------------------------------------------------


@pytest.mark.parametrize("alpha", [Fraction(1, 2), Fraction(1, 4)])
def test_quantile_mechanism_is_epsilon_dp_on_every_small_neighbour_pair(alpha):
    """Exact output distributions of the calibrated permute-and-flip on every histogram of at
    most 3 rows over 4 candidates and each neighbour (one row more, anywhere): the likelihood
    ratio never exceeds exp(epsilon)."""
    epsilon = Fraction(1)
    cal = calibrate(Statistic.QUANTILE, Bounding(lower=0, upper=3), PrivacyCost(epsilon=epsilon),
                    alpha=alpha)  # fmt: skip
    worst = 0.0
    for hist in itertools.product(range(4), repeat=4):
        if sum(hist) > 3:
            continue
        p = _pf_probabilities(quantile_scores(hist, alpha).tolist(), float(cal.rate))
        for j in range(4):
            bigger = list(hist)
            bigger[j] += 1
            q = _pf_probabilities(quantile_scores(bigger, alpha).tolist(), float(cal.rate))
            worst = max(worst, float(np.max(np.abs(np.log(p / q)))))
    assert worst <= float(epsilon) + 1e-9
    assert worst > 0.5 * float(epsilon)  # the bound is not vacuous


def test_count_noise_on_neighbouring_cells_stays_within_epsilon():
    """Empirical privacy loss of a noisy count at x and x + 1 (fresh cells, fixed secrets): the
    log ratio of the two output histograms stays within epsilon up to sampling error."""
    cal = calibrate(Statistic.COUNT, Bounding(), PrivacyCost(epsilon=Fraction(1, 2)))
    mechanism = {"n": CellMechanism("*", cal)}
    n = 40_000
    a = add_noise(pd.DataFrame({"g": np.arange(n), "n": 10}), CellSpace.of("a", ["g"]),
                  mechanism, secret=SECRET, policy_version=1)  # fmt: skip
    b = add_noise(pd.DataFrame({"g": np.arange(n), "n": 11}), CellSpace.of("b", ["g"]),
                  mechanism, secret=OTHER, policy_version=1)  # fmt: skip
    xa = np.bincount(a.frame["n"].to_numpy() + 100, minlength=250)
    xb = np.bincount(b.frame["n"].to_numpy() + 100, minlength=250)
    both = (xa >= 400) & (xb >= 400)  # bins with enough draws for a ratio
    loss = np.abs(np.log(xa[both] / xb[both]))
    assert both.sum() >= 8
    assert loss.max() <= 0.5 + 0.2  # 400 draws: log-ratio sd about 0.07
    assert loss.mean() > 0.3  # and the loss is really there, close to epsilon


# --- statistic identities: what a query pays for before its cells are computed ---------------


def test_statistic_identity_covers_population_keys_domains_and_mechanism():
    from sqlsdc.mechanisms.dp_cells import statistic_identity

    cal = calibrate(Statistic.COUNT, Bounding(), PrivacyCost(epsilon=Fraction(1)))
    other = calibrate(Statistic.COUNT, Bounding(), PrivacyCost(epsilon=Fraction(1, 2)))
    space = CellSpace.of("t", {"__g0": '"t"."region"'}, scope='{"w":1}', data_version="v1")
    base = statistic_identity(space, CellMechanism("*", cal), [["N", "S"]])
    same = statistic_identity(CellSpace.of("t", {"r": '"t"."region"'}, scope='{"w":1}',
                                           data_version="v1"),
                              CellMechanism("*", cal), [["S", "N", "N"]])  # fmt: skip
    assert base == same  # column names and domain order do not matter
    variants = [
        statistic_identity(
            CellSpace.of("t", {"__g0": '"t"."region"'}, scope='{"w":2}', data_version="v1"),
            CellMechanism("*", cal),
            [["N", "S"]],
        ),  # fmt: skip
        statistic_identity(
            CellSpace.of("t", {"__g0": '"t"."region"'}, scope='{"w":1}', data_version="v2"),
            CellMechanism("*", cal),
            [["N", "S"]],
        ),  # fmt: skip
        statistic_identity(space, CellMechanism("*", cal), [["N", "S", "E"]]),
        statistic_identity(space, CellMechanism("*", cal), None),
        statistic_identity(space, CellMechanism('DISTINCT "t"."x"', cal), [["N", "S"]]),
        statistic_identity(space, CellMechanism("*", other), [["N", "S"]]),
    ]
    assert len({v.digest for v in variants} | {base.digest}) == len(variants) + 1
    cell = cell_identity(CellSpace.of("t", {}, scope='{"w":1}', data_version="v1"),
                         CellMechanism("*", cal), {})  # fmt: skip
    assert (
        cell.digest
        != statistic_identity(
            CellSpace.of("t", {}, scope='{"w":1}', data_version="v1"), CellMechanism("*", cal), []
        ).digest
    )  # a global cell is never mistaken for its statistic
