"""A suppression job of a whole table by dimensions outside the universe (``jobs/live_total.py``).

Before (since red team s30f): refused, because its grand total holds the units of the live
pattern's grand total. A total the live pattern publishes, published exactly beside it, links
the two tables by a known constant only; the job is stored with that total forced published.
What still ties a job to the live pattern stays refused: a rounded total beside the exact one,
a dimension the universe columns determine, a total the pattern hides.
"""

from __future__ import annotations

import pytest

import sqlsdc
from sqlsdc.catalog.store import current_policy
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import TabularError
from sqlsdc.jobs.adjust import round_query
from sqlsdc.jobs.protect import protect_query
from sqlsdc.policy import load_policy

LIVE = "holds the same units as a cell of that pattern"
BY_EDUCATION = "SELECT education, COUNT(*) FROM persons GROUP BY education"


@pytest.fixture()
def db(suppress_template, tmp_path, copy_database):
    return copy_database(suppress_template, tmp_path)


def _read(db, sql: str) -> list[tuple]:
    con = open_database(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _live_total(db, table: str, aggregate: str = "count") -> tuple:
    return _read(db, f"SELECT {aggregate}__status, {aggregate}__value FROM "
                     f"sqlsdc.suppressed__{table} WHERE {table_key(table)} IS NULL")[0]  # fmt: skip


def table_key(table: str) -> str:
    return {"persons": "region", "enterprises": "nace"}[table]


@pytest.mark.parametrize(
    ("sql", "table", "aggregate"),
    [
        (BY_EDUCATION, "persons", "count"),
        ("SELECT size_class, SUM(turnover) FROM enterprises WHERE employees >= 0 "
         "GROUP BY size_class", "enterprises", "turnover"),
    ],
    ids=["persons-by-education", "turnover-by-size-class"],
)  # fmt: skip
def test_a_whole_table_by_a_dimension_outside_the_universe_is_stored(db, sql, table, aggregate):
    protect_query(db, "admin", sql, into="whole", time_limit=10)
    status, value = _live_total(db, table, aggregate)  # computed by the job, as a query would
    (total,) = _read(db, "SELECT value FROM protected.whole WHERE status = 'published' AND "
                         f"{sql.split()[1].rstrip(',')} = 'Total'")[0]  # fmt: skip
    assert status == "published" and float(total) == pytest.approx(value, rel=1e-12)
    # a later policy (the same one again) is checked against the stored pattern and passes
    con = open_database(db)
    try:
        _version, document, _source = current_policy(con)
    finally:
        con.close()
    sqlsdc.admin.apply(db, load_policy(document), "admin")


def test_a_rounded_total_beside_the_exact_one_stays_refused(db):
    with pytest.raises(TabularError, match=f"{LIVE}.*tells the sum of its perturbations"):
        round_query(db, "admin", BY_EDUCATION, into="rounded", base=5)


def test_a_total_the_live_pattern_hides_stays_refused(db):
    protect_query(db, "admin", BY_EDUCATION, into="first", time_limit=10)  # computes the pattern
    con = open_database(db, read_only=False)
    try:  # as if the pattern had hidden it (kept hidden by every later pattern)
        con.execute("UPDATE sqlsdc.suppressed__persons SET count__status = 'secondary' "
                    "WHERE region IS NULL AND municipality IS NULL AND sex IS NULL")  # fmt: skip
    finally:
        con.close()
    again = BY_EDUCATION.replace("education", "occupation")
    with pytest.raises(TabularError, match=LIVE):
        protect_query(db, "admin", again, into="second", time_limit=10)


def test_a_dimension_the_universe_determines_stays_refused(db, make_suppress_document):
    """Under a universe of municipality x sex, a table by region adds whole municipalities:
    its cells are sums of live cells, whose hidden ones it would give away."""
    document = make_suppress_document()
    document["tables"]["persons"]["suppression"]["dimensions"] = ["municipality", "sex"]
    sqlsdc.admin.apply(db, load_policy(document), "admin")
    with pytest.raises(TabularError, match=LIVE):
        protect_query(db, "admin", "SELECT region, COUNT(*) FROM persons GROUP BY region",
                      into="regions", time_limit=10)  # fmt: skip
