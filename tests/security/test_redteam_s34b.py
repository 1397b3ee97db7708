"""Red-team round of session 34 (second), with an analyst's connection only, against the one
spelling of values SQL holds equal (``sqlsdc.rewrite.spelling``): where the engine keeps one of
several equal values (a GROUP BY's representative, DISTINCT, a set operation, a LIMIT, MIN and
the other chosen values) the rewrite writes floats as ``x + 0`` (and NaN as ``ABS``) and
intervals through ``normalized_interval``, deciding by its own type inference (``_kind``).
Values the inference does not call a DOUBLE, a FLOAT or an INTERVAL are kept as the engine read
them first, in the order hidden groups move (red team s33c's attack). What was found, and
closed (the inference was swept against DuckDB's ``typeof`` over every allowed operator and
function on every column type, then over 20,000 random nestings of them; the cases are in
``test_the_inferred_type_is_duckdb_s``):

* **types the inference got wrong**: DuckDB's ``//`` of a DECIMAL divides as a DOUBLE (sqlglot
  says DECIMAL), so ``(CAST(n AS DECIMAL(10, 2)) * 0) // -1`` is -0.0; so are a DECIMAL's
  remainder by a HUGEINT or past 38 digits (``fmod(-n, 1)``) and a string minus a DECIMAL;
  ``EXTRACT(julian ...)`` is a DOUBLE (sqlglot: BIGINT); FLOOR and CEIL of a DECIMAL (a
  DOUBLE ``CEIL(-0.01)``) have no sqlglot type; the difference of two TIMESTAMPs (or of a
  string and a TIMESTAMP) is an INTERVAL, but sqlglot writes DuckDB's TIMESTAMP as
  TIMESTAMPNTZ, which the inference did not count as a time (``(ts - ts) * 30`` came back
  '30 days' from a GROUP BY; '1 month' is its one spelling). Each gave ``1 / x`` = -inf (or the
  interval as written) from a GROUP BY, DISTINCT, UNION or MIN.
* **types sqlglot passes on**: a derived table's column took sqlglot's type when it had one
  (not the corrected type of the projection it names), and SUM, MIN, LAG... took sqlglot's
  type of their argument, hidden moreover by the rewrite's ordered ``SUM(x ORDER BY x)``: so
  ``GROUP BY x`` over the DECIMAL ``//`` above, or over ``SUM(<DECIMAL> * <NaN>)``, kept the
  engine's first -0.0 or '-nan'. Past 64 steps (a chain of CTEs) the inference gave up and the
  key took sqlglot's type too.
* **structs, lists and VARIANTs as kept values**: a list (``CAST(... AS DOUBLE[])``), a struct
  (``(x, 1)``) or a VARIANT (which compares the value it holds: -0.0 = 0.0, a DECIMAL 0.00 =
  0.0) as a GROUP BY key, a DISTINCT row or a UNION row kept '[-0.0]', '(-0.0, 1)', '-0.0' as
  read first (MIN over them was already refused). They are refused too.
* **analysts' queries broken by the rewrite**: ``MIN(ts - n * INTERVAL 1 DAY)``, a TIME plus an
  interval and ``ROUND(i, 1) + <DATE>`` (DISTINCT, GROUP BY, MIN) failed in the engine
  (``normalized_interval`` of a time, ``ISNAN`` of a DATE); ``MIN`` of a cast TIMESTAMP and of
  FLOOR or CEIL of a DECIMAL were refused as types without one spelling; ``SELECT (SELECT x
  ...) UNION SELECT (SELECT y ...)`` over DOUBLEs was refused for every data (the subquery's
  own output name copied into ``ISNAN((SELECT ...) AS _col_0)``).

Tried and held (no test added): ROUND/FLOOR/CEIL/SIGN/SQRT/LN/LOG/EXP/POW, ``%``, GREATEST,
COALESCE, NULLIF, IF, CASE, CAST/TRY_CAST to FLOAT/REAL/FLOAT4/FLOAT8 of -0.0 as GROUP BY keys
(spelled); GROUP BY CUBE/ROLLUP/GROUPING SETS with a DOUBLE key, GROUPING(), HAVING, GROUP BY
an alias or ordinal, a scalar subquery, a CTE, nested set operations, EXCEPT, JOIN USING on
DOUBLE keys, COUNT(*) OVER (PARTITION BY a DOUBLE) (a row's own value), FIRST_VALUE/LAG with a
default, SUM/AVG(DISTINCT), DISTINCT with ORDER BY an expression, keys over released cells
(SUM, AVG, COUNT as DOUBLE; the rewrite writes ``SUM(-income * 0)`` as a count times 0), cell
frames grouped by ``CEIL(<age> / -1000)``, MIN ... OVER () over cells (all spelled or
answered); equal intervals (months, days and microseconds of both signs: ``normalized_interval``
gives each class one text); correlated subqueries, DISTINCT ON, QUALIFY, FILTER, UNION BY NAME,
casts to a schema-qualified type and to UNION (refused by the policy); a UNION of a DOUBLE and
a VARCHAR column (DuckDB makes it a VARCHAR); ``//`` by a non-literal or negative divisor over
confidential values (refused); the Spark path (IntDiv, EXTRACT and intervals are not portable:
refused before Spark runs; GROUP BY, DISTINCT, MIN, UNION of -0.0 and NaN answered in one
spelling, FLOOR/CEIL/ROUND/NULLIF keys as on DuckDB). DATE_PART, TRUNC, TO_DAYS, AGE and the
like are outside the allowlist, so sqlglot's unknown types for them are not reached.

Left open (not a test): keys whose type the inference cannot tell at all are left unspelled,
not refused; the rewrite's own cell columns (``__cells.__y0``, ``__sup.count__value``) have no
types, and refusing them would refuse most queries. No way was found to make a released cell
-0.0 or NaN (SUM of zeros is 0.0, the rewrite folds constant factors out of SUM).
"""

