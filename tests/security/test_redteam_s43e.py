"""Red team s43e: the query path's suppression universe across new data (session 43).

Attacked as an analyst of the suppression demo (20,000 persons, enterprises by nace x region,
counts ``freq:3``, turnover ``nk:1,60`` and ``freq:3``) who keeps every answer, while the data
owner adds enterprises. Every attack tried, one line each (W: worked, fixed here; O: worked,
left open; H: held):

- W  **Known sum, changed count** (s42l's ``revision (n)`` for jobs, in the query path): one
     enterprise of turnover 0 added to (A, R02) left its turnover published and unchanged
     (known, so forced published) and moved the count of (A, R02), (A, Total), (Total, R02)
     and the grand total from 22, 80, 206, 1000 to 23, 81, 207, 1001: a firm of turnover 0
     had entered (A, R02), its value and cell exact, two queries.
- W  **Changed sum and count** (s40d's attack on jobs, never handled in the query path): one
     enterprise of turnover 777,777 more in (A, R02): the same four cells' counts moved by 1
     and their turnover by exactly 777,777, published in both versions. Fixed for both by a
     revision rule on the universe (``tabular/universe_revisions.py``): a cell the earlier
     pattern published with another value is a primary, for a count when its change is under
     the frequency rule's minimum, for a sum always (no cell value bounds the units behind a
     sum's change); the four cells' counts and sums are NULL in the new pattern.
- H  two populations one zero or NULL unit apart (``WHERE turnover > 0`` / ``>= 0`` /
     ``IS NOT NULL``, ``COUNT(turnover)``): refused, the query path selects cells by
     ``dimension = value`` only.
- H  ``SUM(turnover)/AVG(turnover)`` where the count is hidden: AVG is published only with its
     count.
"""

from __future__ import annotations

import json

import pytest

import sqlsdc
from sqlsdc.engines.duckdb import open_database

CUBE = (
    "SELECT nace, region, COUNT(*) AS n, SUM(turnover) AS t FROM enterprises "
    "GROUP BY CUBE(nace, region)"
)


def _answers(path):
    with sqlsdc.connect(path, user="analyst") as con:
        frame = con.execute(CUBE).df()
    return frame.fillna({"nace": "*", "region": "*"}).set_index(["nace", "region"])


def _add(path, nace: str, region: str, turnover: float) -> None:
    raw = open_database(path)
    try:
        raw.execute(
            "INSERT INTO enterprises (enterprise_id, nace, region, size_class, employees, "
            "turnover) SELECT max(enterprise_id) + 1, ?, ?, 'micro', 0, ? FROM enterprises",
            [nace, region, turnover],
        )
    finally:
        raw.close()


@pytest.fixture
def changing(suppress_template, copy_database, tmp_path):
    return copy_database(suppress_template, tmp_path)


def _published_twice(before, after, column):
    both = before.join(after, how="inner", suffixes=("", "_after"))
    both = both[both[column].notna() & both[f"{column}_after"].notna()]
    return both[column], both[f"{column}_after"]


def _published_cell(answers):
    """An inner cell whose count and turnover are both published (the attacker's target)."""
    inner = answers[
        (answers.index.get_level_values(0) != "*") & (answers.index.get_level_values(1) != "*")
    ]
    return inner[inner["n"].notna() & inner["t"].notna()].index[0]


def test_a_unit_of_zero_joining_a_known_sum_is_not_told_by_its_count(changing):
    """Fails before s43e: the four cells' counts moved by 1 beside their unchanged turnover."""
    before = _answers(changing)
    nace, region = _published_cell(before)
    _add(changing, nace, region, 0.0)
    after = _answers(changing)
    old, new = _published_twice(before, after, "n")
    moved = (new - old).abs()
    assert ((moved == 0) | (moved >= 3)).all(), moved[(moved > 0) & (moved < 3)]
    for cell in [(nace, region), (nace, "*"), ("*", region), ("*", "*")]:
        assert after.loc[cell, "n"] != after.loc[cell, "n"]  # NULL: the count is hidden
        if before.loc[cell, "t"] == before.loc[cell, "t"]:  # the known sum stays published
            assert after.loc[cell, "t"] == before.loc[cell, "t"]


def test_a_new_unit_s_value_is_not_the_difference_of_two_answers(changing):
    """Fails before s43e: four cells published in both versions differed by 777,777."""
    before = _answers(changing)
    nace, region = _published_cell(before)
    _add(changing, nace, region, 777_777.0)
    after = _answers(changing)
    old, new = _published_twice(before, after, "t")
    assert (new == old).all(), (new - old)[new != old]
    old, new = _published_twice(before, after, "n")
    moved = (new - old).abs()
    assert ((moved == 0) | (moved >= 3)).all(), moved[(moved > 0) & (moved < 3)]
    raw = open_database(changing)
    try:
        report = json.loads(
            raw.sql(
                "SELECT report FROM sqlsdc.suppressions WHERE table_name = 'enterprises'"
            ).fetchall()[0][0]
        )
    finally:
        raw.close()
    changed = [(nace, region), (nace, "*"), ("*", region), ("*", "*")]
    for aggregate, column in (("count", "n"), ("turnover", "t")):
        shown = int(before.loc[changed, column].notna().sum())  # published before: revised
        assert shown >= 3
        assert report["aggregates"][aggregate]["revised"] == shown


def test_three_new_units_publish_their_count(changing):
    """A count's change of at least the frequency rule's minimum is published: the difference
    counts at least that many units. Their turnover is hidden: no cell value bounds the units
    behind a sum's change."""
    before = _answers(changing)
    nace, region = _published_cell(before)
    for turnover in (1000.0, 2000.0, 3000.0):
        _add(changing, nace, region, turnover)
    after = _answers(changing)
    assert after.loc[(nace, region), "n"] == before.loc[(nace, region), "n"] + 3
    assert after.loc[(nace, region), "t"] != after.loc[(nace, region), "t"]
