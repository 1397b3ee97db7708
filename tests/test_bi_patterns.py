"""What BI tools and notebooks send, on an embedded guarded connection (new user s40h): a
limit written as a cast of a literal (SQLAlchemy's ``.limit(3)`` on PostgreSQL) is the literal,
``SELECT DISTINCT`` is answered as the GROUP BY of its outputs (s41g), and the refusals of
``FILTER`` and ``= ANY(list)`` say what to write."""

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


def test_a_limit_cast_of_null_is_no_limit(analyst):
    """``LIMIT CAST(NULL AS INT)`` is ``LIMIT NULL``: a server client that describes a
    statement before binding it (pg8000, asyncpg) has ``LIMIT $1::INTEGER`` planned with NULL,
    which was refused as a computed limit, so SQLAlchemy's ``.limit(3)`` failed on those
    drivers before any value was sent (red team s49e; fails on main)."""
    expected = analyst.execute(GROUPS).fetchall()
    limits = "LIMIT CAST(NULL AS INTEGER) OFFSET CAST(NULL AS BIGINT)"
    assert analyst.execute(f"{GROUPS} {limits}").fetchall() == expected
    assert analyst.execute(f"{GROUPS} LIMIT ?::INTEGER", [None]).fetchall() == expected


def test_a_limit_cast_inside_a_subquery_is_folded_too(analyst):
    sql = ("SELECT region, COUNT(*) AS n FROM persons WHERE region IN (SELECT region FROM "
           "regions ORDER BY region LIMIT {}) GROUP BY region ORDER BY region")  # fmt: skip
    assert (
        analyst.execute(sql.format("CAST(2 AS INT)")).fetchall()
        == analyst.execute(sql.format("2")).fetchall()
    )


TARGET = "municipality = 'R08-M018' AND sex = 'F' AND age = 43 AND occupation = 'craft_trades'"


@pytest.mark.parametrize(
    ("distinct", "grouped"),
    [
        ("SELECT DISTINCT region FROM persons", "SELECT region FROM persons GROUP BY region"),
        (
            "SELECT DISTINCT p.region, sex AS s FROM persons p WHERE age >= 80 ORDER BY 1",
            "SELECT p.region, sex AS s FROM persons p WHERE age >= 80 GROUP BY 1, 2 ORDER BY 1",
        ),
        (
            "SELECT DISTINCT municipality, sex, age FROM persons ORDER BY age DESC LIMIT 5",
            "SELECT municipality, sex, age FROM persons GROUP BY ALL ORDER BY age DESC LIMIT 5",
        ),
        (
            "SELECT DISTINCT lower(region) AS r, 'x' AS c FROM persons",
            "SELECT lower(region) AS r, 'x' AS c FROM persons GROUP BY lower(region)",
        ),
        (
            "SELECT DISTINCT r.name FROM persons p JOIN regions r ON p.region = r.region "
            "WHERE p.age > 90",
            "SELECT r.name FROM persons p JOIN regions r ON p.region = r.region "
            "WHERE p.age > 90 GROUP BY r.name",
        ),
        (
            "SELECT DISTINCT p.region, h.tenure FROM persons p JOIN households h "
            "ON p.household_id = h.household_id",
            "SELECT p.region, h.tenure FROM persons p JOIN households h "
            "ON p.household_id = h.household_id GROUP BY 1, 2",
        ),
        (
            "WITH old AS (SELECT region, sex FROM persons WHERE age >= 90) "
            "SELECT DISTINCT sex, region FROM old",
            "WITH old AS (SELECT region, sex FROM persons WHERE age >= 90) "
            "SELECT sex, region FROM old GROUP BY sex, region",
        ),
    ],
)
def test_select_distinct_is_answered_as_the_group_by_of_its_outputs(analyst, distinct, grouped):
    """BI tools' filter lists: the rows DISTINCT keeps are the groups of GROUP BY every
    output, listed as a grouping without aggregates lists them (its protected count)."""
    answered = analyst.execute(distinct).fetchall()
    assert answered == analyst.execute(grouped).fetchall()
    assert len(answered) > 0


def test_select_distinct_lists_only_groups_the_policy_publishes(analyst, raw):
    """Under the threshold rule a listed group is one of 10 persons or more, and every such
    group is listed: DISTINCT tells no more than the counts would."""
    listed = analyst.execute("SELECT DISTINCT municipality, sex, age FROM persons").fetchall()
    large = raw.execute(
        "SELECT municipality, sex, age FROM persons GROUP BY ALL HAVING COUNT(*) >= 10"
    ).fetchall()
    assert sorted(listed) == sorted(large)
    small = raw.execute("SELECT COUNT(*) FROM (SELECT DISTINCT municipality, sex, age "
                        "FROM persons)").fetchone()[0]  # fmt: skip
    assert small > len(listed)  # the small groups exist and are not listed
    assert analyst.execute(f"SELECT DISTINCT sex, age FROM persons WHERE {TARGET}").fetchall() == []


