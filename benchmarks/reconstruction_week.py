"""The reconstruction of ``reconstruction.py`` asked of every municipality at once, for a week
under the demo's cell limits: what one analyst's limits allow, scored.

Each statement is ``SELECT municipality, COUNT(*) FROM persons WHERE education = 'tertiary'
AND age IN (<a random half of 0..99>) GROUP BY municipality``: one cell per municipality with
tertiary persons among those ages, so a day's cells (5,000 of persons per analyst in the demo)
go to all 182 municipalities' unknowns at once. Statements are asked until a refusal ends the
day; then the clock (``sqlsdc.catalog.store.now``, the tester's, not the attacker's) moves to the
next day. Every municipality's answers are solved by bounded least squares (as in
``reconstruction.py``) and scored with the raw data: the (municipality, age) counts of tertiary
persons recovered exactly, of the ages present, and the persons whose education the recovered
counts decide for certain (their age's count 0 or all of them); against the cell key method's
own table of those counts (``GROUP BY municipality, age``, one statement).

Usage: python benchmarks/reconstruction_week.py [--db PATH] [--persons 20000] [--days 7]
Builds the demo database (the shipped policy and its limits) in a temporary directory unless
--db is given (then it is copied). About 15 s of CPU for a week.

Measured (20,000 persons, red team s50d): 30 statements a day, 210 in the week (11 s of CPU);
166 municipalities answered; 6,438 of their 7,038 present ages exact (91 %), 6,776 persons'
education decided for certain; the direct table: 3,588 of 7,088 exact (51 %). Each build draws
its own cell keys: another build gave 6,435 of 7,023 and 3,634 of 7,088.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import duckdb
import numpy as np
from scipy.optimize import lsq_linear

import sqlsdc
from sqlsdc.catalog import store
from sqlsdc.catalog.cell_limits import CellLimitReached

AGES = list(range(100))
WHERE = "education = 'tertiary'"


def ask_week(db: Path, days: int, seed: int = 7) -> tuple[dict, dict, int]:
    """The answers by municipality (design rows, counts) and the statements answered."""
    rng, rows, answers, asked = random.Random(seed), {}, {}, 0
    real_now, shift = store.now, [timedelta(0)]
    store.now = lambda: real_now() + shift[0]
    try:
        with sqlsdc.connect(str(db), user="analyst") as con:
            for day in range(days):
                shift[0] = timedelta(days=day)
                while True:
                    subset = sorted(rng.sample(AGES, 50))
                    sql = (f"SELECT municipality, COUNT(*) FROM persons WHERE {WHERE} AND age "
                           f"IN ({','.join(map(str, subset))}) GROUP BY municipality")  # fmt: skip
                    try:
                        result = con.execute(sql).fetchall()
                    except CellLimitReached:
                        break
                    asked += 1
                    row = [1.0 if a in subset else 0.0 for a in AGES]
                    for m, value in result:
                        if value is not None:
                            rows.setdefault(m, []).append(row)
                            answers.setdefault(m, []).append(float(value))
    finally:
        store.now = real_now
    return rows, answers, asked


def score(raw, rows: dict, answers: dict) -> dict:
    exact = present = persons = decided = 0
    for m in sorted(rows):
        estimate = lsq_linear(np.array(rows[m]), np.array(answers[m]), bounds=(0, 50)).x
        counts = raw.execute(
            f"SELECT age, COUNT(*), COUNT(*) FILTER (WHERE {WHERE}) FROM persons "
            "WHERE municipality = ? GROUP BY age", [m]).fetchall()  # fmt: skip
        for age, size, tertiary in counts:
            hit = round(estimate[age]) == tertiary
            exact += hit
            present += 1
            persons += size
            decided += size if hit and tertiary in (0, size) else 0
    return {"municipalities": len(rows), "ages_exact": exact, "ages_present": present,
            "persons": persons, "persons_decided": decided}  # fmt: skip


def direct(db: Path, raw) -> dict:
    """The cell key method's own table of the same counts, one statement."""
    with sqlsdc.connect(str(db), user="analyst") as con:
        got = {(m, a): n for m, a, n in con.execute(
            f"SELECT municipality, age, COUNT(*) FROM persons WHERE {WHERE} GROUP BY ALL"
        ).fetchall()}  # fmt: skip
    truth = dict(((m, a), n) for m, a, n in raw.execute(
        f"SELECT municipality, age, COUNT(*) FILTER (WHERE {WHERE}) FROM persons GROUP BY ALL"
    ).fetchall())  # fmt: skip
    exact = sum((got.get(k) or 0) == n for k, n in truth.items())
    return {"ages_exact": exact, "ages_present": len(truth)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", type=Path)
    parser.add_argument("--persons", type=int, default=20_000)
    parser.add_argument("--days", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db, template = Path(tmp) / "week.duckdb", args.db
        if template is None:
            from sqlsdc.demo.build import build_demo_database

            template = Path(tmp) / "demo.duckdb"
            build_demo_database(template, persons=args.persons)
        shutil.copy(template, db)
        started = time.process_time()
        rows, answers, asked = ask_week(db, args.days)
        raw = duckdb.connect(str(template), read_only=True)
        try:
            print(f"statements {asked} in {args.days} days, cpu "
                  f"{time.process_time() - started:.1f}s; {score(raw, rows, answers)}")  # fmt: skip
            shutil.copy(template, db)
            print("direct table:", direct(db, raw))
        finally:
            raw.close()


if __name__ == "__main__":
    main()
