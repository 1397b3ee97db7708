"""Red team s48q: session 48's round-2 merges (release_private's removal of dead publications'
private folders, s48m; linked released files, s48o).

Found (fixed): **an exact column that also reads another column links unseen.** Two files
link record by record by the columns both hold exactly (:mod:`sqlsdc.jobs.linked_files`); a
file's columns were taken for that only when they read one column of the table. ``weight +
0 * income`` reads two: beside ``weight`` in another file of the same persons both were
released (the 20,000-person demo: 18,812 persons linked one to one by sex, age band and
weight, 222 of them among fewer than 10 by the union of the keys, each file alone showing
them among 10 or more). Now every exact column that reads a column the other's reads links
(through the table's value pairs where the two expressions differ).

Found (fixed): **a shuffle given the shuffled column itself moves nothing.** Data shuffling
(Muralidhar & Sarathy) draws y* from the column's normal scores given S; given the column (or
a copy, or a monotone function of it) the residual variance is 0 and every value comes back
where it was, while the file counts the column as perturbed (no link, no exact cut).
``shuffle:weight:given=weight`` in one file beside ``weight`` in another: both released, all
19,296 persons linked one to one by sex, age band and weight. Refused now, as ``noise:c=0``.

Held (one line each; the 20,000-person demo):
- s48h's fast path (``one_cell_each``): the per-cell groupings equal the row groupings on 360
  smallest-difference and 454 union-of-cells queries over tables with duplicate rows of a
  unit, NULL units, NULL keys, zero, negative and NULL measures, empty cuts (60+60 seeds).
- s48i's small-count draws: a base-3 rounding replaced six times under WHEREs that change
  other rows: none of the 89 cells of 1 or 2 published both 0 and 3; a second job of the
  same cells (COUNT(DISTINCT person_id), another name) is refused as a second protection;
  COUNT(person_id), COUNT(1), SUM(1), a distinct household count are refused as aggregates.
- s48o's links: ``-weight``, ``CAST(weight AS VARCHAR) || 'x'``, ``hash(weight)``, weight
  split into ``floor(weight)`` and its fraction, ``CASE WHEN income > 30000 THEN weight END``,
  topcode above the maximum: all refused; noise c=0, microaggregate k=1, rankswap p=0 refused.
- keyed_changes: ``"PERSONS"`` is lower-cased, ``PERſONS`` names no table, ``U&"..."`` does
  not parse (the audit text names the table in every accepted form tried).
- release_private: links beside OUT are left alone; rmtree does not follow links inside.

A publication writes its partial release in ``OUT.<id>.partial/`` beside OUT, named by its
audit entry's id, and holds an exclusive ``flock`` on it until it is done
(:mod:`sqlsdc.release_private`). The id is unique per database only: two databases (two copies
of one demo, a test and a production catalog) publishing to one folder can run with one id at
once. ``claim`` removed whatever stood at its own folder's name without asking for the lock:
a running publication's folder, with its half-written release, was deleted under it, and when
the second publication failed its clean-up deleted the first's folder again."""

from __future__ import annotations

import fcntl
import os

import pytest
from test_redteam_s48o import _apply_both

from sqlsdc import release_private
from sqlsdc.errors import Error, MicrodataError, PolicyError
from sqlsdc.jobs.anonymize import anonymize


def _running(folder):
    """A publication of another process holding ``folder``: made, locked, half written."""
    folder.mkdir(mode=0o700)
    (folder / "release.duckdb").write_bytes(b"half of another database's release")
    handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return handle


def test_a_running_publication_of_the_same_id_keeps_its_folder(tmp_path):
    out = tmp_path / "release.duckdb"
    folder = release_private.private_folder(out, 5)
    handle = _running(folder)
    try:
        # on the base: claim removed the held folder and made its own (no error)
        with pytest.raises(Error, match="another publication"):
            release_private.claim([out], 5)
        assert (folder / "release.duckdb").read_bytes() == b"half of another database's release"
    finally:
        os.close(handle)


