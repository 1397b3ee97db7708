"""Red team s47b: the DP query path and its budget (the demo's ``benefits``, ε = 0.1 a count,
0.2 a sum, ``min_frequency: 20``; a copy whose ``persons`` are under DP with one row a person).

The attacker is the analyst of the README. A finding would be an answer without paying (or
paying less), one noise over two exact values (two populations under one cell identity), a
released value of a cell the minimum frequency withholds, or a sensitivity larger than the one
charged.

Finding (fixed; the tests fail on the code before): a DP quantile's permute-and-flip scores
|(b - a) lt - a gt| (alpha = a/b) were int64. A float parameter alpha = 0.1 + 0.2
(0.30000000000000004, b = 10^17) wrapped them past 2^63 in every cell of 93 rows or more and
released the draw of wrapped scores at full price (March's child median 2,668 where 0.3 gives
123; exact 216); alpha = 1e-300 raised OverflowError after the charge (ε 0.2 paid for
nothing, against "a refusal never comes after the charge"). The wrap kept the scores'
sensitivity (|wrap(x)| is x's distance to a multiple of 2^64), so it was a wrong answer, not a
leak. Now an alpha of more than 9 decimal places is refused before anything runs, and scores
that could pass 2^63 (cells of billions of rows) are Python ints.

No leak was found; the other tests keep the angles that held, so that a later change of the
canonical identity, the charge or the join checks does not reopen them:

- 30 pairs of WHERE spellings (BETWEEN with its bounds swapped or SYMMETRIC, ``<>`` against
  IS DISTINCT FROM, ``//`` against ``/``, LIKE/GLOB/ILIKE, NOT's scope, ``% 5 = 1`` against
  ``= -4``, ROUND's digits, floats one ulp apart, ``0.1 + 0.2``, ...): every pair whose
  populations differ has two identities; the pairs with one identity (``IN (1, 2)`` and
  ``IN (2, 1)``, ``= 1`` and ``= 1.0``) have one population (admin, noise off).
- ``?`` against literals: ``month = ?`` with 1 then 2 pays twice; the literal 2 after the
  parameter 2 is free and the same value.
- 8 connections of one user in 8 threads, each asking a new SUM (ε 0.3 with its unit count)
  at once with ε 0.4 left: one answered, 7 refused, the ledger within the limit.
- A cell below the minimum frequency: its AVG's sd and interval (a function of its noisy
  count and sum) are not in ``cell_accuracy``, as its value is NULL.
- A table with one row per person under DP skips the row caps: a join that repeats its rows
  (ON a non-equality, a public table's non-key column, CROSS JOIN, UNION ALL of a public
  table, a constant derived table) multiplied one person's count; each is refused before the
  charge.

Held also (not kept as tests): error oracles in the exact cells (``1/(amount - 2999)``,
``CASE WHEN amount = 2999 THEN 1/0``: NULL, no error; casts refused by the totality check;
a failing cast of a noisy cell fails on the noisy value, free when paid), 38 aggregate shapes
(COUNT(DISTINCT dim), SUM(amount * 1000), SUM(amount - 3000), MEDIAN, VAR, FILTER, ...): each
refused or post-processing of charged statistics; DP aggregations in a CTE, a derived table,
a scalar subquery, IN and EXCEPT all charge the per-table budget too; ``= ANY(?)`` lists
([1, 2], [2, 1], [1, 2, 2] one identity; [1, 3], [1.0, 2.0], ['1', '2'] others, paid); a
release (``seniors_syn``) in a DP WHERE names its data version, so a replaced synthesis
draws fresh noise (8,454 for an exact 8,695, then 17,923 for 17,919); an engine overflow
of a noisy value (``SUM(amount) * 1e35``, ``COUNT(*) * 9223372036854775807``) fails after
the charge and is free when asked again (post-processing of cached cells); ``GROUP BY ()``,
``GROUP BY ALL``, ``GROUP BY region, region``, ROLLUP inside a derived table, GROUPING_ID;
private groups (ε 1/2, δ 1e-6): groups-only, ``COUNT(DISTINCT region)``, ``HAVING``,
``ORDER BY COUNT(*) LIMIT 1`` pay the selection and release nothing below it; private keys
cast to UHUGEINT, UBIGINT, DECIMAL, BLOB or ENUM, or overflowing products, are refused before
the charge (a HUGEINT key is one exact decimal group per value).
"""

