"""A noisy verification stopped after its charge (an error, Ctrl-C, kill -9): the charge
stands and is recorded with the entry it paid for, the stopped query counts against the
output's ``max_queries``, its error says it was charged and that asking again is charged
again, and the retry's audit entry names the query that paid and stopped (red team s43b's
open item, s44e: :data:`sqlsdc.synth.verify.PAID_PENDING`). The retry pays again, as a DP
query stopped after its charge does (red team s41b): free, it would time the confidential
records' read as often as asked."""

from __future__ import annotations

import json
import shutil
import signal
import textwrap
from fractions import Fraction

import cli_fork
import pytest

import sqlsdc
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import PolicyViolation
from sqlsdc.synth import verify as verify_module
from synth.verify_support import make_synthetic_output, synthetic_db

SQL = "SELECT sex, AVG(income) FROM syn_persons GROUP BY sex"  # two cells


@pytest.fixture(scope="module")
def template(pristine_demo_db, tmp_path_factory):
    return synthetic_db(pristine_demo_db, tmp_path_factory.mktemp("stopped"))


@pytest.fixture
def fresh(template, tmp_path):
    copy = tmp_path / template.name
    shutil.copy(template, copy)
    return copy


def _spent(con) -> Fraction:
    return next(s.spent.epsilon for s in con.remaining_budget() if s.key.user == "analyst")


def _catalog(path, sql):
    raw = open_database(path)
    try:
        return raw.execute(sql).fetchall()
    finally:
        raw.close()


def _stopping_once(monkeypatch, stop: BaseException) -> None:
    """The next verification stops as its confidential side is measured (after the charge)."""
    real, calls = verify_module._measure, []

    def measure(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise stop
        return real(*args, **kwargs)

    monkeypatch.setattr(verify_module, "_measure", measure)


def test_a_verification_stopped_after_its_charge_says_so_and_its_retry_pays_visibly(
    fresh, monkeypatch
):
    """Before: the stop said nothing of the charge, stored nothing, and the retry's entry was
    a plain "verification (noisy)": nothing told the analyst or the admin that it paid twice."""
    _stopping_once(monkeypatch, PolicyViolation("statement timeout (stand-in)"))
    with sqlsdc.connect(fresh, user="analyst") as con:
        with pytest.raises(PolicyViolation, match="was charged and stopped") as refused:
            con.verify(SQL, mode="noisy", epsilon="1/2")
        assert "is charged again" in str(refused.value)
        assert _spent(con) == 1
        answer = con.verify(SQL, mode="noisy", epsilon="1/2")
        assert _spent(con) == 2 and answer.epsilon_spent == "1"
        again = con.verify(SQL, mode="noisy", epsilon="1/2")
        assert again.cached and again.cells == answer.cells and _spent(con) == 2
    audit = _catalog(fresh, "SELECT query_id, decision, reason FROM sqlsdc.audit "
                            "WHERE fingerprint IS NOT NULL ORDER BY query_id")  # fmt: skip
    (stopped, decision, reason), retry = audit[0], audit[1]
    assert decision == "refused" and "statement timeout" in reason
    assert retry[1] == "accepted" and f"query {stopped} paid for it and stopped" in retry[2]
    assert _catalog(fresh, "SELECT count(*) FROM sqlsdc.verifications")[0][0] == 1


def test_a_stopped_verification_counts_against_max_queries(fresh, monkeypatch):
    """Before: a verification stopped after its charge was not counted, so stops escaped the
    output's limit of new queries (here 1: the second new query is refused)."""
    make_synthetic_output(fresh, "syn_one", report={"verification": {"max_queries": 1}})
    _stopping_once(monkeypatch, PolicyViolation("statement timeout (stand-in)"))
    with sqlsdc.connect(fresh, user="analyst") as con:
        with pytest.raises(PolicyViolation, match="charged and stopped"):
            con.verify("SELECT AVG(income) FROM syn_one", mode="noisy", epsilon="1/10")
        with pytest.raises(PolicyViolation, match="its limit"):
            con.verify("SELECT AVG(age) FROM syn_one", mode="noisy", epsilon="1/10")
        retry = con.verify("SELECT AVG(income) FROM syn_one", mode="noisy", epsilon="1/10")
        assert retry.epsilon_spent == "1/10"


def test_the_answer_a_retry_gives_is_the_one_an_unstopped_query_gives(
    fresh, template, tmp_path, monkeypatch
):
    other = tmp_path / "other.duckdb"
    shutil.copy(template, other)
    with sqlsdc.connect(other, user="analyst") as con:
        straight = con.verify(SQL, mode="noisy", epsilon="1/2").cells
    _stopping_once(monkeypatch, KeyboardInterrupt())
    with sqlsdc.connect(fresh, user="analyst") as con:
        with pytest.raises(KeyboardInterrupt) as interrupt:
            con.verify(SQL, mode="noisy", epsilon="1/2")
        assert any("charged and stopped" in n for n in getattr(interrupt.value, "__notes__", []))
        assert con.verify(SQL, mode="noisy", epsilon="1/2").cells == straight


KILLED = textwrap.dedent("""
    import os, sys
    import sqlsdc
    from sqlsdc.synth import verify
    verify._measure = lambda *a, **k: os.kill(os.getpid(), 9)
    with sqlsdc.connect(sys.argv[1], user="analyst") as con:
        con.verify(sys.argv[2], mode="noisy", epsilon="1/2")
""")


def test_a_verification_killed_after_its_charge_is_recorded_with_its_entry(fresh):
    """kill -9 between the charge and the answer: the charge's transaction stored the entry
    it paid for (before: nothing), which counts against ``max_queries``."""
    done = cli_fork.run([str(fresh), SQL], code=KILLED, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    (stored,) = _catalog(fresh, "SELECT answer FROM sqlsdc.verifications")
    assert json.loads(stored[0]) == {verify_module.PAID_PENDING: True}
    with sqlsdc.connect(fresh, user="analyst") as con:
        assert _spent(con) == 1
        answer = con.verify(SQL, mode="noisy", epsilon="1/2")
        assert _spent(con) == 2 and len(answer.cells) == 2
