"""Sums over floating-point measures that hold NaN, ±infinity or values too large to add up
(sqlsdc.guard.summable): such a value survives every mechanism (NaN plus noise is NaN), so
a cell showing it would tell that one of its rows holds it, and a WHERE clause narrowing the
cell to one person would tell whether that person does. Every sum over such a column is
refused, whatever cell it asks for, before anything is run or charged."""

from __future__ import annotations

import duckdb
import pytest

import sqlsdc
from sqlsdc.engines.duckdb import open_database
from sqlsdc.guard.summable import SUMMABLE_MAGNITUDE
from tests.security.test_redteam_s28e import DP, ckm_table, rows
from tests.security.test_redteam_s29 import weighted_table


def refusal(con, sql: str) -> str:
    with pytest.raises(sqlsdc.PolicyViolation) as refused:
        con.execute(sql)
    return str(refused.value)


@pytest.mark.parametrize(
    "value",
    ["'NaN'", "'-NaN'", "'inf'", "'-inf'", "1e141", "-1e300"],
)
def test_a_sum_over_a_column_holding_an_unsummable_value_is_refused_for_every_cell(tmp_path, value):
    """One row (i = 7, in group b) holds the value: sums and averages of every cell, with or
    without that row, are refused alike; counts and the clean column are answered."""
    con = ckm_table(
        tmp_path / "n.duckdb",
        "m DOUBLE, clean DOUBLE",
        f"CASE WHEN i = 7 THEN CAST({value} AS DOUBLE) ELSE i END, i",
    )
    for sql in (
        "SELECT g, SUM(m) FROM t GROUP BY g",
        "SELECT g, AVG(m) FROM t GROUP BY g",
        "SELECT SUM(m) FROM t WHERE g = 'a'",  # the row (in b) is not in the cell: refused too
        "SELECT g, SUM(m) FROM t WHERE g = 'a' GROUP BY g",
        "SELECT g, SUM(2 * m + 1) FROM t GROUP BY g",
    ):
        message = refusal(con, sql)
        assert (
            "t.m holds values that no protected sum can add up (NaN, ±infinity or beyond ±1e+140)"
            in message
        )
        assert "ask an admin to correct or remove those values" in message
    assert [g for g, _n in rows(con, "SELECT g, COUNT(m) FROM t GROUP BY g")] == ["a", "b"]
    clean = rows(con, "SELECT g, SUM(clean) FROM t GROUP BY g")
    assert all(abs(total - exact) < 0.05 * exact for (_g, total), exact in
               zip(clean, (999_000, 1_001_000), strict=True))  # fmt: skip
    con.close()


def test_values_up_to_the_bound_and_nulls_are_summed(tmp_path):
    """The bound is a magnitude: ±1e140 itself is summed, and so are NULLs (not added up)."""
    assert SUMMABLE_MAGNITUDE == 1e140
    con = ckm_table(
        tmp_path / "b.duckdb",
        "m DOUBLE",
        "CASE WHEN i % 3 = 0 THEN 1e140 WHEN i % 3 = 1 THEN -1e140 WHEN i = 8 THEN NULL ELSE i END",
    )
    released = dict(rows(con, "SELECT g, SUM(m) FROM t GROUP BY g"))
    con.close()
    assert set(released) == {"a", "b"}
    assert all(abs(v) < 1e144 for v in released.values())


def test_integer_and_decimal_measures_are_not_scanned(tmp_path):
    """Integers and DECIMAL(p <= 18) cannot be NaN or overflow DuckDB's 128-bit sums: a
    BIGINT far beyond the bound of doubles' magnitudes is summed (and no scan reads it)."""
    con = ckm_table(
        tmp_path / "i.duckdb",
        "m BIGINT, d DECIMAL(18,2)",
        "9000000000000000000 - i, 1234567890123456.78",
    )
    assert con.explain("SELECT g, SUM(m), AVG(d) FROM t GROUP BY g").summed == ()
    released = rows(con, "SELECT g, SUM(m), AVG(d) FROM t GROUP BY g")
    con.close()
    assert [g for g, *_ in released] == ["a", "b"]


