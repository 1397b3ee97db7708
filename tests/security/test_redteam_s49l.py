"""Red team s49l: session 49's later merges (s49j's DP scalar subquery beside CKM cells).

Finding (fixed): validate.prove_cells exempted every ``__cells.x`` whose nearest select has a
``__cells`` source of its own, taking the inner alias to shadow the outer one (s49j). DuckDB
shadows per column, not per alias: a qualified ``__cells.x`` that the inner source lacks binds
to the OUTER ``__cells.x``. A tree whose nested frame read ``__cells.__a0`` from a source
without it passed the last, independent proof and returned the CKM frame's ``__a0`` — the sum
of income before the cell key's noise (1,082,205,476.69 where the released sum is
1,082,187,776) — as the subquery's value. No analyst statement was found that makes the
rewriter emit such a tree (the analyst cannot write ``__`` names; 60 mixed statements below
give the DP value of the DP query alone), so this is the validator's own proof being wrong,
not an answer seen in the wild. A nested frame now shadows only for a column its source
provably holds (an output named so, or DP's ``SELECT *`` of its registered noisy cells and a
column that relation registers); any other is proven against the frame around it.

Finding (fixed): rank swapping's top and bottom 5 % "coded to their means" (s49d) is the floor
of 5 % of the values present: 1 value for 20-39 values, none below 20. One value coded to its
own mean is left as it is and kept out of the swap, so it stays on its own record: the demo's
22 persons aged 94+ of R01 with ``rankswap:income:p=10`` released the largest income
(142,494.58, a man of 94, lower secondary) and the smallest exactly on the persons who have
them, every time (README: "the file never holds the largest or smallest values"). A share of
fewer than 2 values (microaggregation's least k) is refused, saying which share to give or
``top=0``.

Attacks that held (numbers from a 20,000-person demo):
- the same DP subquery twice in one statement, in a CTE read twice, in SELECT and WHERE, in
  two UNION ALL branches: charged once (one budget row), one noisy value (4 statements);
- two different DP subqueries beside one CKM count: one budget row, each noisy value that of
  the DP query alone; GROUP BY ... LIMIT 3 then LIMIT 5: no second charge, same value;
- a DP subquery in WHERE, ORDER BY, CASE, HAVING (with LIMIT), arithmetic with the CKM count:
  charged (one row each), never free; LIMIT (SELECT ...) refused as computed;
- correlated DP subqueries (on region, person_id, amount > p.income): refused before a charge;
- 12 DP aggregate forms (AVG, SUM/COUNT, COUNT DISTINCT, MEDIAN, QUANTILE_CONT, STDDEV,
  VARIANCE, grouped with LIMIT 1, ...) beside COUNT, SUM, AVG of persons (36 statements): the
  DP value is exactly that of the DP query alone (no CKM true value crosses over);
- ``__cells`` written by the analyst (alias, quoted, on a public table): refused as reserved;
- noised_conditions' skip of nested cells: ``(SELECT COUNT(*) FROM persons WHERE income >=
  100000)`` beside a count, as a group key, with region = 'R01': 2,745 / 243, the answers of
  the statements alone (true 2,725 / 245), so the nested condition is still converted; the
  outer WHERE income >= 20000 beside such a subquery (in WHERE, SELECT, group key, HAVING, IN):
  15,042, the noised answer alone (true 15,118);
- mixed statements' bounds: a DP group key with GROUP BY region LIMIT 5 then LIMIT 3: one
  charge; LIMIT 1,000,001 refused before the charge; DP beside CKM over a join, over benefits
  itself (two DP stages: 2/5), in a derived table filtered outside: charged as asked;
- rank swap's coded means across two files one person apart (R01 aged 90+, 100 and 101
  records): the totals differ by her income exactly (258,356.19; swapping and coding keep
  totals), but ``sqlsdc publish --include f1 --include f2`` refuses the pair (file_pairs);
- synthesize at the 10-value floor: 11 incomes of R05-M019 aged 90+, 2,000 rows: parametric
  stores the top-5 and bottom-5 means to the cent (804 and 795 rows: means of 5, as meant);
  cart's smoothing keeps the one uncoded (6th) value: 185 rows within 38,571-39,100, median
  38,872.43 for 38,874.53 — one value of the 11, not linked to a person; reported, not fixed.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest
from db_reads import read
from sqlglot import exp

import sqlsdc.guard.pipeline as pipeline
from sqlsdc.errors import InternalError, MicrodataError
from sqlsdc.guard.validate import validate_release
from sqlsdc.microdata import perturb
from sqlsdc.microdata.steps import apply_steps, parse_step
from tests.test_dp_beside_ckm import _ask, ckm_template  # noqa: F401 - a fixture

MIXED = "SELECT SUM(income), (SELECT COUNT(*) FROM benefits) FROM persons"


@pytest.fixture
def ckm_copy(ckm_template, tmp_path, copy_database):  # noqa: F811
    """A copy of test_dp_beside_ckm's own small CKM demo: the session's shared ``ckm_db``
    holds other modules' charges, which the charges counted here would include."""
    return copy_database(ckm_template, tmp_path)


