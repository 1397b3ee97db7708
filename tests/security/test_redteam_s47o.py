"""Red team s47o: today's job changes (CTA secret order, reader intervals, cart's smoothing of
measures, alpha=0 local suppression).

Finding 1 (cart smoothing, s47m): ``measure_columns`` looked at numeric columns only, so a
measure selected as text (``CAST(income AS VARCHAR)``), or made a date or an interval, was
neither smoothed nor warned about: cart drew it as a category, every synthetic value an original
income. R01 of the 20,000-person demo, sex/age/education/occupation + income as text, 1,500
rows, seed 3: 217 persons unique by the four keys whose key shows one synthetic income, 21 of
them see their own non-zero income to the cent; no warning, no ``unsmoothed_measures``."""

from __future__ import annotations

import duckdb
import pytest

from sqlsdc.errors import SynthesisError
from sqlsdc.synth import synthesize

R01 = "FROM persons WHERE region = 'R01'"


def _read(db, sql):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.sql(sql).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize(
    "expression",
    [
        "CAST(income AS VARCHAR) AS income",
        "education || ':' || CAST(income AS VARCHAR) AS education",
        "DATE '2000-01-01' + CAST(income AS INTEGER) AS paid",
        "to_days(CAST(income AS INTEGER)) AS paid",
    ],
)
def test_a_measure_that_is_not_a_number_is_refused_not_stored_as_originals(
    fresh_demo_db, expression
):
    """On int47 the job stored the file (every synthetic income an original one, no warning);
    now it refuses, audits the refusal and stores nothing."""
    sql = f"SELECT sex, age, occupation, {expression} {R01}"
    with pytest.raises(SynthesisError, match="not a number.*original one"):
        synthesize(fresh_demo_db, user="admin", into="syn", method="cart", sql=sql, rows=300,
                   seed=3)  # fmt: skip
    assert _read(fresh_demo_db, "SELECT count(*) FROM information_schema.tables WHERE "
                                "table_name = 'syn'") == [(0,)]  # fmt: skip
    ((decision,),) = _read(fresh_demo_db, "SELECT decision FROM sqlsdc.audit ORDER BY query_id "
                                          "DESC LIMIT 1")  # fmt: skip
    assert decision == "refused"


def test_text_dimensions_and_a_cast_back_to_a_number_are_still_synthesised(fresh_demo_db):
    """The refusal is for text made of a measure only: text dimensions pass, and a measure cast
    to text and back to a number is traced and smoothed."""
    sql = f"SELECT sex, education, CAST(CAST(income AS VARCHAR) AS DOUBLE) AS pay {R01}"
    report = synthesize(fresh_demo_db, user="admin", into="syn", method="cart", sql=sql,
                        rows=300, seed=3)  # fmt: skip
    assert report.details["smoothing"] == ["pay"]
