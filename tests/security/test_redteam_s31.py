"""Red-team round of session 31, with an analyst's connection only, on what changed that day:
window frames over protected cells, the statement timeout that stops the check between its
passes, and DuckDB's SQL of DATE_TRUNC over stored timestamps.

What succeeded, and was closed:

* the check overran the statement timeout by far, holding the database file: the timeout
  stops a check only between its passes, and within the analysis every constant was evaluated
  in the engine with the connection's *whole* timeout. ``WHERE age = 0+0 OR age = 1+1 OR ...``
  (6,000 constants, 110 KB) ran 8-10 s under a 1.5 s timeout (a 1 MB statement, minutes). A
  constant is now evaluated within the time left, and an evaluation the timeout or a cancel
  interrupted stops the statement instead of being cached as "raises an error" for the rest
  of the connection (:func:`sqlsdc.guard.context.guard_context`).
* a statement of a kilobyte kept the check busy for hours, or exhausted memory: CTEs built on
  themselves double at every step once inlined, and the later passes read them inlined.
  ``c1 AS (SELECT s || s AS s FROM c0)``, ``c2 AS (SELECT s || s AS s FROM c1)``... doubled the
  cell identity's expressions, DuckDB's plan and every row's string (20 steps: 100 s past a 60 s
  timeout; 24: the process was killed for memory, whether or not any row matched: the time
  also told how many rows matched), and ``c1 AS (SELECT a.* FROM c0 a JOIN c0 b ON a.pid =
  b.pid)``... doubled the readings of the table, whose protection proof
  (:func:`sqlsdc.guard.validate.validate_release`, after the last pass the timeout stops at)
  asked again per reading: 9 steps, 43 s; 12, hours. A query whose inlined size exceeds four
  times its written size (and 100,000 nodes or 256 table readings) is now refused before the
  planner (:mod:`sqlsdc.planner.inlining`), and the proof keeps its answer per CTE and per
  SELECT: a written join of 2,048 readings of a table took 73 s to prove, now 3 s.

What held:

* window frames (ROWS, RANGE, GROUPS, EXCLUDE) run over the lifted cells, after the group
  release and HAVING, so every row a frame reaches is a released row, and suppressed cells are
  NULLs (threshold, stored suppression patterns); their offsets must be literals; a frame's
  overflow (``RANGE BETWEEN 9223372036854775807 FOLLOWING`` over counts) fails on released
  values only; computed offsets in an outer query over cells see released rows only. Under DP
  a frame is post-processing: the charge is that of the cells (``test_a_dp_frame_costs_what
  _its_cells_cost``). Frames in ``WINDOW`` clauses are refused with the clause.
* DATE_TRUNC's NULL for the TIMESTAMP type's first year merges that year's rows with real NULLs
  into one cell: a different population, with a different record key (CKM) and a different
  identity (DP), so the split/merge is the differencing any CASE on a timestamp allows; the
  rendering is a function of the tree, so two spellings of one identity run the same SQL. The
  guard refuses DATE_TRUNC of an INTERVAL (``epoch_us`` of a large interval raises).

Observed, not fixed: the check cache is shared by the connections of a process, so a
statement another analyst checked recently is answered faster (a timing signal about other
users' statements, not about data). The engine's running time depends on the rows a
statement reads, as in any SQL engine; what bounds it is the statement timeout and, now, the
inlined size.
"""

from __future__ import annotations

import time

import pytest

import sqlsdc
from sqlsdc.errors import PolicyViolation, QueryCanceled


def chain(step: str, k: int) -> str:
    """``k`` CTEs, each built on the one before by ``step`` (``{p}`` names it)."""
    ctes = ["c0 AS (SELECT person_id, region, occupation AS s FROM persons WHERE age = 97)"]
    ctes += [f"c{i} AS ({step.format(p=f'c{i - 1}')})" for i in range(1, k + 1)]
    return (
        f"WITH {', '.join(ctes)} SELECT region, COUNT(*) FROM c{k} WHERE length(s) > 0 "
        "GROUP BY region"
    )


DOUBLED_STRING = "SELECT person_id, region, s || s AS s FROM {p}"
DOUBLED_READING = (
    "SELECT a.person_id, a.region, a.s FROM {p} AS a JOIN {p} AS b ON a.person_id = b.person_id"
)


