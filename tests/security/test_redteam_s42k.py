"""Red team s42k: revisions of suppression jobs and the rounding audit (session 42).

The attacker reads every version of every stored output (readers keep what ``--replace``
overwrote) and runs guarded queries only; the admin runs routine jobs after each change of the
data. Findings (F fixed, H held):

- F  two spellings of one population, ``WHERE turnover > 0`` and none (the same enterprises:
     both jobs allowed), each compared with its own canonical population's versions only:
     five firms enter (C, R01), the first job is stored again (five units: published), one
     more firm enters, the second is stored again (six units against its own version:
     published); the grand totals of the two latest versions differ by that firm's exact
     turnover (1 cell, 4 jobs). Fixed: a job is compared with the kept versions of every
     population of its table and aggregate that shares cells with it now.
- F  the joint pattern: one firm (1,234,567) enters a hidden cell, three firms a published
     cell of its row; each version protected alone, but with both tables additive, the cells
     published in both known and every change known to be at least 0 (firms only entered), the
     firm's change is [1,234,567, 1,234,567] on the 20,000-person demo (1 cell, 2 versions).
     Fixed: the new version is audited with the stored one (jobs/revision_audit.py), refused.
- H  one name alternating between R01's enterprises and all of them (``--replace``), with
     five firms and then one between versions: the replacement by the other population is
     refused (forced cells of the earlier version make primaries computable), both orders.
- H  a rounding of turnover by nace x region replaced after one new firm: the smallest base
     the audit accepts is 375,353,060 (above every inner cell), and a firm of 20 bases makes
     its own cell a primary needing base 732,652,283, so the replacement is refused; versions
     tell a change within 2 bases only.
- H  the ``primary`` status of a cell published before tells that fewer units than the rules
     allow changed in it, not which or by how much: what a primary tells of any cell.
- H  coalitions: an analyst who changed two firms of a cell beside one victim's change meets
     freq:3 and p% by the rules' own definition (they protect against one other contributor).
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
from scipy.optimize import linprog

from sqlsdc.errors import TabularError
from sqlsdc.jobs.protect import protect_query
from tests.jobs.test_revisions import NEW_FIRM, RULES, change, changed_in_both, published

BY = "SELECT nace, region, SUM(turnover) FROM enterprises {where}GROUP BY nace, region"


def test_two_spellings_of_one_population_are_differenced_across_their_versions(jobs_demo_db):
    """Red team s42k (fails before the fix: the grand totals differed by 1,234,567)."""
    db = jobs_demo_db
    plain, spelled = BY.format(where=""), BY.format(where="WHERE turnover > 0 ")
    protect_query(db, "admin", plain, into="monthly", rules=RULES)
    protect_query(db, "admin", spelled, into="monthly_b", rules=RULES)
    change(db, *(NEW_FIRM.format(nace="C", region="R01", turnover=x)
                 for x in (410_000, 420_000, 430_000, 440_000, 450_000)))  # fmt: skip
    protect_query(db, "admin", plain, into="monthly", rules=RULES, replace=True)
    first = published(db, "monthly")
    change(db, NEW_FIRM.format(nace="C", region="R01", turnover=1_234_567))
    protect_query(db, "admin", spelled, into="monthly_b", rules=RULES, replace=True)
    moved = changed_in_both(first, published(db, "monthly_b"))
    assert moved.empty, moved
    assert not np.isclose(moved.value_2 - moved.value_1, 1_234_567).any()


def _statuses(db, name: str) -> pd.DataFrame:
    con = duckdb.connect(str(db), read_only=True)
    try:
        frame = con.sql(f"SELECT nace, region, status, n, value FROM protected.{name}").df()
    finally:
        con.close()
    return frame.set_index(["nace", "region"])


def _change_interval(
    first: pd.DataFrame, second: pd.DataFrame, cell, unchanged=()
) -> tuple[float, float]:
    """The attacker of the joint pattern: both versions' tables add up, published cells are
    known, firms only entered between them (every cell's change is at least 0), and the cells
    ``unchanged`` did not change (the register: a firm that entered and left in between, red
    team s43c); the interval of ``cell``'s change (scipy's HiGHS)."""
    cells = sorted(set(first.index) | set(second.index))
    at = {(v, c): i for i, (v, c) in enumerate((v, c) for v in (0, 1) for c in cells)}
    bounds = [(0.0, None)] * len(at)
    for v, frame in enumerate((first, second)):
        for c in cells:
            if c not in frame.index:
                bounds[at[v, c]] = (0.0, 0.0)
            elif frame.loc[c].status == "published":
                bounds[at[v, c]] = (float(frame.loc[c].value),) * 2
    naces = sorted({c[0] for c in cells} - {"Total"})
    regions = sorted({c[1] for c in cells} - {"Total"})
    rows = []
    for v in (0, 1):
        for a in [*naces, "Total"]:
            rows.append({at[v, (a, r)]: 1.0 for r in regions if (a, r) in cells})
            rows[-1][at[v, (a, "Total")]] = -1.0
        for r in regions:
            rows.append({at[v, (a, r)]: 1.0 for a in naces if (a, r) in cells})
            rows[-1][at[v, ("Total", r)]] = -1.0
    rows += [{at[1, c]: 1.0, at[0, c]: -1.0} for c in unchanged]
    A_eq = np.zeros((len(rows), len(at)))
    for i, row in enumerate(rows):
        for j, x in row.items():
            A_eq[i, j] += x
    A_ub = np.zeros((len(cells), len(at)))  # old - new <= 0
    for i, c in enumerate(cells):
        A_ub[i, at[0, c]], A_ub[i, at[1, c]] = 1.0, -1.0
    goal = np.zeros(len(at))
    goal[at[1, cell]], goal[at[0, cell]] = 1.0, -1.0
    ends = [linprog(sign * goal, A_ub=A_ub, b_ub=np.zeros(len(cells)), A_eq=A_eq,
                    b_eq=np.zeros(len(rows)), bounds=bounds, method="highs").fun * sign
            for sign in (1.0, -1.0)]  # fmt: skip
    return ends[0], ends[1]


def test_a_cell_hidden_in_both_versions_is_not_the_difference_of_cells_published_in_both(
    jobs_demo_db,
):
    """Red team s42k, the joint pattern (fails before the fix: stored, and the firm's change
    bounded at its exact value: [0, 1,234,567] here, [1,234,567, 1,234,567] on the
    20,000-person demo of `sqlsdc demo`). One firm (1,234,567) enters a hidden cell h, three
    firms another cell of h's row, published, of five or more; the row total changed by four
    units and that cell by three (both published again), the other hidden cells of the row by
    none. A reader who knows that firms only entered (no cell lost) reads h's change from the
    two versions, each protected on its own. Now the new version is refused (the joint audit
    of jobs/revision_audit.py), or the change is kept beyond its levels."""
    db = jobs_demo_db
    sql = BY.format(where="")
    protect_query(db, "admin", sql, into="t", rules=RULES)
    first = _statuses(db, "t")
    inner = [c for c in first.index if "Total" not in c]
    hidden = [c for c in inner if first.loc[c].status != "published"]
    shown = [c for c in inner if first.loc[c].status == "published" and first.loc[c].n >= 5]
    h, x = next((h, x) for h in hidden for x in shown if x[0] == h[0])
    change(db, NEW_FIRM.format(nace=h[0], region=h[1], turnover=1_234_567),
           *(NEW_FIRM.format(nace=x[0], region=x[1], turnover=v)
             for v in (400_000, 410_000, 420_000)))  # fmt: skip
    try:
        protect_query(db, "admin", sql, into="t", rules=RULES, replace=True)
    except TabularError as refusal:
        assert "together give cell" in str(refusal)
        assert _statuses(db, "t").equals(first)  # nothing stored
        return
    low, high = _change_interval(first, _statuses(db, "t"), h)
    # the frequency rule's level, 30 % of the change, on each side
    assert low <= 0.7 * 1_234_567 and high >= 1.3 * 1_234_567, (h, low, high)
