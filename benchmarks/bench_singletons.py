"""Benchmark: what a singleton's respondent computes under each singleton method (red team s44o).

Random 2-5 x 3-6 count tables (cells Poisson(3), ``numpy.random.default_rng(seed)``, rows and
columns drawn first), protected by ``protect`` with the frequency rule 3 and each method
(``gauss``, ``optimal``, ``hitas``) and singleton method. The attacker is the respondent of one
singleton (an inner cell of count 1, primary): the published cells as equalities, every inner
cell >= 0, the singleton's own cell fixed at 1, and one pair of LPs per other primary cell
(inner or margin). A pair is *computed* when the LP interval is narrower than 0.5 (a count is
then known). Prints, per method and singleton method: tables, singletons, hidden cells, pairs
computed and CPU seconds of ``protect``.

    python benchmarks/bench_singletons.py                          # gauss, seeds 0-99
    python benchmarks/bench_singletons.py --methods gauss optimal hitas --seeds 300
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
from scipy.optimize import linprog

from sqlsdc.tabular.api import protect
from sqlsdc.tabular.rules import FrequencyRule

TOTAL = "Total"


def table(seed: int) -> pd.DataFrame:
    """One random count table as microdata (one row per person)."""
    rng = np.random.default_rng(seed)
    n_r, n_c = int(rng.integers(2, 6)), int(rng.integers(3, 7))
    counts = rng.poisson(3, size=(n_r, n_c))
    people = [(f"r{i}", f"c{j}") for i in range(n_r) for j in range(n_c)
              for _ in range(counts[i, j])]  # fmt: skip
    return pd.DataFrame(people, columns=["r", "c"])


def computed_pairs(out: pd.DataFrame) -> tuple[int, int]:
    """(singletons, (singleton, primary) pairs computed by the singleton's respondent)."""
    out = out.reset_index(drop=True)
    inner = [k for k in range(len(out)) if TOTAL not in (out.r[k], out.c[k])]
    where = {k: i for i, k in enumerate(inner)}

    def row(k):
        return [float(out.r[k] in (TOTAL, out.r[j]) and out.c[k] in (TOTAL, out.c[j]))
                for j in inner]  # fmt: skip

    published = [k for k in range(len(out)) if out.status[k] == "published"]
    a_eq = [row(k) for k in published] or None
    b_eq = [float(out.value[k]) for k in published] or None
    primary = [k for k in range(len(out)) if out.status[k] == "primary"]
    singles = [k for k in primary if k in where and out.n[k] == 1]
    pairs = 0
    for s in singles:
        bounds = [(1.0, 1.0) if i == where[s] else (0.0, None) for i in range(len(inner))]
        for p in primary:
            if p == s:
                continue
            target = row(p)
            lo = linprog(target, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs")
            hi = linprog([-t for t in target], A_eq=a_eq, b_eq=b_eq, bounds=bounds,
                         method="highs")  # fmt: skip
            if lo.status == 0 and hi.status == 0 and -hi.fun - lo.fun < 0.5:
                pairs += 1
    return len(singles), pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--methods", nargs="+", default=["gauss"])
    parser.add_argument("--singleton", nargs="+", default=["anySum", "anySumAudit", "subSpace"])
    args = parser.parse_args()
    print("| method | singleton | tables | singletons | hidden | pairs computed | CPU s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for method in args.methods:
        for singleton in args.singleton:
            singles = hidden = pairs = 0
            cpu = 0.0
            for seed in range(args.seeds):
                data = table(seed)
                t = time.process_time()
                out = protect(data, ["r", "c"], None, rules=[FrequencyRule(3)], method=method,
                              time_limit=10, singleton_method=singleton)  # fmt: skip
                cpu += time.process_time() - t
                hidden += int((out.status != "published").sum())
                s, p = computed_pairs(out)
                singles += s
                pairs += p
            print(f"| {method} | {singleton} | {args.seeds} | {singles} | {hidden} | {pairs} | "
                  f"{cpu:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
