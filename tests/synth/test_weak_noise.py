"""A DP synthesis of a table under live suppression, at an ε that leaves its counts exact.

Before: stored at whatever ε the admin granted (persons under suppression have no budget),
with nothing said. Now the job says, in its progress, its report and its audit entry, when
each noisy margin count is exact with probability 1/2 or more (``synth/weak_noise.py``); it
refuses nothing.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from sqlsdc.catalog.budget import BudgetKey, set_limit
from sqlsdc.engines.duckdb import open_database
from sqlsdc.jobs.output_history import earlier_versions
from sqlsdc.mechanisms.accountant import BudgetLimit
from sqlsdc.synth import synthesize
from sqlsdc.synth.weak_noise import EXACT_SCALE


@pytest.fixture()
def db(suppress_template, tmp_path, copy_database):
    """The suppression demo, with ε 2,000 on persons granted (a table under suppression has no
    budget until an admin sets one)."""
    path = copy_database(suppress_template, tmp_path)
    con = open_database(path)
    try:
        set_limit(con, admin="admin", key=BudgetKey("*", "persons"),
                  limit=BudgetLimit(epsilon=Fraction(2000)), reason="tests")  # fmt: skip
    finally:
        con.close()
    return path


def _synthesis(db, epsilon: str, said: list[str], *, replace: bool = False):
    return synthesize(db, user="admin", into="dp", method="dp-ipf", source="persons",
                      columns=["sex", "education"], epsilon=epsilon, seed=3,
                      progress=said.append, replace=replace)  # fmt: skip


def _audited(db) -> list[str]:
    con = open_database(db)
    try:
        return [r for (r,) in con.execute("SELECT reason FROM sqlsdc.audit WHERE decision = "
                                          "'accepted' ORDER BY query_id").fetchall()]  # fmt: skip
    finally:
        con.close()


def test_the_line_is_a_count_exact_more_often_than_not():
    assert math.tanh(1 / (2 * EXACT_SCALE)) == pytest.approx(0.5)


def test_a_large_epsilon_is_noted_where_the_admin_and_the_audit_see_it(db):
    said: list[str] = []
    report = _synthesis(db, "1000", said)
    (note,) = report.details["notes"]
    assert note.startswith("note: ε = 1000 over 1 margin(s)")
    assert "exact with probability 1.00" in note and "suppress protection" in note
    assert note in said
    (reason,) = _audited(db)
    assert reason == f"synthesize job (dp-ipf) stored protected.dp; {note}"
    # the history still reads the output's name from such an entry
    _synthesis(db, "1/2", [], replace=True)
    con = open_database(db)
    try:
        assert [(v.method, v.name) for v in earlier_versions(con)] == [
            ("synthesize", "protected.dp")]  # fmt: skip
    finally:
        con.close()


def test_noise_that_leaves_counts_more_often_wrong_is_not_noted(db):
    said: list[str] = []
    report = _synthesis(db, "1", said)
    assert Fraction(report.parameters["scale"]) > EXACT_SCALE
    assert "notes" not in report.details and not any("note:" in s for s in said)
    assert _audited(db) == ["synthesize job (dp-ipf) stored protected.dp"]
