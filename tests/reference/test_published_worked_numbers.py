"""Published worked numbers that no other test pins, reproduced digit for digit (session 47).

* Templ, "Software development for SDC in R", PSD 2006 (LNCS 4302) pp. 347-359: the attacker's
  LP intervals of a suppressed 4x6 magnitude table, two suppression patterns (digest
  ../shared/reference/seed_2006_microdata.md, T6, "both sets match the paper exactly").
  sqlsdc's attacker is :func:`sqlsdc.tabular.attacker.audit_intervals`.
* Domingo-Ferrer & Sebé, "Optimal multivariate 2-microaggregation", PSD 2006 pp. 129-138:
  x = (0, 1, 10, 11, 12), the optimal 2-partition {0, 1}, {10, 11, 12} with SSE 2.5 (digest T9).
* Massell, Zayatz & Funk, PSD 2006 pp. 304-317 (digest T10): the unweighted p% rule, X1 = 100,
  X2 = 50, T = 150, p = 10 gives protection 10 (sensitive). Their rounding-term and weighted
  variants are EZS-specific and are not sqlsdc's (τ-ARGUS) rule.
* Cox & Kim, "Effects of rounding on the quality and confidentiality of statistical data",
  PSD 2006, Table 3: sum over r = 1..9 of E[(R - r)^2 | r]/r at base 10 is 45 (unbiased),
  24305/252 = 96.448 (50/50, zero-restricted) and 2465/126 = 19.563 (modified conventional)
  (digest ../shared/reference/seed_2006_tabular.md, T2).
* Desfontaines, Voss, Gipson & Mandayam, "Differentially private partition selection", PoPETs
  2022, Theorem 1: the optimal keep probability against discrete-Laplace thresholding at
  epsilon = 1, delta = 1e-6 (the figures sqlsdc's partition module states: 0.70 and 0.27).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from scipy import sparse

from sqlsdc.mechanisms.partition import (
    laplace_partition_selection,
    optimal_keep_probability,
    release_probability,
)
from sqlsdc.microdata.microaggregation import improve, mdav, sse
from sqlsdc.microdata.risk import interval_disclosure
from sqlsdc.tabular.attacker import audit_intervals
from sqlsdc.tabular.rounding import (
    round_modified_conventional,
    round_unbiased,
    round_zero_restricted,
)
from sqlsdc.tabular.rules import CellStats, PPercentRule

# Templ (2006): inner cells; rows sum to 260, 623, 114, 330, columns to 600, 154, 107, 205,
# 101, 160, grand total 1327. Column 7 ("EU") is the row total, row 5 the column totals.
INNER = np.array(
    [[20, 70, 90, 30, 20, 30],
     [500, 1, 1, 50, 1, 70],
     [10, 3, 6, 25, 50, 20],
     [70, 80, 10, 100, 30, 40]], dtype=float,
)  # fmt: skip
EU = 7
PATTERN = [(1, 5), (1, EU), (2, 2), (2, 3), (2, 4), (2, 5), (3, 4), (3, 5), (4, 2), (4, 3), (4, EU)]
INTERVALS = {  # Templ (2006), first pattern
    (1, 5): (18, 71), (1, EU): (258, 311), (2, 2): (0, 53), (2, 3): (0, 11), (2, 4): (0, 53),
    (2, 5): (0, 53), (3, 4): (22, 75), (3, 5): (0, 53), (4, 2): (28, 81), (4, 3): (0, 11),
    (4, EU): (279, 332),
}  # fmt: skip
WIDER = {  # the same with the totals of rows 2 and 3 hidden as well
    (1, 5): (0, 71), (1, EU): (240, 311), (2, 2): (0, 81), (2, 3): (0, 11), (2, 4): (0, 75),
    (2, 5): (0, 71), (2, EU): (570, 808), (3, 4): (0, 75), (3, 5): (0, 71), (3, EU): (39, 185),
    (4, 2): (0, 81), (4, 3): (0, 11), (4, EU): (240, 332),
}  # fmt: skip


def _table() -> tuple[sparse.csr_matrix, np.ndarray]:
    """The 5x7 table (margins included), row-major, and its 12 additivity equations."""
    full = np.zeros((5, 7))
    full[:4, :6] = INNER
    full[:4, 6] = INNER.sum(axis=1)
    full[4] = full[:4].sum(axis=0)
    rows = []
    for r in range(5):  # each row: its six cells minus its total
        a = np.zeros((5, 7))
        a[r, :6], a[r, 6] = 1, -1
        rows.append(a.ravel())
    for c in range(7):  # each column: its four cells minus its total
        a = np.zeros((5, 7))
        a[:4, c], a[4, c] = 1, -1
        rows.append(a.ravel())
    return sparse.csr_matrix(np.array(rows)), full.ravel()


def _index(cell: tuple[int, int]) -> int:
    r, c = cell
    return (r - 1) * 7 + (c - 1)


@pytest.mark.parametrize("expected", [INTERVALS, WIDER], ids=["pattern", "wider"])
def test_templ_2006_lp_intervals(expected):
    A, values = _table()
    assert values[_index((1, EU))] == 260 and values[-1] == 1327
    hidden = np.zeros(len(values), dtype=bool)
    hidden[[_index(c) for c in expected]] = True
    res = audit_intervals(
        A, values, hidden, lower=np.zeros(len(values)), upper=np.full(len(values), np.inf)
    )
    got = {c: (res.lo[_index(c)], res.hi[_index(c)]) for c in expected}
    assert got == pytest.approx(expected, abs=1e-6)
    assert res.exact[hidden].all()


def test_domingo_ferrer_sebe_2006_optimal_2_partition():
    x = np.array([0.0, 1, 10, 11, 12])[:, None]
    labels = mdav(x, 2)
    assert sorted(sorted(x[labels == g, 0].tolist()) for g in set(labels)) == [
        [0, 1], [10, 11, 12],
    ]  # fmt: skip
    assert sse(x, labels) == pytest.approx(2.5)
    assert sse(x, improve(x, 2, labels=labels, seed=1)) == pytest.approx(2.5)  # the optimum


def test_massell_zayatz_funk_2006_p_percent_protection():
    s = CellStats(n=np.array([2]), value=np.array([150.0]), total=np.array([150.0]),
                  top=np.array([[100.0, 50.0]]))  # fmt: skip
    r = PPercentRule(p=10).evaluate(s)
    assert bool(r.sensitive[0]) and float(r.upl[0]) == pytest.approx(10.0)


def test_desfontaines_2022_small_groups_kept_as_stated():
    eps, delta = Fraction(1), Fraction(1, 10**6)
    assert float(optimal_keep_probability(14, eps, delta)) == pytest.approx(0.699887, abs=1e-6)
    sel = laplace_partition_selection(eps, delta, max_groups=1)
    assert sel.threshold == 15
    assert release_probability(14, sel.scale, sel.threshold) == pytest.approx(
        1 / (1 + np.e), rel=1e-12
    )  # P(Z >= 1) = q/(1 + q), q = 1/e


def test_sd_interval_disclosure_scores_columns_not_records_as_sdcmicros_drisk_does():
    """sdcMicro ``dRiskWORK`` (sdcTools/sdcMicro R/dRisk.R) counts the records with at most one
    column strictly outside masked ± k·sd(masked); ours averages the per-column shares (the
    documented difference). One column kept, one moved far: dRisk 100 %, ours 50 %."""
    x = pd.DataFrame({"a": np.arange(100.0), "b": np.arange(100.0)})
    masked = x.assign(b=x["b"] + 1000)
    sds = masked.std()
    outside = (x < masked - 0.1 * sds) | (x > masked + 0.1 * sds)
    drisk = float(outside.sum(axis=1).isin([0, 1]).mean())
    assert drisk == 1.0
    ours = interval_disclosure(x, masked, p=[10], method="sd")
    assert ours["per_column"] == {"a": [100.0], "b": [0.0]} and ours["overall"] == 50.0


@pytest.mark.parametrize(
    ("rule", "expected"),
    [(round_unbiased, Fraction(45)), (round_zero_restricted, Fraction(24305, 252)),
     (round_modified_conventional, Fraction(2465, 126))],
    ids=["unbiased", "50/50", "modified"],
)  # fmt: skip
def test_cox_kim_2006_table_3_relative_mse(rule, expected):
    base = 10
    u = (np.arange(2 * base) + 0.5) / (2 * base)  # exact probabilities 1/2 and r/B
    total = Fraction(0)
    for r in range(1, base):
        rounded = rule(np.full(len(u), r), base, u)
        total += Fraction(int(((rounded - r) ** 2).sum()), len(u)) / r
    assert total == expected
