"""Red team s43c: the newest job code, session 42's (revisions, rounding audit, synthesis
draws), attacked as a reader of every released output and every earlier version.
W: worked, fixed, test below; H: held.

- W  syntheses of overlapping, not equal, rows: ``earlier_draws`` counted the records of
     earlier syntheses of the same rows only, and matched columns by their output names. On
     the suppression demo, 100 cart syntheses of every person's municipality and sex but one
     (``WHERE person_id <> k``, k = 1..100; seeds 100-199; 26.7 s CPU), each of its own
     population, were all stored, and their mean gave all 34 municipality totals under 10
     persons exactly (105 of 180 municipalities in all; s42c's same-rows spelling: 30 of 34).
     ``SELECT municipality AS m, sex AS s FROM persons`` beside ``SELECT municipality, sex``
     was stored too (2 syntheses: the s42c refusal skipped). Fixed: a synthesis counts, per
     row of its source, the records per row that earlier non-DP syntheses of rows holding it
     drew (each its records over its rows now), with a column reading a column it reads.
"""

from __future__ import annotations

import duckdb
import pytest

from sqlsdc.errors import Error

BOTH = "SELECT municipality, sex FROM persons"


def _stored(db) -> list[str]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        tables = con.sql("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'protected'")
        return sorted(r[0] for r in tables.fetchall())
    finally:
        con.close()


@pytest.mark.parametrize(
    "second",
    [
        "SELECT municipality, sex FROM persons WHERE person_id <> 1",  # every person but one
        "SELECT municipality AS m, sex AS s FROM persons",  # the same columns renamed
        "SELECT municipality AS place FROM persons WHERE age < 200 AND person_id > 3",
    ],
)
def test_a_second_synthesis_of_overlapping_rows_or_renamed_columns_counts_the_first(
    suppress_template, tmp_path, copy_database, second
):
    """Red team s43c (fails before the fix: both stored; 100 such syntheses of every person
    but one gave all 34 municipality totals under 10 persons as their mean)."""
    from sqlsdc.synth import synthesize

    db = copy_database(suppress_template, tmp_path)
    synthesize(db, user="admin", into="syn1", method="cart", seed=7, sql=BOTH)
    with pytest.raises(Error, match="suppression"):
        synthesize(db, user="admin", into="syn2", method="cart", seed=8, sql=second)
    assert _stored(db) == ["syn1"]


def test_syntheses_of_disjoint_rows_are_not_counted_together(
    suppress_template, tmp_path, copy_database
):
    """The control: men's and women's syntheses draw no row twice: both stored."""
    from sqlsdc.synth import synthesize

    db = copy_database(suppress_template, tmp_path)
    synthesize(db, user="admin", into="men", method="cart", seed=7,
               sql="SELECT municipality FROM persons WHERE sex = 'M'")  # fmt: skip
    synthesize(db, user="admin", into="women", method="cart", seed=8,
               sql="SELECT municipality FROM persons WHERE sex <> 'M'")  # fmt: skip
    assert _stored(db) == ["men", "women"]


def test_two_files_of_overlapping_rows_with_a_column_drawn_anew_are_not_released_together(
    jobs_demo_db, tmp_path
):
    """Red team s43c (fails before the fix: published; s42c's same-rows refusal compared
    files of the same rows only, and R01's persons with and without those aged 0 are two
    populations whose PRAM draws of the municipality readers average all the same)."""
    from sqlsdc.jobs.anonymize import anonymize
    from sqlsdc.release import publish

    for seed, where in ((1, ""), (2, " AND age >= 1")):
        anonymize(jobs_demo_db, user="admin", into=f"a{seed}",
                  sql=f"SELECT municipality, sex FROM persons WHERE region = 'R01'{where}",
                  steps=["pram:municipality:p=0.8"], seed=seed)  # fmt: skip
    with pytest.raises(Error, match="as drawn by a perturbative step"):
        publish(jobs_demo_db, tmp_path / "release.duckdb", "admin", include=("a1", "a2"))


def test_two_files_of_disjoint_rows_with_a_column_drawn_anew_are_released_together(
    jobs_demo_db, tmp_path
):
    """The control: R01's men's and women's files draw no person twice."""
    from sqlsdc.jobs.anonymize import anonymize
    from sqlsdc.release import publish

    for seed, sex in ((1, "M"), (2, "F")):
        anonymize(jobs_demo_db, user="admin", into=f"a{seed}",
                  sql=f"SELECT municipality FROM persons WHERE region = 'R01' AND sex = '{sex}'",
                  steps=["pram:municipality:p=0.8"], seed=seed)  # fmt: skip
    publish(jobs_demo_db, tmp_path / "release.duckdb", "admin", include=("a1", "a2"))
