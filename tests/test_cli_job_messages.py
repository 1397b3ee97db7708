"""Messages a new user met (s40j) that did not say what happened: a margins file that is a
device or empty, an exhausted budget's audit reason, a CTA solver's numerical "infeasible".
Real processes (:mod:`cli_fork`) on real DuckDB files."""

from __future__ import annotations

import json

import cli_fork
import duckdb
import numpy as np
import pytest
from sqlsdc.cli import errors

from sqlsdc.tabular._cta_model import infeasible

IPF = "SELECT region, education, COUNT(*) FROM persons WHERE age >= 85 GROUP BY region, education"


def sqlsdc(*args, code=0):
    done = cli_fork.run([str(a) for a in args], timeout=120)
    assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    return done


@pytest.mark.parametrize(
    ("margins", "said"),
    [
        ("/dev/null", "margins file /dev/null is a character device, not a regular file"),
        ("empty", "is empty; it needs a header line (the table's dimensions and value)"),
    ],
)
def test_a_margins_file_that_is_no_csv_says_what_it_is(fresh_demo_db, tmp_path, margins, said):
    """``--margins /dev/null`` was reported as "does not exist"; an empty file as pandas'
    "No columns to parse from file"."""
    if margins == "empty":
        margins = tmp_path / "margins.csv"
        margins.touch()
    args = ["--margins", margins, "--rule", "freq:5", "--into", "p_ipf", "--sql", IPF]
    refused = sqlsdc("protect", fresh_demo_db, "--method", "ipf", *args, code=errors.ERROR)
    assert said in refused.stderr
    assert "does not exist" not in refused.stderr
    with duckdb.connect(str(fresh_demo_db), read_only=True) as con:
        stored = con.execute("SELECT count(*) FROM information_schema.tables "
                             "WHERE table_name = 'p_ipf'").fetchone()[0]  # fmt: skip
    assert stored == 0


def test_an_exhausted_budget_is_audited_as_the_analyst_read_it(tmp_path):
    """The audit reason of an exhausted budget began "BudgetExhausted: ", unlike every other
    refusal (a policy's refusal, a syntax error): now it is the message the analyst read."""
    db, policy = tmp_path / "rdc.duckdb", tmp_path / "policy.json"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE visits AS SELECT i % 300 AS id, 'r' || (i % 3) AS region "
                    "FROM range(900) t(i)")  # fmt: skip
    columns = {"id": {"role": "identifier"},
               "region": {"role": "dimension", "domain": ["r0", "r1", "r2"]}}  # fmt: skip
    policy.write_text(json.dumps({
        "tables": {"visits": {
            "privacy_unit": "id", "columns": columns, "dp": {"max_groups": 1, "max_rows": 5},
            "protection": {"counts": {"method": "dp", "spend": {"epsilon": 0.5}}},
        }},
        "budgets": [{"user": "ana", "epsilon": 0.7}],
        "users": {"chief": {"role": "admin"}, "ana": {"role": "analyst"}},
    }))  # fmt: skip
    sqlsdc("init", db, "--policy", policy)
    sqlsdc("query", db, "-u", "ana", "SELECT region, COUNT(*) AS n FROM visits GROUP BY region")
    refused = sqlsdc("query", db, "-u", "ana", "SELECT region, COUNT(*) AS m FROM visits "
                     "WHERE region <> 'x' GROUP BY region", code=errors.BUDGET)  # fmt: skip
    sqlsdc("query", db, "-u", "ana", "SELECT id FROM visits", code=errors.REFUSED)
    entries = json.loads(sqlsdc("audit", db, "--format", "json").stdout)
    reasons = [e["reason"] for e in entries if e["decision"] == "refused"]
    budget, row_level = reasons[1], reasons[0]  # newest first
    assert budget.startswith("privacy budget exhausted for user 'ana' on all tables: this query "
                             "needs ε = 0.5 but only ε = 0.2 remains")  # fmt: skip
    assert budget in refused.stderr  # what the analyst read
    assert row_level.startswith("row-level output of confidential tables is not allowed")


def test_a_numerical_infeasibility_of_cta_says_so():
    """When the CTA model is "infeasible" and its elastic copy finds no sensitive cell short,
    the message read "0 cell(s) fall short, e.g. ;". Such a solver verdict could not be
    provoked on a table on purpose (it is a numerical edge), so the message is checked here."""
    message = str(infeasible(None, np.zeros(4, dtype=bool), "milp"))
    assert "0 cell(s)" not in message and "e.g. ;" not in message
    assert message.startswith("the CTA MILP solver reported that no additive adjusted table")
    assert "a relaxed copy of the same model met every level" in message
    assert "ask for protection levels a little different" in message
