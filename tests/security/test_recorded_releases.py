"""Everything released is recorded (issue 16, class 7): every `sqlsdc protect` job and every
`sqlsdc publish` writes the audit log, and the ledger holds every cell it released, in the
same transaction as the stored result; refusals are audited ``refused`` and failures
``failed``, and a failure leaves neither a result nor ledger rows. (Spark queries: tests/
test_spark.py, section (d).)

The audit log and the ledger are read with plain DuckDB, as an outside auditor would.
"""

from __future__ import annotations

import json
import shutil

import duckdb
import pandas as pd
import pytest
from db_reads import protected_tables, read

import sqlsdc
from sqlsdc import release
from sqlsdc.catalog import store
from sqlsdc.errors import AccessDenied, TabularError
from sqlsdc.jobs.adjust import cta_query, ipf_query, round_query
from sqlsdc.jobs.protect import protect_query
from sqlsdc.release import publish

OLD = "SELECT region, education, COUNT(*) FROM persons WHERE age >= 85 GROUP BY region, education"
YOUNG = "SELECT region, education, COUNT(*) FROM persons WHERE age < 20 GROUP BY region, education"
TURNOVER = "SELECT nace, region, SUM(turnover) FROM enterprises GROUP BY nace, region"


@pytest.fixture()
def db(pristine_demo_db, tmp_path):
    path = tmp_path / "demo.duckdb"
    shutil.copy(pristine_demo_db, path)
    return path


@pytest.fixture()
def suppress_db(suppress_template, tmp_path):
    path = tmp_path / "suppress.duckdb"
    shutil.copy(suppress_template, path)
    return path


def last_audit(path) -> dict:
    row = read(path, f"SELECT {', '.join(store.AUDIT_COLUMNS)} FROM sqlsdc.audit "
                     "ORDER BY logged_at DESC, query_id DESC LIMIT 1")[0]  # fmt: skip
    return dict(zip(store.AUDIT_COLUMNS, row, strict=True))


def ledger(path, query_id: int) -> pd.DataFrame:
    rows = read(path, "SELECT user_name, fingerprint, cell, column_name, mechanism, status "
                      "FROM sqlsdc.ledger WHERE query_id = ?", [query_id])  # fmt: skip
    columns = ["user_name", "fingerprint", "cell", "column_name", "mechanism", "status"]
    return pd.DataFrame(rows, columns=columns)


def stored(path, name: str) -> pd.DataFrame:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.sql(f"SELECT * FROM protected.{name}").df()
    finally:
        con.close()


def leftovers(path) -> tuple[list, list]:
    """Job output tables and their records: what a failed job must not leave."""
    return protected_tables(path), read(path, "SELECT name FROM sqlsdc.outputs")


# --- protect jobs --------------------------------------------------------------------------------


def test_suppression_job_records_every_cell_with_its_status(db):
    report = protect_query(db, "admin", OLD, into="old", time_limit=10)
    entry = last_audit(db)
    assert (entry["user_name"], entry["decision"], entry["sql_text"]) == ("admin", "accepted", OLD)
    assert entry["rows_returned"] == report.cells and entry["fingerprint"]
    cells = ledger(db, entry["query_id"])
    out = stored(db, "old")
    assert len(cells) == 2 * report.cells  # n and value of every cell
    assert set(cells["column_name"]) == {"n", "value"}
    assert set(cells["mechanism"]) == {"suppress"} and set(cells["user_name"]) == {"admin"}
    suppressed = (out["status"] != "published").sum()
    assert suppressed > 0
    assert (cells["status"] == "suppressed").sum() == 2 * suppressed
    identity = json.loads(cells["cell"].iloc[0])
    assert identity["tables"] == ["persons"] and set(identity["keys"]) == {"region", "education"}
    assert "age" in identity["population"]  # the WHERE is part of the cell
    assert read(db, "SELECT query_id FROM sqlsdc.outputs") == [(entry["query_id"],)]


def test_cells_of_different_populations_never_share_a_ledger_identity(db):
    """Two jobs over the same keys but different WHERE: their cells are different cells."""
    protect_query(db, "admin", OLD, into="old", time_limit=10)
    old = ledger(db, last_audit(db)["query_id"])
    protect_query(db, "admin", YOUNG, into="young", time_limit=10)
    young = ledger(db, last_audit(db)["query_id"])
    assert not set(old["cell"]) & set(young["cell"])


@pytest.mark.parametrize(
    "run, method",
    [
        (lambda db: round_query(db, "admin", OLD, into="x", base=5), "round"),
        (lambda db: cta_query(db, "admin", TURNOVER, into="x", intervals=True), "cta"),
    ],
    ids=["round", "cta"],
)
def test_adjustment_jobs_record_every_cell_including_those_published_as_zero(db, run, method):
    report = run(db)
    entry = last_audit(db)
    assert (entry["decision"], entry["user_name"]) == ("accepted", "admin")
    cells = ledger(db, entry["query_id"])
    values = cells[cells["column_name"] == "value"]
    assert len(values) == report.cells >= report.stored  # zeros are released too
    assert set(cells["mechanism"]) == {method} and set(cells["status"]) == {"published"}
    if method == "cta":  # the intervals of the sensitive cells are released cells too
        bounds = cells[cells["column_name"] == "lower_bound"]
        assert len(bounds) == report.sensitive > 0


