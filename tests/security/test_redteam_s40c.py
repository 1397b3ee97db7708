"""Red team s40c: differential privacy (budget, bounding, partition selection, Spark).

Found (fixed here): **two threads answering on one Spark engine read each other's DP cells.**
The noisy cells of a query are registered as session views named by their stage's position
(``__sqlsdc_dp_cells_0``), the same in every query, and a guarded answer then runs over them.
With ana and bob asking on one engine from two threads (the same shape, other populations:
``v < 3`` and ``v >= 3``), bob registered his cells between ana's registration and her
answer: one run of 15 + 15 queries gave bob ana's cells once (his answer ``(-1758, 1010,
7515)``, his own cells ``(-70, -754, 1633)``: another user's release for his own charge,
recorded in the ledger as his), and with other shapes an answer failed after its charge.
Registering the cells and answering over them now take the engine's turn together
(``SparkEngine.answering``, ``guard.spark._answer``).

Found (fixed here): **a function registered in the session under the name of the engine's
hash.** The bounding's keyed choices call ``sqlsdc_duckdb_hash``, registered once when the
engine is made; a constant registered under that name afterwards tied every group of every
unit, so all of them were kept, under the identity and noise of DuckDB's capped cells: bob's
Spark answer minus ana's DuckDB answer of ``SELECT k, COUNT(*) ... GROUP BY k`` (three groups
per unit, max_groups 1) was (200, 57, 153), exactly the rows the cap drops per cell. The
engine registers its hash again before every tree that hashes.

Found (fixed here): **a Spark view replaced after ``load_duckdb`` released other rows under the
noise of the DuckDB cells.** The Spark engine names a DP cell by the DuckDB data version it
recorded when ``load_duckdb`` copied the table, but Spark reads whatever the view of that name
holds when the stage runs. A view replaced in the session afterwards (``createOrReplaceTempView``
of the copy less one person's rows) or a Parquet copy rewritten on disk was computed under the
copy's version, so under the same noise as the DuckDB cells: ana's DuckDB answer minus bob's
Spark answer of ``SELECT k, COUNT(*) FROM events GROUP BY k`` was (10, 0, 0), exactly the rows
of person 0 in each cell, at the price of one query each (ε = 1/10). The Spark answer was also
cached and recorded in the ledger as the release of the DuckDB cells. The engine now checks,
before the charge, that the view is still the copy it made (its plan's semantic hash, its
files' sizes and modification times: ``SparkEngine.data_version``), and refuses otherwise.

The last two need code in the engine's Spark session, which has read the copy; they matter
where a session serves analysts who send SQL only, or is shared with other code, as the
session settings red team s36e pinned do.

What held (tried, no test added):

- Budget under concurrency: 3 processes x 4 threads x 15 distinct DP queries of ε = 0.2 each
  (COUNT and the min_frequency unit count) against a limit of 10: 50 answered, 130 refused,
  10 spent, never more. Two names for one user (``Analyst``, ``analyst ``) are not users.
- Cell identity: 2,700 random conditions (5 atoms, AND/OR/NOT, depth up to 8, with and
  without parentheses) gave 1,585 populations and no two conditions of different truth tables
  shared one; literal spellings (``1_000``, ``.5``, ``5.``, ``0x10``) read as DuckDB reads them;
  ``CONCAT`` and ``||``, ``IFNULL``/``COALESCE``, ``SUBSTR``/``SUBSTRING`` keep their own names
  or the same meaning; parameters ``1``, ``'1'``, ``1.0`` and ``1.5`` are separate cells; CTEs
  shadowing tables, repeated output names, ``SUM(DISTINCT)`` and friends are refused; a
  released synthetic table read in a subquery is in the cells' data versions.
- Sensitivity: VALUES, UNION, CROSS JOIN, ``range``, ``unnest``, LATERAL, correlated
  subqueries, outer joins preserving a public table and joins on non-unique keys are refused
  before they can repeat a unit's rows; measures cannot be group keys.
- Before the charge: the private key-type probe (the stage's SQL under ``LIMIT 0``) is an
  empty-result plan in DuckDB, 12-16 ms whether the population has 19,479 rows or none (the
  stage itself 105 ms against 9-19 ms).
- Partition selection: the optimal rule's closed form is below its recurrence and satisfies
  both (ε, δ) inequalities for 54 (ε, δ) pairs up to n = 5,000; the samplers follow CKS20
  Algorithms 1-3 line by line.
- Spark: 14 DP queries (private groups with ``max_rows_per_unit`` and the bounding report;
  public domains with granularity 1/2, negative bounds, a public join, quantiles, AVG, VAR,
  STDDEV, COUNT(DISTINCT)) gave DuckDB's values, types, ledger rows and spend.

Noticed, not changed: permute-and-flip's running time grows with the visits before a
candidate is accepted, which depends on the scores: over [0, 3000] at ε = 1/5, one visit for
cells of up to 120 rows, a median of 10 at 1,200 rows and 121 at 12,000 (0.3 against 1.2 ms
of CPU). It tells a cell's scale, not a person: a lone unit's scores move each acceptance
probability by at most a factor exp(ε/2).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from spark_events import events_policy, events_sql
from spark_session import local_session, skip_without_jdk
from sqlglot import exp

import sqlsdc
from sqlsdc.errors import NotSupportedError

pytest.importorskip("pyspark.errors", reason="the Spark tests need the spark extra")
skip_without_jdk()

from sqlsdc.engines.spark import SparkEngine, view_name  # noqa: E402
from sqlsdc.guard.spark import run_protected  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.slow,  # a JVM of its own (~13 s of CPU to start and warm); CI runs it
]

EVENTS = events_sql(7)
POLICY = events_policy(7, ("ana", "bob", "carol", "dan"))
COUNTS = "SELECT k, COUNT(*) AS n FROM events GROUP BY k ORDER BY k"


@pytest.fixture(scope="module")
def spark():
    session = local_session("sqlsdc-redteam-s40c")
    yield session
    session.stop()


@pytest.fixture()
def events(tmp_path) -> Path:
    path = tmp_path / "events.duckdb"
    raw = duckdb.connect(str(path))
    raw.execute(EVENTS)
    raw.close()
    sqlsdc.init(path, POLICY)
    return path


def answer(path: Path, user: str, engine: SparkEngine | None = None) -> list[tuple]:
    with sqlsdc.connect(path, user) as con:
        if engine is None:
            return con.execute(COUNTS).fetchall()
        return [tuple(row.values()) for row in run_protected(con, engine, COUNTS).to_pylist()]


def spent(path: Path, user: str) -> list[tuple]:
    raw = duckdb.connect(str(path), read_only=True)
    try:
        return raw.execute(
            "SELECT epsilon, cells FROM sqlsdc.budget_spend WHERE user_name = ? ORDER BY seq",
            [user],
        ).fetchall()
    finally:
        raw.close()


def test_a_view_replaced_after_load_is_refused_before_the_charge(spark, events):
    engine = SparkEngine(spark)
    try:
        engine.load_duckdb(events, ["events"])
        duck = answer(events, "ana")
        assert answer(events, "carol", engine) == duck  # the copy: DuckDB's cells and noise
        view = view_name("events")
        spark.table(view).filter("pid <> 0").createOrReplaceTempView(view)  # one person fewer
        with pytest.raises(NotSupportedError, match="no longer the copy"):
            answer(events, "bob", engine)  # was ana's cells less person 0's rows, exactly
        assert spent(events, "bob") == []
        engine.load_duckdb(events, ["events"])  # copied again: answered again
        assert answer(events, "bob", engine) == duck
    finally:
        engine.close()


def test_a_parquet_copy_rewritten_after_load_is_refused_before_the_charge(spark, events, tmp_path):
    engine = SparkEngine(spark)
    try:
        engine.load_duckdb(events, ["events"])
        (url,) = spark.table(view_name("events")).inputFiles()
        copy = Path(url.removeprefix("file://"))
        fewer = tmp_path / "fewer.parquet"
        with duckdb.connect() as raw:
            raw.execute(f"COPY (SELECT * FROM read_parquet('{copy}') WHERE pid <> 0) TO '{fewer}'")
        os.replace(fewer, copy)
        with pytest.raises(NotSupportedError, match="no longer the copy"):
            answer(events, "dan", engine)
        assert spent(events, "dan") == []
    finally:
        engine.close()


class Interleaving(SparkEngine):
    """The engine with one interleaving of two threads forced, as a scheduler may make it:
    ana's answer runs once bob has registered his cells, or is waiting for his turn to."""

    def __init__(self, session):
        super().__init__(session)
        self.ana_answers, self.bob_ready = threading.Event(), threading.Event()
        self.answering = _Turn(self.answering, self.bob_ready)

    def register_cells(self, name, cells):
        super().register_cells(name, cells)
        if threading.current_thread().name == "bob":
            self.bob_ready.set()

    def run_exact(self, tree, **caps):
        answer = any(t.name.startswith("__sqlsdc_dp_cells_") for t in tree.find_all(exp.Table))
        if answer and threading.current_thread().name == "ana":
            self.ana_answers.set()
            self.bob_ready.wait(60)
        return super().run_exact(tree, **caps)


