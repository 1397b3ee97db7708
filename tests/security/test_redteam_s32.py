"""Red-team round of session 32, with an analyst's connection only.

What succeeded, and was closed:

* **string and wide literals compared with stored values** (error oracles): DuckDB casts a
  string literal compared with a column to the column's exact type, row by row (a cast that
  fails is not folded, so it fails only where it is evaluated), and the guard judged the
  literal by the column's type *family*: ``int_col = '99999999999'`` (a BIGINT's digits, no
  INTEGER), ``tinyint_col = '300'``, ``utinyint_col = '-1'``, ``decimal_4_1_col = '99999'``,
  date texts Python's ``fromisoformat`` reads and DuckDB does not (``'20200101'``,
  ``'2020-W01-1'``, ``'2020-01-01T10'``, a trailing space), dates outside TIMESTAMP_NS's
  range compared with one, and time-of-day columns with dates. Likewise an integer literal of
  39 digits (a HUGEINT or UHUGEINT) compared with an INTEGER or DECIMAL column, and date
  literals of years outside 1678-2261 mixed with a TIMESTAMP_NS in a CASE or COALESCE. Inside
  ``CASE WHEN <condition on dimensions> THEN <comparison> ELSE TRUE END`` each failed in the
  engine exactly when a row met the condition: whether one person of the demo (municipality
  R08-M019, aged 66) exists, through ``age = '99999999999'``. The literal must now fit the
  operand's exact type (``sqlsdc.planner.totality._literal_converts``: a stored column's or
  a cast's; a derived table's column is typed by sqlglot's inference, which called
  ``tinyint_col // 2`` an INTEGER), and a literal of more than 38 digits is mixed with no
  other exact number (``sqlsdc.planner.exact_mixing``).
* **exact constants whose type sqlglot guessed** (error oracles): ``int_col = 1.000…0 * 1``
  (30 decimals) is DECIMAL(38, 30) in DuckDB, so comparing it with an INTEGER casts the
  column to DECIMAL(38, 30), which fails for values of 10^8 and more; sqlglot typed the
  product DOUBLE (or the exact-mixing check took it for a BIGINT), and ``ROUND(1.0…0, 30)``,
  ``ABS(…)``, ``NULLIF(…, 0)``, ``CASE WHEN TRUE THEN … END``, ``(SELECT … * 1)`` and
  ``hugeint_col = 1.5 * 1`` likewise. Inside a CASE on dimensions each failed in the engine
  exactly when the chosen person held a large value. A constant now carries the type the
  engine gives it when it is evaluated before the query (``evaluate_constant`` returns it),
  sums and products of exact constants are shaped from their terms, and an exact constant
  of a type neither knows (inside a subquery) is mixed with no other exact number.
* **values sqlglot types DOUBLE that DuckDB types DECIMAL**: sqlglot types a DECIMAL
  literal DOUBLE, and so a CASE or COALESCE of such literals and a derived table's column
  that selects one; a DOUBLE mixes with any number, so ``CASE WHEN k = 0 THEN 1.0…0 ELSE 1.5
  END = big`` and ``(SELECT 1.0…0 AS h …) q WHERE h = big`` failed only when reached. A
  choice's family is now its values', and a derived column carries the family and shape of
  the value it selects (``sqlsdc.planner.total_checks._type_column``). A sweep of 1,360
  derived-column comparisons over the sweep's exact-number columns found 79 such oracles
  before, none after.

Tried and held (no test added): window frames over CKM and threshold cells with RANGE
offsets that overflow (their keys and values are released ones), CTEs named like tables, joins
through derived tables that could repeat rows (ROLLUP, GROUPING SETS, UNION, LIMIT, DISTINCT
of several columns), SUM(1)/SUM(CASE …) against COUNT(*) (one noise), DATE_TRUNC of the
first decades of TIMESTAMP's range for every part, DATE_TRUNC of TIMESTAMP_NS compared with
TIMESTAMP_NS (refused), constants of every type evaluated early, parameters of odd Python
types, the suppression pattern of the geography hierarchy against simple subtraction.
"""

from __future__ import annotations

import pytest

import sqlsdc
from tests.security.test_redteam_s30b import dimensions_table

