"""dp-ipf on SD2011's S3/S5/S7 variable sets next to Raab's Table 3, and the time of synthesis of
10^6 rows × 10 variables (issue 19, item 7).

    python benchmarks/synth/bench_ipf.py [--reps 10] [--eps 0.5 1 2] [--sets S3 S5 S7]
                                          [--rows 1000000] [--skip-raab] [--skip-timing]

Part 1 runs the steps of the ``dp-ipf`` job (:func:`sqlsdc.synth.job._run_dp`) without a
database: the margins are counted with numpy (the job's ``GROUP BY``; the same counts), each
cell gets the job's keyed discrete Laplace noise of scale M/ε (:func:`sqlsdc.synth.ipf.
noisy_counts`, one row per person, so the bound is 1) from a fixed benchmark secret, and
:func:`sqlsdc.synth.ipf.synthesize_dp_ipf` fits and samples, once with the consistency
projection and once without it on the same noisy margins (a paired comparison). Reported: mean
two-way and three-way standardised U (:func:`sqlsdc.synth.utility.utility_tables`, Raab 2024
§3) and %ru (:func:`sqlsdc.synth.disclosure.replicated_uniques`, divided by N per the digest's
erratum), averaged over the seeds 0..reps−1.

Variables (Raab 2024 §C.5 of the digest; missing values are a level, as in synthpop): S3 = sex,
age in 5 groups ([16,25) [25,35) [35,45) [45,60) [60,∞)), placesize; S5 adds edu, socprof;
S7 adds income in 5 groups ([−8,0) "not applicable", [0,700), [700,1200), [1200,1800),
[1800,∞)) and marital.

Part 2 times ``parametric`` and ``cart`` on a generated frame of ``--rows`` × 10 (5 categorical,
5 numeric, all driven by two latent factors), and dp-ipf on ``--rows`` × 10 categorical.
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction

import numpy as np
import pandas as pd

from sqlsdc.synth import ipf
from sqlsdc.synth.cart import synthesize_cart
from sqlsdc.synth.disclosure import replicated_uniques
from sqlsdc.synth.parametric import synthesize_parametric
from sqlsdc.synth.rng import noise_stream, synth_rng
from sqlsdc.synth.utility import utility_tables

DATA = "/work/shared/data/sd2011.csv"
SECRET = b"sqlsdc benchmark secret (not a database's)"
AGE = [16, 25, 35, 45, 60, np.inf]
INCOME = [-8, 0, 700, 1200, 1800, np.inf]
SETS = {
    "S3": ["sex", "age", "placesize"],
    "S5": ["sex", "age", "placesize", "edu", "socprof"],
    "S7": ["sex", "age", "placesize", "edu", "socprof", "income", "marital"],
}
# Raab 2024, Table 3 (digest §C.6): mean two-way U, mean three-way U, %ru.
RAAB = {
    ("S3", "0.5"): (1.69, 1.90, 0.00), ("S5", "0.5"): (14.59, 8.91, 0.99),
    ("S7", "0.5"): (31.67, 20.85, 0.68),
    ("S3", "1"): (1.15, 1.40, 0.00), ("S5", "1"): (5.48, 4.21, 1.29),
    ("S7", "1"): (15.21, 9.51, 3.46),
    ("S3", "2"): (1.08, 1.31, 0.00), ("S5", "2"): (2.84, 2.65, 1.55),
    ("S7", "2"): (5.86, 4.37, 5.55),
}  # fmt: skip


def sd2011_codes() -> pd.DataFrame:
    """The seven variables of S7 as level codes 0..L−1 (missing: the last level)."""
    raw = pd.read_csv(DATA)
    frame = pd.DataFrame({
        "sex": raw["sex"],
        "age": pd.cut(raw["age"], AGE, right=False),
        "placesize": raw["placesize"],
        "edu": raw["edu"],
        "socprof": raw["socprof"],
        "income": pd.cut(raw["income"], INCOME, right=False),
        "marital": raw["marital"],
    })  # fmt: skip
    codes = {}
    for name, column in frame.items():
        levels = sorted(column.dropna().unique())
        code = pd.Categorical(column, categories=levels).codes.astype(np.int64)
        code[code < 0] = len(levels)  # missing, a level of its own (only where it occurs)
        codes[name] = code
    return pd.DataFrame(codes)


def margin_counts(codes: np.ndarray, axes: tuple[int, ...], shape: list[int]) -> np.ndarray:
    """The job's ``GROUP BY`` of one margin, as a dense array of counts."""
    sub = [shape[a] for a in axes]
    flat = np.ravel_multi_index(tuple(codes[:, a] for a in axes), sub)
    return np.bincount(flat, minlength=int(np.prod(sub))).reshape(sub)


