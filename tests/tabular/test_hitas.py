"""hitas_suppress: sub-tables of hierarchical tables, protection over the WHOLE table."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from scipy.optimize import linprog

import sqlsdc.tabular.hitas as hitas
from sqlsdc.errors import TabularError
from sqlsdc.tabular.hitas import _Table, hitas_suppress
from sqlsdc.tabular.optimal import optimal_suppress

# two levels in both dimensions, with a leaf (B3) at the first level
HR = {
    "Total": None,
    "A1": "Total",
    "A2": "Total",
    "A11": "A1",
    "A12": "A1",
    "A13": "A1",
    "A21": "A2",
    "A22": "A2",
}
HC = {
    "Total": None,
    "B1": "Total",
    "B2": "Total",
    "B3": "Total",
    "B11": "B1",
    "B12": "B1",
    "B21": "B2",
    "B22": "B2",
    "B23": "B2",
}


def leaves(h):
    return [c for c in h if c not in set(h.values())]


def below(h, code):
    """Leaves under (or equal to) code."""
    out = []
    for leaf in leaves(h):
        c = leaf
        while c is not None and c != code:
            c = h[c]
        if c == code:
            out.append(leaf)
    return out


def hier_table(hierarchies, seed, density):
    """Cells (every code combination), values, primaries and A, built independently of hitas."""
    rng = np.random.default_rng(seed)
    dims, trees = list(hierarchies), list(hierarchies.values())
    inner = {k: int(rng.integers(1, 100)) for k in itertools.product(*map(leaves, trees))}
    small = {k: rng.random() < density for k in inner}
    for k in inner:
        if small[k]:
            inner[k] = int(rng.integers(1, 6))
    combos = list(itertools.product(*trees))

    def value(combo):
        under = (below(h, c) for h, c in zip(trees, combo, strict=True))
        return sum(inner[k] for k in itertools.product(*under))

    values = np.array([value(c) for c in combos], dtype=float)
    primary = np.array([small.get(c, False) for c in combos])
    pos = {c: i for i, c in enumerate(combos)}
    rows = []
    for d, h in enumerate(trees):
        for combo in combos:
            kids = [k for k in h if h[k] == combo[d]]
            if kids:
                swap = [combo[:d] + (k,) + combo[d + 1 :] for k in kids]
                rows.append([(pos[combo], 1.0)] + [(pos[s], -1.0) for s in swap])
    A = sp.lil_matrix((len(rows), len(combos)))
    for i, row in enumerate(rows):
        for j, coef in row:
            A[i, j] = coef
    return pd.DataFrame(combos, columns=dims), values, primary, A.tocsr()


def whole_table_ranges(A, values, suppressed, cells):
    A = sp.csr_matrix(A)
    S = np.flatnonzero(suppressed)
    rhs = -(A[:, ~suppressed] @ values[~suppressed])
    out = []
    for cell in cells:
        c = (S == cell).astype(float)
        lo, hi = (
            linprog(s * c, A_eq=A[:, S], b_eq=rhs, bounds=(0, None), method="highs")
            for s in (1, -1)
        )
        out.append((lo.fun if lo.status == 0 else -np.inf, -hi.fun if hi.status == 0 else np.inf))
    return out


def assert_protected_over_whole_table(A, values, suppressed, primary, upl, lpl):
    targets = np.flatnonzero(primary)
    assert suppressed[targets].all()
    ranges = whole_table_ranges(A, values, suppressed, targets)
    for p, (lo, hi) in zip(targets, ranges, strict=True):
        assert hi >= values[p] + upl[p] - 1e-6, (p, hi)
        assert lo <= values[p] - lpl[p] + 1e-6, (p, lo)


def protect(cells, hierarchies, values, primary, upl, lpl, cost, **kwargs):
    """hitas_suppress with the usual a-priori bounds [0, inf)."""
    kwargs = {"lower": 0.0, "upper": np.inf, **kwargs}
    return hitas_suppress(cells, hierarchies, values, primary, upl, lpl, cost, **kwargs)


def levels(values, primary):
    return np.where(primary, np.maximum(1.0, 0.5 * values), 0.0)


def rowset(A):
    A = sp.csr_matrix(A)
    rows = []
    for i in range(A.shape[0]):
        part = slice(A.indptr[i], A.indptr[i + 1])
        rows.append(
            tuple(sorted(zip(A.indices[part].tolist(), A.data[part].tolist(), strict=True)))
        )
    return sorted(rows)


def test_constraints_and_subtables_match_an_independent_build():
    cells, values, _, A = hier_table({"r": HR, "c": HC}, 0, 0.1)
    table = _Table(cells, {"r": HR, "c": HC}, "Total")
    assert rowset(table.constraints()) == rowset(A)
    subtables = table.subtables()
    # parents: {Total, A1, A2} x {Total, B1, B2}, top-down by summed depth
    assert len(subtables) == 9
    sizes = [c.size for c, _ in subtables]
    assert sizes[0] == 3 * 4  # {Total, A1, A2} x {Total, B1, B2, B3}
    # every equation of the whole table lies in a sub-table (those along a shared margin in two)
    local = []
    for sub_cells, sub_A in subtables:
        sub_A = sp.csr_matrix(sub_A)
        global_A = sp.csr_matrix(
            (sub_A.data, sub_cells[sub_A.indices], sub_A.indptr),
            shape=(sub_A.shape[0], values.size),
        )
        local += rowset(global_A)
    assert sorted(set(local)) == rowset(A)
    assert len(local) > len(rowset(A))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("cost_kind", ["unity", "value"])
def test_every_primary_is_protected_over_the_whole_table(seed, cost_kind):
    cells, values, primary, A = hier_table({"r": HR, "c": HC}, seed, 0.2)
    assert primary.any()
    pl = levels(values, primary)
    cost = np.ones(values.size) if cost_kind == "unity" else values
    r = protect(cells, {"r": HR, "c": HC}, values, primary, pl, pl, cost)
    assert r.status == "feasible" and r.gap is None
    assert r.cost == pytest.approx(cost[r.suppressed].sum())
    assert_protected_over_whole_table(A, values, r.suppressed, primary, pl, pl)
    best = optimal_suppress(A, values, primary, pl, pl, cost, lower=0.0, upper=np.inf)
    assert best.status == "optimal"
    assert r.cost >= best.cost - 1e-9


def test_whole_table_audit_repairs_what_the_subtables_miss(monkeypatch):
    # seed 47 at density 0.35: the sub-table patterns leave a primary narrower than its level
    # over the whole table; the repair MILP over the whole table fixes it.
    cells, values, primary, A = hier_table({"r": HR, "c": HC}, 47, 0.35)
    pl = levels(values, primary)
    calls = []

    def recording(A_, *args, **kwargs):
        calls.append(A_.shape[1])
        return optimal_suppress(A_, *args, **kwargs)

    monkeypatch.setattr(hitas, "optimal_suppress", recording)
    r = protect(cells, {"r": HR, "c": HC}, values, primary, pl, pl, values)
    assert calls[-1] == values.size  # the repair ran on the whole table
    assert r.status == "feasible"
    assert_protected_over_whole_table(A, values, r.suppressed, primary, pl, pl)


def test_flat_table_is_one_subtable_and_matches_optimal():
    h = {"Total": None, "x": "Total", "y": "Total", "z": "Total"}
    cells, values, primary, A = hier_table({"r": h, "c": h}, 0, 0.0)
    inner = np.array([[30, 6, 6], [6, 20, 25], [6, 25, 20]], float)

    def sel(code):
        return [0, 1, 2] if code == "Total" else ["x", "y", "z"].index(code)

    values = np.array([inner[sel(a)][..., sel(b)].sum() for a, b in cells.itertuples(index=False)])
    primary = ((cells["r"] == "x") & (cells["c"] == "x")).to_numpy()
    pl = np.where(primary, 10.0, 0.0)
    for cost in (np.ones(values.size), values):
        r = protect(cells, {"r": h, "c": h}, values, primary, pl, pl, cost)
        best = optimal_suppress(A, values, primary, pl, pl, cost, lower=0.0, upper=np.inf)
        assert (r.suppressed == best.suppressed).all()
        assert r.cost == best.cost and r.status == "feasible"
    assert r.cost == 30 + 4 * 6 + 20 + 20


def test_forced_cells_stay_published():
    cells, values, primary, A = hier_table({"r": HR, "c": HC}, 1, 0.2)
    pl = levels(values, primary)
    forced = ((cells["r"] == "Total") | (cells["c"] == "Total")).to_numpy() & ~primary
    r = protect(cells, {"r": HR, "c": HC}, values, primary, pl, pl, values, forced=forced)
    assert r.status == "feasible"
    assert not r.suppressed[forced].any()
    assert_protected_over_whole_table(A, values, r.suppressed, primary, pl, pl)


def test_a_subtable_that_cannot_protect_is_infeasible():
    cells, values, _, _ = hier_table({"r": HR, "c": HC}, 0, 0.0)
    primary = ((cells["r"] == "A11") & (cells["c"] == "B11")).to_numpy()
    # B11 = B1 - B12 inside row A11 once (A11, B12) and (A11, B1) are published
    forced = ((cells["r"] == "A11") & cells["c"].isin(["B12", "B1"])).to_numpy()
    pl = np.where(primary, 1.0, 0.0)
    r = protect(cells, {"r": HR, "c": HC}, values, primary, pl, pl, values, forced=forced)
    assert (r.status, r.gap) == ("infeasible", None)
    assert (r.suppressed == ~forced).all()


def test_no_protection_needed_is_optimal():
    cells, values, primary, _ = hier_table({"r": HR, "c": HC}, 0, 0.2)
    zero = np.zeros(values.size)
    r = protect(cells, {"r": HR, "c": HC}, values, primary, zero, zero, values)
    assert (r.status, r.gap) == ("optimal", 0.0)
    assert (r.suppressed == primary).all()


@pytest.mark.parametrize("solver", ["HIGHS", "CP-SAT"])
def test_other_solvers_protect_too(solver):
    cells, values, primary, A = hier_table({"r": HR, "c": HC}, 2, 0.2)
    pl = levels(values, primary)
    r = protect(cells, {"r": HR, "c": HC}, values, primary, pl, pl, values, solver=solver)
    assert r.status == "feasible"
    assert_protected_over_whole_table(A, values, r.suppressed, primary, pl, pl)


def test_three_dimensional_table():
    hs = {
        "r": {"Total": None, "A": "Total", "B": "Total", "A1": "A", "A2": "A"},
        "c": {"Total": None, "x": "Total", "y": "Total"},
        "s": {"Total": None, "m": "Total", "f": "Total"},
    }
    cells, values, primary, A = hier_table(hs, 4, 0.2)
    assert primary.sum() >= 1
    pl = levels(values, primary)
    r = protect(cells, hs, values, primary, pl, pl, values)
    assert r.status == "feasible"
    assert_protected_over_whole_table(A, values, r.suppressed, primary, pl, pl)
    best = optimal_suppress(A, values, primary, pl, pl, values, lower=0.0, upper=np.inf)
    assert r.cost >= best.cost - 1e-9


def test_codes_given_as_top_level_without_the_total_hang_under_it():
    explicit = {"Total": None, "x": "Total", "y": "Total"}
    cells, values, primary, A = hier_table({"r": explicit, "c": explicit}, 0, 0.0)
    implicit = {"x": None, "y": None}  # no "Total" key: both roll up into the total
    table = _Table(cells, {"r": implicit, "c": implicit}, "Total")
    assert rowset(table.constraints()) == rowset(A)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda c, h: (c.assign(r=c["r"].replace("A11", "A99")), h), r"codes \['A99'\]"),
        (lambda c, h: (pd.concat([c, c.iloc[:1]]), h), "duplicate rows"),
        (lambda c, h: (c, {**h, "r": {**HR, "A1": "A11"}}), "form a cycle"),
        (lambda c, h: (c.drop(columns="c"), h), r"no column for dimension\(s\) \['c'\]"),
        (lambda c, h: (c, {**h, "r": {**HR, "Total": "A1"}}), "the total is the root"),
        (lambda c, h: (c, {**h, "r": {**HR, "A13": "A9"}}), "parent 'A9' of code 'A13'"),
    ],
)
def test_invalid_tables_are_refused(mutate, match):
    cells, values, primary, _ = hier_table({"r": HR, "c": HC}, 0, 0.2)
    cells, hierarchies = mutate(cells, {"r": HR, "c": HC})
    n = len(cells)
    pl = np.zeros(n)
    with pytest.raises(TabularError, match=match):
        protect(cells, hierarchies, np.resize(values, n), np.resize(primary, n), pl, pl, np.ones(n))


@pytest.mark.parametrize("seed", [5, 6])
def test_the_audit_module_agrees_over_the_whole_table(seed):
    audit = pytest.importorskip("sqlsdc.tabular.attacker")
    cells, values, primary, A = hier_table({"r": HR, "c": HC}, seed, 0.2)
    pl = levels(values, primary)
    r = protect(cells, {"r": HR, "c": HC}, values, primary, pl, pl, values)
    bounds = dict(lower=np.zeros(values.size), upper=np.full(values.size, np.inf))
    intervals = audit.audit_intervals(A, values, r.suppressed, **bounds)
    assert audit.audit_check(intervals, values, primary, pl, pl)[primary].all()
