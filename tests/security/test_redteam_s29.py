"""Red-team round of session 29, against the refusal of sums over floating-point values that no
protected sum can add up (:mod:`sqlsdc.guard.summable`, commit 01dbf68): NaN, ±infinity or
magnitudes beyond 1e140 show in exactly the cells that hold them.

Tried: sums in every place of a query (HAVING, ORDER BY, windows, grouping sets, CTEs, joins,
derived tables, subqueries, UNION ALL), scale constants and casts inside the aggregate, integer
and DECIMAL measures, 32-bit FLOAT measures and weights, DP variances and quantiles over NaN and
infinities, threshold post-processing over suppressed cells, verification requests, the scan's
ordering, audit and cache, and Spark's registered copies.

What succeeded, and was closed:

* a weighted sum of a 32-bit FLOAT measure (or with a FLOAT weight) was multiplied in 32 bits,
  which overflow to infinity past 3.4e38, far below the scan's bound: the cell holding such a
  product came out infinite and the others finite. FLOAT factors are now read as DOUBLE;
* on Spark the guard types a query by the database's schema, so a column the database stores
  as BIGINT was summed unscanned while Spark's registered copy held it as DOUBLE with a NaN:
  only the cell holding it was NaN. Copies whose floating-point types differ are now refused
  (its test is in tests/test_spark.py, which has a Spark session);
* ``SUM(m * 1e9999999)`` made ``Fraction`` build a ten-million-digit integer (6 s of CPU while
  holding the connection, hours for 1e999999999) before an internal error; constants are now
  read by the bounded parser and must lie within DOUBLE's range. The same for DP quantiles'
  fractions and for a ``Decimal`` ε given to a verification request.

What held (one test each below): every SUM/AVG wherever it stands is refused like one in the
SELECT list; scale constants are applied to the protected value only; DP statistics that are
not sums clamp NaN and infinities. Left as is: the scan and the query run in two transactions,
so an admin writing data *in the same process* between the two could slip a value past it.
"""

from __future__ import annotations

import math
from decimal import Decimal

import duckdb
import pytest

import sqlsdc
from sqlsdc.errors import ProgrammingError
from tests.security.test_redteam_s28e import CKM, DP, ckm_table, rows


def weighted_table(path, measure: str, weight: str) -> sqlsdc.Connection:
    """A CKM table ``t`` (pid, g in a/b, a measure m and a weight w given as SQL over i in
    0..1999), and an analyst's connection to it."""
    raw = duckdb.connect(str(path))
    raw.execute(
        f"CREATE TABLE t AS SELECT i AS pid, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END AS g, "
        f"{measure} AS m, {weight} AS w FROM range(2000) AS r(i)"
    )
    raw.close()
    sqlsdc.init(path, {
        "tables": {"t": {
            "privacy_unit": "pid",
            "columns": {"pid": {"role": "identifier"},
                        "g": {"role": "dimension", "domain": ["a", "b"]},
                        "m": {"role": "measure"}, "w": {"role": "weight"}},
            "protection": CKM,
        }},
        "users": {"analyst": {"role": "analyst"}, "admin": {"role": "admin"}},
    })  # fmt: skip
    return sqlsdc.connect(path, user="analyst")


def test_a_float_product_that_overflows_32_bits_is_not_told_by_its_cell(tmp_path):
    """One row (i = 7, in b) holds 3e38, within FLOAT and far below the scan's bound; times
    the weight 2 it overflowed FLOAT to infinity, and only the cell of b was infinite."""
    for measure, weight in (("FLOAT", "INTEGER"), ("FLOAT", "FLOAT"), ("FLOAT", "DECIMAL(18, 2)")):
        path = tmp_path / f"{measure}{weight[:7]}.duckdb"
        measure_sql = f"CAST(CASE WHEN i = 7 THEN 3e38 ELSE i END AS {measure})"
        con = weighted_table(path, measure_sql, f"CAST(2 AS {weight})")
        for sql in (
            "SELECT g, SUM(m * w) FROM t GROUP BY g",
            "SELECT g, AVG(w * m) FROM t GROUP BY g",
            "SELECT g, SUM(CASE WHEN g = 'b' THEN m * w END) FROM t GROUP BY g",
        ):
            released = rows(con, sql)
            assert released and all(math.isfinite(v) for _g, v in released), (measure, sql)
        con.close()


