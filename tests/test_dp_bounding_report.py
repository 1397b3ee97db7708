"""The DP bounding report: per cell, noisy shares of input dropped by the row caps and clamped.

Exact values (admin, noise off) are checked against the definition recomputed from the raw
rows; the sensitivity claim (one person moves the whole report vector by at most one person's
worth in L1) against the exact report with and without a person with many rows; the cost
against the policy's spend (three parts adding up to it, paid once).
"""

from __future__ import annotations

import shutil
from fractions import Fraction

import numpy as np
import pytest
from sqlglot import exp
from test_dp_query import dp_document, make_db

import sqlsdc
from sqlsdc.engines.duckdb import open_database
from sqlsdc.guard.pipeline import protect
from sqlsdc.mechanisms.accountant import REPORT_GRID, PrivacyCost, Statistic

REPORT = {"epsilon": "1/2"}


def _document(**visits_dp):
    document = dp_document()
    document["tables"]["persons"]["dp"]["bounding_report"] = REPORT
    visits = document["tables"]["visits"]
    visits["columns"]["clinic"]["domain"] = ["a", "b", "c", "rare"]
    visits["dp"] = {"max_groups": 2, "max_rows": 5, "bounding_report": REPORT, **visits_dp}
    return document


@pytest.fixture(scope="module")
def report_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "report.duckdb"
    make_db(path, _document())
    return path


@pytest.fixture(scope="module")
def raw(report_db):
    con = open_database(report_db)
    yield con
    con.close()


def _exact_accuracy(path, sql):
    with sqlsdc.connect(path, "admin") as con:
        con.set_dp_noise(False)
        cur = con.execute(sql)
        return cur.fetchall(), cur.cell_accuracy()


def test_a_one_row_table_drops_nothing_and_reports_the_clamped_share_exactly(report_db, raw):
    rows, accuracy = _exact_accuracy(
        report_db, "SELECT region, SUM(income) FROM persons GROUP BY region"
    )
    sums = accuracy[accuracy["column"] == "sum(income)"].set_index("row")
    clamped = dict(raw.execute(
        "SELECT region, AVG(CASE WHEN ROUND(income / 10) > 10000 THEN 1 ELSE 0 END) "
        "FROM persons GROUP BY region").fetchall())  # fmt: skip
    for i, (region, _value) in enumerate(rows):
        if region == "W":  # the empty domain cell: no input, no share
            assert np.isnan(sums.loc[i, "dropped"]) and np.isnan(sums.loc[i, "clamped"])
            continue
        assert sums.loc[i, "dropped"] == 0
        assert sums.loc[i, "clamped"] == pytest.approx(clamped[region], abs=1e-12)
    assert clamped["N"] > 0 or clamped["S"] > 0 or clamped["E"] > 0  # person 7: 5e8


def test_counts_are_not_clamped(report_db):
    _rows, accuracy = _exact_accuracy(
        report_db, "SELECT clinic, COUNT(*), SUM(cost) FROM visits GROUP BY clinic"
    )
    counts = accuracy[accuracy["column"] == "count_star()"]
    sums = accuracy[accuracy["column"] == "sum(cost)"]
    assert (counts["clamped"] == 0).all() and (sums["clamped"] > 0.2).all()  # cost up to 150
    assert (counts["dropped"].to_numpy() == sums["dropped"].to_numpy()).all()


def test_the_dropped_share_is_the_per_unit_share_of_rows_the_caps_removed(tmp_path, raw):
    """With only a per-unit cap of 4 rows (every clinic kept, 100 rows per clinic), the whole
    query's dropped share is the mean over persons of (a - min(a, 4)) / a, up to the grid."""
    path = tmp_path / "capped.duckdb"
    make_db(path, _document(max_groups=4, max_rows=100, max_rows_per_unit=4))
    _rows, accuracy = _exact_accuracy(path, "SELECT SUM(cost) FROM visits")
    per_unit = np.array([n for (n,) in raw.execute(
        "SELECT COUNT(*) FROM visits GROUP BY pid").fetchall()])  # fmt: skip
    expected = np.mean((per_unit - np.minimum(per_unit, 4)) / per_unit)
    assert expected > 0.01
    assert accuracy.loc[0, "dropped"] == pytest.approx(expected, abs=2 / REPORT_GRID)


