"""Red team s48o: session 48's merges (ENUM/UUID comparisons, the TableAlias left unchecked,
linked released files, keyed changes since the last re-keying, the COMMIT read back).

Found (fixed): **two released files that hold one exact column under two spellings were not
linked.** s47o's check (:mod:`sqlsdc.jobs.linked_files`) linked two files by a column both
hold as the same expression, or one as it is and the other coarsened; two other expressions
were "two coarsenings, not linked by design". ``weight + 0`` in one file and ``weight * 1``
(or ``CAST(weight AS DOUBLE)`` beside ``round(weight, 6)``) in the other are the same values:
both files under ``releases:`` were accepted, linked one to one by sex, age band and weight
(19,296 of the demo's 20,000 persons), 211 of them below the minimum frequency 10 by the union
of the keys (8 unique), as with ``weight`` in both, which is refused. ``round(weight, 2)``
beside ``round(weight, 1)`` linked 716, 371 exposed. Two expressions of one column now link
through the values they take together in the table.

Found (fixed): **keyed cells released without a keyed ledger row let a new ptable through.**
s48g's check (:mod:`sqlsdc.catalog.keyed_changes`) refused a new ptable while the ledger held
keyed (ckm, round) cells of the table; a query's HAVING and ORDER BY leave no ledger row, and
an aggregate over a derived table of cells leaves a "derived" one. On a fresh 20,000-person
demo (seed 7): ``HAVING COUNT(*) = 5`` listed the 12 municipality x sex cells whose noisy
count is 5 (12 of 12 right), ``SELECT municipality, sex, MAX(n) FROM (SELECT municipality,
sex, COUNT(*) AS n ... GROUP BY ALL) GROUP BY ALL`` gave 246 of the 332 noisy counts exactly;
after either, ``{D: 8, V: 6, js: 2}`` was applied (1 query), and the same question under the
new ptable pins cells as in s48g. Now an answered query naming the table under a keyed
policy version counts as a release.

Held (one line each; the demo of 20,000 persons, a copy with education and size_class as
ENUMs, education with a label no row has):
- ENUM comparisons (36 statements): COALESCE, NULLIF, GREATEST, IN, BETWEEN, LIKE, ^@, ||,
  = ANY, IS DISTINCT FROM, with a text column or a cast number: answered as on VARCHAR, alike
  for a present and an absent label; CASE/IF on a measure, a cast to the ENUM's own type, to
  INTEGER, to DATE and UNION with text refused; TRY_CAST to INTEGER answered (NULL).
- ENUM labels (21 statements): typeof, pg_typeof, DESCRIBE, information_schema refused; no
  refusal or error quotes the type's labels ('doctorate' never shown); ORDER BY an ENUM
  orders by label position over the rows shown only.
- TableAlias left unchecked (14 statements): VALUES, UNNEST, LATERAL refused; a derived
  table's column aliases t(c) hide nothing (CAST(region AS INTEGER) under them refused); a
  constant that raises in a scalar subquery, named or not, refused.
- Linked files: a file's weight read through a subquery, a CTE or a join is refused (its
  population is no WHERE); files are stored sorted by their values (no row-order link).
- Keyed changes after the fix: the table's name cannot be hidden from the audit text
  (U&"..." identifiers do not parse, "PERSONS" is lower-cased, query_table is refused, a
  zero-width space names no declared table).
- COMMIT read-back (code read): ``budget._kept`` reads the ledger row by its sequence number
  (nextval, never reused after a rollback) and ``_answered`` ignores the charge's pending
  entry, so a refused or rolled-back charge cannot look kept; no analyst-controlled path.
- Jobs: a count written as SUM(CASE WHEN age >= 90 THEN 1 ELSE 0 END) is refused by
  ``protect`` (a job's measure is a column).
"""

from __future__ import annotations

import shutil

import pytest

import sqlsdc
from sqlsdc.errors import PolicyError
from sqlsdc.jobs.anonymize import anonymize

KEYS = ("SELECT sex, age, education, {} AS weight FROM persons",
        "SELECT sex, age, occupation, {} AS weight FROM persons")  # fmt: skip


def _apply_both(path, first: str, second: str) -> None:
    """Store two files of persons (age banded 30/65), one holding ``first`` and the other
    ``second`` as its weight, and apply the policy in force releasing both."""
    for name, sql in (("fa", KEYS[0].format(first)), ("fb", KEYS[1].format(second))):
        anonymize(path, user="admin", sql=sql, into=name, steps=["recode:age:breaks=30/65"],
                  seed=1)  # fmt: skip
    release_both(path)


