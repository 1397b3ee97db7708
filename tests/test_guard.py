"""Behaviour of the guarded connection on accepted queries: values, suppression, status, API."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml

import sqlsdc


@pytest.fixture
def analyst(module_analyst):
    """One connection for the module (conftest's ``module_analyst``): its tests only read and
    are refused; audit entries are all they add."""
    return module_analyst


K = 10


def raw_cells(raw, sql):
    return raw.execute(sql).fetchall()


def test_counts_match_raw_and_small_cells_are_null(analyst, raw):
    sql = "SELECT municipality, sex, COUNT(*) FROM persons GROUP BY 1, 2 ORDER BY 1, 2"
    protected = analyst.execute(sql).fetchall()
    expected = raw_cells(raw, sql)
    assert len(protected) == len(expected) > 0
    small = 0
    for (m, s, n), (m2, s2, true_n) in zip(protected, expected, strict=True):
        assert (m, s) == (m2, s2)
        if true_n < K:
            small += 1
            assert n is None
        else:
            assert n == true_n
    assert small > 0, "the demo must contain small cells"


def test_magnitudes_need_enough_contributors_not_rows(analyst, raw):
    # income is NULL for about 2% of persons and 0 for children: a sum's contributors are the
    # persons with a non-zero income, a count's every person with an income.
    sql = (
        "SELECT municipality, SUM(income), AVG(income), COUNT(income) FROM persons "
        "GROUP BY municipality ORDER BY municipality"
    )
    protected = analyst.execute(sql).fetchall()
    sizes = "SELECT municipality, COUNT(NULLIF(income, 0)), COUNT(income) FROM persons GROUP BY 1"
    contributors = {m: (nonzero, counted) for m, nonzero, counted in raw_cells(raw, sizes)}
    expected = {r[0]: r for r in raw_cells(raw, sql)}
    assert any(n < K <= c for n, c in contributors.values())  # zeros alone pass no cell
    for municipality, total, mean, count in protected:
        nonzero, counted = contributors[municipality]
        if nonzero < K:
            assert (total, mean) == (None, None)
        else:
            assert total == pytest.approx(expected[municipality][1])
            assert mean == pytest.approx(expected[municipality][2])
        assert count == (expected[municipality][3] if counted >= K else None)


def test_threshold_boundary_exactly_k(analyst, raw):
    rows = [
        raw_cells(
            raw,
            "SELECT municipality, age, COUNT(*) AS n FROM persons GROUP BY ALL "
            f"HAVING COUNT(*) = {n} ORDER BY municipality, age LIMIT 1",
        )[0]
        for n in (K - 1, K)
    ]
    assert {r[2] for r in rows} == {K - 1, K}, "fixture data must have cells of size k-1 and k"
    for municipality, age, n in rows:
        (value,) = analyst.execute(
            "SELECT COUNT(*) FROM persons WHERE municipality = ? AND age = ?", [municipality, age]
        ).fetchone()
        assert value == (n if n >= K else None)


def test_rollup_totals_are_protected_too(analyst, raw):
    sql = (
        "SELECT region, municipality, COUNT(*) AS n FROM persons WHERE region = 'R01' "
        "GROUP BY ROLLUP (region, municipality) ORDER BY region NULLS LAST, municipality NULLS LAST"
    )
    protected = analyst.execute(sql).fetchall()
    expected = raw_cells(raw, sql)
    assert protected[-1][:2] == (None, None)  # the grand total row exists
    for got, want in zip(protected, expected, strict=True):
        assert got[2] == (want[2] if want[2] >= K else None)


def test_grand_total_below_k_is_suppressed(analyst):
    (value,) = analyst.execute(
        "SELECT SUM(income) FROM persons WHERE municipality = 'R01-M013' AND age = 40"
    ).fetchone()
    assert value is None


def test_count_distinct_units_in_joins(analyst, raw):
    # Joining households multiplies nothing, but the threshold must count distinct persons and
    # distinct households: a cell of one large household is suppressed.
    sql = (
        "SELECT h.municipality, COUNT(*) AS persons FROM persons p JOIN households h "
        "ON p.household_id = h.household_id GROUP BY h.municipality"
    )
    got = dict(analyst.execute(sql).fetchall())
    households = dict(raw_cells(raw, "SELECT municipality, COUNT(*) FROM households GROUP BY 1"))
    persons = dict(raw_cells(raw, sql))
    assert any(households[m] < K <= persons[m] for m in got), "need a cell with few households"
    for municipality, n in got.items():
        enough = households[municipality] >= K and persons[municipality] >= K
        assert n == (persons[municipality] if enough else None)


def test_join_with_public_table_cannot_inflate_counts(analyst):
    # A cross join with a public table would repeat every person 8 times: refused.
    sql = (
        "SELECT p.municipality, COUNT(*) AS n FROM persons p CROSS JOIN regions r "
        "GROUP BY p.municipality ORDER BY p.municipality"
    )
    with pytest.raises(sqlsdc.PolicyViolation, match="CROSS JOIN of confidential rows"):
        analyst.execute(sql)


def test_derived_tables_and_ctes_pass_units_through(analyst, raw):
    sql = (
        "WITH adults AS (SELECT municipality, income FROM persons WHERE age >= 18) "
        "SELECT municipality, COUNT(*), SUM(income) FROM adults GROUP BY municipality"
    )
    got = {r[0]: r[1:] for r in analyst.execute(sql).fetchall()}
    want = {r[0]: r[1:] for r in raw_cells(raw, sql)}
    assert got.keys() == want.keys()
    for municipality, (n, total) in got.items():
        enough = want[municipality][0] >= K
        assert n == (want[municipality][0] if enough else None)
        if enough:
            assert total == pytest.approx(want[municipality][1])


def test_having_order_limit_see_only_protected_values(analyst):
    rows = analyst.execute(
        "SELECT municipality, COUNT(*) AS n FROM persons GROUP BY municipality "
        "HAVING COUNT(*) < 10 ORDER BY n"
    ).fetchall()
    assert rows == []  # every count below 10 is NULL, and NULL < 10 is not true
    lowest = analyst.execute(
        "SELECT municipality, COUNT(*) AS n FROM persons GROUP BY municipality "
        "ORDER BY n NULLS LAST LIMIT 1"
    ).fetchone()
    assert lowest[1] >= K


@pytest.mark.parametrize(
    ("clause", "explicit"),
    [
        ("ORDER BY ALL", "ORDER BY 1, 2, 3"),
        ("ORDER BY ALL DESC", "ORDER BY 1 DESC, 2 DESC, 3 DESC"),
        (
            "ORDER BY ALL DESC NULLS FIRST",
            "ORDER BY 1 DESC NULLS FIRST, 2 DESC NULLS FIRST, 3 DESC NULLS FIRST",
        ),  # fmt: skip
    ],
)
def test_order_by_all_is_every_output_in_turn(analyst, clause, explicit):
    """DuckDB's ORDER BY ALL orders by every output column, left to right, as notebooks and
    BI tools write it (it was refused: "the expression ALL raises an error"); a ROLLUP's
    totals and a set operation too."""
    sql = "SELECT region, sex, COUNT(*) AS n FROM persons GROUP BY ROLLUP (region, sex) "
    assert analyst.execute(sql + clause).fetchall() == analyst.execute(sql + explicit).fetchall()
    union = "SELECT region FROM persons GROUP BY region UNION SELECT sex FROM persons GROUP BY sex "
    assert analyst.execute(union + clause).fetchall() == (
        analyst.execute(union + explicit.split(",")[0]).fetchall()
    )


def test_post_processing_of_protected_cells(analyst, raw):
    """An outer query sums the released groups of a nested aggregation: exactly the groups the
    nested result releases, each with its true count (k units or more) or NULL."""
    nested = "SELECT municipality, COUNT(*) AS n FROM persons GROUP BY 1"
    got = analyst.execute(f"SELECT SUM(n) FROM ({nested})").fetchone()[0]
    released = analyst.execute(f"SELECT municipality, n FROM ({nested})").fetchall()
    truth = dict(raw_cells(raw, "SELECT municipality, COUNT(*) FROM persons GROUP BY 1"))
    assert got == sum(n for _m, n in released if n is not None)
    assert all(n in (None, truth[m]) and (n is None or n >= K) for m, n in released)


def test_cell_status_and_column_names(analyst):
    cur = analyst.execute(
        "SELECT municipality, COUNT(*), SUM(income) / COUNT(income) AS mean FROM persons "
        "GROUP BY municipality ORDER BY municipality"
    )
    assert [d[0] for d in cur.description] == ["municipality", "count_star()", "mean"]
    status = cur.cell_status()
    rows = cur.fetchall()
    assert list(status.columns) == ["municipality", "count_star()", "mean"]
    assert set(status["municipality"]) == {"key"}
    for row, (_, s) in zip(rows, status.iterrows(), strict=True):
        assert (row[1] is None) == (s["count_star()"] == "suppressed")
        assert s["count_star()"] in ("published", "suppressed")


def test_set_operations_of_aggregates(analyst, raw):
    rows = analyst.execute(
        "SELECT sex, COUNT(*) FROM persons GROUP BY sex "
        "UNION ALL SELECT 'all', COUNT(*) FROM persons ORDER BY 1"
    ).fetchall()
    total = raw_cells(raw, "SELECT COUNT(*) FROM persons")[0][0]
    assert rows[-1] == ("all", total) or ("all", total) in rows


def test_public_tables_are_readable(analyst, raw):
    assert analyst.execute("SELECT * FROM regions ORDER BY region").fetchall() == raw_cells(
        raw, "SELECT region, name, population FROM regions ORDER BY region"
    )


def test_parameters_are_bound_as_literals(analyst, raw):
    got = analyst.execute(
        "SELECT COUNT(*) FROM persons WHERE sex = ? AND age >= ?", ["F", 30]
    ).fetchone()
    want = raw_cells(raw, "SELECT COUNT(*) FROM persons WHERE sex = 'F' AND age >= 30")[0]
    assert got == want
    named = analyst.execute("SELECT COUNT(*) FROM persons WHERE sex = $s", {"s": "F"}).fetchone()
    assert named[0] > 0


def test_parameter_errors(analyst):
    with pytest.raises(sqlsdc.ProgrammingError, match=r"1 parameter\(s\) but none were given"):
        analyst.execute("SELECT COUNT(*) FROM persons WHERE sex = ?")
    with pytest.raises(sqlsdc.ProgrammingError, match="not supported"):
        analyst.execute("SELECT COUNT(*) FROM persons WHERE sex = ?", [object()])
    date_literal = analyst.execute("SELECT ? AS d", [dt.date(2024, 1, 2)]).fetchone()
    assert date_literal == (dt.date(2024, 1, 2),)


def test_pep249_cursor(analyst):
    assert sqlsdc.apilevel == "2.0" and sqlsdc.paramstyle == "qmark"
    cur = analyst.cursor()
    assert cur.description is None and cur.rowcount == -1
    with pytest.raises(sqlsdc.ProgrammingError, match="execute"):
        cur.fetchall()
    cur.execute("SELECT sex, COUNT(*) FROM persons GROUP BY sex ORDER BY sex")
    assert cur.rowcount == 2
    assert cur.fetchone()[0] == "F"
    assert [r[0] for r in cur.fetchmany(5)] == ["M"]
    assert cur.fetchall() == []
    assert list(cur.df().columns) == ["sex", "count_star()"]
    assert cur.arrow().num_rows == 2
    assert issubclass(sqlsdc.PolicyViolation, sqlsdc.Error)
    assert issubclass(sqlsdc.Error, sqlsdc.DatabaseError)


def test_explain_does_not_touch_data(analyst):
    explained = analyst.explain("SELECT region, COUNT(*) AS n FROM persons GROUP BY region")
    assert [c.mechanism for c in explained.columns] == ["key", "threshold"]
    assert explained.columns[1].min_frequency == K
    assert "system.main.COUNT(*)" in explained.sql and "__rkey" not in explained.sql
    assert explained.to_dict()["tables"] == ["persons"]


def test_closed_connection(demo_db):
    con = sqlsdc.connect(demo_db, user="analyst")
    con.close()
    with pytest.raises(sqlsdc.InterfaceError, match="closed"):
        con.execute("SELECT 1")


def test_runtime_failures_are_withheld_and_audited(fresh_demo_db):
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        with pytest.raises(sqlsdc.OperationalError, match="withheld"):
            # public data may raise: the guard does not need to prevent it, only hide details
            con.execute("SELECT CAST(name AS INTEGER) FROM regions")
    from sqlsdc.catalog import store
    from sqlsdc.engines.duckdb import open_database

    admin = open_database(fresh_demo_db)
    try:
        entry = store.audit_entries(admin, decision="failed")[0]
        assert "Could not convert" in entry["reason"]
    finally:
        admin.close()


def test_same_query_same_answer_across_sessions(demo_db):
    sql = "SELECT municipality, COUNT(*) FROM persons GROUP BY 1 ORDER BY 1"
    with sqlsdc.connect(demo_db, user="analyst") as a, sqlsdc.connect(demo_db, user="admin") as b:
        assert a.execute(sql).fetchall() == b.execute(sql).fetchall()


def test_keys_only_groups_need_enough_units(analyst, raw):
    """Groups without values are released on a keyed noisy count: n + noise >= k with integer
    noise in [-w, w], w = (k - 1) // 2, fixed per group."""
    sql = "SELECT municipality FROM persons WHERE income > 100000 GROUP BY municipality"
    got = {r[0] for r in analyst.execute(sql).fetchall()}
    counts = dict(
        raw_cells(
            raw, "SELECT municipality, COUNT(*) FROM persons WHERE income > 100000 GROUP BY 1"
        )
    )
    w = (K - 1) // 2
    assert {m for m, n in counts.items() if n >= K + w} <= got
    assert got <= {m for m, n in counts.items() if n >= K - w}
    assert any(n < K - w for n in counts.values()), "the filter must create small groups"
    assert got == {r[0] for r in analyst.execute(sql).fetchall()}  # the same groups every time


def test_every_refusal_is_audited(fresh_demo_db):
    from sqlsdc.catalog import store
    from sqlsdc.engines.duckdb import open_database

    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        with pytest.raises(sqlsdc.PolicyViolation):
            con.execute("SELECT * FROM persons")
        with pytest.raises(sqlsdc.ProgrammingError):
            con.execute("SELECT COUNT(*) FROM persons WHERE sex = ?")
    admin = open_database(fresh_demo_db)
    try:
        reasons = [e["reason"] for e in store.audit_entries(admin, decision="refused")]
    finally:
        admin.close()
    assert reasons[0].startswith("ProgrammingError: the query has 1 parameter(s)")
    assert reasons[1].startswith("row-level output")


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("\u2019R01\u2019", "typographic quotes"),
        ("\u201cR01\u201d", "typographic quotes"),
        ('"R01"', '"R01" in double quotes names a column; write strings in single quotes'),
    ],
)
def test_a_string_in_the_wrong_quotes_says_so(analyst, value, hint):
    """A value pasted from a word processor (’R01’) was 'Column '’r01’' could not be
    resolved. use the declared columns', which does not tell what is wrong."""
    with pytest.raises(sqlsdc.PolicyViolation) as info:
        analyst.execute(f"SELECT region, COUNT(*) FROM persons WHERE region = {value} GROUP BY 1")
    assert hint in info.value.hint