@pytest.mark.parametrize(
    "run, error",
    [
        (lambda db: protect_query(db, "analyst", OLD, into="x"), AccessDenied),
        (lambda db: round_query(db, "analyst", OLD, into="x", base=5), AccessDenied),
        (lambda db: protect_query(db, "admin", "SELECT region, income FROM persons", into="x"),
         TabularError),
        (lambda db: protect_query(db, "admin", OLD, into="bad name"), TabularError),
    ],
    ids=["analyst-suppress", "analyst-round", "row-level", "bad-name"],
)  # fmt: skip
def test_refused_jobs_are_audited_and_release_nothing(db, run, error):
    with pytest.raises(error):
        run(db)
    entry = last_audit(db)
    assert entry["decision"] == "refused" and entry["reason"]
    assert ledger(db, entry["query_id"]).empty
    assert leftovers(db) == ([], [])


def test_failed_jobs_are_audited_and_leave_nothing(db, tmp_path):
    margins = tmp_path / "margins.csv"
    margins.write_text("region,education,value\nR01,Total,10\n")  # one of several regions
    with pytest.raises(TabularError, match="give every cell of a margin"):
        ipf_query(db, "admin", OLD, into="x", margins=margins)
    entry = last_audit(db)
    assert (entry["decision"], entry["user_name"], entry["sql_text"]) == ("failed", "admin", OLD)
    assert "margin" in entry["reason"]
    assert ledger(db, entry["query_id"]).empty and leftovers(db) == ([], [])


def test_a_crash_while_recording_leaves_neither_table_nor_ledger(db, monkeypatch):
    """The stored table, its record and its ledger rows are one transaction with the audit
    entry: a crash before the commit rolls all back, and the job is audited as failed."""
    real = store.record_query

    def crash(con, query_id, user, version, decision, *args, **kwargs):
        if decision == "accepted":
            raise RuntimeError("power cut")
        return real(con, query_id, user, version, decision, *args, **kwargs)

    monkeypatch.setattr(store, "record_query", crash)
    with pytest.raises(RuntimeError, match="power cut"):
        protect_query(db, "admin", OLD, into="old", time_limit=10)
    monkeypatch.undo()
    entry = last_audit(db)
    assert entry["decision"] == "failed" and "power cut" in entry["reason"]
    assert ledger(db, entry["query_id"]).empty and leftovers(db) == ([], [])


# --- publish --------------------------------------------------------------------------------------

QUERY = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"


def test_publish_records_every_released_cell_under_its_own_entry(suppress_db, tmp_path):
    protect_query(suppress_db, "admin", OLD, into="old", time_limit=10)
    job_id = last_audit(suppress_db)["query_id"]
    out = tmp_path / "release.duckdb"
    report = publish(suppress_db, out, "admin", queries={"by_region": QUERY}, analyst="analyst")
    entry = last_audit(suppress_db)
    assert (entry["decision"], entry["user_name"]) == ("accepted", "admin")
    assert entry["rows_returned"] == sum(t.rows for t in report.tables)
    cells = ledger(suppress_db, entry["query_id"])
    assert set(cells["user_name"]) == {"admin"}
    # the job's cells, with the same identities as when the job stored them
    job = ledger(suppress_db, job_id)
    copied = cells[cells["cell"].isin(job["cell"])]
    assert sorted(map(tuple, copied[["cell", "column_name", "status"]].values)) == sorted(
        map(tuple, job[["cell", "column_name", "status"]].values)
    )
    # every cell of every suppression pattern, per aggregate, with its status
    for table in report.tables:
        if table.source == "suppression":
            released = read(out, f"SELECT * FROM {table.table}")
            name = table.table.removeprefix("suppressed_")
            mine = cells[
                cells["cell"].str.contains(f'"tables":["{name}"]', regex=False)
                & (cells["mechanism"] == "suppress")
                & ~cells["cell"].isin(job["cell"])
                & (cells["column_name"] != "n")
            ]  # fmt: skip (n: the query's)
            aggregates = {c for c in mine["column_name"]}
            assert len(mine) == len(released) * len(aggregates) > 0
            assert {"published", "suppressed"} == set(mine["status"])
    # the guarded query's cells (the analyst's entry holds them too)
    with sqlsdc.connect(suppress_db, "analyst") as con:
        n_regions = len(con.execute(QUERY).fetchall())
    query_cells = cells[(cells["column_name"] == "n") & ~cells["cell"].isin(job["cell"])]
    assert len(query_cells) == n_regions


@pytest.mark.parametrize(
    "call, error, decision",
    [
        (lambda db, out: publish(db, out, "analyst"), AccessDenied, "refused"),
        (lambda db, out: publish(db, out, "admin", queries={"rows": "SELECT income FROM persons"}),
         sqlsdc.PolicyViolation, "refused"),
        (lambda db, out: publish(db, db, "admin"), sqlsdc.Error, "refused"),
    ],
    ids=["analyst", "refused-query", "same-file"],
)  # fmt: skip
def test_refused_publications_are_audited_and_release_nothing(suppress_db, tmp_path, call,
                                                              error, decision):  # fmt: skip
    out = tmp_path / "release.duckdb"
    with pytest.raises(error):
        call(suppress_db, out)
    entry = last_audit(suppress_db)
    assert entry["decision"] == decision and entry["reason"]
    assert "publish" in json.loads(entry["sql_text"])
    assert ledger(suppress_db, entry["query_id"]).empty
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


def test_a_publication_that_fails_is_audited_and_leaves_no_file_and_no_ledger(
    suppress_db, tmp_path, monkeypatch
):
    def broken(partial, version, tables, storage, say):
        partial.write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(release, "_write", broken)
    out = tmp_path / "release.duckdb"
    with pytest.raises(OSError, match="disk full"):
        publish(suppress_db, out, "admin")
    entry = last_audit(suppress_db)
    assert entry["decision"] == "failed" and "disk full" in entry["reason"]
    assert ledger(suppress_db, entry["query_id"]).empty
    assert not out.exists() and not list(tmp_path.glob("*.partial"))
