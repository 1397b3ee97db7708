"""Jobs over a table the policy protects by differential privacy (the demo's ``benefits``).

A suppression, rounding, CTA or IPF table, an anonymised file or a non-DP synthesis of such a
table would hold its data exactly, or perturbed once, outside the privacy budget: every job but
the DP syntheses is refused before it reads a row, audited ``refused``, and stores nothing."""

from __future__ import annotations

import duckdb
import pandas as pd
import pytest

import sqlsdc
from sqlsdc.demo.build import demo_policy
from sqlsdc.errors import MicrodataError, TabularError
from sqlsdc.jobs.adjust import cta_query, ipf_query, round_query
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.jobs.protect import protect_query
from sqlsdc.synth import synthesize

COUNTS = "SELECT region, scheme, COUNT(DISTINCT person_id) FROM benefits GROUP BY region, scheme"
SUMS = "SELECT region, SUM(amount) FROM benefits GROUP BY region"
REFUSED = "benefits is protected by differential privacy in the policy"


@pytest.fixture(scope="module")
def dp_template(pristine_demo_db, tmp_path_factory, copy_database):
    """The test demo under the demo's own policy: ``benefits`` by DP, ``persons`` by CKM
    (applied once; each test changes a copy)."""
    path = copy_database(pristine_demo_db, tmp_path_factory.mktemp("dp_tables"))
    sqlsdc.admin.apply(path, demo_policy(), "admin")
    return path


@pytest.fixture
def dp_demo_db(dp_template, tmp_path, copy_database):
    """A copy of :func:`dp_template` for one test."""
    return copy_database(dp_template, tmp_path)


def _jobs(margins):
    return [
        (TabularError, lambda db: protect_query(db, "admin", COUNTS, into="j1")),
        (TabularError, lambda db: protect_query(db, "admin", SUMS, into="j2", method="hypercube")),
        (TabularError, lambda db: round_query(db, "admin", COUNTS, into="j3", base=5)),
        (TabularError, lambda db: cta_query(db, "admin", SUMS, into="j4")),
        (TabularError, lambda db: ipf_query(db, "admin", COUNTS, into="j5", margins=margins)),
        (
            MicrodataError,
            lambda db: anonymize(
                db, user="admin", into="j6", source="benefits", steps=["topcode:amount:upper=2000"]
            ),
        ),  # fmt: skip
        (
            MicrodataError,
            lambda db: anonymize(
                db,
                user="admin",
                into="j7",
                steps=["topcode:income:upper=100000"],
                sql="SELECT p.region, p.income, b.amount FROM persons p "
                "JOIN benefits b ON b.person_id = p.person_id",
            ),
        ),  # fmt: skip
        (
            MicrodataError,
            lambda db: synthesize(
                db,
                user="admin",
                source="benefits",
                into="j8",
                method="parametric",
                columns=["region", "amount"],
                rows=50,
            ),
        ),  # fmt: skip
    ]


def test_non_dp_jobs_over_a_dp_table_are_refused_and_store_nothing(dp_demo_db):
    margins = pd.DataFrame({"region": [f"R0{i}" for i in range(1, 9)], "value": [1.0] * 8})
    jobs = _jobs(margins)
    for error, job in jobs:
        with pytest.raises(error, match=REFUSED):
            job(dp_demo_db)
    entries = sqlsdc.admin.audit(dp_demo_db, "admin", limit=100)
    refused = entries[entries["reason"].fillna("").str.contains(REFUSED)]
    assert len(refused) == len(jobs) and set(refused["decision"]) == {"refused"}
    with duckdb.connect(str(dp_demo_db), read_only=True) as con:
        stored = con.execute("SELECT count(*) FROM duckdb_tables() "
                             "WHERE schema_name = 'protected'").fetchone()[0]  # fmt: skip
        ledger = con.execute("SELECT count(*) FROM sqlsdc.ledger").fetchone()[0]
    assert stored == 0 and ledger == 0


def test_jobs_over_the_tables_the_policy_does_not_protect_by_dp_still_run(dp_demo_db):
    """The same jobs over ``persons`` (cell key method) are not touched by the refusal."""
    report = protect_query(dp_demo_db, "admin", "SELECT region, sex, COUNT(*) FROM persons "
                           "WHERE age >= 90 GROUP BY region, sex", into="old")  # fmt: skip
    assert report.to_dict()
    stored = anonymize(dp_demo_db, user="admin", into="persons_top", source="persons",
                       steps=["topcode:income:upper=200000"])  # fmt: skip
    assert stored.records == 20_000


def test_the_cli_says_why(dp_demo_db, sqlsdc_in_process):
    """Exit 1, as for the jobs' other refusals of a request (an output name taken, a live
    suppression universe)."""
    from sqlsdc.cli.errors import ERROR

    run = sqlsdc_in_process("protect", dp_demo_db, "--sql", COUNTS, "--into", "j",
                            "--method", "suppress")  # fmt: skip
    assert run.returncode == ERROR and "Traceback" not in run.stderr
    assert REFUSED in run.stderr and "sqlsdc synthesize --method dp-ipf" in run.stderr
