"""What a pinned mean tells of a small count, and what the mean floor costs (red team s40a, O2).

A sum of values the query pins (``SUM(age)`` by municipality x age) publishes its mean
``a + d/n``. With cellKey's noise alone (``--cellkey``: ``mean_below`` 0) d is scaled by the
largest value a for every n, so the mean's noise shrinks as 1/n and μ_c marks cells under 3;
with the floor (the policy's ``mean_below``, 18 for the demo) a cell whose protected count is
under it is perturbed as n times a cell of one contribution, its mean. For both, on one demo
database:

- the attack: from the published count n̂ and mean, the true counts the ptables allow
  (``proven``: all below 3 while n̂ >= 3; ``exact``: one candidate), and the posterior mode
  with the ptables' probabilities and a flat prior, against the count alone, on cells under 10;
- the utility: the mean relative error |x̂ − x|/x of ``SUM(income)`` by region x age band
  (ten-year bands), by municipality x age band, and of ``SUM(age)`` by municipality x age.

Usage: python benchmarks/ckm_pinned_mean.py [--persons 20000] [--seed 7]
(runs itself once more with ``--cellkey`` in a subprocess, on the same database file).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import sqlsdc
from sqlsdc.demo.build import build_demo_database
from sqlsdc.engines.duckdb import open_database
from sqlsdc.mechanisms.ptable import count_ptable, magnitude_ptable

COUNTS = count_ptable(5, 3, js=2)
P_SMALL, MU_C, SENSITIVE_BELOW = 0.2, 0.5, 3
BAND = "CASE WHEN age < 20 THEN 0 WHEN age < 40 THEN 1 WHEN age < 60 THEN 2 ELSE 3 END"
UTILITY = {
    "SUM(income) by region x age band": (
        f"SELECT region, {BAND} b, SUM(income) FROM persons GROUP BY 1, 2"
    ),
    "SUM(income) by municipality x age band": (
        f"SELECT municipality, {BAND} b, SUM(income) FROM persons GROUP BY 1, 2"
    ),
    "SUM(age) by municipality x age": (
        "SELECT municipality, age, SUM(age) FROM persons WHERE age > 0 GROUP BY 1, 2"
    ),
}


def _count_likelihood(shown: int, n: int) -> float:
    row = min(n, 8)
    return sum(r.p for r in COUNTS.rows if r.i == row and n + int(r.v) == shown)


def _noise_density():
    """The density of |V| for the last magnitude ptable row (a pinned value's a = 1/0.2 = 5 is
    capped at D = 4), each v spread uniformly over ±1/24."""
    entries = [(float(r.v), r.p) for r in magnitude_ptable(4, 1, step=12).rows if r.i == 4]

    def signed(w: float) -> float:
        return sum(12 * p for v, p in entries if abs(w - v) <= 1 / 24)

    return lambda w: signed(w) + signed(-w) if w >= 0 else 0.0


def attack(con, raw, floor: int) -> dict:
    truth = {
        (m, a): n
        for m, a, n in raw.execute(
            "SELECT municipality, age, COUNT(*) FROM persons WHERE age > 0 GROUP BY 1, 2"
        ).fetchall()
    }
    shown = con.execute(
        "SELECT municipality, age, COUNT(*), SUM(age) FROM persons WHERE age > 0 GROUP BY 1, 2"
    ).fetchall()
    density = _noise_density()
    out = Counter()
    for m, a, published, total in shown:
        if not published:
            continue
        n_true = truth[(m, a)]
        r = abs(total / published - a) / (P_SMALL * a)
        post, alone = {}, {}
        for n in range(1, published + 6):
            lc = _count_likelihood(published, n)
            if not lc:
                continue
            if published < floor or n == 1:  # as one contribution: one density for all n
                lm = density(r - MU_C)
            else:  # cellKey: noise of the largest value a, the mean's shrinks as 1/n
                lm = n * density(n * r - (MU_C if n < SENSITIVE_BELOW else 0.0))
            alone[n] = lc
            if lm > 0:
                post[n] = lc * lm
        small = n_true < 10
        out["cells"] += 1
        out["small"] += n_true < SENSITIVE_BELOW
        out["proven"] += bool(post) and max(post) < SENSITIVE_BELOW
        out["exact"] += len(post) == 1
        out["under 10"] += small
        if post and small:
            total_p = sum(post.values())
            mode = max(post, key=post.get)
            out["mode right"] += mode == n_true
            out["alone right"] += max(alone, key=alone.get) == n_true
            out["sure"] += post[mode] / total_p > 0.9
            out["sure right"] += post[mode] / total_p > 0.9 and mode == n_true
    return dict(out)


def utility(con, raw) -> dict:
    out = {}
    for name, sql in UTILITY.items():
        exact = {(g, b): x for g, b, x in raw.execute(sql).fetchall()}
        shown = [(x, exact[(g, b)]) for g, b, x in con.execute(sql).fetchall()]
        errors = [abs(x - e) / e for x, e in shown if e]  # cells of children: income 0
        out[name] = {"cells": len(errors), "mean relative error": sum(errors) / len(errors)}
    return out


def measure(path: Path, cellkey: bool) -> dict:
    if cellkey:  # the policy as loaded with cellKey's noise in every cell
        import sqlsdc.policy.load as load

        load.mean_below = lambda counts: 0
    raw = open_database(path)
    try:
        with sqlsdc.connect(path, "analyst") as con:
            floor = con.policy.table("persons").protection
            floor = next(r.magnitude.mean_below for r in floor.values() if r.magnitude)
            return {"mean_below": floor, "attack": attack(con, raw, floor), **utility(con, raw)}
    finally:
        raw.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--persons", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--db")
    parser.add_argument("--cellkey", action="store_true")
    args = parser.parse_args()
    if args.db:
        print(json.dumps(measure(Path(args.db), args.cellkey)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "demo.duckdb"
        build_demo_database(path, persons=args.persons, seed=args.seed)
        before = subprocess.run(
            [sys.executable, __file__, "--db", str(path), "--cellkey"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        after = measure(path, cellkey=False)
    print(json.dumps({"cellKey": json.loads(before), "floor": after}, indent=1))


if __name__ == "__main__":
    main()
