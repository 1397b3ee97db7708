"""The dominance rules of threshold and round magnitudes (:mod:`sqlsdc.rewrite.dominance`),
on hand-built tables whose cells sit on either side of each rule's boundary; ordinary cells of
the demo are unaffected; the policy's ``dominance`` is validated."""

from __future__ import annotations

import duckdb
import pytest

import sqlsdc
from sqlsdc.errors import PolicyError
from sqlsdc.policy import AggregateKind, load_policy

# cell -> the contributions of its units (one row each): p% = 10 with x1 = 1000, x2 = 500
CELLS = {
    "at": [1000, 500, 50, 30, 20],  # T - x1 - x2 = 100 = 10 % of x1: not sensitive (strict)
    "below": [1000, 500, 50, 30, 19],  # 99 < 100: sensitive
    "signed": [-1000, 500, 50, 30, 20],  # absolute values: as "at", published as -400
    "zeros": [1000, 0, 0, 0, 0, 0],  # one value padded with zeros
    "spread": [100, 100, 100, 100, 100],  # no one dominates
}
# a unit's rows are summed first: firm 1's 600 + 400 is one contribution of 1000
PAYMENTS = {
    "at": [(1, 600), (1, 400), (2, 500), (3, 50), (4, 30), (5, 20)],
    "below": [(1, 600), (1, 400), (2, 500), (3, 50), (4, 30), (5, 19)],
}


def document(dominance=None) -> dict:
    def table(columns: dict, protection: dict) -> dict:
        return {"privacy_unit": "unit", "columns": columns, "protection": protection}

    columns = {
        "unit": {"role": "identifier"},
        "cell": {"role": "dimension"},
        "value": {"role": "measure"},
    }
    magnitudes = {"method": "threshold"}
    if dominance is not None:
        magnitudes["dominance"] = dominance
    rounded = {"method": "round", "base": 10, "rounding": "conventional"}
    return {
        "tables": {
            "firms": table(columns, {"min_frequency": 3, "magnitudes": magnitudes}),
            "payments": table(columns, {"min_frequency": 3, "magnitudes": magnitudes}),
            "rounded": table(
                columns, {"min_frequency": 3, "counts": rounded, "magnitudes": rounded}
            ),  # fmt: skip
            "rounded_payments": table(
                columns, {"min_frequency": 3, "counts": rounded, "magnitudes": rounded}
            ),  # fmt: skip
            "dominated": table(
                columns,
                {
                    "min_frequency": 3,
                    "magnitudes": {"method": "threshold", "dominance": ["nk:2,85"]},
                },
            ),  # fmt: skip
            "open": table(
                columns,
                {"min_frequency": 3, "magnitudes": {"method": "threshold", "dominance": []}},
            ),  # fmt: skip
        },
        "users": {"admin": {"role": "admin"}, "ana": {"role": "analyst"}},
    }


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("dominance") / "dominance.duckdb"
    con = duckdb.connect(str(path))
    rows = [(cell, v) for cell, values in CELLS.items() for v in values]
    for name in ("firms", "rounded", "dominated", "open"):
        con.execute(f"CREATE TABLE {name} (unit INTEGER PRIMARY KEY, cell VARCHAR, value DOUBLE)")
        con.executemany(
            f"INSERT INTO {name} VALUES (?, ?, ?)", [(u, c, v) for u, (c, v) in enumerate(rows)]
        )
    for name in ("payments", "rounded_payments"):
        con.execute(f"CREATE TABLE {name} (unit INTEGER, cell VARCHAR, value DOUBLE)")
        con.executemany(
            f"INSERT INTO {name} VALUES (?, ?, ?)",
            [(unit, cell, v) for cell, rows in PAYMENTS.items() for unit, v in rows],
        )
    con.close()
    sqlsdc.init(path, document())
    return path


@pytest.fixture(scope="module")
def ana(db):
    con = sqlsdc.connect(db, user="ana")
    yield con
    con.close()


def cells(con, sql: str) -> dict:
    return {cell: value for cell, value in con.execute(sql).fetchall()}


def test_the_p_percent_rule_fires_exactly_below_its_boundary(ana):
    sums = cells(ana, "SELECT cell, SUM(value) FROM firms GROUP BY cell")
    assert sums == {"at": 1600, "below": None, "signed": -400, "zeros": None, "spread": 500}
    means = cells(ana, "SELECT cell, AVG(value) FROM firms GROUP BY cell")
    assert means == {"at": 320, "below": None, "signed": -80, "zeros": None, "spread": 100}
    counts = cells(ana, "SELECT cell, COUNT(*) FROM firms GROUP BY cell")  # counts: no rule
    assert counts == {cell: len(values) for cell, values in CELLS.items()}


def test_the_status_says_suppressed(ana):
    cur = ana.execute("SELECT cell, SUM(value) AS total FROM firms GROUP BY cell ORDER BY cell")
    keys = [row[0] for row in cur.fetchall()]
    status = dict(zip(keys, cur.cell_status()["total"], strict=True))
    assert status["below"] == status["zeros"] == "suppressed"
    assert status["at"] == status["spread"] == "published"


