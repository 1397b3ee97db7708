"""s44j: red team on CKM magnitudes after s43h (x_delta_j = x_j·ε_j·m(|x_j|), the ptable row at
|x̂/x_delta|, a second contribution below z_s adding nothing): enterprises' turnover and
employees (top_k 2, ε [1, 0.5], fp 1e6) and persons' income (top_k 1, fp 20,000, μ_c 0.5,
sensitive_below 3, mean before sum), as the analyst.

Found (closed in s45a by the policy's ``unit_noise``, the permanent per-unit factor of Evans,
Zayatz & Slanta 1998, on for the demo's persons and enterprises; the attack now converges on
x·m, tests below): **a dominant contributor's value averages out of padded sums, in three
statements.** A sum's noise is keyed by its cell (the set of contributors) and
scaled by its largest contributions, so every cell that holds the target as its largest
contributor draws a new, independent noise of the target's own scale around the exact sum.
``SUM(CASE WHEN (pad_k) OR (target) THEN x END)`` for 16 paddings pad_k of small values (region
× size class of micro and small enterprises; region × sex of persons earning under 20,000),
8 sums per statement, less the paddings' own sums (one GROUP BY), averages to the target's
value: on the 20,000-person demo, 3 statements per target, the turnover of 11 of the 12
largest enterprises that are alone in their nace × region × size class within ±5 % (the
largest, 332,410,235, within 0.31 %; one padded difference alone is within ±5 % in 37 % of
draws), the employees of 6 of 12 (the paddings' own employees are of the same scale), the
income of 10 of the 10 largest earners alone in municipality × age × sex (largest error 3.4 %,
on two builds of the demo; paddings of larger values leave more count noise, (x/n)·(n̂ − n)).
This is the counts' documented "averaging over padded unions" (test_redteam3.py) carried to
magnitudes, where it is much cheaper: the noise of a padded cell is the target's
(x_1·m(x_1)·v, cellKey's definition), whatever the padding, so a few paddings suffice, where
a count needed ~320 queries. Consistent cell-keyed noise cannot prevent it (the published
method, cellKey /
τ-ARGUS, keys every step by the cell key); a fix changes the method: key step j by the record
key of contributor j (and the statistic), so that a target's noise is the same in every cell
it dominates (the permanent per-respondent factor of Evans, Zayatz & Slanta, "Using noise for
disclosure limitation of establishment tabular data", J. Official Statistics 14(4), 1998), or
charge magnitudes to a budget.

Held (tests below, or one line each):
- linear spellings: ``SUM(2x)``, ``SUM(-x)``, ``SUM(x + c)``, ``SUM(x·1e-300)`` are
  post-processing of the one ``SUM(x)`` and ``COUNT(x)`` (same noise, no second draw);
  ``SUM(ABS(x))``, ``LEAST``/``GREATEST``/``ROUND``/``COALESCE``, ``SUM(x + y)``, ``SUM(x·y)``,
  ``SUM(x/y)``, ``FILTER``, ``SUM(DISTINCT x)``, UNION of rows, MAX/MEDIAN/STDDEV refused.
- a ratio of two measures of the same units (turnover/employees by nace × region, 133 cells):
  the noise factors never cancel (smallest |x̂_T/T ÷ x̂_E/E − 1| = 0.0012), each statistic has
  its own salted key.
- the small-cell path: the 162 one-person income cells of R02 shown by municipality × age ×
  sex (of 629): AVG is x̂, never closer than μ_c·p_large = 2.5 % (smallest 4.0 %, 6 within
  5 %), the same cell at the region level or in a coarser filter draws the same noise.
- the same contributors spelled otherwise draw the same noise: ``WHERE region = 'R01'``,
  ``WHERE municipality LIKE 'R01-%'``, ``SUM(CASE WHEN region = 'R01' THEN income END)`` and
  ``GROUP BY ROLLUP(region)``'s total give one value (4 statements).
- noise under the last published bit: of 1,496 sums (income by municipality × sex, region ×
  age, municipality × education; turnover and employees by nace × region, nace × size class,
  region × size class; 7 statements) none is the true (x/n)·n̂ rounded to 18 bits, 15 within
  1e-4 of it, which the analyst cannot tell from the others.
- SUM(x·c) for c = 3e299 / 5e299: the scale is applied to the published sum (inf iff the
  published value overflows), no cut point on the contributions.
"""