from __future__ import annotations

import shutil
import threading
from fractions import Fraction

import numpy as np
import pytest

import sqlsdc
from sqlsdc.catalog.budget import BudgetKey
from sqlsdc.catalog.budget_admin import set_limit
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import BudgetExhausted, PolicyViolation
from sqlsdc.mechanisms.accountant import BudgetLimit
from sqlsdc.policy.load import load_policy


@pytest.fixture
def demo(ckm_db, tmp_path):
    """A copy of the shipped demo (benefits under DP) that a test may spend on."""
    path = tmp_path / "demo.duckdb"
    shutil.copy(ckm_db, path)
    return path


def _spent(con) -> Fraction:
    return sum((b.spent.epsilon for b in con.remaining_budget() if b.key.user != "*"), Fraction(0))


def _scope(con, sql: str) -> tuple:
    return tuple((s.scope, s.keys) for s in con.explain(sql).dp_stages)


def _exact(con, sql: str) -> list:
    return con.execute(sql).fetchall()


COUNT = "SELECT COUNT(*) FROM benefits WHERE "

DIFFERENT = [
    ("month BETWEEN 1 AND 3", "month BETWEEN 3 AND 1"),
    ("month // 2 = 1", "month / 2 = 1"),
    ("scheme LIKE 'c%'", "scheme NOT LIKE 'c%'"),
    ("amount > 1000 OR month = 1", "amount > 1000 AND month = 1"),
    ("NOT (month = 1 AND scheme = 'child')", "NOT month = 1 AND scheme = 'child'"),
    ("month % 5 = 1", "month % 5 = -4"),
    ("round(amount) > 1000", "amount > 1000"),
    ("round(amount, -2) > 1000", "round(amount, 2) > 1000"),
    ("abs(amount - 1500) < 100", "amount - 1500 < 100"),
    ("scheme = 'child'", "scheme = 'CHILD'"),
    ("scheme = 'child'", "scheme = 'child '"),
    ("amount > 1000", "amount > 1000.5"),
]


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_where_spellings_of_two_populations_have_two_identities(demo, a, b):
    """One identity over two populations would draw one noise over two exact values (their
    difference exact, or the second answered from the first's cache)."""
    with sqlsdc.connect(demo, "admin") as admin:
        admin.set_dp_noise(False)
        assert _exact(admin, COUNT + a) != _exact(admin, COUNT + b)
        assert _scope(admin, COUNT + a) != _scope(admin, COUNT + b)


@pytest.mark.parametrize(("a", "b"), [("month IN (1, 2)", "month IN (2, 1)"),
                                      ("month = 1", "month = 1.0")])  # fmt: skip
def test_where_spellings_of_one_identity_have_one_population(demo, a, b):
    with sqlsdc.connect(demo, "admin") as admin:
        admin.set_dp_noise(False)
        assert _scope(admin, COUNT + a) == _scope(admin, COUNT + b)
        assert _exact(admin, COUNT + a) == _exact(admin, COUNT + b)


def test_a_parameter_is_the_cell_of_its_value(demo):
    with sqlsdc.connect(demo, "analyst") as con:
        spent = [_spent(con)]
        first = con.execute(COUNT + "month = ?", [1]).fetchall()
        spent.append(_spent(con))
        second = con.execute(COUNT + "month = ?", [2]).fetchall()
        spent.append(_spent(con))
        literal = con.execute(COUNT + "month = 2").fetchall()
        spent.append(_spent(con))
    paid = [b - a for a, b in zip(spent, spent[1:], strict=False)]
    assert paid[0] > 0 and paid[1] == paid[0]  # the value 2 is a new cell, paid
    assert paid[2] == 0 and literal == second  # the literal 2 is the parameter 2's cell
    assert first != second