def test_a_claim_that_fails_on_its_second_target_removes_only_its_own(tmp_path):
    out, parquet = tmp_path / "release.duckdb", tmp_path / "parquet"
    held = release_private.private_folder(parquet, 9)
    handle = _running(held)
    try:
        with pytest.raises(Error, match="another publication"):
            release_private.claim([out, parquet], 9)
        assert not release_private.private_folder(out, 9).exists()  # its own: removed
        assert (held / "release.duckdb").exists()  # the other's: kept
    finally:
        os.close(handle)


def test_a_publication_of_another_database_with_the_same_id_is_not_deleted(
    jobs_demo_db, tmp_path, copy_database
):
    """Two copies of one database: the second's publication gets the id the first's runs
    under. On the base it deleted the first's folder and published; now it fails, the first's
    half-written release untouched; once that one is gone, publishing works."""
    from sqlsdc.engines.duckdb import open_database
    from sqlsdc.release import publish

    (tmp_path / "twin").mkdir()
    twin = copy_database(jobs_demo_db, tmp_path / "twin")
    con = open_database(twin)
    try:
        (query_id,) = con.execute("SELECT nextval('sqlsdc.query_ids')").fetchone()
    finally:
        con.close()
    out = tmp_path / "release.duckdb"
    folder = release_private.private_folder(out, query_id)
    handle = _running(folder)
    try:
        with pytest.raises(Error, match="another publication"):
            publish(jobs_demo_db, out, "admin")
        assert (folder / "release.duckdb").read_bytes() == b"half of another database's release"
        assert not out.exists()
    finally:
        os.close(handle)
    publish(jobs_demo_db, out, "admin")  # the other is done (dead): its folder goes now
    assert out.exists() and not folder.exists()


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("weight", "weight + 0 * income"),  # accepted on the base: 18,812 linked, 222 exposed
        ("weight + 0 * income", "weight + 0 * income"),  # the same, reading two columns
        ("weight * 1", "weight * (1 + 0 * income)"),
    ],
)
def test_an_exact_weight_that_reads_another_column_links_the_files(fresh_demo_db, first, second):
    with pytest.raises(PolicyError, match=r"link record by record by sex, age, (income, )?weight"):
        _apply_both(fresh_demo_db, first, second)


@pytest.mark.parametrize(
    ("sql", "given"),
    [
        ("SELECT sex, age, occupation, weight FROM persons", "weight"),  # itself
        ("SELECT sex, age, occupation, weight, -2 * weight AS w2 FROM persons", "w2"),  # a copy
    ],
)
def test_a_shuffle_given_the_shuffled_column_is_refused(fresh_demo_db, sql, given):
    """On the base the file was stored with every weight as it was (19,296 linked)."""
    with pytest.raises(MicrodataError, match="shuffle moves nothing"):
        anonymize(fresh_demo_db, user="admin", sql=sql, into="fb", seed=1,
                  steps=["recode:age:breaks=30/65", f"shuffle:weight:given={given}"])  # fmt: skip


def test_a_shuffle_given_other_columns_still_moves_the_values(fresh_demo_db):
    import duckdb

    anonymize(fresh_demo_db, user="admin", into="fb", seed=1,
              sql="SELECT sex, age, occupation, weight, income FROM persons",
              steps=["shuffle:weight:given=income/age"])  # fmt: skip
    con = duckdb.connect(str(fresh_demo_db), read_only=True)
    try:
        (kept,) = con.execute(
            "SELECT count(*) FROM protected.fb f JOIN persons p ON p.weight = f.weight AND "
            "p.sex = f.sex AND p.occupation = f.occupation AND p.income = f.income"
        ).fetchone()
    finally:
        con.close()
    assert kept < 2_000  # of 20,000: the weights moved to other records
