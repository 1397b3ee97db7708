"""A distinct count of units under the cell key method (and rounding) is keyed by the counted
units' own record keys, however the query reaches them (red team s29b;
``sqlsdc.rewrite.counted_units``).

``COUNT(DISTINCT persons.household_id)`` counts households: it is keyed by the households'
record keys, looked up through the declared reference, as ``COUNT(DISTINCT h.household_id)``
over a join and ``COUNT(*)`` of households are, so every spelling of one set of households
is one noise and there is nothing to average. The attacks tried here: every allowed spelling
(join in either direction, LEFT JOIN, derived tables and CTEs, a filter on persons), the
spellings the guard refuses (subqueries, DISTINCT rows, computed identifiers), a reference
that matches no household (orphans, NULLs), and a column that is not a reference, which keeps
its own statistic's noise.
"""

from __future__ import annotations

import duckdb
import pytest

import sqlsdc
from tests.security.test_redteam_s28e import rows

JOIN = "persons AS p JOIN households AS h ON p.household_id = h.household_id"
SPELLINGS = [
    "SELECT region, COUNT(DISTINCT household_id) FROM persons {where} GROUP BY region",
    "SELECT p.region, COUNT(DISTINCT h.household_id) FROM " + JOIN + " {where} GROUP BY p.region",
    "SELECT p.region, COUNT(DISTINCT p.household_id) FROM " + JOIN + " {where} GROUP BY p.region",
    "SELECT p.region, COUNT(DISTINCT h.household_id) FROM households AS h JOIN persons AS p "
    "ON h.household_id = p.household_id {where} GROUP BY p.region",
    "SELECT p.region, COUNT(DISTINCT p.household_id) FROM persons AS p LEFT JOIN households "
    "AS h ON p.household_id = h.household_id {where} GROUP BY p.region",
    "SELECT p.region, COUNT(DISTINCT h.hid) FROM persons AS p JOIN (SELECT household_id AS "
    "hid, tenure FROM households) AS h ON p.household_id = h.hid {where} GROUP BY p.region",
    "SELECT p.region, COUNT(DISTINCT p.hid) FROM (SELECT region, age, household_id AS hid "
    "FROM persons) AS p {where} GROUP BY p.region",
    "WITH p AS (SELECT region, age, household_id FROM persons) "
    "SELECT p.region, COUNT(DISTINCT p.household_id) FROM p {where} GROUP BY p.region",
]


@pytest.mark.parametrize("where", ["", "WHERE p.age > 30"], ids=["all", "filtered"])
def test_every_spelling_of_the_households_of_persons_is_one_noise(ckm_db, where):
    con = sqlsdc.connect(ckm_db, user="analyst")
    answers = {}
    for sql in SPELLINGS:
        clause = where if "p." in sql else where.replace("p.", "")
        answers[sql] = rows(con, sql.format(where=clause))
    con.close()
    first = next(iter(answers.values()))
    assert all(a == first for a in answers.values()), answers
    assert len(first) == 8


def test_the_households_of_a_region_are_one_noise_from_either_table(ckm_db):
    """In the demo every person lives in their household's region: the households of the
    persons of a region are the households of the region, one set of units and one noise."""
    con = sqlsdc.connect(ckm_db, user="analyst")
    of_persons = rows(con, "SELECT region, COUNT(DISTINCT household_id) FROM persons GROUP BY 1")
    of_households = rows(con, "SELECT region, COUNT(*) FROM households GROUP BY region")
    con.close()
    assert of_persons == of_households


@pytest.mark.parametrize(
    "sql, match",
    [
        (
            "SELECT region, COUNT(DISTINCT household_id) FROM persons WHERE household_id IN "
            "(SELECT household_id FROM households) GROUP BY region",
            "subqueries over confidential rows",
        ),
        (
            "WITH x AS (SELECT DISTINCT region, household_id FROM persons) "
            "SELECT region, COUNT(*) FROM x GROUP BY region",
            "DISTINCT on confidential rows",
        ),
        (
            "WITH x AS (SELECT region, household_id FROM persons GROUP BY region, household_id) "
            "SELECT region, COUNT(*) FROM x GROUP BY region",
            "cannot be grouped by",
        ),
        (  # a value the analyst computes would look up (and key by) another household
            "SELECT region, COUNT(DISTINCT hid) FROM (SELECT region, household_id + 1 AS hid "
            "FROM persons) AS x GROUP BY region",
            "passed through unchanged",
        ),
        (
            "SELECT region, COUNT(DISTINCT CASE WHEN age > 30 THEN household_id END) "
            "FROM persons GROUP BY region",
            "one stored column",
        ),
    ],
)
def test_other_spellings_of_the_households_of_persons_are_refused(ckm_db, sql, match):
    con = sqlsdc.connect(ckm_db, user="analyst")
    with pytest.raises(sqlsdc.PolicyViolation, match=match):
        con.cursor().execute(sql)
    con.close()


def test_a_column_that_is_not_a_reference_keeps_its_own_noise(ckm_db):
    """A distinct count of a dimension is its own statistic: the rows' key through the
    statistic's salt, no lookup; a distinct count of the rows' own unit is their COUNT(*)."""
    con = sqlsdc.connect(ckm_db, user="analyst")
    municipalities = con.explain("SELECT region, COUNT(DISTINCT municipality) FROM persons "
                                 "GROUP BY region").sql  # fmt: skip
    assert "__ref" not in municipalities and "ckm_mix" in municipalities
    persons = con.explain("SELECT region, COUNT(DISTINCT person_id) FROM persons GROUP BY 1").sql
    assert "__ref" not in persons
    units = rows(con, "SELECT region, COUNT(DISTINCT person_id) FROM persons GROUP BY region")
    assert units == rows(con, "SELECT region, COUNT(*) FROM persons GROUP BY region")
    con.close()


