"""Independent verification of protected tables (sqlsdc.tabular.verify) and truthful solver
statuses: small sdcTable/τ-ARGUS-style tables with known answers, magnitudes like the demo's
turnover (where unscaled costs made HiGHS return a wrong "optimal" table), and deliberately
broken solutions that the verifier must refuse."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sqlsdc.errors import TabularError, VerificationError
from sqlsdc.tabular import Table, controlled_round, cta, protect
from sqlsdc.tabular._cta_model import _model, _solve, no_solution
from sqlsdc.tabular.hierarchy import Hierarchy
from sqlsdc.tabular.verify import (
    verify_cta,
    verify_margins,
    verify_rounding,
    verify_suppression,
)

TWO_BY_TWO = pd.DataFrame(
    {"r": ["a", "a", "b", "b"], "c": ["x", "y", "x", "y"], "value": [20.0, 30.0, 25.0, 5.0],
     "n": [9, 9, 9, 1]}
)  # fmt: skip


def check(out: pd.DataFrame, table: Table):
    """The stored-value checks a job runs, from the output alone."""
    return verify_cta(table, out["adjusted"].to_numpy(), sensitive=out["sensitive"].to_numpy(),
                      upl=out["upl"].to_numpy(), lpl=out["lpl"].to_numpy())  # fmt: skip


@pytest.mark.parametrize("scale", [1.0, 1e9])
def test_cta_2d_table_with_margins_known_answer_at_any_magnitude(scale):
    """(b, y) = 5 with level 3 goes down to 2 and its row and column follow; the same answer
    for turnover-sized values (×1e9), where the costs 1/|a| fall below the solver tolerance."""
    cells = TWO_BY_TWO.assign(value=TWO_BY_TWO["value"] * scale)
    out = cta(cells, dims=["r", "c"], rules=[], sensitive=lambda c: c["n"] == 1,
              protection=3.0 * scale)  # fmt: skip
    got = {(r, c): v / scale for r, c, v in out[["r", "c", "adjusted"]].itertuples(index=False)}
    assert got[("b", "y")] == pytest.approx(2.0)
    assert got[("Total", "Total")] == pytest.approx(77.0)
    assert sum(v == 0 for v in got.values()) == 0
    report = out.attrs["cta"]
    assert report.status == "optimal" and report.gap == 0
    table = Table.from_cells(cells, ["r", "c"])
    weights = 1 / np.abs(table.values)
    assert report.objective == pytest.approx(np.sum(weights * np.abs(out["change"])), rel=1e-9)
    assert check(out, table).passed


def test_cta_hierarchical_known_answer():
    """Total → {A → {A1, A2}, B → {B1}}; A1 = 10 must move 3. Down (the alternating rule's
    first direction), the cheapest compensation (weights 1/|a|) is A2 + 3 (0.06), cheaper than
    moving A and Total (0.05 + 0.03): A1 7, A2 53, margins unchanged."""
    h = Hierarchy.from_parents({"A": "Total", "B": "Total", "A1": "A", "A2": "A", "B1": "B"})
    cells = pd.DataFrame({"g": ["A1", "A2", "B1"], "value": [10.0, 50.0, 40.0], "n": [1, 9, 9]})
    table = Table.from_cells(cells, ["g"], hierarchies={"g": h})
    out = cta(table, rules=[], sensitive=lambda c: c["n"] == 1, protection=3.0)
    got = dict(zip(out["g"], out["adjusted"], strict=True))
    assert got == pytest.approx({"Total": 100.0, "A": 60.0, "B": 40.0, "A1": 7.0, "A2": 53.0,
                                 "B1": 40.0})  # fmt: skip
    assert out.attrs["cta"].status == "optimal" and check(out, table).passed
    moved_up = out["adjusted"].to_numpy().copy()
    moved_up[list(out["g"]).index("A1")] = 9.0  # inside [7, 13]; A2 then 51 keeps A additive
    moved_up[list(out["g"]).index("A2")] = 51.0
    problems = verify_cta(
        table,
        moved_up,
        sensitive=out["sensitive"].to_numpy(),
        upl=out["upl"].to_numpy(),
        lpl=out["lpl"].to_numpy(),
    ).problems
    assert problems and problems[0].startswith("protection: 1 cell(s)")


def test_cta_verifier_refuses_broken_solutions():
    table = Table.from_cells(TWO_BY_TWO, ["r", "c"])
    out = cta(TWO_BY_TWO, dims=["r", "c"], rules=[], sensitive=lambda c: c["n"] == 1,
              protection=3.0)  # fmt: skip
    good = out["adjusted"].to_numpy()
    s, upl, lpl = out["sensitive"].to_numpy(), out["upl"].to_numpy(), out["lpl"].to_numpy()
    weights = 1 / np.abs(table.values)
    cost = float(np.sum(weights * np.abs(good - table.values)))
    args = dict(sensitive=s, upl=upl, lpl=lpl, weights=weights)
    assert verify_cta(table, good, objective=cost, **args).passed

    not_additive = good.copy()
    not_additive[0] += 1.0  # the grand total
    problems = verify_cta(table, not_additive, **args).problems
    assert any(p.startswith("additivity:") for p in problems)
    assert any(p.startswith("margins: 1 cell(s)") for p in problems)

    unprotected = table.values.copy()  # the original table: additive, nothing moved
    with pytest.raises(VerificationError, match=r"protection: 1 cell\(s\) stay inside") as e:
        verify_cta(table, unprotected, **args).require()
    assert e.value.status == "verification_failed"

    zeros = np.zeros_like(good)  # additive and "protected", but cells driven to 0 at a cost
    problems = verify_cta(table, zeros, objective=cost, **args).problems
    assert any(p.startswith("cost: reported") for p in problems)
    negative = good.copy()
    i = int(np.flatnonzero(s)[0])
    negative[i] = -1.0  # below the lower bound 0 of a non-negative table
    assert any(p.startswith("bounds:") for p in verify_cta(table, negative, **args).problems)
    nan = good.copy()
    nan[1] = np.nan
    assert verify_cta(table, nan, **args).problems[0].startswith("values: 1 cell(s)")


def test_controlled_rounding_known_answer_and_broken_roundings():
    """Salazar González's 3×3 example at base 10 (README): optimal, zero-restricted."""
    cells = pd.DataFrame({"region": ["I"] * 3 + ["II"] * 3 + ["III"] * 3,
                          "activity": list("ABC") * 3,
                          "value": [20, 50, 10, 8, 19, 22, 17, 32, 12]})  # fmt: skip
    out = controlled_round(cells, 10, dims=["region", "activity"])
    table = Table.from_cells(cells.assign(n=1), ["region", "activity"])
    rounded = out.cells["rounded"].to_numpy(np.float64)
    assert out.status == "optimal"
    checked = verify_rounding(table, rounded, 10)
    assert checked.passed and checked.checks["max_distance"] < 10

    off = rounded.copy()
    off[-1] += 3.0
    problems = verify_rounding(table, off, 10).problems
    assert any(p.startswith("multiples: 1 cell(s)") for p in problems)
    assert any(p.startswith("additivity:") for p in problems)
    moved = table.values.copy()  # the original: additive, but 8, 19, ... are not multiples
    assert any(p.startswith("multiples:") for p in verify_rounding(table, moved, 10).problems)
    far = rounded.copy()
    i = int(np.flatnonzero(table.values == 20)[0])  # a multiple of 10: must stay
    j = int(np.flatnonzero(table.values == 50)[0])  # same row: keep the row total
    far[i], far[j] = 40.0, 30.0
    problems = verify_rounding(table, far, 10).problems
    assert any(p.startswith("zero restriction: 2 cell(s)") for p in problems)
    assert any(p.startswith("distance: 2 cell(s)") for p in problems)


