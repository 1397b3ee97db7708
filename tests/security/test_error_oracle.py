"""Error oracle: a query that fails for some data and not for other data answers a question.

``DATE_TRUNC(CASE WHEN income > 50000 THEN 'bogus' ELSE 'year' END, d)`` fails exactly when some
row satisfies the condition: one bit per query, an exact income in about 30 queries, and the
exact maximum of a DP column beyond its declared bounds, with budget charged only for the queries
that did not fail (issue 16, class 3). Every argument that can make a function fail (date part,
format, divisor, position, precision, interval amount, quantile, offset) must be a literal on
confidential rows, functions not on the signature list are refused, and functions whose amount
of work the data could drive (REPEAT, LPAD, RANGE) are refused. Each attack is tried on the
threshold demo (``analyst``) and on the demo as shipped (``ckm``: CKM, and DP for ``benefits``).
"""

from __future__ import annotations

import pytest
from sqlglot import exp

import sqlsdc
from sqlsdc.planner.allowlist import (
    OPERATORS,
    PROTECTED_AGGREGATES,
    SCALAR_FUNCTIONS,
    UNPROTECTED_AGGREGATES,
)
from sqlsdc.planner.signatures import SIGNATURES

TARGET = "municipality = 'R08-M018' AND sex = 'F' AND age = 43 AND occupation = 'craft_trades'"
D = "DATE '2020-01-01'"
BOGUS = "CASE WHEN income > 50000 THEN 'bogus' ELSE 'year' END"
LITERAL = r"must be a .*literal"
ORACLE = r"could raise an error"
NOT_ALLOWED = r"is not allowed"


def q(where: str, table: str = "persons", key: str = "region") -> str:
    return f"SELECT {key}, COUNT(*) FROM {table} WHERE {where} GROUP BY {key}"


