"""What the permanent per-unit noise of CKM magnitudes (``unit_noise``, s45a) costs the engine:
the protected SQL of the same queries under the demo policy with and without ``unit_noise``,
run alternately on one DuckDB file in one process, CPU time first (as ``bench_ckm_ab.py``).

The policy without it is applied to a copy of the database (same data, record keys and secret
mix), and its protected SQL is run on the original file: only the rewrite differs.

Usage: python benchmarks/bench_unit_noise.py [--persons 1000000] [--db PATH] [--repeat 9]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench_ckm_ab import QUERIES, timed

import sqlsdc
from sqlsdc import admin
from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.engines.duckdb import open_database
from sqlsdc.policy import load_policy


def without_unit_noise(db: Path, copy: Path) -> None:
    """``copy``: the database under the demo policy with every ``unit_noise`` removed."""
    shutil.copy(db, copy)
    document = demo_policy().document_dict()
    for holder in [document, *document["tables"].values()]:
        holder.get("protection", {}).get("magnitudes", {}).pop("unit_noise", None)
    admin.apply(copy, load_policy(document), "admin")


def explained(db: Path) -> dict[str, str]:
    with sqlsdc.connect(db, user="analyst") as con:
        return {name: con.explain(sql).sql for name, sql in QUERIES.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--persons", type=int, default=1_000_000)
    parser.add_argument("--db", type=Path, help="a demo database to reuse (built if missing)")
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    db = args.db or Path(tempfile.mkdtemp()) / "demo.duckdb"
    if not db.exists():
        build_demo_database(db, persons=args.persons, seed=7)
    copy = Path(tempfile.mkdtemp()) / "without.duckdb"
    without_unit_noise(db, copy)
    sides = {"raw": dict(QUERIES), "without": explained(copy), "with": explained(db)}
    raw = open_database(db)
    print(f"medians of {args.repeat} alternating rounds after one warm-up round (CPU ms)")
    print("| query | raw | without unit noise | with | with/without | with/raw |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in QUERIES:
        runs: dict[str, list[float]] = {side: [] for side in sides}
        for k in range(args.repeat + 1):
            for side, texts in sides.items():
                cpu, _wall, _rows = timed(raw, texts[name])
                if k:
                    runs[side].append(cpu)
        ms = {side: statistics.median(c) * 1000 for side, c in runs.items()}
        print(
            f"| {name} | {ms['raw']:.1f} | {ms['without']:.1f} | {ms['with']:.1f} | "
            f"{ms['with'] / ms['without']:.2f} | {ms['with'] / ms['raw']:.2f} |"
        )
    raw.close()


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"done in {time.perf_counter() - started:.0f} s")
