"""Benchmark: the microaggregation optimiser (``improve``) against recomputing every round.

``improve`` carries candidate lists and local-search evaluations from round to round. This
times it (200 rounds, no time limit) next to the straightforward algorithm it replaced, kept as
the oracle of ``tests/microdata/test_improve_incremental.py``, and checks that both return the
same labels: on the CASC files (13 variables, k ∈ {3, 5, 10}) and, with ``--demo``, on the
README's anonymisation example (income of the 28,025 persons aged 65+ in region R01 of the
1,000,000-person demo, k = 5).

    sqlsdc demo --db /tmp/demo.duckdb --no-queries
    python benchmarks/bench_improve.py --demo /tmp/demo.duckdb

Times are wall-clock and CPU seconds of this process (the machine is shared; CPU time is the
steadier figure). Both kernels are compiled before timing.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from sqlsdc.microdata.microaggregation import improve, information_loss, standardise

ORACLE = Path(__file__).parents[1] / "tests" / "microdata" / "test_improve_incremental.py"


def load_oracle():
    spec = importlib.util.spec_from_file_location("oracle", ORACLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.oracle


def timed(fn, *args, **kwargs):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def cases(data: Path, demo: Path | None):
    for name in ("casc_census", "tarragona"):
        X = standardise(pd.read_csv(data / f"{name}.csv").to_numpy(float))
        for k in (3, 5, 10):
            yield name, k, X
    if demo is not None:
        with duckdb.connect(str(demo), read_only=True) as con:
            sql = "SELECT income FROM persons WHERE region = 'R01' AND age >= 65"
            income = con.execute(sql).df()["income"].to_numpy(dtype=float, na_value=np.nan)
        yield "demo R01 65+ income", 5, standardise(income[np.isfinite(income)][:, None])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    ap.add_argument("--demo", type=Path, help="a 1,000,000-person `sqlsdc demo` database")
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    oracle = load_oracle()
    warm = np.random.default_rng(0).standard_normal((60, 2))
    oracle(warm, 3, rounds=2), improve(warm, 3, rounds=2)
    print("| data | records | k | IL | every round (wall / CPU s) | improve (wall / CPU s) "
          "| same labels |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, k, X in cases(args.data, args.demo):
        expected, w0, c0 = timed(oracle, X, k, rounds=args.rounds)
        got, w1, c1 = timed(improve, X, k, rounds=args.rounds, time_limit=float("inf"))
        same = "yes" if (got == expected).all() else "NO"
        print(f"| {name} | {len(X):,} | {k} | {information_loss(X, got):.3f} "
              f"| {w0:.1f} / {c0:.1f} | {w1:.1f} / {c1:.1f} | {same} |")  # fmt: skip


if __name__ == "__main__":
    main()