ATTACKS = [
    # -- the issue's query and the ways to hide a data-dependent date part
    ("date_trunc_case", q(f"DATE_TRUNC({BOGUS}, {D}) IS NOT NULL"), r"date part of DATE_TRUNC"),
    (
        "date_trunc_target",
        q(f"DATE_TRUNC(CASE WHEN {TARGET} AND income > 40000 THEN 'x' ELSE 'day' END, {D}) > {D}"),
        LITERAL,
    ),
    (
        "date_trunc_coalesce",
        q(f"DATE_TRUNC(COALESCE(CASE WHEN income > 5e4 THEN 'bogus' END, 'year'), {D}) > {D}"),
        LITERAL,
    ),
    (
        "date_trunc_nullif",
        q(
            "DATE_TRUNC(COALESCE(NULLIF('year', CASE WHEN income > 5e4 THEN 'year' END), 'x'), "
            f"{D}) IS NULL"
        ),
        LITERAL,
    ),
    ("date_trunc_if", q(f"DATE_TRUNC(IF(income > 5e4, 'bogus', 'year'), {D}) IS NULL"), LITERAL),
    (
        "date_trunc_concat",
        q(f"DATE_TRUNC('ye' || CASE WHEN income > 5e4 THEN 'x' ELSE 'ar' END, {D}) IS NULL"),
        LITERAL,
    ),
    (
        "date_trunc_nested_case",
        q(
            f"DATE_TRUNC(CASE WHEN age > 30 THEN CASE WHEN income > 5e4 THEN 'x' ELSE 'day' END "
            f"ELSE 'year' END, {D}) IS NULL"
        ),
        LITERAL,
    ),
    ("date_trunc_dimension", q(f"DATE_TRUNC(education, {D}) IS NULL"), r"not valid"),
    ("date_trunc_subquery", q(f"DATE_TRUNC((SELECT 'year'), {D}) IS NULL"), LITERAL),
    (
        "date_trunc_scalar_aggregate",
        q(
            f"DATE_TRUNC((SELECT CASE WHEN COUNT(*) > 0 THEN 'x' ELSE 'year' END FROM persons "
            f"WHERE {TARGET} AND income > 50000), {D}) IS NULL"
        ),
        LITERAL,
    ),
    # -- an invalid literal in a branch that only some rows reach
    (
        "invalid_part_in_branch",
        q(f"CASE WHEN income > 5e4 THEN DATE_TRUNC('bogus', {D}) END IS NULL"),
        r"not valid",
    ),
    (
        "invalid_format_in_branch",
        q(f"CASE WHEN income > 5e4 THEN STRFTIME({D}, '%Q') END IS NULL"),
        r"not valid",
    ),
    (
        "invalid_interval_in_branch",
        q("CASE WHEN income > 5e4 THEN INTERVAL 'bogus' DAY END IS NULL"),
        r"not valid",
    ),
    # -- other parts, formats and patterns
    (
        "strftime_format",
        q(f"STRFTIME({D}, CASE WHEN income > 5e4 THEN '%Q' ELSE '%Y' END) = '2020'"),
        r"format of STRFTIME",
    ),
    ("strptime", q("STRPTIME(occupation, '%Y') IS NULL"), NOT_ALLOWED),
    (
        "strptime_format",
        q(f"STRPTIME('2020', CASE WHEN income > 5e4 THEN '%Q' ELSE '%Y' END) > {D}"),
        NOT_ALLOWED,
    ),
    (
        "regexp_pattern",
        q("REGEXP_MATCHES(occupation, CASE WHEN income > 5e4 THEN '(' END)"),
        NOT_ALLOWED,
    ),
    ("date_part", q(f"DATE_PART({BOGUS}, {D}) > 0"), NOT_ALLOWED),
    ("extract_part", q(f"EXTRACT({BOGUS} FROM {D}) > 0"), r"date part of EXTRACT"),
    # -- casts: the target is a type, so the value must always convert
    (
        "cast_text_to_int",
        q("CAST(CASE WHEN income > 5e4 THEN 'x' ELSE '1' END AS INTEGER) > 0"),
        ORACLE,
    ),
    (
        "cast_to_date",
        q(f"CAST(CASE WHEN income > 5e4 THEN 'x' ELSE '2020-01-01' END AS DATE) > {D}"),
        ORACLE,
    ),
    (
        "cast_to_interval",
        q("CAST(CASE WHEN income > 5e4 THEN 'x' ELSE '1 day' END AS INTERVAL) IS NULL"),
        ORACLE,
    ),
    ("try_cast_then_overflow", q("TRY_CAST(income AS INTEGER) * 1000000000 > 0"), ORACLE),
    ("cast_dimension", q("occupation::INTEGER > 0"), ORACLE),
    # -- interval amounts
    ("interval_column", q("INTERVAL (age) DAY IS NULL"), r"amount of INTERVAL"),
    (
        "interval_case",
        q("INTERVAL (CASE WHEN income > 5e4 THEN 'bogus' ELSE '1 day' END) IS NULL"),
        r"amount of INTERVAL",
    ),
    ("interval_arithmetic", q(f"{D} + INTERVAL (age * 1000000) DAY > {D}"), LITERAL),
    # -- division and modulo
    ("intdiv_column", q("100 // age > 1"), r"divisor of //"),
    ("mod_column", q("100 % age = 1"), r"divisor of %"),
    ("mod_case", q("age % CASE WHEN income > 5e4 THEN 0 ELSE 2 END = 1"), r"divisor of %"),
    ("intdiv_zero", q("age // 0 > 1"), r"positive number literal"),
    ("mod_negative", q("age % -1 = 0"), r"positive number literal"),
    ("intdiv_double_zero", q("income // 0.0 > 1"), r"positive number literal"),
    ("mod_measure", q("income % (income - 50000) = 0"), r"divisor of %"),
    ("divide_by_text", q("income < 50000 OR (age / 'x') IS NULL"), ORACLE),
    ("text_divided", q("income < 50000 OR ('x' / age) IS NULL"), ORACLE),
    # -- positions, precisions and indexes
    (
        "substring_start",
        q("SUBSTRING(occupation, CASE WHEN income > 5e4 THEN 9999999999 ELSE 1 END) = 'x'"),
        r"start position of SUBSTRING",
    ),
    ("substring_length", q("SUBSTRING(occupation, 1, age) = 'x'"), r"length of SUBSTRING"),
    ("substring_huge", q("SUBSTRING(occupation, 1, 9999999999) = 'x'"), r"small integer"),
    ("round_precision", q("ROUND(CAST(income AS DOUBLE), age) > 0"), r"precision of ROUND"),
    ("list_index", q("[income][CASE WHEN income > 5e4 THEN 2 ELSE 1 END] > 0"), NOT_ALLOWED),
    (
        "list_literal_index",
        q("[1, 2][CASE WHEN income > 5e4 THEN 3 ELSE 1 END] IS NULL"),
        NOT_ALLOWED,
    ),
    ("list_extract", q("list_extract([occupation], age) IS NULL"), NOT_ALLOWED),
    ("array_extract", q("array_extract(['a'], age) IS NULL"), NOT_ALLOWED),
    # -- work the data could drive (timing channel, denial of service)
    ("repeat", q("REPEAT(occupation, CAST(income AS BIGINT)) = 'x'"), r"function repeat\(\)"),
    ("lpad", q("LPAD(occupation, age * 1000, 'x') = 'x'"), r"function lpad\(\)"),
    ("rpad", q("RPAD(occupation, age, 'x') = 'x'"), NOT_ALLOWED),
    ("range", q("len(range(age)) > 0"), NOT_ALLOWED),
    ("generate_series", q("len(generate_series(1, age)) > 0"), NOT_ALLOWED),
    ("string_times_number", q("'x' * age = 'x'"), ORACLE),
    ("pow_exact", q("POW(age, 1000) > 0"), ORACLE),
    # -- every clause and scope
    (
        "group_key",
        "SELECT DATE_TRUNC(CASE WHEN age > 50 THEN 'bogus' ELSE 'year' END, DATE '2020-01-01') "
        "AS k, COUNT(*) FROM persons GROUP BY k",
        LITERAL,
    ),
    (
        "aggregate_argument",
        f"SELECT region, COUNT(CASE WHEN DATE_TRUNC({BOGUS}, {D}) IS NULL THEN 1 END) "
        "FROM persons GROUP BY region",
        LITERAL,
    ),
    (
        "sum_argument",
        f"SELECT region, SUM(CASE WHEN DATE_TRUNC({BOGUS}, {D}) > {D} THEN income END) "
        "FROM persons GROUP BY region",
        LITERAL,
    ),
    (
        "derived_table_filter",
        f"SELECT region, COUNT(*) FROM (SELECT region FROM persons WHERE "
        f"DATE_TRUNC({BOGUS}, {D}) IS NOT NULL) t GROUP BY region",
        LITERAL,
    ),
    (
        "derived_table_projection",
        f"SELECT k, COUNT(*) FROM (SELECT DATE_TRUNC({BOGUS}, {D}) AS k FROM persons) t GROUP BY k",
        LITERAL,
    ),
    (
        "cte",
        "WITH t AS (SELECT region, income FROM persons WHERE 100 % (age - 43) = 0) "
        "SELECT region, COUNT(*) FROM t GROUP BY region",
        r"divisor of %",
    ),
    (
        "cte_projection",
        f"WITH t AS (SELECT region, STRFTIME({D}, CASE WHEN income > 5e4 THEN '%Q' ELSE '%Y' END) "
        "AS y FROM persons) SELECT region, COUNT(*) FROM t GROUP BY region",
        LITERAL,
    ),
    (
        "join_on",
        "SELECT r.name, COUNT(*) FROM persons p JOIN regions r ON p.region = r.region AND "
        f"DATE_TRUNC(CASE WHEN p.income > 50000 THEN 'bogus' ELSE 'year' END, {D}) IS NOT NULL "
        "GROUP BY r.name",
        LITERAL,
    ),
    (
        "join_on_public_column",
        "SELECT r.name, COUNT(*) FROM persons p JOIN regions r ON p.region = r.region AND "
        f"DATE_TRUNC(r.name, {D}) IS NOT NULL GROUP BY r.name",
        LITERAL,
    ),
    (
        "having_key",
        f"SELECT municipality, COUNT(*) FROM persons WHERE {TARGET} GROUP BY municipality "
        "HAVING DATE_TRUNC(CASE WHEN municipality = 'R08-M018' THEN 'bogus' ELSE 'year' END, "
        f"{D}) IS NOT NULL",
        LITERAL,
    ),
    (
        "having_aggregate",
        "SELECT municipality, COUNT(*) FROM persons GROUP BY municipality "
        f"HAVING DATE_TRUNC(CASE WHEN SUM(income) > 5e6 THEN 'bogus' ELSE 'year' END, {D}) "
        "IS NOT NULL",
        LITERAL,
    ),
    (
        "having_cast_key",
        f"SELECT municipality, COUNT(*) FROM persons WHERE {TARGET} GROUP BY municipality "
        "HAVING CASE WHEN municipality = 'R08-M018' THEN CAST(municipality AS INT) END IS NULL",
        ORACLE,
    ),
    (
        "output_of_aggregation",
        f"SELECT municipality, STRFTIME({D}, CASE WHEN municipality = 'R08-M018' THEN '%Q' "
        f"ELSE '%Y' END) FROM persons WHERE {TARGET} GROUP BY municipality",
        LITERAL,
    ),
    (
        "order_by_of_aggregation",
        f"SELECT municipality, COUNT(*) FROM persons WHERE {TARGET} GROUP BY municipality "
        "ORDER BY 100 // CASE WHEN municipality = 'R08-M018' THEN 0 ELSE 1 END",
        r"divisor of //",
    ),
    (
        "round_of_aggregate",
        "SELECT municipality, ROUND(SUM(income), CASE WHEN COUNT(*) > 3 THEN 2 ELSE 1 END) "
        "FROM persons GROUP BY municipality",
        r"precision of ROUND",
    ),
    (
        "lag_offset",
        "SELECT region, LAG(COUNT(*), CASE WHEN region = 'R01' THEN -1 ELSE 1 END) "
        "OVER (ORDER BY region) FROM persons GROUP BY region",
        r"offset of LAG",
    ),
]

