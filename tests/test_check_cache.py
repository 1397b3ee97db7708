"""The process-wide cache of checked statements: shared across connections only while the
policy, schema and catalog a check reads are the same. ``explain`` gives a copy of the cached
query (``ProtectedQuery.detached``) whose ``sql`` is the entry's own text object, so ``.sql is``
tells whether two statements were answered by one entry."""

from __future__ import annotations

import shutil

import pytest

import sqlsdc
from sqlsdc.catalog import store
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import PolicyViolation
from sqlsdc.guard import check_cache
from sqlsdc.policy import load_policy

COUNT = "SELECT region, COUNT(*) FROM persons GROUP BY region"
INCOME = "SELECT region, SUM(income) FROM persons GROUP BY region"


def _document(path):
    con = open_database(path)
    try:
        return store.current_policy(con)[1]
    finally:
        con.close()


def test_a_statement_is_checked_once_for_every_connection_of_a_user(fresh_demo_db):
    """Shared by one user's connections; not by another user's (a kept statement answered
    faster told an analyst what another user had asked: red team s45h)."""
    first = sqlsdc.connect(fresh_demo_db, user="analyst")
    again = sqlsdc.connect(fresh_demo_db, user="analyst")
    other = sqlsdc.connect(fresh_demo_db, user="admin")
    try:
        assert again.explain(COUNT).sql is first.explain(COUNT).sql  # one entry's text
        assert other.explain(COUNT).sql is not first.explain(COUNT).sql
        assert other.explain(COUNT).sql == first.explain(COUNT).sql
        assert sorted(first.execute(COUNT).fetchall()) == sorted(other.execute(COUNT).fetchall())
        assert first.explain(COUNT, None).sql is not first.explain(INCOME).sql
    finally:
        first.close()
        again.close()
        other.close()


def test_parameters_are_part_of_the_key(fresh_demo_db):
    sql = "SELECT region, COUNT(*) FROM persons WHERE age >= ? GROUP BY region"
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        adults, seniors = con.explain(sql, [18]), con.explain(sql, [65])
        assert adults.sql is not seniors.sql
        assert adults.sql != seniors.sql
        assert con.explain(sql, (18,)).sql is adults.sql


def test_a_new_policy_is_checked_again(fresh_demo_db):
    with sqlsdc.connect(fresh_demo_db, user="analyst") as before:
        assert before.explain(INCOME).columns
    document = _document(fresh_demo_db)
    document["tables"]["persons"]["columns"].pop("income")
    sqlsdc.admin.apply(fresh_demo_db, load_policy(document), user="admin")
    with sqlsdc.connect(fresh_demo_db, user="analyst") as after:
        with pytest.raises(PolicyViolation):
            after.explain(INCOME)


def test_a_new_index_changes_the_fingerprint(fresh_demo_db):
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        before = con._context.fingerprint
        cached = con.explain(COUNT)
    raw = open_database(fresh_demo_db)
    try:
        raw.execute("CREATE UNIQUE INDEX extra_unique ON regions (name)")
    finally:
        raw.close()
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        assert con._context.fingerprint != before
        assert con.explain(COUNT).sql is not cached.sql


def test_another_database_with_the_same_policy_does_not_share(fresh_demo_db, tmp_path):
    copy = tmp_path / "copy.duckdb"
    shutil.copyfile(fresh_demo_db, copy)
    with sqlsdc.connect(fresh_demo_db, user="analyst") as a, sqlsdc.connect(copy, "analyst") as b:
        assert a._context.fingerprint != b._context.fingerprint
        assert a.explain(COUNT).sql is not b.explain(COUNT).sql


def test_refusals_are_not_kept(fresh_demo_db):
    check_cache.clear()
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        for _ in range(2):
            with pytest.raises(PolicyViolation):
                con.explain("SELECT income FROM persons")
    assert not check_cache._entries


def test_the_cache_is_bounded(fresh_demo_db, monkeypatch):
    monkeypatch.setattr(check_cache, "CAPACITY", 3)
    check_cache.clear()
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        for age in range(5):
            con.explain(f"SELECT region, COUNT(*) FROM persons WHERE age >= {age} GROUP BY region")
    assert len(check_cache._entries) == 3
