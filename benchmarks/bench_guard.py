"""Benchmark of the guarded connection against raw DuckDB, measured in the same run.

For each GROUP BY count query over the demo persons it reports:
  check ms     parse + resolve + check + plan + rewrite + validate, uncached, median
               (a connection caches this per query text, so repeated queries skip it)
  raw ms       the original SQL on an unguarded connection to the same database, median
  engine ms    the protected SQL on the same unguarded connection, median
  guarded ms   ``con.execute(sql).fetchall()`` end to end (cached check, run, ledger, audit)
  engine/raw and guarded/raw ratios

Usage: python benchmarks/bench_guard.py [--persons 1000000] [--repeat 15] [--db PATH]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import sqlsdc
from sqlsdc.demo.build import build_demo_database
from sqlsdc.engines.duckdb import open_database
from sqlsdc.engines.duckdb import run as run_sql
from sqlsdc.guard.pipeline import protect

QUERIES = {
    "count by region": "SELECT region, COUNT(*) FROM persons GROUP BY region",
    "count by municipality": "SELECT municipality, COUNT(*) FROM persons GROUP BY municipality",
    "count by municipality, sex, age": (
        "SELECT municipality, sex, age, COUNT(*) FROM persons GROUP BY municipality, sex, age"
    ),
    "count with filter": (
        "SELECT region, education, COUNT(*) FROM persons WHERE age >= 18 AND sex = 'F' "
        "GROUP BY region, education"
    ),
    "count rollup": (
        "SELECT region, municipality, COUNT(*) FROM persons GROUP BY ROLLUP (region, municipality)"
    ),
    "count + avg income": (
        "SELECT municipality, COUNT(*), AVG(income) FROM persons GROUP BY municipality"
    ),
    "join households (distinct units)": (
        "SELECT h.tenure, COUNT(*) FROM persons p JOIN households h "
        "ON p.household_id = h.household_id GROUP BY h.tenure"
    ),
}


def median_ms(action, repeat: int) -> float:
    action()  # warm up
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--persons", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--db", type=Path, help="existing demo database (built if missing)")
    args = parser.parse_args()
    db = args.db or Path(tempfile.mkdtemp()) / "bench.duckdb"
    if not db.exists():
        started = time.perf_counter()
        build_demo_database(db, persons=args.persons)
        print(
            f"built demo database with {args.persons:,} persons in "
            f"{time.perf_counter() - started:.1f} s"
        )
    raw = open_database(db)
    con = sqlsdc.connect(db, user="analyst")
    print("| query | check ms | raw ms | engine ms | guarded ms | engine/raw | guarded/raw |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, sql in QUERIES.items():
        protected = con.explain(sql).sql
        check = median_ms(lambda sql=sql: protect(sql, None, con._context), args.repeat)
        raw_ms = median_ms(lambda sql=sql: run_sql(raw, sql), args.repeat)
        engine_ms = median_ms(lambda p=protected: run_sql(raw, p), args.repeat)
        guarded = median_ms(lambda sql=sql: con.execute(sql).fetchall(), args.repeat)
        print(
            f"| {name} | {check:.1f} | {raw_ms:.1f} | {engine_ms:.1f} | {guarded:.1f} | "
            f"{engine_ms / raw_ms:.2f} | {guarded / raw_ms:.2f} |"
        )
    con.close()
    raw.close()


if __name__ == "__main__":
    main()