from __future__ import annotations

import datetime
import math

import duckdb
import pytest
import sqlglot
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify

import sqlsdc
from sqlsdc.rewrite.spelling import _kind
from tests.security.test_redteam_s34 import NOBODY, RARE, SOME, _answer, _inner

_DECIMAL_ZERO = "(CAST(n AS DECIMAL(10, 2)) * 0)"
_JULIAN_ZERO = "(EXTRACT(julian FROM CAST('2020-01-01' AS DATE)) * (n * 0))"
# -0.0 on the municipalities of SOME and 0.0 elsewhere, of types the inference got wrong
DECIMAL_SIGNED = f"CASE WHEN k IN {SOME} THEN {_DECIMAL_ZERO} // -1 ELSE {_DECIMAL_ZERO} // 1 END"
JULIAN_SIGNED = f"CASE WHEN k IN {SOME} THEN -{_JULIAN_ZERO} ELSE {_JULIAN_ZERO} END"
# -0.0 everywhere: whatever the engine reads first, unspelled it is -0.0
DECIMAL_NEGATIVE = f"{_DECIMAL_ZERO} // -1"
JULIAN_NEGATIVE = f"-{_JULIAN_ZERO}"
_T0 = "CAST('2020-01-01' AS TIMESTAMP)"
_DAYS_30 = f"(CAST('2020-01-02' AS TIMESTAMP) - {_T0}) * (30 + n * 0)"  # '30 days'
_HOURS_720 = f"(CAST('2020-01-01 01:00' AS TIMESTAMP) - {_T0}) * (720 + n * 0)"  # '720:00:00'
INTERVAL_MIXED = f"CASE WHEN k IN {SOME} THEN {_DAYS_30} ELSE {_HOURS_720} END"


