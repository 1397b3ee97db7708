"""Red team s37e: an analyst's connection against the code merged in session 37 (the answer's
noisy cells as list parameters, ledger identities written in Python, private group keys'
bounds and the released groups of private selection).

What broke (fixed here):

- **Free exact cells for every subset of the paid statistics.** The groups a private
  selection released were kept under a digest of *all* the stage's statistics, so a stage
  asking part of them (``COUNT(*)`` alone after ``COUNT(*), SUM(cost)``: nothing new to pay)
  found no released groups and computed its exact cells again, once per subset: k statistics
  paid gave 2^k - 1 free timings of the population's rows, where red team s37b meant one per
  charge. The digest is now that of the unit count, the one statistic the selection decides
  by, and the selection's parameters (``dp_release.release_digest``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import sqlsdc

sys.path.insert(0, str(Path(__file__).parent.parent))
from test_dp_query import dp_document, make_db, pin_noise  # noqa: E402


@pytest.fixture(scope="module")
def dp_db(tmp_path_factory) -> Path:
    """visits: private groups (clinic), at most 2 groups and 5 rows per person."""
    path = tmp_path_factory.mktemp("s37e") / "dp.duckdb"
    make_db(path, dp_document())
    pin_noise(path, b"red team s37e, fixed secret.....")
    return path


def _exact_runs(monkeypatch) -> list[str]:
    """The exact cells' SQL texts the guard runs (``__pairs``; not the key types' LIMIT 0)."""
    from sqlsdc.engines import duckdb as engine

    texts: list[str] = []
    real = engine.run

    def run(con, sql, *args, **kwargs):
        if "__pairs" in sql and not sql.endswith("LIMIT 0"):
            texts.append(sql)
        return real(con, sql, *args, **kwargs)

    monkeypatch.setattr(engine, "run", run)
    return texts


@pytest.mark.parametrize("where", ["cost < 90", "clinic = 'rare' AND cost BETWEEN 40 AND 42"])
def test_a_subset_of_paid_statistics_is_answered_from_the_released_groups(
    dp_db, monkeypatch, where
):
    """Before the fix the COUNT alone and the SUM alone each computed the exact cells again,
    free: one more timing of the population per subset of the statistics paid together."""
    texts = _exact_runs(monkeypatch)
    both = f"SELECT clinic, COUNT(*), SUM(cost) FROM visits WHERE {where} GROUP BY clinic"
    with sqlsdc.connect(dp_db, "ana") as con:
        first = {c: (n, s) for c, n, s in con.execute(both).fetchall()}
        assert len(texts) == 1
        spent = con.remaining_budget()[0].spent
        texts.clear()
        counts = con.execute(
            f"SELECT clinic, COUNT(*) FROM visits WHERE {where} GROUP BY clinic"
        ).fetchall()
        sums = con.execute(
            f"SELECT clinic, SUM(cost) FROM visits WHERE {where} GROUP BY clinic"
        ).fetchall()
        assert texts == []
        assert dict(counts) == {c: n for c, (n, _s) in first.items()}
        assert dict(sums) == {c: s for c, (_n, s) in first.items()}
        assert con.remaining_budget()[0].spent == spent


def test_a_new_statistic_of_the_population_is_still_computed_and_paid(dp_db, monkeypatch):
    """The released groups answer only what is cached: a statistic not paid before is paid and
    its exact cells computed (the same groups released: the unit counts decide)."""
    texts = _exact_runs(monkeypatch)
    with sqlsdc.connect(dp_db, "ana") as con:
        first = con.execute(
            "SELECT clinic, COUNT(*) FROM visits WHERE cost < 80 GROUP BY clinic"
        ).fetchall()
        spent = con.remaining_budget()[0].spent
        texts.clear()
        more = con.execute(
            "SELECT clinic, COUNT(*), COUNT(cost) FROM visits WHERE cost < 80 GROUP BY clinic"
        ).fetchall()
        assert len(texts) == 1
        assert con.remaining_budget()[0].spent != spent
        assert sorted((c, n) for c, n, _m in more) == sorted(first)
