"""Red team s44a: the analyst's SQL under the cell key method, against session 43's counts of
persons in cells of household columns (protected as a households' sum, s43j) and the rest of
the guarded connection. No leak was found; the attacks that held are kept here as regression
tests, and listed one line each at the end of the module with their numbers.

Scored on the CKM demo (20,000 persons, 8,734 households) as user ``analyst``.
"""

from __future__ import annotations

import pytest

from sqlsdc.errors import PolicyViolation

J = "FROM persons p JOIN households h ON p.household_id = h.household_id"
CANONICAL = f"SELECT p.municipality, COUNT(*) {J} WHERE h.size = 7 GROUP BY 1"

# the same cells (persons of households of 7, by municipality) spelled with the households
# reached otherwise: each must be seen as reading h.size (else: a count of persons, ± D, told
# 7·n_h, s43a) and must draw the canonical spelling's one noise (else: draws to average)
SAME_CELLS = {
    "natural join": "SELECT p.municipality, COUNT(*) FROM persons p NATURAL JOIN households h "
    "WHERE h.size = 7 GROUP BY 1",
    "using": "SELECT p.municipality, COUNT(*) FROM persons p JOIN households h "
    "USING (household_id) WHERE size = 7 GROUP BY 1",
    "using two columns": "SELECT p.municipality, COUNT(*) FROM persons p JOIN households h "
    "USING (household_id, municipality) WHERE size = 7 GROUP BY 1",
    "size in ON": "SELECT p.municipality, COUNT(*) FROM persons p JOIN households h "
    "ON p.household_id = h.household_id AND h.size = 7 GROUP BY 1",
    "materialized cte": "WITH x AS MATERIALIZED (SELECT household_id FROM households "
    "WHERE size = 7) SELECT p.municipality, COUNT(*) FROM persons p JOIN x "
    "ON p.household_id = x.household_id GROUP BY 1",
    "cte of a cte": "WITH y AS (SELECT household_id, size FROM households), x AS (SELECT "
    "household_id FROM y WHERE size = 7) SELECT p.municipality, COUNT(*) FROM persons p "
    "JOIN x ON p.household_id = x.household_id GROUP BY 1",
    "join inside a derived table": "SELECT m, COUNT(*) FROM (SELECT p.municipality AS m "
    "FROM persons p JOIN households h ON p.household_id = h.household_id AND h.size = 7) t "
    "GROUP BY 1",
    "quoted alias": "SELECT p.municipality, COUNT(*) FROM persons p JOIN (SELECT household_id, "
    'size AS "Sz" FROM households) x ON p.household_id = x.household_id WHERE x."Sz" = 7 '
    "GROUP BY 1",
    "star": "SELECT p.municipality, COUNT(*) FROM persons p JOIN (SELECT * FROM households) x "
    "ON p.household_id = x.household_id WHERE x.size = 7 GROUP BY 1",
    "nested derived": "SELECT p.municipality, COUNT(*) FROM persons p JOIN (SELECT "
    "household_id, s FROM (SELECT household_id, size AS s FROM households) y) x "
    "ON p.household_id = x.household_id WHERE x.s = 7 GROUP BY 1",
    "keys renamed in a cte": "WITH x AS (SELECT household_id AS hid, size AS s FROM "
    "households) SELECT p.municipality, COUNT(*) FROM persons p JOIN x ON p.household_id = "
    "x.hid WHERE x.s = 7 GROUP BY 1",
    "both sides renamed": "SELECT p.m, COUNT(*) FROM (SELECT municipality AS m, household_id "
    "AS hh FROM persons) p JOIN (SELECT household_id AS k, size FROM households) h "
    "ON p.hh = h.k WHERE h.size = 7 GROUP BY 1",
    "households first in a derived table": "SELECT t.m, COUNT(*) FROM (SELECT p.municipality "
    "AS m, h.size AS s FROM households h JOIN persons p ON h.household_id = p.household_id) t "
    "WHERE t.s = 7 GROUP BY 1",
    "persons joined again one to one": f"SELECT p.municipality, COUNT(q.age) {J} JOIN persons "
    "q ON q.person_id = p.person_id WHERE h.size = 7 GROUP BY 1",
    "a public table beside": f"SELECT p.municipality, COUNT(*) {J} JOIN regions r "
    "ON r.region = p.region WHERE h.size = 7 GROUP BY 1",
}


