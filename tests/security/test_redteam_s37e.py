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
  by, and the selection's parameters (``dp_reuse.release_digest``).
- **Long keys and conditions outside DP (CKM, threshold), a free timing oracle.** ``SELECT
  region || '<200,000 characters>' AS k, COUNT(*) FROM persons WHERE region = 'zzz' GROUP BY
  k`` took 0.05 s for no row and 0.64 s for 20,000 under threshold (0.49 / 0.76 s under CKM),
  and the same with the literal in the WHERE (``WHERE region = 'zzz' AND region || '<200,000
  characters>' <> ''``: DuckDB evaluates the long conjunct on the rows the others keep) or in
  a derived table's column: asked as often as wished, nothing paid, the number of rows of any
  population told by the clock. Every aggregation's keys (as private DP keys:
  ``rewrite.key_size``) and the conditions and aggregated arguments of it and the scopes it
  reads (at most 65,536 characters of literals per row, IN lists of constants aside) are now
  bounded before anything runs.

What held (tried, no test added):

- ``guard/listed_cells.py``: cells of strings with NUL, U+2028, emoji, quotes and 100,000
  characters, NaN/inf/-0.0/1e308 doubles and float32, dates of years 1 and 9999 and NULL,
  timestamps in us and ms, DECIMAL(38,10), UBIGINT 2^64-1, booleans, large strings and date64
  give the same rows as lists as registered (timestamps in seconds before year 1 are not
  listed). The analyst's own parameters are literals before the check, so the only
  placeholders of the rebuilt text are the lists; a relation is replaced only where it is read
  by name, and its names cannot be written (``__`` prefix). Whether a stage is listed depends
  on its released cells alone.
- ``catalog/identity_text.py``: every printable ASCII character (tripled) and integers 0, -1,
  ±2^63, 2^64-1 give DuckDB's ``to_json`` text byte for byte; '1' and 1, 'null' and NULL,
  True and 1 are told apart as DuckDB does. A key of DuckDB's JSON type (``CAST('42' AS
  JSON)``, the only analyst constant whose JSON text DuckDB would write unquoted) reaches both
  paths as an Arrow string, so both write ``"42"``; a key expression is part of the population
  digest, so ``CAST(age AS VARCHAR) AS k`` and a constant ``k`` never share an identity.
- ``rewrite/key_size.py``: ``repeat``, ``lpad`` and other string builders are not allowed
  functions; ``WITH RECURSIVE`` is refused; DISTINCT, ORDER BY, UNION of confidential rows and
  joins that repeat rows are refused before the sizes matter; a scalar subquery over a public
  table is bounded by its data. The released groups' digest names the population, keys,
  bounding, measures choosing capped rows and the data versions of every table read (through
  the unit count's identity), and the entry the user and policy version.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import sqlsdc
from sqlsdc.errors import PolicyViolation

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


L = "y" * 200_000
DOUBLED = ", ".join(
    ["d0 AS (SELECT region AS k FROM persons)"]
    + [f"d{i} AS (SELECT k || k AS k FROM d{i - 1})" for i in range(1, 12)]
)


@pytest.fixture(scope="module", params=["ckm", "threshold"])
def bi_con(request, ckm_db, demo_db):
    """An analyst's connection to the demo under CKM and under threshold protection."""
    with sqlsdc.connect(ckm_db if request.param == "ckm" else demo_db, "analyst") as con:
        yield con


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT region || '{L}' AS k, COUNT(*) FROM persons WHERE region = 'zzz' GROUP BY k",
        f"SELECT t.k, COUNT(*) FROM (SELECT region || '{L[:5_000]}' AS k FROM persons) AS t "
        "GROUP BY t.k",
        f"WITH {DOUBLED.rsplit(', d6', 1)[0]} SELECT k, COUNT(*) FROM d5 GROUP BY k",
        f"SELECT COUNT(*) FROM persons WHERE region = 'zzz' AND region || '{L}' <> ''",
        f"SELECT region, COUNT(*) FROM (SELECT region FROM persons WHERE region || '{L}' <> '') "
        "AS t GROUP BY region",
        f"SELECT p.region, COUNT(*) FROM persons AS p JOIN regions AS r "
        f"ON p.region = r.region AND r.name || '{L}' <> p.region GROUP BY p.region",
        f"WITH {DOUBLED} SELECT COUNT(*) FROM d11 WHERE k <> ''",
        f"SELECT region, COUNT(*) FROM persons GROUP BY region, sex HAVING COUNT(*) > 0 AND "
        f"region || '{L}' <> ''",
    ],
    ids=[
        "key",
        "derived-key",
        "cte-doubled-key",
        "where",
        "derived-where",
        "join-on",
        "cte-doubled-where",
        "having",
    ],
)
def test_long_keys_and_conditions_are_refused_outside_dp(bi_con, sql):
    """Before the fix each was answered, free, in a time proportional to the rows of the
    population (the first: 0.05 s for none and 0.64 s for 20,000 under threshold)."""
    with pytest.raises(PolicyViolation, match="computed for every row of the population"):
        bi_con.execute(sql)


RECODE = "CASE " + " ".join(f"WHEN age = {i} THEN 'age group number {i}'" for i in range(100))
CODES = ", ".join(f"'code {i:05d}'" for i in range(10_000)) + ", 'N'"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT region, sex, education, occupation, municipality, age, COUNT(*) FROM persons "
        "GROUP BY ALL",
        "SELECT region || ' - ' || sex AS k, COUNT(*), SUM(income) FROM persons GROUP BY k",
        f"SELECT {RECODE} ELSE 'other' END AS g, COUNT(*) FROM persons GROUP BY g",
        "SELECT r.name, COUNT(*) FROM persons AS p JOIN regions AS r ON p.region = r.region "
        "GROUP BY r.name",
        f"SELECT region, COUNT(*) FROM persons WHERE region IN ({CODES}) GROUP BY region",
        "SELECT region, COUNT(*) FROM persons WHERE education LIKE '%tertiary%' "
        "GROUP BY ROLLUP(region)",
        f"SELECT region, COUNT(*) FROM persons WHERE region <> 'zzz' AND 'a' || '{L}' <> '' "
        f"GROUP BY region HAVING 'b' || '{L}' IS NOT NULL",
    ],
    ids=[
        "six-dimensions",
        "concatenation",
        "recode",
        "public-label",
        "long-in-list",
        "like",
        "constants",  # folded once by the engine, before any row
    ],
)
def test_bi_keys_and_conditions_are_answered(bi_con, sql):
    assert bi_con.execute(sql).fetchall() is not None
