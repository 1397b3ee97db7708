"""Attacks on the identity of DP cells (ISSUE16 class 5, the DP parts of class 9, must-haves
1 and 6), as an analyst on the demo database (``benefits`` is protected with DP).

The noise of a DP cell is a function of its identity; if two different populations share an
identity they share noise, and their difference is exact. The identity must therefore cover
every predicate between the base table and the aggregation (derived tables and CTEs
included), and no spelling of the query (aliases, CTE or derived table, order of conjuncts)
may change it.
"""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import build_scope

import sqlsdc
from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.engines.duckdb import EngineError, open_database
from sqlsdc.errors import BudgetExhausted, OperationalError
from sqlsdc.guard import connection, dp_charge
from sqlsdc.planner.identity import aggregation_identity
from sqlsdc.policy import load_policy

PERSONS = 20_000
REGIONS = [f"R0{i}" for i in range(1, 9)]


def _policy(**budget):
    document = demo_policy().document_dict()
    document["budgets"] = [budget or {"user": "*", "epsilon": 100_000}]
    return load_policy(document, name="dp-identity")


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = tmp_path_factory.mktemp("dp-identity") / "template.duckdb"
    build_demo_database(path, persons=PERSONS, seed=11, policy=_policy())
    return path


@pytest.fixture
def db(template, tmp_path):
    """A private copy: every test starts with an empty ledger."""
    path = tmp_path / "demo.duckdb"
    path.write_bytes(template.read_bytes())
    return path


def spend(path) -> list[tuple]:
    con = open_database(path)
    try:
        return con.execute("SELECT epsilon, cells FROM sqlsdc.budget_spend ORDER BY seq").fetchall()
    finally:
        con.close()


def by_key(cursor) -> dict:
    return {row[0]: row[1:] for row in cursor.fetchall()}


def exact(path, sql) -> dict:
    """The exact bounded cells (admin, noise off): what the noise is added to."""
    with sqlsdc.connect(path, "admin") as con:
        con.set_dp_noise(False)
        return by_key(con.execute(sql))


# --- class 5: differencing through a WHERE inside a derived table ----------------------------


DERIVED = "SELECT region, COUNT(*) FROM (SELECT * FROM benefits WHERE {w}) AS b GROUP BY region"


@pytest.mark.parametrize(
    "template_sql",
    [
        DERIVED,
        "WITH b AS (SELECT * FROM benefits WHERE {w}) SELECT region, COUNT(*) FROM b "
        "GROUP BY region",
        "SELECT region, SUM(amount) FROM (SELECT * FROM benefits WHERE {w}) AS b GROUP BY region",
    ],
)
def test_two_populations_behind_one_outer_query_get_independent_noise(db, template_sql):
    """Same outer SELECT, different WHERE inside: the noise of the two must be independent, so
    the difference of the released values is not the exact difference of the populations;
    and the second query is not answered from the first one's cache."""
    first, second = (template_sql.format(w=w) for w in ("month < 6", "month >= 6"))
    with sqlsdc.connect(db, "analyst") as con:
        a, b = by_key(con.execute(first)), by_key(con.execute(second))
    exact_a, exact_b = exact(db, first), exact(db, second)
    assert len(spend(db)) == 2  # two populations, two charges (no free cache hit)
    released = [r for r in REGIONS if a[r][0] is not None and b[r][0] is not None]
    assert len(released) >= 6  # (cells with fewer than 20 noisy units are suppressed)
    noise_a = {r: a[r][0] - exact_a[r][0] for r in released}
    noise_b = {r: b[r][0] - exact_b[r][0] for r in released}
    same = sum(noise_a[r] == noise_b[r] for r in released)
    assert same <= 1  # shared noise would make every one equal
    assert a != b


def test_derived_table_where_differs_from_no_where(db):
    with sqlsdc.connect(db, "analyst") as con:
        filtered = by_key(con.execute(DERIVED.format(w="month < 6")))
        everything = by_key(con.execute("SELECT region, COUNT(*) FROM benefits GROUP BY region"))
        trivially = by_key(con.execute(DERIVED.format(w="TRUE")))
    assert filtered != everything
    assert trivially == everything  # WHERE TRUE is no condition: the same population
    assert len(spend(db)) == 2


