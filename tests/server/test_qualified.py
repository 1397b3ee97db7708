"""``public.table`` (how BI tools write the catalog's tables, Superset always) reaches the guard
as the plain name; nothing else is unqualified."""

from __future__ import annotations

import pytest

from sqlsdc.server.qualified import unqualified

psycopg = pytest.importorskip("psycopg")

SUPERSET_CHART = ("SELECT region AS region, COUNT(*) AS count \nFROM public.persons "
                  "GROUP BY region ORDER BY count DESC \n LIMIT 10000;")  # fmt: skip


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        (
            SUPERSET_CHART,
            "SELECT region AS region, COUNT(*) AS count FROM persons GROUP BY "
            "region ORDER BY count DESC LIMIT 10000",
        ),  # fmt: skip
        ('SELECT COUNT(*) FROM "public"."persons" p', 'SELECT COUNT(*) FROM "persons" AS p'),
        ("SELECT public.persons.sex FROM demo.public.persons", "SELECT persons.sex FROM persons"),
        ("SELECT COUNT(*) FROM persons WHERE sex = $1", None),  # no public: the text itself
        ("SELECT COUNT(*) FROM other.public.persons", None),  # another database
        ("SELECT COUNT(*) FROM main.persons, sqlsdc.public_keys", None),
        ("WITH x AS (SELECT 1 AS a) SELECT a FROM public.x", None),  # never the CTE x
        ("SELECT * FROM public.persons; SELECT 1", None),  # two statements: the guard's
        ("SELECT FROM public.(", None),  # unparsable: the guard reports it
    ],
)
def test_only_the_public_schema_is_dropped(sql, expected):
    assert unqualified(sql, "demo") == (sql if expected is None else expected)


def test_a_public_qualified_aggregate_equals_the_plain_one(server):
    plain = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region ORDER BY region"
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        expected = con.execute(plain).fetchall()
        assert con.execute(plain.replace("persons", "public.persons")).fetchall() == expected
        assert con.execute(plain.replace("persons", "demo.public.persons")).fetchall() == expected
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="qualified table name"):
            con.execute(plain.replace("persons", "main.persons"))


def test_long_statements_are_decided_but_not_kept():
    """Decisions on a statement's text are cached only for short texts: a client sending many
    long distinct statements cannot make the server keep them."""
    long = "SELECT COUNT(*) AS n FROM public.persons WHERE " + " OR ".join(
        f"age = {i}" for i in range(1000)
    )
    kept = unqualified.cache_info().currsize
    assert unqualified(long, "demo").startswith("SELECT COUNT(*) AS n FROM persons WHERE")
    assert unqualified.cache_info().currsize == kept
    unqualified("SELECT COUNT(*) AS n FROM public.persons WHERE age = 7", "demo")
    assert unqualified.cache_info().currsize == kept + 1
