"""Red team s43k: which groups appear over persons ⋈ households, grouped by a household column.

Under the cell key method a group appears when a protected count of the row table's units is
positive. s43i refused counts of persons in cells that household columns define, but a query
with ``COUNT(DISTINCT h.household_id)`` or ``SUM(p.income)`` still let the groups appear by the
persons' protected count (size·n_h ± D): on the CLI demo of 20,000 persons, grouped by
municipality and ``h.size``, 158 groups appeared (the households' count shown as 0) that the
households' own table leaves out, 140 of them of 1 or 2 households, 104 of exactly one; a
third key (``h.tenure``) then told that household's tenure. Now such a group appears by the
published count of the households (the same groups as their own table), and a query without
one is refused, saying to add it.

Also found and fixed: after one new enterprise of turnover 0 or NULL the suppression universe's
revision rule (s43e) newly hid exactly that cell's counts and its margins, beside their
unchanged (known, so published) turnover: cell and value exact in two queries. A sum published
before is now revised where its cell's unit count changed, even unchanged. Left open: which
cells a revision newly hides still tells where units changed, and with NULL the table fact
``every`` flips every AVG off (39 published cells, then none): a unit without turnover came.

Held (one line each):
- totality (s43a's ``_PREDICATES``): 41 conditions that raise per row in DuckDB (INTERVAL,
  text, DATE, STRUCT, list values under IS TRUE / NOT / AND / = TRUE / IN / BETWEEN / IS
  DISTINCT FROM / COALESCE / NULLIF / IF, overflowing arithmetic, casts, pow/exp/ln/sqrt,
  ``//`` and ``%`` by data, SUBSTRING positions, LIKE ESCAPE, regexp, chr, make_date) on a
  one-person cell of the CLI demo: 40 refused, STARTS_WITH (a predicate, no error) answered.
- coarser units (s43i): window and QUALIFY, scalar/IN/EXISTS subqueries, LATERAL, UNION of
  filtered parts, NATURAL and USING joins (household_id, municipality), self-joins through
  households, GROUP BY an aggregated derived table, GROUPING SETS, HAVING SUM(h.size),
  comma joins, CREATE VIEW, and non-linear sums that are counts (CASE/SIGN/LEAST/GREATEST/
  x/x/CAST of a comparison, income*0+1): all refused (24 queries).
- a window or an outer COUNT over the groups, a CTE read by a filter: refused (the groups'
  presence against k); ROLLUP/CUBE and ORDER BY ... LIMIT with the households' count: the
  households' groups only.
- enterprises moved between cells (one UPDATE of nace): nothing published in both versions
  changed (counts, sums, AVGs), the moved cells hidden.
"""

from __future__ import annotations

import pytest

import sqlsdc
from tests.security.test_redteam_s43e import _add, _answers, _published_cell

J = "FROM persons p JOIN households h ON p.household_id = h.household_id"
OWN = "SELECT municipality, size, COUNT(*) FROM households GROUP BY 1, 2"


def _groups(con, sql) -> set:
    return {(r[0], r[1]) for r in con.execute(sql).fetchall()}


@pytest.mark.parametrize(
    "aggregates",
    [
        "COUNT(DISTINCT h.household_id)",
        "COUNT(DISTINCT p.household_id)",
        "SUM(p.income), COUNT(DISTINCT h.household_id)",
    ],
)
def test_groups_by_household_size_appear_as_in_the_households_own_table(ckm, raw_ckm, aggregates):
    """Failed before: 150-odd groups more than the households' own, most of 1 or 2."""
    through = _groups(ckm, f"SELECT p.municipality, h.size, {aggregates} {J} GROUP BY 1, 2")
    own = _groups(ckm, OWN)
    hidden = {(m, s) for m, s, n in raw_ckm.execute(OWN).fetchall()} - own
    assert len(own) > 300 and len(hidden) > 100  # groups the households' own table hides
    assert through == own


@pytest.mark.parametrize("aggregate", ["SUM(p.income)", "SUM(p.weight)"])
def test_a_sum_by_household_size_without_the_households_count_is_refused(ckm, aggregate):
    """Failed before: the groups appeared by the persons' protected count."""
    with pytest.raises(sqlsdc.PolicyViolation, match="which groups appear") as refused:
        ckm.execute(f"SELECT p.municipality, h.size, {aggregate} {J} GROUP BY 1, 2").fetchall()
    assert "COUNT(DISTINCT h.household_id)" in str(refused.value)  # in the query's own names


# -- the query path's suppression universe across new data (s43e's revision rule) -------------


@pytest.fixture
def changing(suppress_template, copy_database, tmp_path):
    return copy_database(suppress_template, tmp_path)


@pytest.mark.parametrize("turnover", [0.0, None])
def test_a_new_firm_of_turnover_0_or_null_hides_its_cell_s_sums(changing, turnover):
    """One enterprise of turnover 0 (or NULL) enters a published cell (A, R02) of the
    suppression demo: s43e's revision rule hid the counts of (A, R02), (A, *), (*, R02) and
    (*, *), no secondary, beside their turnover published unchanged as known: cell and value
    exact in two queries. A sum is revised where its cell's unit count changed."""
    before = _answers(changing)
    inner = before[
        (before.index.get_level_values(0) != "*") & (before.index.get_level_values(1) != "*")
    ]
    cell = _published_cell(before)
    _add(changing, *cell, turnover)
    after = _answers(changing)
    newly = [
        c
        for c in inner.index
        if before.loc[c, "n"] == before.loc[c, "n"] and after.loc[c, "n"] != after.loc[c, "n"]
    ]
    assert newly == [cell]  # which cell changed stays told: a revision hides, it moves nothing
    # failed before: the four cells' turnover stayed published, unchanged beside their revised
    # counts (the new firm's value: 0 or NULL)
    for changed in [cell, (cell[0], "*"), ("*", cell[1]), ("*", "*")]:
        assert after.loc[changed, "n"] != after.loc[changed, "n"]
        assert after.loc[changed, "t"] != after.loc[changed, "t"]