@pytest.mark.parametrize(
    ("sql", "hint"),
    [
        ("SELECT regoin, COUNT(*) FROM persons GROUP BY 1", "did you mean region? use the"),
        ("SELECT region, SUM(incme) FROM persons GROUP BY 1", "did you mean income? use the"),
        ("SELECT xyz, COUNT(*) FROM persons GROUP BY 1", "use the declared columns"),
        ("SELECT __rkeys, COUNT(*) FROM persons GROUP BY 1", "use the declared columns"),
    ],
)
def test_a_misspelt_column_gets_the_close_names_of_the_tables_read(analyst, sql, hint):
    """Only the analyst's columns are offered, never a record key or an undeclared column."""
    with pytest.raises(sqlsdc.PolicyViolation) as info:
        analyst.execute(sql)
    assert info.value.hint.startswith(hint) and "__" not in info.value.hint


def test_a_column_of_two_joined_tables_is_said_to_be_ambiguous(analyst):
    """``region`` of persons JOIN households was 'could not be resolved. did you mean
    region?'; the hint now names both tables and the qualified form, which runs."""
    join = "FROM persons JOIN households USING (household_id)"
    with pytest.raises(sqlsdc.PolicyViolation) as info:
        analyst.execute(f"SELECT region, COUNT(*) {join} GROUP BY region")
    assert info.value.hint.startswith(
        "region is a column of households and persons: say which, e.g. households.region"
    )
    assert len(analyst.execute(f"SELECT persons.region, COUNT(*) {join} GROUP BY 1").fetchall())


