"""Red team s39b: back-end jobs, the release database, the CLI, budgets and concurrency.

Attacked as a reader of what the admin publishes (the suppression demo of ``conftest.py``:
enterprises nace x region under ``freq:3``, persons geography x sex), as an admin's careless
job, and as several processes on one file. Real DuckDB files, real CLI processes.

Every attack tried, one line each (W: worked, fixed here; O: worked, left open; H: held):

- W  a job over whole cells of the live pattern (``region IN (R01, R05, R06, R08) AND employees
     >= 0``: a WHERE on a non-universe column keeps s30f's "universe columns only" check out),
     its own pattern with the live one: (R, R03) = 1 and (R, R07) = 1 exactly, (M, R01) in
     [1, 2] (gauss; hitas or optimal: seven primaries exact). Refused now: any job cell whose
     adding rows are a live cell's (``jobs.live_cells``).
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
- W  ``anonymize --step recode:region:breaks=1/2`` (a text column): exit 70, "internal error:
     TypeError"; ``--step suppress:region:k=0`` stored a file as if protected. Now exit 1 with
     a message; k below 1 refused (k = 1, which suppresses nothing, stays: tests use it).
- H  ``publish DB DB``, ``publish DB ./DB``, ``publish DB link-to-DB``, ``--force``: refused.
- H  four ``synthesize --method dp-catall --epsilon 15`` processes at once on benefits (table
     budget 50, 0.3 spent): three stored, one exit 7; spent 45.3, never over the limit.
- H  ``--into INC`` / ``Inc --replace`` beside ``inc`` (a second protection, s38b's replaced
     versions through case variants, a rounding base changed by a case variant): refused.
- H  ``init`` on an initialised database: no record key changes (the same CKM answers).
- H  two ``protect`` processes at once whose tables differ by one person: one refused.
- H  ``budget grant|set`` with -1, 1e400, 0x10, 1e-30, 10^35, a case-variant table, a non-admin
     ``--as``: usage errors or refusals, never a traceback; ``server-user``, ``serve`` with bad
     TLS files or ports, ``risk``, ``synth-report``, ``microdata-report`` with unknown names:
     one line, no exit 70.
- H  ``publish --query`` as the admin (its default ``--for``): row-level reads of persons and
     ``synthetic.*`` refused as for an analyst; a user ``'*'``, ``'Analyst'``, ``'analyst '``
     (the budgets' "all users" key, case and blank variants): not users; a policy declaring
     ``'*'`` is invalid.
- H  kill -9 of ``publish`` while it starts: no file, no lock kept; the next one writes.
- O  (observed, no test) a DP synthesis (``dp-catall``) of a table the policy protects by
     suppression needs a budget of the admin on it, and then stores noisy cells beside the live
     pattern at whatever ε the admin set (up to 10^6, noise nil): DP over a suppression table is
     a policy decision.
- W  ``publish`` checks the outputs it releases (DP sources, file pairs) in one opening of the
     file and collects them in a second: a ``policy apply`` by another admin between the two
     was not checked again. Closed by the lead the same day: the collection stops when the
     policy version or the outputs differ from those checked
     (``test_release.py::test_a_policy_applied_while_a_publication_is_checked_stops_it``).
"""

from __future__ import annotations

import subprocess

import cli_fork
import pytest
from db_reads import protected_tables, read

import sqlsdc
from sqlsdc.errors import MicrodataError, TabularError
from sqlsdc.jobs.adjust import round_query
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.jobs.protect import protect_query
from sqlsdc.tabular.rules import FrequencyRule


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
    assert protected_tables(suppress_db) == []
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
    assert protected_tables(suppress_db) == []


def test_the_release_database_is_never_the_confidential_one(suppress_db, tmp_path):
    link = tmp_path / "link.duckdb"
    link.symlink_to(suppress_db)
    for out in (suppress_db, tmp_path / "." / suppress_db.name, link):
        done = run("publish", suppress_db, out, "--force", "--as", "admin")
        assert done.returncode == 1 and "another file than the confidential one" in done.stderr
    assert read(suppress_db, "SELECT count(*) FROM persons")[0][0] == 20_000


def test_dp_syntheses_at_once_stay_within_the_table_budget(ckm_db, tmp_path, copy_database):
    db = copy_database(ckm_db, tmp_path)
    args = ["synthesize", str(db), "--as", "admin", "--from", "benefits", "--method",
            "dp-catall", "--epsilon", "15", "--columns", "region,scheme"]  # fmt: skip
    jobs = [cli_fork.popen([*args, "--into", f"s{i}", "--seed", str(i)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for i in range(4)]  # fmt: skip
    codes = sorted(job.wait(timeout=300) for job in jobs)
    for job in jobs:
        job.stderr.close()
    spent = read(db, "SELECT count(*) FROM sqlsdc.outputs WHERE method = 'synthesize'")[0][0]
    assert codes.count(0) == spent <= 3 and set(codes) <= {0, 7}


@pytest.mark.parametrize(
    "step, told",
    [("recode:region:breaks=1/2", "not numbers"), ("suppress:region,sex:k=0", "k must be")],
)
def test_an_anonymisation_step_that_does_not_fit_is_told_not_a_bug(suppress_db, step, told):
    done = run("anonymize", suppress_db, "--as", "admin", "--sql",
               "SELECT region, sex, age FROM persons WHERE age >= 85", "--into", "f",
               "--step", step)  # fmt: skip
    assert done.returncode == 1 and told in done.stderr, done.stderr
    assert "internal error" not in done.stderr
    assert protected_tables(suppress_db) == []
