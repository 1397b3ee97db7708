"""Attacks on the DP bounding report (the dropped and clamped shares of every DP cell).

The shares are statistics of confidential rows: whether one person's value lies beyond a bound
is exactly what an attacker wants. They must carry noise at the scale their cost pays for (a
test that fails at 1.5x too little or too much noise), never be exact for an analyst, come back
identical when a cell is asked again or rephrased (no averaging), and never reuse one noise draw
for two different exact values (their identity names the measures whose clamping they count).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from test_dp_query import dp_document, make_db, pin_noise  # noqa: E402

import sqlsdc  # noqa: E402
from sqlsdc.engines.duckdb import open_database  # noqa: E402
from sqlsdc.mechanisms.samplers import discrete_laplace_variance  # noqa: E402

FIXED_SECRET = b"bounding report attack tests, fixed secret"
QUERY = "SELECT region, SUM(income) FROM persons WHERE age >= {k} GROUP BY region"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    document = dp_document()
    persons = document["tables"]["persons"]
    persons["columns"]["income"]["bounds"] = [0, 30000]  # about 40% of incomes are clamped
    persons["dp"]["bounding_report"] = {"epsilon": "1/2"}
    path = tmp_path_factory.mktemp("report_attacks") / "db.duckdb"
    make_db(path, document)
    pin_noise(path, FIXED_SECRET)
    return path


def _shares(path, user: str, sql: str):
    with sqlsdc.connect(path, user) as con:
        if user == "admin":
            con.set_dp_noise(False)
        cur = con.execute(sql)
        rows = cur.fetchall()
        accuracy = cur.cell_accuracy()
    return rows, accuracy[accuracy["column"] == "sum(income)"].reset_index(drop=True)


def _residuals(db, ks):
    """(noisy - exact) clamped share of every non-empty cell, in units of its expected sd."""
    sd_part = math.sqrt(discrete_laplace_variance(2000)) / 1000  # persons' worth, t = 1/epsilon
    out = []
    for k in ks:
        rows, exact = _shares(db, "admin", QUERY.format(k=k))
        _rows, noisy = _shares(db, "ana", QUERY.format(k=k))
        totals = _count_by_region(db, k)
        for i, (region, _v) in enumerate(rows):
            n = totals.get(region, 0)
            if n < 50:
                continue
            s = exact.loc[i, "clamped"]
            # share = C/(C + K) (one row per person: D = 0, not released): first-order noise
            # ((1 - s) Z_C - s Z_K) / n
            expected_sd = sd_part * math.sqrt((1 - s) ** 2 + s * s) / n
            out.append((noisy.loc[i, "clamped"] - s) / expected_sd)
    return np.array(out)


def _count_by_region(db, k) -> dict:
    con = open_database(db)
    try:
        return dict(con.execute(
            "SELECT region, COUNT(*) FROM persons WHERE age >= ? GROUP BY region", [k]
        ).fetchall())  # fmt: skip
    finally:
        con.close()


@pytest.mark.slow
def test_the_clamped_share_carries_noise_at_the_scale_it_pays_for(db):
    """Fresh cells (another WHERE each time): the residuals of the released clamped share
    against the exact one have the predicted spread; 1.5x less or more noise would fail."""
    z = _residuals(db, range(0, 60, 2))
    assert len(z) >= 80
    spread = float(np.sqrt(np.mean(z**2)))
    assert 1 / 1.35 < spread < 1.35, spread
    assert abs(float(np.mean(z))) < 0.35  # centred: the noise adds no bias
    assert np.count_nonzero(z) >= len(z) - 2  # never (or hardly ever by chance) exact


def test_asking_again_or_rephrased_returns_the_same_shares(db):
    sql = "SELECT region, SUM(income) FROM persons WHERE age >= 30 AND sex = 'f' GROUP BY region"
    rephrased = (
        "SELECT SUM(p.income) AS total, p.region AS r FROM persons AS p "
        "WHERE p.sex = 'f' AND p.age >= 30 GROUP BY p.region"
    )
    rows, first = _shares(db, "ana", sql)
    _rows, again = _shares(db, "ana", sql)
    _rows, other_user = _shares(db, "bob", sql)
    with sqlsdc.connect(db, "ana") as con:
        spent = con.remaining_budget()[0].spent
        cur = con.execute(rephrased)
        regions = [row[1] for row in cur.fetchall()]
        accuracy = cur.cell_accuracy()
        assert con.remaining_budget()[0].spent == spent  # nothing new: nothing charged
    # the rephrased rows come in the order of their own outputs (total first): by region
    shares = accuracy.sort_values("row")[["dropped", "clamped"]].to_numpy()
    by_region = shares[[regions.index(row[0]) for row in rows]]
    for frame in (again, other_user):
        np.testing.assert_array_equal(frame[["dropped", "clamped"]].to_numpy(),
                                      first[["dropped", "clamped"]].to_numpy())  # fmt: skip
    np.testing.assert_array_equal(by_region, first[["dropped", "clamped"]].to_numpy())


def _report_measures(db, sql) -> set[str]:
    with sqlsdc.connect(db, "ana") as con:
        stage = con.explain(sql).dp_stages[0]
    return {s.measure for s in stage.statistics if s.column in (stage.report or ())}


def test_one_noise_draw_never_serves_two_exact_values(db):
    """The report of SUM(income) counts clamping and that of AVG(income) (centred bounds)
    counts it otherwise: their exact values differ, so their identities must (else the same
    noise on two values reveals their difference, the clamped count exactly). COUNT(*) of a
    table with one row per person clamps and drops nothing: its shares are 0, no report is
    drawn (red team s35). Aliases and order do not change what is counted."""
    count = _report_measures(db, "SELECT region, COUNT(*) FROM persons GROUP BY region")
    total = _report_measures(db, "SELECT region, SUM(income) FROM persons GROUP BY region")
    mean = _report_measures(db, "SELECT region, AVG(income) FROM persons GROUP BY region")
    both = _report_measures(db, "SELECT region, SUM(income), COUNT(*) FROM persons GROUP BY region")
    alias = _report_measures(
        db, "SELECT SUM(p.income) AS s, p.region FROM persons p GROUP BY p.region"
    )
    assert count == set() and total and total.isdisjoint(mean)
    assert both == total == alias
