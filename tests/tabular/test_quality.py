"""Information-loss measures on hand-computed examples."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sqlsdc.errors import TabularError
from sqlsdc.tabular import Table, quality


def table2(values, rows="ab", cols="xy"):
    values = np.asarray(values, dtype=float)
    recs = [(r, c, values[i, j], 5) for i, r in enumerate(rows) for j, c in enumerate(cols)]
    return Table.from_cells(pd.DataFrame(recs, columns=["r", "c", "value", "n"]), ["r", "c"])


def inner_to_cells(table, inner):
    """All cells of ``table`` for a protected inner table (margins as sums)."""
    inner = np.asarray(inner, dtype=float).ravel()
    return np.asarray(table.X.T @ inner[np.argsort(table.inner)]).ravel()


def test_single_distribution_by_hand():
    q = quality([4.0, 1, 9], [4.0, 0, 10])
    assert q.hd == pytest.approx(np.sqrt(0.5 * (1 + (np.sqrt(10) - 3) ** 2)))
    assert q.rad == pytest.approx(1 + 1 / 9)
    assert q.aad == pytest.approx(2 / 3)
    assert q.chi2 == pytest.approx(1 / 1 + 1 / 9)  # Cox–Kim: Σ (R−x)²/x
    assert q.max_abs_change == 1.0 and q.max_rel_change == 1.0 and q.max_rel_change_cell == 1


def test_rows_totals_and_margins_on_a_table():
    t = table2([[10, 0], [6, 4]])
    o = t.values
    p = inner_to_cells(t, [[8, 0], [6, 6]])  # rows: 10 → 8, 10 → 12
    q = quality(o, p, t)
    assert q.n_rows == 2 and q.n_cells == 4
    assert q.aad == pytest.approx(((2 + 0) / 2 + (0 + 2) / 2) / 2)
    assert q.rad == pytest.approx((2 / 10 + 2 / 4) / 2)  # the zero cell is skipped
    assert q.rat == pytest.approx(2 / 10 + 2 / 10) and q.at == pytest.approx(4 / 2)
    hd_a = np.sqrt(0.5 * (np.sqrt(8) - np.sqrt(10)) ** 2)
    hd_b = np.sqrt(0.5 * (np.sqrt(6) - 2) ** 2)
    assert q.hd == pytest.approx((hd_a + hd_b) / 2)
    # margins: a 10→8, b 10→12, x 16→14, y 4→6, total unchanged
    assert q.aad_totals == pytest.approx(8 / 5)
    assert q.max_additivity_error == pytest.approx(0.0)
    assert q.max_abs_change == 2.0 and q.max_rel_change == pytest.approx(0.5)
    assert q.max_rel_change_cell["c"] == "y"  # (b, y) and the y total both moved by 50 %
    assert q.rav == pytest.approx(100 * (16 - 26) / 26)  # row variances (50, 2) → (32, 0)


def test_non_additive_protection_is_measured():
    t = table2([[10, 0], [6, 4]])
    p = t.values.copy()
    p[list(t.inner)[0]] += 1.5  # one inner cell moved, margins left alone
    assert quality(t.values, p, t).max_additivity_error == pytest.approx(1.5)


def test_cramers_v_entropy_and_variance_changes():
    t = table2([[10, 0], [0, 10]])
    p = inner_to_cells(t, [[5, 5], [5, 5]])
    q = quality(t.values, p, t)
    assert q.rcv == pytest.approx(-100.0)  # V: 1 → 0
    assert np.isnan(q.entt)  # the original rows have entropy 0: no relative change
    back = quality(p, t.values, t)
    assert back.entt == pytest.approx(-100.0)  # ENT: 2 ln 2 → 0


def test_rank_groups_and_sensitive_chi2():
    o = np.arange(1.0, 21)
    p = o.copy()
    p[[0, 19]] = p[[19, 0]]  # the smallest and the largest swap places
    q = quality(o, p, columns=np.zeros(20), rank_groups=2)
    assert q.rc_mean == pytest.approx(10.0) and q.rc_columns_over_20 == 0
    sens = np.zeros(20, bool)
    sens[0] = True
    q = quality(o, p, sensitive=sens)
    assert q.chi2_nonsensitive == pytest.approx(19**2 / 20)
    assert q.chi2 == pytest.approx(19**2 / 1 + 19**2 / 20)


def test_errors():
    with pytest.raises(TabularError, match="differ in length"):
        quality([1.0, 2], [1.0])
    t = table2([[1, 2], [3, 4]])
    with pytest.raises(TabularError, match="has 9 cells but 2 values"):
        quality([1.0, 2], [1.0, 2], t)
    with pytest.raises(TabularError, match="rows must be dimensions"):
        quality(t.values, t.values, t, rows=["zz"])
    with pytest.raises(TabularError, match="missing values"):
        quality([1.0, np.nan], [1.0, 2])


def test_to_dict_roundtrip():
    d = quality([1.0, 2], [1.0, 3]).to_dict()
    assert d["max_abs_change"] == 1.0 and "hd" in d and "chi2" in d
