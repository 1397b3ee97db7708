"""Red-team round of session 33, with an analyst's connection only.

What was found, and closed:

* **a BETWEEN DuckDB binds when it runs it but not when it lists its tables**: ``age BETWEEN
  '3' AND 5`` passed the guard (the literal fits the column) and then failed in the engine,
  for every row and every data: before running a protected statement the guard asks
  DuckDB's ``get_table_names`` which tables it reads (defence in depth), and that call binds
  the constants of a BETWEEN alone, in order ("Cannot mix values of type VARCHAR and
  INTEGER_LITERAL"; also a DATE bound next to a number, a DECIMAL next to a BOOLEAN).
  No oracle (no data is read there), but the analyst was told that the query failed in the
  engine and that its message could reveal confidential values. Such a statement is now
  refused with sqlsdc's own message, before any DP charge, the engine's text kept for the
  audit log (``guard.engine_reads``).
* **the order of released rows** (a noise-free yes/no question about one person): SQL leaves
  the order of rows to the engine where ORDER BY does not fix it, and DuckDB's came from its
  hash tables, which hold the hidden groups too. Grouping a region's persons by ``CASE WHEN
  <one person's municipality and a guessed age> THEN <a shown municipality> ELSE municipality
  END``, the shown municipalities came back in one order when the guess was right (the
  person's row joined the shown group) and in another when it was wrong (their row made a
  hidden group of its own): on the demo, 111 queries, one per age, gave two orders, one of
  them for the person's true age only, whatever the noise on the counts. Ties of an ORDER
  BY, the rows a LIMIT or OFFSET keeps (also in a derived table), ROW_NUMBER, LAG, LEAD,
  FIRST_VALUE, LAST_VALUE and ROWS frames read the same order. A result that reads
  confidential rows is now ordered by its ORDER BY and then every output column, a scope that
  LIMITs or OFFSETs its rows likewise, and such windows by what their scope releases and the
  cells' keys (``sqlsdc.rewrite.order``). Left: FIRST_VALUE/LAST_VALUE over a RANGE frame
  with an offset, which DuckDB orders by one key only (the value at the frame's edge among
  tied rows is the engine's choice); and the last bits of a floating-point SUM or AVG over
  released values (an outer query's, a window's), which depend on the order the engine adds
  them in (not observed to move with a hidden group on the demo).

Tried and held (no test added): subqueries over protected counts in LIMIT, OFFSET and ORDER BY
(a hidden cell gives NULL, so no limit); FILTER, EXISTS/IN/ANY and correlated subqueries on
confidential rows; UNION/EXCEPT/INTERSECT of group-only aggregations (groups need a protected
count of min_frequency); ROLLUP/CUBE/GROUPING SETS over a one-person cell; DISTINCT ON,
QUALIFY, VALUES, UNNEST, range(), WITH RECURSIVE, TABLESAMPLE, AT (VERSION), #1, COLUMNS(*),
* EXCLUDE, table-as-struct (``GROUP BY p``), COLLATE, GLOB, SIMILAR TO, regexp, LIKE ...
ESCAPE (DuckDB raises per row for ``'a\\' ESCAPE '\\'``: refused); measures compared with
other columns, public columns, protected aggregates, scalar subqueries, scaled or shifted
(``income - 545 > 49455``), through derived tables, CTE and derived column alias lists,
``SELECT *`` alias lists (expanded to named columns before DuckDB sees them) and UNION [BY
NAME]; CTEs and aliases that differ from tables or from each other only in case (quoted);
41 spellings of one CKM sum (one value each); 20 spellings of one DP count (one noise per
identity; every other identity charged); SUM/AVG of a UHUGEINT/HUGEINT measure through casts
to FLOAT/DOUBLE; sqlglot's generated SQL against DuckDB's operator precedence; non-ASCII
names (``"Ä"``/``"ä"``, the Kelvin sign) resolved as DuckDB does (ASCII-only case folding;
the duplicate-output check folds more, a refusal); CASTs that fail on small values in HAVING,
ORDER BY, windows and an outer WHERE over a derived table of cells (evaluated only for shown
groups: DuckDB keeps filters that can throw above the frame's); ``cell_accuracy`` (a function
of the published value); a per-row timing channel through a megabyte of CONCAT in a CASE
branch under a short statement timeout (the check's time dominates and varies more).
"""