def _cells(con, sql) -> dict:
    return {tuple(row[:-1]): row[-1] for row in con.execute(sql).fetchall()}


@pytest.mark.parametrize("sql", SAME_CELLS.values(), ids=SAME_CELLS.keys())
def test_spellings_of_households_of_one_size_publish_the_canonical_cells(ckm, sql):
    """Every spelling is protected as the households' sum and draws its one noise: no value
    off the canonical one (a second draw), none a count of persons (± D of 7·n_h)."""
    canonical = _cells(ckm, CANONICAL)
    assert canonical and any(v != round(v) for v in canonical.values())  # a households' sum
    assert _cells(ckm, sql) == canonical


PRESENCE = {  # keys, WHERE, the count of persons protected as a households' sum
    "tenure, persons over 80": (
        "p.municipality, h.tenure",
        "",
        "COUNT(CASE WHEN p.age > 80 THEN 1 END)",
    ),
    "size, women": ("p.municipality, h.size", "WHERE p.sex = 'F'", "COUNT(*)"),
    "education, social tenants": (
        "p.municipality, p.education",
        "WHERE h.tenure = 'social'",
        "COUNT(p.income)",
    ),
    "age, social tenants": ("p.municipality, p.age", "WHERE h.tenure = 'social'", "COUNT(*)"),
}


@pytest.mark.parametrize("keys, where, count", PRESENCE.values(), ids=PRESENCE.keys())
def test_groups_of_a_households_sum_count_appear_as_the_households_own(ckm, keys, where, count):
    """A count of persons protected as a households' sum shows exactly the groups that the
    households' own protected count shows (COUNT(DISTINCT h.household_id), same cells): its
    presence is no second draw (384, 516, 249 and 550 groups on the demo, all equal)."""
    sql = f"SELECT {keys}, {{}} {J} {where} GROUP BY 1, 2"
    persons = _cells(ckm, sql.format(count))
    households = _cells(ckm, sql.format("COUNT(DISTINCT h.household_id)"))
    assert len(persons) > 100
    assert set(persons) == set(households)


ROW_OPERATIONS = {
    "union all": "UNION ALL SELECT household_id FROM households WHERE false",
    "union": "UNION SELECT household_id FROM households WHERE size = 7",
    "intersect": "INTERSECT SELECT household_id FROM households",
    "except": "EXCEPT SELECT household_id FROM households WHERE size <> 7",
}


@pytest.mark.parametrize("tail", ROW_OPERATIONS.values(), ids=ROW_OPERATIONS.keys())
def test_households_combined_row_by_row_are_refused(ckm, tail):
    """A set operation could hide which households a derived table keeps (or repeat them)."""
    sql = (
        "SELECT p.municipality, COUNT(*) FROM persons p JOIN (SELECT household_id FROM "
        f"households WHERE size = 7 {tail}) x ON p.household_id = x.household_id GROUP BY 1"
    )
    with pytest.raises(PolicyViolation):
        ckm.execute(sql).fetchall()


