"""DP group keys of a public table read through a derived table or a CTE (red team s49c), and
what a query of public groups under ``min_frequency`` pays for, on the demo database
(``benefits``: DP, public groups, ``min_frequency: 20``; ``regions``: public, key ``region``).

A public table's column joined to the DP table has a public domain (the public table's
values); read through a derived table or a CTE that only joins and filters (outer joins
included) it is the same column, so it is answered as the direct join: same cells, same
charge, one cached identity. A derived table that filters the public table, aggregates,
DISTINCTs, UNIONs or is joined again is not provably that column, and stays refused before
any charge.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import sqlglot
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import build_scope

import sqlsdc
from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import PolicyViolation
from sqlsdc.planner.identity import aggregation_identity
from sqlsdc.policy import load_policy

SCHEMES = ["child", "disability", "housing", "unemployment"]


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    document = demo_policy().document_dict()
    document["budgets"] = [{"user": "*", "epsilon": 100_000}]
    path = tmp_path_factory.mktemp("dp-derived-keys") / "template.duckdb"
    build_demo_database(path, persons=5_000, seed=5, policy=load_policy(document, name="s49m"))
    return path


@pytest.fixture
def db(template, tmp_path, copy_database):
    """A private copy: every test starts with an empty ledger."""
    return copy_database(template, tmp_path)


def raw(path, sql: str) -> list[tuple]:
    con = open_database(path)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def ledger(path) -> list[tuple[Fraction, Fraction, Fraction]]:
    """(epsilon, rho, delta) of every charge, in order."""
    rows = raw(path, "SELECT epsilon, rho, delta FROM sqlsdc.budget_spend ORDER BY seq")
    return [tuple(Fraction(v) for v in row) for row in rows]


# --- 1. a public column through a derived table or a CTE ------------------------------------

DIRECT = (
    "SELECT r.name, COUNT(DISTINCT b.person_id), SUM(b.amount) FROM benefits b "
    "LEFT JOIN regions r ON b.region = r.region {where} GROUP BY r.name"
)
DERIVED = (
    "SELECT t.name, COUNT(DISTINCT t.person_id), SUM(t.amount) FROM (SELECT b.person_id, "
    "b.amount, r.name FROM benefits b LEFT JOIN regions r ON b.region = r.region) AS t "
    "{where} GROUP BY t.name"
)
CTE = (
    "WITH t AS (SELECT b.*, r.name FROM benefits b LEFT JOIN regions r ON b.region = r.region) "
    "SELECT name, COUNT(DISTINCT person_id), SUM(amount) FROM t {where} GROUP BY name"
)
NESTED = (
    "SELECT u.name, COUNT(DISTINCT u.person_id), SUM(u.amount) FROM (SELECT * FROM "
    "(SELECT b.person_id, b.amount, b.scheme, r.name FROM benefits b LEFT JOIN regions r "
    "ON b.region = r.region) AS t) AS u {where} GROUP BY u.name"
)


def test_a_public_column_through_a_derived_table_or_cte_is_answered_as_the_direct_join(db):
    """Fails on int49: the three rephrasings were refused ("no public domain")."""
    with sqlsdc.connect(db, "analyst") as con:
        direct = sorted(con.execute(DIRECT.format(where="")).fetchall())
        paid = ledger(db)
        others = [
            sorted(con.execute(sql.format(where="")).fetchall()) for sql in (DERIVED, CTE, NESTED)
        ]
    assert [r[0] for r in direct] == sorted(n for (n,) in raw(db, "SELECT name FROM regions"))
    assert all(o == direct for o in others)  # the same noisy cells: one identity
    assert paid == [(Fraction(3, 10), 0, 0)]  # COUNT 0.1 (the unit count) + SUM 0.2
    assert ledger(db) == paid  # the rephrasings came from the cache, free
    with sqlsdc.connect(db, "admin") as con:  # one identity names one exact value
        con.set_dp_noise(False)
        exact = [sorted(con.execute(sql.format(where="")).fetchall())
                 for sql in (DIRECT, DERIVED, CTE, NESTED)]  # fmt: skip
    assert all(e == exact[0] for e in exact) and exact[0] != direct


def test_a_filter_after_the_join_is_the_direct_query_s_filter_not_the_whole_population(db):
    where = "WHERE {p}scheme = 'child'"
    with sqlsdc.connect(db, "analyst") as con:
        whole = sorted(con.execute(DIRECT.format(where="")).fetchall())
        direct = sorted(con.execute(DIRECT.format(where=where.format(p="b."))).fetchall())
        charges = len(ledger(db))
        cte = sorted(con.execute(CTE.format(where=where.format(p=""))).fetchall())
        nested = sorted(con.execute(NESTED.format(where=where.format(p="u."))).fetchall())
    assert charges == 2 and direct != whole  # the filtered cells are other cells, paid
    assert cte == nested == direct and len(ledger(db)) == charges


REFUSED = {
    # the public table filtered before the outer join: its rows are not the public table's
    "filtered public table": (
        "SELECT t.name, COUNT(*) FROM (SELECT b.person_id, r.name FROM benefits b LEFT JOIN "
        "(SELECT * FROM regions WHERE population > 1000) r ON b.region = r.region) t "
        "GROUP BY t.name"
    ),
    "aggregated": (
        "SELECT t.name, SUM(t.n) FROM (SELECT r.name, b.person_id, COUNT(*) AS n FROM "
        "benefits b LEFT JOIN regions r ON b.region = r.region GROUP BY r.name, b.person_id) t "
        "GROUP BY t.name"
    ),
    "distinct": (
        "SELECT t.name, COUNT(*) FROM (SELECT DISTINCT b.person_id, r.name FROM benefits b "
        "LEFT JOIN regions r ON b.region = r.region) t GROUP BY t.name"
    ),
    "union": (
        "SELECT t.name, COUNT(*) FROM (SELECT b.person_id, r.name FROM benefits b LEFT JOIN "
        "regions r ON b.region = r.region UNION ALL SELECT b.person_id, b.scheme FROM "
        "benefits b) t GROUP BY t.name"
    ),
    "joined again": (
        "SELECT t.name, COUNT(*) FROM (SELECT b.person_id, b.region, r.name FROM benefits b "
        "LEFT JOIN regions r ON b.region = r.region) t JOIN regions g ON t.region = g.region "
        "GROUP BY t.name"
    ),
    "computed": (
        "SELECT t.name, COUNT(*) FROM (SELECT b.person_id, r.name || '' AS name FROM benefits b "
        "LEFT JOIN regions r ON b.region = r.region) t GROUP BY t.name"
    ),
    "limited": (
        "SELECT t.name, COUNT(*) FROM (SELECT b.person_id, r.name FROM benefits b LEFT JOIN "
        "regions r ON b.region = r.region LIMIT 100) t GROUP BY t.name"
    ),
}


@pytest.mark.parametrize("sql", list(REFUSED.values()), ids=list(REFUSED))
def test_derived_tables_that_are_not_the_public_column_stay_refused_before_any_charge(db, sql):
    with sqlsdc.connect(db, "analyst") as con, pytest.raises(PolicyViolation):
        con.execute(sql)
    assert ledger(db) == []


SCHEMA = {
    "t": {"uid": "BIGINT", "region": "VARCHAR", "amount": "DOUBLE"},
    "u": {"region": "VARCHAR", "name": "VARCHAR"},
    "v": {"region": "VARCHAR"},
}


def identity(sql: str):
    tree = qualify(sqlglot.parse_one(sql, read="duckdb"), schema=SCHEMA, dialect="duckdb")
    annotate_types(tree, schema=SCHEMA)
    aggregation = next(s for s in build_scope(tree).traverse() if s.expression.args.get("group"))
    return aggregation_identity(aggregation)


def test_an_outer_join_is_flattened_only_where_it_is_the_whole_from():
    """The identity of an outer join read through a derived table is the direct join's only
    where the derived table is the aggregation's whole FROM; beside another source, the
    population (which rows, joined in which order) is not the direct one's, so it stays an
    opaque relation and its columns are not the public table's."""
    direct = identity(
        "SELECT u.name, COUNT(*) FROM t LEFT JOIN u ON t.region = u.region WHERE t.amount > 1 "
        "GROUP BY u.name"
    )
    derived = identity(
        "SELECT s.name, COUNT(*) FROM (SELECT t.amount, u.name FROM t LEFT JOIN u "
        "ON t.region = u.region) s WHERE s.amount > 1 GROUP BY s.name"
    )
    beside = identity(
        "SELECT s.name, COUNT(*) FROM (SELECT t.region, u.name FROM t LEFT JOIN u "
        "ON t.region = u.region) s JOIN v ON s.region = v.region GROUP BY s.name"
    )
    inner = identity(
        "SELECT s.name, COUNT(*) FROM (SELECT t.amount, u.name FROM t JOIN u "
        "ON t.region = u.region) s WHERE s.amount > 1 GROUP BY s.name"
    )
    assert derived.text == direct.text and derived.keys == ('"u"."name"',)
    assert beside.keys != ('"u"."name"',)  # opaque: a column of the derived table's output
    assert inner.text != direct.text  # an inner join is another population


