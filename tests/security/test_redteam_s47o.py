"""Red team s47o: today's job changes (CTA secret order, reader intervals, cart's smoothing of
measures, alpha=0 local suppression).

Finding 1 (cart smoothing, s47m): ``measure_columns`` looked at numeric columns only, so a
measure selected as text (``CAST(income AS VARCHAR)``), or made a date or an interval, was
neither smoothed nor warned about: cart drew it as a category, every synthetic value an original
income. R01 of the 20,000-person demo, sex/age/education/occupation + income as text, 1,500
rows, seed 3: 217 persons unique by the four keys whose key shows one synthetic income, 21 of
them see their own non-zero income to the cent; no warning, no ``unsmoothed_measures``. Now
refused when some value of such a column is shown by fewer than 3 records (bands pass).

Finding 2 (risk keys, s47i): below.

Held (one line each):
- measure lineage (``measure_columns``): 24 shapes of ``--sql`` (CTE, subquery, CASE, ratio,
  scalar subquery, LATERAL, UNNEST, struct/list element, hash, UNION, DECIMAL, quoted
  capitals, ``main.persons``, cast to text and back, ``SELECT * EXCLUDE``) all traced to
  income and smoothed; a self-join is refused by the records check; ``weight`` (role weight)
  is not smoothed by design;
- two CTA jobs of the same cells under other names (8 one-firm tables): the second is
  refused ("already releases these cells"); ``--replace`` with freq:4, with ``mdi``, with a
  respelled WHERE: every lone cell kept its replaced version's side (8 of 8, 3 each);
- ``reader_intervals`` against my own LP (scipy, published sums and ``n``, listed inner cells
  >= 1, ``lo n <= s <= hi n``), bounds [100, 1000], 4 random 3 x 3 tables, 25 hidden cells:
  never tighter than the reader's; looser by ``lo`` per listed unit on both sides (the LP
  drops ``s >= lo n`` for ``lo > 0``: a unit without a value adds 0; a reader knowing there
  are none gets 100 more each side, nothing the job adds);
- two k = 3 suppress-only files of every person (sex, age band, education / occupation),
  linkable by their exact ``weight`` (18,177 distinct of 20,000; 16,454 linked one to one):
  listing both under ``releases:`` is refused (blanked cells);
- refusals of jobs reach the admin only: ``sqlsdc audit``/``outputs``/``microdata-report`` as
  analyst denied; ``sqlsdc.audit``, ``audit``, ``duckdb_tables()`` and a stored file as an
  analyst query refused.
Open (both closed in s48c, tests/security/test_redteam_s48c.py): two files released that do
not blank but link by an exact column: sex, age (bands
30/65), education, weight and sex, age, occupation, weight of every person, both under
``releases:`` (accepted): 16,455 persons linked one to one by weight, 8 of them unique by
sex, age band, education and occupation, a key neither file's report measured (its own: 0
and 1 below k = 2); no sensitive column in them, so identity only; ``special_values`` of a
measure (admin-given) are drawn exactly, unsmoothed, without
the warning; ``_linked`` picks the LP or the box by the true data (one bit per table: some
cell's sum passes ``hi n``)."""

from __future__ import annotations

import pytest

from sqlsdc.errors import MicrodataError, SynthesisError
from sqlsdc.synth import synthesize
from tests.synth.test_job_smoothing import _read

R01 = "FROM persons WHERE region = 'R01'"


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


def test_text_dimensions_bands_and_a_cast_back_to_a_number_are_synthesised(fresh_demo_db):
    """The refusal is for exact magnitudes as text only: text dimensions and a band of the
    measure (every value shared by 3+ records) pass, and a measure cast to text and back to a
    number is traced and smoothed."""
    band = "CASE WHEN income > 30000 THEN 'high' ELSE 'low' END AS band"
    sql = (f"SELECT sex, education, {band}, CAST(CAST(income AS VARCHAR) AS DOUBLE) AS pay "
           f"{R01}")  # fmt: skip
    report = synthesize(fresh_demo_db, user="admin", into="syn", method="cart", sql=sql,
                        rows=300, seed=3)  # fmt: skip
    assert report.details["smoothing"] == ["pay"]


RENAMED = "SELECT municipality AS place, region, sex, age, education FROM persons"


def test_a_finer_level_renamed_in_the_query_still_needs_its_key(fresh_demo_db):
    """Finding 2 (risk keys, s47i): ``refuse_coarse_keys`` compared column names, so
    ``--sql "SELECT municipality AS place, region, ..."`` with keys region, sex, age, education
    (k = 3) was stored with "records with fk < 3: 0" (1,460 of the demo's 20,000 persons unique
    by place, sex, age band and education) while the file showed every person's
    municipality as ``place`` (accepted on int47). Now each column is traced to its source
    column: the renamed municipality is refused as the plain one is, and naming ``place``
    among the keys passes."""
    from sqlsdc.jobs.anonymize import anonymize

    keys = ["region", "sex", "age", "education"]
    steps = ["recode:age:breaks=15/30/45/65/85", f"suppress:{','.join(keys)}:k=3"]
    with pytest.raises(MicrodataError, match="shows place, a finer level of it"):
        anonymize(fresh_demo_db, user="admin", sql=RENAMED, into="renamed", steps=steps,
                  keys=keys, seed=1)  # fmt: skip
    assert _read(fresh_demo_db, "SELECT count(*) FROM information_schema.tables WHERE "
                                "table_name = 'renamed'") == [(0,)]  # fmt: skip
    fine = ["place", "sex", "age", "education"]
    report = anonymize(fresh_demo_db, user="admin", sql=RENAMED, into="fine",
                       steps=[steps[0], f"suppress:{','.join(fine)}:k=3"], keys=fine,
                       seed=1)  # fmt: skip
    assert report.after["violations"]["3"] == 0
