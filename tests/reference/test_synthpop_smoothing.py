"""synthpop's ``smoothing = "density"`` (1.9-3, R/functions.syn.r ``syn.smooth``) and R's
``bw.SJ`` (stats/R/bandwidths.R, src/bandwidths.c), end to end.

Before s44d, ``synthesize_cart`` smoothed leaf by leaf with Silverman's bandwidth of each leaf's
donors, and never smoothed the first variable of the visit sequence; synthpop smooths the whole
synthetic vector of a variable at once with the Sheather-Jones bandwidth of the values drawn
(``density(ysyn, width = "SJ")$bw``), in ``syn.sample`` (the first variable) as in ``syn.cart``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import brentq

from sqlsdc.errors import SynthesisError
from sqlsdc.synth.cart import synthesize_cart
from sqlsdc.synth.smoothing import bw_sj, smooth_density


def _exact_sj(x: np.ndarray) -> float:
    """Sheather & Jones (1991) "solve-the-equation" bandwidth with exact pair sums (no bins)
    and a tight root: ψ_r(g) = Σ_(i,j) φ^(r)((x_i - x_j)/g) / (n(n-1) g^(r+1)), the
    diagonal included as R includes it, and h = (1/(2√π n ψ4(α2 h^(5/7))))^(1/5)."""
    n = len(x)
    u2 = ((x[:, None] - x[None, :]) ** 2).ravel()

    def psi(g, r):
        z = u2 / g**2
        if r == 4:
            k = (z * z - 6 * z + 3) * np.exp(-z / 2)
        else:
            k = (z**3 - 15 * z * z + 45 * z - 15) * np.exp(-z / 2)
        return k.sum() / (n * (n - 1.0) * g ** (r + 1) * np.sqrt(2 * np.pi))

    q75, q25 = np.percentile(x, [75, 25])
    scale = min(np.std(x, ddof=1), (q75 - q25) / 1.349)
    a, b = 1.24 * scale * n ** (-1 / 7), 1.23 * scale * n ** (-1 / 9)
    alph2 = 1.357 * (psi(a, 4) / -psi(b, 6)) ** (1 / 7)
    c1 = 1 / (2 * np.sqrt(np.pi) * n)
    hmax = 1.144 * scale * n ** (-1 / 5)
    f = lambda h: (c1 / psi(alph2 * h ** (5 / 7), 4)) ** 0.2 - h  # noqa: E731
    return brentq(f, 0.05 * hmax, 2 * hmax, xtol=1e-12)


@pytest.mark.parametrize(
    "sample",
    [
        lambda rng: rng.normal(50, 10, 300),  # R's pair-count path (n <= nb/2 = 500)
        lambda rng: rng.lognormal(3, 0.6, 400),
        lambda rng: np.concatenate([rng.normal(0, 1, 250), rng.normal(8, 2, 250)]),
        lambda rng: rng.normal(0, 1, 1500),  # R's binned path (n > 500)
    ],
)
def test_bw_sj_solves_the_sheather_jones_equation(sample):
    """R's binned ψ estimates and its root tolerance 0.1·lower (1 % of hmax) keep bw.SJ within
    2 % of the exact solution of the equation."""
    x = sample(np.random.default_rng(11))
    assert bw_sj(x) == pytest.approx(_exact_sj(x), rel=0.02)


def test_bw_sj_refuses_what_r_refuses():
    with pytest.raises(SynthesisError, match="at least 2"):
        bw_sj([1.0])
    with pytest.raises(SynthesisError, match="too"):
        bw_sj(np.r_[np.zeros(50), 1.0, 2.0])  # IQR 0: R's "sample is too sparse"


def test_one_bandwidth_for_the_whole_vector():
    """Each smoothed value moves by N(0, h²), h = bw.SJ of all the values drawn."""
    rng = np.random.default_rng(3)
    y = np.round(rng.normal(1000, 100, 20_000), 2)
    out = smooth_density(y, y, np.random.default_rng(4))
    h = bw_sj(y)
    assert np.std(out - y) == pytest.approx(h, rel=0.03)
    # clipped to [min, max + h], then rounded (as R: round after pmin/pmax)
    assert out.min() >= y.min() and out.max() <= y.max() + h + 0.005
    assert np.all(out == np.round(out, 2))  # the observed decimals


def test_a_value_over_70_percent_stays():
    rng = np.random.default_rng(5)
    y = np.concatenate([np.zeros(800), rng.uniform(1, 50, 200).round()])
    out = smooth_density(y, y, np.random.default_rng(6))
    assert np.all(out[y == 0] == 0)
    assert np.mean(out[y > 0] != y[y > 0]) > 0.8


def test_a_top_coded_maximum_stays_and_caps_the_values():
    """10·t[k-1] < t[k] - t[k-1]: 300 records at 100 against 10 at 89 or so."""
    rng = np.random.default_rng(7)
    y = np.concatenate([np.round(rng.uniform(0, 90, 900)), np.full(300, 100.0)])
    out = smooth_density(y, y, np.random.default_rng(8))
    assert np.all(out[y == 100] == 100) and out.max() == 100
    assert np.mean(out[y < 100] != y[y < 100]) > 0.8


def test_the_first_variable_is_smoothed_as_syn_sample_does():
    """Fails before s44d: the first variable was drawn from the originals and left alone."""
    rng = np.random.default_rng(9)
    frame = pd.DataFrame({"income": np.round(rng.lognormal(10, 0.5, 2000), 0)})
    syn, details = synthesize_cart(frame, rng=np.random.default_rng(1), smoothing=True)
    assert details["smoothing"] == ["income"]
    assert np.mean(~syn["income"].isin(frame["income"])) > 0.5
    assert syn["income"].min() >= frame["income"].min()


def test_cart_smooths_with_the_bandwidth_of_all_drawn_values():
    """A tight leaf (sd 1) beside a wide one (sd 30): synthpop's one bandwidth of the whole
    vector (here about 0.52) widens the tight leaf's synthetic values by h² in variance, about
    15 % in sd (seeds 0-2: 1.16, 1.16, 1.14); the per-leaf bandwidths before s44d (0.9·n^-0.2
    of the leaf's sd, about 0.23) moved it 1-7 % (1.05, 1.07, 1.01)."""
    rng = np.random.default_rng(12)
    g = np.repeat(["a", "b"], 1000)
    noise = np.where(g == "a", rng.normal(0, 1, 2000), rng.normal(0, 30, 2000))
    y = np.where(g == "a", 0.0, 100.0) + np.round(noise, 3)
    frame = pd.DataFrame({"g": g, "y": y})
    assert bw_sj(y) == pytest.approx(0.52, abs=0.01)
    for seed in range(3):
        syn, _ = synthesize_cart(frame, rng=np.random.default_rng(seed), smoothing=["y"],
                                 min_leaf=200)  # fmt: skip
        widened = syn.loc[syn["g"] == "a", "y"].std() / y[g == "a"].std()
        assert widened > 1.10


def test_a_node_under_three_leaves_is_not_split_as_rpart():
    """synthpop's syn.cart calls rpart(minbucket = 5, cp = 1e-8); rpart.control then sets
    minsplit = 3 · minbucket = 15. Twelve records (5 of a with y = 0, 7 of b with y = 100)
    form one leaf, so a synthetic a takes y = 100 about 7/12 of the time; before s44d the tree
    split them (scikit-learn's min_samples_split = 2) and every a got 0."""
    frame = pd.DataFrame({"x": ["a"] * 5 + ["b"] * 7, "y": [0.0] * 5 + [100.0] * 7})
    syn, details = synthesize_cart(frame, rng=np.random.default_rng(3), n=2000)
    assert details["leaves"]["y"] == 1
    share = (syn.loc[syn["x"] == "a", "y"] == 100).mean()
    assert share == pytest.approx(7 / 12, abs=0.05)
    big = pd.concat([frame] * 2, ignore_index=True)  # 24 records: 10 a, 14 b, split at 15+
    _, details = synthesize_cart(big, rng=np.random.default_rng(3), n=100)
    assert details["leaves"]["y"] == 2
