"""Benchmark: what the dominance rule of threshold and round magnitudes costs a query.

Builds the demo population (``--persons``, default 1,000,000), copies it twice and applies the
demo policy with every table under the threshold rule (then under rounding: counts base 5,
magnitudes base 100), once with the default dominance rule (``p:10``) and once without
(``dominance: []``). Each query runs ``--repeats`` times per database, A and B alternating, and
the median CPU time of the process (``time.process_time``: DuckDB's threads included) is
printed as a markdown table with the ratio. The persons queries read every row as a
contribution (the aggregation adds ``SUM(ABS(x))``, ``MAX(ABS(x))``, ``MAX(ABS(x), 2)[2]``);
the benefits queries sum each person's payments per cell first (a second aggregation joined
on the cell's keys).

    python benchmarks/bench_dominance.py                     # 1M persons
    python benchmarks/bench_dominance.py --persons 100000 --repeats 3
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import sqlsdc
from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.policy import load_policy

QUERIES = {
    "SUM by region": "SELECT region, SUM(income) FROM persons GROUP BY region",
    "SUM, AVG by municipality x sex": "SELECT municipality, sex, SUM(income), AVG(income) "
    "FROM persons GROUP BY municipality, sex",
    "SUM by ROLLUP(region, age)": "SELECT region, age, SUM(income) FROM persons "
    "GROUP BY ROLLUP (region, age)",
    "benefits SUM by scheme x month (per unit)": "SELECT scheme, month, SUM(amount) "
    "FROM benefits GROUP BY scheme, month",
    "benefits SUM by ROLLUP(region, scheme) (per unit)": "SELECT region, scheme, SUM(amount) "
    "FROM benefits GROUP BY ROLLUP (region, scheme)",
}

METHODS = {
    "threshold": ({"method": "threshold"}, {"method": "threshold"}),
    "round": (
        {"method": "round", "base": 5, "rounding": "unbiased"},
        {"method": "round", "base": 100, "rounding": "conventional"},
    ),
}


def policy(method: str, dominance: bool):
    document = demo_policy().document_dict()
    counts, magnitudes = METHODS[method]
    magnitudes = dict(magnitudes) if dominance else {**magnitudes, "dominance": []}
    document["protection"] = {"min_frequency": 10, "counts": counts, "magnitudes": magnitudes}
    for table in document["tables"].values():
        table.pop("protection", None)
        table.pop("dp", None)
    return load_policy(document)


def cpu(con, sql: str) -> float:
    start = time.process_time()
    con.execute(sql).fetchall()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--persons", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-dominance-"))
    try:
        built = folder / "demo.duckdb"
        start = time.perf_counter()
        build_demo_database(
            built, persons=args.persons, seed=args.seed, policy=policy("threshold", True)
        )
        print(f"built {args.persons:,} persons in {time.perf_counter() - start:.0f} s\n")
        paths = {True: folder / "with.duckdb", False: folder / "without.duckdb"}
        for path in paths.values():
            shutil.copy(built, path)
        print("| method | query | without s | with p:10 s | ratio | cells suppressed by the rule |")
        print("|---|---|---:|---:|---:|---:|")
        for method in METHODS:
            for dominance, path in paths.items():
                sqlsdc.admin.apply(path, policy(method, dominance), "admin")
            cons = {d: sqlsdc.connect(p, user="analyst") for d, p in paths.items()}
            try:
                for title, sql in QUERIES.items():
                    results = {d: cons[d].execute(sql).fetchall() for d in cons}  # warm
                    times = {True: [], False: []}
                    for _ in range(args.repeats):
                        for d in (False, True):
                            times[d].append(cpu(cons[d], sql))
                    with_, without = (statistics.median(times[d]) for d in (True, False))
                    suppressed = sum(
                        v is None and w is not None
                        for a, b in zip(results[True], results[False], strict=True)
                        for v, w in zip(a, b, strict=True)
                    )
                    print(f"| {method} | {title} | {without:.3f} | {with_:.3f} | "
                          f"{with_ / without:.2f} | {suppressed} |")  # fmt: skip
            finally:
                for con in cons.values():
                    con.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
