"""Unaliased function columns are named as PostgreSQL names them (``count``, not DuckDB's
``count_star()``), in the server's answers only."""

from __future__ import annotations

import asyncio

import pytest

from sqlsdc.server.colnames import postgres_names
from tests.server.conftest import PASSWORD

psycopg = pytest.importorskip("psycopg")


@pytest.mark.parametrize(
    ("sql", "engine", "expected"),
    [
        ("SELECT region, COUNT(*) FROM persons GROUP BY region", ["region", "count_star()"],
         ["region", "count"]),
        ("SELECT sex, COUNT(DISTINCT household_id), SUM(income), CAST(AVG(age) AS INT) "
         "FROM persons GROUP BY sex",
         ["sex", "count(DISTINCT household_id)", "sum(income)", "CAST(avg(age) AS INTEGER)"],
         ["sex", "count", "sum", "avg"]),
        ("SELECT region, COUNT(*) AS n FROM persons GROUP BY region", ["region", "n"],
         ["region", "n"]),  # an alias is kept
        ("SELECT region AS r, COUNT(*) FROM persons GROUP BY 1 UNION ALL SELECT 'x', 1",
         ["r", "count_star()"], ["r", "count"]),
        ("SELECT * FROM persons", ["region", "count_star()"], ["region", "count_star()"]),
        ("SELECT COUNT(*) FROM persons", ["a", "b"], ["a", "b"]),  # does not match: unchanged
        ("SELECT COUNT(*) FROM persons", ["n"], ["n"]),  # named by the guard, not the engine
        ("not sql at all (", ["x"], ["x"]),
        ("SELECT version(), upper(name) FROM regions", ['"version"()', "upper(\"name\")"],
         ["version", "upper"]),
    ],
)  # fmt: skip
def test_function_columns_are_named_after_the_function(sql, engine, expected):
    assert postgres_names(sql, engine) == expected


def test_clients_see_postgres_names(server):
    sql = "SELECT region, COUNT(*), AVG(income) FROM persons GROUP BY region"
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        cursor = con.execute(sql)
        assert [d.name for d in cursor.description] == ["region", "count", "avg"]
        cursor = con.execute(sql.replace("GROUP BY", "WHERE sex = %s GROUP BY"), ("F",))
        assert [d.name for d in cursor.description] == ["region", "count", "avg"]
    asyncpg = pytest.importorskip("asyncpg")

    async def described() -> list[str]:  # asyncpg describes before binding (the shape path)
        con = await asyncpg.connect(host=server.host, port=server.port, user="analyst",
                                    password=PASSWORD, database="demo", ssl=False)  # fmt: skip
        try:
            statement = await con.prepare(sql.replace("GROUP BY", "WHERE sex = $1 GROUP BY"))
            return [a.name for a in statement.get_attributes()]
        finally:
            await con.close()

    assert asyncio.run(described()) == ["region", "count", "avg"]


def test_catalog_answers_are_named_as_postgresql_names_them(server):
    """`SELECT version()` came back as a column named '"version"()' (PostgreSQL: version)."""
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        for sql, name in (("SELECT version()", "version"),
                          ("SELECT current_schema()", "current_schema")):  # fmt: skip
            assert [d.name for d in con.execute(sql).description] == [name]
