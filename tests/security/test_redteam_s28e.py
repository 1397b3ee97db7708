"""Red-team round of session 28 (fifth), against the cell key method's link between a cell's
rows and its noise key: record keys lost or repeated through joins, UNION ALL, derived tables,
DISTINCT and grouping sets (two cells of different rows under one key, or a row counted twice
in a count but once in its key), expressions that could raise for some confidential values
only (casts, integer arithmetic, computed string positions, divisors), and a LEFT JOIN that
adds public rows to a count whose key sums the confidential rows only.

Nothing succeeded in this round: every attempt was refused with sqlsdc's own message, or was
answered with the noise of the same rows however the cell was phrased. The areas that held
are pinned below, one test each; each asserts the safe outcome.
"""

from __future__ import annotations

import pytest

import sqlsdc


@pytest.fixture
def ckm(ckm_db):
    """A guarded analyst connection to the demo database with its shipped CKM policy."""
    con = sqlsdc.connect(ckm_db, user="analyst")
    yield con
    con.close()


def rows(con, sql: str) -> list[tuple]:
    """The released rows of ``sql`` on the guarded connection ``con``, sorted."""
    cur = con.cursor()
    cur.execute(sql)
    return sorted(cur.fetchall(), key=repr)


@pytest.mark.parametrize(
    "sql",
    [
        # each person twice in a cell whose key would sum each key once (or twice)
        "SELECT sex, COUNT(*) FROM (SELECT * FROM persons UNION ALL SELECT * FROM persons) "
        "GROUP BY sex",
        "SELECT COUNT(*) FROM (SELECT sex FROM persons UNION SELECT sex FROM persons)",
        "SELECT sex, COUNT(*) FROM (SELECT DISTINCT sex, region FROM persons) GROUP BY sex",
        # a derived table whose GROUP BY column repeats its groups
        "SELECT COUNT(*) FROM persons p JOIN (SELECT region, COUNT(*) AS n FROM persons "
        "GROUP BY GROUPING SETS ((region), (region))) x ON p.region = x.region",
        "SELECT p.sex, COUNT(*) FROM persons p JOIN (SELECT region FROM regions "
        "GROUP BY CUBE(region, region)) x ON p.region = x.region GROUP BY p.sex",
        "SELECT COUNT(*) FROM persons p JOIN (SELECT region FROM regions GROUP BY region "
        "UNION ALL SELECT region FROM regions GROUP BY region) x ON p.region = x.region",
        "SELECT COUNT(*) FROM persons p JOIN (SELECT region || '' AS region, COUNT(*) AS n "
        "FROM persons GROUP BY region) x ON p.region = x.region",
        # a join whose condition is not the key equality alone
        "SELECT r.name, COUNT(*) FROM persons p JOIN regions r ON p.region = r.region OR true "
        "GROUP BY r.name",
        "SELECT r.name, COUNT(*) FROM persons p JOIN regions r "
        "ON upper(p.region) = upper(r.region) GROUP BY r.name",
        # public rows with no confidential row counted beside the keys of the confidential ones
        "SELECT COUNT(*) FROM regions r LEFT JOIN persons p ON p.region = r.region AND p.age > 100",
        # subqueries and per-aggregate filters over confidential rows
        "SELECT sex, COUNT(*) FROM persons WHERE person_id NOT IN "
        "(SELECT person_id FROM benefits) GROUP BY sex",
        "SELECT sex, COUNT(*) FILTER (WHERE age > 50) FROM persons GROUP BY sex",
    ],
)
def test_rows_repeated_or_added_beside_their_keys_are_refused(ckm, sql):
    with pytest.raises(sqlsdc.PolicyViolation):
        ckm.cursor().execute(sql)


@pytest.mark.parametrize(
    "where",
    [
        "age // 0 = 1",
        "CAST(age AS TINYINT) = 1",
        "CAST(income AS INTEGER) > 1",
        "CAST(municipality AS INTEGER) = 5",
        "substr(municipality, age - 50, 2) = 'a'",
        "age % (age - 50) = 1",
        "1 / (age - 50) > 1",
        "-age > 1",
        "abs(age - 2147483647 - 1) > 1",
        "sqrt(age - 50) > 1",
        "CAST(age AS HUGEINT) * age * age > 1",
        "DATE '2000-01-01' + age > DATE '2000-02-01'",
        "[1, 2, 3][age] = 1",
    ],
)
def test_conditions_that_could_raise_for_some_values_are_refused(analyst, where):
    """An expression that raises for some confidential values only is an oracle on them."""
    with pytest.raises(sqlsdc.PolicyViolation):
        analyst.cursor().execute(f"SELECT sex, COUNT(*) FROM persons WHERE {where} GROUP BY sex")


def test_integer_products_in_sums_are_refused(analyst):
    """``SUM(age * 2147483647)`` could overflow for some ages: refused, not an engine error."""
    with pytest.raises(sqlsdc.PolicyViolation, match="overflow"):
        analyst.cursor().execute("SELECT sex, SUM(age * 2147483647) FROM persons GROUP BY sex")


def test_the_same_rows_get_the_same_noise_through_joins(ckm):
    """A cell's noise is keyed by its rows: persons by sex with and without the join to their
    households (unique per person), and the persons left unmatched by a LEFT JOIN on a
    condition, equal the cells counted directly."""
    direct = rows(ckm, "SELECT sex, COUNT(*) FROM persons GROUP BY sex")
    joined = rows(
        ckm,
        "SELECT p.sex, COUNT(*) FROM persons p JOIN households h "
        "ON p.household_id = h.household_id GROUP BY p.sex",
    )
    assert joined == direct
    left = dict(
        rows(
            ckm,
            "SELECT h.tenure, COUNT(*) FROM persons p LEFT JOIN households h "
            "ON p.household_id = h.household_id AND p.age > 80 GROUP BY h.tenure",
        )
    )
    inner = dict(
        rows(
            ckm,
            "SELECT h.tenure, COUNT(*) FROM persons p JOIN households h "
            "ON p.household_id = h.household_id WHERE p.age > 80 GROUP BY h.tenure",
        )
    )
    unmatched = rows(ckm, "SELECT COUNT(*) FROM persons WHERE age <= 80 OR age IS NULL")
    assert {k: v for k, v in left.items() if k is not None} == inner
    assert left[None] == unmatched[0][0]


def test_repeated_grouping_sets_repeat_one_cell_with_one_value(ckm):
    """``GROUPING SETS ((sex), (sex))`` returns each cell twice, with the same noise."""
    released = rows(ckm, "SELECT sex, COUNT(*) FROM persons GROUP BY GROUPING SETS ((sex), (sex))")
    assert released[0] == released[1] and released[2] == released[3]
    assert sorted(set(released)) == rows(ckm, "SELECT sex, COUNT(*) FROM persons GROUP BY sex")
