"""Benchmark: multivariate microaggregation (sqlsdc.microdata) on the CASC reference files.

For Census (1,080 × 13) and Tarragona (834 × 13), all 13 variables standardised, k ∈ {3, 5, 10}:
information loss IL = 100·SSE/SST and time of MDAV and of the optimiser (``improve``: MDAV,
local search, iterated local search), next to sdcMicro's MDAV and the targets of issue 20
(Castro, Gentile & Spagnolo-Arrizabalaga 2022: MDAV/VMDAV + two-swap, and their best heuristic).
Then MDAV time on synthetic standard-normal records × 5 variables (k = 3), whole up to 2·10^5
records and partitioned (``mdav(..., block=)``) above ``--block``. Prints markdown.

    python benchmarks/bench_microdata.py
    python benchmarks/bench_microdata.py --data /work/shared/data --rounds 400
    python benchmarks/bench_microdata.py --skip-casc --sizes 1e5 1e6 --block 50000

Times are wall-clock seconds and CPU seconds of this process (the machine is shared; CPU time
is the steadier figure). The first call compiles the numba kernels (cached on disk after).
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd

from sqlsdc.microdata.microaggregation import improve, information_loss, mdav, standardise

# (sdcMicro MDAV, issue target for the optimiser, best published: Castro et al. 2022 Table 5)
REFERENCE = {
    ("casc_census", 3): (5.69, 5.25, 4.79),
    ("casc_census", 5): (9.09, 8.12, 7.84),
    ("casc_census", 10): (14.16, 12.36, 12.32),
    ("tarragona", 3): (16.93, 15.00, 14.50),
    ("tarragona", 5): (22.46, 20.74, 20.25),
    ("tarragona", 10): (33.19, 30.77, 30.55),
}


def timed(fn, *args, **kwargs):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def casc(data: Path, rounds: int, time_limit: float) -> None:
    print("| data | k | sdcMicro MDAV | MDAV IL | MDAV s | optimiser IL | s (wall/CPU) | target "
          "| best published |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, k), (ref_mdav, target, best) in REFERENCE.items():
        X = standardise(pd.read_csv(data / f"{name}.csv").to_numpy(float))
        labels, w0, _ = timed(mdav, X, k)
        better, w1, c1 = timed(improve, X, k, rounds=rounds, time_limit=time_limit)
        assert np.bincount(better).min() >= k
        il0, il1 = information_loss(X, labels), information_loss(X, better)
        ok = "✓" if il1 <= target else "✗"
        print(f"| {name} | {k} | {ref_mdav:.2f} | {il0:.2f} | {w0:.3f} | {il1:.2f} {ok} "
              f"| {w1:.1f} / {c1:.1f} | ≤ {target:.2f} | {best:.2f} |")  # fmt: skip


def synthetic(sizes: list[float], d: int, k: int, block: int) -> None:
    mdav(np.zeros((2 * k, d)), k)  # compile (or load the cache) outside the timing
    print(f"\n| records × {d} | k | MDAV | s (wall / CPU) | IL |")
    print("|---|---|---|---|---|")
    for n in sizes:
        X = np.random.default_rng(1).standard_normal((int(n), d))
        runs = [("whole", None)] if n <= 2e5 else []
        runs += [(f"partitioned, block {block:,}", block)] if n > block else []
        for label, size in runs:
            labels, wall, cpu = timed(mdav, X, k, block=size)
            assert np.bincount(labels).min() >= k
            il = information_loss(X, labels)
            print(f"| {int(n):,} | {k} | {label} | {wall:.1f} / {cpu:.1f} | {il:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    ap.add_argument("--rounds", type=int, default=200, help="iterated-local-search rounds")
    ap.add_argument("--time-limit", type=float, default=30.0, help="seconds per optimiser run")
    ap.add_argument("--sizes", type=float, nargs="*", default=[1e5])
    ap.add_argument("--vars", type=int, default=5)
    ap.add_argument("--block", type=int, default=50_000, help="partitioned MDAV part size")
    ap.add_argument("--skip-casc", action="store_true")
    args = ap.parse_args()
    print(f"python {platform.python_version()}, {platform.machine()}")
    if not args.skip_casc:
        casc(args.data, args.rounds, args.time_limit)
    synthetic(args.sizes, args.vars, 3, args.block)


if __name__ == "__main__":
    main()