@pytest.mark.parametrize(
    "value",
    [DECIMAL_SIGNED, JULIAN_SIGNED, DECIMAL_NEGATIVE, JULIAN_NEGATIVE],
    ids=["decimal_div", "julian", "decimal_div_negative", "julian_negative"],
)
@pytest.mark.parametrize(
    "template",
    [
        "SELECT 1 / x FROM (SELECT {value} AS x FROM ({{inner}}) t) u GROUP BY x",
        "SELECT 1 / x FROM (SELECT DISTINCT {value} AS x FROM ({{inner}}) t) u",
        # 1e0, not 1.0: sqlglot types EXTRACT(julian) BIGINT, and a set operation of an exact
        # value with a DECIMAL must mix without a failing cast (red team s36b)
        "SELECT 1 / x FROM (SELECT {value} AS x FROM ({{inner}}) t UNION SELECT 1e0) u WHERE x = 0",
        "SELECT 1 / MIN({value}) FROM ({{inner}}) t",
        "SELECT 1 / MAX({value}) FROM ({{inner}}) t",
    ],
    ids=["group_by", "distinct", "union", "min", "max"],
)
def test_doubles_sqlglot_types_otherwise_are_kept_in_one_spelling(ckm, template, value):
    """Before: -inf from every form but MIN and MAX of the signed values (which read 0.0
    first on the demo), for the person's true age and for nobody alike: the engine's first
    read, unspelled."""
    sql = template.format(value=value)
    for condition in (RARE, NOBODY):
        assert _answer(ckm, condition, sql) == [(math.inf,)]


@pytest.mark.parametrize(
    "template",
    [
        f"SELECT CAST(x AS VARCHAR) FROM (SELECT {INTERVAL_MIXED} AS x FROM ({{inner}}) t) u "
        "GROUP BY x",
        f"SELECT CAST(x AS VARCHAR) FROM (SELECT DISTINCT {INTERVAL_MIXED} AS x "
        "FROM ({inner}) t) u",
        f"SELECT CAST(MIN({INTERVAL_MIXED}) AS VARCHAR) FROM ({{inner}}) t",
    ],
    ids=["group_by", "distinct", "min"],
)
def test_a_difference_of_timestamps_is_kept_as_a_normalised_interval(ckm, template):
    """Before: '30 days' or '720:00:00' (equal intervals) as the engine read them first; MIN
    was refused (a 'TIMESTAMP' without one spelling)."""
    for condition in (RARE, NOBODY):
        assert _answer(ckm, condition, template) == [("1 month",)]


_LIST = "CAST('[' || CAST(-(CAST(n AS DOUBLE) * 0) AS VARCHAR) || ']' AS DOUBLE[])"
_STRUCT = "(-(CAST(n AS DOUBLE) * 0), 1)"


@pytest.mark.parametrize(
    "template",
    [
        f"SELECT CAST(x AS VARCHAR) FROM (SELECT {_LIST} AS x FROM ({{inner}}) t) u GROUP BY x",
        f"SELECT CAST(x AS VARCHAR) FROM (SELECT DISTINCT {_LIST} AS x FROM ({{inner}}) t) u",
        f"SELECT CAST(x AS VARCHAR) FROM (SELECT {_STRUCT} AS x FROM ({{inner}}) t) u GROUP BY x",
        f"SELECT CAST(x AS VARCHAR) FROM (SELECT DISTINCT {_STRUCT} AS x FROM ({{inner}}) t) u",
        f"SELECT CAST(x AS VARCHAR) FROM (SELECT {_STRUCT} AS x FROM ({{inner}}) t UNION "
        f"SELECT {_STRUCT} FROM ({{inner}}) t) u",
    ],
    ids=["list_group_by", "list_distinct", "struct_group_by", "struct_distinct", "struct_union"],
)
def test_a_struct_or_list_kept_among_equal_ones_is_refused(ckm, template):
    """Before: '[-0.0]' and '(-0.0, 1)', the representative the engine read first (0.0 and
    -0.0 group together). SQL alone cannot spell a list's or struct's floats: refused, for
    every data."""
    # a UNION of structs is refused earlier: its values' types are not known (red team s36b)
    kept = "struct, list or VARIANT the query keeps|set operation's column"
    with pytest.raises(sqlsdc.PolicyViolation, match=kept):
        _answer(ckm, NOBODY, template)


def test_grouping_by_a_tuple_of_keys_is_still_answered(ckm):
    """``GROUP BY (a, b)`` groups by a and b (not by a struct): answered, keys spelled."""
    rows = _answer(
        ckm, NOBODY, "SELECT 1 / x, k FROM (SELECT -(CAST(n AS DOUBLE) * 0) AS x, k "
        "FROM ({inner}) t) u GROUP BY (x, k)"
    )  # fmt: skip
    assert rows and {row[0] for row in rows} == {math.inf}


