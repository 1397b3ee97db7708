"""Revisions: a suppression job stored again after its data changed (``--replace``, or under
another name) does not publish, in two versions, a cell whose difference is the contribution
of fewer units than its rules allow (:mod:`sqlsdc.jobs.revisions`).

Every test changes a few enterprises and compares the versions as a reader does, cell by cell:
a cell published in two versions with two values gives the change of the units in between, and
in these tests only one or two units changed, so every such cell is a disclosure.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest

from sqlsdc.engines.duckdb import open_database
from sqlsdc.jobs.protect import protect_query
from sqlsdc.tabular.rules import DominanceRule, FrequencyRule

TURNOVER = "SELECT nace, region, SUM(turnover) FROM enterprises GROUP BY nace, region"
RULES = [DominanceRule(n=1, k=60), FrequencyRule(3)]
NEW_FIRM = (
    "INSERT INTO enterprises SELECT max(enterprise_id) + 1, NULL, '{nace}', '{region}', "
    "any_value(size_class), 5, {turnover}, 4242 FROM enterprises"
)


def change(db, *statements: str) -> None:
    con = open_database(db)
    try:
        for sql in statements:
            con.execute(sql)
    finally:
        con.close()


def published(db, name: str) -> pd.DataFrame:
    """The cells a reader of ``protected.<name>`` holds: value and n where published."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        frame = con.sql(f"SELECT nace, region, status, n, value FROM protected.{name}").df()
    finally:
        con.close()
    return frame[frame.status == "published"].set_index(["nace", "region"])[["n", "value"]]


def changed_in_both(first: pd.DataFrame, second: pd.DataFrame) -> pd.DataFrame:
    """The cells published in both versions whose value or unit count differs."""
    both = first.join(second, how="inner", suffixes=("_1", "_2"))
    moved = ~np.isclose(both.value_1, both.value_2, rtol=1e-12, atol=0.0) | (both.n_1 != both.n_2)
    return both[moved]