def test_the_summed_columns_are_the_floating_point_values_added_up(tmp_path):
    """Not the columns of a CASE filter, nor integers however cast (the sum adds up the
    stored column)."""
    con = ckm_table(tmp_path / "s.duckdb", "m DOUBLE, f FLOAT, n INTEGER", "i, i, i")
    query = con.explain(
        "SELECT g, SUM(CASE WHEN g = 'a' THEN m END), AVG(CAST(n AS DOUBLE)), SUM(f), SUM(n) "
        "FROM t GROUP BY g"
    )
    con.close()
    assert query.summed == (("t", "f"), ("t", "m"))


def test_a_weight_holding_an_unsummable_value_refuses_weighted_sums(tmp_path):
    weight = "CASE WHEN i = 5 THEN 'NaN'::DOUBLE ELSE 1.5 END"
    con = weighted_table(tmp_path / "w.duckdb", "i", weight)
    assert con.explain("SELECT g, SUM(m * w) FROM t GROUP BY g").summed == (("t", "m"), ("t", "w"))
    assert "t.w holds values that no protected sum" in refusal(
        con, "SELECT g, SUM(m * w) FROM t GROUP BY g"
    )
    assert [g for g, _s in rows(con, "SELECT g, SUM(m) FROM t GROUP BY g")] == ["a", "b"]
    con.close()


def test_a_dp_sum_over_such_a_column_is_refused_before_it_is_charged(tmp_path):
    path = tmp_path / "dp.duckdb"
    con = ckm_table(path, "m DOUBLE", "CASE WHEN i = 7 THEN 'inf'::DOUBLE ELSE i % 100 END", DP)
    before = con.remaining_budget()
    assert "t.m holds values" in refusal(con, "SELECT g, SUM(m) FROM t GROUP BY g")
    assert "t.m holds values" in refusal(con, "SELECT g, AVG(m) FROM t GROUP BY g")
    assert con.remaining_budget() == before
    con.close()
    with open_database(path, read_only=True) as raw:
        decisions = raw.execute(
            "SELECT decision, reason FROM sqlsdc.audit ORDER BY query_id"
        ).fetchall()
    assert [d for d, _r in decisions[-2:]] == ["refused", "refused"]
    assert all("t.m holds values" in r for _d, r in decisions[-2:])


def test_corrected_data_is_summed_again(tmp_path):
    """The scan's answer holds while the data cannot change: an admin's correction, written
    while the analyst's connection is open in the same process, is seen by its next query."""
    path = tmp_path / "c.duckdb"
    con = ckm_table(path, "m DOUBLE", "CASE WHEN i = 7 THEN 'NaN'::DOUBLE ELSE i END")
    refusal(con, "SELECT g, SUM(m) FROM t GROUP BY g")
    with open_database(path) as admin:
        admin.execute("UPDATE t SET m = 7 WHERE pid = 7")
    assert [g for g, _s in rows(con, "SELECT g, SUM(m) FROM t GROUP BY g")] == ["a", "b"]
    with open_database(path) as admin:
        admin.execute("UPDATE t SET m = 'inf' WHERE pid = 8")
    refusal(con, "SELECT g, SUM(m) FROM t GROUP BY g")
    con.close()


def test_the_same_answer_after_the_file_is_reopened(tmp_path):
    """A later opening (another process may have written) scans again."""
    path = tmp_path / "r.duckdb"
    con = ckm_table(path, "m DOUBLE", "i")
    assert rows(con, "SELECT g, SUM(m) FROM t GROUP BY g")
    con.close()
    with duckdb.connect(str(path)) as raw:
        raw.execute("UPDATE t SET m = '-inf' WHERE pid = 3")
    con = sqlsdc.connect(path, user="analyst")
    refusal(con, "SELECT SUM(m) FROM t")
    con.close()
