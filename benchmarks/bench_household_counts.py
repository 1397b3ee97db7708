"""The cost of a count of persons in cells of household columns, protected as the households'
own magnitude sum (session 43, ``planner/coarser_units.py``, ``rewrite/ckm.py``), against raw
DuckDB running the analyst's SQL, and the two controls it is compared with.

Each query runs ``--repeat`` times on one open guarded connection (analyst), then on a plain
read-only DuckDB connection to the same file, in one process; printed: the median process CPU
of the runs after the first five, per side, and their ratio, as a Markdown table.

Usage: python benchmarks/bench_household_counts.py DEMO_DB [--repeat 25]
(a database made by ``sqlsdc demo --db DEMO_DB --persons 20000``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import duckdb

import sqlsdc

JOIN = "FROM persons p JOIN households h ON p.household_id = h.household_id"
QUERIES = {
    "adults by region × `h.size` (protected as a household sum)": (
        f"SELECT p.region, h.size, COUNT(*) {JOIN} WHERE p.age >= 18 GROUP BY 1, 2"
    ),
    "adults by region (no household column: the persons' count)": (
        f"SELECT p.region, COUNT(*) {JOIN} WHERE p.age >= 18 GROUP BY 1"
    ),
    "households' own `SUM(size)` by region × size": (
        "SELECT region, size, SUM(size) FROM households GROUP BY 1, 2"
    ),
}


def _median_cpu(run, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return statistics.median(times[5:] or times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db")
    parser.add_argument("--repeat", type=int, default=25)
    args = parser.parse_args()
    guarded = {}
    with sqlsdc.connect(args.db, user="analyst") as con:
        for name, sql in QUERIES.items():
            guarded[name] = _median_cpu(lambda sql=sql: con.execute(sql).fetchall(), args.repeat)
    raw = duckdb.connect(args.db, read_only=True)
    print("| query | guarded (ms) | raw DuckDB (ms) | ratio |\n|---|---|---|---|")
    for name, sql in QUERIES.items():
        floor = _median_cpu(lambda sql=sql: raw.execute(sql).fetchall(), args.repeat)
        print(f"| {name} | {guarded[name] * 1e3:.1f} | {floor * 1e3:.2f} | "
              f"{guarded[name] / floor:.0f}× |")  # fmt: skip
    raw.close()


if __name__ == "__main__":
    main()