_COUNTS_BY_AGE = "(SELECT age, COUNT(*) AS c FROM persons GROUP BY age) t"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT MIN(CAST('2020-01-05' AS TIMESTAMP) - age * INTERVAL 1 DAY) FROM " + _COUNTS_BY_AGE,
        "SELECT MAX(CAST(CAST('2020-01-01' AS DATE) AS TIMESTAMP) + c * INTERVAL 1 DAY) "
        "FROM " + _COUNTS_BY_AGE,
        "SELECT DISTINCT CAST('2020-01-05' AS TIMESTAMP) - age * INTERVAL 1 DAY AS x "
        "FROM " + _COUNTS_BY_AGE,
        "SELECT MIN(CAST('10:00' AS TIME) + age * INTERVAL 1 MINUTE) FROM " + _COUNTS_BY_AGE,
        "SELECT DISTINCT CAST('10:00' AS TIME) + age * INTERVAL 1 MINUTE AS x FROM "
        + _COUNTS_BY_AGE,
        "SELECT x FROM (SELECT CAST('10:00' AS TIME) - age * INTERVAL 1 MINUTE AS x FROM "
        + _COUNTS_BY_AGE
        + ") u GROUP BY x",
    ],
    ids=[
        "min_time_minus_interval",
        "max_of_a_cast_timestamp",
        "distinct_time_minus_interval",
        "min_clock_time_plus_interval",
        "distinct_clock_time_plus_interval",
        "group_by_clock_time_minus_interval",
    ],
)
def test_times_are_kept_as_times(ckm, sql):
    """Before: an engine failure (``normalized_interval`` of a TIMESTAMP or a TIME: a time
    plus or minus an interval was called an INTERVAL) or a refusal (a TIMESTAMP 'without one
    spelling'): a time has one."""
    rows = ckm.execute(sql).fetchall()
    assert rows and all(isinstance(row[0], (datetime.datetime, datetime.time)) for row in rows)


_NAN = "(CAST(n AS DOUBLE) * 1e308 * 10 * 0)"  # inf * 0: the x86 NaN, -NaN; not a constant
_DECIMAL_TIMES_NAN = f"CAST(n AS DECIMAL(10, 2)) * {_NAN}"  # a DOUBLE; sqlglot: DECIMAL


@pytest.mark.parametrize(
    "template",
    [
        f"SELECT CAST(s AS VARCHAR) FROM (SELECT k, SUM({_DECIMAL_TIMES_NAN}) AS s "
        "FROM ({inner}) t GROUP BY k) v GROUP BY s",
        f"SELECT CAST(s AS VARCHAR) FROM (SELECT DISTINCT SUM({_DECIMAL_TIMES_NAN}) AS s "
        "FROM ({inner}) t GROUP BY k) v",
        f"SELECT CAST(s AS VARCHAR) FROM (SELECT k, SUM({_DECIMAL_TIMES_NAN}) OVER "
        "(PARTITION BY k) AS s FROM ({inner}) t) v GROUP BY s",
        f"SELECT CAST(s AS VARCHAR) FROM (SELECT SUM({_DECIMAL_TIMES_NAN}) AS s "
        "FROM ({inner}) t GROUP BY k UNION SELECT 1.0) v WHERE s <> 1",
    ],
    ids=["group_by", "distinct", "window_group_by", "union"],
)
def test_a_sum_of_doubles_sqlglot_types_otherwise_is_kept_in_one_spelling(ckm, template):
    """SUM's type was sqlglot's, which follows its argument's (a DECIMAL times a DOUBLE is a
    DECIMAL to sqlglot, a DOUBLE to DuckDB), and the rewrite's ordered SUM (``SUM(x ORDER BY
    x)``) hid the argument: before, '-nan' from every form. SUM, MIN, LAG and the others now
    take their argument's type where it has several spellings."""
    for condition in (RARE, NOBODY):
        assert _answer(ckm, condition, template) == [("nan",)]


