"""What BI tools and notebooks send, on an embedded guarded connection (new user s40h): a
limit written as a cast of a literal (SQLAlchemy's ``.limit(3)`` on PostgreSQL) is the literal,
and the refusals of ``SELECT DISTINCT``, ``FILTER`` and ``= ANY(list)`` say what to write."""

from __future__ import annotations

import pytest

import sqlsdc
from sqlsdc.errors import SqlSyntaxError

GROUPS = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region ORDER BY region"


@pytest.fixture
def analyst(module_analyst):
    return module_analyst


@pytest.mark.parametrize(
    ("limit", "params"),
    [
        ("LIMIT CAST(3 AS INTEGER) OFFSET CAST(1 AS BIGINT)", None),
        ("LIMIT 3::SMALLINT OFFSET 1::UTINYINT", None),
        ("LIMIT ?::INTEGER OFFSET ?::INTEGER", [3, 1]),  # as SQLAlchemy binds .limit().offset()
    ],
)
def test_a_limit_cast_from_a_whole_number_is_that_number(analyst, limit, params):
    expected = analyst.execute(f"{GROUPS} LIMIT 3 OFFSET 1").fetchall()
    assert len(expected) == 3
    assert analyst.execute(f"{GROUPS} {limit}", params).fetchall() == expected


@pytest.mark.parametrize(
    ("limit", "error", "match"),
    [
        ("LIMIT CAST(3.5 AS INTEGER)", sqlsdc.PolicyViolation, "is computed"),  # rounds
        ("LIMIT CAST('3' AS INTEGER)", sqlsdc.PolicyViolation, "is computed"),  # text
        ("LIMIT CAST(300 AS TINYINT)", sqlsdc.PolicyViolation, "is computed"),  # overflows
        ("LIMIT CAST(3 AS DOUBLE)", sqlsdc.PolicyViolation, "is computed"),
        ("LIMIT CAST(-1 AS INTEGER)", SqlSyntaxError, "is not valid"),  # as LIMIT -1
    ],
)
def test_a_limit_cast_that_could_fail_is_refused_as_before(analyst, limit, error, match):
    with pytest.raises(error, match=match):
        analyst.execute(f"{GROUPS} {limit}")


def test_a_limit_cast_inside_a_subquery_is_folded_too(analyst):
    sql = ("SELECT region, COUNT(*) AS n FROM persons WHERE region IN (SELECT region FROM "
           "regions ORDER BY region LIMIT {}) GROUP BY region ORDER BY region")  # fmt: skip
    assert (
        analyst.execute(sql.format("CAST(2 AS INT)")).fetchall()
        == analyst.execute(sql.format("2")).fetchall()
    )


def test_select_distinct_of_dimensions_is_refused_with_the_group_by_to_write(analyst):
    with pytest.raises(sqlsdc.PolicyViolation, match="row-level output") as refused:
        analyst.execute("SELECT DISTINCT p.region, sex AS s FROM persons p ORDER BY 1")
    assert refused.value.hint == (
        "write GROUP BY region, sex instead of DISTINCT, e.g. SELECT region, sex FROM persons "
        "GROUP BY region, sex (each group is listed as its protected count allows)"
    )
    suggested = "SELECT region, sex FROM persons GROUP BY region, sex"
    assert len(analyst.execute(suggested).fetchall()) > 0  # the hint is answered


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT DISTINCT income FROM persons",  # a measure: GROUP BY income is refused too
        "SELECT DISTINCT person_id FROM persons",  # an identifier
        "SELECT DISTINCT lower(region) FROM persons",
        "SELECT DISTINCT p.region FROM persons p JOIN households h "
        "ON p.household_id = h.household_id",
    ],
)
def test_select_distinct_of_other_values_keeps_the_aggregate_hint(analyst, sql):
    with pytest.raises(sqlsdc.PolicyViolation, match="row-level output") as refused:
        analyst.execute(sql)
    assert refused.value.hint.startswith("aggregate it: e.g. SELECT")


def test_filter_clause_is_refused_with_the_case_when_to_write(analyst):
    with pytest.raises(sqlsdc.PolicyViolation, match="FILTER is not allowed") as refused:
        analyst.execute("SELECT region, COUNT(*) FILTER (WHERE sex = 'F') FROM persons "
                        "GROUP BY region")  # fmt: skip
    assert "COUNT(CASE WHEN condition THEN 1 END)" in refused.value.hint
    written = "SELECT region, COUNT(CASE WHEN sex = 'F' THEN 1 END) FROM persons GROUP BY region"
    assert len(analyst.execute(written).fetchall()) > 0


def test_any_of_a_list_is_refused_with_the_in_list_to_write(analyst):
    with pytest.raises(sqlsdc.PolicyViolation, match="ANY is not allowed") as refused:
        analyst.execute("SELECT COUNT(*) FROM persons WHERE region = ANY(['north', 'south'])")
    assert refused.value.hint.startswith("write column IN (value, ...)")


@pytest.mark.parametrize(
    ("sql", "hint"),
    [
        (
            "SELECT region, SUM(CASE WHEN sex = 'F' THEN 1 ELSE 0 END) FROM persons GROUP BY 1",
            "leave out ELSE 0: SUM(CASE WHEN condition THEN value END)",
        ),
        (
            "SELECT region, SUM(IF(sex = 'F', income, 0.0)) FROM persons GROUP BY 1",
            "leave out ELSE 0: SUM(CASE WHEN condition THEN value END)",
        ),
        (
            "SELECT region, AVG(CASE WHEN sex = 'F' THEN 1.0 ELSE 0 END) FROM persons GROUP BY 1",
            "for a share write COUNT(CASE WHEN condition THEN 1 END) * 1.0 / COUNT(*)",
        ),
    ],
)
def test_zero_padding_stays_refused_with_what_to_write(analyst, sql, hint):
    with pytest.raises(sqlsdc.PolicyViolation, match="is not a linear sum") as refused:
        analyst.execute(sql)
    assert hint in refused.value.hint
    written = (
        "SELECT region, COALESCE(SUM(CASE WHEN sex = 'F' THEN income END), 0), "
        "COUNT(CASE WHEN sex = 'F' THEN 1 END) * 1.0 / COUNT(*) FROM persons GROUP BY 1"
    )
    assert len(analyst.execute(written).fetchall()) > 0  # what the hints say is answered


def test_other_padding_keeps_the_general_hint(analyst):
    with pytest.raises(sqlsdc.PolicyViolation, match="is not a linear sum") as refused:
        analyst.execute("SELECT SUM(CASE WHEN sex = 'F' THEN 1 ELSE 2 END) FROM persons")
    assert refused.value.hint.startswith("sum measures as they are")


def test_distinct_on_is_refused_by_name_before_name_resolution(analyst):
    with pytest.raises(sqlsdc.PolicyViolation, match="DISTINCT ON is not allowed") as refused:
        analyst.execute("SELECT DISTINCT ON (region) region, income FROM persons")
    assert refused.value.hint == "use GROUP BY"  # was "Column 'region' could not be resolved"
