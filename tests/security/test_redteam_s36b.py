"""Red team s36b: an analyst's guarded connection against the differential-privacy query path.

What broke (fixed here):

- **Exact magnitudes beside DP counts.** A policy may protect a table's counts with DP and
  leave its magnitudes to another method, and ``counts: {method: dp, ...}`` declared alone
  leaves them to the default, the threshold rule (a measure with bounds, as a DP SUM needs,
  is then summed exactly). ``SUM(income)`` and ``AVG(income)`` of one cell gave its exact
  count (SUM / AVG), and two overlapping populations one person's value, for nothing: the
  budget charged the noisy counts and nothing else. A SUM or AVG released by another method
  than DP over a table whose counts use DP is now refused before anything runs
  (``planner.plan._refuse_beside_dp_counts``).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

import sqlsdc
from sqlsdc.errors import PolicyViolation

# --- magnitudes of another method beside DP counts ------------------------------------------


@pytest.fixture(scope="module")
def mixed_db(tmp_path_factory) -> Path:
    """persons (3,000, one row each) whose counts use DP and whose magnitudes are left to the
    default threshold rule; income has bounds, as a DP SUM would need."""
    path = tmp_path_factory.mktemp("s36b_mixed") / "mixed.duckdb"
    con = duckdb.connect(str(path))
    con.execute(
        "CREATE TABLE persons AS SELECT range AS pid, ['N', 'S', 'E', 'W'][1 + range % 4] AS "
        "region, (range % 90)::INTEGER AS age, (range * 37 % 100000)::DOUBLE AS income "
        "FROM range(3000)"
    )
    con.close()
    sqlsdc.init(path, {
        "tables": {"persons": {
            "privacy_unit": "pid",
            "columns": {"pid": {"role": "identifier"},
                        "region": {"role": "dimension", "domain": ["N", "S", "E", "W"]},
                        "age": {"role": "dimension"},
                        "income": {"role": "measure", "bounds": [0, 100000]}},
            "protection": {"counts": {"method": "dp", "spend": {"epsilon": "1/2"}}}}},
        "users": {"admin": {"role": "admin"}, "ana": {"role": "analyst"}},
        "budgets": [{"user": "*", "epsilon": 10}],
    })  # fmt: skip
    return path


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT region, SUM(income) FROM persons WHERE age = 5 GROUP BY region",
        "SELECT region, AVG(income) FROM persons WHERE age = 5 GROUP BY region",
        "SELECT AVG(income) FROM (SELECT * FROM persons WHERE age < 30) AS t",
    ],
)
def test_magnitudes_beside_dp_counts_are_dp_or_refused(mixed_db, sql):
    """Before the fix, the threshold rule answered these exactly: the DP count of a cell of
    region S and age 5 was noisy (one noise per cell, charged), and SUM / AVG of the same cell
    gave it exactly (17), for no budget."""
    with sqlsdc.connect(mixed_db, "ana") as con:
        before = con.remaining_budget()[0].spent
        with pytest.raises(PolicyViolation, match="counts of persons use differential privacy"):
            con.execute(sql)
        assert con.remaining_budget()[0].spent == before
        assert len(con.execute("SELECT region, COUNT(*) FROM persons GROUP BY region").fetchall())
