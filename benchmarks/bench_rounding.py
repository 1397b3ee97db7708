"""Benchmark: controlled rounding (sqlsdc.tabular.rounding) of hierarchical tables.

Builds hierarchical 2-D (and optionally 3-D) count tables of about 10^2 .. 10^4 cells from
aggregated inner cells (every dimension: Total -> G groups -> S codes per group; inner counts
1 + a geometric variate, so most cells are small and few are multiples of the base), rounds them
with ``controlled_round`` whole (``partition=None``) and partitioned along the first dimension
(then improved as a whole for the time left; once more with a 3 s limit),
checks the result (every cell an adjacent multiple or a reported violation, ``A @ rounded == 0``)
and prints a markdown table.

    python benchmarks/bench_rounding.py                        # 10^2, 10^3, 10^4 cells, 2-D
    python benchmarks/bench_rounding.py --sizes 1e4 --dims 3   # a 3-D table
    python benchmarks/bench_rounding.py --base 10 --time-limit 60

Columns: cells, inner cells, non-multiples (cells with a decision), mode, models solved,
seconds, status, max excess (the relaxation y·β: 0 is a zero-restricted controlled rounding),
distance (Σ |rounded - value| over inner cells) and its ratio to conventional rounding of the
inner cells (which is additive only after recomputing margins: Salazar's trivial solution).
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import pandas as pd

from sqlsdc.tabular import Table, controlled_round


def shape_for(cells: float, dims: int) -> tuple[int, int]:
    """(groups, codes per group) so that (1 + G + G*S) ** dims is about ``cells``."""
    codes = cells ** (1.0 / dims)
    groups = max(1, round((codes - 1) ** 0.5))
    per = max(1, round((codes - 1 - groups) / groups))
    return groups, per


def table(dims: int, cells: float, seed: int, mean: float) -> Table:
    groups, per = shape_for(cells, dims)
    rng = np.random.default_rng(seed)
    axes, hiers = [], {}
    for d in range(dims):
        name = f"d{d}"
        parents = {f"{name}.{g}": None for g in range(groups)}
        for g in range(groups):
            parents.update({f"{name}.{g}.{s}": f"{name}.{g}" for s in range(per)})
        hiers[name] = parents
        axes.append([c for c, p in parents.items() if p is not None])
    grid = pd.MultiIndex.from_product(axes, names=list(hiers)).to_frame(index=False)
    grid["value"] = rng.geometric(1.0 / mean, len(grid)).astype(np.float64)
    grid["n"] = 1
    return Table.from_cells(grid, list(hiers), top=[], hierarchies=hiers)


def run(t: Table, base: int, partition, time_limit: float, seed: int) -> dict:
    t0 = time.perf_counter()
    r = controlled_round(t, base, partition=partition, time_limit=time_limit, seed=seed)
    seconds = time.perf_counter() - t0
    rounded = r.cells["rounded"].to_numpy(dtype=np.float64)
    additive = bool(np.all(t.A @ rounded == 0))
    values = t.values
    multiple = values % base == 0
    inner = t.cells["is_inner"].to_numpy()
    lower = np.floor(values / base) * base
    adjacent = np.where(multiple, rounded == values, np.abs(rounded - lower - base / 2) == base / 2)
    assert additive and np.all(rounded % base == 0) and adjacent[inner].all()
    assert (~adjacent).sum() == len(r.violations)  # margins off their multiples are reported
    conventional = np.floor(values / base + 0.5) * base
    conv_distance = np.abs(conventional - values)[inner].sum()
    return {
        "cells": len(t.cells),
        "inner": int(inner.sum()),
        "non-multiples": int((~multiple).sum()),
        "mode": f"partition {r.partition}" if r.partition else "whole",
        "limit s": time_limit,
        "models": r.subtables,
        "seconds": seconds,
        "status": r.status,
        "max excess": r.max_excess,
        "violations": len(r.violations),
        "distance": r.distance,
        "vs conventional": r.distance / conv_distance if conv_distance else 1.0,
    }


def markdown(rows: list[dict]) -> str:
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for row in rows:
        cells = [
            f"{v:,.2f}"
            if isinstance(v, float) and k != "max excess"
            else f"{v:,}"
            if isinstance(v, int)
            else str(v)
            for k, v in row.items()
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e2,1e3,1e4", help="approximate cell counts")
    ap.add_argument("--dims", type=int, default=2)
    ap.add_argument("--base", type=int, default=5)
    ap.add_argument("--mean", type=float, default=8.0, help="mean inner count")
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rows = []
    for size in (float(s) for s in args.sizes.split(",")):
        t = table(args.dims, size, args.seed, args.mean)
        for partition, limit in ((None, args.time_limit), ("d0", args.time_limit), ("d0", 3.0)):
            rows.append(run(t, args.base, partition, limit, args.seed))
            print(rows[-1], flush=True)
    print(f"\n{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"base {args.base}, time limit {args.time_limit:g} s\n")  # fmt: skip
    print(markdown(rows))


if __name__ == "__main__":
    main()