# Differential privacy: the same refusals on the DP table ``benefits`` (amount bounded to
# [0, 3000]): the oracle would give the exact maximum amount, beyond the declared bounds.
DP_ATTACKS = [
    (
        "dp_max_beyond_bounds",
        q(
            f"DATE_TRUNC(CASE WHEN amount > 3000 THEN 'bogus' ELSE 'year' END, {D}) IS NOT NULL",
            "benefits",
            "scheme",
        ),
        LITERAL,
    ),
    ("dp_divisor", q("100 % CAST(amount AS INTEGER) = 0", "benefits", "scheme"), r"divisor of %"),
    (
        "dp_cast",
        q(
            "CAST(CASE WHEN amount > 2999 THEN 'x' ELSE '1' END AS INTEGER) > 0",
            "benefits",
            "scheme",
        ),
        ORACLE,
    ),
    (
        "dp_sum_argument",
        "SELECT scheme, SUM(CASE WHEN EXTRACT(CASE WHEN amount > 3000 THEN 'x' ELSE 'year' END "
        f"FROM {D}) > 0 THEN amount END) FROM benefits GROUP BY scheme",
        LITERAL,
    ),
    (
        "dp_quantile",
        "SELECT scheme, QUANTILE_CONT(amount, CASE WHEN COUNT(*) > 5 THEN 2 ELSE 0.5 END) "
        "FROM benefits GROUP BY scheme",
        r"quantile of QUANTILE_CONT",
    ),
    (
        "dp_quantile_out_of_range",
        "SELECT scheme, QUANTILE(amount, 2) FROM benefits GROUP BY scheme",
        r"fraction literal",
    ),
    (
        "dp_derived",
        "SELECT scheme, COUNT(*) FROM (SELECT scheme FROM benefits WHERE "
        "STRFTIME(DATE '2020-01-01', CASE WHEN amount > 3000 THEN '%Q' ELSE '%Y' END) = '2020') t "
        "GROUP BY scheme",
        LITERAL,
    ),
    (
        "dp_having",
        "SELECT scheme, COUNT(*) FROM benefits GROUP BY scheme HAVING "
        f"DATE_TRUNC(CASE WHEN scheme = 'child' THEN 'bogus' ELSE 'year' END, {D}) IS NOT NULL",
        LITERAL,
    ),
]


