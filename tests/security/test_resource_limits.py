"""One statement cannot hold a shared process's memory: an answer is read batch by batch and
abandoned once it has more than ``MAX_ANSWER_ROWS`` rows (the red team's cross join of a public
table, tests/security/test_redteam_s25.py, through ``sqlsdc serve``)."""

from __future__ import annotations

import duckdb
import pytest

import sqlsdc
from sqlsdc.engines.duckdb import is_wide_integer, memory_database, run
from sqlsdc.guard import connection


def test_an_answer_over_the_row_cap_is_stopped_and_audited(demo_db, monkeypatch):
    monkeypatch.setattr(connection, "MAX_ANSWER_ROWS", 1_000)
    with sqlsdc.connect(demo_db, user="analyst") as con:
        assert (
            len(con.execute("SELECT r1.name, r2.name FROM regions r1, regions r2").fetchall()) == 64
        )
        with pytest.raises(sqlsdc.AnswerTooLarge, match="more than 1,000 rows") as stopped:
            con.execute("SELECT r1.name FROM regions r1, regions r2, regions r3, regions r4")
        assert isinstance(stopped.value, sqlsdc.OperationalError)
        assert con.execute("SELECT COUNT(*) AS n FROM regions").fetchall()[0][0] == 8
        entries = con.execute("SELECT 1 AS one").fetchall()  # the connection goes on
    assert entries == [(1,)]
    raw = duckdb.connect(str(demo_db), read_only=True)
    try:
        ((decision, reason),) = raw.execute(
            "SELECT decision, reason FROM sqlsdc.audit WHERE sql_text LIKE '%regions r4%' "
            "ORDER BY query_id DESC LIMIT 1"
        ).fetchall()
    finally:
        raw.close()
    assert decision == "refused" and "more than 1,000 rows" in reason


def test_an_answer_over_the_byte_cap_is_stopped(demo_db, monkeypatch):
    monkeypatch.setattr(connection, "MAX_ANSWER_BYTES", 2**20)
    many = ", ".join(f"r{i}.name AS n{i}" for i in range(1, 6))
    tables = ", ".join(f"regions r{i}" for i in range(1, 6))
    with sqlsdc.connect(demo_db, user="analyst") as con:
        with pytest.raises(sqlsdc.AnswerTooLarge, match="more than 1 MiB"):
            con.execute(f"SELECT {many} FROM {tables}")  # 32,768 rows x 5 names: about 2 MB
        assert len(con.execute(f"SELECT {many} FROM {tables} LIMIT 10").fetchall()) == 10


class _PublicOnly:
    """A connection seen through DuckDB's public API only (no private ``_submit``)."""

    def __init__(self, con):
        self.sql, self.interrupt = con.sql, con.interrupt


@pytest.mark.parametrize("through", [lambda con: con, _PublicOnly], ids=["submit", "public"])
def test_run_streams_the_same_answer_either_way_and_stops_at_the_cap(through):
    con = memory_database()
    sql = "SELECT range AS i, range::HUGEINT AS h, 'x' || range AS s FROM range(300000)"
    try:
        answer = run(through(con), sql)
        assert answer.num_rows == 300_000 and answer.column("s")[299_999].as_py() == "x299999"
        assert is_wide_integer(answer.schema.field("h"))
        assert not is_wide_integer(answer.schema.field("i"))
        with pytest.raises(sqlsdc.AnswerTooLarge, match="more than 1,000 rows"):
            run(through(con), sql, max_rows=1_000)
        assert run(con, "SELECT 42 AS x").column("x").to_pylist() == [42]  # the stream was closed
    finally:
        con.close()
