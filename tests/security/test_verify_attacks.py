"""Attacks on the verification server: exact values, tiny groups, a regression dummy for one
person, differencing, repeated noisy queries, query floods. Analysts verify in noisy mode only;
the interval mode's own protections (suppression, refusals, the neighbour scan) are checked as
the admin, its only user (tests/security/test_redteam_s25.py shows why analysts may not use it)."""

from __future__ import annotations

import numpy as np
import pytest
from synth.verify_support import make_synthetic_output, synthetic_db

import sqlsdc
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import PolicyViolation
from sqlsdc.synth.fidelity import Z95, fidelity
from sqlsdc.synth.scan import aggregate_ci

CELL_KEYS = {"group", "estimand", "term", "status", "reason", "fm_interval", "fm_noisy"}


@pytest.fixture(scope="module")
def db(pristine_demo_db, tmp_path_factory):
    return synthetic_db(pristine_demo_db, tmp_path_factory.mktemp("attacks"))


def test_answers_hold_only_fidelity_deciles(db):
    with sqlsdc.connect(db, user="admin") as con:
        answer = con.verify("SELECT region, SUM(income), AVG(income) FROM syn_persons "
                            "GROUP BY region")  # fmt: skip
    for cell in answer.cells:
        assert set(cell) <= CELL_KEYS
        lo, hi = cell["fm_interval"]
        assert round(lo * 10, 9) % 1 == 0 and round(hi * 10, 9) % 1 == 0


def test_tiny_groups_are_suppressed(db):
    raw = open_database(db)
    try:  # a group with 1 to 9 synthetic records
        age, region = raw.execute(
            "SELECT age, region FROM protected.syn_persons GROUP BY ALL "
            "HAVING count(*) BETWEEN 1 AND 9 ORDER BY ALL LIMIT 1"
        ).fetchone()
    finally:
        raw.close()
    where = f"WHERE age = {age} AND region = '{region}'"
    with sqlsdc.connect(db, user="admin") as con:
        answer = con.verify(f"SELECT sex, AVG(income) FROM syn_persons {where} GROUP BY sex")
    with sqlsdc.connect(db, user="analyst") as con:
        tiny = con.verify(f"SELECT AVG(income) FROM syn_persons {where}", mode="noisy",
                          epsilon="1/10")  # fmt: skip
    assert answer.cells and all(c["status"] == "suppressed" for c in answer.cells)
    assert all("fm_interval" not in c for c in answer.cells)
    assert tiny.cells[0]["status"] == "suppressed" and tiny.epsilon_spent == "0"


def test_a_regression_dummy_for_one_person_is_refused(db):
    raw = open_database(db)
    try:
        age, region, sex = raw.execute(
            "SELECT age, region, sex FROM persons WHERE income IS NOT NULL GROUP BY ALL "
            "HAVING count(*) = 1 INTERSECT SELECT age, region, sex FROM protected.syn_persons "
            "ORDER BY ALL LIMIT 1"
        ).fetchone()
    finally:
        raw.close()
    with (
        sqlsdc.connect(db, user="admin") as con,
        pytest.raises(PolicyViolation, match="singles out"),
    ):
        con.verify(f"SELECT OLS(income, age, age = {age} AND region = '{region}' AND "
                   f"sex = '{sex}') "
                   "FROM syn_persons")  # fmt: skip


def test_the_interval_covers_every_one_record_difference(db):
    """Differencing: the released interval of a cell contains the exact FM of the same cell
    without any one of its records, so the answers of a query and of the query that leaves one
    person out are consistent with each other whatever that person's value."""
    sql = "SELECT AVG(income) FROM syn_persons WHERE region = 'R01' AND age BETWEEN 40 AND 44"
    with sqlsdc.connect(db, user="admin") as con:
        (cell,) = con.verify(sql).cells
    raw = open_database(db)
    try:
        where = "WHERE region = 'R01' AND age BETWEEN 40 AND 44 AND income IS NOT NULL"
        y = raw.execute(f"SELECT income FROM persons {where}").fetchnumpy()["income"]
        s = raw.execute(f"SELECT income FROM protected.syn_persons {where}").fetchnumpy()["income"]
    finally:
        raw.close()
    s = np.asarray(s, dtype=float)
    synthetic = (s.mean() - Z95 * s.std(ddof=1) / np.sqrt(len(s)),
                 s.mean() + Z95 * s.std(ddof=1) / np.sqrt(len(s)))  # fmt: skip
    y = np.asarray(y, dtype=float)
    lo, hi = cell["fm_interval"]
    for j in range(len(y)):
        rest = np.delete(y, j)
        est, se = aggregate_ci("avg", rest.sum(), (rest**2).sum(), len(rest), len(rest))
        fm = fidelity((float(est - Z95 * se), float(est + Z95 * se)), synthetic)
        assert lo <= fm <= hi


def test_repeated_noisy_queries_cannot_be_averaged(db):
    sql = "SELECT AVG(income) FROM syn_persons WHERE age > 50"
    with sqlsdc.connect(db, user="analyst") as con:
        answers = {con.verify(sql, mode="noisy", epsilon="1/10").cells[0]["fm_noisy"]
                   for _ in range(5)}  # fmt: skip
    assert len(answers) == 1


def test_query_floods_hit_the_per_user_limit(pristine_demo_db, tmp_path):
    path = synthetic_db(pristine_demo_db, tmp_path)
    make_synthetic_output(path, "syn_limited", report={"verification": {"max_queries": 3}})
    with sqlsdc.connect(path, user="admin") as con:
        for age in (30, 40, 50):
            con.verify(f"SELECT AVG(income) FROM syn_limited WHERE age > {age}")
        with pytest.raises(PolicyViolation, match="its limit"):
            con.verify("SELECT AVG(income) FROM syn_limited WHERE age > 60")
        assert con.verify("SELECT AVG(income) FROM syn_limited WHERE age > 30").cached


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT AVG(income) FROM syn_persons WHERE income > (SELECT AVG(income) FROM persons)",
        "SELECT AVG(p.income) FROM syn_persons s JOIN persons p ON s.age = p.age",
        "SELECT synthetic_copy, AVG(income) FROM syn_persons GROUP BY synthetic_copy",
        "SELECT MAX(income) FROM syn_persons",
        "SELECT AVG(income) FROM syn_persons WHERE read_csv('/etc/passwd') IS NULL",
        "SELECT AVG(income) FROM syn_persons; SELECT 1",
        "SELECT AVG(income) OVER () FROM syn_persons",
    ],
)
def test_hostile_queries_are_refused(db, sql):
    with sqlsdc.connect(db, user="analyst") as con, pytest.raises(PolicyViolation):
        con.verify(sql)
