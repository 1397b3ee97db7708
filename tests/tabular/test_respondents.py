"""``anySumAudit``: no singleton's respondent computes a primary (tabular/respondents.py, s46f).

Red team s44o 2.: GaussSuppression's ``anySum`` lets r1c2 - r0c1 = 0 through in a 4 x 4 count
table, so the one person of r0c1 computes r1c2 = 1. The exact audit finds such pairs; the
default ``anySumAudit`` redoes the walk until it finds none, at fewer hidden cells than
``subSpace`` (all respondents together).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import sparse

from sqlsdc.tabular.gauss import gauss_suppress
from sqlsdc.tabular.model import build_table
from sqlsdc.tabular.respondents import respondent_disclosures

COUNTS = [[3, 1, 1, 0], [0, 0, 1, 8], [5, 12, 3, 3], [12, 5, 5, 3]]  # s44o's 4 x 4


def _table(counts):
    people = [(f"r{i}", f"c{j}") for i, row in enumerate(counts) for j, k in enumerate(row)
              for _ in range(k)]  # fmt: skip
    table = build_table(pd.DataFrame(people, columns=["r", "c"]), ["r", "c"])
    primary = (table.n >= 1) & (table.n <= 2)  # freq:3
    single = np.zeros(table.X.shape[0], dtype=bool)
    ok = table.inner >= 0
    single[ok] = table.n[table.inner[ok]] == 1
    return table, primary, single


def _pattern(counts, method):
    table, primary, single = _table(counts)
    cost = np.abs(table.values).astype(float)  # protect's default cost, "value"
    cost[cost == 0] = 1.0
    hidden = gauss_suppress(table.X, primary, cost, singleton=single, singleton_method=method,
                            values=table.values)  # fmt: skip
    return table, primary, single, hidden


def _outsider_computes(X, hidden, primary) -> bool:
    """Does a primary's column lie in the span of the published columns (exact disclosure)?"""
    X = sparse.csc_matrix(X).toarray().astype(float)
    shown = X[:, ~hidden]
    rank = np.linalg.matrix_rank(shown) if shown.size else 0
    return any(
        np.linalg.matrix_rank(np.column_stack([shown, X[:, c]])) == rank
        for c in np.flatnonzero(primary)
    )


def test_the_audit_finds_anysums_difference_of_singletons():
    """Fails on main (no audit): under anySum the respondent of r0c1 computes r1c2."""
    table, primary, single, hidden = _pattern(COUNTS, "anySum")
    cell = {tuple(r): k for k, r in enumerate(table.cells[["r", "c"]].itertuples(index=False))}
    pairs = respondent_disclosures(table.X, hidden, primary, single)
    found = {(int(table.inner[s]), p) for s, p in pairs}  # inner: row of X -> its cell
    assert (cell["r0", "c1"], cell["r1", "c2"]) in found


def test_anysumaudit_leaves_no_respondent_a_primary_on_random_tables():
    """Fails on main (no ``anySumAudit``). 60 random 2-5 x 3-6 count tables (Poisson(3)):
    anySum leaves pairs in some; anySumAudit in none, no outsider computes a primary, and it
    hides fewer cells than subSpace in total."""
    leaky = hidden_audit = hidden_space = 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        shape = (int(rng.integers(2, 6)), int(rng.integers(3, 7)))
        counts = rng.poisson(3, size=shape).tolist()
        table, primary, single, plain = _pattern(counts, "anySum")
        leaky += bool(respondent_disclosures(table.X, plain, primary, single))
        *_, audited = _pattern(counts, "anySumAudit")
        assert not respondent_disclosures(table.X, audited, primary, single), seed
        assert not _outsider_computes(table.X, audited, primary), seed
        *_, space = _pattern(counts, "subSpace")  # anySumAudit's walk on large tables
        assert not respondent_disclosures(table.X, space, primary, single), seed
        hidden_audit += int(audited.sum())
        hidden_space += int(space.sum())
    assert leaky >= 10
    assert hidden_audit < hidden_space


def test_what_forced_cells_give_a_respondent_is_left_as_anysum_leaves_it():
    """Total = a + p + b, a = 1 (a singleton) and p = 2 primary, b and Total forced (public,
    e.g. an earlier release): the outsider knows only a + p, a's respondent computes p = Total -
    b - a whatever is hidden. The pattern is anySum's, the audit leaves the pair out, and b
    hidden instead of forced is what anySumAudit hides (fails on main: no anySumAudit)."""
    X = sparse.csc_matrix(np.array([[1, 0, 0, 1], [0, 1, 0, 1], [0, 0, 1, 1]]))
    primary = np.array([True, True, False, False])
    forced = np.array([False, False, True, True])
    single = np.array([True, False, False])
    cost = np.array([1.0, 2.0, 5.0, 8.0])
    kept = gauss_suppress(X, primary, cost, forced=forced, singleton=single)
    assert kept.tolist() == primary.tolist()
    audited = gauss_suppress(X, primary, cost, forced=forced, singleton=single,
                             singleton_method="anySumAudit")  # fmt: skip
    assert audited.tolist() == kept.tolist()
    assert respondent_disclosures(X, kept, primary, single) == [(0, 1)]
    assert respondent_disclosures(X, kept, primary, single, forced) == []
    free = gauss_suppress(X, primary, cost, singleton=single, singleton_method="anySumAudit")
    assert free.tolist() == [True, True, True, False]  # b (5) rather than Total (8)


@pytest.mark.parametrize("limit", ["_AUDITED_BELOW_NNZ", "WORK_LIMIT"])
def test_large_tables_and_long_rounds_take_subspace(monkeypatch, limit):
    """From ``gauss._AUDITED_BELOW_NNZ`` nonzeros on, or when the rounds would pass
    ``respondents.WORK_LIMIT`` tests, anySumAudit is subSpace's walk: respondent-safe too."""
    import sqlsdc.tabular.gauss as gauss
    import sqlsdc.tabular.respondents as respondents

    *_, space = _pattern(COUNTS, "subSpace")
    table, primary, single, _ = _pattern(COUNTS, "anySumAudit")
    monkeypatch.setattr(gauss if limit.startswith("_") else respondents, limit, 0)
    *_, large = _pattern(COUNTS, "anySumAudit")
    assert large.tolist() == space.tolist()
    assert not respondent_disclosures(table.X, large, primary, single)
