"""Red team, session 29 (c): suppression, threshold/rounding releases and released outputs,
attacked with only an analyst's guarded connection.

Tried: window functions, ORDER BY/LIMIT and RANK over suppressed cells (they see NULL: held);
group-only queries on a table protected by suppression (found: they were answered by the
threshold rule's noisy group guard over the raw rows, so any WHERE the suppression shape
refuses, ``turnover > 5e6`` included, could be tested for presence; fixed: a group-only
aggregation of a suppressed table now reads the suppression universe, with its shape).
"""

from __future__ import annotations

import shutil

import pytest

import sqlsdc


@pytest.fixture(scope="module")
def guarded(suppress_template, tmp_path_factory):
    path = tmp_path_factory.mktemp("redteam-s29c") / "demo.duckdb"
    shutil.copy(suppress_template, path)
    con = sqlsdc.connect(path, user="analyst")
    yield con
    con.close()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT nace FROM enterprises WHERE turnover > 5e6 GROUP BY nace",
        "SELECT region, sex FROM persons WHERE income > 100000 GROUP BY region, sex",
        "SELECT nace, region FROM enterprises WHERE employees > 20 GROUP BY nace, region",
    ],
)
def test_group_only_queries_cannot_filter_outside_the_suppression_shape(guarded, sql):
    """The same filter is refused with COUNT(*); without an aggregate it must be too."""
    with pytest.raises(sqlsdc.PolicyViolation):
        guarded.execute(sql)


def test_group_only_queries_list_the_cells_of_the_pattern(guarded):
    """A group-only query reads the universe: exactly the groups of the COUNT(*) query."""
    counted = guarded.execute(
        "SELECT nace, region, COUNT(*) FROM enterprises GROUP BY nace, region"
    ).fetchall()
    groups = guarded.execute("SELECT nace, region FROM enterprises GROUP BY nace, region").fetchall()
    assert sorted(groups) == sorted((n, r) for n, r, _ in counted)


def test_windows_and_ordering_over_suppressed_cells_see_null(guarded):
    rows = guarded.execute(
        "SELECT nace, region, SUM(turnover) AS t, RANK() OVER (ORDER BY SUM(turnover)) AS r, "
        "SUM(SUM(turnover)) OVER () AS total FROM enterprises GROUP BY nace, region"
    ).fetchall()
    published = [r for r in rows if r[2] is not None]
    hidden = [r for r in rows if r[2] is None]
    assert hidden and published
    assert {r[3] for r in hidden} == {len(published) + 1}  # one tie: no order among them
    assert {r[4] for r in rows} == {sum(r[2] for r in published)}


def test_a_group_only_query_first_on_a_fresh_database_builds_the_pattern(
    suppress_template, tmp_path
):
    """The first query of a table reading its pattern makes it, aggregates or not."""
    path = tmp_path / "demo.duckdb"
    shutil.copy(suppress_template, path)
    with sqlsdc.connect(path, user="analyst") as con:
        groups = con.execute("SELECT region FROM persons GROUP BY region").fetchall()
        counted = con.execute("SELECT region, COUNT(*) FROM persons GROUP BY region").fetchall()
    assert sorted(groups) == sorted((r,) for r, _ in counted)
