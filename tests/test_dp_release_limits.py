"""What a DP query pays for, at the limits of its release (red team s35's open faults).

A refusal decidable from the query, the policy and the public domains comes before the
charge: the analyst pays nothing for a query that will be refused. A released value never
fails to fit its result type after the charge. A bounding report whose shares are public
constants is neither drawn nor paid for.
"""

from __future__ import annotations

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
