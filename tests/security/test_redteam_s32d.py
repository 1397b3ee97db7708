"""Red-team round s32d, with an analyst's connection only, on what changed in session 32.

What succeeded, and was closed:

* **a long IN list or chain of ranges in an output, named by its alias** (a silently wrong
  answer): :mod:`sqlsdc.planner.repeated_columns` sets aside all but the first value of a long
  IN list (and the columns of all but the first range of a long chain) while sqlglot's
  ``qualify`` runs, and ``qualify`` copies an output expression wherever its alias or position
  names it (``WHERE young``, ``GROUP BY flag``, ``GROUP BY 1``). The copy, made while the
  values were set aside, kept them set aside: ``SELECT region, age IN (0, ..., 19) AS young,
  COUNT(*) ... WHERE young`` counted ``age IN (0)`` (R01: 13 instead of 231), and a chain of
  ranges named by its alias left ranges with no column (``BETWEEN 1 AND 2``), refused as a
  constant that raises. No number escaped the checks (the copy that ran was the copy that was
  checked), but the answer was not the query's. Nothing inside a projection is set aside now.

Tried and held (no test added):

* a differential sweep of 335 statements, each checked with and without the set-aside
  (``GROUP_FROM`` 16 and 10**9), same refusal or same protected SQL for every one: values of
  every kind at the head or the tail of a long IN list and as bounds of the last range of a
  long chain (strings that the column cannot hold, ``'300'``, 39-digit and 20-digit integers,
  ``1.000…0`` with 29 decimals, ``1e400``, NULL, dates, ``TRUE``, ``X'00'``, casts, ``1+1``,
  ``-1``, scalar subqueries) against INTEGER, DOUBLE and VARCHAR columns, also inside ``CASE
  WHEN <one person> THEN … ELSE TRUE END``; the same values as ``?`` parameters (str,
  Decimal, 10**38, date, None, float, bool, negative int); one column written as ``age``,
  ``persons.age``, ``p.age``, ``"age"``, ``"AGE"``, ``AGE``, derived tables and a CTE named
  ``age`` whose column ``age`` is a region, output aliases named like columns (``COUNT(*) AS
  age ... HAVING age BETWEEN …``), chains under NOT, EXISTS, CASE, HAVING, AND and OR. Error
  oracles of s32 stay closed inside long lists and chains (refused for one person as for
  nobody).
* ``DESCRIBE`` against ``information_schema.columns`` for 24 column types (ENUM, user types,
  nested, UNION, BIT, BIGNUM, TIMESTAMP_S/NS, generated columns, views, upper-case quoted
  names): the same type text for every column; a table name in another case is found alike.
  Uniqueness read from ``DESCRIBE`` keys only decides whether constraints are listed at all:
  a table without keys is never made unique by it.
* HAVING over CKM cells that fails on a hidden cell (``CAST(COUNT(*) - 1 AS USMALLINT)``): in
  the frame's CASE, in ORDER BY, in a window over the cells, in an outer WHERE over a derived
  table of cells (DuckDB keeps a filter that can raise above the join, and the derived table's
  ``__cn >= 10`` is in the join), and with EXISTS or scalar subqueries (correlated ones are
  refused; uncorrelated ones fail in the binder for every cell alike): no answer depended on a
  hidden cell.
* DP under ``dp.max_rows_per_unit``: pairs of spellings with one identity (``SUM(x)`` and
  ``SUM(CAST(x AS DOUBLE))``, ``SUM(+x)``, ``SUM(x), AVG(x)``, ``SUM(x), COUNT(x)``,
  ``MEDIAN`` and ``QUANTILE_CONT(…, 0.5)``, a derived ``SELECT *``, ``GROUP BY g, g``): the
  same exact counts with the noise off; spellings with other rows (``WHERE x IS NOT NULL``)
  had another scope.

Left: ``age BETWEEN '300' AND 5`` (a string and an integer bound) is accepted by the guard
and fails in DuckDB's binder for every row alike (no oracle; a refusal would be clearer).
"""

from __future__ import annotations

import pytest

import sqlsdc

AGES = ", ".join(str(age) for age in range(20))
RANGES = " OR ".join(f"age BETWEEN {age} AND {age + 1}" for age in range(20))


@pytest.mark.parametrize(
    "named, written",
    [
        (
            f"SELECT region, age IN ({AGES}) AS young, COUNT(*) FROM persons WHERE young "
            f"GROUP BY region, age IN ({AGES}) ORDER BY region",
            f"SELECT region, age IN ({AGES}) AS young, COUNT(*) FROM persons "
            f"WHERE age IN ({AGES}) GROUP BY region, age IN ({AGES}) ORDER BY region",
        ),
        (
            f"SELECT ({RANGES}) AS flag, COUNT(*) FROM persons GROUP BY flag ORDER BY flag",
            f"SELECT ({RANGES}) AS flag, COUNT(*) FROM persons GROUP BY ({RANGES}) ORDER BY flag",
        ),
        (
            f"SELECT ({RANGES}) AS flag, COUNT(*) FROM persons GROUP BY 1 ORDER BY flag",
            f"SELECT ({RANGES}) AS flag, COUNT(*) FROM persons GROUP BY ({RANGES}) ORDER BY flag",
        ),
    ],
    ids=["in-list-in-where", "ranges-in-group-by", "ranges-by-position"],
)
def test_a_long_list_named_by_its_alias_is_the_whole_list(ckm, named, written):
    """Before: the first query counted ``age IN (0)`` (R01: 13 people instead of 231); the
    others were refused (``BETWEEN 1 AND 2 raises an error``)."""
    assert ckm.execute(named).fetchall() == ckm.execute(written).fetchall()


def test_the_list_named_by_its_alias_still_refuses_what_it_refused(ckm):
    """A value the column cannot hold is refused in the aliased list as in the written one."""
    sql = (
        f"SELECT region, age IN ({AGES}, '99999999999') AS young, COUNT(*) FROM persons "
        f"WHERE young GROUP BY region, young"
    )
    with pytest.raises(sqlsdc.PolicyViolation, match="could raise an error"):
        ckm.execute(sql)
