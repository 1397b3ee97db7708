"""Red team s50g: DuckDB's own SQL surface, and what sqlglot's DuckDB generator writes for it.

Found, fixed here:

- ``CEIL(x, n)`` and ``FLOOR(x, n)`` (a precision: sqlglot reads DuckDB's ``CEIL``/``FLOOR`` with a
  second argument, which DuckDB itself does not take, as ``Ceil(decimals=n)``) were checked as
  one-value functions: the precision was not a literal argument as ROUND's is. sqlglot's DuckDB
  generator writes the call as ``ROUND(CEIL(x * POWER(10, CAST(n AS INT))) / POWER(10, CAST(n AS
  INT)), n)``, casting a precision not typed as an integer to INT: a cast the guard never saw,
  which fails for a DOUBLE out of INT's range. ``WHERE CEIL(CAST(1.5 AS DOUBLE), CASE WHEN
  <one person's quasi-identifiers> AND age = 39 THEN 1e10 ELSE 1 END) > 0`` failed in the engine
  exactly when that person is 39: an error oracle. On the 20,000-person demo, the 5 first persons
  alone in their (municipality, sex, occupation) had their exact age told, 5 of 5, by 32
  queries of ``age >= k`` in all (bisection; 196 by trying each age), 1.6 s of CPU a person.
  Now the precision must be a small integer literal, as ROUND's; all 32 are refused.
- DuckDB's ``COUNT()`` (no argument: its count of rows) over confidential rows was an internal
  error ("a bug in sqlsdc"); now refused, naming ``COUNT(*)``. Not data-dependent (no oracle).
- under cell limits (the shipped demo policy has them), a statement whose CTE the guard keeps
  rather than inlines (``WITH r(a) AS ...``, ``WITH r AS MATERIALIZED ...``) always failed in
  the engine: the statement counting a frame's hidden groups copied the statement's WITH from
  sqlglot's old key ``with`` (now ``with_``), so it read a CTE it did not define. Not
  data-dependent (a catalog error at bind); now answered and charged.
- a process that left a guarded connection open and ended while the watchdog's idle release
  (one second after the last statement) was closing the engine connection aborted with
  SIGABRT (exit 134): 11 of 12 runs of query, ``sleep(1.0)``, exit. Not a leak; the
  interpreter now waits at exit for the watchdog's running action.

Held (tried against the guarded connection as ``analyst``; refused with a clear message or
answered with protected aggregates only): FROM-first SELECT, GROUP BY ALL / ORDER BY ALL
(expanded by the guard), QUALIFY, FILTER (WHERE), USING SAMPLE, UNION BY NAME, POSITIONAL and
ASOF joins, LATERAL, table column aliases ``persons AS p(a, b)``, the row as a column
(``SELECT p ... FROM persons p``), ``COUNT(p.*)``, ``COLUMNS(...)`` and its lambda, ``try()``,
``regexp_*``, string slices ``region[1:2]``, ``#n`` positional columns, select aliases read in
GROUP BY (``region AS age ... GROUP BY age`` binds the column, as DuckDB does), CUBE / ROLLUP /
GROUPING SETS (refused under DP, every cell protected under CKM), window frames with EXCLUDE
(over protected cells), ORDER BY a hidden SUM (ordered by the protected value); about 50
error-oracle shapes: casts, exact arithmetic and negation, ``//`` and ``%`` with computed
divisors, COALESCE / GREATEST / NULLIF / CASE / IN mixing a number column with text literals,
LN / LOG / SQRT / POW / EXP of exact and DOUBLE values, computed ROUND / SUBSTRING / STRFTIME /
DATE_TRUNC / INTERVAL arguments, INTERVAL times a value, exotic cast targets (lists, STRUCT,
ENUM, BIT, UUID, JSON, BLOB); 30 DuckDB aggregates (bool_*, count_if, fsum, product, entropy,
arg_min/max, approx_*, weighted_avg ...); scalar subqueries that may return several rows
(GROUP BY, GROUP BY ALL, UNION ALL: refused, or failing on protected cells only); CTEs
shadowing tables in any case or scope; NATURAL JOIN and USING (expanded on declared columns,
never the hidden ``__rkey``); tuple and SYMMETRIC comparisons of measures; LIMIT n%, FETCH
WITH TIES; comments holding ``*/`` (the generator breaks them up); DuckDB-only literals
(``0x10``, ``1_000``, ``$$...$$``, ``e'...'``: read by sqlglot as what it then writes, so the
engine runs what was checked). Every DuckDB function sqlglot reads into a node the guard
allows (60 of DuckDB's 1,010 function names, by 1-3 arguments) was listed and the SQL written
for it read: ``CEIL``/``FLOOR`` with a precision was the one that wrote an operation the guard
had not seen (now a guard rail, :func:`test_sqlglot_writes_no_cast_the_guard_did_not_see`).
"""

