"""Red team s36c: back-end jobs, `sqlsdc publish` (the release database and its Parquet copy)
and the query-time suppression, attacked by an analyst who combines live answers with
published tables, by a BI user holding only the release files, and by bad command-line input.

What broke (fixed here):

- **`publish --parquet DIR --replace` deleted whatever DIR held.** The old folder is renamed
  aside and removed as a whole once the new one is in place, and nothing checked that it was
  a release: ``sqlsdc publish conf.duckdb release.duckdb --parquet . --replace`` (or any folder
  holding the database, or a parent of it) deleted the confidential database with its catalog
  and audit log (the publication's own accepted entry and ledger rows with it), and every
  other file there. Only an earlier release folder (its ``manifest.json`` and the files it
  lists, nothing else) is replaced now (``release_parquet.check_replaceable``), checked with
  the request, before anything is charged.
"""

from __future__ import annotations

import json

import duckdb
import pytest

from sqlsdc.errors import Error
from sqlsdc.release import publish


def read(path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.fixture()
def in_a_folder(pristine_demo_db, tmp_path, copy_database):
    """The demo database in a folder of its own, next to a file of the admin's."""
    folder = tmp_path / "work"
    folder.mkdir()
    db = copy_database(pristine_demo_db, folder)
    (folder / "notes.txt").write_text("the admin's notes\n")
    return db


@pytest.mark.parametrize("where", ["database's folder", "its parent", "another folder"])
def test_replacing_a_parquet_folder_that_is_no_release_is_refused(in_a_folder, tmp_path, where):
    db = in_a_folder
    target = {"database's folder": db.parent, "its parent": tmp_path}.get(where)
    if target is None:
        target = tmp_path / "photos"
        target.mkdir()
        (target / "holiday.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(Error, match="not an earlier release folder"):
        publish(db, tmp_path / "release.duckdb", "admin", parquet=target, replace=True)
    assert db.exists() and (db.parent / "notes.txt").exists()
    assert not (tmp_path / "release.duckdb").exists()
    assert read(db, "SELECT decision FROM sqlsdc.audit ORDER BY query_id DESC LIMIT 1") == [
        ("refused",)
    ]
    if where == "another folder":
        assert (target / "holiday.jpg").exists()


def test_an_earlier_release_folder_is_still_replaced(in_a_folder, tmp_path):
    db, folder = in_a_folder, tmp_path / "parquet"
    first = publish(db, tmp_path / "release.duckdb", "admin", parquet=folder)
    second = publish(db, tmp_path / "release.duckdb", "admin", parquet=folder, replace=True)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["release_id"] == second.release_id > first.release_id
    (folder / "extra.csv").write_text("a,b\n")  # no longer only a release
    with pytest.raises(Error, match="not an earlier release folder"):
        publish(db, tmp_path / "release.duckdb", "admin", parquet=folder, replace=True)
    assert (folder / "extra.csv").exists()
