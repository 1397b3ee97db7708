"""Red-team round 3 on protection core v2 (issue 16), written as tests of the SAFE behaviour.

Fixed: conditions on a measure through functions instead of comparisons (``NULLIF(LEAST(income,
x), x) IS NULL``, ``SIGN``, ``LIKE`` on a cast, a simple CASE, ``COUNT(NULLIF(...))``) are
refused: a measure read row by row may only be compared with a class break, tested with IS NULL
or aggregated (``sqlsdc.planner.breaks.check_classed_positions``). Open, and a documented limit
of the cell key method: averaging count noise over many padded unions.

The attacker knows the policy and the public parameters; ``raw_ckm``/``raw`` are used only to
pick targets and to check the answers.
"""

from __future__ import annotations

import pytest

import sqlsdc

# ----------------------------------------------------------------------------- helpers
_PAD = (
    "SELECT COUNT(*) FROM persons WHERE municipality = ? AND (age < 10 OR "
    "(age = ? AND sex = ? AND occupation = ? AND ({cond})))"
)


def _targets(raw, limit: int = 6) -> list[tuple]:
    """Persons unique on (municipality, age, sex, occupation) with an income: the attacker
    knows these four attributes of the target (the quasi-identifiers of a neighbour)."""
    return raw.execute(
        "SELECT municipality, age, sex, occupation, any_value(income) FROM persons "
        "WHERE age BETWEEN 25 AND 65 GROUP BY 1, 2, 3, 4 "
        "HAVING count(*) = 1 AND count(income) = 1 ORDER BY 1, 2, 3, 4 LIMIT ?",
        [limit],
    ).fetchall()


def _padded(con, target, cond: str) -> int:
    m, a, s, o, _ = target
    row = con.execute(_PAD.format(cond=cond), [m, a, s, o]).fetchone()
    return 0 if row is None else row[0]  # a count perturbed to 0 is not shown


# ------------------------ 1. conditions on a measure that are not comparison nodes: bisection
# Each template is true exactly when income >= x (x a literal in cents). None is a comparison
# node, so ``planner.breaks.check_classed_comparisons`` (which only inspects =, <, >, BETWEEN,
# IN, IS [NOT] DISTINCT FROM) never sees the measure being compared with x.
AT_LEAST = [
    "NULLIF(LEAST(income, {x}), {x}) IS NULL",  # LEAST(income, x) = x  <=>  income >= x
    "NULLIF(SIGN(income - {x}), -1) IS NOT NULL",  # sign(income - x) in (0, 1)
    "NULLIF(GREATEST(income, {x}), income) IS NULL",
    "CASE SIGN(income - {x}) WHEN -1 THEN FALSE ELSE TRUE END",  # simple CASE: implicit =
    "IF(NULLIF(SIGN(income - {x}), -1) IS NULL, FALSE, TRUE)",
]


@pytest.mark.parametrize("template", AT_LEAST)
def test_measure_condition_without_a_comparison_node_is_not_a_bisection_oracle(
    ckm, raw_ckm, template
):
    """A padded count (a municipality's children, plus one target if <condition>) is a CKM
    count of one of two unit sets, so each query is one exact bit about the target. Class
    breaks were meant to stop this at the income class, but a condition on the measure written
    without a comparison node (NULLIF, LEAST/GREATEST, SIGN, a simple CASE, IF ... IS NULL)
    passes the check: ~30 queries give the target's exact income to the cent (found on the
    100,000-person demo: 4 of 4 targets exact in 29-30 queries each).
    (planner/breaks.py ``check_classed_comparisons`` looks only at comparison nodes.)"""
    tried = exact = 0
    for target in _targets(raw_ckm):
        income = target[4]
        try:
            q0, q1 = _padded(ckm, target, "FALSE"), _padded(ckm, target, "TRUE")
            if q0 == q1:
                continue  # this padding gives both sets the same noise: choose another
            lo, hi = 0, 200_000_000  # cents
            while hi - lo > 1:
                mid = (lo + hi) // 2
                answer = _padded(ckm, target, template.format(x=f"{mid / 100:.2f}"))
                if answer not in (q0, q1):
                    break
                lo, hi = (mid, hi) if answer == q1 else (lo, mid)
        except sqlsdc.PolicyViolation:
            return  # refused: safe
        tried += 1
        exact += round(lo / 100, 2) == round(income, 2)
    assert exact == 0, f"exact income of {exact} of {tried} targets by bisection"