# --- one population, many spellings: one identity, one charge --------------------------------

# A DP count of benefits costs epsilon 1/10, and the noisy unit counts of its minimum frequency
# rule another 1/10: 2 statistics x 8 regions = 16 cells.
COUNT_COST = ("1/5", 16)


SAME_CELLS = [
    "SELECT region, COUNT(*) FROM benefits WHERE month < 6 AND scheme = 'child' GROUP BY region",
    "SELECT b.region AS r, COUNT(*) AS n FROM benefits AS b WHERE b.scheme = 'child' "
    "AND 6 > b.month GROUP BY b.region",
    "SELECT region, COUNT(*) FROM (SELECT * FROM benefits WHERE scheme = 'child') AS x "
    "WHERE x.month < 6.0 GROUP BY region",
    "WITH c AS (SELECT * FROM benefits WHERE month < 6), d AS (SELECT * FROM c WHERE "
    "scheme = 'child') SELECT region, COUNT(*) FROM d GROUP BY region",
    "SELECT region, n FROM (SELECT region, COUNT(*) AS n FROM benefits WHERE NOT month >= 6 "
    "AND scheme = 'child' GROUP BY region) AS t",
    "SELECT region, COUNT(*) FROM (SELECT region AS region, month AS m, scheme FROM benefits) s "
    "WHERE s.scheme = 'child' AND s.m < 6 GROUP BY s.region",
]


def test_rephrasings_of_one_population_share_noise_and_cost_once(db):
    with sqlsdc.connect(db, "analyst") as con:
        results = [by_key(con.execute(sql)) for sql in SAME_CELLS]
    assert all(r == results[0] for r in results)
    assert spend(db) == [COUNT_COST]


DIFFERENT_CELLS = [
    "SELECT region, COUNT(*) FROM benefits WHERE month < 6 GROUP BY region",
    "SELECT region, COUNT(*) FROM benefits WHERE month < 7 GROUP BY region",
    "SELECT region, COUNT(*) FROM benefits WHERE month <= 6 GROUP BY region",
    "SELECT region, COUNT(*) FROM (SELECT * FROM benefits WHERE month < 6 AND scheme = 'child') "
    "AS b GROUP BY region",
    "SELECT region, COUNT(*) FROM (SELECT * FROM benefits WHERE month < 6 OR scheme = 'child') "
    "AS b GROUP BY region",
    "SELECT region, COUNT(*) FROM benefits GROUP BY region",
    "SELECT region, COUNT(DISTINCT person_id) FROM benefits WHERE scheme = 'child' GROUP BY region",
    "SELECT region, COUNT(DISTINCT scheme) FROM benefits GROUP BY region",
    "SELECT region, COUNT(amount) FROM benefits GROUP BY region",
]


def test_different_cells_do_not_share_cache_entries(db):
    with sqlsdc.connect(db, "analyst") as con:
        results = [by_key(con.execute(sql)) for sql in DIFFERENT_CELLS]
    assert len(spend(db)) == len(DIFFERENT_CELLS)  # each paid: no free answer from another
    distinct = {tuple(sorted(r.items())) for r in results}
    assert len(distinct) == len(DIFFERENT_CELLS)


# --- the identity module on its own -----------------------------------------------------------


SCHEMA = {
    "t": {"uid": "BIGINT", "region": "VARCHAR", "month": "INT", "amount": "DOUBLE"},
    "u": {"region": "VARCHAR", "name": "VARCHAR"},
}