@pytest.fixture
def analyst(module_analyst):
    """The module shares one connection: its statements are refused or only read."""
    return module_analyst


@pytest.fixture(params=["analyst", "ckm"])
def guarded(request):
    """Both the threshold demo and the demo as shipped (CKM, DP for benefits)."""
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize(("sql", "pattern"), [pytest.param(s, p, id=i) for i, s, p in ATTACKS])
def test_error_oracle_is_refused(guarded, sql, pattern):
    with pytest.raises(sqlsdc.PolicyViolation, match=pattern) as refused:
        guarded.execute(sql)
    assert refused.value.hint


@pytest.mark.parametrize(("sql", "pattern"), [pytest.param(s, p, id=i) for i, s, p in DP_ATTACKS])
def test_error_oracle_on_dp_table_is_refused_and_free(ckm, sql, pattern):
    before = ckm.remaining_budget()
    with pytest.raises(sqlsdc.PolicyViolation, match=pattern):
        ckm.execute(sql)
    assert ckm.remaining_budget() == before


def test_literal_refusal_says_what_to_write(analyst):
    with pytest.raises(sqlsdc.PolicyViolation) as refused:
        analyst.execute(q(f"DATE_TRUNC({BOGUS}, {D}) IS NOT NULL"))
    assert "the date part of DATE_TRUNC must be a literal" in refused.value.reason
    assert "DATE_TRUNC('year', d)" in refused.value.hint
    assert "CASE around the whole call" in refused.value.hint


