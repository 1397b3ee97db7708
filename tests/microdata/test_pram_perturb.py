"""PRAM on the digest's cases T1–T3, perturbation and coding by property, and the step parser."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from sqlsdc.errors import MicrodataError
from sqlsdc.microdata import perturb, pram
from sqlsdc.microdata.steps import apply_steps, generator, parse_step

SECRET = b"a server secret of 16+ bytes"


def test_nf_matrix_t1():
    T = np.array([5576, 24, 632])
    P = pram.matrix_f(0.6, T)
    expected = [[0.6, 0.3854, 0.0146], [0.0407, 0.6, 0.3593], [0.0017, 0.3983, 0.6]]
    assert P.round(4).tolist() == expected
    assert np.allclose(P.sum(axis=1), 1)
    assert (T @ P).round(2).tolist() == [3347.66, 2414.92, 469.42]  # not invariant


def test_gender_case_t2():
    P = np.array([[0.9, 0.1], [0.1, 0.9]])
    T = np.array([110, 90])
    assert (P.T @ T).tolist() == pytest.approx([108, 92])
    assert pram.unbiased_counts([108, 92], P) == pytest.approx([110, 90])
    assert pram.unbiased_counts([105, 95], P) == pytest.approx([106.25, 93.75])
    assert pram.pram_risk(T, P) == pytest.approx([99 / 108, 0.88043], abs=1e-5)


def test_builders_and_invariance_t3():
    expected = [[0.6, 0.4, 0, 0], [0.2, 0.6, 0.2, 0], [0, 0.2, 0.6, 0.2], [0, 0, 0.4, 0.6]]
    assert pram.matrix_b(0.6, 2, 4) == pytest.approx(np.array(expected))
    T = np.array([500, 300, 200])
    G = pram.matrix_invariant(T, 0.5)
    assert G.round(4).tolist() == [[0.8, 0.1, 0.1], [0.1667, 0.6667, 0.1667], [0.25, 0.25, 0.5]]
    assert T @ G == pytest.approx(T)
    T1 = np.array([5576, 24, 632])
    R = pram.make_invariant(pram.matrix_f(0.6, T1), T1)
    assert T1 @ R == pytest.approx(T1)
    assert R[1, 1] == pytest.approx(0.0102, abs=1e-4)  # the rare category's tiny diagonal


def test_invariant_pram_keeps_expected_frequencies():
    """Averaged over draws, invariant PRAM returns the original frequencies; plain nE does not."""
    values = pd.Series(["a"] * 600 + ["b"] * 300 + ["c"] * 100)
    T = values.value_counts().sort_index()
    R = pram.make_invariant(pram.matrix_e(0.7, 3), T.to_numpy())
    rng = np.random.default_rng(0)
    mean = np.mean(
        [pram.apply(values, R, T.index, rng).value_counts().sort_index() for _ in range(300)],
        axis=0,
    )
    assert mean == pytest.approx(T.to_numpy(), rel=0.02)
    var = pram.unbiased_variance(T.to_numpy(), R)
    assert np.all(np.diag(var) > 0)


def test_pram_apply_keeps_unknown_and_missing_values():
    s = pd.Series(["a", "b", None, "z"])
    out = pram.apply(s, np.eye(2), ["a", "b"], np.random.default_rng(1))
    assert out[[0, 1, 3]].tolist() == ["a", "b", "z"] and out.isna()[2]
    with pytest.raises(MicrodataError, match="rows of probabilities"):
        pram.apply(s, [[0.5, 0.2], [0.5, 0.5]], ["a", "b"], np.random.default_rng(1))


def test_noise_has_exact_moments():
    X = np.random.default_rng(2).standard_normal((500, 3)) @ [[1, 0.5, 0], [0, 1, 0.3], [0, 0, 2]]
    Y = perturb.add_noise(X, 0.2, np.random.default_rng(3))
    assert Y.mean(axis=0) == pytest.approx(X.mean(axis=0), abs=1e-9)
    assert np.cov(Y - X, rowvar=False) == pytest.approx(0.2 * np.cov(X, rowvar=False), abs=1e-8)


def test_rank_swap_is_a_permutation_within_the_window_t17():
    x = np.random.default_rng(4).lognormal(size=1000)
    y = perturb.rank_swap(x, 5, np.random.default_rng(5), top=0, bottom=0)
    assert np.array_equal(np.sort(x), np.sort(y))
    rank = np.argsort(np.argsort(x))
    moved = np.searchsorted(np.sort(x), y) - rank  # rank distance of each swap
    assert np.abs(moved).max() < 5 * 1000 / 100 and (moved != 0).mean() > 0.9


def test_rank_swap_codes_the_top_and_bottom_five_percent_to_their_means():
    """Fails on int49 (s49d): the swapped file held the original maximum and minimum exactly;
    sdcMicro's rankSwap (TopPercent = BottomPercent = 5) codes them to their means first."""
    x = np.random.default_rng(4).lognormal(size=1000)
    x[[3, 7]] = np.nan  # missing values stay where they are, outside the shares
    y = perturb.rank_swap(x, 5, np.random.default_rng(5))
    assert np.isnan(y[[3, 7]]).all() and not np.isnan(np.delete(y, [3, 7])).any()
    s = np.sort(x[~np.isnan(x)])  # 998 values: floor(49.9) = 49 coded at each end
    top, bottom = x >= s[-49], x <= s[48]
    assert top.sum() == bottom.sum() == 49
    assert np.nanmax(y) < np.nanmax(x) and np.nanmin(y) > np.nanmin(x)
    assert y[top] == pytest.approx(np.full(49, s[-49:].mean()))
    assert y[bottom] == pytest.approx(np.full(49, s[:49].mean()))
    assert np.nansum(y) == pytest.approx(np.nansum(x), rel=1e-12)  # the total is kept
    middle = ~top & ~bottom & ~np.isnan(x)
    assert np.array_equal(np.sort(y[middle]), s[49:-49])  # the rest is swapped among itself
    assert (y[middle] != x[middle]).mean() > 0.9


