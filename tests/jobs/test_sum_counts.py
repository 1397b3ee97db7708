"""A sum job's unit counts ``n`` are audited with its sums also when cells published before
(an earlier output of the same rows, the live pattern's grand total) are exempt from its rules
(:func:`sqlsdc.jobs.sum_counts.audit_counts`, :func:`sqlsdc.tabular.universe_pattern
.exempt_known`).

Red team s42i: :func:`~sqlsdc.jobs.protect.protect_query` wraps its rules when a cell is
public, and the counts' audit picked the ``FrequencyRule`` instances among them, which the
wrapped rules are not: the counts went unaudited. The table below is the smallest such case: a
2 x 2 block of single enterprises (their turnovers small, the rest large), which the sums'
pattern hides alone; the published row and column totals of ``n`` then pin each of the four
counts at exactly 1.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest

from sqlsdc.jobs.protect import protect_query
from sqlsdc.jobs.sum_counts import audit_counts, count_table, known_lower
from sqlsdc.tabular.attacker import audit_intervals
from sqlsdc.tabular.model import TOTAL, Table
from sqlsdc.tabular.rules import FrequencyRule
from sqlsdc.tabular.universe_pattern import exempt_known, kind_of, suppression_pattern

BLOCK = [("a", "x"), ("a", "y"), ("b", "x"), ("b", "y")]  # one enterprise each


def _table() -> Table:
    rows = [(r, c) for r in "abc" for c in "xyz"]
    value = {("a", "x"): 500.0, ("a", "y"): 400.0, ("b", "x"): 450.0, ("b", "y"): 550.0}
    return Table.from_cells(
        pd.DataFrame({
            "r": [r for r, _c in rows],
            "c": [c for _r, c in rows],
            "value": [value.get(cell, 8e5) for cell in rows],
            "n": [1 if cell in BLOCK else 30 for cell in rows],
        }),
        ["r", "c"],
    )  # fmt: skip


def _job_pattern(table: Table, known: np.ndarray | None) -> np.ndarray:
    """The hidden cells of a sum job's pattern as :func:`sqlsdc.jobs.protect.protect_query`
    builds it: ``known`` cells (public) exempt from the rules and forced published."""
    rules: list = [FrequencyRule(3)]
    if known is not None:
        rules = exempt_known(rules, known)

    def pattern(counted=()):
        return suppression_pattern(table, [*rules, *counted], method="optimal", time_limit=10,
                                   forced=known)  # fmt: skip

    result = audit_counts(table, rules, pattern(), pattern, method="optimal", time_limit=10,
                          forced=known)  # fmt: skip
    return (result["status"] != "published").to_numpy()


@pytest.mark.parametrize("public", [False, True], ids=["nothing-public", "grand-total-public"])
def test_the_counts_of_a_sum_job_keep_their_safety_range_when_a_cell_is_public(public):
    """Fails before the fix with ``grand-total-public``: the four counts of 1 in [1, 1]."""
    table = _table()
    total = (table.cells[["r", "c"]] == TOTAL).all(axis=1).to_numpy()
    hidden = _job_pattern(table, total if public else None)
    counts = count_table(table)
    found = audit_intervals(counts.A, counts.values, hidden, lower=known_lower(counts)[0],
                            upper=np.full(len(hidden), np.inf), integer=True,
                            time_limit=10)  # fmt: skip
    cells = list(map(tuple, table.cells[["r", "c"]].to_numpy()))
    block = np.array([cell in BLOCK for cell in cells])
    assert hidden[block].all()
    assert (found.hi[block] >= 1.3).all(), found.hi[block]  # freq's 30 % above a count of 1
    assert not hidden[total].any()  # the public total stays published


def test_kind_of_reads_through_the_exemption():
    rule = FrequencyRule(3)
    (wrapped,) = exempt_known([rule], np.zeros(1, dtype=bool))
    assert not isinstance(wrapped, FrequencyRule)
    assert kind_of(wrapped) is rule and kind_of(rule) is rule


# ------------------------- a cell published again with its sum, its count changed (red team s42i)

JOINED = [("M", "R02"), ("M", "Total"), ("Total", "R02"), ("Total", "Total")]  # her cells


def _two_versions(db, turnover: int, *before: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What a reader holds of TURNOVER by nace x region (``s``) before and after one enterprise
    of ``turnover`` joins (M, R02) (after the statements ``before``), as published cells."""
    from tests.jobs.test_revisions import NEW_FIRM, RULES, TURNOVER, change, published

    protect_query(db, "admin", TURNOVER, into="s", rules=RULES)
    first = published(db, "s")
    change(db, *before, NEW_FIRM.format(nace="M", region="R02", turnover=turnover))
    protect_query(db, "admin", TURNOVER, into="s", rules=RULES, replace=True)
    return first, published(db, "s")