def _report_vector(path, sql) -> np.ndarray:
    """The exact report statistics (grid units) of every cell of ``sql``'s stage."""
    with sqlsdc.connect(path, "admin") as guarded:
        stage = guarded.explain(sql).dp_stages[0]
    con = open_database(path)
    try:
        frame = con.execute(stage.sql).df().sort_values("__g0")
    finally:
        con.close()
    return frame[list(stage.report)].to_numpy(dtype=np.int64)


@pytest.mark.parametrize("visits_dp", [{}, {"max_rows_per_unit": 7}], ids=["cells", "unit-cap"])
def test_one_person_moves_the_report_by_at_most_one_person(tmp_path, visits_dp):
    """Person 0 has 60 extra rows in three clinics: removing them changes the vector of
    (dropped, clamped, kept) over all cells by at most REPORT_GRID in L1, the sensitivity the
    noise is calibrated to (accountant.calibrate_report)."""
    with_0, without_0 = tmp_path / "with.duckdb", tmp_path / "without.duckdb"
    make_db(with_0, _document(**visits_dp))
    shutil.copy(with_0, without_0)  # the same record keys: the same keyed choices
    con = open_database(without_0)
    con.execute("DELETE FROM visits WHERE pid = 0")
    con.close()
    sql = "SELECT clinic, SUM(cost) FROM visits GROUP BY clinic"
    with_0, without_0 = _report_vector(with_0, sql), _report_vector(without_0, sql)
    change = np.abs(with_0 - without_0).sum()
    assert 0 < change <= REPORT_GRID


def test_the_report_costs_its_spend_once(report_db):
    sql = "SELECT region, SUM(income) FROM persons GROUP BY region"
    with sqlsdc.connect(report_db, "ana") as con:
        query = con.explain(sql)
        stage = query.dp_stages[0]
        report = [s for s in stage.statistics if s.column in stage.report]
        assert stage.report[0] is None  # one row per person: nothing dropped, nothing released
        assert [s.calibration.statistic for s in report] == [Statistic.UNIT_SHARE] * 2
        assert sum((s.calibration.cost for s in report), PrivacyCost()) == PrivacyCost(
            epsilon=Fraction(1, 2)
        )
        assert query.dp_cost == PrivacyCost(epsilon=Fraction(3, 2))  # SUM 1 + report 1/2
        assert all(s.calibration.scale == REPORT_GRID * 2 for s in report)  # t = 1/epsilon
        before = con.remaining_budget()
        con.execute(sql).fetchall()
        middle = con.remaining_budget()
        con.execute(sql).fetchall()
        after = con.remaining_budget()
    assert middle[0].spent.epsilon - before[0].spent.epsilon == Fraction(3, 2)
    assert after[0].spent == middle[0].spent


def test_without_a_report_the_shares_are_missing_and_explain_says_so(tmp_path):
    path = tmp_path / "plain.duckdb"
    make_db(path, dp_document())
    with sqlsdc.connect(path, "ana") as con:
        cur = con.execute("SELECT region, SUM(income) FROM persons GROUP BY region")
        accuracy = cur.cell_accuracy()
        text = str(con.explain("SELECT region, SUM(income) FROM persons GROUP BY region"))
    assert accuracy["dropped"].isna().all() and accuracy["clamped"].isna().all()
    assert "bounding (persons): not reported (an admin sets dp.bounding_report)" in text


def test_explain_describes_the_report(report_db):
    with sqlsdc.connect(report_db, "ana") as con:
        query = con.explain("SELECT clinic, SUM(cost) FROM visits GROUP BY clinic")
    text = str(query)
    assert "bounding (visits): per cell, noisy shares of input dropped" in text
    assert "cost ε = 0.5" in text
    assert query.to_dict()["dp_bounding_report"][0].startswith("per cell, noisy shares")


def _misplaced(tree: exp.Expr, seen: set[int]) -> int:
    """Nodes of ``tree`` held in a place other than their parent's (or met before)."""
    count, stack = 0, [tree]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            count += 1
            continue
        seen.add(id(node))
        for key, value in node.args.items():
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, exp.Expr):
                    count += child.parent is not node or child.arg_key != key
                    stack.append(child)
    return count