def test_row_level_refusal_suggests_an_aggregate_of_the_tables_asked(analyst, tmp_path):
    """The hint names the table the query read and its own columns, not the demo's persons
    (a user of schemas/examples/minimal.yaml was told to query `persons`)."""
    import duckdb

    with pytest.raises(sqlsdc.PolicyViolation) as refused:
        analyst.execute("SELECT h.* FROM regions r JOIN households h ON h.region = r.region")
    assert refused.value.hint == "aggregate it: e.g. SELECT region, COUNT(*) FROM households " \
        "GROUP BY region"  # fmt: skip
    db = tmp_path / "own.duckdb"
    with duckdb.connect(db) as raw:
        raw.execute("CREATE TABLE people AS SELECT range AS id, 'A' AS town, "
                    "1000.0 * range AS salary FROM range(20)")  # fmt: skip
        raw.execute("CREATE TABLE towns AS SELECT 'A' AS town, 100 AS population")
    sqlsdc.init(db, Path(__file__).parents[1] / "schemas/examples/minimal.yaml", applied_by="owner")
    with sqlsdc.connect(db, user="owner") as con, pytest.raises(sqlsdc.PolicyViolation) as refused:
        con.execute("SELECT * FROM people")
    assert refused.value.hint == "aggregate it: e.g. SELECT town, COUNT(*), AVG(salary) " \
        "FROM people GROUP BY town"  # fmt: skip


