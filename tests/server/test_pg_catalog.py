"""SessionCatalog against the statements real clients send.

``fixtures/psql.json`` and ``fixtures/sqlalchemy_psycopg.json`` hold every statement that psql 15
(``\\dt``, ``\\d``, ``\\d persons``, ``\\dn``, ``\\l``, ``\\dv``, ``\\d+ persons``, ``\\dt+``) and
SQLAlchemy 2 with psycopg 3 (dialect start-up, ``inspect``: schema, table and view names,
``has_table``, columns, primary key, foreign keys, indexes, unique and check constraints,
comments; psycopg's ``TypeInfo.fetch``) sent to a PostgreSQL 15 server, read from that server's
statement log (``log_statement = all``), with their parameters. The table those clients
described had oid 16384; the tests put the demo's oid of ``persons`` in its place.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import sqlsdc
from sqlsdc.server.catalog import CatalogAnswer, SessionCatalog

FIXTURES = Path(__file__).parent / "fixtures"
VISIBLE_PERSONS = ["person_id", "household_id", "region", "municipality", "sex", "age",
                   "education", "occupation", "income", "weight"]  # fmt: skip


def captured(name: str) -> list[tuple[str, tuple | None]]:
    """(statement, parameters) pairs of a capture file."""
    pairs = []
    for entry in json.loads((FIXTURES / name).read_text()):
        match = re.search(r"\n-- parameters: (.*)\Z", entry, re.S)
        if match is None:
            pairs.append((entry, None))
            continue
        values = re.findall(r"\$\d+ = '((?:[^']|'')*)'", match[1])
        pairs.append((entry[: match.start()], tuple(v.replace("''", "'") for v in values)))
    return pairs


@pytest.fixture
def catalog(session_catalog):
    return session_catalog


def persons_oid(catalog: SessionCatalog) -> int:
    rows = catalog.answer("SELECT c.oid FROM pg_catalog.pg_class c WHERE c.relname = 'persons'")
    return rows.table.to_pylist()[0]["oid"]


def replay(catalog, name):
    oid = str(persons_oid(catalog))
    answers = []
    for sql, params in captured(name):
        params = tuple(oid if p == "16384" else p for p in params) if params else params
        answers.append((sql, catalog.answer(sql.replace("16384", oid), params)))
    return answers


def test_every_psql_describe_statement_is_answered(catalog):
    answers = replay(catalog, "psql.json")
    assert all(isinstance(a, CatalogAnswer) for _, a in answers)
    listing = answers[0][1].table.to_pylist()  # \dt
    assert [(r["Schema"], r["Name"], r["Type"]) for r in listing] == [
        ("public", t, "table") for t in ["benefits", "enterprises", "households", "persons",
                                         "regions"]
    ]  # fmt: skip
    columns = [a for s, a in answers if "a.attname" in s and "format_type" in s][0]
    rows = columns.table.to_pylist()
    assert [r["attname"] for r in rows] == VISIBLE_PERSONS
    assert answers[10][1].table.column(0).to_pylist() == ["public"]  # \dn: no sqlsdc schema


def test_sqlalchemy_psycopg_reflection_statements_are_answered(catalog):
    answers = dict(enumerate(a for _, a in replay(catalog, "sqlalchemy_psycopg.json")))
    assert answers[1].table.column(0).to_pylist()[0].startswith("PostgreSQL 15.0 (sqlsdc)")
    assert answers[2].table.to_pylist() == [{"current_schema()": "public"}]
    assert answers[3].table.to_pylist() == [{"transaction_isolation": "read committed"}]
    assert answers[4].table.to_pylist() == [{"standard_conforming_strings": "on"}]
    assert answers[10].table.column(0).to_pylist() == ["information_schema", "public"]
    assert answers[11].table.column(0).to_pylist() == ["benefits", "enterprises", "households",
                                                       "persons", "regions"]  # fmt: skip
    columns = answers[14].table.to_pylist()
    assert [c["name"] for c in columns] == VISIBLE_PERSONS
    assert {c["name"]: c["format_type"] for c in columns}["income"] == "double precision"
    assert {c["name"]: c["comment"] for c in columns}["income"].startswith("measure")
    assert answers[16].table.num_rows == 0  # no primary key
    assert answers[20].table.num_rows == 0  # no index
    assert answers[22].table.to_pylist()[0]["description"].startswith("confidential table")
    assert answers[25] is None  # the data query goes to the guard
    assert answers[28].table.to_pylist()[0]["oid"] == 1700  # psycopg's TypeInfo of numeric


@pytest.mark.parametrize(
    ("statement", "tag"),
    [("BEGIN", "BEGIN"), ("START TRANSACTION READ ONLY", "BEGIN"), ("COMMIT", "COMMIT"),
     ("ROLLBACK", "ROLLBACK"), ("SAVEPOINT s1", "SAVEPOINT"), ("RELEASE SAVEPOINT s1",
     "RELEASE"), ("DISCARD ALL", "DISCARD ALL"), ("DEALLOCATE ALL", "DEALLOCATE ALL"),
     ("UNLISTEN *", "UNLISTEN"), ("SET extra_float_digits = 3", "SET"),
     ("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED", "SET"),
     ("RESET ALL", "RESET"), ("/* jdbc */ SET application_name = 'PostgreSQL JDBC Driver'",
     "SET")],
)  # fmt: skip
def test_session_statements_get_their_tags(catalog, statement, tag):
    assert catalog.answer(statement) == CatalogAnswer(None, tag)


def test_set_values_are_kept_and_echoed_never_run(catalog):
    catalog.answer("SET TIME ZONE 'Europe/Paris'")
    catalog.answer("SET search_path TO public, 'x; DROP TABLE persons'")
    catalog.answer("SET enable_external_access = true")
    assert catalog.answer("SHOW TimeZone").table.to_pylist() == [{"timezone": "Europe/Paris"}]
    assert catalog.answer("show search_path").table.column(0).to_pylist() == [
        "public, x; DROP TABLE persons"
    ]
    assert catalog.answer("SELECT current_setting('enable_external_access')").table.column(
        0
    ).to_pylist() == ["true"]  # the session's string, not the engine's setting
    with pytest.raises(sqlsdc.ProgrammingError, match="cannot be changed"):
        catalog.answer("SET server_version = '99'")
    with pytest.raises(sqlsdc.ProgrammingError, match="unrecognized configuration parameter"):
        catalog.answer("SHOW no_such_thing")


def test_session_functions_and_constants(catalog):
    for sql, value in [("select version()", "PostgreSQL 15.0 (sqlsdc)"),
                       ("select current_schema()", "public"), ("select pg_backend_pid()", 0),
                       ("select 1", 1), ("SELECT current_user", "analyst")]:  # fmt: skip
        got = catalog.answer(sql).table.column(0).to_pylist()[0]
        assert got == value or str(got).startswith(str(value)), sql


def test_information_schema_lists_visible_columns_only(catalog):
    rows = catalog.answer(
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'public' AND table_name = 'persons' ORDER BY ordinal_position"
    ).table.to_pylist()
    assert [r["column_name"] for r in rows] == VISIBLE_PERSONS
    assert rows[-1]["data_type"] == "double precision"
    tables = catalog.answer("SELECT table_schema, table_name FROM information_schema.tables")
    assert {r["table_schema"] for r in tables.table.to_pylist()} == {"public"}


def test_listen_is_refused(catalog):
    with pytest.raises(sqlsdc.NotSupportedError, match="no notifications"):
        catalog.answer("LISTEN events")


def test_data_queries_are_left_to_the_guard(catalog):
    assert catalog.answer("SELECT region, COUNT(*) FROM persons GROUP BY region") is None
    assert catalog.answer("SELECT random()") is None
    assert catalog.answer("") is None


def test_pg_expandarray_expands_an_array_with_positions(catalog):
    """information_schema._pg_expandarray, as pgjdbc's getPrimaryKeys and getIndexInfo call
    it: one (x, n) row per element, in the select list, field access on the record."""
    rows = catalog.answer(
        "SELECT (information_schema._pg_expandarray(ARRAY[5, 3, 9])).x AS x, "
        "(information_schema._pg_expandarray(ARRAY[5, 3, 9])).n AS n"
    ).table.to_pylist()
    assert rows == [{"x": 5, "n": 1}, {"x": 3, "n": 2}, {"x": 9, "n": 3}]
    keys = catalog.answer(
        "SELECT result.column_name, result.key_seq FROM (SELECT a.attname AS column_name, "
        "(information_schema._pg_expandarray(con.conkey)).n AS key_seq, "
        "information_schema._pg_expandarray(con.conkey) AS keys, a.attnum AS a_attnum "
        "FROM pg_catalog.pg_constraint con JOIN pg_catalog.pg_class ct ON con.conrelid = ct.oid "
        "JOIN pg_catalog.pg_attribute a ON a.attrelid = ct.oid WHERE con.contype = 'p' "
        "AND ct.relname = 'persons') result WHERE result.a_attnum = (result.keys).x"
    )
    assert keys.table.num_rows == 0  # the catalog shows no key: none to expand
    with pytest.raises(sqlsdc.PolicyViolation, match="_pg_keysequal"):
        catalog.answer(
            "SELECT information_schema._pg_keysequal(indkey, indkey) FROM pg_catalog.pg_index"
        )


def test_current_user_is_named_as_postgresql_names_it(catalog):
    """psql showed ``SELECT current_user`` under a column ``'analyst'`` (new user s39)."""
    answer = catalog.answer("SELECT current_user, session_user, current_user AS who")
    assert answer.table.to_pylist() == [
        {"current_user": "analyst", "session_user": "analyst", "who": "analyst"}
    ]
    where = catalog.answer("SELECT 1 AS one WHERE current_user = 'analyst'")
    assert where.table.to_pylist() == [{"one": 1}]


def test_show_budget_lists_the_session_users_budgets(catalog):
    """``SHOW sqlsdc.budget``: what ``remaining_budget()`` gives an embedded connection, for
    an analyst on psql or a BI tool (new user s39): the demo's (analyst, *) budget of ε 10 and
    the shared (*, benefits) one of 50, exact amounts as text, NULL where no limit is set."""
    from fractions import Fraction

    answer = catalog.answer("SHOW sqlsdc.budget")
    assert answer.tag == f"SELECT {answer.table.num_rows}"
    rows = {(r["user"], r["table"]): r for r in answer.table.to_pylist()}
    assert set(rows) == {("analyst", "*"), ("*", "benefits")}
    assert rows["analyst", "*"]["epsilon_limit"] == "10"
    assert rows["*", "benefits"]["epsilon_limit"] == "50"
    for row in rows.values():
        parts = ("limit", "spent", "remaining")
        limit, spent, left = (Fraction(row[f"epsilon_{p}"]) for p in parts)
        assert left == max(limit - spent, 0)
        assert row["rho_limit"] is None and row["rho_spent"] == "0"
    assert catalog.answer("show SQLSDC.BUDGET").table == answer.table
