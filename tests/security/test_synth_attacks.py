"""Attacks on the synthesis and anonymisation jobs' ``--sql`` and on released outputs: what an
admin-run job reads must be records of the policy's tables without their secret record keys or
nested whole rows, whatever the spelling; analysts cannot run the job; a released output does
not open confidential rows through joins, subqueries or set operations."""

from __future__ import annotations

import duckdb
import pytest

import sqlsdc
from sqlsdc.admin import apply
from sqlsdc.catalog.store import current_policy
from sqlsdc.errors import AccessDenied, MicrodataError, NotFoundError, PolicyViolation
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.policy import load_policy
from sqlsdc.synth import synthesize

R01 = "FROM persons WHERE region = 'R01'"
STEP = ["recode:age:breaks=15/30/45/65"]


def _stored(db, name):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.sql(f"SELECT * FROM protected.{name}").df()
    finally:
        con.close()


def _record_keys(db) -> set[int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {k for (k,) in con.execute("SELECT __rkey FROM persons").fetchall()}
    finally:
        con.close()


def _carries_keys(frame, keys) -> bool:
    """Whether any column (or any field of a nested column) holds record keys."""
    for column in frame.columns:
        for value in frame[column].head(200):
            values = value.values() if isinstance(value, dict) else [value]
            if any(isinstance(v, int) and v in keys for v in values):
                return True
    return False


KEY_SPELLINGS = [
    f"SELECT sex, age, __rkey + 0 AS k {R01}",
    f'SELECT sex, age, "__RKEY" AS k {R01}',
    f"SELECT sex, age, p {R01.replace('persons', 'persons p')}",
    f"SELECT sex, age, COLUMNS('.*rkey') + 0 {R01}",
    "SELECT a5 AS sex, a6 AS age, a11 AS k FROM persons AS p(a1, a2, a3, a4, a5, a6, a7, a8, a9, "
    "a10, a11) WHERE a3 = 'R01'",
    f"WITH t AS (SELECT * {R01}) SELECT sex, age, __rkey AS k FROM t",
    f"SELECT sex, age, hash(__rkey) AS k {R01}",
]


@pytest.mark.parametrize("sql", KEY_SPELLINGS)
def test_anonymize_sql_cannot_store_record_keys(fresh_demo_db, sql):
    """The record keys are the cell key method's secret: no spelling in --sql may copy them
    (or a whole row holding them) into a file that analysts may be given row by row."""
    keys = _record_keys(fresh_demo_db)
    try:
        anonymize(fresh_demo_db, user="admin", sql=sql, into="leak", steps=STEP)
    except MicrodataError:
        return
    stored = _stored(fresh_demo_db, "leak")
    assert not _carries_keys(stored, keys)
    assert not any("k" == c or "rkey" in c for c in stored.columns if c not in ("sex", "age"))


@pytest.mark.parametrize("sql", KEY_SPELLINGS[:4])
def test_synthesize_sql_cannot_read_record_keys(fresh_demo_db, sql):
    with pytest.raises(MicrodataError):
        synthesize(fresh_demo_db, user="admin", sql=sql, into="leak", method="parametric", seed=1)


def test_the_policy_tables_still_read_with_aliases_and_joins(fresh_demo_db):
    report = synthesize(
        fresh_demo_db, user="admin", into="joined", method="parametric", seed=1,
        sql="SELECT p.sex, p.age, h.size FROM persons AS p JOIN households AS h "
            "ON p.household_id = h.household_id WHERE p.region = 'R01'",
        rows=500,  # a size not read from the data (s44c)
    )  # fmt: skip
    assert report.columns == ["sex", "age", "size"] and report.records > 0


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT sex, (SELECT max(material::VARCHAR) FROM sqlsdc.secrets) AS s FROM persons",
        "WITH secrets AS (SELECT * FROM secrets) SELECT * FROM secrets",
        "SELECT sex, (SELECT count(*) FROM 'x.csv') AS s FROM persons",
        "SELECT sex, (SELECT string_agg(name) FROM duckdb_tables()) AS s FROM persons",
        "SELECT p.sex, q.name FROM persons p, (SELECT name FROM query('SELECT 1 AS name')) q",
        "SELECT sex, income FROM persons UNION ALL SELECT 'x', 1 FROM protected.other",
        "SELECT sex, getenv('HOME') AS s FROM persons",
        "WITH persons AS (SELECT 1 AS x) SELECT * FROM persons",
    ],
)
def test_job_sql_reads_the_policy_tables_only(fresh_demo_db, sql):
    with pytest.raises((MicrodataError, NotFoundError)):  # a file's name: no declared table
        synthesize(fresh_demo_db, user="admin", sql=sql, into="leak", method="parametric", seed=1)


