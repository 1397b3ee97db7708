"""Attacks on released outputs: a synthetic or anonymised table the policy lists under
``releases:`` is read like a public table, and nothing else becomes readable through it."""

from __future__ import annotations

import time

import duckdb
import pytest

import sqlsdc
from sqlsdc.admin import apply
from sqlsdc.catalog.store import current_policy
from sqlsdc.errors import PolicyViolation
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.policy import load_policy
from sqlsdc.synth import synthesize

COLUMNS = ["region", "sex", "age", "income"]


def _raw(db, sql):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.sql(sql).df()
    finally:
        con.close()


def _admin(db, *statements):
    con = duckdb.connect(str(db))
    try:
        for statement in statements:
            con.execute(statement)
    finally:
        con.close()


def _release(db, names):
    con = duckdb.connect(str(db), read_only=True)
    _version, document, _source = current_policy(con)
    con.close()
    apply(db, load_policy({**document, "releases": list(names)}, name="releases"), "admin")


@pytest.fixture(scope="module")
def released_template(pristine_demo_db, tmp_path_factory, copy_database):
    """The demo with two synthetic outputs, one of them released (and one missing release)."""
    db = copy_database(pristine_demo_db, tmp_path_factory.mktemp("released"))
    synthesize(db, user="admin", source="persons", into="persons_syn",
               method="parametric", columns=COLUMNS, seed=1)  # fmt: skip
    synthesize(db, user="admin", source="persons", into="other_syn",
               method="parametric", columns=COLUMNS, seed=2)  # fmt: skip
    _release(db, ["persons_syn", "missing_syn"])
    return db


@pytest.fixture
def released(released_template, tmp_path, copy_database):
    """A copy of the template that the test may change."""
    return copy_database(released_template, tmp_path)


def _refusal(con, sql) -> str:
    with pytest.raises(PolicyViolation) as caught:
        con.execute(sql)
    return str(caught.value)


def test_a_release_reads_like_a_public_table(released):
    raw = _raw(released, "SELECT * FROM protected.persons_syn ORDER BY ALL")
    sql = (
        "SELECT sex, count(*) AS n, max(income) AS top, "
        "row_number() OVER (ORDER BY sex) AS r FROM persons_syn GROUP BY sex ORDER BY sex"
    )
    expected = _raw(released, sql.replace("persons_syn", "protected.persons_syn"))
    with sqlsdc.connect(released, user="analyst") as con:
        rows = con.execute("SELECT * FROM persons_syn ORDER BY ALL").df()
        assert rows.equals(raw.astype(rows.dtypes))
        assert con.execute(sql).df().equals(expected.astype(con.execute(sql).df().dtypes))
        assert {c.mechanism for c in con.execute(sql).query.columns} <= {"public", "key"}
        assert len(con.execute('SELECT * FROM "PERSONS_SYN" WHERE income > 0').df()) > 0


def test_joins_with_confidential_tables_stay_protected(released):
    with sqlsdc.connect(released, user="analyst") as con:
        assert "row-level output of confidential tables" in _refusal(
            con, "SELECT p.income, s.income FROM persons p JOIN persons_syn s "
                 "ON p.region = s.region AND p.age = s.age LIMIT 5")  # fmt: skip
        assert "repeat rows" in _refusal(
            con, "SELECT p.region, SUM(p.income) FROM persons p JOIN persons_syn s "
                 "ON p.region = s.region GROUP BY p.region")  # fmt: skip
        cursor = con.execute(
            "SELECT region, COUNT(*) AS n FROM persons WHERE age IN "
            "(SELECT age FROM persons_syn WHERE income > 900000) GROUP BY region")  # fmt: skip
        counted = [c for c in cursor.query.columns if c.name == "n"]
        assert counted and counted[0].released  # the confidential count is protected


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM protected.persons_syn",
        "SELECT * FROM synthetic.persons_syn",
        "SELECT * FROM main.persons_syn",
        "SELECT * FROM temp.persons_syn",
        'SELECT * FROM "protected"."persons_syn"',
        "SELECT * FROM demo.protected.persons_syn",
        "WITH persons AS (SELECT * FROM persons_syn) SELECT * FROM persons",
    ],
)
def test_names_written_another_way_are_refused(released, sql):
    with sqlsdc.connect(released, user="analyst") as con:
        _refusal(con, sql)


def test_outputs_not_listed_are_refused_as_unknown_names(released):
    with sqlsdc.connect(released, user="analyst") as con:
        listed_elsewhere = _refusal(con, "SELECT * FROM other_syn")
        nowhere = _refusal(con, "SELECT * FROM nowhere_syn")
        assert listed_elsewhere.replace("other_syn", "X") == nowhere.replace("nowhere_syn", "X")
        assert "released output 'missing_syn' is not available" in _refusal(
            con, "SELECT * FROM missing_syn")  # fmt: skip


@pytest.mark.parametrize(
    "change",
    [
        ["DROP VIEW synthetic.persons_syn", "DROP TABLE protected.persons_syn"],
        [
            "DROP VIEW synthetic.persons_syn",
            "DROP TABLE protected.persons_syn",
            "CREATE VIEW protected.persons_syn AS SELECT region, sex, age, income FROM persons",
        ],
        ["UPDATE sqlsdc.outputs SET method = 'suppress' WHERE name = 'protected.persons_syn'"],
        ["DELETE FROM sqlsdc.outputs WHERE name = 'protected.persons_syn'"],
        ["CREATE TABLE main.persons_syn AS SELECT region, sex, age, income FROM persons"],
    ],
    ids=["dropped", "replaced-by-view", "other-job", "unrecorded", "shadowed"],
)
def test_a_dropped_or_replaced_output_is_no_longer_read(released, change):
    con = sqlsdc.Connection(released, "analyst", idle_release=0.05)
    try:
        assert len(con.execute("SELECT * FROM persons_syn").df()) == 20_000
        deadline = time.monotonic() + 30
        while con._db is not None and time.monotonic() < deadline:  # the file is let go
            time.sleep(0.01)
        while True:  # ... and closed: _db is None from the start of the close (its checkpoint)
            try:
                _admin(released, *change)
                break
            except duckdb.ConnectionException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        message = _refusal(con, "SELECT * FROM persons_syn")
        assert "released output 'persons_syn' is not available" in message
        assert "confidential" not in message and "income" not in message
    finally:
        con.close()


def test_anonymised_outputs_are_released_the_same_way(fresh_demo_db):
    anonymize(fresh_demo_db, user="admin", source="persons", into="persons_sdc",
              steps=["recode:age:breaks=15/30/45/65", "microaggregate:income:k=5"])  # fmt: skip
    _release(fresh_demo_db, ["persons_sdc"])
    raw = _raw(fresh_demo_db, "SELECT * FROM protected.persons_sdc ORDER BY ALL")
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        rows = con.execute("SELECT * FROM persons_sdc ORDER BY ALL").df()
        assert len(rows) == len(raw) and list(rows.columns) == list(raw.columns)
        assert "person_id" not in rows.columns


def test_policy_refuses_a_release_named_like_a_table(fresh_demo_db):
    con = duckdb.connect(str(fresh_demo_db), read_only=True)
    _version, document, _source = current_policy(con)
    con.close()
    with pytest.raises(sqlsdc.errors.PolicyError, match="releases.0: 'persons' is the name"):
        load_policy({**document, "releases": ["Persons"]})
    with pytest.raises(sqlsdc.errors.PolicyError, match="releases"):
        load_policy({**document, "releases": ["bad name"]})