REFUSED = {
    "in subquery": "SELECT p.municipality, COUNT(*) FROM persons p WHERE p.household_id IN "
    "(SELECT household_id FROM households WHERE size = 7) GROUP BY 1",
    "exists": "SELECT p.municipality, COUNT(*) FROM persons p WHERE EXISTS (SELECT 1 FROM "
    "households h WHERE h.household_id = p.household_id AND h.size = 7) GROUP BY 1",
    "semi join": "SELECT p.municipality, COUNT(*) FROM persons p SEMI JOIN households h "
    "ON p.household_id = h.household_id AND h.size = 7 GROUP BY 1",
    "anti join": "SELECT p.municipality, COUNT(*) FROM persons p ANTI JOIN households h "
    "ON p.household_id = h.household_id AND h.size < 7 GROUP BY 1",
    "scalar subquery key": "SELECT p.municipality, (SELECT MAX(size) FROM households h WHERE "
    "h.household_id = p.household_id) AS s, COUNT(*) FROM persons p GROUP BY 1, 2",
    "comma join": "SELECT p.municipality, COUNT(*) FROM persons p, households h WHERE "
    "p.household_id = h.household_id AND h.size = 7 GROUP BY 1",
    "persons self-join": "SELECT p.municipality, COUNT(*) FROM persons p JOIN persons q "
    "ON p.household_id = q.household_id GROUP BY 1",
    "distinct households": "SELECT p.municipality, COUNT(*) FROM persons p JOIN (SELECT "
    "DISTINCT household_id FROM households WHERE size = 7) x "
    "ON p.household_id = x.household_id GROUP BY 1",
    "qualify households": "SELECT p.municipality, COUNT(*) FROM persons p JOIN (SELECT "
    "household_id FROM households QUALIFY size = 7) x ON p.household_id = x.household_id "
    "GROUP BY 1",
    "benefits (DP) in a CKM count": "SELECT b.scheme, COUNT(DISTINCT p.person_id) FROM persons "
    "p JOIN benefits b ON b.person_id = p.person_id GROUP BY 1",
    "benefits filtered in a derived table": "SELECT p.sex, COUNT(*) FROM persons p JOIN "
    "(SELECT person_id FROM benefits WHERE amount > 2000) x ON x.person_id = p.person_id "
    "GROUP BY 1",
    "benefits in a cte": "WITH x AS (SELECT person_id, scheme FROM benefits) SELECT x.scheme, "
    "COUNT(DISTINCT p.person_id) FROM persons p JOIN x ON x.person_id = p.person_id GROUP BY 1",
    "benefits beside households": "SELECT p.region, COUNT(DISTINCT h.household_id) FROM "
    "persons p JOIN households h ON p.household_id = h.household_id JOIN benefits b "
    "ON b.person_id = p.person_id WHERE b.scheme = 'child' GROUP BY 1",
}


@pytest.mark.parametrize("sql", REFUSED.values(), ids=REFUSED.keys())
def test_other_ways_to_households_or_benefits_are_refused(ckm, sql):
    """Households read through a subquery or a row-repeating join, and the DP table benefits
    read inside a CKM aggregation (its rows would be released without a charge), are refused."""
    with pytest.raises(PolicyViolation):
        ckm.execute(sql).fetchall()


def test_post_processing_is_not_evaluated_on_hidden_groups(ckm, raw_ckm):
    """An expression over a published count that fails on 0 (``CAST(COUNT(*) - 1 AS
    UTINYINT)``) would tell that a hidden group (a count of 1 or 2 published as 0) exists if it
    ran on it. It runs on the shown groups only: answered, with the shown groups' values."""
    where = "WHERE municipality = 'R01-M001'"
    shown = _cells(ckm, f"SELECT age, COUNT(*) FROM persons {where} GROUP BY 1")
    exact = _cells(raw_ckm, f"SELECT age, COUNT(*) FROM persons {where} GROUP BY 1")
    assert len(exact) - len(shown) >= 10  # hidden groups exist (27 of 30 on the demo)
    minus_one = _cells(
        ckm, f"SELECT age, CAST(COUNT(*) - 1 AS UTINYINT) FROM persons {where} GROUP BY 1"
    )
    assert minus_one == {k: v - 1 for k, v in shown.items()}