def identity(sql: str):
    tree = qualify(sqlglot.parse_one(sql, read="duckdb"), schema=SCHEMA, dialect="duckdb")
    annotate_types(tree, schema=SCHEMA)
    scope = build_scope(tree)
    aggregation = next(s for s in scope.traverse() if s.expression.args.get("group"))
    aggregates = [a for a in aggregation.expression.find_all(sqlglot.exp.AggFunc)]
    return aggregation_identity(aggregation, None, aggregates)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            "SELECT region, COUNT(*) FROM t WHERE month < 6 AND region = 'a' GROUP BY region",
            "SELECT x.region, COUNT(*) FROM t AS x WHERE x.region = 'a' AND x.month < 6 "
            "GROUP BY x.region",
        ),
        (
            "SELECT region, SUM(amount) FROM t WHERE month BETWEEN 1 AND 5 GROUP BY region",
            "WITH c AS (SELECT * FROM t WHERE month >= 1) SELECT region, SUM(c.amount) FROM c "
            "WHERE month <= 5 GROUP BY region",
        ),
        (
            "SELECT t.region, COUNT(*) FROM t JOIN u ON t.region = u.region WHERE u.name = 'n' "
            "GROUP BY t.region",
            "SELECT a.region, COUNT(*) FROM u AS b, t AS a WHERE b.name = 'n' AND a.region = "
            "b.region GROUP BY a.region",
        ),
        (
            "SELECT region, COUNT(*) FROM t WHERE month IN (1, 2, 3) GROUP BY region",
            "SELECT region, COUNT(*) FROM t WHERE month IN (3, 1, 2, 1) GROUP BY region",
        ),
        (
            "SELECT region, COUNT(*) FROM t WHERE month = 1 OR region = 'a' GROUP BY region",
            "SELECT region, COUNT(*) FROM t WHERE region = 'a' OR month = 1 GROUP BY region",
        ),
    ],
)
def test_identity_is_the_same_for_the_same_population(a, b):
    assert identity(a).text == identity(b).text


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            "SELECT region, COUNT(*) FROM (SELECT * FROM t WHERE month < 6) s GROUP BY region",
            "SELECT region, COUNT(*) FROM (SELECT * FROM t WHERE month >= 6) s GROUP BY region",
        ),
        (
            "SELECT region, COUNT(*) FROM t WHERE region = '1' GROUP BY region",
            "SELECT region, COUNT(*) FROM t WHERE region = '1.0' GROUP BY region",
        ),
        (
            "SELECT region, COUNT(*) FROM t WHERE month < 6 GROUP BY region",
            "SELECT region, COUNT(*) FROM t WHERE month < 6.5 GROUP BY region",
        ),
        (
            "SELECT t.region, COUNT(*) FROM t JOIN u ON t.region = u.region GROUP BY t.region",
            "SELECT t.region, COUNT(*) FROM t LEFT JOIN u ON t.region = u.region GROUP BY t.region",
        ),
        (
            "SELECT t.region, COUNT(*) FROM t LEFT JOIN (SELECT * FROM u WHERE name = 'n') v "
            "ON t.region = v.region GROUP BY t.region",
            "SELECT t.region, COUNT(*) FROM t LEFT JOIN u ON t.region = u.region "
            "WHERE u.name = 'n' GROUP BY t.region",
        ),
        (
            "SELECT region, COUNT(*) FROM t GROUP BY region",
            "SELECT region, COUNT(DISTINCT uid) FROM t GROUP BY region",
        ),
        (
            "SELECT region, COUNT(*) FROM (SELECT * FROM t ORDER BY amount LIMIT 10) s "
            "GROUP BY region",
            "SELECT region, COUNT(*) FROM (SELECT * FROM t ORDER BY amount LIMIT 11) s "
            "GROUP BY region",
        ),
        (
            "SELECT region, SUM(amount) FROM (SELECT region, amount FROM t) s GROUP BY region",
            "SELECT region, SUM(amount) FROM (SELECT region, amount * 2 AS amount FROM t) s "
            "GROUP BY region",
        ),
        (
            "SELECT region, COUNT(*) FROM t WHERE region IN "
            "(SELECT region FROM u WHERE name = 'a') "
            "GROUP BY region",
            "SELECT region, COUNT(*) FROM t WHERE region IN "
            "(SELECT region FROM u WHERE name = 'b') "
            "GROUP BY region",
        ),
        (
            "WITH c AS (SELECT * FROM u WHERE name = 'a') SELECT region, COUNT(*) FROM t WHERE "
            "region IN (SELECT region FROM c) GROUP BY region",
            "WITH c AS (SELECT * FROM u WHERE name = 'b') SELECT region, COUNT(*) FROM t WHERE "
            "region IN (SELECT region FROM c) GROUP BY region",
        ),
    ],
)
def test_identity_differs_for_different_populations_or_statistics(a, b):
    assert identity(a).text != identity(b).text


# --- class 9: DP over CTEs, COUNT(DISTINCT), the same cell twice ------------------------------


