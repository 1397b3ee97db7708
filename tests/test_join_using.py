"""A column merged by ``JOIN ... USING`` is one column for the guard, written either way
(sqlsdc/guard/using_columns.py): DuckDB accepts ``SELECT region ... GROUP BY p.region`` over
``USING (region)``, and so does the guard now, with the same released cells as every other
spelling. The merge is an identity of SQL, so it is only made where it is one."""

import pytest
import sqlglot
from sqlglot import exp
from sqlglot.optimizer.qualify import qualify

from sqlsdc.guard import using_columns

SCHEMA = {
    "a": {"x": "INT", "y": "INT"},
    "b": {"x": "INT", "z": "INT"},
    "c": {"x": "INT", "w": "INT"},
    "wide": {"x": "BIGINT"},
}


def merged(sql: str) -> str:
    tree = sqlglot.parse_one(sql, read="duckdb")
    using_columns.mark(list(tree.find_all(exp.Join)))
    tree = qualify(tree, schema=SCHEMA, dialect="duckdb", quote_identifiers=False)
    using_columns.merge(tree, SCHEMA)
    return tree.sql("duckdb")


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        (
            "SELECT x, COUNT(*) FROM a JOIN b USING (x) GROUP BY a.x",
            "SELECT a.x AS x, COUNT(*) AS _col_1 FROM a AS a JOIN b AS b ON a.x = b.x GROUP BY a.x",
        ),
        (
            "SELECT x FROM a LEFT JOIN b USING (x) LEFT OUTER JOIN c USING (x)",
            "SELECT a.x AS x FROM a AS a LEFT JOIN b AS b ON a.x = b.x "
            "LEFT OUTER JOIN c AS c ON a.x = c.x",
        ),
        (  # the first table with the column is the left side, whatever comes before it
            "SELECT x FROM a JOIN c ON a.y = c.w JOIN b USING (x)",
            "SELECT a.x AS x FROM a AS a JOIN c AS c ON a.y = c.w JOIN b AS b ON a.x = b.x",
        ),
    ],
)
def test_a_merged_column_is_its_left_column(sql, expected):
    assert merged(sql) == expected


@pytest.mark.parametrize(
    "sql",
    [
        # the right side of a RIGHT join, or both sides of a FULL join, are not the left column
        "SELECT x FROM a RIGHT JOIN b USING (x)",
        "SELECT x FROM a FULL JOIN b USING (x)",
        # a LEFT join's right column first: NULL where the left one is not
        "SELECT COALESCE(b.x, a.x) FROM a LEFT JOIN b USING (x)",
        # c is tied to a, not to b: b.x is NULL where c.x = a.x is not
        "SELECT COALESCE(b.x, c.x) FROM a LEFT JOIN b USING (x) LEFT JOIN c USING (x)",
        # not tied by the join at all
        "SELECT COALESCE(a.x, b.x) FROM a JOIN b ON a.y = b.z",
        # DuckDB gives the merged column the wider type: BIGINT, not a's INT
        "SELECT x FROM a JOIN wide USING (x)",
        # a derived table has no declared type
        "SELECT x FROM a JOIN (SELECT x FROM b) AS d USING (x)",
        # a CTE of a table's name is not that table
        "WITH b AS (SELECT y AS x FROM a) SELECT x FROM a JOIN b USING (x)",
    ],
)
def test_a_coalesce_that_is_not_its_first_column_is_kept(sql):
    assert "COALESCE(" in merged(sql)


SPELLINGS = [
    "SELECT region, COUNT(*), SUM(income) FROM persons p JOIN regions r USING (region) "
    "GROUP BY region",
    "SELECT region, COUNT(*), SUM(income) FROM persons p JOIN regions r USING (region) "
    "GROUP BY p.region",
    "SELECT p.region, COUNT(*), SUM(income) FROM persons p JOIN regions r USING (region) "
    "GROUP BY region",
    "SELECT p.region, COUNT(*), SUM(income) FROM persons p LEFT JOIN regions r "
    "USING (region) GROUP BY region",
    "SELECT p.region, COUNT(*), SUM(income) FROM persons p GROUP BY p.region",
]


def test_every_spelling_of_a_merged_key_releases_the_same_cells(ckm):
    answers = [sorted(ckm.execute(sql).fetchall()) for sql in SPELLINGS]
    assert len(answers[0]) == 8
    assert all(answer == answers[0] for answer in answers)


def test_a_key_merged_from_a_confidential_join_is_that_of_the_persons(ckm, raw_ckm):
    # a sum: a count of persons in cells of the households' columns is refused (s43i); the
    # households' count decides which groups appear (s43k)
    sql = (
        "SELECT tenure, region, SUM(income), COUNT(DISTINCT h.household_id) "
        "FROM persons p JOIN households h "
        "USING (household_id, region) GROUP BY 1, p.region"
    )
    keys = {row[:2] for row in ckm.execute(sql).fetchall()}
    exact = raw_ckm.execute(
        "SELECT tenure, p.region FROM persons p JOIN households h "
        "ON p.household_id = h.household_id AND p.region = h.region GROUP BY ALL"
    ).fetchall()
    assert keys == set(exact)