def test_the_issue_oracle_answers_nothing(analyst, raw):
    """Both sides of the condition are refused alike: no bit leaks whichever way it goes."""
    (income,) = raw.execute(f"SELECT income FROM persons WHERE {TARGET}").fetchone()
    for threshold in (income - 1, income + 1):
        sql = q(
            f"DATE_TRUNC(CASE WHEN {TARGET} AND income > {threshold} THEN 'bogus' ELSE 'year' "
            f"END, {D}) IS NOT NULL"
        )
        with pytest.raises(sqlsdc.PolicyViolation, match=LITERAL):
            analyst.execute(sql)


# ---------------------------------------------------------------- ordinary uses still work
BANDS = "CASE WHEN age > 50 THEN DATE '2020-05-01' ELSE DATE '2021-03-01' END"
SAFE = [
    ("date_trunc_literal_part", q(f"DATE_TRUNC('year', {BANDS}) > DATE '2020-06-01'")),
    (
        "date_trunc_on_measure",
        q(f"DATE_TRUNC('month', CASE WHEN income > 50000 THEN {D} END) IS NOT NULL"),
    ),
    (
        "date_trunc_group_key",
        f"SELECT DATE_TRUNC('year', {BANDS}) AS y, COUNT(*) FROM persons GROUP BY y",
    ),
    (
        "strftime_group_key",
        f"SELECT STRFTIME({BANDS}, '%Y-%m') AS y, COUNT(*) FROM persons GROUP BY y",
    ),
    ("extract_literal_part", q(f"EXTRACT(YEAR FROM {BANDS}) = 2020")),
    (
        "case_group_key",
        "SELECT CASE WHEN age > 50 THEN 'old' ELSE 'young' END AS band, COUNT(*) "
        "FROM persons GROUP BY band",
    ),
    ("mod_literal", "SELECT age % 10 AS d, COUNT(*) FROM persons GROUP BY d"),
    ("intdiv_literal", "SELECT age // 10 AS decade, COUNT(*) FROM persons GROUP BY decade"),
    ("division_by_data", q("1 / (CAST(age AS DOUBLE) - 50) > 0")),
    ("try_cast", q("TRY_CAST(CASE WHEN income > 5e4 THEN 'x' ELSE '1' END AS INTEGER) IS NULL")),
    ("substring_literal", q("SUBSTRING(occupation, 1, 5) = 'craft'")),
    ("round_output", "SELECT region, ROUND(SUM(income), 2) FROM persons GROUP BY region"),
    (
        "scaled_count",
        "SELECT r.name, COUNT(*) * 1000.0 / r.population AS per_1000 FROM persons p "
        "JOIN regions r ON p.region = r.region GROUP BY r.name, r.population "
        "ORDER BY r.name",
    ),
    (
        "window_over_cells",
        "SELECT region, COUNT(*), SUM(COUNT(*)) OVER (), "
        "LAG(COUNT(*), 1) OVER (ORDER BY region) FROM persons GROUP BY region",
    ),
    ("pow_double", q("POW(CAST(age AS DOUBLE), 1e6) >= 0")),
    (
        "strftime_public",
        "SELECT region, STRFTIME(CASE WHEN population > 1000 THEN DATE "
        "'2020-01-01' END, '%Y') FROM regions",
    ),
]