def test_a_union_of_scalar_subqueries_over_doubles_is_answered(ckm):
    """Before: refused for every data ("DuckDB refuses the text of this statement"): the second
    operand's scalar subquery carries its output name in place (``(SELECT ...) AS _col_0``),
    and the spelling copied it into ``ISNAN((SELECT ...) AS _col_0)``."""
    one = "(SELECT CAST(n AS DOUBLE) FROM ({inner}) s WHERE s.k = '{k}')"
    sql = f"SELECT {one} AS x UNION SELECT {one.replace('{k}', '{j}')}"
    inner = _inner(NOBODY)
    counts = dict(ckm.execute(f"SELECT k, n FROM ({inner}) t").fetchall())
    rows = ckm.execute(sql.format(inner=inner, k="R08-M001", j="R08-M003")).fetchall()
    assert sorted(rows) == sorted({(float(counts["R08-M001"]),), (float(counts["R08-M003"]),)})


_CEIL_NEGATIVE = "CEIL(CAST(n AS DECIMAL(10, 2)) / -1000)"  # CEIL(-0.01): -0.0, a DOUBLE


@pytest.mark.parametrize(
    "template",
    [
        f"SELECT 1 / x FROM (SELECT {_CEIL_NEGATIVE} AS x FROM ({{inner}}) t) u GROUP BY x",
        f"SELECT 1 / x FROM (SELECT DISTINCT {_CEIL_NEGATIVE} AS x FROM ({{inner}}) t) u",
        f"SELECT 1 / MIN({_CEIL_NEGATIVE}) FROM ({{inner}}) t",
    ],
    ids=["group_by", "distinct", "min"],
)
def test_floor_and_ceil_of_a_double_are_kept_in_one_spelling(ckm, template):
    """sqlglot gives FLOOR and CEIL of a DECIMAL (``CAST(n AS DECIMAL) / -1000``, a DOUBLE to
    DuckDB) no type. Before: -inf from the GROUP BY and DISTINCT (an unknown type went
    unspelled), MIN refused (an unknown type)."""
    for condition in (RARE, NOBODY):
        assert _answer(ckm, condition, template) == [(math.inf,)]


def test_min_of_floor_and_ceil_of_decimals_is_answered(ckm):
    """Before: refused ('values of its type (unknown) cannot be written in one spelling'):
    FLOOR and CEIL of a DECIMAL are DECIMALs, of one spelling."""
    template = (
        "SELECT MIN(FLOOR(CAST(n AS DECIMAL(10, 2)))), MAX(CEIL(CAST(n AS DECIMAL(10, 1)) / 3)) "
        "FROM ({inner}) t"
    )
    counts = [n for _, n in _answer(ckm, NOBODY, "SELECT k, n FROM ({inner}) t")]
    ((low, high),) = _answer(ckm, NOBODY, template)
    assert low == min(counts) and high == math.ceil(max(counts) / 3)


_VARIANT_ZERO = "CAST(-(CAST(n AS DOUBLE) * 0) AS VARIANT)"
_VARIANT_SCALES = (
    f"CASE WHEN k IN {SOME} THEN CAST(CAST(n * 0 AS DECIMAL(5, 2)) AS VARIANT) "
    "ELSE CAST(CAST(n * 0 AS DECIMAL(5, 1)) AS VARIANT) END"
)


@pytest.mark.parametrize(
    "template",
    [
        f"SELECT CAST(x AS VARCHAR) FROM (SELECT {_VARIANT_ZERO} AS x FROM ({{inner}}) t) u "
        "GROUP BY x",
        f"SELECT CAST(x AS VARCHAR) FROM (SELECT DISTINCT {_VARIANT_ZERO} AS x "
        "FROM ({inner}) t) u",
        f"SELECT CAST(x AS VARCHAR) FROM (SELECT {_VARIANT_SCALES} AS x FROM ({{inner}}) t) u "
        "GROUP BY x",
    ],
    ids=["zero_group_by", "zero_distinct", "decimal_scales_group_by"],
)
def test_a_variant_kept_among_equal_ones_is_refused(ckm, template):
    """DuckDB 2.0's VARIANT holds a value of any type and compares it by value: -0.0 equals
    0.0, and a DECIMAL(5, 2) 0.00 equals a DECIMAL(5, 1) 0.0, yet they print differently.
    Before: '-0.0' (the engine's first read, unspelled: sqlglot's VARIANT is no float), and
    '0.00' or '0.0' as the engine read SOME's municipalities first or not."""
    with pytest.raises(sqlsdc.PolicyViolation, match="struct, list or VARIANT the query keeps"):
        _answer(ckm, NOBODY, template)


