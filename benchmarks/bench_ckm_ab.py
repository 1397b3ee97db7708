"""A/B benchmark of the cell key method's rewrite: the protected SQL of two source trees, run
alternately on one DuckDB file in one process, CPU time first. With ``--rounding RULE`` the
database's policy is per-cell rounding instead (counts to 5 unbiased, magnitudes to 100 by
RULE, minimum frequency 3; the rounding rewrite is what is compared).

The SQL of the tree under test comes from this process (``sqlsdc`` as installed); that of the
other tree from a subprocess whose ``PYTHONPATH`` is ``--before`` (e.g. ``git archive <commit>
| tar -x -C /tmp/before``), both from ``explain()`` on the same database. Each statement is run
the way the guarded connection runs it (``sqlsdc.engines.duckdb.run``): the original SQL, then
before, then after, in ``--repeat`` rounds after one warm-up round, so that the load of other
processes falls on all alike. CPU is ``time.process_time`` (every thread of the process,
DuckDB's workers included), the measure to compare on a shared machine; wall time is beside it.

Usage: python benchmarks/bench_ckm_ab.py --before /tmp/before [--persons 1000000] [--db PATH]
       [--repeat 9] [--rounding unbiased]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sqlsdc
from sqlsdc import admin
from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.engines.duckdb import open_database
from sqlsdc.engines.duckdb import run as run_sql
from sqlsdc.policy import load_policy

QUERIES = {  # name -> SQL: counts as a control, then sums and means with and without zeros
    "count by region": "SELECT region, COUNT(*) FROM persons GROUP BY region",
    "sum income by region": "SELECT region, SUM(income) FROM persons GROUP BY region",
    "sum + avg income by municipality": (
        "SELECT municipality, SUM(income), AVG(income) FROM persons GROUP BY municipality"
    ),
    "avg income by municipality, sex": (
        "SELECT municipality, sex, AVG(income) FROM persons GROUP BY municipality, sex"
    ),
    "count, sum, avg income by age": (
        "SELECT age, COUNT(*), SUM(income), AVG(income) FROM persons GROUP BY age"
    ),
    "sum turnover by nace, region (top 2)": (
        "SELECT nace, region, SUM(turnover) FROM enterprises GROUP BY nace, region"
    ),
}

EXPLAIN = """
import json, sys
import sqlsdc
with sqlsdc.connect(sys.argv[1], user="analyst") as con:
    print(json.dumps({n: con.explain(q).sql for n, q in json.loads(sys.argv[2]).items()}))
"""


def explained_before(before: Path, db: Path) -> dict[str, str]:
    """The protected SQL of each query under the source tree ``before``."""
    env = {**os.environ, "PYTHONPATH": str(before)}
    done = subprocess.run(
        [sys.executable, "-c", EXPLAIN, str(db), json.dumps(QUERIES)],
        env=env,
        cwd=before,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def apply_rounding(db: Path, rule: str) -> None:
    """The demo policy with every table's counts rounded to 5 (unbiased) and magnitudes to 100
    by ``rule``, minimum frequency 3 (tests/conftest.py's ``rounded_template``)."""
    document = demo_policy().document_dict()
    document["protection"] = {
        "min_frequency": 3,
        "counts": {"method": "round", "base": 5, "rounding": "unbiased"},
        "magnitudes": {"method": "round", "base": 100, "rounding": rule},
    }
    for table in document["tables"].values():
        table.pop("protection", None)
        table.pop("dp", None)
    admin.apply(db, load_policy(document), "admin")


def timed(raw, sql: str) -> tuple[float, float, int]:
    """(CPU s, wall s, rows) of one run."""
    cpu, wall = time.process_time(), time.perf_counter()
    rows = run_sql(raw, sql).num_rows
    return time.process_time() - cpu, time.perf_counter() - wall, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the other source tree")
    parser.add_argument("--persons", type=int, default=1_000_000)
    parser.add_argument("--db", type=Path, help="a demo database to reuse (built if missing)")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--rounding", help="round instead of CKM, magnitudes by this rule")
    args = parser.parse_args()
    db = args.db or Path(tempfile.mkdtemp()) / "demo.duckdb"
    if not db.exists():
        started = time.perf_counter()
        build_demo_database(db, persons=args.persons, seed=7)
        print(f"built {db} ({args.persons:,} persons) in {time.perf_counter() - started:.0f} s")
    if args.rounding:
        apply_rounding(db, args.rounding)
    before = explained_before(args.before, db)
    with sqlsdc.connect(db, user="analyst") as con:
        after = {name: con.explain(sql).sql for name, sql in QUERIES.items()}
    raw = open_database(db)
    print(f"medians of {args.repeat} alternating rounds after one warm-up round (ms)")
    print(
        "| query | CPU raw | CPU before | CPU after | after/before | after/raw "
        "| wall before | wall after |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, sql in QUERIES.items():
        runs: dict[str, list[tuple[float, float, int]]] = {"raw": [], "before": [], "after": []}
        for k in range(args.repeat + 1):
            for side, text in (("raw", sql), ("before", before[name]), ("after", after[name])):
                result = timed(raw, text)
                if k:
                    runs[side].append(result)
        (rows_before,) = {r for _c, _w, r in runs["before"]}
        (rows_after,) = {r for _c, _w, r in runs["after"]}
        assert rows_before == rows_after, (name, rows_before, rows_after)
        cpu = {s: statistics.median(c for c, _w, _r in runs[s]) * 1000 for s in runs}
        wall = {s: statistics.median(w for _c, w, _r in runs[s]) * 1000 for s in runs}
        print(
            f"| {name} | {cpu['raw']:.1f} | {cpu['before']:.1f} | {cpu['after']:.1f} | "
            f"{cpu['after'] / cpu['before']:.2f} | {cpu['after'] / cpu['raw']:.2f} | "
            f"{wall['before']:.0f} | {wall['after']:.0f} |"
        )
    raw.close()


if __name__ == "__main__":
    main()
