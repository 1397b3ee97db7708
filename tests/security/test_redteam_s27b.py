"""Red-team round (b) of session 27 against a repeated DP query over public domains answered
from the user's cache without computing its exact cells (``dp_reuse._from_cache``, the key
types a connection keeps per opening), the nested use of a guarded connection
(``Connection._holding``) and the data version as count, XOR and sum of row hashes. Every
test asserts the SAFE outcome; each docstring tells what was tried. What succeeded, and was
closed here: data changed by another connection of the analyst's own process (an admin's, in
a server or a notebook) while the analyst's connection held the file open: the data versions
were kept for the whole opening, so the repeated query came back from the cache over changed
data, and a second analyst's held connection drew the first one's noise over the new exact
values (their difference was exact)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import test_redteam_s27 as s27
from test_dp_bounding_report import _document as report_document
from test_dp_query import dp_document, make_db
from test_redteam_s26 import _read

import sqlsdc
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import Error
from sqlsdc.guard.connection import Connection

TYPED_KEYS = s27.TYPED_KEYS
typed_db = s27.typed_db  # the fixture: persons with keys of every type, public tables of them

BY_REGION = "SELECT region, SUM(income) AS s, COUNT(*) AS n FROM persons GROUP BY region ORDER BY 1"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("s27b") / "dp.duckdb"
    make_db(path, dp_document())
    return path


@pytest.fixture
def db(pristine, tmp_path, copy_database) -> Path:
    return copy_database(pristine, tmp_path)


def _write(db, sql: str) -> None:
    """An admin's change, on a connection of this process (the analyst's may be open)."""
    raw = open_database(db)
    try:
        raw.execute(sql)
    finally:
        raw.close()


def _fresh(db, user: str, sql: str) -> list[tuple]:
    with sqlsdc.connect(db, user) as con:
        return con.execute(sql).fetchall()


def _cells(db, user: str) -> set[str]:
    rows = _read(db, "SELECT cell_hash FROM sqlsdc.dp_cells WHERE user_name = ?", [user])
    return {h for (h,) in rows}


def test_data_changed_in_the_same_process_is_not_answered_from_the_cache(db):
    """ana asks counts and sums by region, keeps her connection open; an admin of the same
    process (DuckDB shares one instance per file in a process, and the OS lock does not keep
    a process from itself) doubles incomes in N; ana asks again on the open connection. It
    came back from the cache: the old answer, which a fresh connection does not give. Safe:
    the held connection gives what a fresh one gives."""
    with sqlsdc.connect(db, "ana") as con:
        before = con.execute(BY_REGION).fetchall()
        _write(db, "UPDATE persons SET income = 90000 WHERE region = 'N'")
        again = con.execute(BY_REGION).fetchall()
    assert again != before
    assert again == _fresh(db, "ana", BY_REGION)


def test_a_writer_open_beside_the_analyst_is_seen_at_each_query(db):
    """The admin's connection of the process is opened first and kept open while ana asks,
    then writes, and ana asks again (no opening in between to notice). Safe: the repeated
    query gives what a fresh connection gives after the write."""
    raw = open_database(db)
    try:
        with sqlsdc.connect(db, "ana") as con:
            before = con.execute(BY_REGION).fetchall()
            raw.execute("UPDATE persons SET income = 90000 WHERE region = 'S'")
            again = con.execute(BY_REGION).fetchall()
    finally:
        raw.close()
    assert again != before
    assert again == _fresh(db, "ana", BY_REGION)


def test_a_held_connection_draws_no_old_noise_over_new_data(db):
    """bob opens a connection and asks anything of persons (his data version is read); ana
    asks counts by region; an admin of the process changes persons; bob asks ana's query on
    his held connection. His cells were named by the old version: ana's noise over the new
    exact values, so ana and bob together had the change exactly. Safe: new cells."""
    with sqlsdc.connect(db, "bob") as bob:
        bob.execute("SELECT COUNT(*) FROM persons WHERE age > 90").fetchall()
        _fresh(db, "ana", BY_REGION)
        _write(db, "INSERT INTO persons SELECT * REPLACE (pid + 100000 AS pid) FROM persons "
                   "WHERE region = 'S' LIMIT 50")  # fmt: skip
        bob.execute(BY_REGION).fetchall()
    assert _cells(db, "ana") and not _cells(db, "ana") & _cells(db, "bob")


def test_a_public_domain_changed_in_the_same_process_changes_the_grid(db):
    """Domains come from a public table; an admin of the process adds a code to it while
    ana's connection holds the file. Safe: the repeated query's rows are the new grid, the
    same as a fresh connection's."""
    sql = ("SELECT l.code, COUNT(*) FROM persons p JOIN lookup l ON p.region = l.code "
           "GROUP BY l.code ORDER BY 1")  # fmt: skip
    with sqlsdc.connect(db, "ana") as con:
        first = con.execute(sql).fetchall()
        _write(db, "INSERT INTO lookup VALUES ('E', 'east')")
        again = con.execute(sql).fetchall()
    assert [k for k, _n in first] == ["N", "S"]
    assert [k for k, _n in again] == ["E", "N", "S"]
    assert again == _fresh(db, "ana", sql)


def test_noise_turned_off_is_never_answered_from_the_cache(db):
    """The admin asks a query with noise (cached), then turns noise off on the same
    connection and asks it again. Safe: the exact bounded values, not the cached noise."""
    with sqlsdc.connect(db, "admin") as con:
        noisy = con.execute(BY_REGION).fetchall()
        con.execute(BY_REGION).fetchall()
        con.set_dp_noise(False)
        exact = con.execute(BY_REGION).fetchall()
    assert exact != noisy
    counts = dict(_read(db, "SELECT region, count(*) FROM persons GROUP BY region"))
    assert {k: n for k, _s, n in exact} == {"E": counts["E"], "N": counts["N"],
                                            "S": counts["S"], "W": 0}  # fmt: skip