def noisy_margins(codes: np.ndarray, shape: list[int], epsilon: Fraction, seed: int) -> dict:
    """All two-way margins with the job's keyed discrete Laplace noise of scale M/ε."""
    margins = ipf.default_margins(len(shape))
    scale = Fraction(len(margins)) / epsilon
    noisy = {}
    for m in margins:
        label = ",".join(map(str, m))
        noisy[m] = ipf.noisy_counts(
            margin_counts(codes, m, shape), scale,
            lambda i, label=label: noise_stream(SECRET, seed, "sd2011", "dp-ipf", label, i),
        )  # fmt: skip
    return noisy


def raab(reps: int, epsilons: list[str], sets: list[str]) -> list[dict]:
    """Part 1: mean U and %ru of dp-ipf with and without the projection."""
    data = sd2011_codes()
    rows = []
    for name in sets:
        original = data[SETS[name]]
        shape = [int(original[c].max()) + 1 for c in original.columns]
        codes = original.to_numpy()
        for eps in epsilons:
            found = {True: [], False: []}
            started = time.perf_counter()
            for seed in range(reps):
                noisy = noisy_margins(codes, shape, Fraction(eps), seed)
                for project in (True, False):
                    rng = synth_rng(SECRET, seed, "dp-ipf:copy1")
                    out, details = ipf.synthesize_dp_ipf(noisy, shape=shape, rng=rng,
                                                         project=project)  # fmt: skip
                    syn = pd.DataFrame(out, columns=original.columns)
                    two = utility_tables(original, syn, way=2)
                    three = utility_tables(original, syn, way=3)
                    ru = replicated_uniques(original, syn)
                    found[project].append((two["mean"], three["mean"], three["worst"], ru["ru"],
                                           details["ipf"]["converged"]))  # fmt: skip
            seconds = time.perf_counter() - started
            for project in (True, False):
                values = np.array(found[project], float)
                rows.append({
                    "set": name, "eps": eps, "project": project, "reps": reps,
                    "u2": values[:, 0].mean(), "u3": values[:, 1].mean(),
                    "u2_se": values[:, 0].std(ddof=1) / np.sqrt(reps) if reps > 1 else np.nan,
                    "u3_worst": values[:, 2].mean(), "ru": values[:, 3].mean(),
                    "unconverged": int((values[:, 4] == 0).sum()),
                    "seconds": seconds / 2, "k": int(np.prod(shape)),
                    "p1": replicated_uniques(original, original)["p1"],
                })  # fmt: skip
            print(_raab_row(rows[-2]), _raab_row(rows[-1]), sep="\n", flush=True)
    return rows


def _raab_row(r: dict) -> str:
    u2, u3, ru = RAAB.get((r["set"], r["eps"]), (np.nan,) * 3)
    star = f" ({r['unconverged']} not converged)" if r["unconverged"] else ""
    return (f"| {r['set']} | {r['eps']} | {'yes' if r['project'] else 'no'} "
            f"| {r['u2']:.2f} ± {r['u2_se']:.2f} | {u2:.2f} | {r['u3']:.2f} | {u3:.2f} "
            f"| {r['u3_worst']:.2f} | {r['ru']:.2f} | {ru:.2f} "
            f"| {r['seconds']:.1f}{star} |")  # fmt: skip


