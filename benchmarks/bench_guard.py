"""Benchmark of the guarded connection against raw DuckDB, measured in the same run.

For each GROUP BY count query over the demo persons it reports:
  check ms     parse + resolve + check + plan + rewrite + validate, uncached, median
               (a connection caches this per query text, so repeated queries skip it)
  raw ms       the original SQL on an unguarded connection to the same database, median
  engine ms    the protected SQL on the same unguarded connection, median
  guarded ms   ``con.execute(sql).fetchall()`` end to end (cached check, run, ledger, audit)
  engine/raw and guarded/raw ratios

``--fixed-cost`` measures instead what the guard adds to one repeated CKM query (ISSUE18
must-have 5: at most 3 ms): in each round, in turn, the original SQL and the protected SQL on
an unguarded connection, the query on a guarded one (cached check, defence-in-depth table
check, run, audit entry and ledger rows committed), and the floor: the same catalog writes
(BEGIN, the audit entry, the ledger rows of the protected SQL's answer, COMMIT) made by the
guard's own functions on an unguarded connection to a copy of the database (the demo's audit
log is not written), so that load on the machine falls on all four alike. The guard's
overhead is the median over rounds of guarded minus protected SQL, and the guard's own part
the median of that minus the floor. Each is timed by the wall clock and by the process's CPU
time (all its threads, DuckDB's workers among them).

Usage: python benchmarks/bench_guard.py [--persons 1000000] [--repeat 15] [--db PATH]
       python benchmarks/bench_guard.py --fixed-cost [--persons 100000] [--repeat 31] [--db PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import sqlsdc
from sqlsdc.catalog.store import record_query
from sqlsdc.demo.build import build_demo_database
from sqlsdc.engines.duckdb import open_database, parsed
from sqlsdc.engines.duckdb import run as run_sql
from sqlsdc.guard.pipeline import protect
from sqlsdc.guard.postprocess import record_release

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


FIXED_COST_SQL = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"


def fixed_cost(db: Path, repeat: int) -> None:
    """Print the medians of the four interleaved timings, of the guard's overhead and of its
    own part (overhead minus the floor), by the wall clock and by CPU time."""
    # the raw side only reads: opened as a writer of the data, it would make the guarded
    # connection of this process hash the tables again for every query (the cell limits'
    # data versions, forgotten while a writer of the file is open: engine.data_writers)
    raw = open_database(db, writes_data=False)
    con = sqlsdc.connect(db, user="analyst")
    query = con.explain(FIXED_COST_SQL)
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "floor.duckdb"
        shutil.copy(db, copy)
        writer = open_database(copy)
        answer = run_sql(raw, query.sql)

        def floor() -> None:  # the catalog writes of one guarded query, and nothing else
            writer.execute(parsed("BEGIN TRANSACTION"))
            drawn = record_query(writer, None, "analyst", con.policy_version, "accepted",
                                 FIXED_COST_SQL, fingerprint=query.fingerprint,
                                 rows=answer.num_rows)  # fmt: skip
            record_release(writer, answer, query, drawn, "analyst")
            writer.execute(parsed("COMMIT"))

        actions = {
            "raw": lambda: run_sql(raw, FIXED_COST_SQL),
            "protected": lambda: run_sql(raw, query.sql),
            "guarded": lambda: con.execute(FIXED_COST_SQL).fetchall(),
            "floor": floor,
        }
        clocks = {"wall": time.perf_counter, "cpu": time.process_time}
        times = {(c, a): [] for c in clocks for a in actions}
        for round_ in range(repeat + 3):  # three warm-up rounds
            for name, action in actions.items():
                wall, cpu = time.perf_counter(), time.process_time()
                action()
                spent = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
                if round_ >= 3:
                    for clock in clocks:
                        times[clock, name].append(spent[clock] * 1000)
        writer.close()
    print(f"{FIXED_COST_SQL}  ({repeat} rounds, medians; load average {os.getloadavg()[0]:.1f})")
    print(
        "| clock | raw ms | protected SQL ms | guarded ms | guard overhead ms | floor: catalog "
        "writes ms | guard's own ms | guarded/raw |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for clock in clocks:
        medians = {name: statistics.median(times[clock, name]) for name in actions}
        overhead = [g - p for g, p in zip(times[clock, "guarded"], times[clock, "protected"],
                                          strict=True)]  # fmt: skip
        own = [o - f for o, f in zip(overhead, times[clock, "floor"], strict=True)]
        print(f"| {clock} | {medians['raw']:.2f} | {medians['protected']:.2f} | "
              f"{medians['guarded']:.2f} | {statistics.median(overhead):.2f} | "
              f"{medians['floor']:.2f} | {statistics.median(own):.2f} | "
              f"{medians['guarded'] / medians['raw']:.2f} |")  # fmt: skip
    con.close()
    raw.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--persons", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--db", type=Path, help="existing demo database (built if missing)")
    parser.add_argument("--fixed-cost", action="store_true",
                        help="the guard's overhead on one repeated CKM query")  # fmt: skip
    args = parser.parse_args()
    db = args.db or Path(tempfile.mkdtemp()) / "bench.duckdb"
    if not db.exists():
        started = time.perf_counter()
        build_demo_database(db, persons=args.persons)
        print(
            f"built demo database with {args.persons:,} persons in "
            f"{time.perf_counter() - started:.1f} s"
        )
    if args.fixed_cost:
        fixed_cost(db, args.repeat)
        return
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