def test_a_check_of_many_constants_stops_at_the_statement_timeout(ckm_db):
    constants = " OR ".join(f"age = {i} + {i}" for i in range(6000))
    sql = f"SELECT COUNT(*) FROM persons WHERE {constants}"
    with sqlsdc.connect(ckm_db, user="analyst", timeout=1.5) as con:
        started = time.monotonic()
        with pytest.raises(QueryCanceled, match="longer than the statement timeout"):
            con.execute(sql)
        assert time.monotonic() - started < 1.5 + 3.0  # was 8-10 s
        assert con.execute("SELECT COUNT(*) FROM persons WHERE age = 3 + 3").fetchall()


@pytest.mark.parametrize(
    ("step", "k"), [(DOUBLED_STRING, 12), (DOUBLED_READING, 9)], ids=["string", "reading"]
)
def test_a_cte_built_on_itself_is_refused_before_it_grows(ckm_db, step, k):
    with sqlsdc.connect(ckm_db, user="analyst", timeout=20) as con:
        with pytest.raises(PolicyViolation, match="too large once its CTEs"):
            con.execute(chain(step, k))
        assert con.execute(chain(step, 3)).fetchall() is not None  # a few steps: answered


def test_reading_a_cte_twice_and_a_column_twice_stays_answered(ckm):
    """Common shapes read a CTE or a derived column more than once."""
    sql = (
        "WITH p AS (SELECT region, CASE WHEN age < 18 THEN 'child' ELSE 'adult' END AS a "
        "FROM persons), q AS (SELECT region, a || '/' || a AS b FROM p) "
        "SELECT x.region, x.b, COUNT(*) FROM q AS x GROUP BY x.region, x.b "
        "UNION ALL SELECT region, a, COUNT(*) FROM p GROUP BY region, a"
    )
    assert len(ckm.execute(sql).fetchall()) == 32


def test_proving_a_join_of_many_readings_is_linear(ckm_db):
    """A join of 2,048 readings of one table was proved in 73 s (the proof walked every
    projection once per reading), past any timeout; explain runs the whole check."""
    joins = " ".join(
        f"JOIN persons AS p{i} ON p0.person_id = p{i}.person_id" for i in range(1, 2048)
    )
    sql = f"SELECT p0.region, COUNT(*) FROM persons AS p0 {joins} GROUP BY p0.region"
    with sqlsdc.connect(ckm_db, user="analyst", timeout=30) as con:
        with pytest.raises(sqlsdc.PolicyViolation, match="deeper than DuckDB's limit"):
            con.explain(sql)


def test_a_dp_frame_costs_what_its_cells_cost(tmp_path, ckm_db):
    """A frame over DP cells is post-processing: the cells' charge, nothing more."""
    import shutil

    path = tmp_path / "dp.duckdb"
    shutil.copy(ckm_db, path)
    where = "WHERE amount > 1717"  # a population no other test asks for
    cells = f"SELECT month, COUNT(*) AS n FROM benefits {where} GROUP BY month"
    framed = (
        "SELECT month, COUNT(*) AS n, AVG(COUNT(*)) OVER (ORDER BY month ROWS BETWEEN 2 "
        "PRECEDING AND CURRENT ROW) AS ma, SUM(COUNT(*)) OVER (ORDER BY COUNT(*) GROUPS "
        f"BETWEEN 1 PRECEDING AND 1 FOLLOWING EXCLUDE GROUP) AS s FROM benefits {where} "
        "GROUP BY month"
    )
    with sqlsdc.connect(path, user="analyst") as con:

        def spent():
            return [b.spent.epsilon for b in con.remaining_budget()]

        before = spent()
        framed_rows = con.execute(framed).fetchall()
        after_frame = spent()
        released = dict(con.execute(cells).fetchall())
        assert spent() == after_frame != before  # the cells, charged once
        counts = [released[m] for m in sorted(released)]
        for month, n, ma, _s in framed_rows:  # suppressed cells are NULLs, skipped by AVG
            window = [c for c in counts[max(0, month - 3) : month] if c is not None]
            mean = sum(window) / len(window) if window else None
            assert n == released[month] and ma == pytest.approx(mean)