def test_margin_verifier_refuses_missed_margins():
    table = Table.from_cells(TWO_BY_TWO, ["r", "c"])
    values = table.values
    total = int(np.flatnonzero((table.cells["r"] == "Total") & (table.cells["c"] == "Total"))[0])
    ok = verify_margins(table, values, np.array([total]), np.array([80.0]), tolerance=1e-6)
    assert ok.passed and ok.checks["max_margin_error"] == 0
    missed = verify_margins(table, values, np.array([total]), np.array([81.0]), tolerance=1e-6)
    assert missed.problems[0].startswith("margins given: 1 cell(s) miss their given value")


def test_suppression_verifier_runs_the_attacker_audit():
    cells = pd.DataFrame(
        {
            "r": list("aabbcc"),
            "c": list("xyxyxy"),
            "value": [20.0, 30.0, 25.0, 5.0, 12.0, 14.0],
            "n": [9, 9, 9, 1, 9, 9],
        }
    )
    table = Table.from_cells(cells, ["r", "c"])
    out = protect(table, rules=[], primary=lambda c: c["n"] == 1)
    key = table.cells[["r", "c"]].merge(out[["r", "c", "status", "upl", "lpl"]], how="left")
    primary = (key["status"] == "primary").to_numpy()
    upl, lpl = key["upl"].to_numpy(float), key["lpl"].to_numpy(float)
    suppressed = (key["status"] != "published").to_numpy()
    assert primary.sum() == 1 and suppressed.sum() >= 4
    assert verify_suppression(table, suppressed, primary=primary, upl=upl, lpl=lpl).passed
    alone = verify_suppression(table, primary, primary=primary, upl=upl, lpl=lpl)
    assert alone.problems[0].startswith("audit: 1 cell(s) have an attacker interval narrower")
    published = verify_suppression(table, suppressed & ~primary, primary=primary, upl=upl, lpl=lpl)
    assert published.problems[0].startswith("primary published: 1 cell(s)")


def test_solver_statuses_are_mapped_truthfully():
    """An unbounded LP is reported unbounded, not as a timeout; only time_limit says time."""
    from scipy import sparse

    model = _model(np.zeros(1), np.full(1, np.inf), np.array([-1.0]), np.zeros(1),
                   np.full(1, np.inf), sparse.csr_matrix(np.ones((1, 1))))  # fmt: skip
    status, x, _, _ = _solve(model, "highs", "output_flag=false", 10.0)
    assert (status, x) == ("unbounded", None)
    assert "unbounded" in str(no_solution("LP", "highs", "unbounded", 60))
    assert "time_limit=60s" in str(no_solution("LP", "highs", "time_limit", 60))
    for status in ("error: ABNORMAL", "error: UNKNOWN_STATUS"):
        message = str(no_solution("LP", "glop", status, 60))
        assert "time" not in message and status in message
    assert issubclass(VerificationError, TabularError)
