"""Red team s39b: back-end jobs, the release database, the CLI, budgets and concurrency.

Attacked as a reader of what the admin publishes (the suppression demo of ``conftest.py``:
enterprises nace x region under ``freq:3``, persons geography x sex), as an admin's careless
job, and as several processes on one file. Real DuckDB files, real CLI processes.

Every attack tried, one line each (W: worked, fixed here; O: worked, left open; H: held):

- W  a job over whole cells of the live pattern (``region IN (R01, R05, R06, R08) AND employees
     >= 0``: a WHERE on a non-universe column keeps s30f's "universe columns only" check out),
     its own pattern with the live one: (R, R03) = 1 and (R, R07) = 1 exactly, (M, R01) in
     [1, 2] (gauss; hitas or optimal: seven primaries exact). Refused now: any job cell whose
     adding rows are a live cell's (``jobs.protect._live_cell``).
- W  a protect job whose SQL fails in the engine (unknown column, ``CAST(region AS INT)``):
     exit 70 "internal error ... a bug in sqlsdc", the engine's text on stderr quoting a data
     value ('R04'); failing in the job's checks it left no audit entry. Now exit 1, no engine
     text, audited ``failed``.
- W  an anonymised file of every enterprise, ``nace`` and ``region`` exact (turnover
     microaggregated, k = 5), stored beside the pattern (no unit off in any cell: the
     differencing check let it through), then ``publish --include``: the release held the file
     and ``suppressed_enterprises``; the file's counts gave every hidden count ((R, R03) = 1,
     (R, R05) = 3, (R, R07) = 1). Refused now when stored, and at ``policy apply`` in the other
     order (s38e's test that allowed it now expects the refusal).
- H  ``publish DB DB``, ``publish DB ./DB``, ``publish DB link-to-DB``, ``--force``: refused.
"""

from __future__ import annotations

import cli_fork
import duckdb
import pytest

import sqlsdc
from sqlsdc.errors import MicrodataError, TabularError
from sqlsdc.jobs.adjust import round_query
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.jobs.protect import protect_query
from sqlsdc.tabular.rules import FrequencyRule


def read(path, sql: str, params=()) -> list[tuple]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def run(*args):
    return cli_fork.run([str(a) for a in args], timeout=300)


@pytest.fixture
def suppress_db(suppress_template, tmp_path, copy_database):
    return copy_database(suppress_template, tmp_path)


WHOLE_REGIONS = (
    "SELECT nace, region, COUNT(*) FROM enterprises "
    "WHERE region IN ('R01', 'R05', 'R06', 'R08') AND employees >= 0 GROUP BY nace, region"
)


def test_a_job_over_whole_live_cells_is_refused(suppress_db):
    """Four whole regions of enterprises, tabulated by a job with the policy's own rule: its
    72 inner cells are live cells, hidden by another pattern. With the live CUBE (every
    hidden count at least 1) the combined LP pinned two counts of 1 (R x R03, R x R07)."""
    with sqlsdc.connect(suppress_db, user="analyst") as con:
        con.execute("SELECT nace, region, COUNT(*) FROM enterprises GROUP BY CUBE(nace, region)")
    with pytest.raises(TabularError, match="holds the same units as a cell of that pattern"):
        protect_query(suppress_db, "admin", WHOLE_REGIONS, into="regions4",
                      rules=[FrequencyRule(3)], time_limit=10)  # fmt: skip
    with pytest.raises(TabularError, match="protected by suppression in the policy"):
        round_query(suppress_db, "admin", WHOLE_REGIONS, into="regions4_r", base=5)
    assert not read(suppress_db, "SELECT 1 FROM duckdb_tables() WHERE schema_name = 'protected'")
    # a population that lacks units of every cell it shares is still a job (s30f's "old")
    protect_query(
        suppress_db,
        "admin",
        "SELECT region, education, COUNT(*) FROM persons "
        "WHERE age >= 85 GROUP BY region, education",
        into="old",
        time_limit=10,
    )


@pytest.mark.parametrize("where", ["CAST(region AS INT) > 1", "nosuch > 1"])
def test_a_job_whose_sql_fails_in_the_engine_is_no_internal_error(suppress_db, where):
    sql = (
        f"SELECT region, education, COUNT(*) FROM persons WHERE age >= 85 AND {where} "
        "GROUP BY region, education"
    )
    done = run("protect", suppress_db, "--as", "admin", "--into", "bad", "--sql", sql)
    assert done.returncode == 1, done.stderr
    assert "internal error" not in done.stderr and "Exception" not in done.stderr
    assert "'R0" not in done.stderr  # no value of the data
    last = "SELECT decision, reason FROM sqlsdc.audit ORDER BY query_id DESC LIMIT 1"
    decision, reason = read(suppress_db, last)[0]
    assert decision == "failed" and "Exception" in reason


def test_a_file_that_holds_the_live_cells_is_refused(suppress_db):
    with pytest.raises(MicrodataError, match="holds the same units as a cell of that pattern"):
        anonymize(suppress_db, user="admin", into="ent", steps=["microaggregate:turnover:k=5"],
                  sql="SELECT nace, region, turnover FROM enterprises")  # fmt: skip
    assert not read(suppress_db, "SELECT 1 FROM duckdb_tables() WHERE schema_name = 'protected'")