@pytest.mark.parametrize(
    "condition",
    [
        "CAST(income AS VARCHAR) LIKE '3%'",  # the leading digit: ten queries a digit
        "starts_with(CAST(income AS VARCHAR), '37')",
        "CONCAT(income, '') LIKE '%.91'",
        "CASE income WHEN 37037.91 THEN TRUE ELSE FALSE END",  # simple CASE: equality at any value
        "NULLIF(income, 37037.91) IS NULL",
        "NULLIF(FLOOR(income / 12345.67), 0) IS NULL",
    ],
)
def test_measure_conditions_at_any_value_are_refused(ckm, condition):
    """The same bypass of class breaks without bisection: text functions on a cast measure,
    NULLIF and a simple CASE test a measure at any value (here: equality, a digit, a quotient),
    each one exact bit about a padded target. Only class breaks may be tested."""
    with pytest.raises(sqlsdc.PolicyViolation):
        ckm.execute(
            f"SELECT COUNT(*) FROM persons WHERE region = 'R01' AND ({condition})"
        ).fetchall()


# --------------------- 2. averaging CKM count noise over unions with different known-size sets
@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason=(
        "OPEN, a documented limit of the cell key method (README, threat model): noise fixed per "
        "set of units but independent between sets averages out over many padded unions; "
        "differential privacy is the method that bounds it"
    ),
)
def test_averaging_over_padded_unions_does_not_give_exact_small_counts(ckm, raw_ckm):
    """CKM noise is fixed per set of units but independent between sets, and unbiased with
    variance 3 for every ptable row. So n(A) = n̂(A ∪ B_j) − n̂(B_j) + (v_j − v'_j) for any
    B_j disjoint from A: with 160 different B_j (dimension conditions only, e.g.
    ``age > 41 AND age % 7 = 3 AND education <> 'tertiary'``), the mean has standard deviation
    √(6/160) ≈ 0.19 and rounds to the exact count. Two GROUP BY queries per B_j give every
    municipality at once: on the 100,000-person demo, 321 queries gave the exact count of all
    90 of 90 cells under 10 persons of ``sex = 'F' AND age = 40`` by municipality (the
    published value itself is exact for 16 of them). The test uses 40 B_j (81 queries, a
    standard deviation of √(6/40) ≈ 0.39: P(|error| < 0.5) ≈ 80 %, so about 39 of the ~49 small
    cells exact, binomial sd ≈ 2.8; one run: 40 of 49, the published values exact for 1),
    against a threshold of the published exact ones plus 20 % of the cells (1 + 10; 9 + 10 if
    18 % were exact as on the 100,000-person demo): 7 sd clear of it at worst, so the strict
    xfail holds (160 B_j, then 80, showed the same at four and two times the cost). Nothing
    limits or charges repeated differencing of CKM cells (rewrite/ckm.py: noise per unit set;
    no query-set-size or overlap control)."""
    target = "sex = 'F' AND age = 40"
    truth = dict(
        raw_ckm.execute(
            f"SELECT municipality, COUNT(*) FROM persons WHERE {target} GROUP BY 1"
        ).fetchall()
    )

    def counts(condition: str) -> dict:
        sql = f"SELECT municipality, COUNT(*) FROM persons WHERE {condition} GROUP BY 1"
        return dict(ckm.execute(sql).fetchall())

    educations = ["primary", "lower_secondary", "upper_secondary", "tertiary"]
    pads = [
        f"age > 41 AND age % {p} = {r} AND education <> '{e}'"
        for p in (2, 3, 5, 7, 11, 13)
        for r in range(p)
        for e in educations
    ][:40]
    whole = counts(target)
    estimates = {m: [whole.get(m, 0)] for m in truth}
    try:
        for pad in pads:
            union, alone = counts(f"({target}) OR ({pad})"), counts(pad)
            for m in truth:
                estimates[m].append(union.get(m, 0) - alone.get(m, 0))
    except sqlsdc.PolicyViolation:
        return  # refused (e.g. an overlap or query budget): safe
    small = [m for m, n in truth.items() if n < 10]
    exact = sum(round(sum(estimates[m]) / len(estimates[m])) == truth[m] for m in small)
    published = sum(whole.get(m, 0) == truth[m] for m in small)
    assert len(small) >= 10
    assert exact <= published + 0.2 * len(small), (
        f"exact count of {exact} of {len(small)} small cells by averaging "
        f"(the published values are exact for {published})"
    )