@pytest.mark.parametrize("select", ["person_id + 0 AS pid", "CAST(household_id AS VARCHAR) AS h",
                                    "hash(person_id) AS k"])  # fmt: skip
def test_a_renamed_identifier_is_not_stored(fresh_demo_db, select):
    """Column lineage: a value computed from a direct identifier is left out like it."""
    report = anonymize(fresh_demo_db, user="admin", sql=f"SELECT sex, age, {select} {R01}",
                       into="ids", steps=STEP)  # fmt: skip
    alias = select.split()[-1]
    assert alias not in _stored(fresh_demo_db, "ids").columns and alias in report.dropped
    with_cte = f"WITH t AS (SELECT sex, age, {select} {R01}) SELECT * FROM t"
    anonymize(fresh_demo_db, user="admin", sql=with_cte, into="ids2", steps=STEP)
    assert alias not in _stored(fresh_demo_db, "ids2").columns


def test_analysts_cannot_run_the_jobs(fresh_demo_db):
    with pytest.raises(AccessDenied):
        synthesize(fresh_demo_db, user="analyst", source="persons", into="mine",
                   method="parametric", columns=["sex", "age"])  # fmt: skip
    with pytest.raises(AccessDenied):
        anonymize(fresh_demo_db, user="analyst", source="persons", into="mine", steps=STEP)


@pytest.fixture(scope="module")
def released_template(pristine_demo_db, tmp_path_factory, copy_database):
    db = copy_database(pristine_demo_db, tmp_path_factory.mktemp("released"))
    synthesize(db, user="admin", into="seniors_syn", method="parametric", seed=1,
               sql=f"SELECT sex, age, education, income {R01} AND age >= 65",
               rows=3000)  # a size not read from the data (s44c)  # fmt: skip
    con = duckdb.connect(str(db), read_only=True)
    _version, document, _source = current_policy(con)
    con.close()
    apply(db, load_policy({**document, "releases": ["seniors_syn"]}, name="r"), "admin")
    return db


@pytest.fixture
def released(released_template, tmp_path, copy_database):
    """The demo with a released synthetic output ``seniors_syn``: a copy for one test."""
    return copy_database(released_template, tmp_path)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT region, sex, age FROM persons WHERE income = (SELECT MAX(income) FROM seniors_syn)",
        "SELECT s.* FROM seniors_syn s WHERE EXISTS "
        "(SELECT 1 FROM persons p WHERE p.income = s.income)",
        "SELECT s.income FROM seniors_syn s WHERE s.income IN (SELECT income FROM persons)",
        "SELECT income FROM seniors_syn INTERSECT SELECT income FROM persons",
        "SELECT income FROM seniors_syn EXCEPT SELECT income FROM persons",
        "SELECT s.sex, (SELECT COUNT(*) FROM persons p WHERE p.income > s.income) "
        "FROM seniors_syn s",
        "SELECT s.sex FROM seniors_syn s SEMI JOIN persons p ON s.income = p.income",
        "SELECT COUNT(*) FROM seniors_syn s ANTI JOIN persons p ON s.income = p.income",
        "SELECT s.sex, p.sex FROM seniors_syn s JOIN persons p ON s.income = p.income",
        "SELECT s.sex, SUM(p.income) OVER (PARTITION BY s.age) FROM seniors_syn s "
        "JOIN persons p ON s.age = p.age",
        "WITH seniors_syn AS (SELECT * FROM persons) SELECT * FROM seniors_syn",
        "SELECT * FROM SYNTHETIC.seniors_syn",
    ],
)
def test_released_outputs_do_not_single_out_persons(released, sql):
    with sqlsdc.connect(released, user="analyst") as con, pytest.raises(PolicyViolation):
        con.execute(sql)