def test_rank_swap_step_takes_the_top_and_bottom_percents():
    df = pd.DataFrame({"income": np.random.default_rng(8).integers(0, 10**6, 2000)})
    top = df["income"].max()
    out, _ = apply_steps(df, [parse_step("rankswap:income:p=5")], secret=b"s" * 32, seed=0)
    assert out["income"].max() < top and out["income"].sum() == pytest.approx(df["income"].sum())
    out, _ = apply_steps(
        df, [parse_step("rankswap:income:p=5,top=10,bottom=0")], secret=b"s" * 32, seed=0
    )
    assert out["income"].min() == df["income"].min()
    assert (out["income"] == out["income"].max()).sum() == 200  # the top 10 % at their mean
    out, _ = apply_steps(
        df, [parse_step("rankswap:income:p=5,top=0,bottom=0")], secret=b"s" * 32, seed=0
    )
    assert sorted(out["income"]) == sorted(df["income"])  # switched off: a permutation
    for bad in ("top=-1", "top=60,bottom=40", "bottom=100"):
        with pytest.raises(MicrodataError, match="top and bottom"):
            apply_steps(df, [parse_step(f"rankswap:income:p=5,{bad}")], secret=b"s" * 32, seed=0)


def test_recode_and_top_code():
    s = pd.Series([5, 20, 40, 70, None])
    assert perturb.recode(s, [18, 65]).tolist() == ["<18", "18-65", "18-65", ">=65", None]
    assert perturb.top_code(pd.Series([1, 50, 900]), upper=100, lower=2).tolist() == [2, 50, 100]


@pytest.mark.parametrize("k", [2, 3, 5])
def test_local_suppression_reaches_k_anonymity(k):
    rng = np.random.default_rng(k)
    df = pd.DataFrame(
        {
            "region": rng.choice(list("ABCDEFG"), 400),
            "sex": rng.choice(list("FM"), 400),
            "age": rng.integers(0, 90, 400),
        }
    )
    out, counts = perturb.local_suppression(df, ["region", "sex", "age"], k, [1, 2, 3])
    assert not perturb._violators(out, ["region", "sex", "age"], k).any()
    assert counts["age"] > 0 and counts["age"] >= counts["region"]  # least important first
    assert sum(counts.values()) == int(out.isna().sum().sum())


