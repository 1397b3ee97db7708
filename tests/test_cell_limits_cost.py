"""What the policy's cell limits cost a guarded query (issue 18 must-have 5: the guard's fixed
cost per repeated CKM query), and that the shortcuts keep the limits' rules.

A repeated statement under a limit ran two more statements in the answer's transaction (the
query's cells read back from the ledger, then the look-up of their allowance entries): 7
engine calls per query instead of 5, 5.5–7.1 ms of guard overhead in CPU against 3.6–4.3 ms
without limits (``bench_guard.py --fixed-cost``, 100,000 persons). Now the cells come from the
ledger INSERT's own parameters, and what an opening saw committed (allowance entries, the
statements answered) is not asked again: a statement answered before whose cells were all
seen costs no statement (:class:`sqlsdc.catalog.cell_limits.Known`).
"""

from __future__ import annotations

import shutil

import duckdb
import pytest

import sqlsdc
from sqlsdc.catalog import cell_limits
from sqlsdc.catalog.cell_limits import CellLimitReached
from sqlsdc.demo.build import build_demo_database
from sqlsdc.engines import duckdb as engine
from tests.security.test_redteam_s49i import _limited  # the template with a policy's limits

REPEATED = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = tmp_path_factory.mktemp("s50a") / "demo.duckdb"
    build_demo_database(path, persons=2000, seed=50)
    return path


class _Recording:
    """An engine connection that keeps the text of every statement sent through it."""

    def __init__(self, con, sent):
        self._con, self._sent = con, sent

    def execute(self, sql, *args, **kwargs):
        self._sent.append(getattr(sql, "query", sql))
        return self._con.execute(sql, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._con, name)


@pytest.fixture
def sent(monkeypatch):
    texts: list[str] = []
    opened = engine.open_database
    monkeypatch.setattr(engine, "open_database",
                        lambda *a, **k: _Recording(opened(*a, **k), texts))  # fmt: skip
    return texts


LIMITS = [
    {"user": "analyst", "table": "persons", "cells": 5000, "per": "day"},
    {"user": "*", "table": "*", "cells": 50000, "per": "week"},
]


def test_a_repeated_query_costs_no_statement_of_the_limits(template, tmp_path, sent):
    """Fails on main: the third run of the query read the ledger and the allowance (7 engine
    calls: BEGIN, audit, ledger, cells, look-up, COMMIT; the protected SQL is streamed)."""
    db = _limited(template, tmp_path, LIMITS)
    with sqlsdc.connect(db, user="analyst") as con:
        first = con.execute(REPEATED).fetchall()
        assert con.execute(REPEATED).fetchall() == first
        sent.clear()
        assert con.execute(REPEATED).fetchall() == first
    assert [s for s in sent if "cell_allowance" in s or "FROM sqlsdc.ledger" in s] == []
    assert sum(s.startswith("COMMIT") for s in sent) == 1
    usage = sqlsdc.admin.cell_limit_usage(db, "admin", who="analyst")
    used = {(r.user_name, r.per): r.used for r in usage.itertuples()}
    assert used == {("analyst", "day"): len(first), ("*", "week"): len(first)}


def test_a_new_query_reads_no_cells_back_from_the_ledger(template, tmp_path, sent):
    """The cells come from the ledger INSERT's parameters; counted as before."""
    db = _limited(template, tmp_path, LIMITS)
    with sqlsdc.connect(db, user="analyst") as con:
        con.execute(REPEATED).fetchall()
        sent.clear()
        rows = con.execute("SELECT sex, COUNT(*), SUM(income) FROM persons GROUP BY sex").fetchall()
    assert [s for s in sent if "FROM sqlsdc.ledger" in s] == []
    usage = sqlsdc.admin.cell_limit_usage(db, "admin", who="analyst")
    used = {(r.user_name, r.per): r.used for r in usage.itertuples()}
    assert len(rows) == 2 and used[("analyst", "day")] == 8 + 2 * 2


def test_known_cells_of_a_statement_never_answered_are_refused_after_the_end(template, tmp_path):
    """A period ended by a refusal on another connection: a statement of cells this opening
    knows, never answered so, is refused all the same; one answered before is answered."""
    db = _limited(template, tmp_path, [{"user": "analyst", "table": "persons", "cells": 9}])
    with sqlsdc.connect(db, user="analyst") as a, sqlsdc.connect(db, user="analyst") as b:
        shown = a.execute("SELECT sex, COUNT(*) FROM persons GROUP BY sex").fetchall()
        assert a.execute("SELECT sex, COUNT(*) FROM persons GROUP BY sex").fetchall() == shown
        with pytest.raises(CellLimitReached):
            b.execute("SELECT region, COUNT(*) FROM persons GROUP BY region").fetchall()
        with pytest.raises(CellLimitReached, match="ended with a refused query"):
            a.execute("SELECT COUNT(*), sex FROM persons GROUP BY sex").fetchall()
        assert a.execute("SELECT sex, COUNT(*) FROM persons GROUP BY sex").fetchall() == shown
    usage = sqlsdc.admin.cell_limit_usage(db, "admin", who="analyst")
    assert [(r.used, r.ended) for r in usage.itertuples()] == [(2, True)]


def test_cell_keys_written_from_python_are_those_duckdb_writes(template, tmp_path):
    """The allowance keys of :func:`cell_limits._cells` from the ledger rows as written equal
    those DuckDB computes from the ledger (non-ASCII text, separators, DP rows left out)."""
    path = tmp_path / "keys.duckdb"
    shutil.copy(template, path)
    con = duckdb.connect(str(path))
    rows = [
        ('{"tables":["persons"],"keys":{"m":"Žilina, é"}}', "n", "ckm"),
        ('{"tables":["persons"],"keys":{"m":"a\\u001fb"}}', "COUNT(*)", "ckm"),
        ('{"tables":["persons"],"keys":{"m":"Ω"}}', "s", "threshold"),
        ('{"tables":["persons"],"keys":{"m":"Ω"}}', "s", "threshold"),
        ('{"tables":["persons"],"keys":{"m":"x"}}', "d", "dp"),
    ]
    for cell, column, mechanism in rows:
        con.execute("INSERT INTO sqlsdc.ledger VALUES (987654, now(), 'ü', 'f', ?, ?, ?, "
                    "'published')", [cell, column, mechanism])  # fmt: skip
    names = ["households", "persons"]
    versions = ["0f1e", "é\u001f2"]  # a table's data version, hashed into its keys
    read = cell_limits._cells(con, "ü", names, versions, 987654, None)
    given = cell_limits._cells(con, "ü", names, versions, 987654, rows)
    con.close()
    assert len(given) == 3 * 2
    assert sorted(read) == sorted(given)