def generated(rows: int, seed: int = 0) -> pd.DataFrame:
    """``rows`` × 10: five categorical and five numeric columns, all driven by two latent
    normal factors (so every pair is dependent)."""
    rng = np.random.default_rng(seed)
    f = rng.standard_normal((rows, 2))
    e = rng.standard_normal((rows, 10))
    out = {}
    for j, levels in enumerate((2, 3, 4, 5, 6)):
        z = 0.8 * f[:, j % 2] + 0.4 * f[:, 1 - j % 2] * (j / 5) + 0.6 * e[:, j]
        cuts = np.quantile(z, np.linspace(0, 1, levels + 1)[1:-1])
        labels = np.array([f"c{j}_{k}" for k in range(levels)], dtype=object)
        out[f"cat{j}"] = pd.Categorical(labels[np.searchsorted(cuts, z)])
    for j in range(5):
        z = 0.7 * f[:, j % 2] + 0.3 * f[:, 1 - j % 2] + 0.6 * e[:, 5 + j]
        out[f"num{j}"] = np.round(np.exp(z) * 1000) if j % 2 else np.round(z * 10 + 50, 1)
    return pd.DataFrame(out)


def timing(rows: int) -> list[tuple[str, float, str]]:
    """Part 2: seconds of each synthesiser on ``rows`` × 10."""
    data = generated(rows)
    results = []
    for label, run in (
        ("parametric", lambda: synthesize_parametric(data, rng=np.random.default_rng(0))),
        ("cart", lambda: synthesize_cart(data, rng=np.random.default_rng(0))),
    ):
        started = time.perf_counter()
        syn, _ = run()
        seconds = time.perf_counter() - started
        two = utility_tables(data.sample(100_000, random_state=0),
                             syn.sample(100_000, random_state=0), way=2)["mean"]  # fmt: skip
        results.append((label, seconds, f"mean 2-way U {two:.2f} (100k-row samples)"))
        print(f"| {label} | {rows:,} × 10 (5 cat., 5 num.) | {seconds:.1f} | {results[-1][2]} |",
              flush=True)  # fmt: skip
    categorical = data[[c for c in data.columns if c.startswith("cat")]].copy()
    for j in range(5):  # the numeric columns in 4 quartile groups each
        categorical[f"num{j}"] = pd.qcut(data[f"num{j}"], 4, labels=False, duplicates="drop")
    codes = np.column_stack([
        pd.Categorical(categorical[c]).codes.astype(np.int64) for c in categorical.columns
    ])  # fmt: skip
    shape = [int(codes[:, j].max()) + 1 for j in range(codes.shape[1])]
    started = time.perf_counter()
    noisy = noisy_margins(codes, shape, Fraction(1), 0)
    noised = time.perf_counter() - started
    out, details = ipf.synthesize_dp_ipf(noisy, shape=shape, rng=synth_rng(SECRET, 0, "t"))
    seconds = time.perf_counter() - started
    report = details["ipf"]
    note = (f"ε = 1, {int(np.prod(shape)):,} cells, 45 margins; margins + noise "
            f"{noised:.1f} s; IPF {report['iterations']} iterations, converged "
            f"{report['converged']}")  # fmt: skip
    results.append(("dp-ipf", seconds, note))
    print(f"| dp-ipf | {rows:,} × 10 (categorical) | {seconds:.1f} | {note} |", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--eps", nargs="+", default=["0.5", "1", "2"])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--skip-raab", action="store_true")
    parser.add_argument("--skip-timing", action="store_true")
    args = parser.parse_args()
    if not args.skip_raab:
        print("| set | ε | projection | 2-way U ± s.e. | Raab | 3-way U | Raab "
              "| worst 3-way U | %ru | Raab %ru | s per variant |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        raab(args.reps, args.eps, args.sets)
    if not args.skip_timing:
        print("\n| method | data | time (s) | note |\n|---|---|---|---|")
        timing(args.rows)


if __name__ == "__main__":
    main()
