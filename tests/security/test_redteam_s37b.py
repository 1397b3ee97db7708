"""Red team s37b: an analyst's guarded connection against the differential-privacy query path.

What broke (fixed here):

- **A timing oracle through long private group keys.** With ``dp.groups: private`` the
  analyst writes the group key expression, and the exact cells compute it for every row of
  the population, then hash, group and sort it in several passes. ``SELECT clinic || '<900,000
  characters>' AS k, COUNT(*) FROM visits WHERE clinic = 'rare' AND cost BETWEEN 40 AND 42
  GROUP BY k`` (one row, one person) against the same with ``BETWEEN 50 AND 52`` (no row):
  once the statistics are paid, asking again is free and computes the exact cells again, and
  the one-row query took longer in 27 of 30 paired runs (medians 443 and 309 ms; a population
  of 2,466 rows took 26-30 s): whether a person with given attributes exists, exactly, for
  one charge per population and any number of free timings. Private group keys are now
  bounded from the query before the charge (``rewrite.key_size``): at most 1,024 characters
  of literals and 16 stored values in a value (a CASE as long as its longest branch; derived
  tables, CTEs and aggregated public tables followed), and 65,536 characters of literals
  evaluated per row, conditions included.
- **A timing oracle through the free repetition of a private-group query.** Even with the
  plain key ``clinic``, the one-row population above took longer than the empty one in 32 of
  40 paired runs (medians 17.9 and 14.2 ms): a repeated private-group statement computed its
  exact cells, and keyed and drew every group present before the selection, at every asking.
  The groups a private selection released are now recorded with its cells
  (``dp_reuse.release_digest``, keyed by the stage's statistics, so a rephrasing finds them
  too), and a stage asked again is answered from them without its exact cells: 19 of 40 after
  the fix, one timing per charge. They are kept also when the answer fails after the cells
  were drawn (``Connection._keep_released``): an answer made to pass the 64 MiB cap each time
  (a literal doubled through CTEs beside the private stage) cached nothing and recomputed the
  exact cells at every asking.

What held (tried, no test added): one cell identity over two exact values, none: parameters
(``month > ?`` with 6 and 7 are two statistics; a parameter and its literal one), 6 / 6.0 /
'6' / 6.5 and ``>= 7`` (one statistic where DuckDB compares alike, else paid again), ``WHERE
TRUE``, ``month = month``, ``COUNT(1)`` / ``COUNT(month)`` / ``SUM(1)``, a public join, an IN
over a public table; UNION ALL of a table with itself, self-joins, DISTINCT, QUALIFY, window
and ORDER BY ... LIMIT derived tables, TABLESAMPLE, FILTER, subqueries and correlated
EXISTS over another confidential table, grouping by an identifier, a measure or an
expression without a domain, ROLLUP (all refused before the charge); exact arithmetic in
private keys (the totality check); quantile variants (MEDIAN = QUANTILE_CONT/DISC(0.5) one
statistic, other fractions paid apart, list and computed fractions refused); HAVING and ORDER
BY on aggregates not shown (charged), SUM(COUNT(*)) OVER () over the noisy cells; suppressed
cells (no accuracy row, no value); budget keys of a table spelled "Benefits" (charged).
An answer over the 64 MiB cap after the charge (a 200,000-character literal beside 324
cells) is paid but its statistics are then paid: the same cells asked again cost nothing
(the leftover the brief names; a refund would give the noisy values for free, since whether
the answer passes the cap is a function of them).

Left open:

- The first asking of a population still runs in a time that grows with its rows and groups
  (one timing per charge: a single paired run of the one-row and empty populations above
  differs by a few ms, within the jitter of a shared machine). Public grids of more than 256
  cells are computed at every asking too, but their keys are stored columns (no long key) and
  the engine's work per row is far below the jitter.
- The same long-key amplification exists outside DP: a CKM count grouped by ``region ||
  '<900,000 characters>'`` is answered, free, in 0.3 s for no row and 1.3 s for 11,589.
- Permute-and-flip's running time (quantiles) depends on the scores, so a timed quantile
  shows more than its output (the position of the accepted candidate in its permutation).
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
    path = tmp_path_factory.mktemp("s37b") / "dp.duckdb"
    make_db(path, dp_document())
    pin_noise(path, b"red team s37b, fixed secret.....")
    return path


def _spent(path: Path):
    with sqlsdc.connect(path, "ana") as con:
        return con.remaining_budget()[0].spent


def _doubled(levels: int) -> str:
    """A key built on itself ``levels`` times through CTEs: 2^levels copies of clinic."""
    parts = ["d0 AS (SELECT clinic AS k FROM visits)"]
    parts += [f"d{i} AS (SELECT k || k AS k FROM d{i - 1})" for i in range(1, levels + 1)]
    return f"WITH {', '.join(parts)} SELECT k, COUNT(*) FROM d{levels} GROUP BY k"


LONG = "y" * 20_000
RECODE = "CASE " + " ".join(f"WHEN clinic = 'c{i}' THEN 'group {i}'" for i in range(150))


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT clinic || '{LONG}' AS k, COUNT(*) FROM visits WHERE clinic = 'rare' GROUP BY k",
        f"SELECT t.k, COUNT(*) FROM (SELECT clinic || '{LONG[:2_000]}' AS k FROM visits) AS t "
        "GROUP BY t.k",
        _doubled(5),
        f"SELECT l.big, SUM(v.cost) FROM visits AS v JOIN (SELECT code, MIN(label || '{LONG}') "
        "AS big FROM lookup GROUP BY code) AS l ON v.clinic = l.code GROUP BY l.big",
        "SELECT CASE WHEN clinic || '" + "z" * 70_000 + "' = 'x' THEN 'x' ELSE clinic END AS k, "
        "COUNT(*) FROM visits GROUP BY k",
    ],
    ids=["literal", "derived-table", "cte-doubling", "public-aggregate", "condition"],
)
def test_a_long_private_group_key_is_refused_before_the_charge(dp_db, sql):
    """Before the fix each was answered, and the first one's exact cells took about 10 ms more
    per row of the population at 900,000 characters: asked again for free, its running time
    told whether one person with given attributes exists."""
    before = _spent(dp_db)
    with sqlsdc.connect(dp_db, "ana") as con:
        with pytest.raises(PolicyViolation, match="group keys of private groups"):
            con.execute(sql)
    assert _spent(dp_db) == before


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT clinic, COUNT(*), SUM(cost) FROM visits GROUP BY clinic",
        "SELECT UPPER(clinic) || ' - ' || clinic AS g, COUNT(DISTINCT pid) FROM visits GROUP BY 1",
        f"SELECT {RECODE} ELSE clinic END AS g, COUNT(*) FROM visits GROUP BY g",
        "SELECT SUBSTRING(clinic, 1, 1) AS g, AVG(cost) FROM visits WHERE cost < 90 GROUP BY g",
        "SELECT l.label, COUNT(*) FROM visits AS v JOIN lookup AS l ON v.clinic = l.code "
        "GROUP BY l.label",
        _doubled(3),
    ],
    ids=["column", "concatenation", "recode", "substring", "public-label", "cte"],
)
def test_private_group_keys_analysts_write_are_answered(dp_db, sql):
    with sqlsdc.connect(dp_db, "ana") as con:
        assert con.execute(sql).fetchall() is not None


def _engine_texts(monkeypatch) -> list[str]:
    """The SQL texts the guard runs through ``engines.duckdb.run`` (exact cells, answers)."""
    from sqlsdc.engines import duckdb as engine

    texts: list[str] = []
    real = engine.run

    def run(con, sql, *args, **kwargs):
        texts.append(sql)
        return real(con, sql, *args, **kwargs)

    monkeypatch.setattr(engine, "run", run)
    return texts


ONE_ROW = "clinic = 'rare' AND cost BETWEEN 40 AND 42"  # one visit, one person
NO_ROW = "clinic = 'rare' AND cost BETWEEN 50 AND 52"


@pytest.mark.parametrize("where", [ONE_ROW, NO_ROW, "cost < 90"], ids=["one", "none", "many"])
def test_a_private_selection_asked_again_is_answered_without_its_exact_cells(
    dp_db, monkeypatch, where
):
    """Before the fix each asking computed the exact cells again (free once paid), and their
    running time told the one-row population from the empty one in 32 of 40 paired runs.
    Asked again, rephrased, or from a new opening, the released groups and their cached cells
    answer: no exact cells, the same values, nothing charged."""
    sql = f"SELECT clinic, COUNT(*) AS n, SUM(cost) AS s FROM visits WHERE {where} GROUP BY clinic"
    rephrased = (f"SELECT v.clinic AS c, SUM(v.cost), COUNT(*) FROM visits AS v "
                 f"WHERE {where.replace('clinic', 'v.clinic').replace('cost', 'v.cost')} "
                 "GROUP BY 1")  # fmt: skip
    texts = _engine_texts(monkeypatch)
    with sqlsdc.connect(dp_db, "ana") as con:
        first = sorted(con.execute(sql).fetchall())
        spent = con.remaining_budget()[0].spent
        exact = [t for t in texts if "__pairs" in t and not t.endswith("LIMIT 0")]
        assert exact  # computed once, paid
        texts.clear()
        assert sorted(con.execute(sql).fetchall()) == first
        assert sorted(con.execute(rephrased).fetchall()) == [(c, s, n) for c, n, s in first]
        assert con.remaining_budget()[0].spent == spent
    with sqlsdc.connect(dp_db, "ana") as other:
        assert sorted(other.execute(sql).fetchall()) == first
    # the new opening reads the key types with LIMIT 0 (no row); no exact cells ran again
    assert not [t for t in texts if "__pairs" in t and not t.endswith("LIMIT 0")]


def test_an_answer_made_to_fail_after_the_charge_does_not_recompute_the_cells(dp_db, monkeypatch):
    """The answer's transaction caches the cells: an answer over the 64 MiB cap (a literal
    doubled through CTEs beside a count of the private stage) kept nothing, and each asking,
    free once paid, computed the exact cells again before failing, timed as before. The
    released groups (none here: the selection drops a one-row group) and their cells are now
    kept when such an answer fails."""
    one_row = "clinic = 'rare' AND cost BETWEEN 19 AND 20"  # a population not asked before
    parts = [f"t AS (SELECT clinic, COUNT(*) AS n FROM visits WHERE {one_row} GROUP BY clinic)",
             f"l0 AS (SELECT (SELECT COUNT(*) FROM t) AS n, '{'y' * 400_000}' AS s)"]  # fmt: skip
    parts += [f"l{i} AS (SELECT n, s || s AS s FROM l{i - 1})" for i in range(1, 9)]
    sql = f"WITH {', '.join(parts)} SELECT n, s FROM l8"  # 2^8 x 400,000 characters
    texts = _engine_texts(monkeypatch)
    with sqlsdc.connect(dp_db, "ana") as con:
        for asking in range(3):
            texts.clear()
            with pytest.raises(sqlsdc.AnswerTooLarge):
                con.execute(sql)
            exact = [t for t in texts if "__pairs" in t and not t.endswith("LIMIT 0")]
            assert len(exact) == (1 if asking == 0 else 0)


@pytest.fixture(scope="module")
def quantile_db(tmp_path_factory) -> Path:
    """visits with magnitudes under epsilon, as a quantile needs."""
    document = dp_document()
    document["tables"]["visits"]["protection"]["magnitudes"] = {
        "method": "dp",
        "spend": {"epsilon": "1/2"},
    }
    path = tmp_path_factory.mktemp("s37b_quantile") / "dp.duckdb"
    make_db(path, document)
    pin_noise(path, b"red team s37b, fixed secret.....")
    return path


@pytest.mark.parametrize("where", ["cost < 95", "clinic = 'rare' AND cost < 30"])
def test_a_private_quantile_asked_again_is_answered_without_its_exact_cells(
    quantile_db, monkeypatch, where
):
    sql = f"SELECT clinic, MEDIAN(cost), COUNT(*) FROM visits WHERE {where} GROUP BY clinic"
    texts = _engine_texts(monkeypatch)
    with sqlsdc.connect(quantile_db, "ana") as con:
        first = sorted(con.execute(sql).fetchall())
        assert len([t for t in texts if "__rows" in t and not t.endswith("LIMIT 0")]) == 2
        texts.clear()
        assert sorted(con.execute(sql).fetchall()) == first
        assert not [t for t in texts if "__rows" in t and not t.endswith("LIMIT 0")]