def test_select_distinct_under_the_cell_key_method_lists_the_groups_of_the_grouping(ckm):
    """Under CKM a grouping without aggregates lists the groups whose protected count reaches
    the minimum frequency; DISTINCT lists exactly those, and with a DP table its groups."""
    for distinct, grouped in (
        ("SELECT DISTINCT municipality, sex, age FROM persons",
         "SELECT municipality, sex, age FROM persons GROUP BY ALL"),
        ("SELECT DISTINCT scheme FROM benefits", "SELECT scheme FROM benefits GROUP BY scheme"),
    ):  # fmt: skip
        answered = ckm.execute(distinct).fetchall()
        assert answered == ckm.execute(grouped).fetchall()
        assert len(answered) > 0


@pytest.mark.parametrize(
    ("sql", "match"),
    [
        ("SELECT DISTINCT income FROM persons", "'income' is a measure and cannot be grouped by"),
        ("SELECT DISTINCT region, income FROM persons", "is a measure"),
        ("SELECT DISTINCT person_id FROM persons", "identifier persons.person_id cannot be"),
        ("SELECT DISTINCT * FROM persons", "cannot be grouped by"),
        ("SELECT DISTINCT region, turnover FROM enterprises LIMIT 1", "is a measure"),
    ],
)
def test_select_distinct_of_a_measure_or_identifier_stays_refused(analyst, sql, match):
    with pytest.raises(sqlsdc.PolicyViolation, match=match):
        analyst.execute(sql)


@pytest.mark.parametrize(
    ("sql", "match"),
    [  # DISTINCT applies after what these compute; a grouping would compute it per group
        ("SELECT DISTINCT region, COUNT(*) OVER () FROM persons", "row-level output"),
        ("SELECT DISTINCT 5 FROM persons", "row-level output"),  # no value read
        ("SELECT DISTINCT region FROM persons ORDER BY COUNT(*)", "must appear in GROUP BY"),
        ("SELECT COUNT(*) FROM (SELECT DISTINCT region FROM persons) t", "DISTINCT on"),
        ("SELECT DISTINCT region FROM persons UNION SELECT region FROM regions", "UNION"),
    ],
)
def test_distinct_where_it_is_no_grouping_is_left_as_it_is(analyst, sql, match):
    with pytest.raises(sqlsdc.PolicyViolation, match=match):
        analyst.execute(sql)


def test_distinct_over_public_rows_or_aggregates_is_not_rewritten(analyst):
    assert "DISTINCT" in analyst.explain("SELECT DISTINCT name FROM regions").sql
    sql = "SELECT DISTINCT COUNT(*) > 0 AS any FROM persons GROUP BY region"
    assert analyst.execute(sql).fetchall() == [(True,)]


def test_filter_clause_is_refused_with_the_case_when_to_write(analyst):
    with pytest.raises(sqlsdc.PolicyViolation, match="FILTER is not allowed") as refused:
        analyst.execute("SELECT region, COUNT(*) FILTER (WHERE sex = 'F') FROM persons "
                        "GROUP BY region")  # fmt: skip
    assert "COUNT(CASE WHEN condition THEN 1 END)" in refused.value.hint
    written = "SELECT region, COUNT(CASE WHEN sex = 'F' THEN 1 END) FROM persons GROUP BY region"
    assert len(analyst.execute(written).fetchall()) > 0


@pytest.mark.parametrize(
    ("written", "as_in"),
    [  # psycopg2 writes a list into the text: ARRAY['R01','R02'], a date '2020-01-02'::date
        ("region = ANY(ARRAY['R01','R03'])", "region IN ('R01', 'R03')"),
        ("region = ANY(['R02'])", "region IN ('R02')"),  # DuckDB's list literal
        ("age = ANY (ARRAY[30,31,NULL]) AND sex = 'F'", "age IN (30, 31, NULL) AND sex = 'F'"),
    ],
)
def test_any_of_a_written_array_of_constants_is_its_in_list(analyst, written, as_in):
    sql = "SELECT region, COUNT(*) AS n FROM persons WHERE {} GROUP BY region ORDER BY 1"
    answered = analyst.execute(sql.format(written)).fetchall()
    assert answered == analyst.execute(sql.format(as_in)).fetchall()
    assert len(answered) > 0