from __future__ import annotations

import shutil

import duckdb
import pytest
import sqlglot
from sqlglot import exp
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify

import sqlsdc
from sqlsdc.catalog.cell_limits import CellLimitReached
from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.engines.duckdb_sql import to_sql
from sqlsdc.errors import PolicyViolation
from sqlsdc.planner.allowlist import ALLOWED
from sqlsdc.planner.signatures import SIGNATURES, literal_refusal
from sqlsdc.policy import load_policy

# One person in the demo data (seed 7, 20,000 persons): the only one with these values.
TARGET = "municipality = 'R08-M018' AND sex = 'F' AND occupation = 'craft_trades'"


def _precision(function: str, condition: str) -> str:
    return (
        f"SELECT region, COUNT(*) FROM persons WHERE {function}(CAST(1.5 AS DOUBLE), "
        f"CASE WHEN {condition} THEN 1e10 ELSE 1 END) > 0 GROUP BY region"
    )


@pytest.mark.parametrize("function", ["CEIL", "FLOOR", "CEILING"])
def test_a_computed_precision_of_ceil_or_floor_is_refused(demo_db, function):
    """Old: answered when no row meets the condition, failed in the engine when one does (the
    generator's ``CAST(<precision> AS INT)`` of 1e10): ``age >= 200`` answered, ``age >= 22``
    failed. Now both are refused before anything runs, saying the precision must be a
    literal."""
    with sqlsdc.connect(demo_db, user="analyst") as con:
        for condition in ("age >= 200", "age >= 22", f"{TARGET} AND age = 41"):
            with pytest.raises(PolicyViolation, match="precision of (CEIL|FLOOR) must be"):
                con.execute(_precision(function, condition)).fetchall()


def test_a_literal_precision_of_ceil_or_floor_is_answered(demo_db):
    """The legitimate use keeps working: a whole-number literal precision (as ROUND's)."""
    sql = "SELECT FLOOR(CAST(age AS DOUBLE), -1) AS decade, COUNT(*) FROM persons GROUP BY decade"
    with sqlsdc.connect(demo_db, user="analyst") as con:
        decades = [row[0] for row in con.execute(sql).fetchall()]
    assert decades[:3] == [0.0, 10.0, 20.0]
    with sqlsdc.connect(demo_db, user="analyst") as con:
        with pytest.raises(PolicyViolation, match="precision of CEIL"):
            con.execute("SELECT COUNT(*) FROM persons WHERE CEIL(CAST(age AS DOUBLE), 1.5) > 1")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT region, COUNT() FROM persons GROUP BY region",
        "SELECT COUNT(*) FROM (SELECT region, COUNT() AS c FROM persons GROUP BY region) AS t",
        "SELECT scheme, COUNT() FROM benefits GROUP BY scheme",
    ],
)
def test_count_without_an_argument_is_refused_with_a_hint(demo_db, sql):
    """DuckDB's ``COUNT()`` (its count of rows; sqlglot keeps no argument) failed the guard as
    an internal error ("AttributeError ... this is a bug in sqlsdc"); now it is refused,
    naming ``COUNT(*)``. Over a public table it stays answered."""
    with sqlsdc.connect(demo_db, user="analyst") as con:
        with pytest.raises(PolicyViolation, match=r"COUNT\(\) without an argument.*COUNT\(\*\)"):
            con.execute(sql)
        assert con.execute("SELECT COUNT() FROM regions").fetchall() == [(8,)]


_TYPED = {"i": "INT", "d": "DOUBLE", "m": "DECIMAL(10, 2)", "s": "VARCHAR", "ts": "TIMESTAMP"}
_WRITTEN_CASTS_ALLOWED = {"TEXT", "VARCHAR"}  # a cast to text is total (UPPER(i) writes one)


def _new_casts(sql: str) -> list[str]:
    """The casts the SQL sqlglot writes for ``sql`` holds and its parse does not, to a type
    other than text, when every argument the guard requires to be a literal is one."""
    schema = {"t": _TYPED}
    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.ParseError:
        return []
    if any(not isinstance(n, ALLOWED) for n in tree.walk()):
        return []  # refused by the allowlist
    if any(isinstance(n, exp.Func) and type(n) not in SIGNATURES for n in tree.walk()):
        return []  # refused on confidential rows (e.g. APPROX_QUANTILE, a Quantile subclass)
    if any(type(n) in SIGNATURES and literal_refusal(n, lambda _: None) for n in tree.walk()):
        return []  # refused: an argument that must be a literal is not one
    try:
        tree = annotate_types(qualify(tree, schema=schema, dialect="duckdb"), schema=schema)
        written = sqlglot.parse_one(to_sql(tree), read="duckdb")
    except sqlglot.errors.SqlglotError:
        return []
    had = {n.to.sql("duckdb") for n in tree.find_all(exp.Cast)}
    return [
        c.sql("duckdb")
        for c in written.find_all(exp.Cast)
        if c.to.sql("duckdb") not in had | _WRITTEN_CASTS_ALLOWED
        and not c.find_ancestor(exp.If, exp.Case)  # LENGTH's BLOB branch: typeof-guarded
    ]


