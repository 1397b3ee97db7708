"""Red team s44i: what the policy tells the attacker of a suppression universe (query path).

1. Policy bounds. An analyst reads the policy (``sqlsdc policy show``), each measure's ``bounds:
   [lo, hi]`` of one value: a hidden sum beside a published count of n units lies in
   [lo * n, hi * n], beside a hidden count up to hi times the largest count the published
   counts allow. The universe's audit assumed [0, inf). Below (employees bounded by [0, 50],
   a 3 x 3 table of three firms per cell), (A, R1) holds 52 employees, one firm of 50;
   nk(1, 60) asks its interval to reach 50 * 100 / 60 = 83.3. On main it was reported protected
   with (A, R3), (B, R1), (B, R3), (C, R1), (C, R3) hidden; (B, R3) holds 148 employees, 2 short
   of its cap, and (C, R1) 15, so the attacker's LP with the bounds put (A, R1) in [0, 69].
   Now the audit knows the bounds: 5 secondaries again, another set (the R1 and R3 totals,
   (A, R3), (C, R1), (C, R3)), and the interval reaches 88.
2. A pattern stored before s44h's fix published sums (and their contributors: SUM / AVG) beside
   hidden counts, which stay published. Such a sum tells its count is at least its contributors
   (and exactly them when the pattern's AVGs told every unit has a value); the counts' audit
   now starts from those bounds, so the count pattern adds suppressions where they prove a
   count short.

Demo (20,000 persons, seed 7, enterprises' employees clamped to [0, 50] and the policy's bounds
[0, 50]): a joint LP over the CUBE(nace, region) answer's counts and employees with the bounds
found no primary short on main either (12 counts, 82 employees primaries; 23 and 128 cells
hidden, the same after the fix): the gap needs a sum near hi * n beside a dominated cell.

Held (one line each):
- demo, employees clamped to and bounded by [0, 50]: one CUBE(nace, region) query, a joint LP
  over its counts and sums (sum <= 50 * count both ways, count >= 1 per listed cell): no count
  or employees primary short of its level (cut to what the bounds allow), main and now.
- demo with the shipped bounds: the same patterns before and after (enterprises 168 cells:
  23 counts, 87 employees, 128 turnover hidden; persons 557 cells: 97 counts, 107 incomes).
- the job (``protect --method suppress``, SUM(employees) by nace x region) on the 3 x 3 table
  above with bounds [0, 50]: a hidden sum's n is hidden too; the joint LP over n and sums put
  (A, R1) in [0, 88], reaching 83.3 (also with (B, R1) of one firm). Jobs unchanged.
- random search, gap 2 (800 random tables, old pattern by the rule before s44h, one firm
  added): no case where the fixed audit refuses a table main protected correctly.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import linprog

from sqlsdc.errors import TabularError
from sqlsdc.tabular.universe import COUNT, EVERY, STATUS, VALUE, Universe
from sqlsdc.tabular.universe_pattern import protect_universe

FIRMS = {  # employees of the three firms in every inner cell
    ("A", "R1"): [50, 1, 1],
    ("A", "R2"): [40, 40, 40],
    ("A", "R3"): [12, 12, 12],
    ("B", "R1"): [15, 15, 15],
    ("B", "R2"): [50, 49, 49],
    ("B", "R3"): [50, 49, 49],
    ("C", "R1"): [5, 5, 5],
    ("C", "R2"): [20, 20, 20],
    ("C", "R3"): [20, 20, 20],
}
HI = 50.0


def _universe(bounds=((("employees", (0.0, HI))),), counts=("freq:3",)) -> Universe:
    return Universe(
        table="enterprises",
        unit="enterprise_id",
        groups=(("nace", ("nace",)), ("region", ("region",))),
        measures=("employees",),
        counts=SimpleNamespace(rules=list(counts), min_frequency=3),
        magnitudes=SimpleNamespace(rules=["nk:1,60", "freq:3"], min_frequency=3),
        secondary="gauss",
        cost="value",
        time_limit=10.0,
        bounds=bounds,
    )


def _cells(firms: dict) -> pd.DataFrame:
    rows = []
    for (nace, region), values in firms.items():
        rows.append({
            "nace": nace, "region": region, "__units": len(values), "__spread": 1,
            "employees__sum": float(sum(values)), "employees__n": len(values),
            "employees__nz": sum(v != 0 for v in values),
            "employees__top": sorted((float(v) for v in values), reverse=True),
        })  # fmt: skip
    return pd.DataFrame(rows)


def _leaves(pattern: pd.DataFrame) -> list[tuple]:
    return [(r.nace, r.region) for r in pattern.itertuples()
            if not pd.isna(r.nace) and not pd.isna(r.region)]  # fmt: skip


def _covers(pattern, leaves) -> np.ndarray:
    return np.array([[(pd.isna(c.nace) or c.nace == a) and (pd.isna(c.region) or c.region == b)
                      for a, b in leaves] for c in pattern.itertuples()], float)  # fmt: skip


def _sum_interval(pattern: pd.DataFrame, cell: tuple) -> tuple[float, float]:
    """The attacker's LP interval of one sum: the published sums, every inner cell's sum in
    [0, HI * its count] (counts as published, or 3 where hidden: every count here is 3)."""
    leaves = _leaves(pattern)
    cover = _covers(pattern, leaves)
    shown = pattern[f"employees{VALUE}"].notna().to_numpy()
    counts = pattern[f"{COUNT}{VALUE}"].to_numpy(dtype=float)
    inner = {(r.nace, r.region): i for i, r in enumerate(pattern.itertuples())}
    cap = [HI * (counts[inner[leaf]] if not math.isnan(counts[inner[leaf]]) else 3)
           for leaf in leaves]  # fmt: skip
    target = cover[inner[cell]]
    out = []
    for sense in (1, -1):
        res = linprog(sense * target, A_eq=cover[shown],
                      b_eq=pattern[f"employees{VALUE}"].to_numpy(dtype=float)[shown],
                      bounds=[(0, c) for c in cap], method="highs")  # fmt: skip
        assert res.status == 0
        out.append(sense * res.fun)
    return out[0], out[1]


def test_the_policy_bounds_are_known_to_the_attacker():
    """(A, R1): 52 employees, one firm of 50; nk(1, 60) asks its interval to reach 83.3. On
    main it was reported protected and an LP with the policy's bounds put it in [0, 69]
    (fails on main); now [0, 88]."""
    pattern, report = protect_universe(_universe(), _cells(FIRMS))
    assert report["aggregates"]["employees"]["audit_passed"]
    assert pattern[f"employees{STATUS}"].iloc[
        [i for i, r in enumerate(pattern.itertuples()) if (r.nace, r.region) == ("A", "R1")]
    ].item() == "primary"  # fmt: skip
    lo, hi = _sum_interval(pattern, ("A", "R1"))
    assert hi >= 50 * 100 / 60 - 1e-6, (lo, hi)


def _old_pattern(universe: Universe, firms: dict) -> pd.DataFrame:
    """The pattern the rule before s44h stored: counts and the measure protected as separate
    tables (each with no other aggregate), its AVGs off (a unit without a value somewhere)."""
    counts, _ = protect_universe(dataclasses.replace(universe, magnitudes=None), _cells(firms))
    sums, _ = protect_universe(dataclasses.replace(universe, counts=None), _cells(firms))
    old = counts.copy()
    for column in sums.columns:
        if column.startswith("employees"):
            old[column] = sums[column]
    old[f"employees{EVERY}"] = False
    return old


OLD = {  # (A, R3) and (C, R3): 3 firms and 120 employees each, their counts hidden, sums shown
    ("A", "R1"): [5, 5],
    ("A", "R2"): [1] * 10,
    ("A", "R3"): [40, 40, 40],
    ("B", "R1"): [15, 15, 15],
    ("B", "R2"): [1] * 10,
    ("B", "R3"): [40, 40, 40],
    ("C", "R1"): [15, 15, 15],
    ("C", "R2"): [1] * 10,
    ("C", "R3"): [40, 40, 40],
}


def test_sums_an_earlier_pattern_showed_beside_hidden_counts_are_known_to_the_counts_audit():
    """A pattern stored by the rule before s44h showed (A, R3)'s and (C, R3)'s employees (120,
    3 contributors) beside their hidden counts: each count is at least 3, so (R3 total 9,
    (B, R3) 3) both are 3, and (A, R1) = 2 firms follows from its row. After a data change (an
    11th firm in (A, R2)), main published a new pattern from whose counts, with "count >= the
    contributors of a shown sum", an LP puts (A, R1) in [2, 2] (the same with a new firm in
    (B, R3), (B, R1) or (C, R1)). The earlier release pinned it; no pattern can hide it again,
    so the universe is refused, saying why (fails on main: a pattern, no error)."""
    universe = _universe(bounds=())
    old = _old_pattern(universe, OLD)
    beside = old[f"{COUNT}{STATUS}"].ne("published") & old[f"employees{STATUS}"].eq("published")
    shown = sorted(zip(old["nace"][beside], old["region"][beside], strict=True))
    assert shown == [("A", "R3"), ("C", "R3")]
    changed = {**OLD, ("A", "R2"): [1] * 11}
    with pytest.raises(TabularError, match="sums beside hidden unit counts") as refusal:
        protect_universe(universe, _cells(changed), earlier=old)
    assert "'nace': 'A', 'region': 'R1'} = 2" in str(refusal.value)
