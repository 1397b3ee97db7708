"""GROUPING(key, ...) of ROLLUP/CUBE/GROUPING SETS: a function of the grouping level only.

It is answered under the threshold rule, the cell key method and suppression, equals DuckDB's own
GROUPING on the same groups, and takes only whole group keys (anything else is refused before the
engine could fail on it). Under differential privacy it is refused with ROLLUP itself
(tests/test_dp_query.py).
"""

from __future__ import annotations

import shutil

import pytest

import sqlsdc
from sqlsdc import PolicyViolation


@pytest.fixture
def analyst(module_analyst):
    """One connection for the module (conftest's ``module_analyst``): the tests that take
    ``analyst`` only read and are refused."""
    return module_analyst


ROLLUP = (
    "SELECT region, sex, GROUPING(region) AS g1, GROUPING(region, sex) AS g2, COUNT(*) AS n "
    "FROM persons GROUP BY ROLLUP (region, sex)"
)


def _levels(rows) -> set[tuple]:
    """(keys, GROUPING values) of each row: what GROUPING must agree on."""
    return {tuple(row[:4]) for row in rows}


def test_grouping_under_the_threshold_rule_equals_duckdbs(analyst, raw):
    guarded = analyst.execute(ROLLUP).fetchall()
    assert _levels(guarded) == _levels(raw.execute(ROLLUP).fetchall())
    assert {(g1, g2) for _r, _s, g1, g2, _n in guarded} == {(0, 0), (0, 1), (1, 3)}


def test_grouping_under_the_cell_key_method(ckm, raw_ckm):
    sql = ROLLUP + " HAVING GROUPING(region, sex) > 0 ORDER BY g2 DESC, region"
    guarded = ckm.execute(sql).fetchall()
    assert guarded[0][:4] == (None, None, 1, 3)  # the grand total comes first
    assert _levels(guarded) == _levels(raw_ckm.execute(sql).fetchall())


def test_grouping_under_suppression(suppress_template, tmp_path):
    db = tmp_path / "suppress.duckdb"
    shutil.copy(suppress_template, db)
    sql = (
        "SELECT region, GROUPING(region) AS g, COUNT(*) AS n FROM enterprises "
        "WHERE nace = 'C' GROUP BY ROLLUP (region) ORDER BY g, region"
    )
    with sqlsdc.connect(db, user="analyst") as con:
        rows = con.execute(sql).fetchall()
    assert [g for _r, g, _n in rows] == [0] * (len(rows) - 1) + [1]
    assert rows[-1][0] is None


@pytest.mark.parametrize(
    "argument", ["sex", "income", "age", "age // 10", "region || 'x'"], ids=str
)
def test_grouping_takes_whole_group_keys_only(analyst, argument):
    sql = (
        f"SELECT age // 10 AS d, region, GROUPING({argument}) FROM persons "
        "GROUP BY ROLLUP (age // 10, region)"
    )
    with pytest.raises(PolicyViolation, match="GROUPING takes columns the query groups by"):
        analyst.execute(sql)


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT region, COUNT(*) FROM persons GROUP BY ROLLUP (1)", "not positions"),
        ("SELECT region, sex, COUNT(*) FROM persons GROUP BY CUBE (region, 2)", "not positions"),
        (
            "SELECT region, COUNT(*) FROM persons GROUP BY GROUPING SETS ((region, 'x'), ())",
            "not positions",
        ),  # fmt: skip
        (
            "SELECT region, SUM(CASE WHEN GROUPING(region) = 0 THEN income END) FROM persons "
            "GROUP BY ROLLUP (region)",
            "inside an aggregate",
        ),  # fmt: skip
        (
            "SELECT region, COUNT(*) FILTER (WHERE GROUPING(region) = 0) FROM persons "
            "GROUP BY ROLLUP (region)",
            "inside an aggregate|FILTER",
        ),  # fmt: skip
    ],
)
def test_misplaced_grouping_gets_a_message_that_says_what_to_write(analyst, sql, message):
    with pytest.raises(PolicyViolation, match=message):
        analyst.execute(sql)


def test_common_bi_total_label_and_expression_keys_are_answered(analyst, raw):
    labelled = ("SELECT CASE WHEN GROUPING(region) = 1 THEN 'Total' ELSE region END AS r, "
                "COUNT(*) AS n FROM persons GROUP BY ROLLUP (region) ORDER BY r")  # fmt: skip
    assert [r for r, _n in analyst.execute(labelled).fetchall()] == [
        r for r, _n in raw.execute(labelled).fetchall()
    ]
    banded = "SELECT FLOOR(age / 10) AS d, COUNT(*) FROM persons GROUP BY ROLLUP (FLOOR(age / 10))"
    assert {d for d, _n in analyst.execute(banded).fetchall()} <= {
        d for d, _n in raw.execute(banded).fetchall()
    }
