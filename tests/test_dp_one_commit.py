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
from fractions import Fraction
from pathlib import Path

import dp_persons
import duckdb
import pytest

import sqlsdc
from sqlsdc.catalog import budget
from sqlsdc.catalog.budget import BudgetKey
from sqlsdc.catalog.budget_admin import set_limit
from sqlsdc.catalog.budget_tables import bump
from sqlsdc.catalog.store import CHARGED_PENDING
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import BudgetExhausted, Error
from sqlsdc.guard import dp_charge
from sqlsdc.mechanisms.accountant import BudgetLimit

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


# --- fewer statements in each of the two transactions -----------------------------------------


class Recording:
    """A DuckDB connection that records the statements sent to it (texts, or the method)."""

    def __init__(self, con, log: list[str]):
        self._con, self._log = con, log

    def execute(self, sql, *args, **kwargs):
        self._log.append(" ".join(getattr(sql, "query", sql).split()))
        return self._con.execute(sql, *args, **kwargs)

    def __getattr__(self, name):
        attr = getattr(self._con, name)
        if name not in ("register", "unregister", "get_table_names", "_submit"):
            return attr

        def recorded(*args, **kwargs):
            self._log.append(name)
            return attr(*args, **kwargs)

        return recorded


def by_region(age: int) -> str:
    return f"SELECT region, COUNT(*) FROM persons WHERE age >= {age} GROUP BY region"


def test_a_new_cell_query_charges_in_one_statement_and_caches_with_its_count(db, monkeypatch):
    """A connection whose budget state is current charges in one statement (the bump, the
    ledger row and the pending audit entry) and caches its cells with the ledger row's cell
    count in one statement: 11 engine calls per new-cell query of a known text, 14 before. The rows
    are those the separate statements wrote."""
    log: list[str] = []
    opened = engine.open_database
    monkeypatch.setattr(engine, "open_database", lambda *a, **k: Recording(opened(*a, **k), log))
    with sqlsdc.connect(db, "ana") as con:
        con.execute(by_region(1)).fetchall()  # the opening's first charge reads the state
        (start,) = con._con.execute("SELECT charges FROM sqlsdc.budget_lock").fetchone()
        ids = []
        for age in (2, 3):
            con.explain(by_region(age))  # checked beforehand, as a client's Describe
            first = len(log)
            cur = con.execute(by_region(age))
            assert len(cur.fetchall()) == 4
            ids.append(cur.query_id)
            calls = log[first:]
            charge = calls[calls.index("BEGIN TRANSACTION") + 1 : calls.index("COMMIT")]
            assert len(charge) == 1 and charge[0].startswith("WITH bumped AS (UPDATE")
            assert not any(c.startswith("UPDATE sqlsdc.budget_spend") for c in calls)
            assert len(calls) == 11, calls  # 14 before (session 46)
    other = open_database(db)
    try:
        (end,) = other.execute("SELECT charges FROM sqlsdc.budget_lock").fetchone()
        assert end == start + 2
        spend = other.execute(
            "SELECT query_id, user_name, tables, epsilon, rho, delta, cells, policy_version "
            "FROM sqlsdc.budget_spend WHERE query_id IN (?, ?) ORDER BY seq",
            ids,
        ).fetchall()
        assert spend == [(i, "ana", ["persons"], "1/2", "0", "0", 4, 1) for i in ids]
        audit = other.execute(
            "SELECT query_id, user_name, decision, reason, sql_text, rows_returned "
            "FROM sqlsdc.audit WHERE query_id IN (?, ?) ORDER BY query_id",
            ids,
        ).fetchall()
        assert audit == [(i, "ana", "accepted", None, by_region(a), 4)
                         for i, a in zip(ids, (2, 3), strict=True)]  # fmt: skip
        cached = other.execute(  # the 4 cells and the statistic paid, of each query
            "SELECT query_id, count(*) FROM sqlsdc.dp_cells WHERE query_id IN (?, ?) "
            "GROUP BY ALL ORDER BY ALL",
            ids,
        ).fetchall()
        assert cached == [(i, 5) for i in ids]
    finally:
        other.close()


def test_a_charge_decided_on_a_stale_state_is_rolled_back_and_decided_afresh(db, monkeypatch):
    """The connection's state says 29.5 of ana's 30 remain; an administrator then sets her limit
    to the 1/2 she spent. The one-statement charge, decided on the old state, sees from the
    bump's counter that someone wrote since, rolls back and decides afresh: refused, nothing
    charged, no pending entry left."""
    tried: list[tuple | None] = []
    known = budget._charge_known

    def watched(*args):
        row = known(*args)
        tried.append(row)
        return row

    monkeypatch.setattr(budget, "_charge_known", watched)
    with sqlsdc.connect(db, "ana") as con:
        con.execute(by_region(1)).fetchall()
        admin = open_database(db)
        try:
            set_limit(admin, admin="admin", key=BudgetKey("ana"),
                      limit=BudgetLimit(epsilon=Fraction(1, 2)), reason="s46e")  # fmt: skip
        finally:
            admin.close()
        with pytest.raises(BudgetExhausted):
            con.execute(by_region(2))
    assert tried == [None]  # sent once, then rolled back
    other = open_database(db)
    try:
        assert [e for _q, e in _charges(other)] == ["1/2"]
        pending = other.execute(
            "SELECT count(*) FROM sqlsdc.audit WHERE reason = ?", [CHARGED_PENDING]
        ).fetchone()
        assert pending == (0,)
    finally:
        other.close()