def small_firm(db, nace: str, region: str) -> int:
    """An enterprise of a cell of many, whose removal no rule of that cell notices alone."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(
            "SELECT enterprise_id FROM enterprises WHERE nace = ? AND region = ? "
            "ORDER BY turnover, enterprise_id LIMIT 1 OFFSET 3",
            [nace, region],
        ).fetchall()[0][0]
    finally:
        con.close()


def _turnover_stored(db) -> None:
    """The first version of the turnover table, stored (each test's first job)."""
    protect_query(db, "admin", TURNOVER, into="s", rules=RULES)


def test_two_updates_publish_no_cell_that_changed_in_any_two_versions(jobs_state, tmp_path):
    db = jobs_state(_turnover_stored, tmp_path)
    versions = []
    versions.append(published(db, "s"))
    for region, turnover in (("R02", 1234567), ("R03", 2345678)):
        change(db, NEW_FIRM.format(nace="C", region=region, turnover=turnover))
        protect_query(db, "admin", TURNOVER, into="s", rules=RULES, replace=True)
        versions.append(published(db, "s"))
    for i in range(3):
        for j in range(i + 1, 3):
            assert changed_in_both(versions[i], versions[j]).empty, (i, j)
    # the cells no new firm entered stay published as they were
    assert versions[2].loc[("F", "Total")].equals(versions[0].loc[("F", "Total")])


def test_an_update_that_removes_a_unit_hides_the_cells_it_left(jobs_state, tmp_path):
    db = jobs_state(_turnover_stored, tmp_path)
    first = published(db, "s")
    gone = small_firm(db, "G", "R01")
    change(db, f"DELETE FROM enterprises WHERE enterprise_id = {gone}")
    protect_query(db, "admin", TURNOVER, into="s", rules=RULES, replace=True)
    second = published(db, "s")
    assert changed_in_both(first, second).empty
    for cell in [("G", "R01"), ("G", "Total"), ("Total", "R01"), ("Total", "Total")]:
        assert cell not in second.index  # each is the firm's turnover away from the first


def test_one_unit_added_to_a_cell_and_one_to_its_total(jobs_state, tmp_path):
    """One firm in (C, R02) and one in (F, R05): the grand total changed by two units, its
    row and column totals by one each; none of them is published in both versions."""
    db = jobs_state(_turnover_stored, tmp_path)
    first = published(db, "s")
    change(
        db,
        NEW_FIRM.format(nace="C", region="R02", turnover=1234567),
        NEW_FIRM.format(nace="F", region="R05", turnover=7654321),
    )
    protect_query(db, "admin", TURNOVER, into="s", rules=RULES, replace=True)
    assert changed_in_both(first, published(db, "s")).empty


def test_a_job_of_the_same_rows_under_another_name_after_new_data(jobs_state, tmp_path):
    """The versions a reader compares need not share a name: the units are kept per
    population."""
    db = jobs_state(_turnover_stored, tmp_path)
    change(db, NEW_FIRM.format(nace="C", region="R02", turnover=1234567))
    protect_query(db, "admin", TURNOVER, into="t", rules=RULES)
    assert changed_in_both(published(db, "s"), published(db, "t")).empty


def test_a_unit_count_that_changed_by_one_is_hidden_though_the_sum_changed_by_four(
    jobs_state, tmp_path
):
    """A new firm and three revised ones in (C, R02): the sum's difference has 4 units and
    passes the rules, but ``n`` differs by the one new firm (a count of 1)."""
    db = jobs_state(_turnover_stored, tmp_path)
    first = published(db, "s")
    change(
        db,
        NEW_FIRM.format(nace="C", region="R02", turnover=1000000),
        "UPDATE enterprises SET turnover = turnover + 1000000 WHERE enterprise_id IN ("
        "SELECT enterprise_id FROM enterprises WHERE nace = 'C' AND region = 'R02' "
        "ORDER BY enterprise_id LIMIT 3)",
    )
    protect_query(db, "admin", TURNOVER, into="s", rules=RULES, replace=True)
    assert changed_in_both(first, published(db, "s")).empty


def test_the_same_data_again_publishes_the_same_table(jobs_state, tmp_path):
    db = jobs_state(_turnover_stored, tmp_path)
    first = published(db, "s")
    protect_query(db, "admin", TURNOVER, into="s", rules=RULES, replace=True)
    pd.testing.assert_frame_equal(first, published(db, "s"))


@pytest.mark.parametrize("n_new", [3])
def test_enough_new_units_publish_the_changed_cells(jobs_state, tmp_path, n_new):
    """Three new firms of similar turnover in (C, R02) pass the rules as a difference: the
    job does not hide every cell that changed (an update of enough units is published)."""
    db = jobs_state(_turnover_stored, tmp_path)
    first = published(db, "s")
    change(db, *(NEW_FIRM.format(nace="C", region="R02", turnover=1000000 + i)
                 for i in range(n_new)))  # fmt: skip
    protect_query(db, "admin", TURNOVER, into="s", rules=RULES, replace=True)
    moved = changed_in_both(first, published(db, "s"))
    assert ("Total", "Total") in moved.index
    assert (moved.n_2 - moved.n_1 == n_new).all()


def test_a_new_person_in_a_hierarchy_hides_its_municipality_region_and_totals(jobs_demo_db):
    """A count by region > municipality x education (``freq`` of the policy): one person aged
    85 more; the cells of her municipality, region and the totals that changed by her are
    hidden, the hierarchy's subtotals included."""
    db = jobs_demo_db
    sql = (
        "SELECT region, municipality, education, COUNT(*) FROM persons WHERE age >= 80 "
        "GROUP BY region, municipality, education"
    )

    def cells() -> pd.DataFrame:
        con = duckdb.connect(str(db), read_only=True)
        try:
            frame = con.sql("SELECT geography, education, status, n FROM protected.g").df()
        finally:
            con.close()
        return frame[frame.status == "published"].set_index(["geography", "education"])

    protect_query(db, "admin", sql, into="g")
    first = cells()
    change(
        db,
        "INSERT INTO persons SELECT (SELECT max(person_id) + 1 FROM persons), "
        "* EXCLUDE (person_id) REPLACE (85 AS age) "
        "FROM (SELECT * FROM persons WHERE age >= 80 ORDER BY person_id LIMIT 1)",
    )
    protect_query(db, "admin", sql, into="g", replace=True)
    both = first.join(cells(), how="inner", suffixes=("_1", "_2"))
    assert (both.n_1 == both.n_2).all()
    assert len(both) > 100  # the cells she did not change stay published


def test_an_output_stored_before_units_were_kept_hides_every_cell_that_changed(
    jobs_state, tmp_path
):
    """A catalog that kept no units of the earlier version (stored before ``job_units``):
    the difference population is unknown, so every cell it published that changed is hidden."""
    db = jobs_state(_turnover_stored, tmp_path)
    first = published(db, "s")
    change(
        db,
        "DROP TABLE IF EXISTS sqlsdc.job_units",
        NEW_FIRM.format(nace="C", region="R02", turnover=1234567),
    )
    protect_query(db, "admin", TURNOVER, into="s", rules=RULES, replace=True)
    second = published(db, "s")
    assert changed_in_both(first, second).empty
    assert len(first.index.intersection(second.index)) > 20  # the unchanged cells stay