def _chained(links: int, value: str) -> str:
    ctes = [f"c0 AS (SELECT {value} AS x FROM ({{inner}}) t)"]
    ctes += [f"c{i} AS (SELECT x FROM c{i - 1})" for i in range(1, links + 1)]
    return f"WITH {', '.join(ctes)} SELECT 1 / x FROM c{links} GROUP BY x"


def test_a_type_told_through_a_long_chain_of_ctes_is_kept_in_one_spelling(ckm):
    """The inference followed a column through at most 64 steps, then took sqlglot's type
    (a DECIMAL for a DECIMAL's ``//``, a DOUBLE): before, -inf through 80 CTEs (inf through
    40). Now the type is followed further, and past that the query is refused."""
    value = f"{_DECIMAL_ZERO} // -1"
    assert _answer(ckm, NOBODY, _chained(80, value)) == [(math.inf,)]
    # past the inference's reach, or (since session 37) past 128 SELECT blocks altogether
    with pytest.raises(sqlsdc.PolicyViolation, match="cannot tell the type|too complex"):
        _answer(ckm, NOBODY, _chained(160, value))


_T_PLUS_NOTHING = "(CAST('2020-01-01' AS TIMESTAMP) + n * INTERVAL 0 DAY)"


@pytest.mark.parametrize(
    "template",
    [
        "SELECT 1 / x FROM (SELECT DISTINCT CAST(-n AS DECIMAL(10, 2)) % CAST(1 AS HUGEINT) AS x "
        "FROM ({inner}) t) u",
        "SELECT 1 / x FROM (SELECT CAST(-n AS DECIMAL(38, 20)) % CAST(1 AS DECIMAL(38, 0)) AS x "
        "FROM ({inner}) t) u GROUP BY x",
        "SELECT 1 / MIN(CAST(-n AS DECIMAL(38, 20)) % CAST(1 AS DECIMAL(38, 0))) FROM ({inner}) t",
        "SELECT 1 / x FROM (SELECT DISTINCT '-0.0' - CAST(n AS DECIMAL(10, 2)) * 0 AS x "
        "FROM ({inner}) t) u",
    ],
    ids=["decimal_mod_hugeint", "mod_past_38_digits", "min_mod_past_38_digits", "string_minus"],
)
def test_decimal_arithmetic_duckdb_computes_as_a_double_is_kept_in_one_spelling(ckm, template):
    """DuckDB computes a DECIMAL's remainder by a HUGEINT, or one past 38 digits, and a string
    minus a DECIMAL as DOUBLEs (fmod(-n, 1) is -0.0); sqlglot calls them DECIMALs. Before:
    -inf from each."""
    for condition in (RARE, NOBODY):
        assert _answer(ckm, condition, template) == [(math.inf,)]


@pytest.mark.parametrize(
    "template",
    [
        f"SELECT CAST(x AS VARCHAR) FROM (SELECT DISTINCT '2020-01-31' - {_T_PLUS_NOTHING} AS x "
        "FROM ({inner}) t) u",
        f"SELECT CAST(x AS VARCHAR) FROM (SELECT '2020-01-31' - {_T_PLUS_NOTHING} AS x "
        "FROM ({inner}) t) u GROUP BY x",
    ],
    ids=["distinct", "group_by"],
)
def test_a_string_minus_a_timestamp_is_kept_as_a_normalised_interval(ckm, template):
    """A string minus a TIMESTAMP is the string read as a TIMESTAMP, minus it: an INTERVAL.
    Before: '30 days'."""
    for condition in (RARE, NOBODY):
        assert _answer(ckm, condition, template) == [("1 month",)]


def test_a_number_plus_a_date_is_kept_as_a_date(ckm):
    """sqlglot calls ROUND(<integer>, 1) a DOUBLE, and so the sum with a DATE (a DATE to
    DuckDB). Before: refused for every data (an engine failure: ISNAN of a DATE)."""
    template = (
        "SELECT DISTINCT ROUND(CAST(n AS INTEGER), 1) + CAST('2020-01-01' AS DATE) AS x "
        "FROM ({inner}) t ORDER BY x"
    )
    rows = _answer(ckm, NOBODY, template)
    assert rows and all(isinstance(x, datetime.date) for (x,) in rows)


