"""The frequency rule of a magnitude counts its contributors, the units of non-zero value
(:func:`sqlsdc.rewrite.cells.frequency_count`), under the threshold rule and rounding, on
hand-built tables at the boundary: k non-zero contributors are published, k − 1 padded with
any number of zeros are not, a cell of zeros only is suppressed (its sum and its mean), and
the counts of the same cells count every unit. A unit with several rows contributes when any
of its rows is non-zero: rows +5 and −5 make a contributor whose total is 0; the p%-rule reads
that total, so beside two others it adds nothing to T − x1 − x2 = 0 and the cell is dominated
under the default policy."""

from __future__ import annotations

import duckdb
import pytest

import sqlsdc

K = 3
# cell -> (unit, value) rows
ROWS = {
    "k": [(1, 100), (2, 200), (3, 300)],  # exactly k non-zero contributors
    "padded": [(4, 100), (5, 200)] + [(u, 0) for u in range(100, 150)],  # k - 1 and 50 zeros
    "zeros": [(u, 0) for u in range(200, 220)],  # zeros only
    "nulls": [(6, 100), (7, 200), (8, None), (9, None)],  # NULL is no contributor either
    "signed": [(10, 100), (11, 200), (12, 5), (12, -5)],  # unit 12: rows +5 and -5
    "twice": [(13, 100), (14, 200), (15, 0), (15, 0)],  # unit 15: two zero rows
}


def document() -> dict:
    def table(protection: dict) -> dict:
        columns = {
            "unit": {"role": "identifier"},
            "cell": {"role": "dimension"},
            "value": {"role": "measure"},
        }
        return {"privacy_unit": "unit", "columns": columns, "protection": protection}

    rounded = {"method": "round", "base": 10, "rounding": "conventional"}
    return {
        "tables": {
            # the frequency rule alone
            "exact": table(
                {"min_frequency": K, "magnitudes": {"method": "threshold", "dominance": []}}
            ),
            "guarded": table({"min_frequency": K, "magnitudes": {"method": "threshold"}}),
            "rounded": table({"min_frequency": K, "counts": rounded, "magnitudes": rounded}),
        },
        "users": {"admin": {"role": "admin"}, "ana": {"role": "analyst"}},
    }


@pytest.fixture(scope="module")
def ana(tmp_path_factory):
    path = tmp_path_factory.mktemp("nonzero") / "nonzero.duckdb"
    con = duckdb.connect(str(path))
    rows = [(unit, cell, value) for cell, pairs in ROWS.items() for unit, value in pairs]
    for name in ("exact", "guarded", "rounded"):
        con.execute(f"CREATE TABLE {name} (unit INTEGER, cell VARCHAR, value INTEGER)")
        con.executemany(f"INSERT INTO {name} VALUES (?, ?, ?)", rows)
    con.close()
    sqlsdc.init(path, document())
    with sqlsdc.connect(path, user="ana") as analyst:
        yield analyst


def by_cell(con, sql: str) -> dict:
    return {row[0]: row[1:] for row in con.execute(sql).fetchall()}


def test_threshold_publishes_k_contributors_and_not_k_minus_one_padded_with_zeros(ana):
    shown = by_cell(
        ana,
        "SELECT cell, SUM(value), AVG(value), COUNT(*), COUNT(value), COUNT(DISTINCT unit) "
        "FROM exact GROUP BY cell",
    )
    assert shown["k"] == (600, 200, 3, 3, 3)
    # k - 1 contributors: the 50 zeros lift no sum or mean over k; the counts count them
    assert shown["padded"] == (None, None, 52, 52, 52)
    assert shown["zeros"] == (None, None, 20, 20, 20)  # no contributor: fail closed
    assert shown["nulls"] == (None, None, 4, None, 4)  # COUNT(value): 2 values, under k
    # unit 12's rows +5 and -5 are non-zero: it contributes (total 0), so 3 contributors
    assert shown["signed"] == (300, 75, 4, 4, 3)
    # unit 15's two rows of 0: one unit, no contributor
    assert shown["twice"] == (None, None, 4, 4, 3)


def test_a_unit_of_total_zero_is_dominated_beside_two_others(ana):
    """Unit 12 (+5, −5) passes the frequency rule as a contributor; its contribution (its
    total in the cell) is 0, so the p%-rule (default) finds T − x1 − x2 = 0 and suppresses."""
    shown = by_cell(ana, "SELECT cell, SUM(value), AVG(value) FROM guarded GROUP BY cell")
    assert shown["k"] == (600, 200)
    for cell in ("padded", "zeros", "twice", "signed"):
        assert shown[cell] == (None, None), cell


def test_the_same_under_rounding(ana):
    shown = by_cell(ana, "SELECT cell, SUM(value), AVG(value) FROM rounded GROUP BY cell")
    assert shown["k"][0] is not None and shown["k"][0] % 10 == 0
    for cell in ("padded", "zeros", "twice", "signed"):
        assert shown[cell] == (None, None), cell


def test_a_padded_query_tells_no_more_than_the_cell_alone(ana):
    """``WHERE cell = 'padded' OR value = 0``: the same contributors as the cell alone (the
    zeros of every cell added), so the same verdict: suppressed under both methods."""
    for table in ("exact", "guarded", "rounded"):
        alone = ana.execute(f"SELECT SUM(value) FROM {table} WHERE cell = 'padded'").fetchone()
        padded = ana.execute(
            f"SELECT SUM(value) FROM {table} WHERE cell = 'padded' OR value = 0"
        ).fetchone()
        assert alone == padded == (None,), table
