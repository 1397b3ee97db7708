"""The guard's check time against the size of the SQL (ISSUE18 must-have 6: linear; 100 KB
in at most 1 s on an idle machine).

For OR chains and AND chains of equalities (checked as the IN lists they mean), IN lists, and
chains whose operands are not equalities of one column (ORs of ANDs, of ranges) of growing length
over the demo persons it reports the
median time of one uncached check (parse, resolve, check, plan, rewrite, validate): wall-clock
seconds, CPU seconds of the process (less sensitive to other load on the machine), and the
floor: the CPU seconds sqlglot alone takes to parse the statement and generate it again, with
the ratio of the check to it; and sqlglot's passes that a check resolving every name with it
does (the guard's parse, ``qualify``, ``annotate_types``, generation), with the ratio to them
(the guard runs ``qualify`` and ``annotate_types`` on one range per group of ranges of a column
and without the values of long IN lists, ``planner/repeated_columns.py``). It
fails (exit code 1) when a 100 KB statement takes longer than ``--bound`` wall-clock seconds.

Whole statements of other shapes (a CASE of many WHENs as a group key, in a WHERE or in a
derived table whose column is the key, an OR of ranges as a group key, long IN lists of
strings, a long string literal, many UNION ALL branches, many CTEs, many columns) at 10 and
100 KB are reported
after them with their outcome (some are refused by a limit: depth, SELECT blocks), not held to
the bound.

Usage: python benchmarks/bench_guard_size.py [--persons 20000] [--repeat 3] [--bound 1.0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import sqlglot
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify

import sqlsdc
from sqlsdc.demo.build import build_demo_database
from sqlsdc.guard.parse import parse_statement
from sqlsdc.guard.pipeline import _cycle_collection_paused, protect

SHAPES = {
    "OR chain": lambda n: " OR ".join(f"age = {i}" for i in range(n)),
    "AND chain": lambda n: " AND ".join(f"age <> {i}" for i in range(n)),
    "IN list": lambda n: "age IN (" + ", ".join(str(i) for i in range(n)) + ")",
    "OR of ANDs": lambda n: " OR ".join(f"(age = {i} AND sex = 'F')" for i in range(n)),
    "OR of ranges": lambda n: " OR ".join(f"age BETWEEN {i} AND {i + 1}" for i in range(n)),
}
TEMPLATE = "SELECT region, COUNT(*) FROM persons WHERE {} GROUP BY region"
SIZES_KB = (10, 25, 50, 100)
STATEMENTS = {  # whole statements of n parts (red team s37): reported, not held to --bound
    "CASE of WHENs": lambda n: "SELECT CASE " + " ".join(
        f"WHEN age = {i} THEN 'a{i}'" for i in range(n)) + " ELSE 'z' END AS g, COUNT(*) "
        "FROM persons GROUP BY g",
    "CASE in WHERE": lambda n: TEMPLATE.format("CASE " + " ".join(
        f"WHEN age = {i} THEN 'a{i}'" for i in range(n)) + " ELSE 'z' END = 'a5'"),
    "CASE key of a derived table": lambda n: "SELECT g, COUNT(*) FROM (SELECT CASE " + " ".join(
        f"WHEN age = {i} THEN 'a{i}'" for i in range(n)) + " ELSE 'z' END AS g FROM persons) t "
        "GROUP BY g",
    "OR of ranges as key": lambda n: "SELECT (" + " OR ".join(
        f"age BETWEEN {i} AND {i + 1}" for i in range(n)) + ") AS g, COUNT(*) FROM persons "
        "GROUP BY g",
    "IN of strings": lambda n: TEMPLATE.format(
        "municipality IN (" + ", ".join(f"'m{i}'" for i in range(n)) + ")"),
    "long string": lambda n: TEMPLATE.format("municipality = '" + "x" * (10 * n) + "'"),
    "UNION ALL": lambda n: " UNION ALL ".join(
        f"SELECT region, COUNT(*) FROM persons WHERE age = {i % 110} GROUP BY region"
        for i in range(n)),
    "CTEs": lambda n: "WITH " + ", ".join(
        f"c{i} AS (SELECT region, COUNT(*) AS n FROM persons WHERE age = {i % 110} "
        "GROUP BY region)" for i in range(n)) + " SELECT * FROM c0",
    "chained CTEs": lambda n: "WITH c0 AS (SELECT * FROM persons), " + ", ".join(
        f"c{i} AS (SELECT * FROM c{i - 1} WHERE age > {i % 110})" for i in range(1, n))
        + f" SELECT region, COUNT(*) FROM c{max(n - 1, 0)} GROUP BY region",
    "columns": lambda n: "SELECT region, " + ", ".join(
        f"SUM(CASE WHEN age = {i % 110} THEN 1 ELSE 0 END) AS s{i}" for i in range(n))
        + " FROM persons GROUP BY region",
}  # fmt: skip


def statement(shape: str, kilobytes: int) -> str:
    make = STATEMENTS.get(shape) or (lambda n: TEMPLATE.format(SHAPES[shape](n)))
    n = 1
    while len(make(n)) < kilobytes * 1000:
        n *= 2
    low, high = n // 2, n
    while low < high:  # the shortest chain of at least that size
        middle = (low + high) // 2
        if len(make(middle)) < kilobytes * 1000:
            low = middle + 1
        else:
            high = middle
    return make(low)


def outcome(sql: str, context) -> str:
    """``ok``, or the class of the refusal (a statement shape may be refused by a limit)."""
    try:
        protect(sql, None, context)
    except sqlsdc.Error as refusal:
        return type(refusal).__name__
    return "ok"


def timed(run) -> tuple[float, float]:
    """(wall, CPU) seconds of ``run()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def floor(sql: str) -> None:
    """What any check must do at least: sqlglot's parse and generation of the statement (with
    the cycle collector paused, as during a check)."""
    with _cycle_collection_paused():
        sqlglot.parse_one(sql, read="duckdb").sql(dialect="duckdb")


