"""CPU time of a confidential table joined with a public one, against the query without the
join and raw DuckDB, measured in the same run (s41g).

A join of ``persons`` with the public ``regions`` on its declared key keeps every person's
row once (``planner/multiplicity.py``), so the protected SQL can count rows (``COUNT(*)``)
as it does on ``persons`` alone; before s41g it counted ``COUNT(DISTINCT person_id)`` for the
count's frequency rule (threshold) and for a sum's contributors (threshold and CKM).

For each query and policy (the demo's cell key method, and the threshold rule) it times, round
after round so that the machine's load falls on all alike: the raw SQL, the protected SQL of
this checkout and, with ``--before FILE``, the protected SQL another checkout wrote with
``--dump FILE``, each on an unguarded connection (``sqlsdc.engines.duckdb.run``, as the guard
runs it); medians of the process's CPU time (DuckDB's threads included) and of wall time.

Usage: python benchmarks/bench_public_join.py [--persons 1000000] [--repeat 15] [--db PATH]
           [--dump FILE | --before FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import sqlsdc
from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.engines.duckdb import open_database
from sqlsdc.engines.duckdb import run as run_sql
from sqlsdc.policy import load_policy

JOINED = "FROM persons p JOIN regions r ON p.region = r.region"
QUERIES = {
    "count by region name (join)": f"SELECT r.name, COUNT(*) AS n {JOINED} GROUP BY r.name",
    "count by region (no join)": "SELECT region, COUNT(*) AS n FROM persons GROUP BY region",
    "count + sum income by region name (join)": (
        f"SELECT r.name, COUNT(*) AS n, SUM(p.income) AS s {JOINED} GROUP BY r.name"
    ),
    "count + sum income by region (no join)": (
        "SELECT region, COUNT(*) AS n, SUM(income) AS s FROM persons GROUP BY region"
    ),
}


def _threshold(db: Path, folder: Path) -> Path:
    """A copy of ``db`` with the threshold rule on every table."""
    copy = folder / "threshold.duckdb"
    shutil.copy(db, copy)
    document = demo_policy().document_dict()
    document["protection"] = {
        "min_frequency": 10,
        "counts": {"method": "threshold"},
        "magnitudes": {"method": "threshold"},
    }
    for table in document["tables"].values():
        table.pop("protection", None)
        table.pop("dp", None)
    sqlsdc.admin.apply(copy, load_policy(document, name="threshold"), "admin")
    return copy


def protected_texts(databases: dict[str, Path]) -> dict[str, str]:
    texts = {}
    for policy, db in databases.items():
        con = sqlsdc.connect(db, user="analyst")
        try:
            for label, sql in QUERIES.items():
                texts[f"{policy}: {label}"] = con.explain(sql).sql
        finally:
            con.close()
    return texts


def timed(con, sql: str) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    run_sql(con, sql)
    return time.process_time() - cpu, time.perf_counter() - wall


def measure(databases, texts, before, repeat: int) -> None:
    print("| policy: query | raw CPU ms | before CPU ms | after CPU ms | before/raw | after/raw "
          "| after wall ms |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for policy, db in databases.items():
        con = open_database(db)
        try:
            for label, sql in QUERIES.items():
                key = f"{policy}: {label}"
                variants = {"raw": sql, "after": texts[key]}
                if before is not None:
                    variants["before"] = before[key]
                for text in variants.values():
                    timed(con, text)  # warm up
                cpu = {name: [] for name in variants}
                wall = {name: [] for name in variants}
                for _ in range(repeat):
                    for name, text in variants.items():
                        c, w = timed(con, text)
                        cpu[name].append(c * 1000)
                        wall[name].append(w * 1000)
                med = {name: statistics.median(values) for name, values in cpu.items()}
                raw, after = med["raw"], med["after"]
                old = f"{med['before']:.1f}" if "before" in med else ""
                ratio = f"{med['before'] / raw:.2f}" if "before" in med else ""
                print(
                    f"| {key} | {raw:.1f} | {old} | {after:.1f} | {ratio} | {after / raw:.2f} "
                    f"| {statistics.median(wall['after']):.1f} |"
                )
        finally:
            con.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--persons", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--db", type=Path, help="demo database (built if missing)")
    parser.add_argument("--dump", type=Path, help="write this checkout's protected SQL here")
    parser.add_argument("--before", type=Path, help="protected SQL written by --dump")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="sqlsdc-join-"))
    db = args.db or folder / "demo.duckdb"
    if not db.exists():
        build_demo_database(db, persons=args.persons, seed=7)
    threshold = db.with_name(db.stem + "-threshold.duckdb")
    if not threshold.exists():
        shutil.move(_threshold(db, folder), threshold)
    databases = {"ckm": db, "threshold": threshold}
    texts = protected_texts(databases)
    if args.dump is not None:
        args.dump.write_text(json.dumps(texts, indent=1))
        return
    before = json.loads(args.before.read_text()) if args.before is not None else None
    measure(databases, texts, before, args.repeat)


if __name__ == "__main__":
    main()