@pytest.mark.parametrize(
    "condition",
    [
        "region = ANY(ARRAY[sex])",  # not constants
        "region = ANY(ARRAY[(SELECT MIN(region) FROM regions)])",
        "region = ANY('{}')",  # PostgreSQL's array text: a string to DuckDB
        "region = ANY(ARRAY[])",
        "region < ANY(ARRAY['R02'])",
    ],
)
def test_any_of_anything_else_is_refused_with_the_in_list_to_write(analyst, condition):
    with pytest.raises(sqlsdc.PolicyViolation, match="ANY is not allowed") as refused:
        analyst.execute(f"SELECT COUNT(*) FROM persons WHERE {condition}")
    assert refused.value.hint.startswith("write column IN (value, ...), column = ANY(ARRAY[")


BY_REGION = "SELECT region, sex, COUNT(*) AS n, AVG(income) AS a FROM persons WHERE {} GROUP BY ALL"


@pytest.mark.parametrize(
    ("condition", "params", "written"),
    [
        ("region = ANY(?)", [["R01", "R03"]], "region IN ('R01', 'R03')"),
        ("region = ANY (?) AND age >= ?", [("R02",), 65], "region IN ('R02') AND age >= 65"),
        ("age = ANY($1) AND sex = $2", [[30, 31, None], "F"],
         "age IN (30, 31, NULL) AND sex = 'F'"),
        ("sex = $s AND age = ANY($ages)", {"ages": [80, 81], "s": "M"},
         "sex = 'M' AND age IN (80, 81)"),
        ("NOT (region = ANY(?))", [["R01"]], "NOT region IN ('R01')"),
        # a cast to an array type: the IN list of the values cast to its element type
        ("region = ANY($1::text[])", [["R01", "R03"]], "region IN ('R01', 'R03')"),
        ("age = ANY(CAST($1 AS INT[])) AND sex = $2", [["30", "31", None], "F"],
         "age IN (30, 31, NULL) AND sex = 'F'"),
        ("region = ANY($1::varchar[]) AND age = ANY($2 :: int [ ])", [["R02"], [40, 41]],
         "region IN ('R02') AND age IN (40, 41)"),
    ],
)  # fmt: skip
def test_a_list_parameter_of_any_is_the_in_list_of_its_values(analyst, condition, params, written):
    """psycopg's ``col = ANY(%s)`` of a Python list: the IN list of literals it means."""
    answered = analyst.execute(BY_REGION.format(condition), params).fetchall()
    assert answered == analyst.execute(BY_REGION.format(written)).fetchall()
    assert len(answered) > 0


@pytest.mark.parametrize(
    ("condition", "params", "match"),
    [  # the checks of the IN list written out
        ("income = ANY(?)", [[49455.39, 49455.4]], "class break"),
        ("person_id = ANY(?)", [[1, 2]], "identifier persons.person_id cannot be used"),
        ("region = ANY(?)", [["R01", 5]], "could raise an error"),
        ("region < ANY(?)", [["R01"]], "a list parameter is bound only as the values of"),
        ("region IN ?", [["R01"]], "a list parameter is bound only as the values of"),
        ("region = ANY(?)", ["R01"], "ANY is not allowed"),  # no list: an array of text
        ("region = ANY(?)", [[]], "is empty"),
        ("region = ANY(?)", [[["R01"]]], "holds a list"),
        # cast to an array type: the checks of its IN list, each value cast
        ("age = ANY($1::text[])", [[30, 31]], "could raise an error"),  # not the cast's type
        ("region = ANY($1::int[])", [[1, 2]], "could raise an error"),
        ("age = ANY($1::int[])", [["30", "x"]], r"CAST\('x' AS INT\) raises an error"),
        ("income = ANY($1::double[])", [[49455.39, 49455.4]], "class break"),
        ("person_id = ANY($1::int[])", [[1, 2]], "identifier persons.person_id"),
        ("region = ANY($1::text[])", [[["R01"]]], "holds a list"),
        ("region = ANY($1::text[])", [[]], "is empty"),
        ("region = ANY($1::text[][])", [["R01"]], "one-dimensional array of a plain type"),
        ("region = ANY($1::text[2])", [["R01"]], "one-dimensional array of a plain type"),
        ("region = ANY($1::STRUCT(a TEXT)[])", [["R01"]], "one-dimensional array of a plain"),
        ("region = ANY(TRY_CAST($1 AS TEXT[]))", [["R01"]], "bound only as the values of"),
        ("region = ANY($1::text)", [["R01"]], "bound only as the values of"),
        ("region < ANY($1::text[])", [["R01"]], "bound only as the values of"),
        ("region = ANY($1::text[])", ["{R01,R02}"], "ANY is not allowed"),  # text: no list
    ],
)
def test_a_list_parameter_is_checked_as_its_in_list_or_refused(analyst, condition, params, match):
    with pytest.raises(sqlsdc.Error, match=match):
        analyst.execute(BY_REGION.format(condition), params)


