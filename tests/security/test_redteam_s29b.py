"""Red-team round of session 29 (second), with an analyst's connection only, against what the
first round of the day touched or left: constants in linear forms, DP answers from the cache,
the Spark path, and one population written several ways.

What succeeded, and was closed:

* the cell key method gave one sum of one set of records as many independent noises as there
  were sets of columns in its ``CASE WHEN`` filter: the statistic key of ``SUM(CASE WHEN c
  THEN income END)`` was the hash of every column of the argument, the filter's included, so
  ``CASE WHEN sex IS NULL OR sex IS NOT NULL THEN income END`` (every row) got other noise
  than ``SUM(income)`` (demo: 7 usable columns, 128 noises of the same exact sum to average,
  no budget). The cell key already tells which rows a filter keeps; the statistic is now
  named by the columns of the value alone, as a WHERE clause is (noise depends on rows and
  measure, not on spelling).

What held (one test each below): every spelling of a scale constant (``0.1``, ``1e-1``,
``1/10``, ``CAST(0.1 AS DOUBLE)``, ``1.e-1``) gives one DP identity and one charge, and a DP
quantile's fraction likewise; tautologies and their negations in a DP filter are one
population with one noise, and what differs is charged; DP answers come from the cache over
the same data version only; repeated rows (UNION ALL, self-joins, table functions, VALUES,
UNNEST) never reach a DP aggregation. Spark (``tests/test_spark.py``): a copy registered under
another case of the table's name is still checked against the database's types.

Observed, not a leak: ``SUM(m * 0.1)`` of an INTEGER measure is refused (the totality check
sees INTEGER × DECIMAL) while ``SUM(m * 1e-1)`` and ``SUM(m / 10)`` are answered; the guard
never runs the product (it scales the protected sum), so the refusal is over-cautious, not
unsafe. ``SUM(9223372036854775807)`` fails in the engine (the scale times a protected count
overflows BIGINT): it fails on released values only, never on a withheld one.
"""

from __future__ import annotations

import pytest

import sqlsdc
from tests.security.test_redteam_s28e import DP, ckm_table, rows

EVERY_ROW = "{c} IS NULL OR {c} IS NOT NULL"


@pytest.mark.parametrize("aggregate", ["SUM", "AVG"])
def test_a_ckm_sum_filtered_by_a_condition_true_for_every_row_has_the_noise_of_the_sum(
    ckm_db, aggregate
):
    """The same records and the same measure: one noise, whichever columns a CASE filter
    (true for every row) names. Before, each set of filter columns drew its own noise."""
    con = sqlsdc.connect(ckm_db, user="analyst")
    where = "FROM persons WHERE region = 'R08' GROUP BY region"
    plain = rows(con, f"SELECT region, {aggregate}(income) {where}")
    for columns in (["sex"], ["age"], ["education", "municipality"], ["occupation", "weight"]):
        condition = " AND ".join(f"({EVERY_ROW.format(c=c)})" for c in columns)
        for argument in (f"CASE WHEN {condition} THEN income END", f"IF({condition}, income)"):
            assert rows(con, f"SELECT region, {aggregate}({argument}) {where}") == plain, columns
    con.close()
