"""s43j: counts of persons in cells of household columns are protected as a magnitude sum over
households (:attr:`sqlsdc.planner.plan.CellPlan.per_unit_counts`), not refused.

Over ``persons ⋈ households`` every household adds all its persons of a cell at once (c_h),
so the count is published as the households' own ``SUM`` of such values is: keyed by the
households' record keys, perturbed from its largest c_h by their magnitude ptable, under their
mean floor counted by households. Grouped or filtered by ``h.size`` the count is size·n_h; as
a count of persons (± D) it told hidden household counts of 1-2 (s43a, refused by s43i); as a
sum over households it tells no more than the households' own ``SUM(size)``. Keyed by the
households alone (same key for adults and for persons of 17 and over), the noise factor
cancelled in the ratio of two such counts under the mean floor: 66 of 91 cells told the exact
ratio of their true counts, so the noise is drawn with a key of the contributions (unit, c_h).
Every test here fails on main, where these counts are refused.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from tests.security.test_redteam_s43i import PROTECTED_AS_SUMS

J = "FROM persons p JOIN households h ON p.household_id = h.household_id"
D = 5  # the demo's count ptable


def _cells(con, sql) -> dict:
    return {tuple(row[:-1]): row[-1] for row in con.execute(sql).fetchall()}


@pytest.mark.parametrize("sql", PROTECTED_AS_SUMS.values(), ids=PROTECTED_AS_SUMS.keys())
def test_counts_in_cells_of_household_columns_are_answered_as_household_sums(ckm, raw_ckm, sql):
    cursor = ckm.execute(sql)
    published = {tuple(r[:-1]): r[-1] for r in cursor.fetchall()}
    assert cursor.query.columns[-1].mechanism == "ckm"
    exact = _cells(raw_ckm, sql)
    assert published and set(published) <= set(exact)
    values = [(v, exact[k]) for k, v in published.items() if v is not None and exact[k]]
    # perturbed: a magnitude. A large cell's noise can fall under its last published bit (6084
    # of 8 cells by size was published as 6084.0 in one CI run; about 1 in 3,600 cells over
    # all spellings): at least half, not 90 %, so that 8 cells do not flake
    assert sum(v != e for v, e in values) >= 0.5 * len(values)
    large = [(v, e) for v, e in values if e >= 200]  # useful where cells are not small
    assert all(abs(v - e) <= 0.25 * e for v, e in large), large


SIZED = {  # a spelling whose cells hold households of one size s, and the households' own sum
    "key": (
        f"SELECT h.municipality, h.size, COUNT(*) {J} GROUP BY 1, 2",
        "SELECT municipality, size, SUM(size) FROM households GROUP BY 1, 2",
    ),
    "persons' key": (
        f"SELECT p.municipality, h.size, COUNT(*) {J} GROUP BY 1, 2",
        "SELECT municipality, size, SUM(size) FROM households GROUP BY 1, 2",
    ),
    "where": (
        f"SELECT p.municipality, 5, COUNT(*) {J} WHERE h.size = 5 GROUP BY 1",
        "SELECT municipality, 5, SUM(size) FROM households WHERE size = 5 GROUP BY 1",
    ),
    "derived": (
        "SELECT p.municipality, 7, COUNT(*) FROM persons p JOIN (SELECT household_id FROM "
        "households WHERE size = 7) AS x ON p.household_id = x.household_id GROUP BY 1",
        "SELECT municipality, 7, SUM(size) FROM households WHERE size = 7 GROUP BY 1",
    ),
}


@pytest.mark.parametrize("sql, own", SIZED.values(), ids=SIZED.keys())
def test_persons_by_household_size_tell_no_more_than_the_households_sum(ckm, raw_ckm, sql, own):
    """s43a's attack on every spelling: n_h = the k with |v - size·k| ≤ D (one candidate),
    or round(v/size), on cells of 1 or 2 households. It proves no more than on the
    households' own SUM(size) of the same cells, whose cells it shows exactly (same presence),
    and guesses at the rate of chance."""
    truth = {
        (m, s): n
        for m, s, n in raw_ckm.execute(
            "SELECT municipality, size, COUNT(*) FROM households GROUP BY ALL"
        ).fetchall()
    }
    persons, households = _cells(ckm, sql), _cells(ckm, own)
    assert set(persons) == set(households)  # shown by the households' protected count

    def found(published: dict) -> tuple[int, int]:
        proved = guessed = 0
        for (m, s), v in published.items():
            if truth[(m, s)] > 2 or v is None:
                continue
            fits = [k for k in range(1, 1000) if abs(v - s * k) <= D]
            proved += fits == [truth[(m, s)]]
            guessed += round(v / s) == truth[(m, s)]
        return proved, guessed

    small = sum(truth[c] <= 2 for c in persons)
    assert small >= (10 if "GROUP BY 1, 2" in sql else 0)  # sizes 5, 7 alone: few
    (proved, guessed), (own_proved, own_guessed) = found(persons), found(households)
    # s43a proved 46 of 48 such cells; a guess hits by chance about as often as on the
    # households' own sum, both draws of one mechanism under fresh record keys each session
    # (17 and 9 of 107 cells by municipality and size; 9 and 4 of 17 with size 5)
    # (a fit within ± D is no proof under this noise: 0 to 2 chance fits, as own_proved's)
    assert proved <= max(own_proved, 1) + 2, (proved, own_proved, small)
    assert guessed <= 0.4 * small + 3, (guessed, own_guessed, small)


def test_two_counts_of_the_same_households_do_not_tell_the_ratio_of_their_counts(ckm, raw_ckm):
    """Adults and persons of 17 and over by municipality and size: the same households, other
    contributions. Keyed by the households alone both drew one noise factor, which cancelled in
    their ratio under the mean floor (66 of 91 cells told x_a/x_b exactly, and with it the
    17-year-olds of a few households)."""
    qa = f"SELECT h.municipality, h.size, COUNT(*) {J} WHERE p.age >= 18 GROUP BY 1, 2"
    qb = f"SELECT h.municipality, h.size, COUNT(*) {J} WHERE p.age >= 17 GROUP BY 1, 2"
    a, b = _cells(ckm, qa), _cells(ckm, qb)
    ta, tb = _cells(raw_ckm, qa), _cells(raw_ckm, qb)
    differ = [c for c in a if c in b and a[c] and b[c] and ta[c] != tb[c]]
    assert len(differ) >= 30
    ratio = {c: Fraction(a[c] / b[c]).limit_denominator(200) for c in differ}
    exact = [c for c in differ if ratio[c] == Fraction(ta[c], tb[c])]
    assert len(exact) <= 0.1 * len(differ), f"{len(exact)} of {len(differ)} ratios exact"


def test_spellings_of_one_count_publish_one_value(ckm):
    """COUNT(*), COUNT(p.sex) and a filter that keeps every person count the same
    contributions: one key, one value (no second draw to average)."""
    star = _cells(ckm, f"SELECT h.tenure, COUNT(*) {J} GROUP BY 1")
    column = _cells(ckm, f"SELECT h.tenure, COUNT(p.sex) {J} GROUP BY 1")
    kept = _cells(ckm, f"SELECT h.tenure, COUNT(*) {J} WHERE h.size >= 1 GROUP BY 1")
    assert len(star) == 3 and star == column == kept
