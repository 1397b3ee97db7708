"""Red team s43l: revisions of rounding, CTA and IPF jobs whose earlier version kept no units.

:mod:`sqlsdc.jobs.adjusted_revisions` (s43d) refuses a rounding, CTA or IPF stored again after
a few units changed, by the units each version kept in ``sqlsdc.job_units``. A version stored
before those were kept (every rounding, CTA and IPF output of a catalog from before session 43)
was not compared at all: its first replacement after new data was stored and published the
changed units' contribution, as before s43d.
"""

from __future__ import annotations

import duckdb
import pandas as pd
import pytest

from sqlsdc.errors import TabularError
from sqlsdc.jobs.adjust import cta_query, round_query
from tests.security.test_redteam_s43d import NEW_FIRM, OLD80, RULES, TURNOVER, change

NEW_FIRM_1234567 = NEW_FIRM.format(turnover=1234567)


def _stored(db, name: str, dims) -> pd.Series:
    con = duckdb.connect(str(db), read_only=True)
    try:
        frame = con.sql(f"SELECT {', '.join(dims)}, value FROM protected.{name}").df()
    finally:
        con.close()
    return frame.set_index(list(dims))["value"]


FORGET_UNITS = "DELETE FROM sqlsdc.job_units"  # as a catalog from before s43d kept none


def _turnover_cta(db) -> None:
    """The CTA of turnover by nace and region, stored as ``t``."""
    cta_query(db, "admin", TURNOVER, into="t", rules=RULES)


def test_a_cta_stored_before_units_were_kept_is_not_replaced_after_one_new_firm(
    jobs_state, tmp_path
):
    """Before: the CTA replaced after one new firm was stored, and (C, R02) and R02's total
    moved by exactly its turnover, 1,234,567 (s43d's attack, on an older catalog)."""
    db = jobs_state(_turnover_cta, tmp_path)
    first = _stored(db, "t", ("nace", "region"))
    change(db, FORGET_UNITS)
    change(db, NEW_FIRM_1234567)
    with pytest.raises(TabularError, match=r"kept no units"):
        cta_query(db, "admin", TURNOVER, into="t", rules=RULES, replace=True)
    difference = _stored(db, "t", ("nace", "region")).sub(first, fill_value=0.0).abs()
    assert not ((difference - 1234567).abs() < 1.0).any()


def test_a_cta_stored_before_units_were_kept_is_stored_again_on_the_same_data(jobs_state, tmp_path):
    """The same data gives the same table: nothing new to readers, stored. The version that
    kept no units stays with its readers, so new data after it is still refused."""
    db = jobs_state(_turnover_cta, tmp_path)
    first = _stored(db, "t", ("nace", "region"))
    change(db, FORGET_UNITS)
    cta_query(db, "admin", TURNOVER, into="t", rules=RULES, replace=True)
    pd.testing.assert_series_equal(_stored(db, "t", ("nace", "region")), first)
    change(db, NEW_FIRM_1234567)
    with pytest.raises(TabularError, match=r"job \d+ stored it kept no units"):
        cta_query(db, "admin", TURNOVER, into="t", rules=RULES, replace=True)


def test_a_rounding_stored_before_units_were_kept_does_not_tell_who_turned_80(jobs_demo_db):
    """Before: one person of R03 turning 80, the rounding to base 5 replaced moved exactly the
    cells of their region and education (R03's total 570 -> 575)."""
    db, dims = jobs_demo_db, ("region", "education")
    round_query(db, "admin", OLD80, into="r", base=5)
    first = _stored(db, "r", dims)
    moved = 0
    for region in ["R01", "R02", "R03"]:
        change(db, FORGET_UNITS)
        change(db, "UPDATE persons SET age = 80 WHERE person_id = (SELECT min(person_id) FROM "
                   f"persons WHERE age = 79 AND region = '{region}')")  # fmt: skip
        try:
            round_query(db, "admin", OLD80, into="r", base=5, replace=True)
        except TabularError as refusal:
            assert "kept no units" in str(refusal) or "fewer units" in str(refusal)
        now = _stored(db, "r", dims)
        moved += int((now.sub(first, fill_value=0) != 0).sum())
    assert moved == 0


@pytest.mark.parametrize(
    "where",
    [
        "WHERE nace <> 'Ü'",  # a literal that is not printable ASCII
        'WHERE "nace" IS NOT NULL',  # a quoted column: '"' in the population's text
    ],
)
def test_a_dropped_suppression_of_a_population_not_written_in_plain_text_is_still_kept(
    pristine_demo_db, tmp_path, copy_database, where
):
    """s43c's forgotten pattern with the first job's population spelled so that its ledger
    identity is no plain JSON text (replaced_suppressions._ledger_status gave None and the
    version was skipped). Before: the second pattern published cells the first hid, and the
    two pinned counts of 1 (as s43c's attack without the fix)."""
    from sqlsdc.jobs.protect import protect_query
    from sqlsdc.tabular.rules import FrequencyRule
    from tests.security.test_redteam_s32b import NACE_REGION, _job, assert_two_patterns_protect

    db = copy_database(pristine_demo_db, tmp_path)
    rules = [FrequencyRule(3)]
    first_sql = NACE_REGION.replace(" GROUP BY", f" {where} GROUP BY")
    protect_query(db, "admin", first_sql, into="by_gauss", rules=rules, time_limit=10)
    first = _job(db, "by_gauss")
    con = duckdb.connect(str(db))
    con.execute("DROP TABLE protected.by_gauss")
    con.close()
    protect_query(db, "admin", NACE_REGION, into="by_hitas", method="hitas", rules=rules,
                  time_limit=10)  # fmt: skip
    assert_two_patterns_protect(db, first, _job(db, "by_hitas"))


def test_a_synthesis_of_one_hidden_cell_does_not_tell_its_count(
    suppress_template, tmp_path, copy_database
):
    """Before: a cart synthesis drew as many records as its source, and ``WHERE municipality =
    m``, one job per municipality, told all 23 municipality counts the live pattern hides (1-9
    persons) by its size (here the first 3). Now refused without --rows; with it, stored."""
    import sqlsdc
    from sqlsdc.synth import synthesize

    db = copy_database(suppress_template, tmp_path)
    with sqlsdc.connect(db, user="analyst") as con:
        live = con.execute("SELECT municipality, COUNT(*) FROM persons GROUP BY municipality")
        hidden = sorted(m for m, n in live.fetchall() if n is None)[:3]
    told = 0
    for i, place in enumerate(hidden):
        sql = f"SELECT sex FROM persons WHERE municipality = '{place}'"
        with pytest.raises(sqlsdc.Error, match=r"--rows N"):
            synthesize(db, user="admin", into=f"syn{i}", method="cart", seed=7, sql=sql)
        synthesize(db, user="admin", into=f"syn{i}", method="cart", seed=7, sql=sql, rows=1)
        raw = duckdb.connect(str(db), read_only=True)
        try:
            size = raw.execute(f"SELECT count(*) FROM protected.syn{i}").fetchone()[0]
            (true,) = raw.execute(f"SELECT count(*) FROM ({sql})").fetchone()
        finally:
            raw.close()
        told += size == true
    assert told == 0
