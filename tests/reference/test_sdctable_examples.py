"""sdcTable's published test cases, end to end: our secondary suppression against its patterns.

Source: sdcTools/sdcTable ``tests/testthat/test-protectTable.r`` (``protectTable works``) and
``R/protect_gauss.R``. The problem is ``microdata1`` (100 records, regions A-D by gender, cells
in sdcTable's order: Total, then each region's Total/male/female, 1-based) with one primary
cell, (A, female) of 2 records. sdcTable's default cost (``weights``) is the cell frequency.

* OPT, HYPERCUBE, HITAS and SIMPLEHEURISTIC suppress cells 5, 6, 11, 12: (A, male), (A, female),
  (C, male), (C, female) — the cheapest rectangle (C's 22 records against B's 33 and D's 25).
* GAUSS suppresses 5, 6, 14, 15 (region D): sdcTable hands SSBtools ``GaussSuppression``
  ``candidates = 1:ncol(m)``, the cell order, so the last cells are the first to be hidden; with
  (D, male) forced published (status "z") it gives 5, 6, 11, 12.
* Singletons: regions a, b, b, c with the frequency rule ``maxN = 1`` leave a = c = 1 primary;
  each of their respondents gets the other from Total - b (``detectSingletons = TRUE``: one
  more suppression; ``FALSE``: none).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import linprog

from sqlsdc.tabular.api import protect
from sqlsdc.tabular.gauss import gauss_suppress
from sqlsdc.tabular.model import build_table
from sqlsdc.tabular.rules import FrequencyRule

sys.path.insert(0, str(Path(__file__).parents[1] / "tabular"))
from test_rules import SDCTABLE_DIMS, microdata1  # noqa: E402

OPT_PATTERN = [5, 6, 11, 12]  # test-protectTable.r: OPT, HYPERCUBE, HITAS, SIMPLEHEURISTIC
GAUSS_PATTERN = [5, 6, 14, 15]  # test-protectTable.r: GAUSS (candidates in cell order)


def _table():
    return build_table(microdata1(), ["region", "gender"], None, hierarchies=SDCTABLE_DIMS)


def _a_female(cells: pd.DataFrame) -> np.ndarray:
    return ((cells["region"] == "A") & (cells["gender"] == "female")).to_numpy()


def _hidden(out: pd.DataFrame) -> list[int]:
    return (np.flatnonzero(out["status"].to_numpy() != "published") + 1).tolist()


def _attacker_interval(X, values, published, cell) -> tuple[float, float]:
    """The attacker's LP (our own, independent of sqlsdc's audit): min and max of ``cell`` over
    non-negative inner cells z with X.T @ z equal to every published cell."""
    Xd = X.toarray().astype(float)
    a_eq, b_eq = Xd[:, published].T, values[published]
    bounds = [(0, None)] * Xd.shape[0]
    lo = linprog(Xd[:, cell], A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs")
    hi = linprog(-Xd[:, cell], A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs")
    assert lo.status == 0 and hi.status == 0
    return lo.fun, -hi.fun


def test_microdata1_counts_are_sdctables():
    t = _table()
    cells = t.cells
    assert cells[["region", "gender"]].values.tolist()[:6] == [
        ["Total", "Total"], ["Total", "male"], ["Total", "female"],
        ["A", "Total"], ["A", "male"], ["A", "female"],
    ]  # fmt: skip
    assert cells["n"].tolist() == [100, 55, 45, 20, 18, 2, 33, 14, 19, 22, 12, 10, 25, 11, 14]


@pytest.mark.parametrize("method", ["optimal", "hitas", "gauss"])
def test_protect_table_one_primary_gives_sdctables_opt_pattern(method):
    """sdcTable OPT/HYPERCUBE/HITAS/SIMPLEHEURISTIC: cells 5, 6, 11, 12 (cost 18 + 12 + 10 =
    40 frequencies of secondaries; no other pattern costs as little)."""
    t = _table()
    out = protect(t, rules=[], primary=_a_female, method=method, cost="frequency")
    assert _hidden(out) == OPT_PATTERN
    secondary = out["status"] == "secondary"
    assert out.loc[secondary, "n"].sum() == 40
    # the attacker's LP cannot pin (A, female) = 2: it ranges over [0, 12]
    published = np.flatnonzero(out["status"].to_numpy() == "published")
    lo, hi = _attacker_interval(t.X, t.values, published, 5)
    assert (lo, hi) == pytest.approx((0.0, 12.0))
    assert out.loc[5, ["lo", "hi"]].tolist() == pytest.approx([0.0, 12.0])


def test_gauss_with_sdctables_candidate_order_gives_its_gauss_pattern():
    """sdcTable's GAUSS calls GaussSuppression with ``candidates = 1:ncol(m)``: a strictly
    decreasing cost puts our candidates in that order and gives its cells 5, 6, 14, 15; with
    (D, male) forced (status "z") its 5, 6, 11, 12."""
    t = _table()
    n_cells = len(t.cells)
    in_cell_order = np.arange(n_cells, 0, -1, dtype=float)
    primary = _a_female(t.cells)
    s = gauss_suppress(t.X, primary, in_cell_order, values=t.values)
    assert (np.flatnonzero(s) + 1).tolist() == GAUSS_PATTERN
    forced = ((t.cells["region"] == "D") & (t.cells["gender"] == "male")).to_numpy()
    s = gauss_suppress(t.X, primary, in_cell_order, forced=forced, values=t.values)
    assert (np.flatnonzero(s) + 1).tolist() == OPT_PATTERN


def test_our_gauss_default_order_is_no_costlier_than_sdctables_gauss():
    """With GaussSuppression's own ``CandidatesDefault`` order (cost n + 1), region C (22
    records) is hidden, not D (25) as sdcTable's cell-order candidates give."""
    t = _table()
    s = gauss_suppress(t.X, _a_female(t.cells), t.n + 1.0, values=t.values)
    assert (np.flatnonzero(s) + 1).tolist() == OPT_PATTERN
    peer = np.zeros(len(t.cells), bool)
    peer[np.array(GAUSS_PATTERN) - 1] = True
    assert t.n[s].sum() < t.n[peer].sum()