def test_a_constant_beyond_doubles_range_is_refused_at_once(tmp_path):
    """``Fraction("1e9999999")`` builds a ten-million-digit integer (6 s of CPU, holding the
    connection and its file; 1e999999999 hours), after which the guard failed with an internal
    error; constants are now read by the bounded parser and must be within DOUBLE's range (so
    no scale or offset applied to a protected value overflows in the engine)."""
    con = ckm_table(tmp_path / "c.duckdb", "m DOUBLE", "i")
    for sql in (
        "SELECT g, SUM(m * 1e9999999) FROM t GROUP BY g",
        "SELECT g, AVG(m / 1e-999999999) FROM t GROUP BY g",
        "SELECT g, SUM(m + 1e400) FROM t GROUP BY g",
        "SELECT g, SUM(m * 1e300 * 1e300 / 1e300) FROM t GROUP BY g",
    ):
        with pytest.raises(sqlsdc.PolicyViolation, match="within the range of DOUBLE"):
            con.execute(sql)
    assert [g for g, _s in rows(con, "SELECT g, SUM(m * 1e300) FROM t GROUP BY g")] == ["a", "b"]
    con.close()
    dp = ckm_table(tmp_path / "q.duckdb", "m DOUBLE", "i % 100", DP)
    with pytest.raises(sqlsdc.PolicyViolation, match="is not a number between 0 and 1"):
        dp.execute("SELECT g, QUANTILE_CONT(m, 1e-999999999) FROM t GROUP BY g")
    dp.close()


def test_a_decimal_epsilon_is_read_by_the_bounded_parser(fresh_demo_db):
    """The same billion-digit integer through the Python API: a verification's ε given as
    ``Decimal("1e-9999999")`` took 6 s before failing (1e-999999999: hours, holding the file)."""
    from tests.synth.verify_support import make_synthetic_output

    make_synthetic_output(fresh_demo_db)
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        with pytest.raises(ProgrammingError, match="the exponent of '1E-9999999' is beyond"):
            con.verify("SELECT AVG(income) FROM syn_persons", mode="noisy",
                       epsilon=Decimal("1e-9999999"))  # fmt: skip


# --- what held -------------------------------------------------------------------------------


def test_every_place_a_sum_can_stand_is_refused_alike(tmp_path):
    """HAVING, ORDER BY, windows over aggregates, grouping sets, CTEs, self-joins and derived
    tables read the same sums: each is refused, with the SELECT list's message."""
    con = ckm_table(
        tmp_path / "p.duckdb", "m DOUBLE", "CASE WHEN i = 7 THEN 'NaN'::DOUBLE ELSE i END"
    )
    for sql in (
        "SELECT g, COUNT(*) FROM t GROUP BY g HAVING SUM(m) > 0",
        "SELECT g, COUNT(*) FROM t GROUP BY g ORDER BY AVG(m) DESC",
        "SELECT g, RANK() OVER (ORDER BY SUM(m)) FROM t GROUP BY g",
        "SELECT g, SUM(m) FROM t GROUP BY GROUPING SETS ((g), ())",
        "WITH c AS (SELECT g, m FROM t) SELECT g, SUM(m) FROM c GROUP BY g",
        "SELECT x.g, SUM(x.m) FROM t AS x JOIN t AS y ON x.pid = y.pid GROUP BY x.g",
        "SELECT g, c FROM (SELECT g, COUNT(*) AS c, SUM(m) AS s FROM t GROUP BY g) WHERE s > 0",
    ):
        with pytest.raises(sqlsdc.PolicyViolation, match="t.m holds values that no protected"):
            con.execute(sql)
    con.close()


def test_a_scale_is_applied_to_the_protected_value(tmp_path):
    """``SUM(m * 1e200)`` is ``1e200 * SUM(m)`` of the same protected cell (same noise): an
    overflow there would be a function of released values only."""
    con = ckm_table(tmp_path / "s.duckdb", "m DOUBLE", "i")
    plain = rows(con, "SELECT g, SUM(m) FROM t GROUP BY g")
    scaled = rows(con, "SELECT g, SUM(m * 1e200) FROM t GROUP BY g")
    con.close()
    assert [(g, v * 1e200) for g, v in plain] == scaled


def test_dp_clamps_non_finite_values_in_variances_and_quantiles(tmp_path):
    """DP statistics that are not sums are not refused: their values are clamped to the
    declared bounds (NaN and infinities included), so every cell is finite."""
    for value in ("'NaN'", "'inf'", "'-inf'"):
        values = f"CASE WHEN i = 7 THEN CAST({value} AS DOUBLE) ELSE i % 100 END"
        con = ckm_table(tmp_path / f"{value[1:-1]}.duckdb", "m DOUBLE", values, DP)
        for sql in (
            "SELECT g, VAR_SAMP(m) FROM t GROUP BY g",
            "SELECT g, STDDEV(m) FROM t GROUP BY g",
            "SELECT g, QUANTILE_CONT(m, 0.9) FROM t GROUP BY g",
        ):
            released = rows(con, sql)
            assert len(released) == 2 and all(math.isfinite(v) for _g, v in released), sql
        con.close()