RARE = "municipality = 'R08-M019' AND age = 66"  # one person of the demo (seed 7)
NOBODY = "municipality = 'R08-M019' AND age = 200"


@pytest.mark.parametrize(
    "comparison", ["age = '99999999999'", "age = 340282366920938463463374607431768211455"]
)
def test_a_literal_the_column_cannot_hold_is_no_oracle_on_the_demo(ckm, comparison):
    """The attack on the shipped demo: before, the first query failed in the engine and the
    second was answered (one person is aged 66 in R08-M019). Both are refused now."""
    for condition in (RARE, NOBODY):
        sql = (
            f"SELECT region, COUNT(*) FROM persons WHERE CASE WHEN {condition} THEN "
            f"{comparison} ELSE TRUE END GROUP BY region"
        )
        with pytest.raises(sqlsdc.PolicyViolation, match="could raise an error"):
            ckm.execute(sql)


@pytest.fixture(scope="module")
def typed(tmp_path_factory):
    """A CKM table whose pid 7 alone has k = 1, with columns of narrow exact and temporal
    types (everyone's values ordinary)."""
    columns = {
        "k": "CASE WHEN i = 7 THEN 1 ELSE 0 END",
        "ti": "CAST(i % 100 AS TINYINT)",
        "ii": "CAST(i AS INTEGER)",
        "ui": "CAST(i % 100 AS UTINYINT)",
        "de": "CAST(i % 100 AS DECIMAL(4,1))",
        "d": "DATE '2020-01-01' + CAST(i % 700 AS INTEGER)",
        "ts": "TIMESTAMP '2020-01-01' + to_hours(i)",
        "tns": "CAST(TIMESTAMP '2020-01-01' + to_hours(i) AS TIMESTAMP_NS)",
        "tm": "TIME '10:00' + to_minutes(i % 600)",
    }
    with dimensions_table(tmp_path_factory.mktemp("typed") / "t.duckdb", columns, 200) as con:
        yield con


FAILED_FOR_K_1 = [  # each failed in the engine when k = 1 selected pid 7, answered for k = 2
    "ii = '99999999999'",
    "ti = '300'",
    "ui = '-1'",
    "ii IN ('1', '99999999999')",
    "ii BETWEEN '1' AND '99999999999'",
    "de = '99999'",
    "de = '99999999999999999999999999999999999999999'",
    "de = 170141183460469231731687303715884105727",
    "ii = 170141183460469231731687303715884105728",
    "d = '20200101'",
    "d = '2020-W01-1'",
    "d > '2020-01-01 1000'",
    "ts = '2020-01-01T10'",
    "ts = '2020-01-01 10:00:00,5'",
    "ts = '2020-01-01 '",
    "tns = '0001-01-01'",
    "tns = '9999-12-31'",
    "CASE WHEN k = {v} THEN CAST('0001-01-01' AS DATE) ELSE "
    "CAST('2020-01-01' AS TIMESTAMP_NS) END IS NULL",
    "COALESCE(CASE WHEN k = {v} THEN CAST('9999-01-01' AS TIMESTAMP) END, "
    "CAST('2020-01-01' AS TIMESTAMP_NS)) IS NULL",
]


@pytest.mark.parametrize("comparison", FAILED_FOR_K_1)
def test_a_literal_cast_to_a_columns_type_must_fit_it(typed, comparison):
    for v in (1, 2):
        condition = comparison.format(v=v)
        if "{v}" not in comparison:
            condition = f"CASE WHEN k = {v} THEN {comparison} ELSE TRUE END"
        with pytest.raises(sqlsdc.PolicyViolation, match="could raise an error"):
            typed.execute(f"SELECT g, COUNT(*) FROM t WHERE {condition} GROUP BY g")


