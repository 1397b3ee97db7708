"""Red team s44o: today's jobs and synthesis changes (session 44, round 2).

1. The suppression JOB's audit (``protect --method suppress`` of a SUM) assumed every hidden
   sum in [0, inf), not the policy's ``bounds: [lo, hi]`` of the measure that an analyst reads
   (``sqlsdc policy show``); s44i fixed the query path only. Below (s44i's 3 x 3 table of three
   firms per cell, employees bounded by [0, 50]), (A, R1) holds 52 employees, one firm of 50;
   nk(1, 60) asks its interval to reach 50 * 100 / 60 = 83.3. A COUNT job of the same rows
   (freq:3) publishes every cell's n = 3, so every hidden sum is at most 150; (B, R3) holds
   148. The sum job hid (A, R3), (B, R1), (B, R3), (C, R1), (C, R3), published (A, R1)'s
   interval as [0, 88], and the attacker's LP with the bounds put it in [0, 69] (2 jobs,
   1 LP). Now the job's audit starts from the bounds (``sum_counts.measure_bounds``, s44i's
   candidate fix): it hides the R1 and R3 totals and (A, R3), (C, R1), (C, R3) instead, and
   the LP reaches 88.
2. Singletons (closed by s46f): GaussSuppression's singleton method ``anySum``, SSBtools'
   default, which s44d runs over the optimal and HiTaS patterns too, lets a published
   combination of singletons with unequal coefficients through once ("subSubSec"). In the 4 x 4
   count table below, r1c2 - r0c1 = 0 follows from the published margins, so the respondent of
   r0c1 (a count of 1) computes r1c2 = 1 exactly, with gauss, optimal and hitas alike. Random
   2-5 x 3-6 count tables (freq:3, seeds 0-99 or 0-299; a singleton's value fixed, an LP per
   other primary): (singleton, primary) pairs computed exactly: gauss 163 (315 singletons),
   optimal 3,144 on main 4bd013d -> 512 now (960 singletons, seeds 0-299), hitas 179 (315).
   SSBtools' ``singletonMethod = "subSpace"`` ("conservative") leaves 0 of 315 with gauss, at
   1,034 hidden cells instead of 874 (+18 %). Since s44p the admin chooses (policy
   ``suppression: singleton``, ``sqlsdc protect --singleton``). Since s46f the default is
   ``anySumAudit`` (tabular/respondents.py): the anySum walk is redone, guarding every
   respondent an exact audit finds computing a primary, until none does; on
   benchmarks/bench_singletons.py's 100 tables (Poisson(3) cells, 237 singletons) gauss goes
   from 131 pairs at 938 hidden cells (anySum) to 0 at 1,045 (subSpace: 0 at 1,104). ``anySum``
   stays for the admin who wants R's patterns, with its residual risk (test below).

Held (one line each):
- synthesis (CART, smoothing on, demo 20,000 persons, seeds 1 and 2, region..income): income
  values equal to an original 13.6 % / 13.9 % on main 4bd013d -> 4.8 % / 4.8 % now; records
  identical to an original 10.5 % / 10.9 % -> 5.5 % / 5.4 %; the maximum income (966,119.86,
  one person) published exactly once per file on main (clipped to the observed range) -> 0
  now (clip at max + h); income values held by one person reproduced 23-28 -> 23-30, the
  chance collisions of smoothed values with 2 decimals (none is the maximum).
- rounding versions (85+ by region x education, base 12): the same cells under another name
  by 7 spellings (COUNT(DISTINCT person_id), ``age > 84``, ``AND person_id > 0``, ``AND income
  IS NOT NULL``, dimensions swapped, region alone, ``AND person_id <> 8``, ``age >= 84``):
  all refused; the first name replaced by another population (age >= 90), then a new name of
  the first population: refused (its readers keep the first version).
- CTA of turnover (employees >= 10) stored twice on the same data: the same 134 cells (one
  differs by 1e-9, float noise): nothing to average.
- synthesis size without --rows: ``WHERE age >= 85``, LIMIT, USING SAMPLE, a derived table,
  UNION ALL of all and a subset: refused; ``WHERE TRUE`` and ``age >= 0 OR age IS NULL``
  (every row) stored.
- cart ``draw=balanced`` under the demo's CKM publishes all 182 municipality counts exactly
  (5 of 1 person, 3 of 2) and 341 of 353 municipality x sex cells: documented as opt-in
  exact (README, Synthetic data), as an anonymised file without a perturbative step of the
  same columns is (stored likewise): the admin's release, not a bypass.
"""

from __future__ import annotations

import duckdb
import pandas as pd
import pytest
from scipy.optimize import linprog

import sqlsdc.admin
from sqlsdc.demo.build import demo_policy
from sqlsdc.jobs.protect import protect_query
from sqlsdc.policy import load_policy
from sqlsdc.tabular.api import protect
from sqlsdc.tabular.rules import FrequencyRule, parse_rule
from tests.security.test_redteam_s44i import FIRMS, HI  # its 3 x 3 table of three firms

TOTAL = "Total"


def _firms_database(db) -> None:
    """The demo database with the enterprises replaced by FIRMS, employees bounded by [0, 50]
    in the policy, and threshold protection (counts of 3 published as they are)."""
    doc = demo_policy().document_dict()
    doc["protection"] = {"min_frequency": 3, "counts": {"method": "threshold"},
                         "magnitudes": {"method": "threshold"}}  # fmt: skip
    for table in doc["tables"].values():
        table.pop("protection", None)
        table.pop("dp", None)
    doc["tables"]["enterprises"]["columns"]["employees"]["bounds"] = [0, HI]
    sqlsdc.admin.apply(db, load_policy(doc, name="bounded"), "admin")
    with duckdb.connect(str(db)) as raw:
        raw.execute("DELETE FROM enterprises")
        firm = 0
        for (nace, region), values in FIRMS.items():
            for value in values:
                firm += 1
                raw.execute(
                    "INSERT INTO enterprises (enterprise_id, holding_id, nace, region, "
                    "size_class, employees, turnover) VALUES (?, ?, ?, ?, 'S', ?, 1000)",
                    [firm, firm, nace, region, value],
                )


