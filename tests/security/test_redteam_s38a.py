"""Red team s38a: an analyst's guarded connection against the demo policy (cell key method)
and its variants, after session 37's changes.

What broke (fixed here):

- **Threshold magnitudes beside cell-key counts.** A policy that declares ``counts: {method:
  ckm, ...}`` alone (or ``magnitudes: {method: threshold}`` beside it) leaves SUM and AVG to the
  threshold rule, which publishes them exactly. Red team s36b and s37d refused such magnitudes
  beside DP and rounded counts, not beside the cell key method's: ``SUM(income) / AVG(income)``
  of R01-M007 x F was 116.0 where ``COUNT(income)`` showed 115, and with ``AND NOT age = 43``
  112.0 where it showed 113: the 4 persons aged 43 there, exactly, a group the count noise
  (D = 5) was to blur; ``SUM(age) WHERE age = c`` is c times the exact count. Such a SUM or AVG
  is refused at query time now (``planner.plan._COUNTS_REVEALED_BY``), counts are answered.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import sqlsdc
from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.errors import PolicyViolation
from sqlsdc.policy import load_policy


@pytest.fixture(scope="module")
def ckm_threshold_db(tmp_path_factory) -> Path:
    """The demo with cell-key counts and the default (threshold) magnitudes."""
    document = demo_policy().document_dict()
    document["protection"]["magnitudes"] = {"method": "threshold"}
    document["tables"]["enterprises"].pop("protection", None)
    path = tmp_path_factory.mktemp("s38a") / "ckm_threshold.duckdb"
    policy = load_policy(document, name="ckm-counts-threshold-magnitudes")
    build_demo_database(path, persons=20_000, seed=7, policy=policy)
    return path


@pytest.fixture(scope="module")
def ckm_threshold(ckm_threshold_db):
    con = sqlsdc.connect(ckm_threshold_db, user="analyst")
    yield con
    con.close()


CELL = "FROM persons WHERE municipality = 'R01-M007' AND sex = 'F'"


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT SUM(income) / AVG(income) {CELL} AND NOT age = 43",
        f"SELECT SUM(income) {CELL}",
        f"SELECT AVG(income) {CELL}",
        f"SELECT COUNT(*), AVG(income) {CELL}",
        "SELECT SUM(age) FROM persons WHERE age = 43 AND municipality = 'R01-M007'",
        "SELECT region, SUM(turnover) FROM enterprises GROUP BY region",
    ],
)
def test_threshold_magnitudes_beside_ckm_counts_are_refused(ckm_threshold, sql):
    with pytest.raises(PolicyViolation, match="use the cell key method"):
        ckm_threshold.execute(sql).fetchall()


def test_ckm_counts_beside_threshold_magnitudes_are_answered(ckm_threshold):
    (count,) = ckm_threshold.execute(f"SELECT COUNT(income) {CELL}").fetchall()
    assert count[0] > 0