def _n_told(first: pd.DataFrame, second: pd.DataFrame) -> pd.DataFrame:
    """The cells both versions publish, the n published in both differing nowhere."""
    both = first.join(second, how="inner", suffixes=("", "_2"))
    told = both.n.notna() & both.n_2.notna()
    assert (both.n[told] == both.n_2[told]).all(), both[told & (both.n != both.n_2)]
    return both


def test_a_unit_of_no_turnover_that_joins_a_published_cell_is_not_told(jobs_demo_db):
    """Fails before the fix: one enterprise of turnover 0 more in (M, R02), and (M, R02),
    (M, Total), (Total, R02) and the grand total were published in both versions with the same
    sums and n + 1 (14 -> 15, ...). Their sums are public (published before, unchanged) and
    stay published; their n, which the revision rule on n flags, is hidden."""
    from tests.jobs.test_revisions import RULES, TURNOVER, published

    first, second = _two_versions(jobs_demo_db, 0)
    both = _n_told(first, second)
    assert both.loc[JOINED, "n_2"].isna().all()  # the n of the four cells she joined: hidden
    assert (both.loc[JOINED, "value"] == both.loc[JOINED, "value_2"]).all()  # sums: as before
    assert (both.n.notna() & both.n_2.notna()).sum() > 20  # the other cells keep their n
    protect_query(jobs_demo_db, "admin", TURNOVER, into="s", rules=RULES, replace=True)
    third = published(jobs_demo_db, "s")  # the first version is kept: still revised
    assert third.loc[JOINED, "n"].isna().all() and third.n.notna().sum() == second.n.notna().sum()


def test_a_count_revised_in_a_catalog_that_kept_no_units_is_hidden(jobs_demo_db):
    """Without kept units (an output stored before ``sqlsdc.job_units``) a changed ``n``
    beside an unchanged sum is hidden too, whatever the units that changed (fail closed)."""
    first, second = _two_versions(jobs_demo_db, 0, "DROP TABLE IF EXISTS sqlsdc.job_units")
    both = _n_told(first, second)
    assert both.n_2.isna().sum() == 4 and (both.value == both.value_2).all()


def test_a_unit_of_some_turnover_that_joins_a_published_cell_hides_the_cells(jobs_demo_db):
    """The same enterprise with a turnover: the four sums changed by it, so they are no known
    cells and the revision rule hides them whole (s42f), n and sum."""
    first, second = _two_versions(jobs_demo_db, 1234567)
    for cell in JOINED:
        assert cell in first.index and cell not in second.index
    both = _n_told(first, second)
    assert (both.value == both.value_2).all() and second.n.notna().all()  # no n hidden alone


def test_a_count_hidden_beside_its_known_sum_stays_hidden(jobs_demo_db):
    """Fails without the count job's reading of a NULL ``n``: after the job above, a count job
    of the same rows published (M, R02)'s 15 enterprises (and the totals), against the 14 the
    sum job's first version published. The sum job's ledger records those four ``n``
    suppressed and their sums published."""
    from tests.jobs.test_revisions import published

    _two_versions(jobs_demo_db, 0)
    counts = "SELECT nace, region, COUNT(*) FROM enterprises GROUP BY nace, region"
    protect_query(jobs_demo_db, "admin", counts, into="c", rules=[FrequencyRule(3)])
    shown = published(jobs_demo_db, "c")
    assert not shown.index.isin(JOINED).any(), shown[shown.index.isin(JOINED)]
    with duckdb.connect(str(jobs_demo_db), read_only=True) as con:
        rows = con.execute(
            "SELECT column_name, status, count(*) FROM sqlsdc.ledger WHERE query_id = ("
            "SELECT query_id FROM sqlsdc.outputs WHERE name = 'protected.s') GROUP BY ALL"
        ).fetchall()
    found = {(column, status): count for column, status, count in rows}
    assert found[("n", "suppressed")] == found[("value", "suppressed")] + 4, found