@pytest.mark.parametrize("sql", [pytest.param(s, id=i) for i, s in SAFE])
def test_ordinary_uses_still_work(guarded, sql):
    assert guarded.execute(sql).fetchall()


def test_literal_part_gives_the_true_grouping(analyst, raw):
    sql = f"SELECT DATE_TRUNC('year', {BANDS}) AS y, COUNT(*) FROM persons GROUP BY y ORDER BY y"
    assert analyst.execute(sql).fetchall() == raw.execute(sql).fetchall()


DP_SAFE = [
    ("dp_mod", q("month % 3 = 0", "benefits", "scheme")),
    ("dp_quantile", "SELECT scheme, QUANTILE_CONT(amount, 0.5) FROM benefits GROUP BY scheme"),
    ("dp_extract", q(f"EXTRACT(MONTH FROM {D}) = 1", "benefits", "scheme")),
]


@pytest.mark.parametrize("sql", [pytest.param(s, id=i) for i, s in DP_SAFE])
def test_ordinary_dp_uses_still_work(ckm, sql):
    assert ckm.execute(sql).fetchall()


# ---------------------------------------------------------------- the signature list
def test_every_allowed_function_has_a_signature():
    """Roles are declared for every function and operator the guard lets through."""
    listed = (*OPERATORS, *SCALAR_FUNCTIONS, *PROTECTED_AGGREGATES, *UNPROTECTED_AGGREGATES)
    missing = [c.__name__ for c in listed if c not in SIGNATURES]
    assert not missing


def test_signatures_name_existing_arguments():
    for node_type, sig in SIGNATURES.items():
        for literal in sig.literals:
            assert literal.key in node_type.arg_types, (node_type.__name__, literal.key)
        for key, _sample in sig.sample:
            assert key in node_type.arg_types, (node_type.__name__, key)
        assert issubclass(node_type, exp.Expr)
