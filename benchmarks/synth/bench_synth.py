"""Quality and time of sqlsdc's synthesisers (issue 19): SDMetrics quality score
(sqlsdc.synth.utility.quality_score), synthesis time, share of synthetic records identical to an
original and replicated uniques, on the CASC Census data, Tarragona, SD2011 and the demo persons.

    python benchmarks/synth/bench_synth.py [--reps 5] [--write-csv DIR] [--sets NAME ...]

``--write-csv DIR`` keeps every synthetic copy (``DATA.METHOD.REP.csv``, and the demo persons
themselves as ``real/demo_persons.csv``), for bench_peers.py to score with the SDMetrics package.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
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
    "demo_persons": lambda: demo_persons(),
}


def demo_persons(persons: int = 10_000) -> pd.DataFrame:
    """The demo's persons (seed 0) without their identifiers, which a synthesis job drops."""
    from sqlsdc.demo.data import build_tables

    table = build_tables(persons, seed=0)["persons"].to_pandas()
    return table.drop(columns=["person_id", "household_id"])


def methods():
    found = {
        "cart (balanced draws)": lambda d, rng: synthesize_cart(d, rng=rng, draw="balanced"),
        "cart (synthpop draws)": lambda d, rng: synthesize_cart(d, rng=rng),  # the default
    }
    if importlib.util.find_spec("sqlsdc.synth.parametric"):
        from sqlsdc.synth.parametric import synthesize_parametric

        found["parametric"] = lambda d, rng: synthesize_parametric(d, rng=rng)
    return found


def slug(label: str) -> str:
    """``"cart (synthpop draws)"`` → ``"cart-synthpop-draws"``: one file name per method."""
    return "-".join(re.findall(r"[a-z0-9]+", label.lower()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--write-csv", type=Path)
    parser.add_argument("--sets", nargs="+", choices=list(SETS), default=list(SETS))
    args = parser.parse_args()
    print("| data | method | quality | time (s) | identical | ru % | ru/p1 % |")
    print("|---|---|---|---|---|---|---|")
    for name in args.sets:
        data = SETS[name]()
        if args.write_csv and name == "demo_persons":
            (args.write_csv / "real").mkdir(parents=True, exist_ok=True)
            data.to_csv(args.write_csv / "real" / f"{name}.csv", index=False)
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
                if args.write_csv:
                    args.write_csv.mkdir(parents=True, exist_ok=True)
                    syn.to_csv(args.write_csv / f"{name}.{slug(label)}.{rep}.csv", index=False)
            q, t, ident, ru, rup1 = np.mean(rows, axis=0)
            print(f"| {name} | {label} | {q:.4f} | {t:.2f} | {ident:.2%} | {ru:.2f} | {rup1:.1f} |")


if __name__ == "__main__":
    main()
