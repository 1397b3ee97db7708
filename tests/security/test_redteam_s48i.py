"""Red team s48i: one cell through several channels: a live guarded query (the cell key method
of the demo policy), a back-end job's table (rounding, suppression, CTA) and the release
database, read together by an analyst who also reads every published output.

Found and fixed (``jobs/adjust._small_counts``; the test fails on main):

- **A cell missing from a count rounding to base 3, shown by the analyst's live query, is a
  1.** A rounding leaves out the cells it rounds to 0 "so that a reader cannot tell them from
  empty ones", and red team s42c allowed base 3 on the reasoning that such a cell holds 1 or 2.
  But Salazar's model minimises the distance, so a count goes to its nearest multiple wherever
  the margins allow: every 2 went to 3 and every 1 but one in 50 to 0. The live query of the
  same cells shows which are not empty (the threshold rule as suppressed rows, every one; the
  cell key method, js = 2, as 3 to 7 for a third of the 1s and most 2s): everyone aged 85+ by
  municipality x sex to base 3, one job and one live query, proved 65 cells of one person and
  no 2 on the tests' threshold demo (jobs' secret), 49 (all 1s) on the demo of seed 20260101
  under the threshold rule and 9 (all 1s) under its cell key method (16 on the tests' CKM
  demo). At base 5, 81 cells proved under 5 there (50 of 1, 31 of 2). Now a count table's
  cells below the base are drawn first by the unbiased random rule (Cox & Kim 2006 rule 4:
  up with probability n/B), keyed by the database's secret, the job and the cell's identity
  and count, and the controlled rounding holds them: a missing cell shown live is a 1 with
  probability about 2/3 against a 2 (46 of 1 and 13 of 2 on the tests' demo). The cost: the
  margins may leave their adjacent multiples (8 relaxed there, ``near_feasible``).

Held (one line each; statements or jobs tried, scored against the raw data):

- a job's SQL naming the stored table by its catalog (``j1.enterprises``,
  ``j1.main.enterprises``), which DuckDB resolves past the temporary view that gives jobs the
  class of x·m of ``size_class``: protect (2), anonymize (2), synthesize (1): all refused
  before reading ("reads enterprises and public tables only", "may read the policy's tables
  only").
- one population under a job's and another job's spellings: a rounding of enterprises by nace
  x region ``WHERE size_class = 'micro'`` (the class of x·m), then suppression jobs of the same
  counts written ``employees < 10``, ``employees < 10.5`` and ``NOT (size_class IN ('small',
  'medium', 'large'))``: all three refused as the same cells protected a second way.
- the anonymised file's exact weights (the README's ``seniors_r01`` keeps ``weight``; 18,177
  distinct values among 20,000 persons) as a key into live queries: ``weight = w`` and a
  ``BETWEEN`` of width 0.002 are refused (class breaks only), so no live cell is one record.
- a suppression job of incomes (R01 aged 85+ by municipality x sex, ``freq:5``, ``p:10``: 19
  primaries, 4 secondaries) publishing each cell's ``n`` and listing every non-empty cell,
  beside the live CKM counts of the same non-zero incomes (one query): the joint support of
  the ptable's rows, the listing (n >= 1), the primaries' n < 5 and the published totals left
  0 of the 15 hidden inner cells exact.
- CTA and IPF of counts whose rules flag a cell: refused ("a known function of the count").
- the release database against the live channel: ``publish --query`` of a CKM count and sum
  by municipality x sex (198 rows) and a respelling (``85 <= age``, columns swapped, live
  ``BETWEEN 85 AND 200``): every cell the same as the analyst's live answer, 0 of 198 apart.
  A DP count of benefits published ``--for analyst`` charged the analyst 0.1 (50 and 10
  budgets both); the same query live was answered with the release's noise for nothing, and a
  respelling over the same rows (``month >= 1``) with new noise, charged 0.1 again.

Noted for the lead (not an analyst's attack): a job's ``--rule freq:1`` is taken as given,
so a suppression or IPF job of a count table publishes its cells of 1 exactly next to a
policy whose minimum frequency is 10 (R01 aged 85+ by municipality x sex: 17 cells of 1-2).
"""

from __future__ import annotations

import duckdb

import sqlsdc
from sqlsdc.jobs.adjust import round_query

OLD_COUNTS = (
    "SELECT municipality, sex, COUNT(*) FROM persons WHERE age >= 85 GROUP BY municipality, sex"
)


def _rounded_and_live(db) -> tuple[set, set, dict]:
    """The inner cells ``protected.rounded`` publishes, those the analyst's live query of the
    same cells shows, and every cell's true count (the score)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        rounded = {
            (m, s)
            for m, s, _v in con.sql(
                "SELECT municipality, sex, value FROM protected.rounded "
                "WHERE municipality <> 'Total' AND sex <> 'Total'"
            ).fetchall()
        }
        truth = {(m, s): n for m, s, n in con.sql(OLD_COUNTS).fetchall()}
    finally:
        con.close()
    with sqlsdc.connect(db, user="analyst") as analyst:
        shown = {(m, s) for m, s, v in analyst.execute(OLD_COUNTS).fetchall() if v != 0}
    return rounded, shown, truth


def _proved(db) -> list[int]:
    """The true counts of the cells a reader proves small: missing from the rounding (rounded
    to 0) and shown by the analyst's live query (the threshold rule shows a cell under the
    minimum frequency as NULL, the cell key method a cell of 1 or 2 as 0 or 3 to 7)."""
    rounded, shown, truth = _rounded_and_live(db)
    proved = [truth[cell] for cell in sorted(shown - rounded)]
    assert all(n in (1, 2) for n in proved), "a proved cell is not 1 or 2: the score is off"
    return proved


def test_a_cell_missing_from_a_rounding_to_base_3_is_not_read_as_a_one(jobs_demo_db):
    """The demo under the threshold rule, the jobs' fixed secret: before the fix every missing
    cell the live query shows was a 1 (65 of 65, no 2); the small counts drawn by the unbiased
    rule leave both among them, the 1s 46 of 59 (the expected share 2·70 / (2·70 + 35))."""
    round_query(jobs_demo_db, "admin", OLD_COUNTS, into="rounded", base=3)
    proved = _proved(jobs_demo_db)
    ones, twos = proved.count(1), proved.count(2)
    assert ones + twos >= 30, f"too few small cells to score: {proved}"
    assert twos >= 0.15 * (ones + twos), f"a missing cell is a 1: {ones} ones, {twos} twos"
    assert ones >= 0.4 * (ones + twos), f"a missing cell is a 2: {ones} ones, {twos} twos"