@pytest.mark.parametrize(
    "inner",
    ["ti // 2", "GREATEST(ti, 5)", "CASE WHEN k = 0 THEN ti ELSE 1 END", "COALESCE(ti, 1)"],
)
def test_a_derived_column_is_no_wider_than_the_engine_types_it(typed, inner):
    """sqlglot types ``tinyint_col // 2`` (and GREATEST, COALESCE, CASE of it) INTEGER, DuckDB
    TINYINT: through a derived table, ``h = '200'`` passed as an INTEGER's literal and failed
    in the engine exactly when the branch was reached. Only a stored column's type is
    trusted now."""
    for v in (1, 2):
        with pytest.raises(sqlsdc.PolicyViolation, match="could raise an error"):
            typed.execute(
                f"SELECT g, COUNT(*) FROM (SELECT g, k, {inner} AS h FROM t) AS q "
                f"WHERE CASE WHEN k = {v} THEN h = '200' ELSE TRUE END GROUP BY g"
            )


@pytest.mark.parametrize(
    "condition",
    [
        "ii = '150'",
        "ti IN ('1', '-5', '127')",
        "ui BETWEEN '0' AND '255'",
        "de = '12.5'",
        "d = '2020-03-01'",
        "d < '2020-03-01 12:00:00'",
        "ts >= '2020-01-02T05:30'",
        "tns < '2020-01-03 10:00:00.5'",
        "tm > '12:30'",
        "ii = 99999999999",
        "year(d) = '2020'",
        "CASE WHEN k = 1 THEN CAST('2000-01-01' AS DATE) ELSE CAST('2020-01-01' AS "
        "TIMESTAMP_NS) END IS NULL",
    ],
)
def test_literals_of_the_columns_type_are_still_compared(typed, condition):
    """Answered (a cell may be dropped by the cell key method: the answer may be empty)."""
    typed.execute(f"SELECT g, COUNT(*) FROM t WHERE {condition} GROUP BY g").fetchall()


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A CKM table whose pid 7 alone has k = 1 and large exact values."""
    columns = {
        "k": "CASE WHEN i = 7 THEN 1 ELSE 0 END",
        "big": "CAST(CASE WHEN i = 7 THEN 2000000000 ELSE i END AS INTEGER)",
        "hu": "CAST(CASE WHEN i = 7 THEN 170141183460469231731687303715884105727 ELSE i END "
        "AS HUGEINT)",
    }
    with dimensions_table(tmp_path_factory.mktemp("wide") / "t.duckdb", columns, 200) as con:
        yield con


D30 = "1." + "0" * 30  # DECIMAL(31, 30)


@pytest.mark.parametrize(
    "comparison",
    [
        f"big = {D30} * 1",
        f"big = {D30} + 0",
        f"big IN (1, {D30} * 1)",
        f"big BETWEEN 0 AND {D30} * 1",
        f"COALESCE(big, {D30} * 1) = 1",
        f"GREATEST(big, {D30} * 1) = 1",
        f"big = ROUND({D30}, 30)",
        f"big = ABS({D30})",
        f"big = NULLIF({D30}, 0)",
        f"big = CASE WHEN TRUE THEN {D30} END",
        f"big = (SELECT {D30} * 1)",
        "hu = 1.5 * 1",
        "hu = 0.5 + 0",
    ],
)
def test_an_exact_constant_is_mixed_as_the_engine_types_it(wide, comparison):
    """Each failed in the engine when k = 1 selected pid 7 (its large value cannot be cast to
    the constant's DECIMAL type), and was answered for k = 2."""
    for v in (1, 2):
        condition = f"CASE WHEN k = {v} THEN {comparison} ELSE TRUE END"
        sql = f"SELECT g, COUNT(*) FROM t WHERE {condition} GROUP BY g"
        with pytest.raises(sqlsdc.PolicyViolation, match="could raise an error"):
            wide.execute(sql)


@pytest.mark.parametrize(
    "comparison",
    ["big = 1.5 * 1", "big > 17 + 1", "big = (SELECT 5)", f"big = FLOOR({D30})", "hu = 1 / 2"],
)
def test_exact_constants_that_fit_are_still_compared(wide, comparison):
    wide.execute(f"SELECT g, COUNT(*) FROM t WHERE {comparison} GROUP BY g").fetchall()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The error-oracle sweep's table (``tests/security/test_error_oracle_sweep.py``) with its
    exact-number columns."""
    from tests.security.test_error_oracle_sweep import COLUMNS, build
    from tests.security.test_redteam_s28e import CKM

    names = ["ti_min", "in_min", "bi_min", "ub_max", "uh_max", "de4", "de18", "de38", "de38_0"]
    columns = {name: COLUMNS[name] for name in names}
    with build(tmp_path_factory.mktemp("sweep32") / "t.duckdb", CKM, columns) as con:
        yield con


WIDE = "170141183460469231731687303715884105727"  # a HUGEINT literal
WIDER = "340282366920938463463374607431768211455"  # an UHUGEINT literal


@pytest.mark.parametrize(
    "condition",
    [
        "ti_min = '300'",
        "NULLIF(ti_min, '300') IS NULL",
        "in_min IN ('99999999999')",
        f"in_min < {WIDER}",
        f"bi_min IN ({WIDER})",
        "ub_max = '-1'",
        "uh_max IN ('-1')",
        "de4 < '99999999999'",
        "de4 IN ('1e5')",
        f"de18 = {WIDER}",
        f"de38 < {WIDE}",
        f"GREATEST(de38_0, {WIDE}) IS NULL",
    ],
)
def test_the_sweep_s_columns_end_alike_with_or_without_a_row_in_the_branch(sweep, condition):
    """The sweep's way (each shape must end alike whether or not rows reach it), with a branch
    that some rows reach (g = 'a') and one no row reaches: each of these failed for the first
    and was answered for the second (91 of 11,340 literal comparisons of the sweep's columns;
    none since)."""
    from tests.security.test_error_oracle_sweep import outcome

    ends = {
        outcome(
            sweep,
            f"SELECT g, COUNT(*) FROM t WHERE CASE WHEN {branch} THEN {condition} "
            "ELSE TRUE END GROUP BY g",
        )  # fmt: skip
        for branch in ("g = 'a'", "g = 'nobody'")
    }
    assert ends == {"refused"}


@pytest.mark.parametrize(
    ("inner", "condition"),
    [
        (None, f"CASE WHEN k = 0 THEN {D30} ELSE 1.5 END = big"),
        (None, f"COALESCE(CASE WHEN k = 0 THEN {D30} END, 1.5) = big"),
        (f"{D30} AS h", "h = big"),
        (f"CASE WHEN k = 0 THEN {D30} ELSE 1.5 END AS h", "h = big"),
        (f"{D30} * 1 AS h", "h = big"),
        (f"CASE WHEN k = 0 THEN {D30} ELSE 1.5 END AS h", "GREATEST(h, big) IS NULL"),
    ],
)
def test_decimal_values_sqlglot_types_double_are_mixed_as_decimals(wide, inner, condition):
    """sqlglot types a DECIMAL literal DOUBLE, and so a CASE or COALESCE of them and a
    derived table's column selecting one; a DOUBLE mixes with anything, but DuckDB's
    DECIMAL(38, 30) cannot hold pid 7's large value: each failed only when the branch was
    reached. A choice's family is now its values', and a derived column's family and shape
    are those of the value it selects."""
    source = "t" if inner is None else f"(SELECT g, k, big, {inner} FROM t) AS q"
    for v in (1, 2):
        with pytest.raises(sqlsdc.PolicyViolation, match="could raise an error"):
            wide.execute(
                f"SELECT g, COUNT(*) FROM {source} WHERE CASE WHEN k = {v} THEN {condition} "
                "ELSE TRUE END GROUP BY g"
            )


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT g, COUNT(*) FROM (SELECT g, big, 1.5 AS h FROM t) AS q WHERE h < big GROUP BY g",
        "SELECT g, COUNT(*) FROM (SELECT g, big FROM t UNION ALL SELECT g, big FROM t WHERE "
        "k = 5) AS q WHERE big > 3 GROUP BY g",
        "SELECT g, COUNT(*) FROM (SELECT g, CASE WHEN k = 0 THEN big END AS h FROM t) AS q "
        "WHERE h > 3 GROUP BY g",
    ],
)
def test_derived_values_that_fit_are_still_compared(wide, sql):
    try:
        wide.execute(sql).fetchall()
    except sqlsdc.PolicyViolation as refused:  # repeated rows, not the comparison
        assert "could raise an error" not in str(refused)
