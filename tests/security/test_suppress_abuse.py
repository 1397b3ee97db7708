"""Attempts to read around cell suppression in the query path.

Every query under ``method: suppress`` is cut from one audited pattern; these tests try to make
a query compute something else (filters, expressions, FILTER clauses, subqueries) or to learn a
hidden value from what HAVING, arithmetic or row presence reveal.
"""

from __future__ import annotations

import pytest

import sqlsdc


@pytest.fixture(scope="module")
def guarded(suppress_template, tmp_path_factory, copy_database):
    path = copy_database(suppress_template, tmp_path_factory.mktemp("suppress-abuse"))
    con = sqlsdc.connect(path, user="analyst")
    yield con
    con.close()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT nace, COUNT(*) FROM enterprises WHERE nace = 'A' OR 1 = 1 GROUP BY nace",
        "SELECT nace, COUNT(*) FROM enterprises WHERE (nace = 'A') = TRUE GROUP BY nace",
        "SELECT nace, COUNT(*) FROM enterprises WHERE nace = region GROUP BY nace",
        "SELECT nace, COUNT(*) FROM enterprises WHERE nace = 'A' AND turnover > 0 GROUP BY nace",
        "SELECT nace, COUNT(*) FROM enterprises WHERE NOT nace <> 'A' GROUP BY nace",
        "SELECT nace, COUNT(*) FROM enterprises WHERE nace = (SELECT MIN(region) FROM regions) "
        "GROUP BY nace",
        "SELECT nace, COUNT(*) FROM enterprises WHERE nace LIKE 'A%' GROUP BY nace",
        "SELECT LOWER(nace), COUNT(*) FROM enterprises GROUP BY LOWER(nace)",
        "SELECT nace, turnover > 1e6 AS big, COUNT(*) FROM enterprises GROUP BY nace, big",
        "SELECT nace, SUM(turnover) FILTER (WHERE employees > 5) FROM enterprises GROUP BY nace",
        "SELECT nace, COUNT(*) FILTER (WHERE turnover > 1e6) FROM enterprises GROUP BY nace",
        "SELECT nace, SUM(DISTINCT turnover) FROM enterprises GROUP BY nace",
        "SELECT nace, SUM(CASE WHEN employees > 5 THEN turnover END) FROM enterprises "
        "GROUP BY nace",
        "SELECT (SELECT COUNT(*) FROM enterprises WHERE nace = 'A') AS n",
        "SELECT nace FROM enterprises GROUP BY nace HAVING COUNT(*) > 0 "
        "UNION ALL SELECT region FROM enterprises",
        "SELECT region, COUNT(*) FROM enterprises e WHERE EXISTS "
        "(SELECT 1 FROM regions r WHERE r.region = e.region) GROUP BY region",
    ],
)
def test_queries_that_would_compute_other_cells_are_refused(guarded, sql):
    with pytest.raises(sqlsdc.PolicyViolation):
        guarded.execute(sql)


def test_having_on_a_hidden_value_reveals_nothing(guarded):
    """A suppressed sum is NULL to HAVING: rows kept are exactly those with a published sum,
    whatever threshold the attacker tries."""
    sql = "SELECT nace, region, SUM(turnover) AS t FROM enterprises GROUP BY nace, region"
    published = {(r[0], r[1]) for r in guarded.execute(sql).fetchall() if r[2] is not None}
    for threshold in (0, 1e5, 1e7):
        kept = guarded.execute(
            f"SELECT nace, region, COUNT(*) FROM enterprises GROUP BY nace, region "
            f"HAVING SUM(turnover) > {threshold}"
        ).fetchall()
        assert {(r[0], r[1]) for r in kept} <= published
    below = guarded.execute(
        "SELECT nace, region FROM enterprises GROUP BY nace, region HAVING SUM(turnover) IS NULL"
    ).fetchall()
    assert {tuple(r) for r in below}.isdisjoint(published)
    assert len(below) + len(published) == len(guarded.execute(sql).fetchall())


def test_arithmetic_on_hidden_values_stays_hidden(guarded):
    rows = guarded.execute(
        "SELECT nace, region, SUM(turnover) - SUM(turnover) AS zero, "
        "COALESCE(SUM(turnover), -1) AS t FROM enterprises GROUP BY nace, region"
    ).fetchall()
    assert any(r[3] == -1 for r in rows)
    assert all((r[2] is None) == (r[3] == -1) for r in rows)


def test_parameters_select_cells_like_literals(guarded):
    literal = guarded.execute(
        "SELECT region, COUNT(*) FROM enterprises WHERE nace = 'C' GROUP BY region ORDER BY 1"
    ).fetchall()
    bound = guarded.execute(
        "SELECT region, COUNT(*) FROM enterprises WHERE nace = ? GROUP BY region ORDER BY 1", ["C"]
    ).fetchall()
    assert literal == bound and literal