def test_a_list_parameter_counts_against_the_statement_length(analyst):
    values = [f"R{i:08d}" for i in range(80_000)]  # 14 characters each written out
    with pytest.raises(sqlsdc.PolicyViolation, match="with its list parameters written out"):
        analyst.execute(BY_REGION.format("region = ANY(?)"), [values])
    many = list(range(400_000))  # refused by its length before a literal is made
    with pytest.raises(sqlsdc.PolicyViolation, match="with its list parameters written out"):
        analyst.execute(BY_REGION.format("age = ANY(?)"), [many])


class _Spelled(int):
    """An int whose repr is another number's: a list's repr is its elements' reprs."""

    def __repr__(self) -> str:
        return "30"


def test_a_list_parameter_keys_the_check_cache_element_by_element(analyst):
    """The check cache keys parameters by type and spelling; a list's spelling alone would
    give ``[_Spelled(31)]`` (bound as 31) the key of ``[30]``, and ``[30]`` its check."""
    sql = BY_REGION.format("age = ANY(?)")
    assert (
        analyst.execute(sql, [[_Spelled(31)]]).fetchall()
        == analyst.execute(BY_REGION.format("age IN (31)")).fetchall()
    )
    assert (
        analyst.execute(sql, [[30]]).fetchall()
        == analyst.execute(BY_REGION.format("age IN (30)")).fetchall()
    )


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


def test_a_simple_case_in_a_sum_is_refused_with_the_searched_form_to_write(analyst):
    """``SUM(CASE occupation WHEN 'x' THEN income END)`` has one branch and no ELSE: the
    refusal said "more than one branch or an ELSE"; it names the simple CASE and the form that
    is answered."""
    with pytest.raises(sqlsdc.PolicyViolation, match="a simple CASE") as refused:
        analyst.execute("SELECT region, SUM(CASE occupation WHEN 'professionals' THEN income "
                        "END) FROM persons GROUP BY 1")  # fmt: skip
    assert "more than one branch" not in str(refused.value)
    assert "CASE WHEN condition THEN measure END" in str(refused.value)
    written = ("SELECT region, SUM(CASE WHEN occupation = 'professionals' THEN income END) "
               "FROM persons GROUP BY 1")  # fmt: skip
    assert len(analyst.execute(written).fetchall()) > 0


def test_distinct_on_is_refused_by_name_before_name_resolution(analyst):
    with pytest.raises(sqlsdc.PolicyViolation, match="DISTINCT ON is not allowed") as refused:
        analyst.execute("SELECT DISTINCT ON (region) region, income FROM persons")
    assert refused.value.hint == "use GROUP BY"  # was "Column 'region' could not be resolved"


@pytest.mark.parametrize(
    ("sql", "params", "named", "not_named"),
    [
        ("SELECT region, to_char(age, '999') FROM persons GROUP BY region, age", None,
         "function to_char() is not allowed (to_char(...), read as CAST(", "cast()"),
        ("SELECT string_agg(region, ',') FROM persons", None,
         "function string_agg() is not allowed (string_agg(persons.region, ','))", "listagg"),
        ("SELECT region, GROUP_CONCAT(sex) FROM persons GROUP BY region", None,
         "function group_concat() is not allowed", "listagg"),
        ("SELECT region, COUNT(*) FROM persons WHERE age = ? AND sex = ? AND "
         "to_char(age) = ? GROUP BY region", [30, "F", "30"], "function to_char()", "cast()"),
        ("SELECT region, SUM(nvl(income, 0)) FROM persons GROUP BY region", None,
         "(function nvl() transforms the values)", "coalesce()"),
        ("SELECT region, var_samp(income) FROM persons GROUP BY region", None,
         "VAR_SAMP over confidential values is not allowed", "VARIANCE"),
        ("SELECT region, COUNT(*) FROM persons WHERE pow(age, 2) > 100 GROUP BY region", None,
         "pow(persons.age, 2) could raise an error", "POWER"),
        ("SELECT region, list(age) FROM persons GROUP BY region", None,
         "function list() is not allowed (list(persons.age))", "array_agg"),
    ],
)  # fmt: skip
def test_a_refusal_names_functions_as_the_statement_wrote_them(
    analyst, sql, params, named, not_named
):
    """sqlglot reads ``to_char`` as a cast, ``string_agg`` as LISTAGG, ``nvl`` as COALESCE:
    a refusal named functions the analyst never wrote (s41g)."""
    with pytest.raises(sqlsdc.PolicyViolation) as refused:
        analyst.execute(sql, params)
    assert named in refused.value.args[0]
    assert not_named.lower() not in str(refused.value).lower()
