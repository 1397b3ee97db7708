"""The audit decisions of guarded Spark queries, without a JVM: the engine's answer is replaced
by a stub, so the guard's own handling of each outcome is what is tested."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import duckdb
import pytest

import sqlsdc
import sqlsdc.guard.spark as guarded_spark
from sqlsdc.errors import AnswerTooLarge, OperationalError


def _last_decision(path) -> tuple[str, str]:
    raw = duckdb.connect(str(path), read_only=True)
    try:
        return raw.execute(
            "SELECT decision, reason FROM sqlsdc.audit ORDER BY query_id DESC LIMIT 1"
        ).fetchone()
    finally:
        raw.close()


@pytest.fixture
def spark_stubbed(pristine_demo_db, tmp_path, monkeypatch):
    """A copy of the demo database and a Spark engine stub whose answer raises ``failure``."""
    path = tmp_path / "demo.duckdb"
    shutil.copy(pristine_demo_db, path)
    raised: list[BaseException] = []

    def answer(engine, tree, noisy):
        raise raised[0]

    for check in ("_check_spark_types", "check_summable", "check_engine_tables"):
        monkeypatch.setattr(guarded_spark, check, lambda *args, **kwargs: None)
    monkeypatch.setattr(guarded_spark, "_answer", answer)
    engine = SimpleNamespace(refresh=lambda tables: None, schemas={}, summable={}, run=None)
    return path, engine, raised


def test_a_spark_answer_past_the_row_cap_is_audited_refused_as_on_duckdb(spark_stubbed):
    """(s44q, after red team s44k.) Fails on the branch's start: Spark's AnswerTooLarge (an
    OperationalError) was caught as a Spark failure and audited ``failed``, where the DuckDB
    path audits the same cap ``refused`` (it is the guard's limit, not the engine failing)."""
    path, engine, raised = spark_stubbed
    raised.append(AnswerTooLarge("the answer has more than 1,000 rows, the most a connection"))
    with sqlsdc.connect(path, "analyst") as con:
        with pytest.raises(AnswerTooLarge):
            guarded_spark.run_protected(
                con, engine, "SELECT age, COUNT(*) FROM persons GROUP BY age"
            )
    decision, reason = _last_decision(path)
    assert decision == "refused"
    assert reason.startswith("AnswerTooLarge: the answer has more than 1,000 rows")


def test_a_spark_failure_is_still_audited_failed(spark_stubbed):
    """Spark's own failure (an OperationalError) stays ``failed``, with its withheld detail."""
    path, engine, raised = spark_stubbed
    raised.append(OperationalError("the query failed on Spark", detail="DIVIDE_BY_ZERO: x"))
    with sqlsdc.connect(path, "analyst") as con:
        with pytest.raises(OperationalError, match="failed on Spark"):
            guarded_spark.run_protected(
                con, engine, "SELECT age, COUNT(*) FROM persons GROUP BY age"
            )
    decision, reason = _last_decision(path)
    assert decision == "failed"
    assert "DIVIDE_BY_ZERO" in reason