from __future__ import annotations

import statistics

import pytest

from sqlsdc.demo.build import demo_policy
from sqlsdc.mechanisms.ckm import MixKeys
from sqlsdc.mechanisms.unit_noise import unit_factor
from sqlsdc.policy import AggregateKind


def _attack(ckm, raw_ckm, table, column, keys, second, pad):
    """The attack's (x, estimate, factor m) on the table's 5 largest values alone in
    their cell of ``keys``: per target, 2 statements of 8 ``SUM(CASE WHEN (pad_k) OR (target)
    THEN x END)`` less the 16 paddings' own sums (``pad`` grouped by region and ``second``,
    one statement shared by all targets), averaged."""
    group = ", ".join(keys)
    targets = raw_ckm.execute(
        f"SELECT {group}, MAX({column}) FROM {table} GROUP BY ALL "
        f"HAVING COUNT(*) = 1 ORDER BY {len(keys) + 1} DESC LIMIT 5"
    ).fetchall()
    base = {
        (r, s): v
        for r, s, v in ckm.execute(
            f"SELECT region, {second}, SUM({column}) FROM {table} WHERE {pad} GROUP BY 1, 2"
        ).fetchall()
        if v is not None
    }
    errors = []
    for *values, truth in targets:
        target = " AND ".join(f"{k} = {v!r}" for k, v in zip(keys, values, strict=True))
        estimates = []
        pads = list(base)
        for start in range(0, len(pads), 8):
            part = pads[start : start + 8]
            sums = ", ".join(
                f"SUM(CASE WHEN (region = '{r}' AND {second} = {s!r} AND {pad}) "
                f"OR ({target}) THEN {column} END)"
                for r, s in part
            )
            for row in ckm.execute(f"SELECT {sums} FROM {table}").fetchall():
                estimates += [v - base[k] for k, v in zip(part, row, strict=True) if v is not None]
        assert len(estimates) >= 12  # no row above when the first sum's cell is not shown
        factor = _factor(raw_ckm, table, column, target)
        errors.append((truth, statistics.mean(estimates), factor))
    return errors


def _factor(raw_ckm, table: str, column: str, target: str) -> float:
    """The permanent factor of the one unit of ``table`` that ``target`` selects, computed by
    the reference (:func:`sqlsdc.mechanisms.unit_noise.unit_factor`) from its record key and
    the database's secret mix, read as an admin would."""

    ((rkey,),) = raw_ckm.execute(f"SELECT __rkey FROM {table} WHERE {target}").fetchall()
    keys = MixKeys(*raw_ckm.execute("SELECT * FROM sqlsdc.ckm_mix").fetchall()[0])
    rule = demo_policy().table(table).rule(AggregateKind.MAGNITUDES)
    return unit_factor(rkey, f"{table}.{column}", rule.magnitude.unit_noise, keys)


def _assert_the_average_is_the_noised_value(attack, unit_noise) -> None:
    """The padded average converges on x·m, not x (s45a, the unit noise of the demo policy):
    every target's limit x·m is at least (a − 1)·x from x, the 5 estimates are nearer x·m than
    x on average, and their mean error to x stays at least 3 %. Before the unit noise, the same
    3 statements per target gave 11 of the 12 largest lone enterprises' turnover and 10 of 10
    top incomes within 5 %."""
    assert len(attack) == 5
    factors = [m for _, _, m in attack]
    assert min(abs(m - 1) for m in factors) >= unit_noise.a - 1 - 1e-12
    # what is left of est/(x·m) − 1 is the paddings' cell noise, ~2 % per target after 16
    # paddings: the mean of the 5 was within 2.4 % of 0 on 16 builds, 5.0 % once in CI (the
    # record keys and the mix are random per build), so it is compared with the error to x
    centred = statistics.mean(abs(est / (x * m) - 1) for x, est, m in attack)
    plain = statistics.mean(abs(est / x - 1) for x, est, _ in attack)
    assert centred < plain, f"the padded average is not nearer x·m ({centred}) than x ({plain})"
    # E|m − 1| is about 0.083 for [1.05, 1.15]: 6.1-12.2 % was seen on 16 builds; 3 % keeps a
    # chance failure near 1 in 1,000
    assert plain >= 0.03, f"the padded average is within {plain:.3f} of the true values"


