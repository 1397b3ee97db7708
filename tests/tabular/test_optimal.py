"""optimal_suppress: known optima, solvers agree, limits are honest, protection is real."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import linprog

from sqlsdc.errors import TabularError
from sqlsdc.tabular.attacker import audit_check, audit_intervals
from sqlsdc.tabular.optimal import (
    SuppressionResult,
    _totally_unimodular,
    attacker_ranges,
    optimal_suppress,
)

ALL_SOLVERS = ["SCIP", "HIGHS", "CBC", "CP-SAT"]


def grid_table(inner):
    """A 2-D table with margins: values, A (parent +1, children -1) and the (r, c) -> cell map."""
    inner = np.asarray(inner, dtype=float)
    R, K = inner.shape
    full = np.zeros((R + 1, K + 1))
    full[:R, :K] = inner
    full[:R, K] = inner.sum(axis=1)
    full[R, :K] = inner.sum(axis=0)
    full[R, K] = inner.sum()
    idx = np.arange(full.size).reshape(full.shape)
    rows = [(idx[i, K], idx[i, :K]) for i in range(R + 1)]
    rows += [(idx[R, j], idx[:R, j]) for j in range(K + 1)]
    A = sp.lil_matrix((len(rows), full.size))
    for r, (head, kids) in enumerate(rows):
        A[r, head] = 1
        A[r, kids] = -1
    return full.ravel(), A.tocsr(), idx


def lp_range(A, values, suppressed, cell, lower=0.0, upper=np.inf):
    """Attacker's [min, max] of one cell over the whole table, straight from linprog."""
    A = sp.csr_matrix(A)
    S = np.flatnonzero(suppressed)
    rhs = -(A[:, ~suppressed] @ values[~suppressed])
    c = (S == cell).astype(float)
    bounds = np.column_stack([np.broadcast_to(b, values.shape)[S] for b in (lower, upper)])
    out = []
    for sign in (1, -1):
        res = linprog(sign * c, A_eq=A[:, S], b_eq=rhs, bounds=bounds, method="highs")
        out.append(-sign * np.inf if res.status == 3 else sign * res.fun)
    return out


def solve(A, values, primary, upl, lpl, cost, **kwargs):
    """optimal_suppress with the usual a-priori bounds [0, inf)."""
    kwargs = {"lower": 0.0, "upper": np.inf, **kwargs}
    return optimal_suppress(A, values, primary, upl, lpl, cost, **kwargs)


def assert_protected(A, values, result, primary, upl, lpl, **bounds):
    assert result.suppressed[primary].all()
    for p in np.flatnonzero(primary):
        lo, hi = lp_range(A, values, result.suppressed, p, **bounds)
        assert hi >= values[p] + upl[p] - 1e-6, (p, hi)
        assert lo <= values[p] - lpl[p] + 1e-6, (p, lo)


