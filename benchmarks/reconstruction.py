"""A linear reconstruction attack (Dinur & Nissim 2003) on protected counts and sums, scored.

The attacker has an analyst's guarded connection only. It asks many counts (or sums) of
overlapping sub-populations of one municipality, ``municipality = M AND age IN (S_i) AND
education = 'tertiary'`` for random halves ``S_i`` of the ages 0..99, and solves the noisy
answers by bounded least squares (``scipy.optimize.lsq_linear``) for x_a, the number of tertiary
persons of age a in M. Answers with bounded noise to many different populations reconstruct the
data ("the fundamental law of information recovery", Dwork & Roth 2014, section 8.1): the cell
key method gives the same noise to the same population only, and every subset is another one.

Variants (``--variant``): ``in`` (the IN lists above), ``padded`` (each subset OR a fixed large
population P, another municipality: every count is large, P's count is one more unknown),
``ranges`` (``age BETWEEN a AND b``), ``partition`` (``GROUP BY CASE WHEN age IN (S) ...``: two
cells, a subset and its complement, per statement) and ``sum`` (``SUM(income)`` over the subsets,
unknown the total income per age: with the demo's per-unit factors m of 0.85-0.95 or 1.05-1.15 it
recovers sum(x·m), reported as its relative error against the true sum).

Scored with the raw data (the tester's, never the attacker's): ages whose count was recovered
exactly (of 100, and of the ages present in M), and the persons of M whose education the
recovered counts decide (their age's count 0 or all of them) correctly, against the baseline of
guessing the municipality's majority (nobody tertiary). Refusals (a cell limit, a threshold)
are counted; the attack solves what it got.

Usage: python benchmarks/reconstruction.py [--db PATH] [--persons 20000] [--queries 400]
       [--variant in|padded|ranges|partition|sum|all] [--municipality R01-M001]
       [--method ckm|threshold|dp] [--no-limits]
Builds the demo database in a temporary directory unless --db is given (the demo policy: CKM
counts and sums and its cell limits; --method threshold or dp protects persons so, --no-limits
drops the limits). Runs in about a minute of CPU with the defaults.

Measured (20,000 persons, R01-M001: 35 persons, 30 ages, 14 with tertiary persons; majority
guess decides 20 of 35 persons): without limits, 100 counts -> 90/100 ages exact, 300 -> 98
(28 persons), partition 300 statements -> 100/100 (30 persons), padded 300 -> 95/100, sum 300
-> median relative error 16% per age (4 of 28 within 5%, 13 within 15%: x·m, not x). With the
demo's limit (200 cells of persons a day) the attack stops at 200 cells, enough for 95/100
ages (27 persons decided; padded 96/100, partition 94/100). Under DP (--method dp: ε 0.1 a
count, budget 10) 100 answers, then the budget: 78/100, worse than guessing (86/100).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
from scipy.optimize import lsq_linear

import sqlsdc
from sqlsdc.errors import Error

AGES = list(range(100))


def _subset_sql(variant: str, m: str, subset: list[int], pad: str, rng: random.Random):
    """The statement of one subset and the row(s) of the design matrix its answer(s) read."""
    listed = ",".join(map(str, subset))
    where = f"municipality = '{m}' AND education = 'tertiary'"
    if variant == "in":
        return f"SELECT COUNT(*) FROM persons WHERE {where} AND age IN ({listed})", [subset]
    if variant == "padded":
        sql = (f"SELECT COUNT(*) FROM persons WHERE education = 'tertiary' AND ((municipality = "
               f"'{m}' AND age IN ({listed})) OR municipality = '{pad}')")  # fmt: skip
        return sql, [subset + ["pad"]]
    if variant == "ranges":
        a = rng.randrange(0, 99)
        b = rng.randrange(a + 1, 100)
        sql = f"SELECT COUNT(*) FROM persons WHERE {where} AND age BETWEEN {a} AND {b}"
        return sql, [list(range(a, b + 1))]
    if variant == "partition":
        rest = [a for a in AGES if a not in subset]
        sql = (f"SELECT CASE WHEN age IN ({listed}) THEN 'a' ELSE 'b' END AS part, COUNT(*) "
               f"FROM persons WHERE {where} GROUP BY part")  # fmt: skip
        return sql, {"a": subset, "b": rest}
    if variant == "sum":
        sql = (f"SELECT SUM(income) FROM persons WHERE municipality = '{m}' AND age IN "
               f"({listed})")  # fmt: skip
        return sql, [subset]
    raise ValueError(variant)


def attack(con, variant: str, m: str, queries: int, pad: str, seed: int = 7) -> dict:
    """Ask ``queries`` statements of ``variant`` and solve them; returns the estimate per age."""
    rng = random.Random(seed)
    columns = AGES + (["pad"] if variant == "padded" else [])
    rows, answers, refused, reasons = [], [], 0, set()
    started = time.process_time()
    wall = time.time()
    for _ in range(queries):
        subset = sorted(rng.sample(AGES, 50))
        sql, design = _subset_sql(variant, m, subset, pad, rng)
        try:
            result = con.execute(sql).fetchall()
        except Error as refusal:
            refused += 1
            reasons.add(str(refusal).split(";")[0][:160])
            continue
        if isinstance(design, dict):  # a partition: one cell per part
            pairs = [(design[k], v) for k, v in result if k in design]
        else:
            pairs = [(design[0], result[0][0])] if result else []
        for members, value in pairs:
            if value is None:
                continue
            rows.append([1.0 if c in members else 0.0 for c in columns])
            answers.append(float(value))
    estimate = None
    if rows:
        upper = 1e9 if variant == "sum" else 50
        bounds = (np.zeros(len(columns)), np.full(len(columns), upper))
        if variant == "padded":
            bounds[1][-1] = 1e6
        estimate = lsq_linear(np.array(rows), np.array(answers), bounds=bounds).x[: len(AGES)]
    return {"estimate": estimate, "answered": len(answers), "refused": refused,
            "reasons": sorted(reasons), "cpu_s": time.process_time() - started,
            "wall_s": time.time() - wall}  # fmt: skip


def score(raw, variant: str, m: str, estimate) -> dict:
    """How much of the truth ``estimate`` recovered, and the majority baseline's share."""
    if variant == "sum":
        truth = dict(raw.execute("SELECT age, SUM(income) FROM persons WHERE municipality = ? "
                                 "GROUP BY age", [m]).fetchall())  # fmt: skip
        present = [a for a in AGES if truth.get(a)]
        if estimate is None:
            return {"ages_within_5pct": 0, "ages_present": len(present)}
        errors = [abs(estimate[a] - truth[a]) / truth[a] for a in present]
        return {"ages_present": len(present),
                "ages_within_5pct": sum(e <= 0.05 for e in errors),
                "ages_within_15pct": sum(e <= 0.15 for e in errors),
                "median_rel_error": float(np.median(errors))}  # fmt: skip
    counts = raw.execute(
        "SELECT age, COUNT(*), COUNT(*) FILTER (WHERE education = 'tertiary') FROM persons "
        "WHERE municipality = ? GROUP BY age", [m]).fetchall()  # fmt: skip
    size = {a: n for a, n, _ in counts}
    tertiary = {a: t for a, _, t in counts}
    truth = np.array([tertiary.get(a, 0) for a in AGES])
    got = np.full(len(AGES), -1) if estimate is None else np.rint(estimate).astype(int)
    exact = got == truth
    persons = sum(size.values())
    decided = sum(size[a] for a in size if exact[a] and tertiary[a] in (0, size[a]))
    majority = sum(size[a] - tertiary[a] for a in size)  # guess: nobody is tertiary
    return {"ages_exact": int(exact.sum()), "of_ages": len(AGES),
            "present_ages_exact": int(sum(exact[a] for a in size)), "present_ages": len(size),
            "persons": persons, "persons_decided": decided,
            "share_decided": round(decided / persons, 3),
            "baseline_majority": round(majority / persons, 3)}  # fmt: skip


