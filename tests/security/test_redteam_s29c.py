"""Red team, session 29 (c): suppression, rounding releases and released outputs, attacked
with only an analyst's guarded connection.

Tried: window functions, ORDER BY/LIMIT, RANK and HAVING over suppressed cells (they see NULL:
held); scale constants under rounding (``SUM(m::DOUBLE * 1e6)`` scales the rounded sum: held);
the pattern table and released names read directly (refused: held); a released synthetic
table as a scalar bound on a confidential measure, in correlated subqueries, in joins that
repeat rows, or shadowed by CREATE (all refused: held, pinned in test_released_outputs.py);
differencing the suppressed pattern through its margins with a linear program.

What succeeded, and was closed:

* group-only queries on a table protected by suppression were answered by the threshold
  rule's noisy group guard over the raw rows, so any WHERE the suppression shape refuses
  (``turnover > 5e6``) could be tested for presence. A group-only aggregation of a suppressed
  table now reads the cells of the suppression pattern, with its shape (and makes the
  pattern first, as an aggregate would);
* a count without GROUP BY whose filters name a suppressed cell came back as 0 (the value for
  no unit at all) instead of NULL; it is NULL now, and 0 only where no cell matches;
* every cell of the pattern is listed by queries, a suppressed one with NULL, so an analyst
  knows each hidden count is at least 1 (a margin at least its number of inner cells); the
  secondary suppression and its audit assumed ``[0, inf)``. With that bound a linear program
  over the published nace x region counts narrowed hidden cells to one value either way (a
  count of 2 under ``freq:3`` shown to be 1 or 2, against a required upper protection of 1).
  The count patterns are now protected and audited against those a-priori bounds.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linprog

import sqlsdc
from sqlsdc.engines.duckdb import open_database


@pytest.fixture(scope="module")
def guarded(suppress_template, tmp_path_factory, copy_database):
    path = copy_database(suppress_template, tmp_path_factory.mktemp("redteam-s29c"))
    with sqlsdc.connect(path, user="analyst") as con:
        yield con


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
    groups = guarded.execute(
        "SELECT nace, region FROM enterprises GROUP BY nace, region"
    ).fetchall()
    assert sorted(groups) == sorted((n, r) for n, r, _ in counted)


def test_a_suppressed_total_is_null_and_an_empty_one_is_zero(guarded):
    """Without GROUP BY a count is one cell: NULL when the pattern hides it (it was 0, the
    answer for no unit at all), 0 when no cell matches."""
    hidden = guarded.execute(
        "SELECT nace, region FROM enterprises GROUP BY nace, region HAVING COUNT(*) IS NULL"
    ).fetchall()
    assert hidden
    for nace, region in hidden[:3]:
        sql = f"SELECT COUNT(*) FROM enterprises WHERE nace = '{nace}' AND region = '{region}'"
        assert guarded.execute(sql).fetchall() == [(None,)]
        assert guarded.execute(sql + " HAVING COUNT(*) = 0").fetchall() == []
    none = "SELECT COUNT(*) FROM enterprises WHERE nace = 'A' AND region = 'nowhere'"
    assert guarded.execute(none).fetchall() == [(0,)]


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
    suppress_template, tmp_path, copy_database
):
    """The first query of a table reading its pattern makes it, aggregates or not."""
    path = copy_database(suppress_template, tmp_path)
    with sqlsdc.connect(path, user="analyst") as con:
        groups = con.execute("SELECT region FROM persons GROUP BY region").fetchall()
        counted = con.execute("SELECT region, COUNT(*) FROM persons GROUP BY region").fetchall()
    assert sorted(groups) == sorted((r,) for r, _ in counted)


def _attacker_intervals(cells: dict, lower: float) -> dict:
    """Each hidden inner cell's [min, max] over the nace x region table's additivity, every
    hidden cell at least ``lower`` (what the analyst knows of it a priori)."""
    inner = [k for k in cells if None not in k]
    hidden = [k for k in inner if cells[k] is None]
    at = {k: i for i, k in enumerate(hidden)}
    rows, totals = [], []
    margins = [(n, None) for n in {n for n, _ in inner}] + [
        (None, r) for r in {r for _, r in inner}
    ]
    for margin in [*margins, (None, None)]:
        if cells.get(margin) is None:
            continue
        members = [
            k for k in inner if all(m is None or m == c for m, c in zip(margin, k, strict=True))
        ]
        row = np.zeros(len(hidden))
        for k in members:
            if k in at:
                row[at[k]] = 1
        rows.append(row)
        totals.append(cells[margin] - sum(cells[k] for k in members if k not in at))
    bounds = [(lower, None)] * len(hidden)
    out = {}
    for k, i in at.items():
        c = np.zeros(len(hidden))
        c[i] = 1
        lo = linprog(c, A_eq=np.array(rows), b_eq=totals, bounds=bounds).fun
        hi = -linprog(-c, A_eq=np.array(rows), b_eq=totals, bounds=bounds).fun
        out[k] = (lo, hi)
    return out


def test_a_hidden_count_keeps_its_upper_protection_given_that_its_cell_exists(
    suppress_template, tmp_path, copy_database
):
    """A suppressed cell's row is in the result (NULL count), so the analyst knows it has at
    least one unit; the pattern must protect primary cells against that bound, not 0: a
    count under ``freq:3`` must be possibly one higher than it is (UPL = max(30 %, 1))."""
    path = copy_database(suppress_template, tmp_path)
    with sqlsdc.connect(path, user="analyst") as con:
        rows = con.execute(
            "SELECT nace, region, COUNT(*) FROM enterprises GROUP BY CUBE(nace, region)"
        ).fetchall()
    cells = {(n, r): v for n, r, v in rows}
    intervals = _attacker_intervals(cells, lower=1.0)
    raw = open_database(path)
    try:
        true = dict(
            ((n, r), c)
            for n, r, c in raw.execute(
                "SELECT nace, region, COUNT(*) FROM enterprises GROUP BY nace, region"
            ).fetchall()
        )
    finally:
        raw.close()
    primary = {k: true[k] for k in intervals if true[k] < 3}
    assert primary
    assert all(intervals[k][1] >= v + 1 - 1e-6 for k, v in primary.items()), {
        k: (v, intervals[k]) for k, v in primary.items()
    }
