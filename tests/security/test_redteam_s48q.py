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
from sqlsdc.errors import Error, PolicyError


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