# Primary (0, 0) = 30 with protection 10 up and down. Every other cell of its row and column is 6
# (< 10), so the only 4-cell pattern is the rectangle through the margins (0,T) (T,0) (T,T); the
# cheapest by value instead splits the move over (0,1) (0,2) (1,0) (2,0) and closes the cycle
# with the diagonal (1,1) (2,2) = 20 + 20 (the anti-diagonal costs 25 + 25).
HAND = [[30, 6, 6], [6, 20, 25], [6, 25, 20]]
MARGIN_RECTANGLE = {(0, 0), (0, 3), (3, 0), (3, 3)}
VALUE_CYCLE = {(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (1, 1), (2, 2)}


@pytest.fixture
def hand():
    values, A, idx = grid_table(HAND)
    primary = np.zeros(values.size, bool)
    primary[idx[0, 0]] = True
    pl = np.where(primary, 10.0, 0.0)
    return values, A, idx, primary, pl


def cells_of(result, idx):
    return {
        tuple(int(k) for k in np.argwhere(idx == c)[0]) for c in np.flatnonzero(result.suppressed)
    }


@pytest.mark.parametrize("solver", ALL_SOLVERS)
def test_unity_cost_takes_the_margin_rectangle(hand, solver):
    values, A, idx, primary, pl = hand
    r = solve(A, values, primary, pl, pl, np.ones(values.size), solver=solver)
    assert isinstance(r, SuppressionResult)
    assert (r.status, r.gap, r.cost) == ("optimal", 0.0, 4.0)
    assert cells_of(r, idx) == MARGIN_RECTANGLE
    assert_protected(A, values, r, primary, pl, pl)


@pytest.mark.parametrize("solver", ALL_SOLVERS)
def test_value_cost_takes_the_cheap_six_cell_cycle(hand, solver):
    values, A, idx, primary, pl = hand
    r = solve(A, values, primary, pl, pl, values, solver=solver)
    assert (r.status, r.cost) == ("optimal", 30 + 4 * 6 + 20 + 20)
    assert cells_of(r, idx) == VALUE_CYCLE
    assert_protected(A, values, r, primary, pl, pl)


def test_forcing_a_cell_moves_the_cycle_to_the_other_diagonal(hand):
    values, A, idx, primary, pl = hand
    forced = np.zeros(values.size, bool)
    forced[idx[1, 1]] = True
    r = solve(A, values, primary, pl, pl, values, forced=forced)
    assert (r.status, r.cost) == ("optimal", 30 + 4 * 6 + 25 + 25)
    assert cells_of(r, idx) == {(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (1, 2), (2, 1)}
    assert not r.suppressed[forced].any()


def test_forcing_the_rest_of_the_row_is_infeasible_and_fails_closed(hand):
    values, A, idx, primary, pl = hand
    forced = np.zeros(values.size, bool)
    forced[idx[0, 1:]] = True  # (0,1) (0,2) (0,T) published: (0,0) = (0,T) - (0,1) - (0,2)
    for solver in ("SCIP", "CP-SAT"):
        r = solve(A, values, primary, pl, pl, values, forced=forced, solver=solver)
        assert (r.status, r.gap) == ("infeasible", None)
        assert (r.suppressed == ~forced).all()  # fail-closed, not a solution


def test_protection_beyond_the_a_priori_bounds_is_infeasible(hand):
    values, A, idx, primary, pl = hand
    upper = values.copy()
    upper[idx[0, 0]] = values[idx[0, 0]] + 9  # the attacker knows the cell is at most 39
    r = optimal_suppress(A, values, primary, pl, pl, values, lower=0, upper=upper)
    assert r.status == "infeasible"
    upper[idx[0, 0]] = values[idx[0, 0]] + 10  # exactly enough room
    r = optimal_suppress(A, values, primary, pl, pl, values, lower=0, upper=upper)
    assert r.status == "optimal"
    assert_protected(A, values, r, primary, pl, pl, lower=0, upper=upper)


def test_a_priori_upper_bounds_are_respected(hand):
    values, A, idx, primary, pl = hand
    # Interior cells known to be <= 24: the diagonal (20) can grow by 4 only, so the value-optimal
    # cycle cannot carry the up-move of 10 (it would need 6 on one diagonal cell).
    upper = np.full(values.size, np.inf)
    inside = idx[1:3, 1:3].ravel()
    upper[inside] = np.maximum(24.0, values[inside])  # the 25s stay where they are
    r = optimal_suppress(A, values, primary, pl, pl, values, lower=0, upper=upper)
    assert r.status == "optimal"
    assert cells_of(r, idx) != VALUE_CYCLE
    assert r.cost > 94
    assert_protected(A, values, r, primary, pl, pl, lower=0, upper=upper)


def test_no_primary_needs_nothing(hand):
    values, A, _, primary, pl = hand
    none = np.zeros(values.size, bool)
    r = solve(A, values, none, pl * 0, pl * 0, values)
    assert (r.status, r.cost, r.suppressed.any()) == ("optimal", 0.0, False)


def random_table(n, seed, density=0.1):
    rng = np.random.default_rng(seed)
    inner = rng.integers(1, 100, size=(n, n))
    small = rng.random((n, n)) < density
    inner[small] = rng.integers(1, 6, size=small.sum())
    values, A, idx = grid_table(inner)
    primary = np.zeros(values.size, bool)
    primary[idx[:n, :n][small]] = True
    upl = np.where(primary, np.maximum(1.0, 0.5 * values), 0.0)
    lpl = np.where(primary, np.maximum(1.0, 0.3 * values), 0.0)
    return values, A, primary, upl, lpl


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_solvers_agree_and_protect_on_random_tables(seed):
    values, A, primary, upl, lpl = random_table(6, seed, density=0.12)
    assert primary.sum() >= 2
    costs = {}
    for solver in ("SCIP", "HIGHS", "CP-SAT"):
        r = solve(A, values, primary, upl, lpl, values, solver=solver)
        assert r.status == "optimal"
        assert_protected(A, values, r, primary, upl, lpl)
        costs[solver] = r.cost
    assert len(set(costs.values())) == 1, costs


def test_fractional_data_is_scaled_exactly_for_cp_sat():
    values, A, idx = grid_table(np.array(HAND) / 4.0)  # quarters: CP-SAT scales by 100
    primary = np.zeros(values.size, bool)
    primary[idx[0, 0]] = True
    pl = np.where(primary, 2.5, 0.0)
    results = [solve(A, values, primary, pl, pl, values, solver=s) for s in ("SCIP", "CP-SAT")]
    assert [r.cost for r in results] == [pytest.approx(94 / 4)] * 2
    assert cells_of(results[1], idx) == VALUE_CYCLE


@pytest.mark.parametrize("solver", ["SCIP", "HIGHS", "CP-SAT"])
def test_turnover_sized_values_and_fractional_levels(solver):
    # the demo's failure: turnover near 10^10 and levels like 100/60 * x1 - T (fractional) were
    # "infeasible" — SCIP drowned in absolute tolerances, and CP-SAT rounded the tight caps down
    # below the (rounded up) level. The witnesses are now measured in units of each level, and
    # the caps round outwards; the answer is the one of the small table.
    scale = 1e9 / 3.0
    values, A, idx = grid_table(np.array(HAND) * scale)
    primary = np.zeros(values.size, bool)
    primary[idx[0, 0]] = True
    pl = np.where(primary, 10.0 * scale, 0.0)
    r = solve(A, values, primary, pl, pl, values, solver=solver)
    assert r.status == "optimal"
    assert r.cost == pytest.approx((30 + 4 * 6 + 20 + 20) * scale)
    assert cells_of(r, idx) == VALUE_CYCLE
    n = values.size  # (scipy's linprog in lp_range gives up at these magnitudes; GLOP is scaled)
    res = audit_intervals(A, values, r.suppressed, lower=np.zeros(n), upper=np.full(n, np.inf))
    assert audit_check(res, values, primary, pl, pl).all()


def test_tiny_time_limit_is_never_a_wrong_optimal():
    values, A, primary, upl, lpl = random_table(14, 3, density=0.1)
    reference = solve(A, values, primary, upl, lpl, values, solver="HIGHS", time_limit=60)
    assert reference.status == "optimal"
    seen = set()
    for solver, limit in [("SCIP", 0.01), ("HIGHS", 0.01), ("CP-SAT", 0.01), ("SCIP", 1.5)]:
        r = solve(A, values, primary, upl, lpl, values, solver=solver, time_limit=limit)
        seen.add(r.status)
        assert r.status in ("optimal", "feasible", "timeout")
        if r.status == "optimal":
            assert r.cost == pytest.approx(reference.cost)
        elif r.status == "feasible":
            assert r.cost >= reference.cost - 1e-9
            assert r.gap is None or 0.0 <= r.gap <= 1.0
            assert_protected(A, values, r, primary, upl, lpl)
        else:
            assert r.gap is None and (r.suppressed == np.ones(values.size, bool)).all()
    assert seen - {"optimal"}, "the limits were too generous to test anything"


def test_hierarchical_matrix_is_not_unimodular_but_still_solved_exactly():
    # rows: T = A + B, A = A1 + A2; columns: T = X + Y, X = X1 + X2
    r_codes = ["T", "A", "B", "A1", "A2"]
    c_codes = ["T", "X", "Y", "X1", "X2"]
    r_kids = {"T": ["A", "B"], "A": ["A1", "A2"]}
    c_kids = {"T": ["X", "Y"], "X": ["X1", "X2"]}
    leaves_r, leaves_c = ["B", "A1", "A2"], ["Y", "X1", "X2"]
    rng = np.random.default_rng(5)
    inner = {(a, b): float(rng.integers(5, 60)) for a in leaves_r for b in leaves_c}
    inner[("A1", "X1")] = 3.0

    def under(code, kids):
        return [code] if code not in kids else sum((under(k, kids) for k in kids[code]), [])

    pos = {(a, b): i for i, (a, b) in enumerate((a, b) for a in r_codes for b in c_codes)}
    values = np.array(
        [sum(inner[(x, y)] for x in under(a, r_kids) for y in under(b, c_kids)) for a, b in pos]
    )
    rows = [
        [(pos[a, b], 1)] + [(pos[k, b], -1) for k in r_kids[a]] for a in r_kids for b in c_codes
    ]
    rows += [
        [(pos[a, b], 1)] + [(pos[a, k], -1) for k in c_kids[b]] for b in c_kids for a in r_codes
    ]
    A = sp.lil_matrix((len(rows), values.size))
    for i, row in enumerate(rows):
        for j, coef in row:
            A[i, j] = coef
    A = A.tocsr()
    assert _totally_unimodular(grid_table(HAND)[1]) and not _totally_unimodular(A)
    primary = np.zeros(values.size, bool)
    primary[pos["A1", "X1"]] = True
    pl = np.where(primary, 2.0, 0.0)
    results = [
        solve(A, values, primary, pl, pl, values, solver=s) for s in ("SCIP", "HIGHS", "CP-SAT")
    ]
    assert {r.status for r in results} == {"optimal"}
    assert len({r.cost for r in results}) == 1
    for r in results:
        assert_protected(A, values, r, primary, pl, pl)


def test_attacker_ranges_matches_a_direct_lp(hand):
    values, A, idx, primary, pl = hand
    suppressed = np.zeros(values.size, bool)
    suppressed[[idx[0, 0], idx[0, 3], idx[3, 0], idx[3, 3]]] = True
    lo, hi = attacker_ranges(A, values, suppressed, 0.0, np.inf, [idx[0, 0], idx[1, 1]])
    # (0,T) = (0,0) + 12 and (T,0) = (0,0) + 12 etc.: (0,0) can be anything >= 0
    assert lo.tolist() == [0.0, 20.0]
    assert hi.tolist() == [np.inf, 20.0]  # a published cell is its value
    assert [lo[0], hi[0]] == lp_range(A, values, suppressed, idx[0, 0])


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(forced="primary"), "both primary and forced"),
        (dict(values="broken"), "does not add up"),
        (dict(solver="GUROBI"), "unknown solver 'GUROBI'"),
        (dict(upl="negative"), "upl must be finite and >= 0"),
        (dict(lower="above"), "lower <= value <= upper"),
        (dict(time_limit=0), "time_limit must be a positive"),
        (dict(cost=[1.0, 2.0]), "cost must be a scalar or have one entry per cell"),
    ],
)
def test_invalid_input_is_refused(hand, change, match):
    values, A, idx, primary, pl = hand
    kwargs = dict(lower=0.0, upper=np.inf)
    args = dict(values=values.copy(), upl=pl.copy(), cost=values.copy())
    if change.get("forced") == "primary":
        kwargs["forced"] = primary
    if change.get("values") == "broken":
        args["values"][idx[0, 0]] += 1
    if change.get("upl") == "negative":
        args["upl"][3] = -1
    if change.get("lower") == "above":
        kwargs["lower"] = values + 1
    if "cost" in change:
        args["cost"] = change["cost"]
    for key in ("solver", "time_limit"):
        if key in change:
            kwargs[key] = change[key]
    with pytest.raises(TabularError, match=match):
        optimal_suppress(A, args["values"], primary, args["upl"], pl, args["cost"], **kwargs)


@pytest.mark.parametrize("seed", [4, 5])
def test_the_audit_module_agrees_that_primaries_are_protected(seed):
    audit = pytest.importorskip("sqlsdc.tabular.attacker")
    values, A, primary, upl, lpl = random_table(8, seed, density=0.12)
    r = solve(A, values, primary, upl, lpl, values)
    assert r.status == "optimal"
    bounds = dict(lower=np.zeros(values.size), upper=np.full(values.size, np.inf))
    intervals = audit.audit_intervals(A, values, r.suppressed, **bounds)
    assert audit.audit_check(intervals, values, primary, upl, lpl)[primary].all()
    # and one cell fewer (the cheapest secondary) would leave some primary short
    secondary = np.flatnonzero(r.suppressed & ~primary)
    fewer = r.suppressed.copy()
    fewer[secondary[np.argmin(values[secondary])]] = False
    intervals = audit.audit_intervals(A, values, fewer, **bounds)
    assert not audit.audit_check(intervals, values, primary, upl, lpl)[primary].all()