@pytest.mark.parametrize("method", ["gauss", "optimal", "hitas"])
def test_two_singletons_that_complete_each_other_get_a_third_suppression(method):
    """test-protectTable.r: a, b, b, c with maxN = 1: ``detectSingletons = TRUE`` adds one
    suppression. Every method adds b (GaussSuppression's ``anySum``): with a and c alone
    hidden, a's respondent gets c = Total - b - a. (Before s44d the optimal and HiTaS methods
    published b, as sdcTable's ``detectSingletons = FALSE``.)"""
    df = pd.DataFrame({"region": ["a", "b", "b", "c"]})
    t = build_table(df, ["region"], None, hierarchies={"region": dict.fromkeys("abcd")})
    out = protect(t, rules=[FrequencyRule(min_freq=2)], method=method, cost="frequency")
    assert out["status"].tolist() == ["published", "primary", "secondary", "primary"]
    # the respondent of a knows a = 1: the published cells leave c in [0, 3 - 0], not 1
    published = np.flatnonzero(out["status"].to_numpy() == "published")
    X = t.X.toarray()
    Xd = X[X[:, 1] == 0]  # a's inner cell removed: a respondent subtracts their own 1
    lo, hi = _attacker_interval(type(t.X)(Xd), t.values - X[X[:, 1] == 1].sum(axis=0), published, 3)
    assert hi - lo > 0


# --- test-simpleheuristic.R: a pattern with two suppressions per line that still discloses ------

SIMPLE_INNER = {
    ("w", "a"): 30, ("w", "b"): 47, ("w", "c"): 64, ("w", "d"): 89,
    ("x", "a"): 90, ("x", "b"): 124, ("x", "c"): 5, ("x", "d"): 31,
    ("y", "a"): 92, ("y", "b"): 100, ("y", "c"): 59, ("y", "d"): 85,
    ("z", "a"): 800, ("z", "b"): 991, ("z", "c"): 651, ("z", "d"): 685,
}  # fmt: skip
SIMPLE_PRIMARY = {("w", "a"), ("w", "b"), ("w", "c"), ("x", "a"), ("x", "c"), ("y", "b"),
                  ("y", "d"), ("z", "b"), ("z", "d")}  # fmt: skip


def _simple_table():
    from sqlsdc.tabular.model import Table

    df = pd.DataFrame([(a, b, v) for (a, b), v in SIMPLE_INNER.items()], columns=["v1", "v2", "f"])
    return Table.from_cells(df, ["v1", "v2"], value="f", n="f")


def _simple_mask(cells: pd.DataFrame) -> np.ndarray:
    return np.array(
        [(a, b) in SIMPLE_PRIMARY for a, b in zip(cells["v1"], cells["v2"], strict=True)]
    )


def test_simpleheuristic_trap_is_exact_without_secondaries():
    """Every row and column has two or more of the 9 primaries, yet (w, b) = 47 is computable
    (sdcTable's SIMPLEHEURISTIC_OLD leaves it so)."""
    t = _simple_table()
    published = np.flatnonzero(~_simple_mask(t.cells))
    wb = int(np.flatnonzero((t.cells["v1"] == "w") & (t.cells["v2"] == "b"))[0])
    assert _attacker_interval(t.X, t.values, published, wb) == pytest.approx((47.0, 47.0))


@pytest.mark.parametrize("method", ["optimal", "hitas", "gauss"])
def test_simpleheuristic_adds_sdctables_one_suppression(method):
    """sdcTable's SIMPLEHEURISTIC adds one suppression and ``attack`` gives (w, b) in [0, 78]:
    with small protection levels (1 %) and frequency costs every method adds (x, d) = 31 and
    leaves the same interval. (With τ-ARGUS's 10 % manual levels (w, c) = 64 would need up to
    70.4 while (x, d) alone leaves it at most 69, so two cells are hidden.)"""
    from sqlsdc.tabular.rules import ManualRule

    t = _simple_table()
    out = protect(t, rules=[ManualRule(_simple_mask, safety_range=1)], method=method,
                  cost="frequency")  # fmt: skip
    secondary = out[out["status"] == "secondary"]
    assert secondary[["v1", "v2", "value"]].values.tolist() == [["x", "d", 31.0]]
    published = np.flatnonzero(out["status"].to_numpy() == "published")
    wb = int(np.flatnonzero((out["v1"] == "w") & (out["v2"] == "b"))[0])
    assert _attacker_interval(t.X, t.values, published, wb) == pytest.approx((0.0, 78.0))
    assert out.loc[wb, ["lo", "hi"]].tolist() == pytest.approx([0.0, 78.0])