def _interval(sums, counts, cell) -> tuple[float, float]:
    """The attacker's LP: the published sums, each inner cell's sum in [0, 50 * its published
    count]."""
    inner = [(a, b) for a, b in zip(sums.nace, sums.region, strict=True) if TOTAL not in (a, b)]
    n = {(a, b): v for a, b, v in zip(counts.nace, counts.region, counts.value, strict=True)}
    rows, values = [], []
    for r in sums.itertuples():
        if r.status == "published":
            rows.append([float(r.nace in (TOTAL, a) and r.region in (TOTAL, b)) for a, b in inner])
            values.append(r.value)
    bounds = [(0.0, HI * n[c]) for c in inner]
    target = [float(c == cell) for c in inner]
    lo = linprog(target, A_eq=rows, b_eq=values, bounds=bounds, method="highs")
    hi = linprog([-t for t in target], A_eq=rows, b_eq=values, bounds=bounds, method="highs")
    assert lo.status == 0 and hi.status == 0
    return lo.fun, -hi.fun


def test_the_suppression_job_knows_the_policy_bounds_of_its_measure(jobs_demo_db):
    """Fails on the integration branch (s44i's fix not applied to jobs): the published count
    job and the bounds put (A, R1) in [0, 69], short of nk(1, 60)'s 83.3; now [0, 88]."""
    _firms_database(jobs_demo_db)
    group = "FROM enterprises GROUP BY nace, region"
    protect_query(jobs_demo_db, "admin", f"SELECT nace, region, COUNT(*) {group}", into="cnt",
                  rules=[parse_rule("freq:3")], time_limit=10)  # fmt: skip
    protect_query(jobs_demo_db, "admin", f"SELECT nace, region, SUM(employees) {group}",
                  into="emp", rules=[parse_rule("nk:1,60"), parse_rule("freq:3")],
                  time_limit=10)  # fmt: skip
    with duckdb.connect(str(jobs_demo_db), read_only=True) as raw:
        counts = raw.execute("SELECT * FROM protected.cnt").df()
        sums = raw.execute("SELECT * FROM protected.emp").df()
    assert (counts.status == "published").all() and set(counts.value) >= {3}
    primary = sums[(sums.nace == "A") & (sums.region == "R1")]
    assert primary.status.item() == "primary"
    lo, hi = _interval(sums, counts, ("A", "R1"))
    assert hi >= HI * 100 / 60 - 1e-6, (lo, hi)
    assert primary.upper_bound.item() <= hi + 1e-6  # the published interval is not wider


COUNTS = [[3, 1, 1, 0], [0, 0, 1, 8], [5, 12, 3, 3], [12, 5, 5, 3]]  # rows r0-r3, columns c0-c3


@pytest.mark.parametrize("singleton", [None, "subSpace", "anySum"])
@pytest.mark.parametrize("method", ["gauss", "optimal", "hitas"])
def test_a_singletons_respondent_computes_another_singleton_only_under_anysum(method, singleton):
    """r0c1 and r1c2 hold one person each (primary); the respondent of r0c1 fixes it at 1 and
    solves the published margins for r1c2: exactly 1 with every method under ``anySum`` (strict
    xfails until s46f, now the admin's opt-in residual risk); an interval under the default
    ``anySumAudit`` (fails on main: the default was anySum) and under ``subSpace`` (s44p).
    On τ-ARGUS's levels (``reach_threshold=False``): with a count's upper level reaching
    ``min_freq`` (s48d), optimal and hitas hide more and even ``anySum`` leaves r1c2 in [0, 5];
    gauss still pins it."""
    people = [(f"r{i}", f"c{j}") for i, row in enumerate(COUNTS) for j, k in enumerate(row)
              for _ in range(k)]  # fmt: skip
    chosen = {} if singleton is None else {"singleton_method": singleton}
    out = protect(pd.DataFrame(people, columns=["r", "c"]), ["r", "c"], None,
                  rules=[FrequencyRule(3, reach_threshold=False)], method=method,
                  time_limit=10, **chosen)  # fmt: skip
    out = out.reset_index(drop=True)
    inner = [k for k in range(len(out)) if TOTAL not in (out.r[k], out.c[k])]
    rows, values = [], []
    for r in out.itertuples():
        if r.status == "published":
            rows.append([float(r.r in (TOTAL, out.r[k]) and r.c in (TOTAL, out.c[k]))
                         for k in inner])  # fmt: skip
            values.append(float(r.value))
    cell = {(out.r[k], out.c[k]): i for i, k in enumerate(inner)}
    assert out.status[inner[cell["r0", "c1"]]] == out.status[inner[cell["r1", "c2"]]] == "primary"
    bounds = [(1.0, 1.0) if i == cell["r0", "c1"] else (0.0, None) for i in range(len(inner))]
    target = [float(i == cell["r1", "c2"]) for i in range(len(inner))]
    lo = linprog(target, A_eq=rows, b_eq=values, bounds=bounds, method="highs").fun
    hi = -linprog([-t for t in target], A_eq=rows, b_eq=values, bounds=bounds, method="highs").fun
    if singleton == "anySum":
        assert hi - lo < 1e-6, (lo, hi)
    else:
        assert hi - lo > 0.5, (lo, hi)