class _Turn:
    """The engine's lock, noting when bob starts waiting for it."""

    def __init__(self, lock, waiting: threading.Event):
        self.lock, self.waiting = lock, waiting

    def __enter__(self):
        if threading.current_thread().name == "bob":
            self.waiting.set()
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()


PARTS = {
    "ana": "SELECT k, COUNT(*) AS n FROM events WHERE v < 3 GROUP BY k",
    "bob": "SELECT k, COUNT(*) AS n FROM events WHERE v >= 3 GROUP BY k",
}


def test_two_threads_on_one_engine_are_each_answered_over_their_own_cells(spark, events):
    own = {}
    for user, sql in PARTS.items():  # each user's cells, cached for them on DuckDB
        with sqlsdc.connect(events, user) as con:
            own[user] = sorted(con.execute(sql).fetchall())
    engine = Interleaving(spark)
    got: dict[str, object] = {}

    def ask(user: str) -> None:
        if user == "bob":
            engine.ana_answers.wait(60)
        with sqlsdc.connect(events, user) as con:
            try:
                got[user] = sorted(tuple(r.values()) for r in
                                   run_protected(con, engine, PARTS[user]).to_pylist())  # fmt: skip
            except Exception as e:  # noqa: BLE001 - the failure is the test's outcome
                got[user] = e

    try:
        engine.load_duckdb(events, ["events"])
        threads = [threading.Thread(target=ask, args=(u,), name=u) for u in PARTS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert got == own  # ana's answer was bob's cells
    finally:
        engine.close()


def test_a_function_registered_under_the_hash_s_name_does_not_choose_the_rows(spark, events):
    from pyspark.sql.functions import arrow_udf

    from sqlsdc.engines.spark import HASH_UDF

    by_v = "SELECT v, COUNT(*) AS n FROM events GROUP BY v"  # a unit's rows in several groups
    with sqlsdc.connect(events, "ana") as con:
        duck = sorted(con.execute(by_v).fetchall())
    engine = SparkEngine(spark)
    try:
        engine.load_duckdb(events, ["events"])
        constant = arrow_udf(
            lambda s: pa.array([0] * len(s), pa.decimal128(20, 0)), "decimal(20,0)"
        )
        spark.udf.register(HASH_UDF, constant)  # every group of every unit tied: all kept
        with sqlsdc.connect(events, "bob") as con:
            answer = sorted(tuple(r.values()) for r in run_protected(con, engine, by_v).to_pylist())
        assert answer == duck  # was DuckDB's cells plus the rows max_groups drops, exactly
    finally:
        engine.close()
