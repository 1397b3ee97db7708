"""A DP scalar subquery beside a cell-key-method aggregate (s49a's finding, s49j).

``SELECT region, COUNT(*), (SELECT COUNT(*) FROM benefits) FROM persons GROUP BY 1`` failed as
an internal error ("__a0 of protected cells is not a protected value"): the validator's proof
of the CKM frame walked into the subquery's own frame over the DP noisy cells and read its
``__cells.__a0`` (the noisy value) as the CKM frame's true count. Each frame is now proven on
its own columns: the statement is answered, the DP cells charged once and their noisy value
the one the DP aggregate asked alone has, the CKM cells those of the CKM query alone; one whose
rows no bound known before the charge covers (the CKM groups) is refused before the charge.
"""

from __future__ import annotations

import duckdb
import pytest

import sqlsdc
from sqlsdc.demo.build import build_demo_database
from sqlsdc.errors import AnswerTooLarge, InternalError

DP_COUNT = "SELECT COUNT(*) FROM benefits"
CKM_BY_REGION = "SELECT region, COUNT(*) FROM persons GROUP BY 1 ORDER BY 1"


@pytest.fixture(scope="module")
def ckm_template(tmp_path_factory):
    """A small CKM demo that no other test asks: the session's shared ``ckm_db`` holds other
    modules' charges and cached DP cells, which made the charges counted here theirs too."""
    path = tmp_path_factory.mktemp("dp-beside-ckm") / "demo.duckdb"
    build_demo_database(path, persons=4000, seed=49)
    return path


@pytest.fixture
def ckm_copy(ckm_template, tmp_path, copy_database):
    return copy_database(ckm_template, tmp_path)


def _spent(path) -> list[tuple]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(
            "SELECT epsilon, rho, cells FROM sqlsdc.budget_spend WHERE user_name = 'analyst' "
            "ORDER BY seq"
        ).fetchall()
    finally:
        con.close()


def _ask(path, sql: str) -> list[tuple]:
    con = sqlsdc.connect(path, user="analyst")
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_a_dp_scalar_subquery_beside_a_ckm_aggregate_is_answered_and_charged_once(ckm_copy):
    """Fails on int49: InternalError for each statement, before any charge."""
    rows = _ask(ckm_copy, f"SELECT COUNT(*), ({DP_COUNT}) AS b FROM persons")
    charged = _spent(ckm_copy)
    assert len(charged) == 1  # the DP cells, charged once
    (dp,) = _ask(ckm_copy, DP_COUNT)[0]
    assert _spent(ckm_copy) == charged  # the same cells again: not charged again
    (ckm,) = _ask(ckm_copy, "SELECT COUNT(*) FROM persons")[0]
    assert rows == [(ckm, dp)]
    by_region = _ask(ckm_copy, CKM_BY_REGION)
    for sql in (
        f"SELECT region, COUNT(*), ({DP_COUNT}) FROM persons GROUP BY 1 ORDER BY 1 LIMIT 100",
        f"SELECT region, COUNT(*), ({DP_COUNT}) AS b FROM persons GROUP BY region "
        "ORDER BY region LIMIT 100",
    ):
        assert _ask(ckm_copy, sql) == [(*row, dp) for row in by_region]
    assert _spent(ckm_copy) == charged


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT region, COUNT(*), ({DP_COUNT}) FROM persons GROUP BY 1",
        f"SELECT region, COUNT(*), ({DP_COUNT}) AS b FROM persons GROUP BY region",
        f"SELECT region, COUNT(*) FROM persons GROUP BY 1 HAVING COUNT(*) > ({DP_COUNT})",
    ],
)
def test_a_dp_scalar_beside_unbounded_ckm_groups_is_refused_before_the_charge(ckm_copy, sql):
    """Fails on int49: an InternalError ("__a0 of protected cells is not a protected value").
    The CKM groups have no bound before the charge, so the answer could pass the cap of rows
    after the DP cells had paid: refused first, saying what to write instead."""
    with pytest.raises(AnswerTooLarge, match="statement of its own") as refused:
        _ask(ckm_copy, sql)
    assert not isinstance(refused.value, InternalError)
    assert "add a LIMIT" in str(refused.value)
    assert _spent(ckm_copy) == []
