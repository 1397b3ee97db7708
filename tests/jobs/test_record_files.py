"""Which anonymised files the differencing check can write as exact tables of one table, and
what it does with the others.

A file is compared as the exact tables of its population (a WHERE on one table) and of its
unperturbed columns that read a dimension (:mod:`sqlsdc.jobs.record_files`); a query of
another shape cannot be, so it and an exact table of a table it reads are refused together,
whichever comes second (red teams s38b and s38e). A file also takes part in
the signed sums of three or more exact tables, whichever is stored last.
"""

from __future__ import annotations

import pytest

from sqlsdc.demo.build import demo_policy
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import MicrodataError, PolicyViolation, TabularError
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.jobs.protect import protect_query
from sqlsdc.jobs.record_files import _population, opaque_tables
from sqlsdc.release import publish

POLICY = demo_policy()  # persons and households, both confidential


@pytest.mark.parametrize(
    "source",
    [
        "persons",
        "SELECT * FROM persons WHERE age >= 85",
        "SELECT p.*, p.region AS r FROM persons AS p WHERE p.age >= 85",
        "SELECT * EXCLUDE (age) FROM persons",
        "SELECT region, age FROM persons WHERE household_id IN (SELECT household_id FROM "
        "households WHERE region = 'R01')",
    ],
)
def test_a_plain_population_of_one_table_is_comparable(source):
    assert _population(source) is not None
    assert opaque_tables(POLICY, source) == []


@pytest.mark.parametrize(
    "source",
    [
        "SELECT * FROM (SELECT * FROM persons) AS p WHERE age >= 85",
        "SELECT * FROM persons WHERE age >= 85 LIMIT 100",
        "SELECT * FROM persons USING SAMPLE 50%",
        "SELECT DISTINCT region, age FROM persons",
        "SELECT region FROM persons p WHERE EXISTS (SELECT 1 FROM persons q WHERE q.region = "
        "p.region AND q.age < 18)",
        "SELECT region FROM persons p WHERE EXISTS (SELECT 1 FROM households h WHERE "
        "h.household_id = p.household_id)",
        "SELECT region, count(*) OVER (PARTITION BY region) AS n FROM persons",
        "SELECT * REPLACE (age // 10 AS age) FROM persons",
        "SELECT region FROM persons AS p(a, region)",
        "SELECT region FROM persons UNION ALL SELECT region FROM persons",
        "SELECT * FROM other.persons",
        "not sql at all (",
    ],
)
def test_a_query_of_another_shape_is_opaque_for_the_tables_it_reads(source):
    """A derived table, a LIMIT, a sample, DISTINCT, the table read again or a correlated
    subquery (its ``p.`` could not be dropped without rebinding it), a window, a star that
    replaces a column, column aliases of the table, a union, another schema's table: none is
    a WHERE on the rows of one table. An unreadable source may read any table."""
    assert _population(source) is None
    found = opaque_tables(POLICY, source)
    assert "persons" in found
    assert ("households" in found) == ("households" in source or source.endswith("("))


AGED = "SELECT region, sex, education, income FROM (SELECT * FROM persons) AS p WHERE age >= 85"


def test_a_new_file_of_another_shape_is_refused_next_to_an_exact_table(jobs_demo_db):
    """The other order of red team s38b's derived table: the suppression job first, then the
    file, which the check could not compare: refused, and nothing stored."""
    protect_query(jobs_demo_db, "admin", "SELECT sex, SUM(income) FROM persons WHERE age >= 85 "
                  "GROUP BY sex", into="incomes")  # fmt: skip
    with pytest.raises(MicrodataError, match="population is no WHERE on persons"):
        anonymize(jobs_demo_db, user="admin", into="aged_file", sql=AGED,
                  steps=["topcode:income:upper=1e9"])  # fmt: skip
    con = open_database(jobs_demo_db)
    try:
        found = con.sql("SELECT * FROM duckdb_tables() WHERE table_name = 'aged_file'")
        assert not found.fetchall()
    finally:
        con.close()


def _lonely(db) -> tuple[str, str]:
    con = open_database(db)
    try:
        return con.sql(
            "SELECT municipality, any_value(region) FROM persons WHERE age >= 85 "
            "GROUP BY municipality HAVING count(*) = 1 AND count(income) = 1 "
            "ORDER BY municipality LIMIT 1"
        ).fetchall()[0]
    finally:
        con.close()


AGED_R02 = "age >= 85 AND region = 'R02'"


@pytest.mark.parametrize("last", ["file", "job"])
def test_a_file_is_one_of_the_tables_of_a_signed_sum(jobs_demo_db, last):
    """Red team s38b's four releases by sex of people aged 85 or over, R02 ∪ R03 ∪ {one person
    of R01}, R02 ∪ R03 ∪ R04, R02 ∪ R04 and R02, the last an anonymised file of sex and income
    (income only top-coded): T1 - T2 + T3 - T4 is that person's income. The release stored
    last is refused, the file or the job."""
    municipality, region = _lonely(jobs_demo_db)
    assert region == "R01"
    populations = [f"region IN ('R02', 'R03') OR municipality = '{municipality}'",
                   "region IN ('R02', 'R03', 'R04')", "region IN ('R02', 'R04')"]  # fmt: skip

    def job(j: int) -> None:
        protect_query(jobs_demo_db, "admin", "SELECT sex, SUM(income) FROM persons WHERE "
                      f"age >= 85 AND ({populations[j]}) GROUP BY sex", into=f"t{j}")  # fmt: skip

    def file() -> None:
        anonymize(jobs_demo_db, user="admin", into="r02_file", steps=["topcode:income:upper=1e9"],
                  sql=f"SELECT sex, income FROM persons WHERE {AGED_R02}")  # fmt: skip

    if last == "file":
        for j in range(3):
            job(j)
        with pytest.raises(MicrodataError, match="r02_file would isolate 1 unit"):
            file()
    else:
        file()
        job(0)
        job(1)
        with pytest.raises(TabularError, match="would isolate 1 unit"):
            job(2)


def test_a_file_next_to_an_opaque_file_of_the_same_people_but_one(jobs_demo_db, tmp_path):
    """Everyone aged 85 or over as a derived table (income only top-coded), then the same
    people but one municipality's person as a plain WHERE: the two totals differ by that
    person's income. Stored side by side they are withheld candidates, which reach no reader;
    a publication that holds both is refused before it writes anything (red team s38f,
    ``sqlsdc.jobs.file_pairs.refuse_opaque_files``)."""
    municipality, _region = _lonely(jobs_demo_db)
    anonymize(jobs_demo_db, user="admin", into="aged_file", sql=AGED,
              steps=["topcode:income:upper=1e9"])  # fmt: skip
    anonymize(jobs_demo_db, user="admin", into="aged_minus", steps=["topcode:income:upper=1e9"],
              sql="SELECT region, sex, education, income FROM persons WHERE age >= 85 "
              f"AND municipality <> '{municipality}'")  # fmt: skip
    out = tmp_path / "release.duckdb"
    with pytest.raises(PolicyViolation, match="aged_file"):
        publish(jobs_demo_db, out, "admin", include=["aged_file", "aged_minus"])
    assert not out.exists()
