"""Tests of sqlsdc.tabular.audit: the attacker's feasibility intervals and the protection check."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from ortools.sat.python import cp_model
from scipy import sparse
from scipy.optimize import linprog

from sqlsdc.errors import TabularError
from sqlsdc.tabular.audit import AuditResult, audit_check, audit_intervals
from sqlsdc.tabular.gauss import gauss_suppress

INF = np.inf


def make_table(*sizes, inner):
    """X, A, values and labels of a flat table with all margins (cells in Kronecker order)."""
    Ds, Hs, codes = [], [], []
    for n in sizes:
        codes.append(["Total", *(f"c{i}" for i in range(n))])
        Ds.append(np.hstack([np.ones((n, 1)), np.eye(n)]))
        Hs.append(np.hstack([[1.0], -np.ones(n)])[None, :])
    X = sparse.csc_matrix(np.ones((1, 1)))
    for D in Ds:
        X = sparse.kron(X, D, format="csc")
    full = [len(c) for c in codes]
    A = sparse.vstack(
        [
            sparse.kron(
                sparse.kron(sparse.eye(int(np.prod(full[:d]))), H),
                sparse.eye(int(np.prod(full[d + 1 :]))),
            )
            for d, H in enumerate(Hs)
        ]
    ).tocsr()
    values = X.T @ np.asarray(inner, dtype=float).ravel()
    return X.astype(np.int8), A, values, list(itertools.product(*codes))


def mask(labels, chosen):
    return np.array([lab in chosen for lab in labels])


def box(values):
    return dict(lower=np.zeros(len(values)), upper=np.full(len(values), INF))


RECT = {("c0", "c0"), ("c0", "c1"), ("c1", "c0"), ("c1", "c1")}


def test_rectangle_intervals_by_hand():
    # x00 = 1 + t, x01 = 5 - t, x10 = 6 - t, x11 = 7 + t with all >= 0: t in [-1, 5]
    X, A, values, labels = make_table(3, 3, inner=[[1, 5, 9], [6, 7, 8], [10, 11, 12]])
    sup = mask(labels, RECT)
    for integer in (False, True):
        res = audit_intervals(A, values, sup, **box(values), integer=integer)
        got = {labels[c]: (res.lo[c], res.hi[c]) for c in np.flatnonzero(sup)}
        assert got == {
            ("c0", "c0"): (0.0, 6.0),
            ("c0", "c1"): (0.0, 6.0),
            ("c1", "c0"): (1.0, 7.0),
            ("c1", "c1"): (6.0, 12.0),
        }
        assert res.exact.all()
        assert np.array_equal(res.lo[~sup], values[~sup])
        assert np.array_equal(res.hi[~sup], values[~sup])


def test_a_priori_bounds_narrow_the_rectangle():
    # a-priori ±50 %: x00 in [0.5, 1.5] limits t to [-0.5, 0.5]
    X, A, values, labels = make_table(3, 3, inner=[[1, 5, 9], [6, 7, 8], [10, 11, 12]])
    sup = mask(labels, RECT)
    res = audit_intervals(A, values, sup, lower=values * 0.5, upper=values * 1.5)
    got = {labels[c]: (res.lo[c], res.hi[c]) for c in np.flatnonzero(sup)}
    assert got == {
        ("c0", "c0"): (0.5, 1.5),
        ("c0", "c1"): (4.5, 5.5),
        ("c1", "c0"): (5.5, 6.5),
        ("c1", "c1"): (6.5, 7.5),
    }


def test_lone_primary_fails_until_gauss_adds_a_partner():
    X, A, values, labels = make_table(4, inner=[2, 9, 4, 30])
    primary = mask(labels, {("c0",)})
    upl, lpl = np.where(primary, 3.0, 0.0), np.where(primary, 2.0, 0.0)
    res = audit_intervals(A, values, primary, **box(values))
    c0 = labels.index(("c0",))
    assert (res.lo[c0], res.hi[c0]) == (2.0, 2.0)  # Total - c1 - c2 - c3
    assert not audit_check(res, values, primary, upl, lpl)[c0]

    sup = gauss_suppress(X, primary, values)
    assert {labels[c] for c in np.flatnonzero(sup)} == {("c0",), ("c2",)}
    res = audit_intervals(A, values, sup, **box(values))
    assert (res.lo[c0], res.hi[c0]) == (0.0, 6.0)  # c0 + c2 = 6
    ok = audit_check(res, values, primary, upl, lpl)
    assert ok.all()
    assert not audit_check(res, values, primary, upl * 2, lpl)[c0]  # 6 < 2 + 6


def test_lp_and_integer_bounds_differ_onn_triangle():
    """Onn (PSD 2006, §9): {y >= 0 : 2 y1 + (2u+1) y2 = 4u+1} has the single integer point
    (u, 1) while the LP gives y1 in [0, 2u + 1/2]; here u = 5, published total t = 21."""
    A = sparse.csr_matrix(np.array([[-2.0, -11.0, 1.0]]))
    values = np.array([5.0, 1.0, 21.0])
    sup = np.array([True, True, False])
    lp = audit_intervals(A, values, sup, **box(values))
    assert lp.lo[:2].tolist() == [0.0, 0.0]
    assert lp.hi[0] == 10.5
    assert lp.hi[1] == pytest.approx(21 / 11)
    ip = audit_intervals(A, values, sup, **box(values), integer=True)
    assert ip.lo[:2].tolist() == [5.0, 1.0] and ip.hi[:2].tolist() == [5.0, 1.0]
    assert ip.exact.all()
    primary = np.array([True, False, False])
    levels = np.where(primary, 1.0, 0.0)
    assert audit_check(lp, values, primary, levels, levels)[0]  # the LP audit is fooled
    assert not audit_check(ip, values, primary, levels, levels)[0]


ONN_U = [[2, 1, 2, 0, 2, 0], [1, 0, 2, 0, 0, 2], [1, 0, 0, 2, 2, 0], [0, 1, 0, 2, 0, 2]]  # [j][i]
ONN_V = [[2, 1, 2, 3, 0, 0], [2, 1, 0, 0, 2, 1], [0, 0, 2, 1, 2, 3]]  # [k][i]
ONN_W = [[2, 3, 2], [2, 1, 2], [2, 1, 2], [2, 1, 2]]  # [j][k]


def _onn_tables():
    """All integer 6×4×3 tables with Onn's Example 1 two-way margins (seed digest §11 T6)."""
    m = cp_model.CpModel()
    x = {key: m.new_int_var(0, 3, "") for key in itertools.product(range(6), range(4), range(3))}
    for i, j in itertools.product(range(6), range(4)):
        m.add(sum(x[i, j, k] for k in range(3)) == ONN_U[j][i])
    for i, k in itertools.product(range(6), range(3)):
        m.add(sum(x[i, j, k] for j in range(4)) == ONN_V[k][i])
    for j, k in itertools.product(range(4), range(3)):
        m.add(sum(x[i, j, k] for i in range(6)) == ONN_W[j][k])
    sols = []

    class Collect(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self):
            sols.append([self.value(v) for v in x.values()])

    solver = cp_model.CpSolver()
    solver.parameters.enumerate_all_solutions = True
    solver.solve(m, Collect())
    return list(x), np.array(sols, dtype=float)


