"""A noisy verification stopped after its charge (an error, Ctrl-C, kill -9): the charge
stands and is recorded with what it paid for; asking the same again answers it without a new
charge, and the stopped query counts against the output's ``max_queries`` (red team s43b's
open item, fixed by s44e: :data:`sqlsdc.synth.verify.PAID_PENDING`)."""

from __future__ import annotations

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
from synth.verify_support import synthetic_db

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


def test_a_verification_stopped_after_its_charge_is_answered_by_a_retry_without_a_new_charge(
    fresh, monkeypatch
):
    """Before: the stop (here an error as the confidential side is measured) stored nothing;
    the retry paid 2 x 1/2 again (spent 2, not 1), and the stopped one was not counted."""
    real = verify_module._measure
    calls = []

    def stopped(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise PolicyViolation("statement timeout (stand-in)")
        return real(*args, **kwargs)

    monkeypatch.setattr(verify_module, "_measure", stopped)
    with sqlsdc.connect(fresh, user="analyst") as con:
        with pytest.raises(PolicyViolation, match="charged and stopped") as refused:
            con.verify(SQL, mode="noisy", epsilon="1/2")
        assert "without a new charge" in str(refused.value)
        assert _spent(con) == 1
        answer = con.verify(SQL, mode="noisy", epsilon="1/2")
        assert _spent(con) == 1, "the retry is paid by the stopped query's charge"
        assert answer.epsilon_spent == "0" and not answer.cached
        assert [c["status"] for c in answer.cells] == ["released", "released"]
        again = con.verify(SQL, mode="noisy", epsilon="1/2")
        assert again.cached and again.cells == answer.cells and _spent(con) == 1
        con.verify(SQL, mode="noisy", epsilon="1/4")  # another ε: a new query, paid
        assert _spent(con) == Fraction(3, 2)
    audit = _catalog(fresh, "SELECT decision, reason FROM sqlsdc.audit "
                            "WHERE fingerprint IS NOT NULL ORDER BY query_id")  # fmt: skip
    first = audit[0]
    assert first[0] == "refused" and "statement timeout" in first[1]
    assert audit[1][0] == "accepted" and "which stopped" in audit[1][1]
    (stored,) = _catalog(fresh, "SELECT count(*) FROM sqlsdc.verifications")[0]
    assert stored == 2


def test_the_answer_a_retry_gives_is_the_one_an_unstopped_query_gives(fresh, template, tmp_path):
    other = tmp_path / "other.duckdb"
    shutil.copy(template, other)
    with sqlsdc.connect(other, user="analyst") as con:
        straight = con.verify(SQL, mode="noisy", epsilon="1/2").cells
    real = verify_module._measure

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    verify_module._measure = stopped
    try:
        with sqlsdc.connect(fresh, user="analyst") as con:
            with pytest.raises(KeyboardInterrupt) as interrupt:
                con.verify(SQL, mode="noisy", epsilon="1/2")
            assert any("charged and stopped" in n for n in interrupt.value.__notes__)
    finally:
        verify_module._measure = real
    with sqlsdc.connect(fresh, user="analyst") as con:
        assert con.verify(SQL, mode="noisy", epsilon="1/2").cells == straight
        assert _spent(con) == 1


KILLED = textwrap.dedent("""
    import os, sys
    import sqlsdc
    from sqlsdc.synth import verify
    verify._measure = lambda *a, **k: os.kill(os.getpid(), 9)
    with sqlsdc.connect(sys.argv[1], user="analyst") as con:
        con.verify(sys.argv[2], mode="noisy", epsilon="1/2")
""")


def test_a_verification_killed_after_its_charge_is_recorded_and_counted(fresh):
    """kill -9 between the charge and the answer: the charge's transaction holds what it paid
    for, so the retry is free, and the killed query counts against ``max_queries``."""
    done = cli_fork.run([str(fresh), SQL], code=KILLED, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    pending = _catalog(fresh, "SELECT answer FROM sqlsdc.verifications")
    assert len(pending) == 1 and verify_module.PAID_PENDING in pending[0][0]
    with sqlsdc.connect(fresh, user="analyst") as con:
        assert _spent(con) == 1
        answer = con.verify(SQL, mode="noisy", epsilon="1/2")
        assert _spent(con) == 1 and len(answer.cells) == 2