@pytest.mark.slow
def test_padded_sums_average_to_a_dominant_enterprises_noised_turnover(ckm, raw_ckm):
    keys = ("nace", "region", "size_class")
    pad = "size_class IN ('micro', 'small')"
    attack = _attack(ckm, raw_ckm, "enterprises", "turnover", keys, "size_class", pad)
    rule = demo_policy().table("enterprises").rule(AggregateKind.MAGNITUDES)
    _assert_the_average_is_the_noised_value(attack, rule.magnitude.unit_noise)


@pytest.mark.slow
def test_padded_sums_average_to_a_top_earners_noised_income(ckm, raw_ckm):
    keys = ("municipality", "age", "sex")
    pad = "income > 0 AND income < 20000"  # many small contributions: n̂/n close to 1
    attack = _attack(ckm, raw_ckm, "persons", "income", keys, "sex", pad)
    rule = demo_policy().table("persons").rule(AggregateKind.MAGNITUDES)
    _assert_the_average_is_the_noised_value(attack, rule.magnitude.unit_noise)


def test_linear_spellings_of_a_sum_draw_no_second_noise(ckm):
    """SUM(2x), SUM(-x), SUM(x + c) are the one SUM(x) (and COUNT(x)) scaled: no new draw."""
    rows = ckm.execute(
        "SELECT nace, region, SUM(turnover), SUM(2 * turnover), SUM(-turnover), "
        "SUM(turnover + 5), COUNT(turnover) FROM enterprises GROUP BY 1, 2"
    ).fetchall()
    shown = [r for r in rows if r[2] is not None]
    assert len(shown) >= 50
    for _, _, x, double, minus, shifted, n in shown:
        assert double == pytest.approx(2 * x, rel=1e-12)
        assert minus == pytest.approx(-x, rel=1e-12)
        assert shifted == pytest.approx(x + 5 * n, rel=1e-12)


def test_a_ratio_of_two_measures_of_the_same_units_keeps_both_noises(ckm, raw_ckm):
    """Turnover and employees of one cell have the same contributors but their own keys:
    x̂_T/x̂_E is not T/E (the noise factors do not cancel)."""
    truth = {
        (n, r): (t, e)
        for n, r, t, e in raw_ckm.execute(
            "SELECT nace, region, SUM(turnover), SUM(employees) FROM enterprises GROUP BY ALL"
        ).fetchall()
    }
    rows = ckm.execute(
        "SELECT nace, region, SUM(turnover), SUM(employees) FROM enterprises GROUP BY 1, 2"
    ).fetchall()
    factors = [
        abs((t / truth[(n, r)][0]) / (e / truth[(n, r)][1]) - 1) for n, r, t, e in rows if t and e
    ]
    assert len(factors) >= 50
    assert min(factors) > 1e-6, "a ratio of two measures cancelled its noise"


def test_one_persons_income_is_never_shown_closer_than_its_noise_floor(ckm, raw_ckm):
    """A one-person cell is perturbed with μ_c: |x̂/(x·m) − 1| >= μ_c·p_large = 2.5 % (cellKey's
    ``.perturb_cell_flex`` for a sensitive cell, m(x) >= p_large), AVG being x̂ there, around
    the person's contribution x·m (m the permanent unit factor, s45a)."""
    keys = MixKeys(*raw_ckm.execute("SELECT * FROM sqlsdc.ckm_mix").fetchall()[0])
    noise = demo_policy().table("persons").rule(AggregateKind.MAGNITUDES).magnitude.unit_noise
    truth = {
        (m, a, s): x * unit_factor(k, "persons.income", noise, keys)
        for m, a, s, x, k in raw_ckm.execute(
            "SELECT municipality, age, sex, SUM(income), MIN(__rkey) FROM persons "
            "WHERE region = 'R02' AND income <> 0 GROUP BY ALL HAVING COUNT(*) = 1"
        ).fetchall()
    }
    rows = ckm.execute(
        "SELECT municipality, age, sex, AVG(income) FROM persons "
        "WHERE region = 'R02' AND income <> 0 GROUP BY 1, 2, 3"
    ).fetchall()
    errors = [abs(v / truth[(m, a, s)] - 1) for m, a, s, v in rows if (m, a, s) in truth and v]
    assert len(errors) >= 50
    assert min(errors) >= 0.025 - 1e-9