GROUPS = 60


def households_db(path, counts: dict):
    """Persons of 60 groups: per group 12 households of 4, 10 missing households of 2 (orphan
    references) and one person without a household (NULL); counts protected by ``counts``."""
    with duckdb.connect(str(path)) as con:
        con.execute(f"CREATE TABLE households AS SELECT i AS hid FROM range({GROUPS * 12}) r(i)")
        con.execute(
            "CREATE TABLE persons AS SELECT i AS pid, (i // 4) % 12 + 12 * (i // 48) AS hid, "
            f"'g' || (i // 48) AS g, 'member' AS kind FROM range({GROUPS * 48}) r(i)"
        )
        con.execute(
            f"INSERT INTO persons SELECT {GROUPS * 48} + i, 100000 + i // 2, 'g' || (i // 20), "
            f"'orphan' FROM range({GROUPS * 20}) r(i)"
        )
        con.execute(
            f"INSERT INTO persons SELECT {GROUPS * 68} + i, NULL, 'g' || i, 'alone' "
            f"FROM range({GROUPS}) r(i)"
        )
    identifier = {"role": "identifier"}
    sqlsdc.init(
        path,
        {
            "protection": {"min_frequency": 1, "counts": counts},
            "tables": {
                "persons": {
                    "privacy_unit": "pid",
                    "columns": {
                        "pid": identifier,
                        "hid": {**identifier, "references": "households.hid"},
                        "g": {"role": "dimension"},
                        "kind": {"role": "dimension"},
                    },
                },
                "households": {"privacy_unit": "hid", "columns": {"hid": identifier}},
            },
            "users": {"analyst": {"role": "analyst"}, "admin": {"role": "admin"}},
        },
    )
    return path


@pytest.fixture(scope="module")
def orphans(tmp_path_factory):
    path = tmp_path_factory.mktemp("orphans") / "orphans.duckdb"
    return households_db(path, {"method": "ckm", "ptable": {"D": 5, "V": 3, "js": 2}})


def test_an_orphan_reference_gets_other_noise_than_the_households_without_it(orphans):
    """Every group counts 12 households and 10 orphans through persons.hid, 12 through the
    join. Were the orphans' part of the key zero, both counts (22 and 12, one ptable row)
    would draw the same noise and every difference would be exactly 10."""
    con = sqlsdc.connect(orphans, user="analyst")
    through_reference = dict(rows(con, "SELECT g, COUNT(DISTINCT hid) FROM persons GROUP BY g"))
    through_join = dict(
        rows(
            con,
            "SELECT p.g, COUNT(DISTINCT h.hid) FROM persons AS p JOIN households AS h "
            "ON p.hid = h.hid GROUP BY p.g",
        )
    )
    without_orphans = dict(
        rows(con, "SELECT g, COUNT(DISTINCT hid) FROM persons WHERE kind <> 'orphan' GROUP BY g")
    )
    without_nulls = dict(
        rows(con, "SELECT g, COUNT(DISTINCT hid) FROM persons WHERE kind <> 'alone' GROUP BY g")
    )
    con.close()
    assert len(through_reference) == len(through_join) == GROUPS
    assert without_orphans == through_join  # the same households: one noise
    assert without_nulls == through_reference  # NULL counts nothing and keys nothing
    exact = sum(through_reference[g] - through_join[g] == 10 for g in through_join)
    assert exact <= 0.5 * GROUPS, f"{exact} of {GROUPS} differences are the orphan exactly"


def test_orphans_and_the_persons_who_name_them_do_not_share_noise(orphans):
    """An orphan is keyed by its own value through the secret mix, not by the persons naming
    it: 10 orphans of 20 persons (one ptable row) do not draw the persons' noise (the key of
    their COUNT(*)), which would make every difference exactly 10."""
    con = sqlsdc.connect(orphans, user="analyst")
    released = rows(
        con,
        "SELECT g, COUNT(*), COUNT(DISTINCT hid) FROM persons WHERE kind = 'orphan' GROUP BY g",
    )
    con.close()
    assert len(released) == GROUPS
    exact = sum(persons - households == 10 for _g, persons, households in released)
    assert exact <= 0.5 * GROUPS, f"{exact} of {GROUPS} differences are exact"


def test_a_rounded_count_of_households_is_one_coin_however_it_is_counted(tmp_path):
    """Rounding's coin is the cell key too: 12 households of a group round (unbiased, base 10)
    to 10 or 20 by one coin, the same through the reference and through the join (with two
    keys about a third of the groups would come out differently: two draws of one number)."""
    path = households_db(
        tmp_path / "round.duckdb", {"method": "round", "base": 10, "rounding": "unbiased"}
    )
    con = sqlsdc.connect(path, user="analyst")
    through_reference = rows(
        con, "SELECT g, COUNT(DISTINCT hid) FROM persons WHERE kind = 'member' GROUP BY g"
    )
    through_join = rows(
        con,
        "SELECT p.g, COUNT(DISTINCT h.hid) FROM persons AS p JOIN households AS h "
        "ON p.hid = h.hid GROUP BY p.g",
    )
    con.close()
    assert len(through_reference) == GROUPS
    assert {value for _g, value in through_reference} == {10, 20}
    assert through_reference == through_join