def test_step_parser_and_errors():
    step = parse_step("microaggregate:income,age:k=5,method=optimal")
    assert step.columns == ("income", "age") and step.params == {"k": "5", "method": "optimal"}
    assert step.text() == "microaggregate:income,age:k=5,method=optimal"
    for text, match in [
        ("twirl:x", "unknown step 'twirl'; use one of microaggregate, noise, pram, "),
        ("microagregate:x:k=5", "unknown step 'microagregate'; did you mean microaggregate?"),
        ("pram:", "names no column"),
        ("pram:x", "needs p="),
        ("pram:x:p=1,q=2", "unknown parameter"),
        ("noise:x:c", "not NAME=VALUE"),
    ]:
        with pytest.raises(MicrodataError, match=match):
            parse_step(text)


def test_steps_are_reproducible_from_secret_and_seed():
    rng = np.random.default_rng(0)
    df = pd.DataFrame(
        {"edu": rng.choice(["p", "s", "t"], 300), "income": rng.lognormal(10, 1, 300)}
    )
    steps = [parse_step("pram:edu:p=0.7"), parse_step("noise:income:c=0.1")]
    a, log = apply_steps(df, steps, secret=SECRET, seed=1)
    b, _ = apply_steps(df, steps, secret=SECRET, seed=1)
    c, _ = apply_steps(df, steps, secret=SECRET, seed=2)
    d, _ = apply_steps(df, steps, secret=b"another secret of 16 bytes", seed=1)
    assert a.equals(b) and not a.equals(c) and not a.equals(d)
    assert log[0]["step"] == "pram:edu:p=0.7" and log[0]["edu"]["changed"] > 0
    g1, g2 = (generator(SECRET, 1, 0, steps[0]) for _ in range(2))
    assert g1.random() == g2.random()
    with pytest.raises(MicrodataError, match="columns nope not in the data; available: edu, "
                       "income$"):  # fmt: skip
        apply_steps(df, [parse_step("pram:nope:p=0.5")], secret=SECRET, seed=1)


def test_shuffle_keeps_marginals_and_rank_correlations():
    """Digest T17: shuffled columns are permutations; the dependence on S survives."""
    from scipy.stats import spearmanr

    rng = np.random.default_rng(9)
    s = rng.standard_normal(2000)
    x = np.exp(0.8 * s + 0.6 * rng.standard_normal(2000))  # confidential, skewed
    y = perturb.shuffle(x, s[:, None], np.random.default_rng(10))[:, 0]
    assert np.array_equal(np.sort(y), np.sort(x))
    assert spearmanr(y, s)[0] == pytest.approx(spearmanr(x, s)[0], abs=0.05)
    assert np.mean(y == x) < 0.05  # values moved between records
    df = pd.DataFrame({"x": x, "s": s})
    out, log = apply_steps(df, [parse_step("shuffle:x:given=s")], secret=SECRET, seed=1)
    assert np.array_equal(np.sort(out["x"]), np.sort(x)) and log[0]["given"] == ["s"]


@pytest.mark.parametrize("c", [float("nan"), float("inf"), 1e308])
def test_noise_levels_that_cannot_be_drawn_say_so(c):
    """NaN passed every check and inf or 1e308 overflowed c·Σ: numpy's errors and warnings
    reached the user as a bug in sqlsdc (exit 70)."""
    X = np.random.default_rng(0).lognormal(10, 1, (50, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning escapes either
        with pytest.raises(MicrodataError, match="c must be ≥ 0|cannot be drawn"):
            perturb.add_noise(X, c, np.random.default_rng(1))
    with pytest.raises(MicrodataError, match="not a finite number|cannot be drawn"):
        apply_steps(pd.DataFrame({"x": X[:, 0]}), [parse_step(f"noise:x:c={c}")],
                    secret=SECRET, seed=1)  # fmt: skip
