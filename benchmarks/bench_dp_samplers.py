"""Throughput of sqlsdc's exact DP noise: samplers, per-cell noise, quantiles and the catalog.

Issue 4 lists sampler throughput (cells/s) as a benchmark. Noise is drawn in Python, one keyed
PRF stream per cell (HMAC-SHA256 counter mode) and the exact CKS20 samplers over integers, so
its cost is per released cell, not per row: a query's rows are aggregated by the engine first.

  sampler            one draw per cell from KeyedStream(...).derive(cell): the sampler alone
  add_noise          dp_cells.add_noise on a frame of exact cells: canonical identity (JSON),
                     SHA-256 digest, stream, draw, exact rational value
  noisy_quantiles    per-cell medians by permute-and-flip over 100 candidates (10 rows each)
  charge + cache     catalog.budget.charge of one query with N new cells (one transaction that
                     also writes them to sqlsdc.dp_cells), then cached_cells for all N digests

Usage: python benchmarks/bench_dp_samplers.py [--cells 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd

from sqlsdc.catalog import budget, dp_cache
from sqlsdc.catalog.store import ensure_catalog
from sqlsdc.engines.duckdb import open_database
from sqlsdc.mechanisms.accountant import Bounding, BudgetLimit, PrivacyCost, Statistic, calibrate
from sqlsdc.mechanisms.dp_cells import CellMechanism, CellSpace, add_noise, noisy_quantiles
from sqlsdc.mechanisms.prf import KeyedStream
from sqlsdc.mechanisms.samplers import discrete_gaussian, discrete_laplace

SECRET = b"benchmark secret, not for production"


def _rate(fn, n: int, repeat: int) -> float:
    """Median cells per second of ``fn()`` processing n cells."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return n / statistics.median(times)


def samplers(n: int, repeat: int) -> list[tuple[str, float]]:
    base = KeyedStream(SECRET, 1, "bench")
    rows = []
    for name, draw, params in (
        ("discrete Laplace", discrete_laplace, (1, 10, 1000, 10**6)),
        ("discrete Gaussian", discrete_gaussian, (1, 100, 10**6, 10**12)),
    ):
        for p in params:
            param = Fraction(p)

            def run(draw=draw, param=param):
                for i in range(n):
                    draw(param, base.derive(i))

            label = "t" if draw is discrete_laplace else "σ²"
            rows.append((f"sampler: {name}, {label} = {p:g}", _rate(run, n, repeat)))
    return rows


def cells(n: int, repeat: int) -> list[tuple[str, float]]:
    frame = pd.DataFrame({
        "region": np.arange(n) % 97,
        "sex": np.where(np.arange(n) % 2, "F", "M"),
        "age": np.arange(n) // 194,
        "n": np.arange(n) % 500,
        "s": (np.arange(n) % 500) * 1234.0,
    })  # fmt: skip
    space = CellSpace.of("persons", ["region", "sex", "age"])
    count = calibrate(Statistic.COUNT, Bounding(max_groups=3), PrivacyCost(epsilon=1))
    total = calibrate(Statistic.SUM, Bounding(lower=0, upper=10**5),
                      PrivacyCost(rho=Fraction(1, 10)))  # fmt: skip
    rows = []
    for label, mechanisms in (
        ("add_noise: COUNT, Laplace", {"n": CellMechanism("*", count)}),
        ("add_noise: SUM, Gaussian", {"s": CellMechanism("income", total)}),
    ):
        run = lambda m=mechanisms: add_noise(frame, space, m, secret=SECRET, policy_version=1)  # noqa: E731
        rows.append((label, _rate(run, n, repeat)))
    m = max(n // 20, 1)
    hist = pd.DataFrame({
        "cell": np.repeat(np.arange(m), 100),
        "bin": np.tile(np.arange(100), m),
        "count": 10,
    })  # fmt: skip
    median = calibrate(Statistic.QUANTILE, Bounding(lower=0, upper=99), PrivacyCost(epsilon=1))
    run = lambda: noisy_quantiles(hist, CellSpace.of("t", ["cell"]), CellMechanism("x", median),  # noqa: E731
                                  secret=SECRET, policy_version=1)  # fmt: skip
    rows.append(("noisy_quantiles: median of 100 candidates", _rate(run, m, repeat)))

    with tempfile.TemporaryDirectory() as tmp:
        con = open_database(Path(tmp) / "bench.duckdb")
        ensure_catalog(con)
        limits = {budget.BudgetKey("bench"): BudgetLimit(epsilon=10**9)}
        noisy = [add_noise(frame.assign(v=i), space, {"n": CellMechanism("*", count)},
                           secret=SECRET, policy_version=i) for i in range(repeat)]  # fmt: skip
        times = []
        for i, out in enumerate(noisy):
            start = time.perf_counter()
            budget.charge(con, user="bench", tables=["persons"], cost=count.cost, query_id=i,
                          limits=limits, cells=out.new_cells, policy_version=i,
                          sql="SELECT COUNT(*) FROM persons")  # fmt: skip
            times.append(time.perf_counter() - start)
        rows.append((f"charge + cache {n} cells (one transaction)", n / statistics.median(times)))
        digests = [c.identity.digest for c in noisy[0].new_cells]
        rows.append(
            (
                "cached_cells lookup",
                _rate(lambda: dp_cache.cached_cells(con, "bench", 0, digests), n, repeat),
            )
        )
        con.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = samplers(max(args.cells // 4, 1), args.repeat) + cells(args.cells, args.repeat)
    width = max(len(name) for name, _ in rows)
    print(f"{'what':<{width}}  cells/s")
    for name, rate in rows:
        print(f"{name:<{width}}  {rate:>10,.0f}")


if __name__ == "__main__":
    main()
