"""Quality and time of sqlsdc's synthesisers (issue 19): SDMetrics quality score
(sqlsdc.synth.utility.quality_score), synthesis time, share of synthetic records identical to an
original and replicated uniques, on the CASC Census data, Tarragona and SD2011.

    python benchmarks/synth/bench_synth.py [--reps 5] [--write-csv DIR]

``--write-csv`` keeps the first synthetic copy of each run, for bench_peers.py to score with the
SDMetrics package itself. The parametric method is measured when sqlsdc.synth.parametric exists.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import numpy as np
import pandas as pd

from sqlsdc.synth.cart import synthesize_cart
from sqlsdc.synth.disclosure import identical_share, replicated_uniques
from sqlsdc.synth.utility import quality_score

DATA = Path("/work/shared/data")
SETS = {
    "casc_census": lambda: pd.read_csv(DATA / "casc_census.csv"),
    "tarragona": lambda: pd.read_csv(DATA / "tarragona.csv"),
    "sd2011": lambda: pd.read_csv(DATA / "sd2011.csv"),
}


def methods():
    found = {
        "cart": lambda d, rng: synthesize_cart(d, rng=rng),
        "cart (synthpop draws)": lambda d, rng: synthesize_cart(d, rng=rng, draw="random"),
    }
    if importlib.util.find_spec("sqlsdc.synth.parametric"):
        from sqlsdc.synth.parametric import synthesize_parametric

        found["parametric"] = lambda d, rng: synthesize_parametric(d, rng=rng)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--write-csv", type=Path)
    args = parser.parse_args()
    print("| data | method | quality | time (s) | identical | ru % | ru/p1 % |")
    print("|---|---|---|---|---|---|---|")
    for name, load in SETS.items():
        data = load()
        for label, run in methods().items():
            rows = []
            for rep in range(args.reps):
                started = time.perf_counter()
                syn, _ = run(data, np.random.default_rng(rep))
                seconds = time.perf_counter() - started
                ru = replicated_uniques(data, syn)
                quality = quality_score(data, syn)["score"]
                share = identical_share(data, syn)
                rows.append((quality, seconds, share, ru["ru"], ru["ru_of_p1"] or 0.0))
                if rep == 0 and args.write_csv:
                    args.write_csv.mkdir(parents=True, exist_ok=True)
                    syn.to_csv(args.write_csv / f"{name}.{label.split()[0]}.csv", index=False)
            q, t, ident, ru, rup1 = np.mean(rows, axis=0)
            print(f"| {name} | {label} | {q:.4f} | {t:.2f} | {ident:.2%} | {ru:.2f} | {rup1:.1f} |")


if __name__ == "__main__":
    main()
