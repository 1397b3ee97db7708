"""A global aggregate's answer is one cell under a cell limit, shown or not (review of s50,
item 4 of s50l): ``SELECT COUNT(*) FROM persons WHERE 1=0`` answers no row (the total is
published as 0, as every group a CKM threshold leaves out) and is charged 1 cell, as the
hidden cell of its frame (:func:`sqlsdc.guard.hidden_cells.hidden_cells`), with no ledger row.

Kept, not changed: the "no row" is the total's released value ("0, or too few to show"), as a
group left out of a grouped answer is, and both are charged. A free "no row" would let the
analyst ask "are fewer than k persons such that ...?" without end (a probe of one person's
value answers "no row" half the time, free); charging it only when the total's rows exist
would make the charge read the data (0 rows against 1 to k - 1 rows, told apart by when the
limit refuses). The global total's cell is charged from the query's shape alone."""

from __future__ import annotations

import duckdb
import pytest

import sqlsdc
from tests.security.test_redteam_s49n import template  # noqa: F401 - a fixture
from tests.security.test_redteam_s50d import _fresh, _used


def _one_person(db) -> str:
    """A condition on dimensions that one person of ``db`` meets."""
    raw = duckdb.connect(str(db), read_only=True)
    municipality, age = raw.execute(
        "SELECT municipality, age FROM persons GROUP BY ALL HAVING COUNT(*) = 1 ORDER BY ALL"
    ).fetchone()
    raw.close()
    return f"municipality = '{municipality}' AND age = {age}"


@pytest.mark.parametrize("where", ["1 = 0", "age > 1000", "one person"])
def test_a_total_answered_as_no_row_costs_one_cell_whatever_the_data(template, tmp_path, where):  # noqa: F811
    """No row of the data, or one person's: the same charge, 1 cell. No row of the data
    answers no row; one person's count answers no row or a count the ptable drew for 1 (the
    cell key is drawn per build: 3 in one CI run), charged alike."""
    db = _fresh(template, tmp_path, "total", 100)
    one = where == "one person"
    where = _one_person(db) if one else where
    with sqlsdc.connect(db, user="analyst") as con:
        answer = con.execute(f"SELECT COUNT(*) FROM persons WHERE {where}").fetchall()
    assert answer == [] or (one and len(answer) == 1)
    assert _used(db) == 1


def test_a_total_shown_costs_one_cell(template, tmp_path):  # noqa: F811
    db = _fresh(template, tmp_path, "shown", 100)
    with sqlsdc.connect(db, user="analyst") as con:
        assert len(con.execute("SELECT COUNT(*) FROM persons WHERE age > 30").fetchall()) == 1
    assert _used(db) == 1