def release_both(path) -> None:
    """Apply the policy in force with ``releases: [fa, fb]``."""
    from sqlsdc.admin import apply
    from sqlsdc.catalog import store
    from sqlsdc.engines.duckdb import open_database
    from sqlsdc.policy import load_policy

    con = open_database(path)
    try:
        document = store.current_policy(con)[1]
    finally:
        con.close()
    apply(path, load_policy({**document, "releases": ["fa", "fb"]}, name="x"), "admin")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("weight + 0", "weight * 1"),  # the same values, spelt apart
        ("CAST(weight AS DOUBLE)", "round(weight, 6)"),
        ("round(weight, 2)", "round(weight, 1)"),  # a finer rounding beside a coarser
        ("weight * 1000", "weight + 0"),  # a scaling
    ],
)
def test_two_spellings_of_an_exact_weight_link_the_files(fresh_demo_db, first, second):
    """Finding (fixed): accepted on the base (19,296 persons linked, 211 below 10 by the
    union of the keys for the first two); refused now, as ``weight`` in both is."""
    with pytest.raises(PolicyError, match="link record by record by sex, age, weight"):
        _apply_both(fresh_demo_db, first, second)


def test_two_files_of_different_bands_and_no_exact_column_are_released(fresh_demo_db):
    """Files that hold age in bands of other breaks and no near-unique column link no record
    that the union exposes: released, as before."""
    _apply_both(fresh_demo_db, "CASE WHEN age < 40 THEN 'a' ELSE 'b' END",
                "CASE WHEN age < 50 THEN 'a' ELSE 'b' END")  # fmt: skip


@pytest.fixture(scope="module")
def seven_db(tmp_path_factory):
    """A fresh 20,000-person demo (seed 7, CKM), nothing asked: its ledger is empty."""
    from sqlsdc.demo.build import build_demo_database

    path = tmp_path_factory.mktemp("s48o") / "demo.duckdb"
    build_demo_database(path, persons=20_000, seed=7)
    return path


def _new_ptable():
    from sqlsdc.demo.build import demo_policy
    from sqlsdc.policy import load_policy

    document = demo_policy().document_dict()
    document["protection"]["counts"] = {"method": "ckm", "ptable": {"D": 8, "V": 6, "js": 2}}
    return load_policy(document, name="changed")


ASKED = {
    "having": "SELECT municipality, sex FROM persons GROUP BY ALL HAVING COUNT(*) = 5",
    "nested": "SELECT municipality, sex, MAX(n) FROM (SELECT municipality, sex, COUNT(*) AS n "
    "FROM persons GROUP BY ALL) AS t GROUP BY ALL",
}


@pytest.mark.parametrize("form", sorted(ASKED))
def test_keyed_cells_shown_through_having_or_nesting_keep_the_ptable(seven_db, tmp_path, form):
    """Finding (fixed): applied on the base after either question (no ckm row in the
    ledger); refused now, as after the plain ``COUNT(*)`` by the same cells."""
    from sqlsdc.admin import apply

    db = tmp_path / "demo.duckdb"
    shutil.copy(seven_db, db)
    plain = "SELECT municipality, sex, COUNT(*) FROM persons GROUP BY ALL"
    with sqlsdc.connect(db, user="analyst") as con:
        shown = con.execute(ASKED[form]).fetchall()
    assert len(shown) > 0  # 11 or 12 cells: the keys are drawn anew with each database
    with pytest.raises(PolicyError, match="keyed noise"):
        apply(db, _new_ptable(), "admin")
    fresh = tmp_path / "other.duckdb"  # the cells shown are the noisy counts themselves
    shutil.copy(seven_db, fresh)
    with sqlsdc.connect(fresh, user="analyst") as con:
        counts = {tuple(row[:2]): row[2] for row in con.execute(plain).fetchall()}
    if form == "having":
        assert all(counts[row] == 5 for row in shown)
    else:
        assert all(counts[tuple(row[:2])] == row[2] for row in shown)


def test_a_new_ptable_before_any_question_is_applied(seven_db, tmp_path):
    """Nothing asked (the demo's build runs no query): the new ptable is applied."""
    from sqlsdc.admin import apply

    db = tmp_path / "demo.duckdb"
    shutil.copy(seven_db, db)
    assert apply(db, _new_ptable(), "admin").version == 2