# --- 2. what a query of public groups pays under min_frequency ------------------------------


def test_groups_alone_under_min_frequency_are_the_public_domain_and_free(db):
    """Fails on int49: the query paid the counts' epsilon (0.1) for a noisy unit count per
    scheme that nothing used (no value to withhold, every group of the domain released)."""
    with sqlsdc.connect(db, "analyst") as con:
        explained = con.explain("SELECT scheme FROM benefits GROUP BY scheme")
        cursor = con.execute("SELECT scheme FROM benefits WHERE amount > 2000 GROUP BY scheme")
        groups = sorted(s for (s,) in cursor.fetchall())
    assert explained.dp_cost.is_zero and ledger(db) == []
    assert groups == SCHEMES  # the domain, whatever the data


SMALL = "SELECT scheme, SUM(amount) FROM benefits WHERE amount > 1500 GROUP BY scheme"


def test_a_sum_under_min_frequency_pays_for_the_unit_counts_that_withhold_its_cells(db):
    """With a value to withhold the noisy unit count is used (a cell of fewer noisy units than
    ``min_frequency`` is NULL, status ``suppressed``), so it is paid: SUM 0.2 plus 0.1."""
    with sqlsdc.connect(db, "analyst") as con:
        assert con.explain(SMALL).dp_cost.epsilon == Fraction(3, 10)
        con.execute(SMALL).fetchall()
    assert ledger(db) == [(Fraction(3, 10), 0, 0)]
    with sqlsdc.connect(db, "admin") as con:  # the same rule over exact (bounded) unit counts
        con.set_dp_noise(False)
        cursor = con.execute(SMALL)
        rows, status = cursor.fetchall(), cursor.cell_status()
    released = dict(rows)
    units = dict(raw(db, "SELECT scheme, COUNT(DISTINCT person_id) FROM benefits "
                         "WHERE amount > 1500 GROUP BY scheme"))  # fmt: skip
    few = {s for s in SCHEMES if units.get(s, 0) < 20}
    assert few and all(released[s] is None for s in few)
    suppressed = {s for (s, _), v in zip(rows, status.iloc[:, 1], strict=True)
                  if v == "suppressed"}  # fmt: skip
    assert suppressed == {s for s, v in released.items() if v is None}
