"""Red team s39d: session 39's last merges (the frequency rule of a magnitude counts non-zero
contributors; negligible perturbation; cart drawing with replacement by default) attacked with
an analyst's guarded connection (threshold and rounding demos of 20,000 persons, target: the
one person aged 94 of R05-M021) and as an admin running jobs on the suppression demo.

Every attack tried, one line each (W: worked, test below; H: held; O: observation, no test):

Frequency rule of SUM/AVG (``rewrite/cells.frequency_count``), threshold and round demos
- H  ``SUM(income + 0.000001) WHERE target OR income = 0`` (1,877 zeros made non-zero and
     negligible): NULL under both (the p%-rule: T − x1 − x2 is 1.9e-3, far below 10 % of x1).
- H  ``SUM(income + 0.0)``, ``AVG(income)`` padded with zeros: NULL.
- H  ``CASE WHEN income = 0 THEN 0.000001 / -0.0 / 'NaN' ELSE income END``, ``CASE WHEN age
     = 94 THEN income ELSE 1000 END`` (known padding), ``... ELSE 0 END``, ±1e6 alternating
     padding, ``ROUND(income / 1e9)``, ``GREATEST(income, 1e-6)``, ``COALESCE(NULLIF(income,
     0), 1e-9)``: refused before the rule (not a linear sum of columns);
     ``income * (age = 94)::INT`` refused (a cast that could fail).
- O  COUNT(*) of a cell published where its SUM is suppressed tells that fewer than k of its
     units have a non-zero value; before the change the exact sum 0 told that all were zero.
Negligible perturbation (``microdata/negligible.py``), suppression demo
- H  PRAM moving records out of one category only: the step's matrix is nE(p), every category
     changed at rate 1 − p (invariant: small categories more), no per-category matrix exists.
- H  several weak steps in sequence: each judged alone, a weak one leaves its column exact
     (the safe side); a step after a strong one does not undo it.
- O  swap with partners sharing the municipality (``swap:<household constant>,municipality:
     similar=municipality``) would count municipality as perturbed while unchanged, but no
     household-constant column other than the geography reaches the step (identifiers and
     expressions of them, ``sum(age) OVER (PARTITION BY household_id)`` too, are dropped);
     ``household_id`` as a geography column crashes with a pandas ``ValueError`` (not a
     MicrodataError; no release).
Syntheses (``synth/cart.py``, ``jobs/synthesis_files.py``)
- H  ``draw="BALANCED"``/other spellings: cart accepts exactly the three names, the check the
     same string.
- W  cart drawn with replacement (the default, no check) of ``SELECT municipality, sex FROM
     persons`` with ``rows=2,000,000`` (100 times the source): the first variable's counts are
     100·c ± 10·sqrt(c), so ``round(count / 100)`` gave all 34 municipality totals under 10
     persons exactly, the 23 the suppression pattern hides among them (2 s CPU). ``copies``
     does the same (the copies' mean); ``parametric`` likewise (33 of 34 at 2,000,000 rows,
     run in-process). Fixed: a non-DP synthesis of more records in all than
     its source is checked as an exact file (``synthesis_files.exact_synthesis``), refused
     beside the pattern; the other order (stored, then suppression applied) refused too.
"""

from __future__ import annotations

import duckdb
import pytest
from db_reads import protected_tables

from sqlsdc.errors import SynthesisError


def _small_municipalities(db) -> dict[str, int]:
    raw = duckdb.connect(str(db), read_only=True)
    try:
        return dict(raw.execute(
            "SELECT municipality, count(*) FROM persons GROUP BY 1 HAVING count(*) < 10"
        ).fetchall())  # fmt: skip
    finally:
        raw.close()


@pytest.mark.parametrize(("rows", "copies"), [(2_000_000, 1), (None, 2)])
def test_a_large_synthesis_drawn_with_replacement_does_not_tell_the_hidden_totals(
    suppress_template, tmp_path, copy_database, rows, copies
):
    """cart (default draws, with replacement) of municipality and sex, 100 times the source's
    rows: each municipality's synthetic count over 100 was its true count for all 34 under 10
    persons (the 23 hidden by ``suppressed_persons`` among them); copies average alike. A
    non-DP synthesis of more records than its source is now checked as an exact file
    (``jobs/synthesis_files.exact_synthesis``): refused beside the pattern, nothing stored."""
    from sqlsdc.synth import synthesize

    db = copy_database(suppress_template, tmp_path)
    small = _small_municipalities(db)
    with pytest.raises(SynthesisError, match="holds the same units as a cell of that pattern"):
        synthesize(db, user="admin", into="syn", method="cart", seed=7, rows=rows, copies=copies,
                   sql="SELECT municipality, sex FROM persons")  # fmt: skip
    assert len(small) >= 20
    assert protected_tables(db) == []


def test_a_synthesis_the_size_of_its_source_is_stored_beside_the_pattern(
    suppress_template, tmp_path, copy_database
):
    """The same synthesis with as many records as its source (the default) carries the draws'
    noise and is stored, as before; so is a DP one of many rows (its counts converge to noisy
    margins)."""
    from sqlsdc.synth import synthesize

    db = copy_database(suppress_template, tmp_path)
    report = synthesize(db, user="admin", into="syn", method="cart", seed=7,
                        sql="SELECT municipality, sex FROM persons")  # fmt: skip
    assert report.details["exact_columns"] == []


def test_a_large_synthesis_then_suppression_switched_on(jobs_demo_db):
    """The other order: the large synthesis stored under the threshold policy (no pattern
    yet; its report lists every column as exact), then suppression by geography x sex: the
    policy is refused, as after a balanced synthesis."""
    from sqlsdc import admin
    from sqlsdc.errors import PolicyError
    from sqlsdc.policy import load_policy
    from sqlsdc.synth import synthesize
    from tests.conftest import suppress_document

    report = synthesize(jobs_demo_db, user="admin", into="syn", method="cart", seed=7,
                        rows=2_000_000, sql="SELECT municipality, sex FROM persons")  # fmt: skip
    assert report.details["exact_columns"] == ["municipality", "sex"]
    with pytest.raises(PolicyError, match=r"of protected\.syn holds the same units as a cell"):
        admin.apply(jobs_demo_db, load_policy(suppress_document()), "admin")
    assert admin.show(jobs_demo_db)[0] == 1