def sqlglot_passes(sql: str, schema: dict) -> None:
    """What a check built on sqlglot's resolution does at least: the guard's parse (balanced
    chains, equalities folded into IN lists), sqlglot's ``qualify`` and ``annotate_types``, and
    generation."""
    with _cycle_collection_paused():
        tree = parse_statement(sql, len(sql))
        tree = qualify(tree, schema=schema, dialect="duckdb", quote_identifiers=False)
        annotate_types(tree, schema=schema, dialect="duckdb").sql(dialect="duckdb")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--persons", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bound", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "demo.duckdb"
        build_demo_database(db, persons=args.persons)
        with sqlsdc.connect(db, user="analyst") as con:
            context = con._context  # uncached checks: protect() itself, not the cache
            print(
                f"{'shape':12} {'KB':>5} {'check s':>9} {'cpu s':>7} {'floor s':>8} "
                f"{'ratio':>6} {'passes s':>9} {'ratio':>6}"
            )
            worst = 0.0
            for shape in SHAPES:
                for kilobytes in SIZES_KB:
                    sql = statement(shape, kilobytes)
                    runs = [
                        timed(lambda sql=sql: protect(sql, None, context))
                        for _ in range(args.repeat)
                    ]
                    wall = statistics.median(w for w, _c in runs)
                    cpu = statistics.median(c for _w, c in runs)
                    least = statistics.median(
                        timed(lambda sql=sql: floor(sql))[1] for _ in range(args.repeat)
                    )
                    passes = statistics.median(
                        timed(lambda sql=sql: sqlglot_passes(sql, context.schema))[1]
                        for _ in range(args.repeat)
                    )
                    if kilobytes == 100:
                        worst = max(worst, wall)
                    print(
                        f"{shape:12} {len(sql) / 1000:5.0f} {wall:9.3f} {cpu:7.3f} {least:8.3f} "
                        f"{cpu / least:6.1f} {passes:9.3f} {cpu / passes:6.1f}"
                    )
            print(f"\n{'statement':28} {'KB':>5} {'check s':>9} {'cpu s':>7}  outcome")
            for shape in STATEMENTS:
                for kilobytes in (10, 100):
                    sql = statement(shape, kilobytes)
                    runs = [
                        timed(lambda sql=sql: outcome(sql, context)) for _ in range(args.repeat)
                    ]
                    wall = statistics.median(w for w, _c in runs)
                    cpu = statistics.median(c for _w, c in runs)
                    print(f"{shape:28} {len(sql) / 1000:5.0f} {wall:9.3f} {cpu:7.3f}  "
                          f"{outcome(sql, context)}")  # fmt: skip
    print(f"slowest 100 KB check: {worst:.3f} s (bound {args.bound} s)")
    return 0 if worst <= args.bound else 1


if __name__ == "__main__":
    sys.exit(main())
