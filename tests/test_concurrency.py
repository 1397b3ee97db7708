"""Many users on one database: threads sharing or opening connections, concurrent DP charges.

Every failure a thread sees must be sqlsdc's own error (never a raw engine exception), and after
any number of concurrent DP queries the spend ledger and the budgets agree and stay within the
limits.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from fractions import Fraction

import cli_fork
import dp_persons
import duckdb
import numpy as np
import pandas as pd
import pytest

import sqlsdc
from sqlsdc.catalog import budget, budget_admin
from sqlsdc.engines.duckdb import open_database
from sqlsdc.engines.waiters import others_waiting
from sqlsdc.errors import BudgetExhausted

THREADS = 16
LIMIT = Fraction(5)  # the analyst's epsilon: ten COUNT queries at 1/2


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """The DP persons database, built once for the module: each test changes a copy."""
    path = tmp_path_factory.mktemp("concurrency") / "dp.duckdb"
    rng = np.random.default_rng(3)
    persons = pd.DataFrame({"pid": np.arange(2000), "region": rng.choice(list("NSEW"), 2000),
                            "age": rng.integers(0, 100, 2000)})  # fmt: skip
    con = duckdb.connect(str(path))
    con.register("frame", persons)
    con.execute("CREATE TABLE persons AS SELECT * FROM frame")
    con.close()
    sqlsdc.init(path, dp_persons.document(LIMIT))
    return path


@pytest.fixture
def dp_db(template, tmp_path):
    path = tmp_path / template.name
    shutil.copy(template, path)
    return path


def run_threads(target, n: int = THREADS) -> list[BaseException]:
    """Run ``target(i)`` in ``n`` threads started together; the exceptions they raised."""
    failures: list[BaseException] = []
    start = threading.Barrier(n)

    def work(i: int) -> None:
        start.wait()
        try:
            target(i)
        except BaseException as error:  # noqa: BLE001 - collected and asserted by the test
            failures.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failures


def ledger_epsilon(path) -> Fraction:
    con = open_database(path, read_only=True)
    try:
        return sum((Fraction(r["epsilon"]) for r in budget_admin.spend_ledger(con, limit=10_000)),
                   Fraction(0))  # fmt: skip
    finally:
        con.close()


def query(i: int) -> str:
    return f"SELECT region, COUNT(*) FROM persons WHERE age >= {i} GROUP BY region"


@pytest.mark.parametrize("threads", [8, 16])
def test_connections_opened_from_many_threads_at_once_all_work(dp_db, threads):
    def open_and_query(i: int) -> None:
        with sqlsdc.connect(dp_db, "admin") as con:
            con.set_dp_noise(False)
            assert len(con.execute(query(i)).fetchall()) == 4

    assert run_threads(open_and_query, threads) == []


def test_one_connection_shared_by_threads_runs_their_queries_one_by_one(dp_db):
    con = sqlsdc.connect(dp_db, "ana")
    try:
        failures = run_threads(lambda i: con.execute(query(i % 8)).fetchall())
        spent = {s.key: s.spent.epsilon for s in con.remaining_budget()}
    finally:
        con.close()
    assert failures == []  # 8 distinct queries (4 of epsilon): repeats are free from the cache
    assert spent[budget.BudgetKey("ana")] == Fraction(4) == ledger_epsilon(dp_db)


def test_concurrent_dp_queries_serialise_and_never_exceed_the_budget(dp_db):
    def own_connection(i: int) -> None:
        with sqlsdc.connect(dp_db, "ana") as con:
            con.execute(query(i)).fetchall()

    failures = run_threads(own_connection)
    assert all(isinstance(f, BudgetExhausted) for f in failures), failures
    assert len(failures) == THREADS - 10  # exactly ten queries of 1/2 fit in 5
    with sqlsdc.connect(dp_db, "ana") as con:
        (status,) = [s for s in con.remaining_budget() if s.key == budget.BudgetKey("ana")]
    assert status.spent.epsilon == LIMIT == ledger_epsilon(dp_db)
    assert status.remaining.epsilon == 0


def test_a_busy_holder_yields_the_file_only_to_live_waiters_of_other_processes(tmp_path):
    db = tmp_path / "x.duckdb"
    folder = tmp_path / "x.duckdb.waiting"
    assert not others_waiting(db)  # nobody ever waited
    folder.mkdir()
    (folder / str(os.getpid())).touch()
    assert not others_waiting(db)  # this process's own threads do not wait on the file
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (folder / str(sleeper.pid)).touch()
        assert others_waiting(db)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not others_waiting(db)  # a waiter killed while waiting is not waited for


def test_the_same_new_cells_asked_at_once_are_cached_once_with_one_answer(dp_db):
    """Threads of one user ask the same new cells at once: each caches them with its answer,
    and a thread that meets a cell another cached first runs its answer's transaction again
    (no error, and every thread sees the same noisy cells)."""
    answers: list[list] = []

    def own_connection(i: int) -> None:
        with sqlsdc.connect(dp_db, "ana") as con:
            answers.append(sorted(con.execute(query(30)).fetchall()))

    assert run_threads(own_connection) == []
    assert len(answers) == THREADS and all(a == answers[0] for a in answers)
    con = open_database(dp_db, read_only=True)
    try:
        entries = con.execute(
            "SELECT count(*), count(DISTINCT entry) FROM sqlsdc.dp_cells WHERE user_name = 'ana'"
        ).fetchone()
    finally:
        con.close()
    assert entries[0] == entries[1] > 0


ANALYST = """
import sys
import sqlsdc
with sqlsdc.connect(sys.argv[1], "ana") as con:
    con.execute(sys.argv[2]).fetchall()
