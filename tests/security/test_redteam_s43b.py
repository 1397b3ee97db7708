"""Red team s43b: differential privacy, budgets and noisy verification (session 43).

Attacked as an analyst with guarded connections, on the demo (20,000 persons) and on s35's
verification database (a BIGINT income, a text code, a released synthetic output).

Every attack tried, one line each (W: worked, fixed here; O: worked, left open; H: held):

- W  noisy verification of an OLS whose regressors are collinear on the synthetic data
     (``OLS(income, age, age * 2)``): refused after its charge (3 cells x epsilon on the
     demo: 0.75 at epsilon 1/4, for no answer) and after the confidential records were read;
     neither cached nor counted against the output's ``max_queries``, so it could be sent
     without limit (s42b's open item). Fixed: the synthetic intervals are computed with the
     plan, before the charge; the refusal costs nothing and reads no confidential record.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_redteam_s35 import verify_db  # noqa: F401 - s35's fixture

import sqlsdc
from sqlsdc.errors import PolicyViolation

COLLINEAR = [
    "SELECT OLS(income, age, age * 2) FROM syn",
    "SELECT region, OLS(income, age, age + 1, 2 * age - 1) FROM syn GROUP BY region",
]


@pytest.mark.parametrize("sql", COLLINEAR)
def test_a_request_collinear_on_the_synthetic_data_is_refused_before_the_charge(
    verify_db: Path,  # noqa: F811
    sql: str,
    monkeypatch,
):
    """Before (s42b's open item): charged epsilon per cell, the confidential records read,
    then refused, neither cached nor counted against the per-output limit. Now refused from
    the synthetic (public) records alone: nothing charged, only the synthetic side read."""
    from sqlsdc.synth import verify as verify_module

    texts, real = [], verify_module.engine.run

    def run(con, text, *args, **kwargs):
        texts.append(text)
        return real(con, text, *args, **kwargs)

    monkeypatch.setattr(verify_module.engine, "run", run)
    with sqlsdc.connect(verify_db, "ana") as con:
        spent = con.remaining_budget()[0].spent
        with pytest.raises(PolicyViolation, match="collinear on the synthetic data"):
            con.verify(sql, mode="noisy", epsilon="1/1000")
        assert con.remaining_budget()[0].spent == spent
    assert len(texts) == 1, "only the synthetic records are read"
    assert "protected" in texts[0].lower() and "persons" not in texts[0].lower()


def test_a_request_that_is_not_collinear_is_still_charged_and_answered(verify_db: Path):  # noqa: F811
    with sqlsdc.connect(verify_db, "ana") as con:
        before = con.remaining_budget()[0].spent.epsilon
        answer = con.verify(
            "SELECT region, OLS(income, age) FROM syn GROUP BY region", mode="noisy",
            epsilon="1/1000",
        )  # fmt: skip
        assert [c["status"] for c in answer.cells] == ["released"] * 4
        assert all(0 <= c["fm_noisy"] <= 1 for c in answer.cells)
        assert con.remaining_budget()[0].spent.epsilon - before == pytest.approx(4 / 1000)
