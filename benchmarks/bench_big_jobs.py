"""Benchmark of the long steps of jobs on a big table, old formulation against new, A/B in
the same run (session 48, s48h; session 47's new-user test on the 1,000,000-person demo).

1. ``sqlsdc protect`` next to an exact file of persons (a synthetic or anonymised file whose
   six columns region, municipality, sex, age, education, occupation are exact) — the
   differencing checks :func:`~sqlsdc.jobs.uncovered.smallest_difference` (both orders) and
   :func:`~sqlsdc.jobs.cell_unions.cells_add_up`: distinct units counted over rows for every
   grouping (``additive=False``, the old statement) against per-cell counts added up
   (``additive=True``, chosen when :func:`~sqlsdc.jobs.unit_cells.one_cell_each` holds; its
   own cost is included in the new time). The answers must be equal.
2. ``sqlsdc anonymize``'s risk step: the risk report (frequencies, individual risk, SUDA on
   five keys) before and after, with ``np.unique`` (old) and :func:`unique_rows` (new); the
   record linkage of a microaggregated income (k = 5), one ``cKDTree.query`` of every record
   (old) against :func:`~sqlsdc.microdata.risk._nearest` (distinct queries, in chunks).

CPU is the process's (``time.process_time``, DuckDB's threads included).

Usage: python benchmarks/bench_big_jobs.py [--db DEMO.duckdb | --persons 1000000] [--only ...]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
from scipy.spatial import cKDTree
from sqlglot import exp

import sqlsdc.microdata.risk as risk
import sqlsdc.microdata.suda as suda
from sqlsdc.jobs import cell_unions, uncovered
from sqlsdc.jobs.anonymize import _risk
from sqlsdc.jobs.exact_release import Release, tells
from sqlsdc.jobs.tabulation import JobSpec

FILE = ("region", "municipality", "sex", "age", "education", "occupation")
KEYS = ["region", "municipality", "sex", "age", "education"]


def _cpu(fn):
    start = time.process_time()
    out = fn()
    return out, time.process_time() - start


def _np_unique(codes):
    combos, inverse, counts = np.unique(codes, axis=0, return_inverse=True, return_counts=True)
    return combos, inverse.ravel(), counts


def differencing(con) -> list[tuple]:
    spec = JobSpec(table="persons", dims=("region", "sex", "education"), measure=None,
                   unit="person_id", where=None)  # fmt: skip
    exact = tuple((n, exp.column(n)) for n in FILE)
    other = Release(label="file", where=None, dims=FILE, exact=exact)
    told = tells(con, spec, other)
    job = (None, [(d, exp.column(d)) for d in spec.dims], False)
    theirs = (None, uncovered._keys(other), told)
    rows = []
    orders = (("job cells vs file", job, theirs), ("file cells vs job", theirs, job))
    for name, cut, cover in orders:

        def run(additive, cut=cut, cover=cover):
            if additive and not uncovered._additive(con, spec, cut, cover):
                additive = False
            sql = uncovered._statement(spec, cut, cover, 5, additive=additive).sql("duckdb")
            return con.execute(sql).fetchall()

        old, old_s = _cpu(lambda: run(False))
        new, new_s = _cpu(lambda: run(True))
        rows.append((f"smallest_difference: {name}", old_s, new_s, old == new))
    file = JobSpec(table="persons", dims=FILE, measure=None, unit="person_id", where=None)
    keys, inner = [e for _n, e in exact], cell_unions._keys(spec)

    def union(additive):
        if additive and not cell_unions._additive(con, file, spec, keys, inner):
            additive = False
        query = cell_unions._union_query(file, spec, keys, inner, False, additive=additive)
        return con.execute(query.sql("duckdb")).fetchall()

    old, old_s = _cpu(lambda: union(False))
    new, new_s = _cpu(lambda: union(True))
    rows.append(("cells_add_up: file cells vs job", old_s, new_s, old == new))
    return rows


def risk_step(con) -> list[tuple]:
    df = con.execute(f"SELECT {', '.join(KEYS)}, weight, household_id, income FROM persons "
                     "ORDER BY person_id").df()  # fmt: skip
    rows = []
    for name, grouped in (("old", _np_unique), ("new", risk.unique_rows)):
        risk.unique_rows, suda.unique_rows = grouped, grouped
        _risk(df, KEYS, "weight", "household_id")  # numba's compilation outside the timing
        out, seconds = _cpu(lambda: _risk(df, KEYS, "weight", "household_id"))
        rows.append((name, out, seconds))
    (_o, old, old_s), (_n, new, new_s) = rows
    result = [("risk report (5 keys, SUDA)", old_s, new_s, repr(old) == repr(new))]
    x = df["income"].dropna().to_numpy(float)  # the records with an income
    order = np.argsort(x, kind="stable")
    z = x.copy()
    n = len(x) // 5 * 5
    z[order[:n]] = x[order[:n]].reshape(-1, 5).mean(axis=1).repeat(5)
    x, z = x[:, None] / x.std(ddof=1), z[:, None] / x.std(ddof=1)
    old, old_s = _cpu(lambda: cKDTree(x).query(z, k=1)[1])
    new, new_s = _cpu(lambda: risk._nearest(x, z))
    result.append(("record linkage (income, k = 5)", old_s, new_s, bool((old == new).all())))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, help="a demo database (default: build one)")
    parser.add_argument("--persons", type=int, default=1_000_000)
    parser.add_argument("--only", default="differencing,risk")
    args = parser.parse_args()
    db = args.db
    if db is None:
        from sqlsdc.demo.build import build_demo_database

        db = Path(tempfile.mkdtemp()) / "demo.duckdb"
        build_demo_database(db, persons=args.persons, seed=20260101)
    con = duckdb.connect(str(db), read_only=True)
    (persons,) = con.execute("SELECT count(*) FROM persons").fetchone()
    print(f"{persons:,} persons, DuckDB {duckdb.__version__}")
    print("| step | old CPU s | new CPU s | old/new | same answer |\n|---|---:|---:|---:|---|")
    for part in args.only.split(","):
        step = {"differencing": differencing, "risk": risk_step}[part]
        for name, old_s, new_s, same in step(con):
            print(f"| {name} | {old_s:.1f} | {new_s:.1f} | {old_s / new_s:.1f} | {same} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