def test_dp_over_ctes_and_derived_tables_is_answered(db):
    queries = [
        "WITH b AS (SELECT * FROM benefits WHERE month < 6) SELECT region, COUNT(*), "
        "SUM(amount), AVG(amount) FROM b GROUP BY region",
        "WITH a AS (SELECT * FROM benefits), b AS (SELECT * FROM a WHERE month < 6) "
        "SELECT region, COUNT(*), SUM(amount), AVG(amount) FROM b GROUP BY region",
        "SELECT region, COUNT(*), SUM(amount), AVG(amount) FROM (SELECT * FROM benefits "
        "WHERE month < 6) AS b GROUP BY region",
    ]
    with sqlsdc.connect(db, "analyst") as con:
        results = [by_key(con.execute(sql)) for sql in queries]
    assert set(results[0]) == set(REGIONS)
    assert results[0] == results[1] == results[2]
    assert len(spend(db)) == 1


def test_count_distinct_of_a_dimension_counts_values_not_persons(db):
    sql = "SELECT region, COUNT(DISTINCT scheme) FROM benefits GROUP BY region"
    persons = "SELECT region, COUNT(DISTINCT person_id) FROM benefits GROUP BY region"
    values, units = exact(db, sql), exact(db, persons)
    raw = open_database(db)
    try:
        truth = dict(raw.execute("SELECT region, COUNT(DISTINCT scheme) FROM benefits "
                                 "GROUP BY region").fetchall())  # fmt: skip
    finally:
        raw.close()
    assert {r: v[0] for r, v in values.items()} == truth  # 4 schemes; each unit adds <= 12
    assert values != units
    with sqlsdc.connect(db, "analyst") as con:
        explained = con.explain(sql)
    (stage,) = explained.dp_stages
    (statistic,) = [s for s in stage.statistics if s.measure.startswith("DISTINCT")]
    assert statistic.measure == 'DISTINCT "benefits"."scheme"'
    assert statistic.calibration.scale == 240  # max_groups 2 x max_rows 12 / epsilon 0.1


def test_count_distinct_bounds_the_values_of_each_unit(tmp_path):
    """One unit with 50 distinct values in a group adds at most max_rows (5) of them."""
    import duckdb

    path = tmp_path / "distinct.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE ev AS SELECT 1 AS pid, 'g' AS grp, 'v' || range AS v "
                    "FROM range(50)")  # fmt: skip
        con.execute("INSERT INTO ev SELECT 2 + range, 'g', 'v0' FROM range(30)")
    rule = {"method": "dp", "spend": {"epsilon": 1}}
    sqlsdc.init(path, {
        "tables": {"ev": {
            "privacy_unit": "pid",
            "columns": {"pid": {"role": "identifier"},
                        "grp": {"role": "dimension", "domain": ["g", "h"]},
                        "v": {"role": "dimension"}},
            "protection": {"counts": rule, "magnitudes": rule},
            "dp": {"max_groups": 1, "max_rows": 5},
        }},
        "users": {"admin": {"role": "admin"}, "ana": {"role": "analyst"}},
        "budgets": [{"user": "*", "epsilon": 100}],
    })  # fmt: skip
    with sqlsdc.connect(path, "admin") as con:
        con.set_dp_noise(False)
        got = dict(con.execute("SELECT grp, COUNT(DISTINCT v) FROM ev GROUP BY grp").fetchall())
    assert got == {"g": 5, "h": 0}


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT region, COUNT(*), COUNT(*) FROM benefits GROUP BY region",
        "SELECT region, COUNT(*) FROM benefits GROUP BY region UNION ALL "
        "SELECT region, COUNT(*) FROM benefits GROUP BY region",
        "SELECT a.region, a.n + b.n FROM (SELECT region, COUNT(*) n FROM benefits GROUP BY "
        "region) a JOIN (SELECT region, COUNT(*) n FROM benefits GROUP BY region) b "
        "ON a.region = b.region",
        "WITH c AS (SELECT region, COUNT(*) AS n FROM benefits GROUP BY region) "
        "SELECT x.region, x.n - y.n FROM c AS x JOIN c AS y ON x.region = y.region",
    ],
)
def test_the_same_dp_cell_twice_in_one_query_is_drawn_and_charged_once(db, sql):
    with sqlsdc.connect(db, "analyst") as con:
        rows = con.execute(sql).fetchall()
    assert rows
    assert spend(db) == [COUNT_COST]