def test_a_repeated_query_has_the_first_runs_schema_audit_and_values(db):
    """ana asks one query twice on one connection (the second from the cache), and in two
    phrasings with the same stage SQL. Safe: the same values and column types, each run
    audited, and one charge."""
    alias = "SELECT region AS r, SUM(income) AS s, COUNT(*) AS n FROM persons GROUP BY 1 ORDER BY 1"
    with sqlsdc.connect(db, "ana") as con:
        first = con.execute(BY_REGION)
        rows, kinds = first.fetchall(), [d[1] for d in first.description]
        for sql in (BY_REGION, alias):
            cur = con.execute(sql)
            assert cur.fetchall() == rows
            assert [d[1] for d in cur.description] == kinds
    audited = _read(db, "SELECT decision FROM sqlsdc.audit WHERE user_name = 'ana'")
    assert len(audited) == 3
    assert len(_read(db, "SELECT * FROM sqlsdc.budget_spend WHERE user_name = 'ana'")) == 1


def test_another_users_cache_answers_nothing(db):
    """ana asks; bob asks the same on his own connection. Safe: bob is charged for his cells
    (not served from ana's cache), and his cells are his."""
    _fresh(db, "ana", BY_REGION)
    _fresh(db, "bob", BY_REGION)
    spent = dict(_read(db, "SELECT user_name, count(*) FROM sqlsdc.budget_spend GROUP BY 1"))
    assert spent == {"ana": 1, "bob": 1}
    assert _cells(db, "bob")


def test_a_policy_applied_in_the_same_process_is_not_answered_from_the_old_cache(db, tmp_path):
    """``sqlsdc.admin.apply`` (same process) gives persons another granularity while ana's
    connection holds the file and has BY_REGION cached; she asks it again: all its cells are
    in the cache, so nothing is charged (the charge is where a held connection learned of a
    new policy). Safe: a refusal that names the new version, or the new policy's answer,
    never the old policy's cached cells."""
    import yaml

    document = dp_document()
    document["tables"]["persons"]["dp"]["granularity"] = 1000
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(document))
    with sqlsdc.connect(db, "ana") as con:
        before = con.execute(BY_REGION).fetchall()
        sqlsdc.admin.apply(db, policy, "admin")
        try:
            again = con.execute(BY_REGION).fetchall()
        except Error as refusal:
            assert "policy version 2" in str(refusal)
            again = con.execute(BY_REGION).fetchall()
    assert again != before
    assert all(s % 1000 == 0 for _k, s, _n in again)


def test_cached_answers_keep_the_bounding_report(tmp_path):
    """A repeated query answered from the cache: its cell accuracy (with the bounding
    report's dropped/clamped shares) must be what the first run gave, not missing."""
    path = tmp_path / "report.duckdb"
    make_db(path, report_document())
    sql = "SELECT region, SUM(income) FROM persons GROUP BY region ORDER BY 1"
    with sqlsdc.connect(path, "ana") as con:
        cur = con.execute(sql)
        rows, first = cur.fetchall(), cur.cell_accuracy()
        cur = con.execute(sql)
        assert cur.fetchall() == rows
        again = cur.cell_accuracy()
    assert list(again.columns) == list(first.columns)
    assert again.equals(first)


def test_nested_uses_release_the_file_and_never_close_under_the_outer_one(db):
    """Nested uses of one connection (the Spark path's), one of them failing, on four threads.
    Safe: the engine connection stays open under the outer use, the depth returns to zero,
    and the idle release then closes the engine connection (the file is not held forever)."""
    con = Connection(db, "ana", idle_release=0.05)
    try:
        con.execute(BY_REGION).fetchall()
        errors: list = []

        def nested() -> None:
            try:
                with con._holding() as outer:
                    with pytest.raises(ZeroDivisionError), con._holding():
                        1 / 0  # noqa: B018
                    outer.execute("SELECT 1").fetchall()  # still open
            except Exception as failure:  # noqa: BLE001
                errors.append(failure)

        threads = [threading.Thread(target=nested) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and con._depth == 0
        import time

        time.sleep(0.5)
        assert con._db is None  # released when idle
        assert con.execute(BY_REGION).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("n", range(len(TYPED_KEYS)), ids=list(TYPED_KEYS))
def test_a_cached_answer_has_the_key_types_of_the_first(typed_db, n):
    """Dates, timestamps, decimals, booleans, huge integers and strings as public-domain
    keys: the second run of a query on one connection is answered from the cache, its key
    column built from the domain's Python values and the key types kept from the first.
    Safe: the same rows and column types as the first run and as a fresh connection's."""
    sql = (f"SELECT l.code, COUNT(*) FROM persons p JOIN pub{n} l ON p.k{n} = l.code "
           "GROUP BY l.code ORDER BY l.code")  # fmt: skip
    with sqlsdc.connect(typed_db, "ana") as con:
        first = con.execute(sql)
        rows, kinds = first.fetchall(), [d[1] for d in first.description]
        again = con.execute(sql)
        assert again.fetchall() == rows
        assert [d[1] for d in again.description] == kinds
    with sqlsdc.connect(typed_db, "ana") as con:
        fresh = con.execute(sql)
        assert fresh.fetchall() == rows
        assert [d[1] for d in fresh.description] == kinds