"""


def test_an_admin_command_waiting_for_the_file_goes_before_analysts(dp_db, tmp_path):
    """While the file is held, an admin command (`sqlsdc audit`) and an analyst's process wait
    for it; when it is let go the admin goes first, whichever polls first: the audit it lists
    does not hold the analyst's query. Before, every turn went to whichever waiter took the
    free lock first, and under 16 busy analysts an admin waited about 19 s for its turn
    (benchmarks/load_test.py)."""
    folder = tmp_path / "dp.duckdb.waiting"
    sql = query(42)

    def waiting(marker: str, *processes: subprocess.Popen) -> None:
        for _ in range(2400):  # the process has marked itself as waiting for the file
            if folder.is_dir() and marker in {p.name for p in folder.iterdir()}:
                return
            assert all(p.poll() is None for p in processes), "a waiter ended"
            threading.Event().wait(0.05)
        raise AssertionError(f"{marker} is not waiting: {list(folder.iterdir())}")

    holder = open_database(dp_db)  # this process holds the file
    try:  # the admin first: the analyst's opening lets it go first from its own start on
        admin = cli_fork.popen(["audit", dp_db, "--format", "json"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
        waiting(f"{admin.pid}.first", admin)
        analyst = cli_fork.popen([dp_db, sql], code=ANALYST, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)  # fmt: skip
        waiting(f"{analyst.pid}", admin, analyst)
    finally:
        holder.close()
    listed, errors = admin.stdout.read(), admin.stderr.read()  # to the end: both exited
    analyst_errors = analyst.stderr.read()
    admin.wait(120)
    analyst.wait(120)
    assert admin.returncode == 0 and analyst.returncode == 0, errors + analyst_errors
    assert sql not in listed  # the admin read the file before the analyst's query was run
    con = open_database(dp_db, read_only=True)
    try:
        assert con.execute("SELECT decision FROM sqlsdc.audit WHERE sql_text = ?",
                           [sql]).fetchall() == [("accepted",)]  # fmt: skip
    finally:
        con.close()


def test_an_analyst_waiting_long_goes_first_like_an_admin(dp_db, tmp_path, monkeypatch):
    """A guarded connection's opening that has waited :data:`FIRST_SECONDS` marks itself as
    going first, as an admin command does, so that busy holders let the file go after their
    statement and fresh openings let it in: every turn went to whichever waiter polled first,
    and under 16 busy processes some analysts waited the whole 60 s and failed (red team
    s37). It is let in first when the file is let go."""
    from sqlsdc.engines import duckdb as engine

    monkeypatch.setattr(engine, "FIRST_SECONDS", 0.3)
    folder = tmp_path / "dp.duckdb.waiting"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from sqlsdc.engines.duckdb import open_database; "
         f"con = open_database({str(dp_db)!r}); print('open', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    opened: list = []
    try:
        assert holder.stdout.readline().strip() == "open"
        waiter = threading.Thread(target=lambda: opened.append(
            open_database(dp_db, wait=30, writes_data=False, first=False)))  # fmt: skip
        waiter.start()
        for _ in range(200):
            if folder.is_dir() and f"{os.getpid()}.first" in {p.name for p in folder.iterdir()}:
                break
            threading.Event().wait(0.05)
        else:
            raise AssertionError(f"not marked as going first: {list(folder.iterdir())}")
        assert others_waiting(dp_db, first=True) is False  # its own mark, not another's
    finally:
        holder.stdin.close()
        holder.wait(30)
    waiter.join(30)
    assert len(opened) == 1
    opened[0].close()
    assert not folder.exists() or not list(folder.iterdir())