def test_concurrent_connections_of_one_user_never_spend_past_the_limit(demo):
    """Each connection's kept budget state (``_charge_known``) is stale once another charged:
    8 new statistics of ε 0.3 at once with ε 0.4 left answer one."""
    with sqlsdc.connect(demo, "analyst") as con:
        start = _spent(con)
    with open_database(demo) as raw:
        set_limit(raw, admin="admin", key=BudgetKey("analyst"),
                  limit=BudgetLimit(start + Fraction(20, 10)), reason="s47b")  # fmt: skip
    cons = [sqlsdc.connect(demo, "analyst") for _ in range(8)]
    try:
        for i, con in enumerate(cons):  # each keeps a state (0.2 each, 1.6 in all)
            con.execute(COUNT + f"month = {i + 1}").fetchall()
        assert _spent(cons[0]) == start + Fraction(16, 10)
        outcome: list = [None] * 8
        together = threading.Barrier(8)

        def ask(i: int) -> None:
            together.wait()
            sql = f"SELECT SUM(amount) FROM benefits WHERE month = {i + 1} AND region = 'R01'"
            try:
                outcome[i] = cons[i].execute(sql).fetchall()
            except BudgetExhausted as e:
                outcome[i] = e

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        answered = [o for o in outcome if not isinstance(o, BudgetExhausted)]
        assert len(answered) == 1
        assert _spent(cons[0]) == start + Fraction(19, 10)
    finally:
        for con in cons:
            con.close()


def test_a_withheld_cell_gives_no_accuracy(demo):
    """An AVG's sd is a function of its cell's noisy count and sum: a cell below the minimum
    frequency shows neither, nor its interval."""
    # housing over the year: hundreds of recipients a cell, shown whatever the noise; the
    # other schemes' payments over 1,800 in January: a few a cell, withheld but for a draw
    # of the noise (January alone gave cells of 19-45, none below 20 for some secrets)
    sql = ("SELECT region, scheme, AVG(amount) AS a FROM benefits WHERE scheme = 'housing' "
           "OR (month = 1 AND amount > 1800) GROUP BY region, scheme "
           "ORDER BY region, scheme")  # fmt: skip
    with sqlsdc.connect(demo, "analyst") as con:
        cur = con.execute(sql)
        rows = cur.fetchall()
        accuracy = cur.cell_accuracy()
    withheld = {i for i, (_region, _scheme, a) in enumerate(rows) if a is None}
    assert withheld and len(withheld) < len(rows)  # below 20 recipients (noisy)
    assert withheld.isdisjoint(set(accuracy["row"]))
    assert set(accuracy["row"]) == set(range(len(rows))) - withheld


@pytest.fixture(scope="module")
def persons_dp(ckm_db, tmp_path_factory):
    """The demo with persons (one row a person) under DP: no row caps, so a join that repeats
    rows would multiply a person's contribution past the sensitivity charged."""
    path = tmp_path_factory.mktemp("s47b") / "persons_dp.duckdb"
    shutil.copy(ckm_db, path)
    _version, document, _history = sqlsdc.admin.show(path)
    persons = document["tables"]["persons"]
    persons["protection"] = {"counts": {"method": "dp", "spend": {"epsilon": 1}},
                             "magnitudes": {"method": "dp", "spend": {"epsilon": 1}}}  # fmt: skip
    persons["dp"] = {"granularity": 1, "max_groups": 1, "max_rows": 1}
    persons["columns"]["region"]["domain"] = [f"R0{i}" for i in range(1, 9)]
    for budget in document["budgets"]:
        budget["epsilon"] = 1000
    sqlsdc.admin.apply(path, load_policy(document), user="admin")
    return path


CELL = "WHERE p.region = 'R01' AND p.age = 40"


@pytest.mark.parametrize(
    "joined",
    [
        "JOIN regions r ON r.population > 0",
        "JOIN regions r ON p.region <> r.region",
        "CROSS JOIN regions r",
        ", regions r",
        "JOIN (SELECT region FROM regions UNION ALL SELECT region FROM regions) r "
        "ON p.region = r.region",
        "JOIN (SELECT 1 AS x FROM regions) r ON true",
        "JOIN regions r USING (region) JOIN regions r2 ON r2.population > 0",
    ],
)
def test_a_join_that_repeats_one_row_persons_is_refused_unpaid(persons_dp, joined):
    with sqlsdc.connect(persons_dp, "analyst") as con:
        before = _spent(con)
        with pytest.raises(PolicyViolation):
            con.execute(f"SELECT COUNT(*) FROM persons p {joined} {CELL}").fetchall()
        assert _spent(con) == before


