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
     A population written as a derived table (``FROM (SELECT * FROM persons) AS p``) was
     compared with none: two such syntheses and a plain one of the same people, three draws,
     were stored. Now such a source and any synthesis of a table it reads count as the same
     rows when a column of one may be one of the other (fail closed).
- W  the same for anonymised files (``file_pairs._refuse_two_draws``): 30 PRAM files (p=0.8)
     of R01's persons but one each, published together, gave 11 of 24 municipality counts
     exactly as their PRAM-corrected mean (one file: 3). Fixed: files of overlapping rows
     are refused as files of the same rows are.
- W  a suppression output forgotten once no output holds it: enterprise counts by nace x
     region by ``gauss`` (``freq:3``), the output replaced by a table of persons or dropped,
     then the same cells by ``hitas`` under another name (3 jobs): the second pattern
     published 4 cells the first hid, and the two pinned 4 of 12 primaries, 3 at exactly 1
     (s32b's attack, which ``earlier_suppressions`` blocks while the first is stored).
     Fixed: the versions no output holds (jobs/replaced_suppressions.py, from the ledger and
     the kept units) are kept suppressed, published and audited as stored ones are.
- W  three versions: the joint revision audit read the new version with the stored one only.
     Two firms entered a hidden cell h (F = 1,234,567 with v2, H = 1,111,111 with v3), a firm
     J (1,000,000) entered another hidden cell of h's row with F and left with H, three firms
     entered a published cell of the row each time: each consecutive pair met its levels,
     and v1 with v3 (h's neighbour unchanged between them) bounded h's change above at its
     exact value 2,345,678 (3 jobs, on the 20,000-person demo). Fixed by the same versions:
     v3 is audited with v1 too and refused.
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


OPAQUE = "SELECT p.municipality, p.sex FROM (SELECT * FROM persons) AS p"


@pytest.mark.parametrize("first, second", [(OPAQUE, OPAQUE), (OPAQUE, BOTH), (BOTH, OPAQUE)])
def test_a_synthesis_of_a_derived_table_counts_as_one_of_the_same_rows(
    suppress_template, tmp_path, copy_database, first, second
):
    """Red team s43c (fails before the fix: both stored; a population written as a derived
    table was no population earlier_draws compared, either way round)."""
    from sqlsdc.synth import synthesize

    db = copy_database(suppress_template, tmp_path)
    synthesize(db, user="admin", into="syn1", method="cart", seed=7, sql=first)
    with pytest.raises(Error, match="syn2"):
        synthesize(db, user="admin", into="syn2", method="cart", seed=8, sql=second)
    assert _stored(db) == ["syn1"]


def test_a_derived_table_of_other_columns_is_not_counted(
    suppress_template, tmp_path, copy_database
):
    """The control: a synthesis of persons' ages by a derived table, then one of their
    municipality and sex, share no column: both stored."""
    from sqlsdc.synth import synthesize

    db = copy_database(suppress_template, tmp_path)
    synthesize(db, user="admin", into="ages", method="cart", seed=7,
               sql="SELECT p.age FROM (SELECT * FROM persons) AS p")  # fmt: skip
    synthesize(db, user="admin", into="places", method="cart", seed=8, sql=BOTH)
    assert _stored(db) == ["ages", "places"]


def test_syntheses_of_disjoint_rows_are_not_counted_together(
    suppress_template, tmp_path, copy_database
):
    """The control: men's and women's syntheses draw no row twice: both stored (each as large
    as its source, given as --rows: a default size, its population's count, is refused under
    suppression, red team s43l)."""
    from sqlsdc.synth import synthesize

    db = copy_database(suppress_template, tmp_path)
    con = duckdb.connect(str(db), read_only=True)
    men, women = con.execute("SELECT count(*) FILTER (sex = 'M'), count(*) FILTER (sex <> 'M') "
                             "FROM persons").fetchone()  # fmt: skip
    con.close()
    synthesize(db, user="admin", into="men", method="cart", seed=7, rows=men,
               sql="SELECT municipality FROM persons WHERE sex = 'M'")  # fmt: skip
    synthesize(db, user="admin", into="women", method="cart", seed=8, rows=women,
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


@pytest.mark.parametrize("forget", ["replace", "drop"])
def test_a_suppression_pattern_no_output_holds_any_more_is_still_kept(
    pristine_demo_db, tmp_path, copy_database, forget
):
    """Red team s43c (fails before the fix: 4 cells the first pattern hid published, 3
    enterprise counts of 1 pinned exactly with the first pattern)."""
    from sqlsdc.jobs.protect import protect_query
    from sqlsdc.tabular.rules import FrequencyRule
    from tests.security.test_redteam_s32b import NACE_REGION, _job, assert_two_patterns_protect

    db = copy_database(pristine_demo_db, tmp_path)
    rules = [FrequencyRule(3)]
    protect_query(db, "admin", NACE_REGION, into="by_gauss", rules=rules, time_limit=10)
    first = _job(db, "by_gauss")
    if forget == "drop":
        con = duckdb.connect(str(db))
        con.execute("DROP TABLE protected.by_gauss")
        con.close()
    else:  # other cells under its name
        protect_query(db, "admin", "SELECT region, sex, COUNT(*) FROM persons GROUP BY region, sex",
                      into="by_gauss", rules=rules, time_limit=10, replace=True)  # fmt: skip
    protect_query(db, "admin", NACE_REGION, into="by_hitas", method="hitas", rules=rules,
                  time_limit=10)  # fmt: skip
    assert_two_patterns_protect(db, first, _job(db, "by_hitas"))


def test_the_first_and_third_versions_are_audited_together(jobs_demo_db):
    """Red team s43c (fails before the fix: the third version stored, and the change of h
    from the first to the third version bounded above at its exact value, 2,345,678: two
    firms entered h, F = 1,234,567 and H = 1,111,111). A firm J (1,000,000) enters another
    hidden cell h2 of h's row with F, and leaves with H's entry; three firms enter a
    published cell of the row each time. Each pair of consecutive versions meets its levels
    (J's entry and exit hide F's and H's), the first and third did not: h2 is unchanged
    between them. The third is now audited with the first too (no output holds it)."""
    from sqlsdc.errors import TabularError
    from sqlsdc.jobs.protect import protect_query
    from tests.jobs.test_revisions import NEW_FIRM, RULES, change
    from tests.security.test_redteam_s42k import BY, _change_interval, _statuses

    db, sql = jobs_demo_db, BY.format(where="")
    protect_query(db, "admin", sql, into="t", rules=RULES)
    first = _statuses(db, "t")
    inner = [c for c in first.index if "Total" not in c]
    hidden = [c for c in inner if first.loc[c].status != "published"]
    shown = [c for c in inner if first.loc[c].status == "published" and first.loc[c].n >= 5]
    h, h2, x = next((h, h2, x) for h in hidden for h2 in hidden for x in shown
                    if h != h2 and x[0] == h[0] == h2[0])  # fmt: skip
    firm = NEW_FIRM.format
    change(db, firm(nace=h[0], region=h[1], turnover=1_234_567),
           firm(nace=h2[0], region=h2[1], turnover=1_000_000),
           *(firm(nace=x[0], region=x[1], turnover=v) for v in (400_000, 410_000, 420_000)),
           )  # fmt: skip
    protect_query(db, "admin", sql, into="t", rules=RULES, replace=True)
    second = _statuses(db, "t")
    change(db, f"DELETE FROM enterprises WHERE turnover = 1000000 AND nace = '{h2[0]}' "
               f"AND region = '{h2[1]}'",
           firm(nace=h[0], region=h[1], turnover=1_111_111),
           *(firm(nace=x[0], region=x[1], turnover=v) for v in (430_000, 440_000, 450_000)),
           )  # fmt: skip
    try:
        protect_query(db, "admin", sql, into="t", rules=RULES, replace=True)
    except TabularError as refusal:
        assert "together give cell" in str(refusal)
        assert _statuses(db, "t").equals(second)  # nothing stored
        return
    unchanged = [c for c in hidden if c[0] == h[0] and c != h]
    low, high = _change_interval(first, _statuses(db, "t"), h, unchanged)
    assert low <= 0.7 * 2_345_678 and high >= 1.3 * 2_345_678, (h, low, high)
