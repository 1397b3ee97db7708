"""Coverage of sqlsdc's reported 95% DP intervals, and what the bounding report says about it.

The five questions of the side-by-side harness (``benchmarks/peers/run.py``: Q1 count by region,
Q2 average income by region, Q3 sum of benefit amounts by month, Q4 count by municipality x age
band with private groups, Q5 sum of income over ~9,500 fine cells), on the demo data, each
repeated with fresh noise (a new PRF secret and a new user per repetition). The policy is the
harness's, with ``dp.bounding_report: {epsilon: 0.1}`` on every table, plus a second benefits
table, ``benefits_cells``, bounded by per-cell caps only (``max_groups: 2, max_rows: 12``, the
demo's policy; no per-person cap), on which Q3 is asked again as ``Q3-cells``.

Per question: the share of released cells whose reported 95% interval (``cursor.cell_accuracy``
``low``..``high``: the noise only) holds the exact *bounded* answer (noise off) and the exact
*unbounded* answer (raw SQL), the mean relative bias of bounding ((bounded - exact)/|exact|),
and the mean ``dropped`` and ``clamped`` shares the bounding report released for those cells.
Where the intervals miss the exact answer, the report shows why.

Usage: python benchmarks/bench_dp_coverage.py [--persons 100000] [--reps 5] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import sqlsdc
from sqlsdc.engines.duckdb import open_database

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
import run as harness  # noqa: E402

REPORT = {"epsilon": 0.1}


def policy(domain: dict, users: int) -> dict:
    document = harness.policy(domain, users)
    tables = document["tables"]
    cells = {**tables["benefits"], "dp": {"max_groups": 2, "max_rows": 12, "granularity": 1}}
    tables["benefits_cells"] = cells
    for table in tables.values():
        table["dp"] = {**table.get("dp", {}), "bounding_report": REPORT}
    return document


def build(workdir: Path, domain: dict, users: int) -> Path:
    path = workdir / "coverage.duckdb"
    path.unlink(missing_ok=True)
    con = open_database(path)
    for table, source in (("persons", "persons"), ("persons_p", "persons"),
                          ("benefits", "benefits"), ("benefits_cells", "benefits")):  # fmt: skip
        con.execute(f"CREATE TABLE {table} AS SELECT * FROM '{workdir}/{source}.parquet'")
    con.close()
    sqlsdc.init(path, policy(domain, users))
    return path


def measure(path: Path, qs: list[dict], exact: dict, reps: int) -> list[dict]:
    tables = {"Q4": "persons_p", "Q3-cells": "benefits_cells"}
    bounded = {}
    with sqlsdc.connect(path, "admin") as con:
        con.set_dp_noise(False)
        for q in qs:
            rows = con.execute(harness.sql_of(q, tables.get(q["id"]))).fetchall()
            bounded[q["id"]] = {
                harness.key(r[:-1]): float(r[-1]) for r in rows if r[-1] is not None
            }
    seen = {q["id"]: [] for q in qs}
    for rep in range(reps):
        harness.new_secret(path)
        with sqlsdc.connect(path, f"u{rep}") as con:
            for q in qs:
                cur = con.execute(harness.sql_of(q, tables.get(q["id"])))
                rows = cur.fetchall()
                for a in cur.cell_accuracy().itertuples():
                    k = harness.key(rows[int(a.row)][:-1])
                    seen[q["id"]].append((k, a.low, a.high, a.dropped, a.clamped))
    out = []
    for q in qs:
        truth, bound, cells = exact[q["id"]], bounded[q["id"]], seen[q["id"]]
        inside_b = [lo <= bound.get(k, 0.0) <= hi for k, lo, hi, _d, _c in cells]
        inside_t = [lo <= truth.get(k, 0.0) <= hi for k, lo, hi, _d, _c in cells]
        bias = [(bound.get(k, 0.0) - truth[k]) / abs(truth[k]) for k, *_ in cells if truth.get(k)]
        shown = [(d, c) for _k, _l, _h, d, c in cells if d == d and c == c]  # not NaN
        out.append({
            "q": q["id"], "cells": len(cells) / reps,
            "cover_bounded": statistics.fmean(inside_b), "cover_exact": statistics.fmean(inside_t),
            "bias": statistics.fmean(bias) if bias else float("nan"),
            "dropped": statistics.fmean(d for d, _c in shown) if shown else float("nan"),
            "clamped": statistics.fmean(c for _d, c in shown) if shown else float("nan"),
        })  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--persons", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="coverage-"))
    workdir.mkdir(parents=True, exist_ok=True)
    domain = harness.prepare(workdir, args.persons)
    qs = harness.questions(harness.public_keys(domain), domain["rows"])
    q3 = next(q for q in qs if q["id"] == "Q3")
    qs.insert(3, {**q3, "id": "Q3-cells"})
    exact = harness.exact_answers(workdir, [q for q in qs if q["id"] != "Q3-cells"])
    exact["Q3-cells"] = exact["Q3"]
    path = build(workdir, domain, args.reps)
    rows = measure(path, qs, exact, args.reps)
    print(f"{args.persons:,} persons, {args.reps} repetitions, bounding report ε = "
          f"{REPORT['epsilon']} per table")  # fmt: skip
    print("| question | cells | 95% coverage, bounded | 95% coverage, exact | bias of bounding "
          "| reported dropped | reported clamped |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['q']} | {r['cells']:,.0f} | {r['cover_bounded']:.1%} | "
              f"{r['cover_exact']:.1%} | {r['bias']:+.2%} | {r['dropped']:.3f} | "
              f"{r['clamped']:.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