def test_onn_example_table_has_two_integer_tables_and_exact_intervals():
    keys, tables = _onn_tables()
    assert len(tables) == 2  # Onn: exactly two tables, x111 in {0, 2}
    inner = tables[0]
    margins = [("u", i, j) for i, j in itertools.product(range(6), range(4))]
    margins += [("v", i, k) for i, k in itertools.product(range(6), range(3))]
    margins += [("w", j, k) for j, k in itertools.product(range(4), range(3))]
    rows = []
    for m_i, (kind, a, b) in enumerate(margins):
        row = np.zeros(len(keys) + len(margins))
        row[len(keys) + m_i] = 1.0
        for c, (i, j, k) in enumerate(keys):
            if (kind, a, b) in {("u", i, j), ("v", i, k), ("w", j, k)}:
                row[c] = -1.0
        rows.append(row)
    A = sparse.csr_matrix(np.array(rows))
    margin_values = -(A[:, : len(keys)] @ inner)
    values = np.concatenate([inner, margin_values])
    sup = np.arange(len(values)) < len(keys)
    for integer in (False, True):
        res = audit_intervals(A, values, sup, **box(values), integer=integer)
        assert res.exact.all()
        assert np.allclose(res.lo[sup], tables.min(axis=0))
        assert np.allclose(res.hi[sup], tables.max(axis=0))
    assert (res.lo[0], res.hi[0]) == (0.0, 2.0)  # x111


