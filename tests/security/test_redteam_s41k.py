"""Red-team round 2 of session 41 (s41k): today's merged changes to DP charging, replaced jobs,
the jobs' differencing check and roundings of sums.

Found, and closed:

* **two protections of one cell through a replaced or dropped output**: the rule "one set of
  cells, one protection" (red team s33b/s33c) compared a job with the *current* outputs only.
  A rounding to base 3 of a count table, replaced under its name by a rounding of another
  population (or its table dropped by an admin), then the same table rounded to base 5 (4, 7,
  ...) under another name, was stored, and readers of both versions held every cell rounded
  to several bases. On the jobs demo (45 cells of persons aged 85+ by region x education),
  bases 3 and 4 left 196 candidate counts where base 3 alone left 225; bases 3, 4, 5 and 7
  left 184 (one cell exact). Earlier versions, which their readers keep, are now checked as
  the current outputs are (``refusals._refuse_earlier_protection``).
"""

from __future__ import annotations

import pytest

from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import TabularError
from sqlsdc.jobs.adjust import round_query
from sqlsdc.jobs.protect import protect_query

OLD = "SELECT region, education, COUNT(*) FROM persons WHERE age >= 85 GROUP BY region, education"
OTHER = OLD.replace("85", "80")


@pytest.fixture
def jobs_db(jobs_demo_db):
    return jobs_demo_db


def _drop(db, table: str) -> None:
    con = open_database(db)
    try:
        con.execute(f"DROP TABLE protected.{table}")
    finally:
        con.close()


@pytest.mark.parametrize("how", ["replaced", "dropped"])
def test_a_second_base_beside_a_replaced_or_dropped_rounding_is_refused(jobs_db, how):
    """Before: stored; readers of both versions held each cell rounded to bases 3 and 5."""
    round_query(jobs_db, "admin", OLD, into="r", base=3)
    if how == "replaced":
        round_query(jobs_db, "admin", OTHER, into="r", base=3, replace=True)
    else:
        _drop(jobs_db, "r")
    with pytest.raises(TabularError, match=r"protected.r as job \d+ stored it released these "
                                           "cells"):  # fmt: skip
        round_query(jobs_db, "admin", OLD, into="r5", base=5)
    with pytest.raises(TabularError, match="protected by method round; its readers keep it"):
        protect_query(jobs_db, "admin", OLD, into="s")
    if how == "replaced":  # the same cells under the earlier version's name, to its base
        round_query(jobs_db, "admin", OLD, into="r", base=3, replace=True)


def test_a_dropped_rounding_is_not_stored_again_to_another_base(jobs_db):
    """Refused by name and base (before: the job failed in the engine as it stored, reading the
    dropped table: nothing was stored, but the refusal did not say why)."""
    round_query(jobs_db, "admin", OLD, into="r", base=3)
    _drop(jobs_db, "r")
    with pytest.raises(TabularError, match="rounded to base 3; a rounding of them to base 5"):
        round_query(jobs_db, "admin", OLD, into="r", base=5)
