"""Red team s36f: the bound of a DP statement's answer rows, checked before the charge
(``guard.answer_bound``), as it stood after red team s36d.

What broke (fixed here):

- **ROLLUP, CUBE and GROUPING SETS over noisy cells.** The answer's SQL may group the released
  cells again; each grouping set groups them once more (``ROLLUP(age, n)`` over 50 cells: up to
  50 + 50 + 1 rows), but the bound read the select's source rows (50). The statement paid, and
  its answer was then stopped for its size. A select's bound is now its rows times its grouping
  sets (``ROLLUP`` of n keys n + 1, ``CUBE`` 2^n, ``GROUPING SETS`` the sum of its elements'),
  and a ROLLUP or CUBE nested where it is not counted is unbounded.
- **An unaliased derived table equating its own columns.** With sources without aliases every
  column is unqualified, so ``ON q = w`` (two columns of the right side) was read as a join on
  the right side's unique key: each left row was taken to meet one right row (10 rows for 100).
  The guard names derived tables, so this was reached only by the bound itself; a join of an
  unaliased source now equates no column through ON.
- **An aggregate in a source taken as the select's.** ``FROM c PIVOT (SUM(v) FOR ...)`` made the
  select an aggregate without GROUP BY (one row); PIVOT and UNPIVOT (refused by the validator)
  are now unbounded, and an aggregate in a select's sources is not the select's.
- **DuckDB's macros over UNNEST.** ``generate_subscripts`` and ``regexp_split_to_table`` in a
  select list give rows per element, as UNNEST does, but were read as scalar functions (10
  rows for 30). The function allowlist refuses both; the bound now reads them as UNNEST, and
  Spark's generators ``stack``, ``inline`` and ``inline_outer`` too.

What held (tried, no test added): UNNEST and ``unnest(range(n))`` in the select list, LATERAL,
table functions and ``(VALUES ...) CROSS JOIN c`` (unbounded); NATURAL joins, joins on OR,
on a parenthesised equality or on inequalities (multiplied); SEMI, ANTI, ASOF, POSITIONAL
and outer joins inside derived tables (no unique key claimed through them); UNION/INTERSECT/
EXCEPT ALL; DISTINCT ON; windows and QUALIFY; LIMIT inside and outside subqueries; ``COLUMNS``
and ``* EXCLUDE`` projections; a CTE named like a relation and defined after its use
(DuckDB resolves the table); duplicate unaliased sources (DuckDB refuses them); a public
table's declared key with NULLs (an equality never meets NULL; the key has a unique index).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
import sqlglot

import sqlsdc
from sqlsdc.errors import AnswerTooLarge
from sqlsdc.guard import connection as guarded
from sqlsdc.guard.answer_bound import answer_rows


@pytest.fixture
def ages_db(tmp_path) -> Path:
    """persons (DP counts) with an age dimension of 50 declared values."""
    path = tmp_path / "ages.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE persons AS SELECT range AS pid, (range % 50)::INTEGER AS age "
                "FROM range(2000)")  # fmt: skip
    con.close()
    dp = {"method": "dp", "spend": {"epsilon": "1/2"}}
    sqlsdc.init(path, {
        "tables": {"persons": {
            "privacy_unit": "pid",
            "columns": {"pid": {"role": "identifier"},
                        "age": {"role": "dimension", "domain": list(range(50))}},
            "protection": {"counts": dp, "magnitudes": dp}}},
        "users": {"admin": {"role": "admin"}, "ana": {"role": "analyst"}},
        "budgets": [{"user": "*", "epsilon": 10}],
    })  # fmt: skip
    return path


ROLLUP = ("SELECT age, n FROM (SELECT age, COUNT(*) AS n FROM persons GROUP BY age) AS a "
          "GROUP BY ROLLUP(age, n)")  # fmt: skip


def test_grouping_sets_over_noisy_cells_are_bounded_before_the_charge(ages_db, monkeypatch):
    """Before the fix the bound was 50 rows (the cells): with a cap of 100 the statement paid,
    and its 101 rows were then stopped. Now it is bounded by 150 and refused unpaid."""
    monkeypatch.setattr(guarded, "MAX_ANSWER_ROWS", 100)
    with sqlsdc.connect(ages_db, "ana") as con:
        before = con.remaining_budget()[0].spent
        with pytest.raises(AnswerTooLarge, match="up to 150 rows"):
            con.execute(ROLLUP)
        assert con.remaining_budget()[0].spent == before
    monkeypatch.setattr(guarded, "MAX_ANSWER_ROWS", 150)
    with sqlsdc.connect(ages_db, "ana") as con:
        assert len(con.execute(ROLLUP).fetchall()) == 101


CELLS = {"c": (10, frozenset({"__g0"}))}


def _bound(sql: str) -> float:
    return answer_rows(sqlglot.parse_one(sql, read="duckdb"), CELLS, lambda _table: None)


@pytest.mark.parametrize(
    "sql, rows, most",
    [
        ("SELECT __g0, __a0 FROM c GROUP BY ROLLUP(__g0, __a0)", 21, 30),
        ("SELECT __g0, __a0 FROM c GROUP BY CUBE(__g0, __a0, __a1)", 52, 80),
        ("SELECT __g0, __a0 FROM c GROUP BY GROUPING SETS ((__g0), (__a0), (__g0, __a0), ())",
         23, 40),
        ("SELECT __g0, __a0 FROM c GROUP BY __g0, ROLLUP(__a0)", 20, 20),
        ("SELECT __g0 FROM c GROUP BY GROUPING SETS (ROLLUP(__g0, __a0), (__a1))", 24, 40),
        ("SELECT __g0 FROM c GROUP BY ROLLUP((__g0, __a0), __a1)", 21, 30),
        ("SELECT * FROM (SELECT * FROM c) JOIN (SELECT DISTINCT __g0 AS q, __g0 AS w FROM c) "
         "ON q = w", 100, 100),
        ("SELECT * FROM c PIVOT (SUM(__a0) FOR __a1 IN (0, 1, 2))", 10, float("inf")),
        ("SELECT * FROM c UNPIVOT (v FOR k IN (__a0, __a1))", 20, float("inf")),
        ("SELECT generate_subscripts([4, 5, 6], 1), __g0 FROM c", 30, float("inf")),
        ("SELECT regexp_split_to_table('a,b,c', ','), __g0 FROM c", 30, float("inf")),
    ],
)  # fmt: skip
def test_the_bound_covers_the_answer(sql, rows, most):
    """``rows``: what DuckDB answers over 10 cells (``__a0`` = g % 2, ``__a1`` = g % 3);
    before the fix the bound was below it (10, or 1 for the PIVOT)."""
    con = duckdb.connect()
    con.execute("CREATE TABLE c AS SELECT range::INTEGER AS __g0, (range % 2)::INTEGER AS __a0, "
                "(range % 3)::INTEGER AS __a1 FROM range(10)")  # fmt: skip
    assert len(con.execute(sql).fetchall()) == rows
    assert rows <= _bound(sql) == most


@pytest.mark.parametrize(
    "generator", ["stack(3, 1, 2, 3)", "inline(array(struct(1), struct(2)))",
                  "inline_outer(array(struct(1), struct(2)))"],
)  # fmt: skip
def test_spark_generators_in_a_select_list_are_unbounded(generator):
    """Spark's generators give rows per element in a select list, as UNNEST does; before the
    fix the bound was the cells' 10 rows."""
    tree = sqlglot.parse_one(f"SELECT {generator}, __g0 FROM c", read="spark")
    assert answer_rows(tree, CELLS, lambda _table: None) == float("inf")
