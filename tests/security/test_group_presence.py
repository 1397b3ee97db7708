"""Group presence: whether a group appears must tell no more than its protected count.

Under the cell key method a group appears exactly when its protected count of units is positive
(or, where the group's existence is the whole release, at least the minimum frequency). So
asking for the groups of a condition, or for small counts with HAVING, cannot reveal that one
person meets the condition unless the published count would.
"""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp

THRESHOLDS = [50_000, 100_000, 200_000, 500_000]


def _counts(con, where: str) -> dict:
    sql = f"SELECT municipality, COUNT(*) FROM persons WHERE {where} GROUP BY municipality"
    return dict(con.execute(sql).fetchall())


def _true_counts(raw, where: str) -> dict:
    """The unprotected counts of the population the guarded query counts: a condition on the
    unit-noised income compares x·m (:mod:`sqlsdc.rewrite.noised_conditions`, s45m)."""
    from sqlsdc.demo.build import demo_policy
    from sqlsdc.rewrite.noised_conditions import noise_conditions, policy_lookup

    sql = f"SELECT municipality, COUNT(*) FROM persons WHERE {where} GROUP BY municipality"
    tree = sqlglot.parse_one(sql, read="duckdb")
    assert noise_conditions(tree, policy_lookup(demo_policy()), lambda: sql)
    return dict(raw.execute(tree.sql("duckdb")).fetchall())


@pytest.mark.parametrize("threshold", THRESHOLDS)
def test_groups_appear_only_with_a_positive_protected_count(ckm, raw_ckm, threshold):
    where = f"income > {threshold}"
    released = _counts(ckm, where)
    assert all(n > 0 for n in released.values())
    truth = _true_counts(raw_ckm, where)
    small = {m for m, n in truth.items() if n <= 2}  # js = 2: never published as 1 or 2
    assert small, "the test needs small cells"
    assert all(released.get(m, 0) in (0,) or released[m] >= 3 for m in small)
    # presence of a small cell is the same yes/no its count gives: a published count of 0
    # would have shown it as absent anyway
    assert set(released) <= set(truth)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT municipality, COUNT(*) FROM persons GROUP BY municipality HAVING COUNT(*) < 3",
        "SELECT municipality, COUNT(*) AS n FROM persons WHERE income > 200000 "
        "GROUP BY municipality HAVING n <= 2",
        "SELECT municipality, sex, COUNT(*) FROM persons WHERE age > 90 GROUP BY ALL "
        "HAVING COUNT(*) BETWEEN 1 AND 2",
        "SELECT * FROM (SELECT municipality, COUNT(*) AS n FROM persons WHERE age > 95 "
        "GROUP BY municipality) WHERE n < 3",
    ],
)
def test_having_cannot_list_the_small_cells(ckm, sql):
    assert ckm.execute(sql).fetchall() == []


def test_a_group_only_query_is_a_count_whose_value_is_hidden(ckm):
    """Without an aggregate the groups are released on the protected count reaching k."""
    where = "income > 200000"
    counts = _counts(ckm, where)
    groups = {
        r[0]
        for r in ckm.execute(
            f"SELECT municipality FROM persons WHERE {where} GROUP BY municipality"
        ).fetchall()
    }
    assert groups == {m for m, n in counts.items() if n >= 10}
    distinct = {
        r[0] for r in ckm.execute(f"SELECT DISTINCT municipality FROM (SELECT municipality FROM "
                                  f"persons WHERE {where} GROUP BY municipality)").fetchall()
    }  # fmt: skip
    assert distinct == groups


def test_presence_in_a_subquery_follows_the_protected_count(ckm):
    where = "income > 200000"
    counts = _counts(ckm, where)
    sql = (
        "SELECT COUNT(*) FROM regions WHERE region IN (SELECT region FROM persons "
        f"WHERE {where} AND municipality = 'R01-M001' GROUP BY region)"
    )
    (present,) = ckm.execute(sql).fetchone()
    assert present == (1 if counts.get("R01-M001", 0) >= 10 else 0)


def test_bisection_on_presence_cannot_go_below_the_published_counts(ckm):
    """Raising a threshold until a group disappears stops where its *published* count drops
    to 0: presence never answers for a cell that the count hides."""
    for threshold in (100_000, 200_000, 500_000):
        where = f"income > {threshold} AND age > 60"
        counts = _counts(ckm, where)
        sql = f"SELECT municipality, SUM(income) FROM persons WHERE {where} GROUP BY municipality"
        present = {r[0] for r in ckm.execute(sql).fetchall()}
        assert present == set(counts)


def test_having_is_evaluated_only_for_the_groups_shown(ckm):
    """A HAVING that can fail (``CAST(COUNT(*) - 1 AS USMALLINT)`` on a cell the noise made 0)
    must never be evaluated on a hidden cell, whatever order the engine's optimiser gives the
    conjuncts of a filter: the protected SQL nests it in ``CASE WHEN <shown> THEN <having>
    ELSE FALSE END``, and the query over many small cells, some hidden, is answered."""
    sql = (
        "SELECT municipality, sex, age, COUNT(*) AS n FROM persons "
        "GROUP BY municipality, sex, age HAVING CAST(COUNT(*) - 1 AS USMALLINT) > 0"
    )
    where = sqlglot.parse_one(ckm.explain(sql).sql, read="duckdb").args["where"].this
    assert isinstance(where, exp.Case) and where.args["default"] == exp.false()
    (branch,) = where.args["ifs"]
    assert "__cn" in branch.this.sql() and branch.args["true"].find(exp.Cast) is not None
    rows = ckm.execute(sql).fetchall()
    assert rows and all(n > 1 for *_keys, n in rows)