def _protected_tree(path, sql: str, monkeypatch):
    """The tree the pipeline hands to validate_release for ``sql``, and the policy."""
    seen = []

    def record(tree, policy):
        seen.append((tree.copy(), policy))
        return validate_release(tree, policy)

    monkeypatch.setattr(pipeline, "validate_release", record)
    answer = _ask(path, sql)
    return seen[-1], answer


def _spent(path) -> int:
    return read(path, "SELECT COUNT(*) FROM sqlsdc.budget_spend WHERE user_name = 'analyst'")[0][0]


def test_a_nested_frame_reading_a_column_its_cells_lack_is_proven_against_the_outer(
    ckm_copy, monkeypatch
):
    """Fails on int49: validate_release accepts the tree, and DuckDB answers the nested
    ``__cells.__a0`` with the CKM frame's sum before its noise."""
    (tree, policy), answer = _protected_tree(ckm_copy, MIXED, monkeypatch)
    dp_frames = [
        s
        for s in tree.find_all(exp.Subquery)
        if s.alias == "__cells" and s.find(exp.Table).name.startswith("__sqlsdc_dp_cells_")
    ]
    assert len(dp_frames) == 1
    dp_frames[0].this.replace(exp.select(exp.Literal.number(1).as_("__y9")))
    raw = duckdb.connect(str(ckm_copy), read_only=True)
    try:  # the tester runs it raw: the nested read is the outer frame's unprotected __a0
        released, leaked = raw.execute(tree.sql("duckdb")).fetchone()[:2]
    finally:
        raw.close()
    assert released == answer[0][0]
    # the frame's sum before its noise: cents where the release is rounded, within the noise
    # (the cell key's noise on a sum of 4,000 incomes is well under 1 %; 0.1 % was exceeded)
    assert leaked != round(leaked) and abs(leaked - released) < 0.01 * released
    with pytest.raises(InternalError, match="__a0 of protected cells is not a protected value"):
        validate_release(tree, policy)


def test_the_dp_subquery_asked_twice_in_one_statement_is_charged_once(ckm_copy):
    """Held on int49 (kept as a regression): the DP cells are one stage's, charged once and
    released with one noisy value wherever the statement reads them."""
    dp = "(SELECT COUNT(*) FROM benefits WHERE scheme = 'child')"
    ((count, a, b),) = _ask(ckm_copy, f"SELECT COUNT(*), {dp}, {dp} FROM persons")
    assert a == b
    assert _spent(ckm_copy) == 1
    union = _ask(
        ckm_copy,
        f"SELECT COUNT(*), {dp} FROM persons UNION ALL SELECT COUNT(*), {dp} FROM households",
    )
    where = _ask(ckm_copy, f"SELECT COUNT(*), {dp} FROM persons WHERE {dp} > 0")
    ((alone,),) = _ask(ckm_copy, dp[1:-1])
    assert {row[1] for row in union} == {a} and where == [(count, a)] and alone == a
    assert _spent(ckm_copy) == 1


def test_rank_swap_refuses_a_top_share_that_codes_one_value():
    """Fails on int49: 22 values with the default 5 % code floor(1.1) = 1 value at each end
    "to its mean", i.e. leave it, and keep it out of the swap: the file held the largest and
    the smallest value exactly, on the records that have them (the demo's 22 persons aged 94+
    of R01, ``rankswap:income:p=10``: 142,494.58 on its own man of 94). Below 20 values the
    default codes none at all."""
    rng = np.random.default_rng(49)
    df = pd.DataFrame({"income": rng.lognormal(10, 1, 22).round(2)})
    with pytest.raises(MicrodataError, match="top 5 % of 22 values is 1 value"):
        apply_steps(df, [parse_step("rankswap:income:p=10")], secret=b"s" * 32, seed=0)
    with pytest.raises(MicrodataError, match="give top ≥ 9.09"):
        perturb.rank_swap(df["income"].to_numpy(), 10, rng, bottom=10)
    out, _ = apply_steps(
        df, [parse_step("rankswap:income:p=10,top=10,bottom=10")], secret=b"s" * 32, seed=0
    )  # 2 values at each end: coded to their mean, the extremes gone
    assert out["income"].max() < df["income"].max() and out["income"].min() > df["income"].min()
    out, _ = apply_steps(
        df, [parse_step("rankswap:income:p=10,top=0,bottom=0")], secret=b"s" * 32, seed=0
    )  # switched off as the admin asks: a permutation
    assert sorted(out["income"]) == sorted(df["income"])
