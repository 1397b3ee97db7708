"""Benchmark of DP queries in the guarded path against raw DuckDB, measured in the same run.

A synthetic database with ``persons`` (one row per person; public domains) and ``visits``
(several rows per person: the bounding of max_groups/max_rows runs as window functions) under
``method: dp``. For each query (medians of --repeat runs after one warm-up):

  raw ms      the original SQL on an unguarded connection to the same file
  cells ms    the exact bounded cells (the stage SQL from ``con.explain(sql)``) on that same
              connection: the engine cost of bounding and clamping
  e2e ms      ``sqlsdc.connect(db, user).execute(sql).fetchall()`` for a user who has not seen
              the cells: check (cached plan), exact cells, noise for every cell, the budget
              charge (a committed transaction), the query over the noisy cells, audit

Issue 4's target is DP/raw <= 1.5 for COUNT and SUM on 10M rows. Each repeat is run by
another user, so every run draws and charges its noise (a user's repeated query would be
served from the cache).

Usage: python benchmarks/bench_dp.py [--rows 10000000] [--repeat 5] [--db PATH]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import sqlsdc
from sqlsdc.engines.duckdb import open_database

TARGET = 1.5
REGIONS = [f"R{i:02d}" for i in range(20)]
QUERIES = [
    ("count by region", "SELECT region, COUNT(*) FROM persons GROUP BY region"),
    ("count by region, sex", "SELECT region, sex, COUNT(*) FROM persons GROUP BY region, sex"),
    ("sum income by region", "SELECT region, SUM(income) FROM persons GROUP BY region"),
    ("avg income by sex", "SELECT sex, AVG(income) FROM persons WHERE age >= 18 GROUP BY sex"),
    ("visits: count by clinic", "SELECT clinic, COUNT(*) FROM visits GROUP BY clinic"),
    ("visits: sum cost by clinic", "SELECT clinic, SUM(cost) FROM visits GROUP BY clinic"),
]


def policy(users: int) -> dict:
    dp = {"method": "dp", "spend": {"epsilon": "1/2"}}
    return {
        "tables": {
            "persons": {
                "privacy_unit": "pid",
                "columns": {
                    "pid": {"role": "identifier"},
                    "region": {"role": "dimension", "domain": REGIONS},
                    "sex": {"role": "dimension", "domain": ["F", "M"]},
                    "age": {"role": "dimension"},
                    "income": {"role": "measure", "bounds": [0, 500000]},
                },
                "protection": {"counts": dp, "magnitudes": dp},
                "dp": {"granularity": 100},
            },
            "visits": {
                "privacy_unit": "pid",
                "columns": {
                    "pid": {"role": "identifier"},
                    "clinic": {"role": "dimension", "domain": [f"c{i}" for i in range(50)]},
                    "cost": {"role": "measure", "bounds": [0, 1000]},
                },
                "protection": {"counts": dp, "magnitudes": dp},
                "dp": {"max_groups": 3, "max_rows": 5},
            },
        },
        "users": {"admin": {"role": "admin"}, **{f"u{i}": {"role": "analyst"}
                                                 for i in range(users)}},  # fmt: skip
        "budgets": [{"user": "*", "epsilon": 100000}],
    }


def build(path: Path, rows: int, users: int) -> None:
    con = open_database(path)
    persons = rows  # synthetic columns from hash(row number): reproducible data, not noise
    con.execute(
        f"""CREATE TABLE persons AS SELECT range AS pid,
            'R' || lpad(CAST(range % 20 AS VARCHAR), 2, '0') AS region,
            CASE WHEN range % 2 = 0 THEN 'F' ELSE 'M' END AS sex,
            CAST(hash(range) % 100 AS INTEGER) AS age,
            CAST(hash(range + 1) % 200000 AS DOUBLE) AS income
            FROM range({persons})"""
    )
    con.execute(
        f"""CREATE TABLE visits AS SELECT CAST(hash(range) % {rows // 4} AS BIGINT) AS pid,
            'c' || CAST(hash(range + 7) % 50 AS VARCHAR) AS clinic,
            CAST(hash(range + 3) % 1500 AS DOUBLE) AS cost FROM range({rows})"""
    )
    con.close()
    sqlsdc.init(path, policy(users))


def median_ms(run, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--db", type=Path)
    args = parser.parse_args()
    path = args.db or Path(tempfile.mkdtemp()) / "bench_dp.duckdb"
    users = 2 * (args.repeat + 1) * len(QUERIES)
    if not path.exists():
        start = time.perf_counter()
        build(path, args.rows, users)
        print(f"built {path} ({args.rows:,} persons and visits) in "
              f"{time.perf_counter() - start:.1f} s")  # fmt: skip
    user = iter(range(users))
    print(f"{'query':30} {'raw ms':>8} {'cells ms':>9} {'e2e ms':>8} {'e2e/raw':>8} target")
    for name, sql in QUERIES:
        guarded = [sqlsdc.connect(path, f"u{next(user)}") for _ in range(args.repeat + 1)]
        stage = guarded[0].explain(sql).dp_stages[0].sql
        for con in guarded:  # connection-level work (data version) outside the timing
            con._data_version(guarded[0].explain(sql).dp_stages[0].table)
        raw = open_database(path, writes_data=False)  # reads only (engines.duckdb.data_writers)
        raw.execute(sql).fetchall()
        raw_ms = median_ms(lambda raw=raw, sql=sql: raw.execute(sql).fetchall(), args.repeat)
        cells_ms = median_ms(lambda raw=raw, stage=stage: raw.execute(stage).fetchall(),
                             args.repeat)  # fmt: skip
        raw.close()
        guarded[0].execute(sql).fetchall()  # warm-up
        runs = iter(guarded[1:])
        e2e_ms = median_ms(
            lambda runs=runs, sql=sql: next(runs).execute(sql).fetchall(), args.repeat
        )
        for con in guarded:
            con.close()
        ratio = e2e_ms / raw_ms
        verdict = "met" if ratio <= TARGET else "missed"
        print(f"{name:30} {raw_ms:8.1f} {cells_ms:9.1f} {e2e_ms:8.1f} {ratio:8.2f} "
              f"<= {TARGET} {verdict}")  # fmt: skip


if __name__ == "__main__":
    main()