@pytest.mark.slow
def test_sqlglot_writes_no_cast_the_guard_did_not_see():
    """Every DuckDB function sqlglot reads into a node the guard allows, with 1 to 3 arguments
    of each column type (and integer literals), written as the SQL that runs: no cast appears
    that the parsed call did not hold (beyond casts to text), once the arguments the guard
    requires to be literals are. ``CEIL(x, d)`` wrote ``CAST(d AS INT)`` (an error oracle);
    a future sqlglot that writes another such cast fails here."""
    names = sorted(
        {
            row[0]
            for row in duckdb.sql(
                "SELECT function_name FROM duckdb_functions() "
                "WHERE function_type IN ('scalar', 'aggregate', 'macro')"
            ).fetchall()
            if row[0].isidentifier()
        }
    )
    values = [*_TYPED, "2"]
    found = []
    for name in names:
        for first in values:
            for rest in ([], ["d"], ["i"], ["2"], ["d", "2"], ["i", "s"]):
                sql = f"SELECT {name}({', '.join([first, *rest])}) AS r FROM t"
                found += [(sql, cast) for cast in _new_casts(sql)]
    assert found == []


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    """A small demo whose analyst may be released 20 cells of persons a day."""
    document = demo_policy().document_dict()
    document["budgets"] = [b for b in document.get("budgets", []) if b.get("user") != "analyst"]
    document["cell_limits"] = [{"user": "analyst", "table": "persons", "cells": 20}]
    path = tmp_path_factory.mktemp("s50g") / "demo.duckdb"
    build_demo_database(path, persons=2000, seed=50, policy=load_policy(document, name="s50g"))
    return path


@pytest.mark.parametrize(
    "cte",
    [
        "WITH r(a) AS (SELECT region FROM persons WHERE age >= {age})",
        "WITH r AS MATERIALIZED (SELECT region AS a FROM persons WHERE age >= {age})",
    ],
)
def test_a_kept_cte_is_counted_under_cell_limits(limited, tmp_path, cte):
    """Under cell limits the groups a HAVING hides are counted by a statement over the frame,
    which was built without the statement's WITH (read under sqlglot's old key "with"): a CTE
    the guard keeps (column names, MATERIALIZED) made every such query fail in the engine
    ("Table with name r does not exist"). Now the first is answered and charged its 8 regions
    times 2 aggregates (16 of 20 cells); the second would pass the limit and is refused."""
    path = tmp_path / "demo.duckdb"
    shutil.copy(limited, path)
    sql = cte + " SELECT a, COUNT(*) FROM r GROUP BY a HAVING COUNT(*) > 99999"
    with sqlsdc.connect(path, user="analyst") as con:
        assert con.execute(sql.format(age=1)).fetchall() == []
        with pytest.raises(CellLimitReached):
            con.execute(sql.format(age=2)).fetchall()


_EXIT_DURING_AN_ACTION = """
import threading, time, duckdb
from sqlsdc.engines import watchdog
started = threading.Event()
def inside_the_engine():
    started.set()
    duckdb.connect().execute(
        "SELECT COUNT(*) FROM range(400000000) t(x) WHERE x % 7 = 3").fetchall()
watchdog.after(0, inside_the_engine)
started.wait()
time.sleep(0.2)
print("done", flush=True)
"""


@pytest.mark.slow
def test_the_process_ends_cleanly_while_the_watchdog_is_inside_the_engine():
    """A script that left a guarded connection open and ended about one second after its last
    statement, while the watchdog's idle release was closing the engine connection, aborted
    (SIGABRT, exit 134, "terminate called after throwing an instance of ''"): Python stops a
    daemon thread at exit wherever it is. 11 of 12 runs of query, ``sleep(1.0)``, exit did.
    Now the interpreter waits at exit for the running action (here a DuckDB query)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _EXIT_DURING_AN_ACTION], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-300:]  # old: -6 (SIGABRT)
    assert done.stdout.startswith("done")  # then, maybe, DuckDB's progress bar