STARS = {
    "count": "SELECT COUNT(p.*) FROM persons p",
    "count by table name": "SELECT COUNT(persons.*) FROM persons",
    "distinct": "SELECT COUNT(DISTINCT p.*) FROM persons p",
    "sum": "SELECT SUM(p.*) FROM persons p",
    "where": "SELECT COUNT(*) FROM persons p WHERE p.* IS NOT NULL",
    "coalesce": "SELECT COUNT(*) FROM persons p WHERE COALESCE(p.*) IS NOT NULL",
    "group by": "SELECT p.sex FROM persons p GROUP BY p.*",
    "order by": "SELECT sex, COUNT(*) FROM persons p GROUP BY sex ORDER BY COUNT(p.*)",
    "joined table": f"SELECT p.sex, COUNT(h.*) {J} GROUP BY 1",
}


@pytest.mark.parametrize("sql", STARS.values(), ids=STARS.keys())
def test_every_column_of_a_confidential_table_inside_an_expression_is_refused(ckm, sql):
    """``p.*`` inside an expression names no one declared column: on main all 9 spellings
    raised InternalError ("column p.* resolved outside the policy ... a bug in sqlsdc"), fail
    closed but told as a bug, the CLI's internal-error exit. Now a PolicyViolation that says
    what to write instead. A public table's ``COUNT(r.*)`` stays answered."""
    with pytest.raises(PolicyViolation, match=r"every column of \w+\) cannot be used"):
        ckm.execute(sql).fetchall()
    assert ckm.execute("SELECT COUNT(r.*) FROM regions r").fetchall() == [(8,)]


NEVER, ALWAYS = "age > 500", "age >= 0"
ORACLES = [  # an error exactly where {c} holds: both spellings must behave alike
    "(CASE WHEN {c} THEN occupation ELSE 'true' END) = TRUE",
    "(CASE WHEN {c} THEN occupation ELSE 'true' END) BETWEEN FALSE AND TRUE",
    "(CASE WHEN {c} THEN occupation ELSE 'true' END) IS NOT DISTINCT FROM TRUE",
    "(CASE WHEN {c} THEN occupation ELSE 'true' END) = ANY([TRUE])",
    "GREATEST(CASE WHEN {c} THEN occupation ELSE 'true' END, TRUE)",
    "(age, 1) = (CASE WHEN {c} THEN occupation ELSE '1' END, 1)",
    "DATE '2000-01-01' + CASE WHEN {c} THEN 2000000000 ELSE 1 END > DATE '1999-01-01'",
    "INTERVAL 1 DAY * CASE WHEN {c} THEN 9223372036854775807 ELSE 1 END > INTERVAL 1 DAY",
    "'x' LIKE (CASE WHEN {c} THEN 'a\\' ELSE 'a' END) ESCAPE '\\'",
    "make_date(2000, CASE WHEN {c} THEN 13 ELSE 1 END, 1) > DATE '1999-01-01'",
    "substr(occupation, CASE WHEN {c} THEN -9223372036854775807 ELSE 1 END) > 'a'",
    "starts_with(occupation, CASE WHEN {c} THEN 1 ELSE 2 END)",
    "abs(CAST(age AS BIGINT) - 9223372036854775807 - CASE WHEN {c} THEN 2 ELSE 0 END) > 0",
]


def _outcome(con, sql):
    try:
        return ("answered", con.execute(sql).fetchall())
    except PolicyViolation:
        return ("refused", None)


@pytest.mark.parametrize("condition", ORACLES)
def test_an_error_does_not_tell_whether_a_condition_holds(ckm, condition):
    """Each condition fails in the engine exactly where ``{c}`` holds, if it is run: it is
    refused, or answered without error, whether ``{c}`` holds for no one or for everyone."""
    never, always = (
        _outcome(ckm, f"SELECT COUNT(*) FROM persons WHERE {condition.format(c=c)}")
        for c in (NEVER, ALWAYS)
    )
    assert never[0] == always[0]


