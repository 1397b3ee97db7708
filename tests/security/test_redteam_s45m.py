"""s45m: conditions on a unit-noised measure compare x·m (closes s45l's open finding).

Under CKM the demo's incomes carry permanent unit noise: every SUM/AVG adds x·m. Conditions
compared the stored x with the class breaks, so the class of x beside y = x·m told the side of 1
each factor is on (s45l: 17 % of incomes of 20,000 or more, centred estimate within 2.4 % of x
on average). Now every comparison of such a column at a break, in the query that reads its table
(WHERE, JOIN ON, CASE of an aggregate's argument, a derived table's own WHERE), compares x·m
(:mod:`sqlsdc.rewrite.noised_conditions`); comparisons through a derived table's output or by
another method's frame are refused. A protection job's WHERE compares x·m too since s46c
(:mod:`sqlsdc.jobs.noised_where`; more in ``tests/jobs/test_noised_where.py``).

Each test here fails on int45 before the fix: the rows a condition kept were those of x.
"""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp

import sqlsdc
from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.errors import PolicyViolation
from sqlsdc.jobs.tabulation import parse_job
from sqlsdc.mechanisms.ckm import MixKeys
from sqlsdc.mechanisms.unit_noise import unit_factor
from sqlsdc.policy import AggregateKind, load_policy


def _kept(ckm, raw_ckm, sql: str) -> set[int]:
    """The record keys of the persons the rewritten query's row level keeps (its select that
    names ``__rk0`` and aggregates nothing), run as an admin; with ``__v0``, only those whose
    value is not NULL (a CASE inside the aggregate)."""
    tree = sqlglot.parse_one(ckm.explain(sql).sql, read="duckdb")
    rows = next(
        s
        for s in tree.find_all(exp.Select)
        if "__rk0" in s.named_selects and "__a0" not in s.named_selects
    )
    wanted = "__v0" if "__v0" in rows.named_selects else "__rk0"
    picked = exp.select("__rk0").from_(rows.subquery("__x")).where(f"{wanted} IS NOT NULL")
    if tree.args.get("with_") is not None:  # the statement's CTEs, which the rows may read
        picked.set("with_", tree.args["with_"].copy())
    return {r[0] for r in raw_ckm.execute(picked.sql("duckdb")).fetchall()}


def _noised(raw_ckm) -> dict[int, tuple[float, float]]:
    """(x, x·m) of every person with an income, by record key (the Python reference)."""
    noise = demo_policy().table("persons").rule(AggregateKind.MAGNITUDES).magnitude.unit_noise
    keys = MixKeys(*raw_ckm.execute("SELECT * FROM sqlsdc.ckm_mix").fetchall()[0])
    rows = raw_ckm.execute("SELECT __rkey, income FROM persons WHERE income IS NOT NULL")
    return {
        k: (float(x), float(x) * unit_factor(k, "persons.income", noise, keys))
        for k, x in rows.fetchall()
    }


CLASSES = [  # (the analyst's SQL, the class as a test of a value)
    ("SELECT COUNT(*) FROM persons WHERE income >= 20000", lambda v: v >= 20000),
    (
        "SELECT COUNT(*) FROM persons WHERE income BETWEEN 20000 AND 50000",
        lambda v: 20000 <= v <= 50000,
    ),
    ("SELECT SUM(CASE WHEN income < 10000 THEN income END) FROM persons", lambda v: v < 10000),
    (
        "SELECT COUNT(*) FROM persons p JOIN households h "
        "ON p.household_id = h.household_id AND p.income >= 50000",
        lambda v: v >= 50000,
    ),
    (
        "SELECT COUNT(*) FROM (SELECT sex FROM persons WHERE income >= 100000) t WHERE sex = 'F'",
        None,  # checked below: women only
    ),
    (
        "WITH t AS (SELECT sex FROM persons WHERE income >= 100000) "
        "SELECT COUNT(*) FROM t WHERE sex = 'F'",
        None,  # a CTE's own WHERE: its definition is converted too
    ),
]


@pytest.mark.parametrize("sql, within", CLASSES, ids=range(len(CLASSES)))
def test_a_class_of_income_is_a_class_of_the_noised_value(ckm, raw_ckm, sql, within):
    """A count or sum restricted by an income class keeps exactly the persons whose x·m (the
    Python reference :func:`unit_factor`) is in it, not those whose x is (int45: 70 more
    persons of 20,000 or more, the units on the wrong side of each break)."""
    values = _noised(raw_ckm)
    kept = _kept(ckm, raw_ckm, sql)
    if within is None:
        women = {
            k for (k,) in raw_ckm.execute("SELECT __rkey FROM persons WHERE sex = 'F'").fetchall()
        }
        expected = {k for k, (_, y) in values.items() if y >= 100000} & women
        by_x = {k for k, (x, _) in values.items() if x >= 100000} & women
    else:
        expected = {k for k, (_, y) in values.items() if within(y)}
        by_x = {k for k, (x, _) in values.items() if within(x)}
    assert expected != by_x  # the classes differ: the test tells x·m from x
    assert kept == expected