def test_every_node_of_the_stage_trees_has_one_place(tmp_path):
    """The exact cells' SQL is built in place, without sqlglot's copying builders, so a node
    used twice (the key columns, the row cap's literal) must be made once per place: a shared
    node would have one parent, and Spark, which runs these trees, or any pass that changes
    one place would change the other. Covered: per-unit pairs, the unit row cap, the report
    and its join, one-row cells, ranked and unranked quantile histograms, CTEs, no keys."""
    document = _document(max_rows_per_unit=7)
    document["tables"]["visits"]["protection"]["magnitudes"]["spend"] = {"epsilon": 1}
    path = tmp_path / "trees.duckdb"
    make_db(path, document)
    queries = [
        "SELECT clinic, COUNT(*), SUM(cost), AVG(cost), MEDIAN(cost), COUNT(DISTINCT pid) "
        "FROM visits WHERE cost > 1 GROUP BY clinic",
        "SELECT COUNT(*), SUM(cost), STDDEV(cost) FROM visits",
        "WITH v AS (SELECT * FROM visits WHERE cost < 90) SELECT clinic, VAR_SAMP(cost) FROM v "
        "GROUP BY clinic",
        "SELECT region, sex, COUNT(*), AVG(income), MEDIAN(income) FROM persons GROUP BY region, "
        "sex",
        "SELECT COUNT(*), SUM(income) FROM persons",
    ]
    with sqlsdc.connect(path, "admin") as con:
        for sql in queries:
            query = protect(sql, None, con._context)
            seen: set[int] = set()
            trees = [query.tree, *(t for s in query.dp_stages for t in s.trees.values())]
            assert query.dp_stages and len(trees) > 1
            assert sum(_misplaced(t, seen) for t in trees) == 0, sql


def test_a_person_s_identical_rows_keep_the_caps_rows_and_the_report_agrees(tmp_path):
    """Person 1 has 20 identical visits in each of clinics a, b and c (one record key, one
    cost: a clinic's rows hash alike) under ``max_rows_per_unit: 6`` beside ``max_rows: 3``.
    The unit row cap kept the 6 rows of the smallest hash, all in one clinic, and max_rows
    then counted 3 of them, the report weighing 3/60 of the person kept (red team s45j).
    Ranked with the rows the cell cap drops last and the cells in the group cap's order
    (``Hashed.capped_order``), the cap keeps 3 rows in each of two clinics, all 6 counted,
    and the report weighs them 6/60 kept and the other 54 dropped. The cells are the same on
    a copy whose rows are stored in another order. Fails on the old ranking (3 rows)."""
    base, less, shuffled = (tmp_path / f"{n}.duckdb" for n in ("base", "less", "shuffled"))
    make_db(base, _document(max_groups=4, max_rows=3, max_rows_per_unit=6))
    with open_database(base) as con:
        con.execute("DELETE FROM visits WHERE pid = 1")
        con.execute("INSERT INTO visits (pid, clinic, cost, __rkey) SELECT 1, c, 50.0, 4242 "
                    "FROM (SELECT UNNEST(['a', 'b', 'c']) AS c), range(20)")  # fmt: skip
    shutil.copy(base, less)
    shutil.copy(base, shuffled)
    with open_database(less) as con:
        con.execute("DELETE FROM visits WHERE pid = 1")
    with open_database(shuffled) as con:
        con.execute("CREATE TEMP TABLE v AS SELECT * FROM visits ORDER BY hash(rowid, 7)")
        con.execute("DELETE FROM visits")
        con.execute("INSERT INTO visits SELECT * FROM v")
    sql = "SELECT clinic, COUNT(*), SUM(cost) FROM visits GROUP BY clinic"
    with sqlsdc.connect(base, "admin") as guarded:
        (stage,) = guarded.explain(sql).dp_stages

    def cells(path):
        with open_database(path) as con:
            return con.execute(stage.sql).df().sort_values("__g0").set_index("__g0")

    on_base, on_less = cells(base), cells(less)
    count, total = (s.column for s in stage.statistics[:2])
    moved = on_base.sub(on_less, fill_value=0).loc[["a", "b", "c"]]
    assert sorted(moved[count]) == [0, 3, 3]
    assert (moved[total] == 50 * moved[count]).all()
    dropped, clamped, kept = stage.report
    one = moved[count] == 3
    g = REPORT_GRID
    assert moved[kept].tolist() == [g * 3 // 60 if k else 0 for k in one]
    assert moved[dropped].tolist() == [g * 17 // 60 if k else g * 20 // 60 for k in one]
    assert moved[clamped].tolist() == [0, 0, 0]
    assert on_base.equals(cells(shuffled)) and on_base.equals(cells(base))  # reproducible