from __future__ import annotations

import pytest

import sqlsdc
from sqlsdc.engines.duckdb import open_database


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM persons WHERE age BETWEEN '300' AND 5",
        "SELECT region, COUNT(*) FROM persons WHERE age NOT BETWEEN '3' AND 5 GROUP BY region",
        "SELECT COUNT(*) FROM persons WHERE '3' BETWEEN age AND 5",
        "SELECT scheme, COUNT(*) FROM benefits WHERE month BETWEEN '3' AND 5 GROUP BY scheme",
    ],
)
def test_a_between_duckdb_cannot_bind_alone_is_refused_clearly(fresh_demo_db, sql):
    """Before: "the query failed in the engine ... could reveal confidential values", for
    every data. Now a refusal that says why, audited with the engine's text, nothing spent."""
    con = sqlsdc.connect(fresh_demo_db, user="analyst")
    try:
        before = con.remaining_budget()
        with pytest.raises(sqlsdc.PolicyViolation, match="before reading any data"):
            con.explain(sql)  # explain refuses what running refuses (session 36)
        with pytest.raises(sqlsdc.PolicyViolation, match="before reading any data"):
            con.execute(sql)
        assert con.remaining_budget() == before
        # the same bounds in the order DuckDB binds, or in one type, are answered
        con.execute("SELECT COUNT(*) FROM persons WHERE age BETWEEN 3 AND '5'").fetchall()
        con.execute("SELECT COUNT(*) FROM persons WHERE age BETWEEN '3' AND '5'").fetchall()
    finally:
        con.close()
    raw = open_database(fresh_demo_db)
    try:
        decision, reason = raw.execute(
            "SELECT decision, reason FROM sqlsdc.audit WHERE sql_text = ? ORDER BY query_id",
            [sql],
        ).fetchall()[-1]
    finally:
        raw.close()
    assert decision == "refused" and "Cannot mix values" in reason


RARE = "municipality = 'R08-M019' AND age = 66"  # one person of the demo (seed 7)
NOBODY = "municipality = 'R08-M019' AND age = 200"


def _keys_in_order(con, condition: str) -> list:
    """The municipalities of region R08 as the guard returns them, when the rows meeting
    ``condition`` are counted in R08-M001 instead of their own municipality."""
    sql = (
        f"SELECT CASE WHEN {condition} THEN 'R08-M001' ELSE municipality END AS k, COUNT(*) "
        "FROM persons WHERE region = 'R08' GROUP BY k"
    )
    return [row[0] for row in con.execute(sql).fetchall()]


def test_the_order_of_released_rows_tells_nothing_about_one_person(ckm):
    """Before: DuckDB's hash tables gave the released rows one order when the one person of
    R08-M019 was aged 66 (their row joined R08-M001) and another when nobody met the
    condition (their row made a hidden group of its own): a noise-free yes/no question about
    one person per query. The rows now come in the order of their released values."""
    rare, nobody = _keys_in_order(ckm, RARE), _keys_in_order(ckm, NOBODY)
    assert sorted(rare) == sorted(nobody)  # the same groups are shown
    assert rare == nobody == sorted(rare)


def test_a_query_s_own_order_is_kept_and_its_ties_broken_by_released_values(ckm):
    rows = ckm.execute(
        "SELECT sex, age, COUNT(*) AS n FROM persons WHERE region = 'R08' GROUP BY sex, age "
        "ORDER BY sex DESC, n LIMIT 40"
    ).fetchall()
    assert [r[0] for r in rows] == sorted((r[0] for r in rows), reverse=True)
    assert rows == sorted(rows, key=lambda r: (r[0] == "F", r[2], r[1]))