def test_the_row_level_hint_is_a_query_the_tables_rules_answer(tmp_path):
    """The suggested aggregate runs: a table suppressed over (nace, region) was told to group
    by its first dimension by name (``founded``), outside the universe, and a DP table by a
    dimension without a domain (new user s38)."""
    import duckdb

    db = tmp_path / "office.duckdb"
    with duckdb.connect(db) as raw:
        raw.execute(
            "CREATE TABLE firms AS SELECT 'B' || range AS id, ['C', 'G'][range % 2 + 1] "
            "AS nace, ['N', 'S'][range // 2 % 2 + 1] AS region, 1990 + range % 7 AS "
            "founded, range % 13 AS staff, range::DOUBLE AS turnover FROM range(400)"
        )
        raw.execute(
            "CREATE TABLE vat AS SELECT 'B' || (range % 400) AS id, 'q' || range % 4 "
            "AS quarter, 'x' || range % 3 AS kind, 10.0 AS amount FROM range(1600)"
        )
        raw.execute(
            "CREATE TABLE shops AS SELECT range AS id, 'c' || range % 3 AS city, "
            "range % 5 AS floor, range::DOUBLE AS sales FROM range(300)"
        )
    dims = {"role": "dimension"}
    policy = {
        "tables": {
            "firms": {
                "privacy_unit": "id",
                "protection": {
                    "counts": {"method": "suppress", "rules": ["freq:3"]},
                    "magnitudes": {"method": "suppress", "rules": ["freq:3"]},
                },
                "suppression": {"dimensions": ["nace", "region"]},
                "columns": {
                    "id": {"role": "identifier"},
                    "founded": dims,
                    "nace": dims,
                    "region": dims,
                    "staff": {"role": "measure", "bounds": [0, 20]},
                    "turnover": {"role": "measure", "bounds": [0, 1000]},
                },
            },
            "vat": {
                "privacy_unit": "id",
                "protection": {
                    "counts": {"method": "dp", "spend": {"epsilon": 0.1}},
                    "magnitudes": {"method": "dp", "spend": {"epsilon": 0.1}},
                },
                "dp": {"max_groups": 4, "max_rows": 1},
                "columns": {
                    "id": {"role": "identifier"},
                    "kind": dims,
                    "quarter": {"role": "dimension", "domain": ["q0", "q1", "q2", "q3"]},
                    "amount": {"role": "measure", "bounds": [0, 100]},
                },
            },
            "shops": {
                "privacy_unit": "id",
                "protection": {
                    "min_frequency": 3,
                    "counts": {"method": "round", "base": 5},
                    "magnitudes": {"method": "round", "base": 100},
                },
                "columns": {
                    "id": {"role": "identifier"},
                    "city": dims,
                    "floor": dims,
                    "sales": {"role": "measure", "bounds": [0, 1000]},
                },
            },
        },
        "budgets": [{"user": "ana", "epsilon": 5}],
        "users": {"chief": {"role": "admin"}, "ana": {"role": "analyst"}},
    }
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    sqlsdc.init(db, tmp_path / "policy.yaml", applied_by="chief")
    hints = {
        "firms": "SELECT nace, COUNT(*), SUM(staff) FROM firms GROUP BY nace",
        "vat": "SELECT quarter, COUNT(*), AVG(amount) FROM vat GROUP BY quarter",
        "shops": "SELECT city, COUNT(*), SUM(sales) FROM shops GROUP BY city",
    }
    with sqlsdc.connect(db, user="ana") as con:
        for table, example in hints.items():
            with pytest.raises(sqlsdc.PolicyViolation) as refused:
                con.execute(f"SELECT * FROM {table}")
            assert refused.value.hint == f"aggregate it: e.g. {example}"
            assert len(con.execute(example).fetchall()) > 1  # answered, grouped
