"""What a DP query pays for, at the limits of its release (red team s35's open faults).

A refusal decidable from the query, the policy and the public domains comes before the
charge: the analyst pays nothing for a query that will be refused. A released value never
fails to fit its result type after the charge. A bounding report whose shares are public
constants is neither drawn nor paid for.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from test_dp_query import dp_document, make_db, pin_noise, spend_rows

import sqlsdc
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import PolicyViolation
from sqlsdc.mechanisms.accountant import Bounding, PrivacyCost, Statistic, calibrate
from sqlsdc.mechanisms.dp_cells import CellMechanism, CellSpace, noisy_quantiles


def _ledger(path) -> tuple[list, list]:
    """The spend rows and the audit decisions of the database, in order."""
    con = open_database(path)
    try:
        audit = con.execute("SELECT decision FROM sqlsdc.audit ORDER BY query_id").fetchall()
    finally:
        con.close()
    return spend_rows(path), [d for (d,) in audit]


# --- refusals come before the charge ---------------------------------------------------------


@pytest.fixture(scope="module")
def dp_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("limits") / "dp.duckdb"
    make_db(path, dp_document())
    pin_noise(path)
    return path


def test_a_quantile_too_large_to_compute_is_refused_before_it_is_charged(tmp_path):
    """Income on a grid of 1/100 has 10^7 candidate medians; 8 public cells of region x sex
    make 8 x 10^7 scores, over the limit: refused, and the spend and the ledger unchanged."""
    document = dp_document()
    document["tables"]["persons"]["dp"]["granularity"] = "1/100"
    path = tmp_path / "fine.duckdb"
    make_db(path, document)
    with sqlsdc.connect(path, "ana") as con:
        con.execute("SELECT region, COUNT(*) FROM persons GROUP BY region")  # spends 1/2
        before, spent = _ledger(path), [b.spent for b in con.remaining_budget()]
        with pytest.raises(PolicyViolation, match="too large to compute"):
            con.execute("SELECT region, sex, MEDIAN(income) FROM persons GROUP BY region, sex")
        after = [b.spent for b in con.remaining_budget()]
    spends, decisions = _ledger(path)
    assert after == spent and len(spends) == 1 and spends == before[0]
    assert decisions == [*before[1], "refused"]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT CAST(LENGTH(clinic) AS DOUBLE) AS k, COUNT(*) FROM visits GROUP BY k",
        "SELECT region, COUNT(*) AS n FROM persons GROUP BY region HAVING COUNT(*) BETWEEN '3' "
        "AND 5000",
    ],
    ids=["private-key-type", "answer-text"],
)
def test_refusals_decided_by_the_query_come_before_the_charge(dp_db, sql):
    """Private groups by a DOUBLE key (the type of the query, not of the data) and an answer
    whose constants DuckDB cannot bind: both used to be refused after the charge."""
    before = _ledger(dp_db)
    with sqlsdc.connect(dp_db, "ana") as con:
        spent = [b.spent for b in con.remaining_budget()]
        with pytest.raises(PolicyViolation, match="one group each|refuses the text"):
            con.execute(sql)
        assert [b.spent for b in con.remaining_budget()] == spent
    spends, decisions = _ledger(dp_db)
    assert spends == before[0] and decisions == [*before[1], "refused"]


def test_quantiles_of_many_cells_are_scored_in_blocks_with_the_same_values():
    """Private groups take their cells from the data, so their quantiles are never refused once
    paid: the scores are computed a block of cells at a time, with the values of one block."""
    calibration = calibrate(Statistic.QUANTILE, Bounding(lower=0, upper=99),
                            PrivacyCost(epsilon=1))  # fmt: skip
    rng = np.random.default_rng(3)
    cells = np.repeat(np.arange(40), 25)
    histogram = pd.DataFrame({"cell": cells, "bin": rng.integers(0, 100, cells.size),
                              "count": rng.integers(0, 5, cells.size)})  # fmt: skip
    histogram = histogram.sample(frac=1, random_state=1)  # rows of a cell apart
    space, mechanism = CellSpace.of("t", ["cell"]), CellMechanism("x", calibration)

    def medians(limit):
        return noisy_quantiles(histogram, space, mechanism, secret=b"s35 blocks" * 4,
                               policy_version=1, column="q", max_scores=limit)  # fmt: skip

    whole, blocks = medians(None), medians(3 * 100)  # three cells of 100 candidates a block
    assert list(whole.frame["cell"]) == list(blocks.frame["cell"])
    assert whole.values["q"] == blocks.values["q"]


# --- released integers hold every value the noise can take ----------------------------------


@pytest.fixture(scope="module")
def rich_db(tmp_path_factory):
    """12,000 persons of income 10^15 (bounds [0, 10^15]): the exact total, 1.2 x 10^19, and
    the noisy sums at epsilon 10^-5 (sd 1.4 x 10^20) pass BIGINT's 9.2 x 10^18."""
    document = dp_document()
    persons = document["tables"]["persons"]
    persons["columns"]["income"]["bounds"] = [0, 10**15]
    persons["protection"]["magnitudes"]["spend"] = {"epsilon": "1/100000"}
    path = tmp_path_factory.mktemp("rich") / "rich.duckdb"
    make_db(path, document)
    con = open_database(path)
    try:
        con.execute("INSERT INTO persons BY NAME SELECT p.* REPLACE (p.pid + 3000 * t.k AS pid) "
                    "FROM persons AS p, range(1, 4) AS t(k)")  # fmt: skip
        con.execute("UPDATE persons SET income = 1e15")
    finally:
        con.close()
    pin_noise(path)
    return path