_TYPED = (
    "(SELECT CAST(1 AS BIGINT) AS n, CAST(2 AS INTEGER) AS i, CAST(1.5 AS DOUBLE) AS d, "
    "CAST(1.5 AS DECIMAL(10, 2)) AS m, CAST(1.5 AS DECIMAL(38, 20)) AS w, DATE '2020-01-01' AS dt, "
    "TIMESTAMP '2020-01-01' AS ts, INTERVAL 1 DAY AS iv, TIME '10:00' AS tm, "
    "CAST(3 AS HUGEINT) AS h, TRUE AS b) t"
)


@pytest.mark.parametrize(
    "value",
    [
        # DOUBLEs and INTERVALs sqlglot types otherwise (found by a sweep of the allowed
        # operators and functions over these types, and 20,000 random nestings of them)
        "m // 2", "w % CAST(1 AS DECIMAL(38, 0))", "m % h", "'1' - m", "m + '1'",
        "EXTRACT(julian FROM dt)", "ts - ts", "dt - ts", "'2020-01-01' - ts", "(ts - ts) * 30",
        "FLOOR(n)", "CEIL(m / 3)", "FLOOR(m // 2)", "DATE_TRUNC('day', h * iv)", "SUM(m * d)",
        "MIN(m // 2)", "LAG(m // 2) OVER ()", "'1' - dt - d",
        # and values of one spelling it must not write as a DOUBLE or an INTERVAL
        "ts - INTERVAL 1 DAY", "tm + INTERVAL 1 MINUTE", "ROUND(i, 1) + dt", "NULLIF(1, iv)",
        "CAST(CAST(m AS DATE) AS TIMESTAMP)", "FLOOR(m)", "ROUND(i)", "'1' - dt",
    ],
)  # fmt: skip
def test_the_inferred_type_is_duckdb_s(value):
    """The rewrite's type inference against DuckDB's own: a value DuckDB computes as a DOUBLE,
    a FLOAT or an INTERVAL is spelled, a time, an integer or a string is not (a DECIMAL may
    be: ``x + 0`` keeps it a DECIMAL)."""
    grouped = " GROUP BY ALL" if value.startswith(("SUM", "MIN")) else ""
    sql = f"SELECT {value} AS x FROM {_TYPED}{grouped}"
    con = duckdb.connect()
    try:
        actual = con.execute(f"SELECT typeof(x) FROM ({sql})").fetchone()[0]
    finally:
        con.close()
    tree = qualify(sqlglot.parse_one(sql, read="duckdb"), dialect="duckdb")
    kind = _kind(annotate_types(tree, dialect="duckdb").selects[0].unalias(), tree)
    spelled = kind is not None and kind.this.name in ("DOUBLE", "FLOAT", "INTERVAL")
    if actual.startswith("DECIMAL"):
        assert kind is not None
    else:
        assert spelled == (actual in ("DOUBLE", "FLOAT", "INTERVAL")), (actual, kind)


@pytest.mark.parametrize(
    "template",
    [
        "SELECT COUNT(DISTINCT (n, k)) FROM ({inner}) t",
        "SELECT COUNT(DISTINCT (CAST(n AS DOUBLE) * 0, k)) FROM ({inner}) t",
        "SELECT COUNT(*) FROM (SELECT DISTINCT (n, k) AS s FROM ({inner}) t) u",
        "SELECT COUNT(*) FROM (SELECT s FROM (SELECT (n, (n, k)) AS s FROM ({inner}) t) u "
        "GROUP BY s) v",
    ],
    ids=["count_distinct", "count_distinct_of_floats", "distinct", "group_by_nested"],
)
def test_structs_of_one_spelling_and_counts_of_structs_are_answered(ckm, template):
    """Structs whose fields have one spelling each are kept as any value; COUNT(DISTINCT ...)
    keeps no value, only counts the classes. Refused in an intermediate version of this
    round's fix (a tuple's type was a STRUCT of unknown fields)."""
    municipalities = len(_answer(ckm, NOBODY, "SELECT k FROM ({inner}) t"))
    assert _answer(ckm, NOBODY, template) == [(municipalities,)]
