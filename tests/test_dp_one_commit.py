"""Why a DP query with new cells keeps two commits: its charge commits before any exact cell is
computed, and its answer's record commits before the answer is returned (session 46).

Issue 17's idea was one transaction per new-cell query (BEGIN, charge, exact cells, noise,
answer, audit and ledger, COMMIT): one COMMIT and one BEGIN fewer. It is unsafe with DuckDB,
and these tests pin the facts that make it so:

- a statement interrupted inside a DuckDB transaction (the statement timeout, which an analyst
  may shorten, a cancel, Ctrl-C) aborts the whole transaction, and the COMMIT sent after it
  reports success and keeps nothing: a charge written in that transaction is gone, while the
  exact cells were (partly) computed and timed. Charging again after the rollback can be
  refused (a concurrent query spent the budget meanwhile), and a process killed before the
  COMMIT charges nothing at all; so the exact cells would be computed for free
  (ISSUE16 must-have 6, red team s41b);
- the charge must therefore be visible to every other connection (committed) when the first
  statement of the release runs;
- the row of ``budget_lock`` that a charge bumps, held by a transaction not committed, makes
  every other charge of the database fail at once and retry; after its retries (about 1 s)
  a charge fails clearly, charges and computes nothing. A transaction spanning the exact
  cells and the answer would hold that row for a whole query (seconds on a large table), so
  every concurrent DP query of the database would fail that way.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import dp_persons
import duckdb
import pytest

import sqlsdc
from sqlsdc.catalog.budget_tables import bump
from sqlsdc.catalog.store import CHARGED_PENDING
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import Error
from sqlsdc.guard import dp_charge

BY_REGION = "SELECT region, COUNT(*) FROM persons WHERE age >= 7 GROUP BY region"


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """The DP persons database, built once for the module: each test changes a copy."""
    return dp_persons.build(tmp_path_factory.mktemp("one_commit") / "one_commit.duckdb")


@pytest.fixture
def db(template, tmp_path) -> Path:
    path = tmp_path / template.name
    shutil.copy(template, path)
    return path


def _charges(con) -> list[tuple]:
    return con.execute("SELECT query_id, epsilon FROM sqlsdc.budget_spend ORDER BY seq").fetchall()


def test_an_interrupted_statement_aborts_its_transaction_and_the_commit_keeps_nothing(tmp_path):
    """A charge (the bump and the spend row) and the exact cells in one transaction: the
    statement timeout interrupts the cells, and DuckDB rolls the charge back with them."""
    con = duckdb.connect(str(tmp_path / "abort.duckdb"))
    con.execute("CREATE TABLE lock (id INTEGER PRIMARY KEY, charges BIGINT)")
    con.execute("INSERT INTO lock VALUES (1, 1)")
    con.execute("CREATE TABLE spend (seq BIGINT, epsilon VARCHAR)")
    con.execute("BEGIN TRANSACTION")
    con.execute("UPDATE lock SET charges = charges + 1 WHERE id = 1")
    con.execute("INSERT INTO spend VALUES (1, '1/2')")
    with pytest.raises(duckdb.InterruptException):  # the guard's timeout, as on exact cells
        engine.run(con, "SELECT sum(hash(range)) FROM range(10000000000)", timeout=0.1)
    with pytest.raises(duckdb.TransactionException, match="aborted"):
        con.execute("SELECT count(*) FROM spend")
    with contextlib.suppress(duckdb.Error):  # DuckDB 2.0 reports success here
        con.execute("COMMIT")
    assert con.execute("SELECT count(*) FROM spend").fetchone() == (0,)
    assert con.execute("SELECT charges FROM lock").fetchone() == (1,)
    con.close()


def test_every_statement_of_the_release_runs_after_the_charge_is_committed(db, monkeypatch):
    """Each statement that reads confidential rows after the charge (the exact cells; a
    private key's types) runs when another connection already reads the charge's ledger row
    and its pending audit entry: the charge has committed."""
    seen: list[tuple] = []
    release = dp_charge.release

    def watched_release(stages, run, **kwargs):
        def watched_run(text):
            other = open_database(db)  # another connection of this process's DuckDB instance
            try:
                ledger = _charges(other)
                pending = other.execute(
                    "SELECT query_id FROM sqlsdc.audit WHERE reason = ?", [CHARGED_PENDING]
                ).fetchall()
            finally:
                other.close()
            seen.append((ledger, pending))
            return run(text)

        return release(stages, watched_run, **kwargs)

    monkeypatch.setattr(dp_charge, "release", watched_release)
    with sqlsdc.connect(db, "ana") as con:
        cur = con.execute(BY_REGION)
        assert len(cur.fetchall()) == 4
        query_id = cur.query_id
    assert seen  # the exact cells were computed through the watched run
    for ledger, pending in seen:
        assert ledger == [(query_id, "1/2")]
        assert pending == [(query_id,)]


def test_a_charge_behind_an_uncommitted_bump_fails_clearly_and_computes_nothing(db, monkeypatch):
    """Another connection holds ``budget_lock``'s row in a transaction not committed (as a
    charge spanning a whole query would): the charge conflicts on every retry and fails with
    sqlsdc's message; nothing is charged, no exact cell is computed, nothing is returned.
    Once the row is let go, the same statement is charged and answered."""
    released: list[int] = []
    release = dp_charge.release

    def counted_release(*args, **kwargs):
        released.append(1)
        return release(*args, **kwargs)

    monkeypatch.setattr(dp_charge, "release", counted_release)
    holder = open_database(db)
    try:
        holder.execute("BEGIN TRANSACTION")
        bump(holder)
        with sqlsdc.connect(db, "ana") as con:
            with pytest.raises(Error, match="too many concurrent charges"):
                con.execute(BY_REGION)
            assert released == []
            assert _charges(holder) == []
            holder.execute("ROLLBACK")
            audit = holder.execute("SELECT decision, reason FROM sqlsdc.audit").fetchall()
            ((decision, reason),) = audit  # the engine's conflict, for an admin only
            assert decision == "refused" and "Conflict" in reason
            assert "too many concurrent charges" in reason
            cur = con.execute(BY_REGION)
            assert len(cur.fetchall()) == 4
            assert _charges(holder) == [(cur.query_id, "1/2")]
    finally:
        holder.close()