def test_sums_beyond_bigint_are_released_as_hugeint(rich_db):
    sql = "SELECT region, SUM(income) AS s FROM persons GROUP BY region"
    with sqlsdc.connect(rich_db, "admin") as con:
        con.set_dp_noise(False)
        (total,) = con.execute("SELECT SUM(income) FROM persons").fetchone()
    with sqlsdc.connect(rich_db, "ana") as con:
        cursor = con.execute(sql)
        sums = dict(cursor.fetchall())
        kinds = [d[1] for d in cursor.description]
        frame = con.execute(sql).df()  # the same cells again, from the cache
    assert total == 12_000 * 10**15 and isinstance(total, int)  # exact, beyond 2^63
    assert kinds == ["VARCHAR", "HUGEINT"]  # as DuckDB's SUM of integers
    assert all(isinstance(v, int) for v in sums.values())
    assert max(abs(v) for v in sums.values()) > 2**63  # the noise passed BIGINT too
    assert frame["s"].tolist() == [float(sums[r]) for r in frame["region"]]  # df(): float64


def test_a_count_or_sum_whose_noise_could_pass_its_type_is_refused_before_the_charge(tmp_path):
    """10^4 groups of 10^6 rows per person and bounds of 10^15 at epsilon 10^-6: the COUNT's
    sd, 1.4 x 10^16, and the SUM's, 1.4 x 10^31, are within 10^8 sd of BIGINT's and HUGEINT's
    ranges."""
    document = dp_document()
    visits = document["tables"]["visits"]
    visits["columns"]["cost"]["bounds"] = [0, 10**15]
    visits["dp"].update(max_groups=10**4, max_rows=10**6)
    visits["protection"] = {kind: {"method": "dp", "spend": {"epsilon": "1/1000000"}}
                            for kind in ("counts", "magnitudes")}  # fmt: skip
    path = tmp_path / "wild.duckdb"
    make_db(path, document)
    with sqlsdc.connect(path, "ana") as con:
        for sql in ("SELECT COUNT(*) FROM visits", "SELECT SUM(cost) FROM visits"):
            with pytest.raises(PolicyViolation, match="could pass the range"):
                con.execute(sql)
        con.execute("SELECT COUNT(*) FROM persons")  # other tables unaffected
    spends, decisions = _ledger(path)
    assert len(spends) == 1 and decisions == ["refused", "refused", "accepted"]


# --- a report of public constants is neither drawn nor paid for ------------------------------


def test_counts_of_a_one_row_table_pay_no_report_and_state_zero_shares_exactly(tmp_path):
    """``persons`` has one row per person and a bounding report: a count can drop nothing (one
    row each) and clamp nothing (no measure), so its shares are 0 whatever the data. The query
    pays the count's epsilon alone; a sum still pays for its report (it clamps)."""
    document = dp_document()
    document["tables"]["persons"]["dp"]["bounding_report"] = {"epsilon": "1/2"}
    path = tmp_path / "report.duckdb"
    make_db(path, document)
    counts = "SELECT region, COUNT(*) AS n, COUNT(DISTINCT pid) AS u FROM persons GROUP BY region"
    with sqlsdc.connect(path, "ana") as con:
        (stage,) = con.explain(counts).dp_stages
        text = str(con.explain(counts))
        accuracy = con.execute(counts).cell_accuracy()
        con.execute("SELECT region, SUM(income) FROM persons GROUP BY region")
    assert stage.report is None and stage.shares_zero
    assert "nothing dropped nor clamped" in text
    assert len(accuracy) == 8  # every cell, the empty domain cell W too
    assert (accuracy["dropped"] == 0).all() and (accuracy["clamped"] == 0).all()
    count_epsilon = Fraction(1, 2)  # counts: {epsilon: 1/2}; COUNT and COUNT(DISTINCT) alike
    spends = [Fraction(epsilon) for _user, epsilon, _rho, _cells in spend_rows(path)]
    assert spends == [2 * count_epsilon, 1 + Fraction(1, 2)]  # the sum: 1, its report: 1/2
