"""CPU time of one DP quantile draw (permute-and-flip) against the size of its cell.

A median over a grid of k + 1 candidates is drawn by
:func:`sqlsdc.mechanisms.dp_cells.permute_and_flip` from the cell's histogram scores. Its cost
should be set by k + 1 and the rate (the policy), not by the cell's rows: a timed quantile
would otherwise tell its cell's size. For each grid and cell size the script draws ``--cells``
cells (one keyed stream each; rows uniform over the grid, epsilon = 1/5, so rate = 1/10) and
prints the median and the 10th-90th percentiles of the CPU time per draw
(``time.process_time``: the machine's other cores are busy), then one draw over 10^6
candidates whose best stands alone.

Usage: python benchmarks/bench_permute_flip.py [--cells 100]
(run it with PYTHONPATH at another checkout's root to measure that version: same script)
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction

import numpy as np

from sqlsdc.mechanisms.dp_cells import permute_and_flip, quantile_scores
from sqlsdc.mechanisms.prf import KeyedStream

SECRET = b"benchmark secret, not for production"
RATE = Fraction(1, 10)  # epsilon 1/5 for a median: rate = epsilon / (2 Delta), Delta = 1


def per_draw(scores: np.ndarray, cells: int, label: str) -> np.ndarray:
    """CPU milliseconds of each of ``cells`` draws on ``scores``, one keyed stream each."""
    base = KeyedStream(SECRET, 1, label)
    times = []
    for cell in range(cells):
        stream = base.derive(cell)
        start = time.process_time()
        permute_and_flip(scores, RATE, stream)
        times.append((time.process_time() - start) * 1e3)
    return np.array(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=100)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    print("| candidates | rows in the cell | CPU ms per draw: median (p10-p90) |")
    print("|---:|---:|---:|")
    for k in (101, 3001):
        for rows in (12, 120, 1200, 12_000):
            hist = np.bincount(rng.integers(0, k, rows), minlength=k)
            t = per_draw(quantile_scores(hist, Fraction(1, 2)), args.cells, f"{k}/{rows}")
            p10, p50, p90 = np.percentile(t, [10, 50, 90])
            print(f"| {k:,} | {rows:,} | {p50:.2f} ({p10:.2f}-{p90:.2f}) |")
    alone = np.full(10**6, 10**6, dtype=np.int64)
    alone[777_777] = 0
    start = time.process_time()
    permute_and_flip(alone, Fraction(1, 2), KeyedStream(SECRET, 1, "alone"))
    print(f"| 1,000,000 | one best alone | {(time.process_time() - start) * 1e3:,.0f} |")


if __name__ == "__main__":
    main()
