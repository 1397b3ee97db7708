"""s43m: red team on counts of persons in cells of household columns, protected as household
sums (s43j, :attr:`sqlsdc.planner.plan.CellPlan.per_unit_counts`).

Such a count is a CKM magnitude: its noise is a function of the contributions (household, c_h)
and its published value has 18 significant bits, so two counts of one cell are equal exactly
when every household adds the same number of persons to both, and differ otherwise (a key
collision aside, 2^-32). ``COUNT(*)`` next to ``COUNT(CASE WHEN p.age >= a THEN 1 END)`` of one
cell is then a yes/no oracle "is everyone in the cell at least a", in both directions: bisection
gives the youngest member's exact age, and comparing ``age >= a`` with ``age >= a + 1`` tells
whether anyone is aged a. On the 20,000-person demo, region R08 (6 statements of 21 thresholds
each, municipality x household size): every age of every member of all 11 one-household cells
shown (11 of 11 households, 2 to 6 members), the exact age support of 24 of 54 cells.

The persons' own CKM counts (integers) have the one-way half of this (values differ ⇒ the
counted persons differ, the consistency of the cell key method): by p.municipality, p.sex,
p.education in R08, 2 statements found 1,004 of 1,227 ages present, none false, every age of
7 of 18 cells of 1-2 persons. The sums' values, continuous, add the other direction (equal ⇒
same contributions), which turns the bisection into an exact answer. Not fixed in session 43:
a per-spelling key lets spellings of one count be averaged (what s43j prevented), so the fix
is a design decision for the lead (see the report); the tests are strict xfails with numbers.

The households' tenure is told the same way, and not only by the new counts: next to
``COUNT(*)`` by municipality and size, ``COUNT(CASE WHEN h.tenure = t THEN 1 END)`` equals it
exactly where every household of the cell has tenure t. One statement: 94 of 542 cells told one
tenure for all their households (94 right), among them the exact tenure of all 43
one-household cells shown. The households' own ``SUM(size)`` beside ``SUM(CASE WHEN tenure = t
THEN size END)`` gives the same 94 and 43 (older than s43j: the per-unit count inherits the
magnitudes' oracle, as s43j said it tells what that sum tells). On the tests' demo: the youngest
member's exact age in 6 of 6 one-household cells (8 statements each), the exact tenure of 46 of
46 single households shown, by either spelling.
"""

from __future__ import annotations

import pytest

J = "FROM persons p JOIN households h ON p.household_id = h.household_id"


def _youngest_by_equality(con, where: str) -> tuple[int, int]:
    """The youngest member's age of a cell, by bisection on equal published counts; queries."""
    base = con.execute(f"SELECT COUNT(*) {J} WHERE {where}").fetchall()[0][0]
    lo, hi, queries = 0, 127, 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        sql = f"SELECT COUNT(CASE WHEN p.age >= {mid} THEN 1 END) {J} WHERE {where}"
        value = con.execute(sql).fetchall()[0][0]
        queries += 1
        lo, hi = (mid, hi) if value == base else (lo, mid - 1)
    return lo, queries


@pytest.mark.xfail(
    strict=True,
    reason="s43m: equal household-sum counts tell that every member is at least a: the exact "
    "age of the youngest member of every one-household cell shown, 8 statements each "
    "(R08 on the 20,000-person demo: every age of 11 of 11 such households)",
)
def test_equal_counts_do_not_tell_the_youngest_members_age(ckm, raw_ckm):
    shown = {
        (m, s)
        for m, s, v in ckm.execute(
            f"SELECT h.municipality, h.size, COUNT(*) {J} WHERE h.region IN ('R07', 'R08') "
            "GROUP BY 1, 2"
        ).fetchall()
        if v
    }
    truth = raw_ckm.execute(
        f"SELECT h.municipality, h.size, MIN(p.age) {J} WHERE h.region IN ('R07', 'R08') "
        "GROUP BY 1, 2 HAVING COUNT(DISTINCT h.household_id) = 1 ORDER BY 1, 2"
    ).fetchall()
    cells = [(m, s, age) for m, s, age in truth if (m, s) in shown][:6]
    assert len(cells) >= 4  # one-household cells the households' protected count shows
    exact = 0
    for m, s, age in cells:
        found, queries = _youngest_by_equality(ckm, f"h.municipality = '{m}' AND h.size = {s}")
        assert queries <= 8
        exact += found == age
    assert exact <= len(cells) // 2, f"the youngest member's exact age in {exact} of {len(cells)}"


TENURE = {
    "persons counted per household (s43j)": (
        "SELECT h.municipality, h.size, COUNT(*), {cases} " + J + " GROUP BY 1, 2",
        "COUNT(CASE WHEN h.tenure = '{t}' THEN 1 END)",
    ),
    "households' own SUM(size)": (
        "SELECT municipality, size, SUM(size), {cases} FROM households GROUP BY 1, 2",
        "SUM(CASE WHEN tenure = '{t}' THEN size END)",
    ),
}


@pytest.mark.xfail(
    strict=True,
    reason="s43m: equal CKM sums tell that every household of a cell has tenure t: one "
    "statement, the exact tenure of all 43 one-household cells shown on the 20,000-person demo "
    "(the households' SUM(size) the same: the magnitudes' oracle, older than s43j)",
)
@pytest.mark.parametrize("sql", TENURE.values(), ids=TENURE.keys())
def test_equal_sums_do_not_tell_a_single_households_tenure(ckm, raw_ckm, sql):
    tenures = ["owner", "social", "tenant"]
    statement, case = sql
    cases = ", ".join(case.format(t=t) for t in tenures)
    rows = ckm.execute(statement.format(cases=cases)).fetchall()
    truth = {
        (m, s): (n, t)
        for m, s, n, t in raw_ckm.execute(
            "SELECT municipality, size, COUNT(*), MIN(tenure) FROM households GROUP BY 1, 2"
        ).fetchall()
    }
    single = told = 0
    for m, s, total, *by_tenure in rows:
        n, tenure = truth[(m, s)]
        if not total or n != 1:
            continue
        single += 1
        told += [t for t, v in zip(tenures, by_tenure, strict=True) if v == total] == [tenure]
    assert single >= 10  # one-household cells the households' protected count shows
    assert told <= single // 2, f"the exact tenure of {told} of {single} single households"
