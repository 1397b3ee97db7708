"""Tests of sqlsdc.tabular.attacker: the attacker's feasibility intervals and protection check."""

from __future__ import annotations

import itertools
from dataclasses import astuple

import numpy as np
import pytest
from ortools.sat.python import cp_model
from scipy import sparse
from scipy.optimize import linprog

from sqlsdc.errors import TabularError
from sqlsdc.tabular import attacker
from sqlsdc.tabular.attacker import AuditResult, audit_check, audit_intervals
from sqlsdc.tabular.gauss import gauss_suppress

INF = np.inf


def _dim(spec):
    """Codes, leaves-by-codes ancestor matrix and ``parent - Σ children`` rows of a dimension:
    ``spec`` is an int n (Total + n codes) or ``{code: parent or None}``, parents first."""
    parents = {f"c{i}": None for i in range(spec)} if isinstance(spec, int) else dict(spec)
    codes = ["Total", *parents]
    par = {c: ("Total" if p is None else p) for c, p in parents.items()}
    kids = {c: [k for k, p in par.items() if p == c] for c in codes}
    leaves = [c for c in codes if not kids[c]]
    D = np.zeros((len(leaves), len(codes)))
    for i, leaf in enumerate(leaves):
        c = leaf
        while c is not None:
            D[i, codes.index(c)] = 1
            c = par.get(c)
    H = [[1 if c == p else -1 if c in kids[p] else 0 for c in codes] for p in codes if kids[p]]
    return codes, D, np.array(H, dtype=float)


def make_table(*dims, inner):
    """X, A, values and labels of a table with all margins of ``dims`` (Kronecker cell order)."""
    parts = [_dim(d) for d in dims]
    X = sparse.csc_matrix(np.ones((1, 1)))
    for _, D, _ in parts:
        X = sparse.kron(X, D, format="csc")
    sizes = [len(codes) for codes, _, _ in parts]
    A = sparse.vstack(
        [
            sparse.kron(
                sparse.kron(sparse.eye(int(np.prod(sizes[:d]))), H),
                sparse.eye(int(np.prod(sizes[d + 1 :]))),
            )
            for d, (_, _, H) in enumerate(parts)
        ]
    ).tocsr()
    values = X.T @ np.asarray(inner, dtype=float).ravel()
    return X.astype(np.int8), A, values, list(itertools.product(*(c for c, _, _ in parts)))


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


def test_integer_bounds_with_unbounded_partners():
    # t = 2 y1 + 11 y2 - 22 z = 21 with z >= 0 unbounded: the LP lets y1 reach 0 (y2 = 21/11);
    # over integers 2 y1 = 21 (mod 11) forces y1 = 5 (mod 11), so y1 >= 5; y1 is unbounded above
    A = sparse.csr_matrix(np.array([[-2.0, -11.0, 22.0, 1.0]]))
    values = np.array([5.0, 1.0, 0.0, 21.0])
    sup = np.array([True, True, True, False])
    lp = audit_intervals(A, values, sup, **box(values))
    ip = audit_intervals(A, values, sup, **box(values), integer=True)
    assert (lp.lo[0], lp.hi[0]) == (0.0, INF)
    assert (ip.lo[0], ip.hi[0]) == (5.0, INF)
    assert ip.exact.all() and lp.exact.all()


# a 3×4×4 count table with all margins published and 32 inner cells suppressed (found by a
# random search over GaussSuppression patterns): its LP and integer intervals differ
GAP_INNER = [
    [[0, 4, 1, 2], [3, 1, 1, 2], [2, 4, 1, 5], [2, 4, 3, 3]],
    [[2, 4, 5, 5], [5, 4, 2, 2], [6, 1, 3, 3], [3, 1, 2, 2]],
    [[2, 3, 3, 4], [7, 2, 10, 3], [3, 4, 4, 3], [2, 3, 3, 3]],
]
GAP_SUPPRESSED = [
    [[0, 0, 1, 1], [0, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 1]],
    [[1, 1, 0, 0], [0, 0, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]],
    [[1, 1, 1, 1], [0, 1, 0, 1], [1, 0, 0, 1], [1, 1, 1, 0]],
]


def _cp_sat_range(A_s, rhs, pos):
    out = []
    for sense in (-1, 1):
        m = cp_model.CpModel()
        xs = [m.new_int_var(0, 100, "") for _ in range(A_s.shape[1])]
        for row, b in zip(A_s, rhs, strict=True):
            if row.any():
                m.add(sum(int(a) * x for a, x in zip(row, xs, strict=True) if a) == int(b))
        (m.maximize if sense > 0 else m.minimize)(xs[pos])
        solver = cp_model.CpSolver()
        assert solver.solve(m) == cp_model.OPTIMAL
        out.append(solver.objective_value)
    return tuple(out)