def test_a_join_on_the_public_key_counts_each_person_once(persons_dp):
    with sqlsdc.connect(persons_dp, "admin") as admin:
        admin.set_dp_noise(False)
        alone = admin.execute(f"SELECT COUNT(*) FROM persons p {CELL}").fetchall()
        joined = admin.execute(
            f"SELECT COUNT(*) FROM persons p JOIN regions r ON p.region = r.region {CELL}"
        ).fetchall()
    assert alone == joined


# --- a quantile's alpha of many decimal places --------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "parameters"),
    [
        ("SELECT scheme, QUANTILE_CONT(amount, ?) FROM benefits WHERE month = 3 GROUP BY scheme",
         [0.1 + 0.2]),
        ("SELECT QUANTILE_CONT(amount, 1e-300) FROM benefits WHERE month = 3", None),
        ("SELECT QUANTILE_DISC(amount, 0.0000000001) FROM benefits WHERE month = 3", None),
    ],
)  # fmt: skip
def test_a_quantile_of_more_than_9_decimal_places_is_refused_unpaid(demo, sql, parameters):
    """Finding: the permute-and-flip scores |(b - a) lt - a gt| of alpha = a/b were int64.
    Before: alpha = 0.1 + 0.2 (a float parameter, b = 10^17) wrapped past 2^63 over cells of
    93 rows or more and released the draw of wrapped scores at full price (the child median
    of March 2,668 where 0.3 gives 123, exact 216); alpha = 1e-300 raised OverflowError after
    the charge (ε 0.2 paid for nothing; a refusal never comes after the charge). Now refused
    before anything runs."""
    with sqlsdc.connect(demo, "analyst") as con:
        before = _spent(con)
        with pytest.raises(PolicyViolation, match="more than 9 decimal places"):
            con.execute(sql, parameters).fetchall()
        assert _spent(con) == before


def test_a_quantile_of_9_decimal_places_answers(demo):
    with sqlsdc.connect(demo, "analyst") as con:
        rows = con.execute(
            "SELECT QUANTILE_CONT(amount, 0.999999999) FROM benefits WHERE month = 3"
        ).fetchall()
    assert len(rows) == 1 and 0 <= rows[0][0] <= 3000


def _python_scores(histogram: list[int], alpha: Fraction) -> list[int]:
    a, b = alpha.numerator, alpha.denominator
    out = []
    for j in range(len(histogram)):
        below, above = sum(histogram[:j]), sum(histogram[j + 1 :])
        out.append(abs((b - a) * below - a * above))
    return out


@pytest.mark.parametrize("alpha", [Fraction(1, 10**9), Fraction(3, 10), Fraction(1, 10**300)])
def test_quantile_scores_are_exact_past_int64(alpha):
    """A cell of 3 x 2^40 rows (or any alpha of a long denominator): the scores pass 2^63 and
    are Python ints, not int64 wrapped around (before: a mismatch, or OverflowError)."""
    from sqlsdc.mechanisms.dp_cells import _block_scores, quantile_scores

    histogram = [2**40, 0, 2**40, 2**40 + 5]
    want = _python_scores(histogram, alpha)
    assert [int(x) for x in quantile_scores(histogram, alpha)] == want
    codes = np.zeros(len(histogram), dtype=np.int64)
    bins = np.arange(len(histogram), dtype=np.int64)
    counts = np.array(histogram, dtype=np.int64)
    block = _block_scores(codes, bins, counts, 0, 1, len(histogram) - 1, alpha)
    assert [int(x) for x in block[0]] == want


def test_small_cells_keep_int64_scores():
    from sqlsdc.mechanisms.dp_cells import quantile_scores

    scores = quantile_scores([0, 2, 0, 1, 0], Fraction(3, 10))
    assert scores.dtype == np.int64
    assert scores.tolist() == _python_scores([0, 2, 0, 1, 0], Fraction(3, 10))