def test_unbounded_interval_and_time_limit():
    X, A, values, labels = make_table(2, inner=[3, 4])
    everything = np.ones(len(values), dtype=bool)
    res = audit_intervals(A, values, everything, **box(values))
    assert res.hi.tolist() == [INF, INF, INF] and res.lo.tolist() == [0.0, 0.0, 0.0]
    assert res.exact.all()
    primary = mask(labels, {("c0",)})
    assert audit_check(res, values, primary, np.full(3, 1e9), np.full(3, 3.0)).all()

    X, A, values, labels = make_table(3, 3, inner=[[1, 5, 9], [6, 7, 8], [10, 11, 12]])
    sup = mask(labels, RECT)
    res = audit_intervals(A, values, sup, **box(values), time_limit=0.0)
    assert not res.exact[sup].any() and res.exact[~sup].all()
    assert np.all(res.lo <= values) and np.all(res.hi >= values)
    # the outer bounds from single rows: x00 <= min(row 0 rest 6, column 0 rest 7)
    c00 = labels.index(("c0", "c0"))
    assert (res.lo[c00], res.hi[c00]) == (0.0, 6.0)
    primary = mask(labels, {("c0", "c0")})
    assert not audit_check(res, values, primary, np.zeros(16), np.zeros(16))[c00]


def test_audit_check_rules():
    lo = np.array([0.0, 5.0, 0.0, 2.0, -INF])
    hi = np.array([10.0, 5.0, 10.0, 4.0, INF])
    values = np.array([5.0, 5.0, 5.0, 3.0, 1.0])
    res = AuditResult(lo, hi, np.array([True, True, False, True, True]))
    primary = np.array([True, True, True, True, False])
    levels = np.zeros(5)
    # a published (determined) primary fails even with zero levels; not exact fails
    expected = [True, False, False, True, True]
    assert audit_check(res, values, primary, levels, levels).tolist() == expected
    upl = np.array([5.0, 0, 0, 1.0, 0])
    lpl = np.array([5.0, 0, 0, 1.5, 0])
    assert audit_check(res, values, primary, upl, lpl).tolist()[::3] == [True, False]
    spl = np.array([10.5, 0, 0, 0, 0])
    assert not audit_check(res, values, primary, levels, levels, spl)[0]
    with pytest.raises(TabularError, match="upl must have one entry per cell"):
        audit_check(res, values, primary, levels[:2], levels)


def test_input_errors():
    X, A, values, labels = make_table(2, inner=[3, 4])
    sup = np.array([False, True, True])
    with pytest.raises(TabularError, match=r"cell 1 has value 3.0 outside its a-priori bounds"):
        audit_intervals(A, values, sup, lower=np.full(3, 4.0), upper=np.full(3, INF))
    with pytest.raises(TabularError, match="not additive"):
        audit_intervals(A, values + [1.0, 0.0, 0.0], sup, **box(values))
    with pytest.raises(TabularError, match="integral A, values and bounds"):
        audit_intervals(A, values * 0.5, sup, **box(values), integer=True)
    with pytest.raises(TabularError, match="scipy.sparse"):
        audit_intervals(A.toarray(), values, sup, **box(values))
    with pytest.raises(TabularError, match="suppressed must be a bool array"):
        audit_intervals(A, values, sup.astype(int), **box(values))


def _random_case(rng):
    sizes = [int(rng.integers(2, 5)) for _ in range(int(rng.integers(2, 4)))]
    inner = rng.poisson(3.0, size=sizes)
    X, A, values, _ = make_table(*sizes, inner=inner)
    primary = (values >= 1) & (values <= 2)
    if not primary.any():
        primary[int(np.argmin(np.where(values > 0, values, INF)))] = True
    return X, A, values, gauss_suppress(X, primary, values + 1, values=values), len(sizes)


@pytest.mark.parametrize("seed", range(25))
def test_random_tables_match_an_independent_lp(seed):
    X, A, values, sup, n_dims = _random_case(np.random.default_rng(seed))
    res = audit_intervals(A, values, sup, **box(values))
    assert res.exact.all()
    assert np.all(res.lo <= values + 1e-9) and np.all(res.hi >= values - 1e-9)
    S = np.flatnonzero(sup)
    A_s = A[:, S].toarray()
    rhs = -(A[:, ~sup] @ values[~sup])
    for pos, c in enumerate(S):
        obj = np.zeros(len(S))
        obj[pos] = 1.0
        lo = linprog(obj, A_eq=A_s, b_eq=rhs, bounds=(0, None), method="highs")
        hi = linprog(-obj, A_eq=A_s, b_eq=rhs, bounds=(0, None), method="highs")
        assert res.lo[c] == pytest.approx(lo.fun, abs=1e-7)
        assert (res.hi[c] == INF and hi.status == 3) or res.hi[c] == pytest.approx(-hi.fun)
    ires = audit_intervals(A, values, sup, **box(values), integer=True)
    assert ires.exact.all()
    assert np.all(ires.lo >= res.lo - 1e-9) and np.all(ires.hi <= res.hi + 1e-9)
    if n_dims == 2:  # two-way tables are totally unimodular: LP bounds are integer bounds
        assert np.array_equal(ires.lo, res.lo) and np.array_equal(ires.hi, res.hi)