def _by_group(con, condition: str, projection: str, source: str = "") -> dict:
    """``projection`` per municipality of R08 (rows meeting ``condition`` counted in
    R08-M001), as a dict; ``source`` wraps the aggregation in an outer query."""
    key = f"CASE WHEN {condition} THEN 'R08-M001' ELSE municipality END"
    inner = f"SELECT {key} AS k, {projection} FROM persons WHERE region = 'R08' GROUP BY k"
    sql = source.format(inner=inner) if source else inner
    return {row[0]: row[1:] for row in con.execute(sql).fetchall()}


@pytest.mark.parametrize(
    "projection, source",
    [
        ("ROW_NUMBER() OVER () AS rn", ""),
        ("ROW_NUMBER() OVER (ORDER BY COUNT(*) >= 0) AS rn", ""),
        ("LAG(COUNT(*) >= 0) OVER () AS previous", ""),
        ("FIRST_VALUE(COUNT(*) >= 0) OVER () AS first", ""),
        ("COUNT(*) AS n", "SELECT k, ROW_NUMBER() OVER () FROM ({inner}) t"),
        ("COUNT(*) AS n", "SELECT k, 1 FROM ({inner} LIMIT 5) t"),
        ("COUNT(*) AS n", "SELECT k, 1 FROM ({inner} ORDER BY COUNT(*) >= 0 LIMIT 5 OFFSET 2) t"),
    ],
)
def test_windows_and_limits_over_cells_do_not_read_the_engine_s_order(ckm, projection, source):
    """Each numbered, paired or chose the groups of R08 in the engine's order, which differed
    when the one person of R08-M019 was aged 66 (test above): ROW_NUMBER gave R08-M013 another
    number, and a LIMIT in a derived table kept other groups. Their ties are now broken by
    released values, so the answers (here functions of group keys and of which groups exist,
    the same for both conditions) are equal."""
    rare = _by_group(ckm, RARE, projection, source)
    nobody = _by_group(ckm, NOBODY, projection, source)
    assert rare == nobody


def test_a_moving_average_keeps_its_frame_and_an_unordered_last_value_its_partition(ckm):
    rows = ckm.execute(
        "SELECT age, COUNT(*) AS n, AVG(COUNT(*)) OVER (ORDER BY age ROWS BETWEEN 1 PRECEDING "
        "AND CURRENT ROW) AS m, LAST_VALUE(age) OVER () AS last FROM persons "
        "WHERE region = 'R08' AND age BETWEEN 20 AND 29 GROUP BY age"
    ).fetchall()
    ages = [r[0] for r in rows]
    assert ages == sorted(ages)
    assert rows[0][2] == rows[0][1]
    assert all(r[2] == (r[1] + p[1]) / 2 for p, r in zip(rows, rows[1:], strict=False))
    assert {r[3] for r in rows} == {max(ages)}


@pytest.mark.parametrize(
    "window",
    [
        "FIRST_VALUE(COUNT(*)) OVER (ORDER BY COUNT(*) >= 0 RANGE BETWEEN 1 PRECEDING AND "
        "CURRENT ROW)",
        "LAST_VALUE(k) OVER (ORDER BY COUNT(*) >= 0 RANGE BETWEEN CURRENT ROW AND 1 FOLLOWING)",
    ],
)
def test_a_first_or_last_value_over_a_range_offset_is_refused(ckm, window):
    """Its frame starts or ends among rows tied on the one ORDER BY key DuckDB allows there, so
    which of them it returns is the engine's order (red team s33's open point)."""
    key = f"CASE WHEN {RARE} THEN 'R08-M001' ELSE municipality END"
    with pytest.raises(sqlsdc.PolicyViolation, match="RANGE frame with an offset"):
        ckm.execute(f"SELECT {key} AS k, {window} FROM persons WHERE region = 'R08' GROUP BY k")
    # the same function over a ROWS frame, or a RANGE frame without offset, is answered
    for frame in ("ROWS BETWEEN 1 PRECEDING AND CURRENT ROW",
                  "RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"):  # fmt: skip
        window = f"FIRST_VALUE(COUNT(*)) OVER (ORDER BY COUNT(*) >= 0 {frame})"
        ckm.execute(f"SELECT {key} AS k, {window} FROM persons WHERE region = 'R08' GROUP BY k")