def test_statistics_paid_once_are_free_in_other_combinations(db):
    with sqlsdc.connect(db, "analyst") as con:
        con.execute("SELECT region, SUM(amount), AVG(amount) FROM benefits GROUP BY region")
        con.execute("SELECT region, SUM(amount) FROM benefits GROUP BY region")
        con.execute("SELECT region, AVG(amount) FROM benefits GROUP BY region")
        con.execute("SELECT region, AVG(amount) FROM benefits GROUP BY region")
    # SUM 1/5; AVG reuses that sum and draws its count with its whole 1/5; noisy unit counts
    # 1/10: 3 statistics x 8 cells. SUM again: free. AVG alone: its own centred sum and count,
    # 1/10 each, once (the repeat is free).
    assert spend(db) == [("1/2", 24), ("1/5", 16)]


# --- must-have 6: the budget is spent before the exact cells are computed ---------------------


def _failing_exact_cells(monkeypatch, seen: list[str]):
    real = connection.engine.run

    def run(con, sql, timeout=None):
        seen.append(sql)
        if "__pairs" in sql:  # the exact bounded cells of a DP aggregation
            raise connection.engine.duckdb.InterruptException("INTERRUPT Error: interrupted")
        return real(con, sql, timeout=timeout)

    monkeypatch.setattr(connection.engine, "run", run)


def test_a_dp_query_that_fails_while_computing_has_paid(db, monkeypatch):
    sql = "SELECT region, COUNT(*) FROM benefits WHERE month < 3 GROUP BY region"
    seen: list[str] = []
    _failing_exact_cells(monkeypatch, seen)
    with sqlsdc.connect(db, "analyst") as con:
        with pytest.raises(OperationalError, match="timeout"):
            con.execute(sql)
        assert spend(db) == [("1/5", 0)]  # charged before the cells ran, none of them kept
        monkeypatch.undo()
        first = con.execute(sql).fetchall()
        again = con.execute(sql).fetchall()
    assert first == again
    # a statistic is paid for later askings once its cells are kept (s41j): the first asking
    # after the failure pays again (no free re-run of the exact cells), the repeat nothing
    assert spend(db) == [("1/5", 0), ("1/5", 16)]  # 8 regions × 2 statistics kept


def test_a_real_timeout_of_the_exact_cells_still_spends(db, monkeypatch):
    """The exact cells of a DP query, stopped by the statement timeout, have been paid. The
    check and what runs before the charge fit in the timeout (they count too); once the
    charge is committed, the engine gets a nanosecond of what is left."""
    sql = ("SELECT region, COUNT(*), SUM(amount), AVG(amount) FROM benefits AS a "
           "WHERE month > 1 GROUP BY region")  # fmt: skip
    charged, time_left, charge = [], connection.Connection._time_left, dp_charge.charge

    def charge_then_note(*args, **kwargs):
        paid = charge(*args, **kwargs)
        charged.append(True)
        return paid

    monkeypatch.setattr(dp_charge, "charge", charge_then_note)
    monkeypatch.setattr(connection.Connection, "_time_left",
                        lambda self: 1e-9 if charged else time_left(self))  # fmt: skip
    with sqlsdc.connect(db, "analyst") as con:
        try:
            con.execute(sql)
        except (OperationalError, EngineError):
            pass  # stopped: what matters is the ledger
    assert [e for e, _cells in spend(db)] == ["3/5"]  # COUNT, SUM, AVG, unit counts


def test_an_exhausted_budget_refuses_before_any_exact_cell_runs(tmp_path, monkeypatch):
    path = tmp_path / "small.duckdb"
    build_demo_database(path, persons=2_000, seed=3,
                        policy=_policy(user="analyst", epsilon="1/5"))  # fmt: skip
    with sqlsdc.connect(path, "analyst") as con:
        con.execute("SELECT region, COUNT(*) FROM benefits GROUP BY region")  # spends all
        seen: list[str] = []
        _failing_exact_cells(monkeypatch, seen)
        with pytest.raises(BudgetExhausted):
            con.execute("SELECT scheme, COUNT(*) FROM benefits GROUP BY scheme")
    assert not [s for s in seen if "__pairs" in s]