def test_three_way_table_where_lp_and_integer_bounds_differ():
    X, A, values, labels = make_table(3, 4, 4, inner=GAP_INNER)
    chosen = {
        (f"c{i}", f"c{j}", f"c{k}")
        for i, j, k in itertools.product(range(3), range(4), range(4))
        if GAP_SUPPRESSED[i][j][k]
    }
    sup = mask(labels, chosen)
    lp = audit_intervals(A, values, sup, **box(values))
    ip = audit_intervals(A, values, sup, **box(values), integer=True)
    assert lp.exact.all() and ip.exact.all()
    at = {lab: labels.index(lab) for lab in [("c0", "c1", "c3"), ("c1", "c2", "c2")]}
    c = at["c0", "c1", "c3"]  # true value 2
    assert (lp.lo[c], lp.hi[c]) == (0.0, 4.0) and (ip.lo[c], ip.hi[c]) == (0.0, 3.0)
    c = at["c1", "c2", "c2"]  # true value 3
    assert (lp.lo[c], lp.hi[c]) == (1.0, 4.0) and (ip.lo[c], ip.hi[c]) == (2.0, 4.0)
    S = np.flatnonzero(sup)
    A_s, rhs = A[:, S].toarray(), -(A[:, ~sup] @ values[~sup])
    for pos, c in enumerate(S):  # every integer interval is CP-SAT's own min and max
        assert (ip.lo[c], ip.hi[c]) == _cp_sat_range(A_s, rhs, pos)
    # upper protection 2 for the cell (c0, c1, c3) = 2: the LP audit says 4 is reachable, but no
    # integer table has it above 3
    primary = mask(labels, {("c0", "c1", "c3")})
    upl, lpl = np.where(primary, 2.0, 0.0), np.where(primary, 1.0, 0.0)
    assert audit_check(lp, values, primary, upl, lpl).all()
    assert not audit_check(ip, values, primary, upl, lpl)[at["c0", "c1", "c3"]]


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


def test_explicit_zeros_in_A_are_not_coefficients():
    A = sparse.csr_matrix(
        (np.array([-1.0, 0.0, -1.0, 1.0]), np.array([0, 1, 2, 3]), np.array([0, 4])), shape=(1, 4)
    )  # a - 0 b + c = t with the 0 stored explicitly; b is in no constraint
    values = np.array([3.0, 5.0, 4.0, 7.0])
    res = audit_intervals(A, values, np.array([True, True, True, False]), **box(values))
    assert res.lo.tolist() == [0.0, 0.0, 0.0, 7.0] and res.hi.tolist() == [7.0, INF, 7.0, 7.0]


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
    """A random 2-D or 3-D table, flat or with a level of groups, protected by gauss_suppress."""
    dims = []
    for _ in range(int(rng.integers(2, 4))):
        if rng.random() < 0.5:
            dims.append(int(rng.integers(2, 5)))
        else:
            groups = int(rng.integers(1, 3))
            spec = {f"g{g}": None for g in range(groups)}
            for g in range(groups):
                spec |= {f"g{g}.{i}": f"g{g}" for i in range(int(rng.integers(1, 4)))}
            dims.append(spec)
    shape = [int(_dim(d)[1].shape[0]) for d in dims]
    X, A, values, _ = make_table(*dims, inner=rng.poisson(3.0, size=shape))
    primary = (values >= 1) & (values <= 2)
    if not primary.any():
        primary[int(np.argmin(np.where(values > 0, values, INF)))] = True
    return X, A, values, gauss_suppress(X, primary, values + 1, values=values), len(dims)


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


@pytest.mark.slow  # two spawned worker processes that import the solver (~4-5 s of CPU)
def test_worker_processes_give_the_same_intervals(monkeypatch):
    """Components solved in 2 spawned worker processes: the same result as in this process."""
    monkeypatch.setattr(attacker, "_PARALLEL_FROM_CELLS", 0)
    cases = [_random_case(np.random.default_rng(seed)) for seed in range(4)]
    A = sparse.block_diag([A for _, A, _, _, _ in cases], format="csr")  # 4+ components
    values = np.concatenate([v for _, _, v, _, _ in cases])
    sup = np.concatenate([s for _, _, _, s, _ in cases])
    for integer in (False, True):
        one = audit_intervals(A, values, sup, **box(values), integer=integer)
        two = audit_intervals(A, values, sup, **box(values), integer=integer, processes=2)
        assert one.exact.all()
        for got, want in zip(astuple(two), astuple(one), strict=True):
            assert np.array_equal(got, want)