def _policy(args):
    """The demo policy, its persons protected by ``args.method``, without its cell limits
    with ``args.no_limits``."""
    from sqlsdc.demo.build import demo_policy
    from sqlsdc.policy import load_policy

    document = demo_policy().document_dict()
    if args.no_limits:
        document.pop("cell_limits", None)
    persons = document["tables"]["persons"]
    if args.method == "threshold":
        persons["protection"] = {"min_frequency": 10, "counts": {"method": "threshold"},
                                 "magnitudes": {"method": "threshold"}}  # fmt: skip
    elif args.method == "dp":  # ε 0.1 a count, 1 a sum (income clamped to its bounds)
        count, total = {"epsilon": 0.1}, {"epsilon": 1}
        persons["protection"] = {"counts": {"method": "dp", "spend": count},
                                 "magnitudes": {"method": "dp", "spend": total}}  # fmt: skip
        persons["dp"] = {"max_groups": 1, "max_rows": 1}
    return load_policy(document, name=f"reconstruction-{args.method}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", type=Path)
    parser.add_argument("--persons", type=int, default=20_000)
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--variant", default="all")
    parser.add_argument("--municipality", default="R01-M001")
    parser.add_argument("--pad", default="R01-M002")
    parser.add_argument("--user", default="analyst")
    parser.add_argument("--method", default="ckm", choices=["ckm", "threshold", "dp"],
                        help="the built demo's protection of persons (default: the shipped "
                        "policy, CKM and its cell limits)")  # fmt: skip
    parser.add_argument("--no-limits", action="store_true", help="the built demo without "
                        "the policy's cell_limits")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db
        if db is None:
            from sqlsdc.demo.build import build_demo_database

            db = Path(tmp) / "demo.duckdb"
            build_demo_database(db, persons=args.persons, policy=_policy(args))
        variants = (["in", "padded", "ranges", "partition", "sum"] if args.variant == "all"
                    else args.variant.split(","))  # fmt: skip
        template = db
        for variant in variants:
            if args.db is None:  # each variant on its own copy: a limit one ends is not shared
                db = Path(tmp) / f"{variant}.duckdb"
                shutil.copy(template, db)
            con = sqlsdc.connect(str(db), user=args.user)
            try:
                got = attack(con, variant, args.municipality, args.queries, args.pad)
            finally:
                con.close()
            raw = duckdb.connect(str(db), read_only=True)
            try:
                scored = score(raw, variant, args.municipality, got["estimate"])
            finally:
                raw.close()
            print(
                f"{variant:9} asked {args.queries} answered-cells {got['answered']} refused "
                f"{got['refused']} cpu {got['cpu_s']:.1f}s wall {got['wall_s']:.1f}s {scored}"
            )
            for reason in got["reasons"][:2]:
                print("          refused:", reason)


if __name__ == "__main__":
    main()