def test_explain_names_the_rules(ana):
    plan = ana.explain("SELECT cell, COUNT(*) AS n, SUM(value) AS total FROM firms GROUP BY cell")
    assert "n: threshold (min_frequency 3)\n" in str(plan)
    assert "total: threshold (min_frequency 3; dominance p:10)" in str(plan)
    assert plan.columns[2].to_dict()["dominance"] == ["p:10"]
    assert "dominance" not in plan.columns[1].to_dict()


def test_a_unit_s_rows_are_one_contribution(ana, db):
    """Row by row, firm 1's 600 and 400 would leave T − x1 − x2 = 499 of x1 = 600; as one
    contribution of 1000 the cell "below" is dominated. Its margin (ROLLUP) too is judged on
    the units' totals over both cells."""
    assert cells(ana, "SELECT cell, SUM(value) FROM payments GROUP BY cell") == {
        "at": 1600,
        "below": None,
    }
    rolled = ana.execute(
        "SELECT cell, SUM(value) FROM payments GROUP BY ROLLUP (cell) ORDER BY cell NULLS LAST"
    ).fetchall()
    # the total: firm 1's 2000, firm 2's 1000, then 199: 199 < 10 % of 2000, dominated
    assert rolled == [("at", 1600), ("below", None), (None, None)]


def test_a_repeated_grouping_set_reads_each_unit_once(ana):
    """``GROUPING SETS ((cell), (cell), (cell))`` gives a row per copy, and so did the units'
    totals: T was three times 1599 and x2 firm 1's own 1000 again, and "below" was published
    (red team s40b). Each unit's total is read once per cell."""
    for group in ("GROUPING SETS ((cell), (cell), (cell))", "cell, ROLLUP (cell)"):
        rows = ana.execute(f"SELECT cell, SUM(value) FROM payments GROUP BY {group}").fetchall()
        assert sorted(set(rows)) == [("at", 1600), ("below", None)], group
        sql = f"SELECT cell, SUM(value) FROM rounded_payments GROUP BY {group}"
        rounded = dict(ana.execute(sql).fetchall())
        assert rounded["below"] is None and rounded["at"] is not None, group


def test_rounded_sums_follow_the_same_rule(ana):
    sums = cells(ana, "SELECT cell, SUM(value) FROM rounded GROUP BY cell")
    assert sums["below"] is None and sums["zeros"] is None
    # published as the rounded mean times the rounded count (5 units: 10, conventional)
    assert sums["at"] == 3200 and sums["spread"] == 1000


def test_the_n_k_rule_and_no_rule(ana):
    # nk:2,85: x1 + x2 > 85 % of T; "at": 1500 / 1600 = 93.75 %, "spread": 40 %
    dominated = cells(ana, "SELECT cell, SUM(value) FROM dominated GROUP BY cell")
    assert dominated == {"at": None, "below": None, "signed": None, "zeros": None, "spread": 500}
    # no dominance rule: "below" is published; "zeros" has one contributor, under the
    # frequency rule's 3 (its zeros are no contributors, tests/test_nonzero_contributors.py)
    shown = cells(ana, "SELECT cell, SUM(value) FROM open GROUP BY cell")
    assert shown["below"] == 1599 and shown["zeros"] is None


def test_ordinary_cells_of_the_demo_are_unaffected(analyst, raw):
    """Sums of incomes by region and sex are far from dominated: exact, as before."""
    sql = "SELECT region, sex, SUM(income) FROM persons GROUP BY region, sex"
    shown = {(r, s): v for r, s, v in analyst.execute(sql).fetchall()}
    exact = {(r, s): v for r, s, v in raw.execute(sql).fetchall()}
    assert shown == pytest.approx(exact) and None not in shown.values()


@pytest.mark.parametrize(
    "kind, rule, message",
    [
        ("magnitudes", {"method": "threshold", "dominance": ["freq:3"]}, "is not a rule"),
        ("magnitudes", {"method": "threshold", "dominance": ["nk:7,90"]}, "at most 6"),
        ("magnitudes", {"method": "round", "base": 5, "dominance": ["p:0"]}, "above 0"),
        ("counts", {"method": "threshold", "dominance": ["p:10"]}, "only magnitudes"),
        (
            "magnitudes",
            {"method": "ckm", "ptable": {"D": 2, "V": 1}, "dominance": ["p:10"]},
            "only magnitudes under method threshold or round",
        ),  # fmt: skip
        ("magnitudes", {"method": "threshold", "dominance": ["p10"]}, "is not a rule"),
    ],
)
def test_policy_errors(kind, rule, message):
    document_ = document()
    document_["tables"]["firms"]["protection"] = {kind: rule}
    with pytest.raises(PolicyError, match=message):
        load_policy(document_)


def test_the_default_is_the_p_percent_rule():
    policy = load_policy(document())
    assert policy.table("firms").rule(AggregateKind.MAGNITUDES).dominance == ("p:10",)
    assert policy.table("open").rule(AggregateKind.MAGNITUDES).dominance == ()