def test_a_published_count_by_class_is_the_count_of_noised_values_in_it(ckm, raw_ckm):
    """The guarded answer of a count by class is the CKM-protected count of the x·m in it: its
    deviation from that count is within the count ptable's D (5), from the count of x it is
    not always (the same answer as the row-level test above, through the published cell)."""
    values = _noised(raw_ckm)
    answer = ckm.execute("SELECT COUNT(*) FROM persons WHERE income >= 200000").fetchall()[0][0]
    by_y = sum(y >= 200000 for _, y in values.values())
    assert abs(answer - by_y) <= 5


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM (SELECT income AS i FROM persons) t WHERE i >= 20000",
        "SELECT COUNT(*) FROM (SELECT * FROM persons) t WHERE income >= 20000",
        "WITH t AS (SELECT income FROM persons) SELECT COUNT(*) FROM t WHERE income >= 20000",
    ],
)
def test_a_condition_through_a_derived_table_is_refused(ckm, sql):
    """Compared outside the select that reads persons, the column cannot be noised there: the
    shape is refused with what to write instead (a CTE the planner inlines is converted)."""
    try:
        kept = ckm.execute(sql).fetchall()
    except PolicyViolation as e:
        assert "x·m" in str(e) or "noise" in str(e)
        return
    # inlined into the select that reads persons: then it must count the x·m class
    sql_inner = "SELECT COUNT(*) FROM persons WHERE income >= 20000"
    assert kept == ckm.execute(sql_inner).fetchall()


def test_a_derived_table_of_dimensions_is_answered(ckm):
    """Only a condition that reads the noised column is refused: a derived table of persons
    with its own dimension filter outside is answered as before."""
    sql = "SELECT COUNT(*) FROM (SELECT sex, income FROM persons) t WHERE sex = 'F'"
    assert ckm.execute(sql).fetchall()[0][0] > 1000


def test_a_jobs_class_of_a_noised_measure_is_a_class_of_the_noised_value(ckm, raw_ckm):
    """A job's WHERE at a break (the README's ``WHERE employees >= 10``) keeps the units whose
    x·m passes it, as the query path does (a strict expected failure until s46c: the job
    counted x's class)."""
    from sqlsdc.jobs.tabulation import cells_sql

    policy = demo_policy()
    spec = parse_job(
        "SELECT nace, COUNT(*) FROM enterprises WHERE employees >= 10 GROUP BY nace", policy
    )
    cells = raw_ckm.execute(cells_sql(spec, 0)).fetchall()
    counted = sum(row[1] for row in cells)
    noise = policy.table("enterprises").rule(AggregateKind.MAGNITUDES).magnitude.unit_noise
    keys = MixKeys(*raw_ckm.execute("SELECT * FROM sqlsdc.ckm_mix").fetchall()[0])
    rows = raw_ckm.execute("SELECT __rkey, employees FROM enterprises").fetchall()
    by_y = sum(
        x is not None and x * unit_factor(k, "enterprises.employees", noise, keys) >= 10
        for k, x in rows
    )
    by_x = sum(x is not None and x >= 10 for _, x in rows)
    assert by_x != by_y
    assert counted == by_y


@pytest.fixture(scope="module")
def threshold_counts_db(tmp_path_factory):
    """The demo with persons' counts by threshold beside CKM magnitudes with unit noise."""
    document = demo_policy().document_dict()
    document["protection"]["counts"] = {"method": "threshold"}
    policy = load_policy(document, name="demo-threshold-counts")
    path = tmp_path_factory.mktemp("s45m") / "demo.duckdb"
    build_demo_database(path, persons=2000, seed=3, policy=policy)
    return path


def test_another_methods_condition_on_a_noised_measure_is_refused(threshold_counts_db):
    """A count by threshold would compare the stored x (its frame computes no factor):
    refused, while its count by a dimension is answered."""
    with sqlsdc.connect(threshold_counts_db, user="analyst") as con:
        with pytest.raises(PolicyViolation, match="x·m"):
            con.execute("SELECT COUNT(*) FROM persons WHERE income >= 20000").fetchall()
        assert con.execute("SELECT COUNT(*) FROM persons WHERE sex = 'F'").fetchall()[0][0] > 0
