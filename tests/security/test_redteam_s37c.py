"""Red team s37c: back-end jobs, the release database and the live server.

Each test is an attack that worked before its fix (the commit that adds the test fixes it).
"""

from __future__ import annotations

import pandas as pd
import pytest

from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import TabularError
from sqlsdc.jobs.adjust import ipf_query
from sqlsdc.jobs.protect import protect_query

OLD = "persons WHERE age >= 85"


def _true_margins(db, where: str) -> pd.DataFrame:
    """The exact margins of the income table by region x education: what the README tells an
    admin to write when no census is at hand."""
    con = open_database(db)
    try:
        return con.sql(
            "SELECT COALESCE(region, 'Total') AS region, COALESCE(CAST(education AS VARCHAR), "
            f"'Total') AS education, SUM(income) AS value FROM persons WHERE {where} "
            "GROUP BY CUBE (region, education) HAVING region IS NULL OR education IS NULL"
        ).df()
    finally:
        con.close()


def _lonely(db) -> tuple[str, float]:
    """A municipality with one person aged 85 or over, and that person's income."""
    con = open_database(db)
    try:
        return con.sql(
            "SELECT municipality, any_value(income) FROM persons WHERE age >= 85 "
            "GROUP BY municipality HAVING count(*) = 1 ORDER BY municipality LIMIT 1"
        ).fetchall()[0]
    finally:
        con.close()


IPF_SQL = (
    "SELECT region, education, SUM(income) FROM persons WHERE age >= 85 GROUP BY region, education"
)


def _minus(municipality: str) -> str:
    return (
        "SELECT sex, SUM(income) FROM persons WHERE age >= 85 AND municipality <> "
        f"'{municipality}' GROUP BY sex"
    )


def test_ipf_margins_and_a_suppression_job_of_one_person_fewer(jobs_demo_db):
    """An IPF job publishes its given margins as they are (exact, when the admin wrote them
    from the data as the README shows); a suppression job over the same population less one
    person published its total exactly too, and the two totals differed by that person's
    income: the differencing check ignored IPF outputs. Now the second job is refused."""
    municipality, _income = _lonely(jobs_demo_db)
    ipf_query(jobs_demo_db, "admin", IPF_SQL, into="inc_ipf",
              margins=_true_margins(jobs_demo_db, "age >= 85"))  # fmt: skip
    with pytest.raises(TabularError, match="differ by only 1 unit"):
        protect_query(jobs_demo_db, "admin", _minus(municipality), into="inc_minus")


def test_suppression_job_then_ipf_of_one_person_more(jobs_demo_db):
    """The same attack in the other order: the IPF job is checked against the suppression
    output already stored."""
    municipality, _income = _lonely(jobs_demo_db)
    protect_query(jobs_demo_db, "admin", _minus(municipality), into="inc_minus")
    with pytest.raises(TabularError, match="differ by only 1 unit"):
        ipf_query(jobs_demo_db, "admin", IPF_SQL, into="inc_ipf",
                  margins=_true_margins(jobs_demo_db, "age >= 85"))  # fmt: skip
