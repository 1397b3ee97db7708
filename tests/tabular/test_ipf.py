"""IPF against hand computations and closed forms; MDI-CTA step (digest §11 T9); errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sqlsdc.errors import TabularError
from sqlsdc.tabular import ipf
from sqlsdc.tabular.ipf import rake


def seed2(values, rows="ab", cols="xyz"):
    values = np.asarray(values, dtype=float)
    idx = pd.MultiIndex.from_product([list(rows[: values.shape[0]]), list(cols[: values.shape[1]])],
                                     names=["r", "c"])  # fmt: skip
    return pd.Series(values.ravel(), index=idx)


def margin(values, codes, name):
    return pd.Series(np.asarray(values, dtype=float), index=pd.Index(list(codes), name=name))


def test_uniform_seed_gives_the_independence_table_in_one_cycle():
    rows, cols = [3.0, 7], [2.0, 5, 3]
    out = ipf(seed2(np.ones((2, 3))), [margin(rows, "ab", "r"), margin(cols, "xyz", "c")])
    assert out.values.to_numpy() == pytest.approx(np.outer(rows, cols).ravel() / 10)
    assert out.iterations == 1 and out.converged


def test_two_by_three_one_cycle_by_hand():
    # row step: [1,2,3]·12/6 = [2,4,6]; [4,5,6]·9/15 = [2.4,3,3.6]; column step on sums
    # [4.4, 7, 9.6] with targets [5, 7, 9]
    g_r, g_c = np.repeat([0, 1], 3), np.tile([0, 1, 2], 2)
    x, it, _, ok = rake(np.arange(1.0, 7), [g_r, g_c], [np.array([12.0, 9]),
                        np.array([5.0, 7, 9])], max_iter=1)  # fmt: skip
    expected = [2 * 5 / 4.4, 4, 6 * 9 / 9.6, 2.4 * 5 / 4.4, 3, 3.6 * 9 / 9.6]
    assert x == pytest.approx(expected) and it == 1 and not ok


def test_two_by_two_keeps_the_seed_odds_ratio_closed_form():
    # seed odds ratio (1·4)/(2·3) = 2/3; margins all 5 give [[x, 5-x], [5-x, x]] with
    # x²/(5-x)² = 2/3, so x = 5·√(2/3)/(1+√(2/3))
    out = ipf(seed2([[1, 2], [3, 4]], cols="xy"),
              [margin([5, 5], "ab", "r"), margin([5, 5], "xy", "c")])  # fmt: skip
    q = np.sqrt(2 / 3)
    x = 5 * q / (1 + q)
    assert out.values.to_numpy() == pytest.approx([x, 5 - x, 5 - x, x], abs=1e-8)


def test_factorises_and_keeps_zeros():
    seed = seed2([[4, 0, 2], [1, 3, 5]])
    out = ipf(seed, [margin([10, 12], "ab", "r"), margin([6, 7, 9], "xyz", "c")])
    fitted = out.values.to_numpy().reshape(2, 3)
    assert fitted[0, 1] == 0
    assert fitted.sum(axis=1) == pytest.approx([10, 12]) and out.max_error <= 1.2e-8
    ratio = fitted / np.where(seed.to_numpy().reshape(2, 3) > 0, seed.to_numpy().reshape(2, 3), 1)
    # IPF optimality: fitted/seed = α_r β_c on the non-zero cells
    assert ratio[0, 0] / ratio[1, 0] == pytest.approx(ratio[0, 2] / ratio[1, 2])


def test_three_way_table_with_two_way_margins():
    rng = np.random.default_rng(0)
    truth = rng.uniform(1, 10, (2, 3, 2))
    idx = pd.MultiIndex.from_product([["a", "b"], ["x", "y", "z"], ["u", "v"]],
                                     names=["r", "c", "d"])  # fmt: skip
    t = pd.Series(truth.ravel(), index=idx)
    margins = [t.groupby(level=["r", "c"]).sum(), t.groupby(level=["c", "d"]).sum(),
               t.groupby(level=["r", "d"]).sum()]  # fmt: skip
    out = ipf(pd.Series(1.0, index=idx), margins)
    for m in margins:
        assert out.values.groupby(level=list(m.index.names)).sum().to_numpy() == pytest.approx(
            m.to_numpy(), abs=1e-7
        )


def test_dataframe_seed_is_accepted():
    frame = seed2(np.ones((2, 2)), cols="xy").rename("value").reset_index()
    out = ipf(frame, [margin([1, 3], "ab", "r")])
    assert out.values.to_numpy() == pytest.approx([0.5, 0.5, 1.5, 1.5])


def test_paper_stopping_rule_leaves_t9_non_additive():
    # digest §11 T9, U run: the 0.25/25 rule stops after 2 cycles with row sums
    # (79.889, 49.158, 60.952) — not additive to a tight tolerance
    orig = np.array([[20.0, 50, 10], [8, 19, 22], [17, 32, 12]])
    free = np.ones(9, bool)
    free[3] = False
    g_r, g_c = np.repeat(np.arange(3), 3)[free], np.tile(np.arange(3), 3)[free]
    targets = [orig.sum(1) - [0, 11, 0], orig.sum(0) - [11, 0, 0]]
    x, it, err, ok = rake(orig.ravel()[free], [g_r, g_c], targets, tol=0.25, max_iter=25)
    full = np.zeros(9)
    full[free], full[3] = x, 11
    assert it == 2 and ok and err > 1e-6
    assert full.reshape(3, 3).sum(1) == pytest.approx([79.889, 49.158, 60.952], abs=1e-3)
    x, it, err, ok = rake(orig.ravel()[free], [g_r, g_c], targets)
    full[free] = x
    k = float(np.sum(full * np.log(full / orig.ravel())))
    assert ok and k == pytest.approx(0.800782, abs=1e-6)


def test_inconsistent_margins_are_refused():
    with pytest.raises(TabularError, match="different grand totals"):
        ipf(seed2(np.ones((2, 3))), [margin([3, 7], "ab", "r"), margin([2, 5, 4], "xyz", "c")])
    s3 = pd.Series(1.0, index=pd.MultiIndex.from_product([["a", "b"], ["x", "y"], ["u", "v"]],
                                                         names=["r", "c", "d"]))  # fmt: skip
    rc = s3.groupby(level=["r", "c"]).sum()
    rd = s3.groupby(level=["r", "d"]).sum() * np.array([1, 1, 2, 1])
    with pytest.raises(TabularError, match=r"disagree on their common margin over \['r'\]"):
        ipf(s3, [rc, rd])


def test_zero_patterns_that_cannot_fit():
    with pytest.raises(TabularError, match="no positive seed cell"):
        ipf(seed2([[0, 0], [1, 1]], cols="xy"), [margin([1, 1], "ab", "r")])
    with pytest.raises(TabularError, match="did not converge in 50 cycles"):
        ipf(seed2([[1, 0], [0, 1]], cols="xy"),
            [margin([1, 2], "ab", "r"), margin([2, 1], "xy", "c")], max_iter=50)  # fmt: skip


def test_bad_inputs():
    with pytest.raises(TabularError, match="no target for 'b'"):
        ipf(seed2(np.ones((2, 2)), cols="xy"), [margin([1], "a", "r")])
    with pytest.raises(TabularError, match="not all of"):
        ipf(seed2(np.ones((2, 2)), cols="xy"), [margin([1], "a", "zz")])
    with pytest.raises(TabularError, match="non-negative seed"):
        rake(np.array([-1.0, 1]), [np.array([0, 0])], [np.array([1.0])])