# Attacks that held (s44a), one line each:
# - household columns reached by NATURAL JOIN, USING (1 or 2 columns), ON, a MATERIALIZED CTE,
#   a CTE of a CTE, a join inside a derived table, a quoted alias, SELECT *, nested derived
#   tables, renamed keys, a 1:1 self-join, a public table beside: all 15 spellings published
#   the canonical per-household sum's 4 cells to the bit
#   (no count of persons, no second draw); ROLLUP / outer joins / twice-joined households fall
#   back to s43i's refusals.
# - IN / EXISTS / scalar subqueries, SEMI / ANTI / comma joins, persons self-joined on
#   household_id, DISTINCT / QUALIFY / UNION / INTERSECT / EXCEPT of households: all refused.
# - benefits (DP) inside a CKM aggregation over persons (4 spellings): refused, nothing charged.
# - persons' COUNT(*) and COUNT(DISTINCT household_id) by municipality x age are two
#   independent draws of one number in 97 % of the cells (one person per household: 2,803
#   of 2,879 cells of R01-R03): a Bayesian reading with the demo's count ptable and the
#   cells' own prior names the true count for 1,551 cells instead of 1,339, never with 90 %
#   confidence, and no shown count of 1 or 2 with 95 % (inherent: two units, two keys).
# - an identifier compared with itself beside the unique key (e.holding_id = f.holding_id
#   AND e.enterprise_id = f.enterprise_id) is answered: a NOT NULL filter on an identifier,
#   which WHERE refuses; the demo has no NULL holding_id or household_id (nothing to learn).
#   Comparing two different identifiers (p.person_id = h.household_id: 2 persons) is refused.
# - per-household counts of persons by person columns (municipality x age, region R01, 377
#   cells, c_h = 1 in 99 %): published / COUNT(DISTINCT h.household_id) gave c̄·f with f in
#   [0.51, 1.53] for one-person cells; groups appear exactly as the households' own count
#   shows them (377 = 377); no candidate count ruled out beyond the households' ptable.
# - the grand total drawn three ways (persons' COUNT(*), the per-household count, households'
#   SUM(size)): 3 independent draws (20004, 20001.75, 20000.625 of 20000), not more; trivially
#   true household filters (h.size >= 1, GROUP BY h.size * 0.0) repeat the per-household draw.
# - COUNT(DISTINCT expression) through derived tables / CTEs (age // 10, CAST, CASE): refused as
#   expressions; COUNT(DISTINCT h.tenure) over persons: refused (joined table's dimension).
# - post-processing (LN, CAST to TINYINT/UTINYINT) of published counts: evaluated after hidden
#   groups are dropped (27 hidden groups of R01-M001, no error).
# - 107 error-oracle templates (casts to BOOLEAN, DECIMAL(p,s), FLOAT, HUGEINT, ENUM, DATE;
#   ESCAPE, SIMILAR TO, GLOB, regexp, make_date, date/interval overflow, substr/left/lpad/
#   repeat/split_part positions, ** / << / factorial, ln/sqrt/exp of exact numbers, XOR, LIKE
#   ANY, && / @>, ANY/ALL, simple CASE operands, list/struct/array comparisons): refused or
#   total for both a never-true and an always-true condition (13 kept as tests above).
# - window functions, ORDER BY / LIMIT / OFFSET over groups (ROW_NUMBER, RANK, LAG, COUNT(*)
#   OVER ()): computed on the 3 shown groups of R01-M001 only, not its 27 hidden ones; an
#   outer query over an aggregation (COUNT, MIN/MAX, LIMIT, scalar subquery, LEFT JOIN from a
#   public table) sees groups of a protected count of at least 10 only (0 of 3 there).
# - a count of persons in cells of household columns through a SUM of a value constant in
#   practice (LEAST(age, 0) + 1, age // 200 + 1, CAST(age >= 0 AS INT), POWER(x, 0), x / x,
#   LENGTH, two-branch CASE, 17 spellings, and 6 through derived tables): all refused
#   (totality, linear form), so no pinned sum of all members tells the persons' n̂.
# - enterprises joined on holding_id (self-join, holding_id = enterprise_id), grouped or
#   filtered by holding_id, COUNT(DISTINCT holding_id), persons joined on region: refused.
