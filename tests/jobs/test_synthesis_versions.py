"""Syntheses that count as exact files, in every version and whatever their query's shape.

Before (session 39's notes): the history of outputs listed no synthesis (its audit reason reads
``synthesize job (cart) stored ...``), so a balanced synthesis replaced by one drawn with
replacement was forgotten by the differencing check; and a balanced synthesis whose query was
no WHERE on one table was stored and then left out of the check of every later exact table.
"""

from __future__ import annotations

import pytest

from sqlsdc import admin
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import MicrodataError, PolicyError, TabularError
from sqlsdc.jobs.output_history import earlier_versions
from sqlsdc.jobs.protect import protect_query
from sqlsdc.policy import load_policy
from sqlsdc.synth import synthesize
from sqlsdc.tabular.rules import FrequencyRule

EVERYONE = "SELECT sex, municipality, income FROM persons"
OPAQUE = "SELECT p.sex, p.municipality FROM (SELECT * FROM persons) AS p"


def _synthesis(db, draw: str, sql: str = EVERYONE, *, replace: bool = False, rows=None):
    synthesize(db, user="admin", into="syn", method="cart", seed=7, sql=sql,
               options={"draw": draw}, replace=replace, rows=rows)  # fmt: skip


def _persons_but_babies(db):
    """Exact counts of everyone aged 1 or over: a cell less the balanced synthesis's is the
    persons aged 0 there (1-4 of them)."""
    sql = (
        "SELECT municipality, sex, COUNT(*) FROM persons WHERE age >= 1 GROUP BY municipality, sex"
    )
    protect_query(db, "admin", sql, into="nonzero", rules=[FrequencyRule(5)])


def test_a_replaced_balanced_synthesis_is_still_compared(jobs_demo_db):
    _synthesis(jobs_demo_db, "balanced")
    # now drawn with replacement, of R02's persons' ages: one draw of another column, not
    # exact itself (a column the balanced one drew too would be a second draw of R02's rows)
    _synthesis(jobs_demo_db, "random", "SELECT age FROM persons WHERE region = 'R02'",
               replace=True, rows=1000)  # a size not read from the data (s44c)  # fmt: skip
    con = open_database(jobs_demo_db)
    try:
        versions = [(v.method, v.name) for v in earlier_versions(con)]
    finally:
        con.close()
    assert versions == [("synthesize", "protected.syn")]
    with pytest.raises(TabularError, match=r"protected\.syn as job \d+ stored it"):
        _persons_but_babies(jobs_demo_db)


def test_a_synthesis_drawn_with_replacement_is_not_but_a_second_draw_of_its_rows_is(
    jobs_demo_db,
):
    """One draw with replacement holds no count exactly; a second of the same rows, the first
    replaced or not, is two draws that readers average (red team s42c): their records in all
    outnumber the source's, and it is checked as an exact file."""
    _synthesis(jobs_demo_db, "random")
    _persons_but_babies(jobs_demo_db)
    with pytest.raises(MicrodataError, match="differ by only 1 unit"):
        _synthesis(jobs_demo_db, "random", replace=True)


def test_an_opaque_balanced_synthesis_refuses_a_later_exact_table(jobs_demo_db):
    _synthesis(jobs_demo_db, "balanced", OPAQUE)  # no exact table yet: stored
    with pytest.raises(TabularError, match=r"the file protected\.syn reads persons by a query"):
        _persons_but_babies(jobs_demo_db)
    # and a policy switching suppression of persons on (the pattern an exact table)
    from tests.conftest import suppress_document

    with pytest.raises(PolicyError, match=r"protected\.syn reads persons by a query"):
        admin.apply(jobs_demo_db, load_policy(suppress_document()), "admin")


def test_an_opaque_synthesis_drawn_with_replacement_refuses_nothing(jobs_demo_db):
    _synthesis(jobs_demo_db, "random", OPAQUE)
    _persons_but_babies(jobs_demo_db)
