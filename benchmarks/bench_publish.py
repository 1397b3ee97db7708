"""Benchmark of ``sqlsdc publish``: the release database of the demo's protected outputs.

Builds the demo database (``--persons``, default 1,000,000), applies the suppression policy of
the README's query-path example to enterprises, stores three job outputs (a suppression job, a
controlled rounding and a CTA), then times ``publish`` with two named guarded queries (one with
the cell key method, one with differential privacy): job outputs, the suppression pattern
(computed on first use) and the query results go to a new file. Reported: the time of each step
and the size of the release.

Usage: python benchmarks/bench_publish.py [--persons 1000000] [--db PATH]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from sqlsdc.admin import policy_checks
from sqlsdc.catalog.setup import apply_policy
from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.engines.duckdb import open_database
from sqlsdc.jobs.adjust import cta_query, round_query
from sqlsdc.jobs.protect import protect_query
from sqlsdc.policy import load_policy
from sqlsdc.release import publish

TURNOVER = "SELECT nace, region, SUM(turnover) FROM enterprises GROUP BY nace, region"
QUERIES = {
    "persons_by_region": "SELECT region, sex, COUNT(*) AS n FROM persons GROUP BY region, sex",
    "benefits_by_scheme": "SELECT scheme, COUNT(DISTINCT person_id) AS recipients, "
    "SUM(amount) AS paid FROM benefits GROUP BY scheme",
}


def timed(label: str, run) -> None:
    start = time.perf_counter()
    run()
    print(f"{label:45} {time.perf_counter() - start:8.2f} s")


def suppress_enterprises(path: Path) -> None:
    document = demo_policy().document_dict()
    document["tables"]["enterprises"]["protection"] = {
        "counts": {"method": "suppress", "rules": ["freq:3"]},
        "magnitudes": {"method": "suppress", "rules": ["nk:1,60", "freq:3"]},
    }
    document["tables"]["enterprises"]["suppression"] = {"dimensions": ["nace", "region"]}
    con = open_database(path)
    try:
        policy = load_policy(document, name="bench-publish")
        apply_policy(con, policy, applied_by="admin", checks=policy_checks())
    finally:
        con.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--persons", type=int, default=1_000_000)
    parser.add_argument("--db", type=Path)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    db = args.db or folder / "demo.duckdb"
    if not db.exists():
        timed(f"demo database ({args.persons:,} persons)",
              lambda: build_demo_database(db, persons=args.persons))  # fmt: skip
        timed("suppression policy for enterprises", lambda: suppress_enterprises(db))
        timed("job: suppression of turnover by nace x region", lambda: protect_query(
            db, "admin", TURNOVER, into="turnover", replace=True))  # fmt: skip
        timed("job: controlled rounding, persons by region x sex", lambda: round_query(
            db, "admin", "SELECT region, sex, COUNT(*) FROM persons GROUP BY region, sex",
            into="persons_rounded", base=5, replace=True))  # fmt: skip
        timed("job: CTA of turnover by nace x size class", lambda: cta_query(
            db, "admin", "SELECT nace, size_class, SUM(turnover) FROM enterprises "
            "GROUP BY nace, size_class", into="turnover_cta", replace=True))  # fmt: skip
    out = folder / "release.duckdb"
    timed("publish (first: computes the suppression pattern)",
          lambda: publish(db, out, "admin", queries=QUERIES, analyst="analyst"))  # fmt: skip
    timed("publish again (pattern fresh, queries cached)",
          lambda: publish(db, out, "admin", queries=QUERIES, analyst="analyst",
                          replace=True))  # fmt: skip
    print(f"release: {out.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
