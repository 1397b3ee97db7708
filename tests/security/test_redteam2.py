"""Red-team round 2 on protection core v2 (issue 16): attacks that worked on the first build of
the new core, written as tests of the SAFE behaviour. Fixed since: the union crash, the two
known-valued-statistic attacks (statistic keys now go through a secret mix,
``sqlsdc.mechanisms.ckm.statistic_key``) and the bisection through a padded count (conditions
on measures take class breaks only, ``sqlsdc.planner.breaks``).

The attacker knows the policy and therefore the perturbation tables (public parameters; the tests
read them from the catalog through ``raw_ckm`` only as a shortcut for regenerating them) and the
statistic salts (``sqlsdc.mechanisms.ckm.statistic_salt`` is a public hash).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import sqlsdc
from sqlsdc.demo.build import demo_policy
from sqlsdc.mechanisms.ckm import Lookup, perturb_magnitude, statistic_salt
from sqlsdc.policy import AggregateKind

M = 2**32


def magnitude_key(cell_key: int, statistic: str) -> int:
    """The attacker's model of a statistic's key: the cell key plus the public salt (what the
    build this attack was found on did; statistic keys now go through a secret mix)."""
    return (cell_key + statistic_salt(statistic)) % M


# ---------------------------------------------------------------------------------- helpers
def _ptables(raw) -> dict[tuple[int, float], list[tuple[float, int, int]]]:
    """(v, lo, hi) per (ptable_id, row i): ptable 1 counts (D 5, V 3, js 2), 2 magnitudes."""
    table: dict[tuple[int, float], list[tuple[float, int, int]]] = {}
    for pid, i, v, lo, hi in raw.execute(
        "SELECT ptable_id, i, v, lo, hi FROM sqlsdc.ptable_entries ORDER BY ptable_id, i, lo"
    ).fetchall():
        table.setdefault((int(pid), float(i)), []).append((float(v), int(lo), int(hi)))
    return table


def _count_noise(pt, n: int, key: int) -> int:
    row = pt[(1, float(min(n, max(i for p, i in pt if p == 1))))]
    return next(int(v) for v, lo, hi in row if lo <= key < hi)


def _key_from_v(pt, v: float, step: int = 12) -> int | None:
    """The magnitude ptable's last row maps each key to v_entry + (u − ½)/step, u the key's place
    in its entry: a continuous, invertible function of the key. Back to the exact key."""
    row = pt[(2, max(i for p, i in pt if p == 2))]
    value, lo, hi = min(row, key=lambda e: abs(e[0] - v))
    u = (v - value) * step + 0.5
    if not -1e-9 <= u < 1 + 1e-9:
        return None
    return round(lo + u * (hi - lo))


def _magnitude_lookup(pt) -> Lookup:
    rows = [("all", i, v, lo, hi) for (p, i), es in pt.items() if p == 2 for v, lo, hi in es]
    return Lookup(*(np.array(c) for c in zip(*rows, strict=True)), step=12)


def _cell_key_from_known_average(pt, avg: float, n: int, known_sum: float, top: float):
    """The cell key of a cell whose SUM(age) is known (ages fixed by the WHERE): the published
    AVG·n − x is ±δ·(μ + |v|) with δ = 0.2·top (public flex function), v is continuous in the
    key (spread), so the key comes out exactly."""
    mu = 0.5 if n < 3 else 0.0
    t = (avg * n - known_sum) / (0.2 * top)
    if abs(t) < mu:
        return None
    key = _key_from_v(pt, math.copysign(abs(t) - mu, t))
    return None if key is None else (key - statistic_salt("sum:persons.age")) % M


# ------------------------- 1. a known-valued magnitude gives the cell key: exact incomes
@pytest.mark.slow
def test_known_valued_average_does_not_reveal_the_cell_key_and_an_exact_income(ckm, raw_ckm):
    """AVG(age) of a cell whose ages the WHERE fixes has a known true value, so its published
    value gives the noise, v + (u − ½)/12 — and since u is the key's place inside its (public,
    monotone) ptable entry, the noise is an invertible function of the salted cell key: the key
    (Σ rkey + public salt) comes out to the integer. The same records' other statistics use the
    same key plus another public salt, so AVG(income) of the same cell is then a known function
    of the income and inverts to the cent. One query per target: a target unique on
    (municipality, age, sex, occupation), padded with the municipality's 5-year-olds without
    income. (mechanisms/ckm.py ``Lookup.interpolated`` / rewrite/ckm.py ``_spread``: u is not
    independent of the key; ``statistic_salt`` is a public offset of one shared key.)"""
    pt = _ptables(raw_ckm)
    main = _magnitude_lookup(pt)
    magnitude = demo_policy().table("persons")
    magnitude = magnitude.rule(AggregateKind.MAGNITUDES).magnitude
    targets = raw_ckm.execute(
        "SELECT * FROM (SELECT municipality, age, sex, occupation, any_value(income) AS x "
        "FROM persons WHERE age BETWEEN 25 AND 65 GROUP BY ALL "
        "HAVING count(*) = 1 AND count(income) = 1) AS t "
        "ORDER BY hash(municipality, age, sex, occupation) LIMIT 25"
    ).fetchall()

    def invert(xhat: float, key: int, n: int, nhat: int) -> float:
        lo, hi = 0.0, 3 * xhat + 10
        for _ in range(200):
            mid = (lo + hi) / 2
            if perturb_magnitude(mid, [mid], key, n, magnitude, main, protected=nhat) < xhat:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    tried = exact = 0
    for m, a, s, o, income in targets:
        rows = ckm.execute(
            "SELECT COUNT(*), AVG(age), AVG(income) FROM persons WHERE municipality = ? AND "
            "((age = 5 AND income = 0) OR (age = ? AND sex = ? AND occupation = ?))",
            [m, a, s, o],
        ).fetchall()
        if not rows or rows[0][1] is None or rows[0][2] is None:
            continue
        nhat, avg_age, avg_income = rows[0]
        tried += 1
        found = set()
        for n in range(max(1, nhat - 5), nhat + 6):
            key = _cell_key_from_known_average(pt, avg_age, n, 5 * (n - 1) + a, max(a, 5))
            if key is None or n + _count_noise(pt, n, key) != nhat:
                continue
            x = invert(avg_income * n, magnitude_key(key, "sum:persons.income"), n, nhat)
            if abs(x * 100 - round(x * 100)) < 1e-3:
                found.add(round(x, 2))
        exact += found == {income}
    assert tried >= 10
    assert exact <= 0.2 * tried, f"exact income of {exact} of {tried} targets, one query each"


# --------------------------- 2. the same key gives the exact count of small cells
def test_known_valued_average_does_not_reveal_exact_small_counts(ckm, raw_ckm):
    """The cell key recovered from AVG(age) under ``WHERE age = a`` (test 1) fixes the count
    noise too: for each candidate n in n̂ ± 5 the key is recovered and the count ptable must give
    n + v = n̂. Most small cells come out with one candidate, the true count.

    Four ages (40-43), about 215 small cells: with the record keys new on every build, one age
    (about 46 cells) left the margin 2 standard deviations above the mean (exact 2-12 of 46
    over 30 builds, one CI run 13 against 12.5), a failure in about one build of forty; over
    four ages, 30 builds gave 20-44 exact (chance 9-23) against a margin of about 69."""
    pt = _ptables(raw_ckm)
    rng = np.random.default_rng(16)
    small = exact = chance = 0
    for age in (40, 41, 42, 43):
        sql = (
            f"SELECT municipality, sex, COUNT(*), AVG(age) FROM persons WHERE age = {age} "
            "GROUP BY municipality, sex"
        )
        truth = {
            (m, s): n
            for m, s, n in raw_ckm.execute(
                f"SELECT municipality, sex, COUNT(*) FROM persons WHERE age = {age} GROUP BY ALL"
            ).fetchall()
        }
        for m, s, nhat, avg in ckm.execute(sql).fetchall():
            if avg is None or truth[(m, s)] >= 10:
                continue
            small += 1
            candidates, guessed = [], []
            for n in range(max(1, nhat - 5), nhat + 6):
                key = _cell_key_from_known_average(pt, avg, n, age * n, age)
                if key is not None and n + _count_noise(pt, n, key) == nhat:
                    candidates.append(n)
                # the same test with a key drawn at random: what the procedure gets by chance
                if n + _count_noise(pt, n, int(rng.integers(M))) == nhat:
                    guessed.append(n)
            exact += candidates == [truth[(m, s)]]
            chance += guessed == [truth[(m, s)]]
    assert small >= 80
    # with the cell key recoverable the attack got 55-60 % of the small cells exact; now the
    # recovered "key" must do no better than a random one, up to a margin of a quarter of the
    # cells (the known-valued sum's noise still narrows n a little: about 15 % exact, see above)
    assert exact <= chance + 0.25 * small, f"exact count of {exact} of {small} (chance {chance})"


# ------------------ 3. a CKM count of padding ∪ {target if income > x}: bisection oracle
def test_padded_count_with_a_condition_on_the_target_is_not_a_bisection_oracle(ckm, raw_ckm):
    """CKM gives one noisy value per set of units, and a WHERE could test a measure at any
    threshold: a count of a padding cell plus one target under ``income > x`` took one of two
    values, the padding's or the padding-with-target's, so each query was one exact bit of the
    target's income (~30 queries gave it to the cent). Conditions on measures now take class
    breaks only (``sqlsdc.planner.breaks``): a bisection stops at the income class."""
    m, a, s, o = raw_ckm.execute(
        "SELECT municipality, age, sex, occupation FROM persons WHERE age BETWEEN 25 AND 65 "
        "AND income IS NOT NULL GROUP BY ALL HAVING count(*) = 1 LIMIT 1"
    ).fetchone()
    sql = (
        "SELECT COUNT(*) FROM persons WHERE municipality = ? AND (age < 10 OR "
        "(age = ? AND sex = ? AND occupation = ? AND income > ?))"
    )
    for x in (-1.0, 12_345.67, 49_999.0, 1e12):
        with pytest.raises(sqlsdc.PolicyViolation, match="class breaks"):
            ckm.execute(sql, [m, a, s, o, x])
    for x in (0, 20_000, 50_000, 100_000):  # the classes remain askable
        assert ckm.execute(sql, [m, a, s, o, x]).fetchall()


# ---------------------------- 4. accepted queries that crash with an internal error
@pytest.mark.parametrize(
    "sql",
    [
        "SELECT x FROM (SELECT COUNT(*) AS x FROM persons WHERE region = 'R01' UNION ALL "
        "SELECT COUNT(*) FROM persons WHERE region = 'R01') AS t",
    ],
)
def test_union_in_a_derived_table_is_answered_or_refused(ckm, sql):
    """A UNION ALL of two protected aggregations inside a derived table crashes the guard:
    ``InternalError: AttributeError: 'Scope' object has no attribute 'union_scopes'``."""
    try:
        ckm.execute(sql).fetchall()
    except sqlsdc.PolicyViolation:
        pass
    except sqlsdc.InternalError as bug:  # pragma: no cover - the failure this test documents
        pytest.fail(f"internal error on an accepted query: {bug}")
