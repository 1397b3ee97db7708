"""Benchmark: controlled tabular adjustment (sqlsdc.tabular.cta) on large 3-D tables.

Builds flat 3-D count tables (inner cells ~ Poisson(Gamma(0.8, 25)), so a tail of small cells
exists; empty cells are left out as the table model does), marks cells with 0 < n < 5 as
sensitive (frequency rule, 30 % safety range, at least 1), and runs the fixed-direction CTA LP
(HiGHS through OR-Tools' model builder, filled from the sparse constraint matrix in one call).
Then the free-direction MILP on a small 2-D table, with the LP heuristic's objective beside it.

    python benchmarks/bench_cta.py                     # 50x40x25 and 100x80x50 (~54k, ~417k cells)
    python benchmarks/bench_cta.py --shapes 20x20x20   # other sizes
    python benchmarks/bench_cta.py --milp 40x30 --time-limit 60

Columns: cells, constraint rows, sensitive cells, seconds to build the table (cells, X, A), to
build the LP (rules, bounds, model), to solve it, the status, the objective (Σ |change|/value),
max |A @ adjusted|, and the process's peak resident memory so far.
"""

from __future__ import annotations

import argparse
import platform
import resource
import time

import numpy as np
import pandas as pd

from sqlsdc.tabular.cta import cta
from sqlsdc.tabular.model import Table
from sqlsdc.tabular.rules import FrequencyRule

RULES = [FrequencyRule(min_freq=5, safety_range=30)]


def count_table(shape: tuple[int, ...], seed: int) -> Table:
    rng = np.random.default_rng(seed)
    idx = np.indices(shape).reshape(len(shape), -1)
    counts = rng.poisson(rng.gamma(0.8, 25, idx.shape[1]))
    keep = counts > 0
    frame = {f"d{k}": np.char.add(f"d{k}.", idx[k][keep].astype(str)) for k in range(len(shape))}
    cells = pd.DataFrame(frame).assign(value=counts[keep].astype(float), n=counts[keep])
    return Table.from_cells(cells, list(frame))


def run_lp(shape, seed, time_limit):
    start = time.perf_counter()
    table = count_table(shape, seed)
    table_s = time.perf_counter() - start
    start = time.perf_counter()
    out = cta(table, rules=RULES, time_limit=time_limit)
    total = time.perf_counter() - start
    r = out.attrs["cta"]
    return {
        "table": "x".join(map(str, shape)),
        "cells": len(table.cells),
        "rows": table.A.shape[0],
        "sensitive": r.n_sensitive,
        "table s": round(table_s, 2),
        "build s": round(total - r.solve_seconds, 2),
        "solve s": round(r.solve_seconds, 2),
        "status": r.status,
        "objective": round(r.objective, 3),
        "additivity": f"{r.max_additivity_error:.1e}",
        "peak MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }


def run_milp(shape, seed, time_limit):
    table = count_table(shape, seed)
    lp = cta(table, rules=RULES, time_limit=time_limit).attrs["cta"]
    start = time.perf_counter()
    r = cta(table, rules=RULES, method="milp", time_limit=time_limit).attrs["cta"]
    return {
        "table": "x".join(map(str, shape)),
        "cells": len(table.cells),
        "binaries": r.n_sensitive,
        "LP objective": round(lp.objective, 4),
        "MILP objective": round(r.objective, 4),
        "bound": round(r.bound, 4),
        "gap": f"{r.gap:.2%}",
        "status": r.status,
        "seconds": round(time.perf_counter() - start, 2),
    }


def markdown(rows: list[dict]) -> str:
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[h]) for h in head) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["50x40x25", "100x80x50"])
    parser.add_argument("--milp", default="30x20")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(
        f"# CTA on {platform.processor() or platform.machine()}, python {platform.python_version()}"
    )
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    print(markdown([run_lp(s, args.seed, args.time_limit) for s in shapes]))
    print()
    milp = tuple(int(x) for x in args.milp.split("x"))
    print(markdown([run_milp(milp, args.seed, args.time_limit)]))


if __name__ == "__main__":
    main()
