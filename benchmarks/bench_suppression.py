"""Benchmark: GaussSuppression (sqlsdc.tabular.gauss) and the attacker audit on large tables.

Builds hierarchical 2-D and 3-D frequency tables of about 10^3 .. 10^6 cells from synthetic
microdata (every dimension: Total -> G groups -> S codes per group; codes drawn from a Zipf-like
distribution so that a tail of small cells exists), marks cells with 1 <= n <= max_n as primary
(frequency rule; with sqlsdc's table model only non-empty cells exist), runs ``gauss_suppress``
(anySum singletons = inner cells with n = 1, cost n + 1 as GaussSuppression's CandidatesDefault)
and ``audit_intervals`` (LP, a-priori bounds [0, inf), its components in ``--processes`` worker
processes, 2 by default), and prints a markdown table.

    python benchmarks/bench_suppression.py                       # 10^3 .. 10^5 cells, 2-D and 3-D
    python benchmarks/bench_suppression.py --sizes 1e6 --dims 3  # the 10^6-cell target
    python benchmarks/bench_suppression.py --intervals           # interval protection, magnitudes

Columns: cells, inner cells, primary and secondary suppressions, seconds for gauss and audit,
the number of independent LP components of the suppressed cells and the largest one, the share
of suppressed cells with exact (proven) intervals, and the share of primary cells protected
(``audit_check`` with zero protection levels: the interval has positive width), and the
process's peak resident memory so far.

``--intervals`` instead runs ``protect`` (method gauss, cost value, rules nk(1,60) + freq(3)) on
magnitude tables: the demo database's enterprises (turnover by nace × region and by nace × region
× size class) and Pareto(1.1) magnitudes on the hierarchical 2-D and 3-D tables above; it prints
the primary and secondary suppressions, their value, the rounds of the interval step and seconds.
"""

from __future__ import annotations

import argparse
import platform
import resource
import time

import numpy as np
import pandas as pd
from scipy import sparse
from scipy.sparse.csgraph import connected_components

from sqlsdc.tabular.attacker import audit_check, audit_intervals
from sqlsdc.tabular.gauss import gauss_suppress


def shape_for(cells: float, dims: int) -> tuple[int, int]:
    """(groups, codes per group) so that (1 + G + G*S) ** dims is about ``cells``."""
    codes = cells ** (1.0 / dims)
    groups = max(1, round((codes - 1) ** 0.5))
    per = max(1, round((codes - 1 - groups) / groups))
    return groups, per


def microdata(dims: int, groups: int, per: int, records: int, seed: int, zipf: float):
    rng = np.random.default_rng(seed)
    cols, hiers = {}, {}
    for d in range(dims):
        name = f"d{d}"
        leaves = [f"{name}.{g}.{s}" for g in range(groups) for s in range(per)]
        parents = {f"{name}.{g}": None for g in range(groups)}
        parents.update(
            {f"{name}.{g}.{s}": f"{name}.{g}" for g in range(groups) for s in range(per)}
        )
        p = rng.permutation(1.0 / np.arange(1, len(leaves) + 1) ** zipf)
        cols[name] = np.asarray(leaves, dtype=object)[
            rng.choice(len(leaves), records, p=p / p.sum())
        ]
        hiers[name] = parents
    return pd.DataFrame(cols), hiers


def build(frame: pd.DataFrame, hiers: dict):
    """X, A, counts n and inner n: sqlsdc's build_table when present, else a Kronecker cube."""
    try:
        from sqlsdc.tabular.model import build_table
    except ImportError:
        return _kron_cube(frame, hiers)
    t = build_table(frame, list(hiers), hierarchies=hiers)
    n = t.n.astype(np.float64)
    return t.X, t.A, n, n[t.inner]


def _kron_cube(frame, hiers):
    """Fallback builder for the two-level hierarchies made here: all code combinations (empty
    cells included, as zeros)."""
    Ds, Hs, ids = [], [], []
    for name, parents in hiers.items():
        codes = ["Total", *parents]
        leaves = [c for c in parents if parents[c] is not None]
        par = {c: ("Total" if p is None else p) for c, p in parents.items()}
        D = np.zeros((len(leaves), len(codes)))
        for i, leaf in enumerate(leaves):
            c = leaf
            while c is not None:
                D[i, codes.index(c)] = 1
                c = par.get(c)
        Ds.append(sparse.csr_matrix(D))
        H = [
            [1.0 if c == p else (-1.0 if par.get(c) == p else 0.0) for c in codes]
            for p in codes
            if any(par.get(c) == p for c in codes)
        ]
        Hs.append(sparse.csr_matrix(np.array(H)))
        ids.append(pd.Categorical(frame[name], categories=leaves).codes)
    X = Ds[0]
    for D in Ds[1:]:
        X = sparse.kron(X, D, format="csr")
    sizes = [D.shape[1] for D in Ds]
    A = sparse.vstack(
        [
            sparse.kron(
                sparse.kron(sparse.eye(int(np.prod(sizes[:d]))), H),
                sparse.eye(int(np.prod(sizes[d + 1 :]))),
            )
            for d, H in enumerate(Hs)
        ]
    ).tocsr()
    lengths = [D.shape[0] for D in Ds]
    flat = np.ravel_multi_index(tuple(ids), lengths)
    inner_n = np.bincount(flat, minlength=int(np.prod(lengths))).astype(np.float64)
    return X.tocsc().astype(np.int8), A, X.T @ inner_n, inner_n


def component_sizes(A, sup) -> np.ndarray:
    """Sizes of the groups of suppressed cells linked by constraint rows (the audit's LPs)."""
    B = (A[:, np.flatnonzero(sup)] != 0).astype(np.int8).tocsr()
    B = B[np.diff(B.indptr) > 0]
    m = B.shape[0]
    _, label = connected_components(sparse.bmat([[None, B], [B.T, None]]), directed=False)
    return np.bincount(label[m:])[np.unique(label[m:])]


def run(dims, cells, max_n, seed, zipf, per_cell, time_limit, processes):
    groups, per = shape_for(cells, dims)
    records = int(per_cell * (groups * per) ** dims)
    frame, hiers = microdata(dims, groups, per, records, seed, zipf)
    t0 = time.perf_counter()
    X, A, n, inner_n = build(frame, hiers)
    t_build = time.perf_counter() - t0
    primary = (n >= 1) & (n <= max_n)
    t0 = time.perf_counter()
    sup = gauss_suppress(X, primary, n + 1.0, singleton=inner_n == 1, values=n)
    t_gauss = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = audit_intervals(
        A,
        n,
        sup,
        lower=np.zeros(len(n)),
        upper=np.full(len(n), np.inf),
        time_limit=time_limit,
        processes=processes,
    )
    t_audit = time.perf_counter() - t0
    zero = np.zeros(len(n))
    ok = audit_check(res, n, primary, zero, zero)
    comp = component_sizes(A, sup)
    return {
        "dims": dims,
        "cells": X.shape[1],
        "inner": X.shape[0],
        "records": records,
        "primary": int(primary.sum()),
        "secondary": int(sup.sum() - primary.sum()),
        "build s": t_build,
        "gauss s": t_gauss,
        "audit s": t_audit,
        "components": len(comp),
        "largest": int(comp.max()) if len(comp) else 0,
        "exact %": 100.0 * res.exact[sup].mean() if sup.any() else 100.0,
        "protected %": 100.0 * ok[primary].mean() if primary.any() else 100.0,
        "peak MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def interval_rows(time_limit):
    """protect() with interval protection on skewed magnitude tables (see the module docstring)."""
    from sqlsdc.demo.build import DEFAULT_PERSONS, DEFAULT_SEED
    from sqlsdc.demo.data import build_tables
    from sqlsdc.tabular import protect
    from sqlsdc.tabular.rules import DominanceRule, FrequencyRule

    rules = [DominanceRule(1, 60), FrequencyRule(3)]
    firms = build_tables(DEFAULT_PERSONS, DEFAULT_SEED)["enterprises"].to_pandas()
    cases = [
        ("demo nace × region", firms, ["nace", "region"], "turnover", None),
        ("demo nace × region × size", firms, ["nace", "region", "size_class"], "turnover", None),
    ]
    for dims in (2, 3):
        groups, per = shape_for(1e3, dims)
        frame, hiers = microdata(dims, groups, per, int(8 * (groups * per) ** dims), 7, 0.5)
        frame["v"] = np.round((np.random.default_rng(7).pareto(1.1, len(frame)) + 1) * 100)
        cases.append((f"Pareto {dims}-D", frame, list(hiers), "v", hiers))
    rows = []
    for name, frame, dims, measure, hiers in cases:
        t0 = time.perf_counter()
        out = protect(frame, dims, measure, rules=rules, hierarchies=hiers, time_limit=time_limit)
        report = out.attrs["audit"]
        rows.append(
            {
                "table": name,
                "cells": len(out),
                "primary": report.n_primary,
                "secondary": report.n_secondary,
                "secondary value": float(out.loc[out["status"] == "secondary", "value"].sum()),
                "rounds": report.rounds,
                "audit passed": report.passed,
                "seconds": time.perf_counter() - t0,
            }
        )
        print(f"# done: {rows[-1]}", flush=True)
    return rows


def print_rows(rows, number="{:.2f}"):
    """A markdown table: floats in ``number`` format, integers with thousands separators."""

    def fmt(v):
        if isinstance(v, float):
            return number.format(v)
        return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)

    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---:" for _ in cols) + "|")
    for r in rows:
        print("| " + " | ".join(fmt(r[c]) for c in cols) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e3, 1e4, 1e5])
    ap.add_argument("--dims", nargs="+", type=int, default=[2, 3])
    ap.add_argument("--max-n", type=int, default=2, help="primary: 1 <= n <= max_n")
    ap.add_argument(
        "--records-per-cell",
        type=float,
        default=8.0,
        help="microdata records per possible inner cell",
    )
    ap.add_argument("--zipf", type=float, default=0.5, help="code distribution exponent")
    ap.add_argument("--time-limit", type=float, default=300.0, help="audit time limit (s)")
    ap.add_argument("--processes", type=int, default=2, help="audit worker processes")
    ap.add_argument("--seed", type=int, default=20261122)
    ap.add_argument("--intervals", action="store_true", help="interval protection instead")
    args = ap.parse_args()
    if args.intervals:
        print_rows(interval_rows(args.time_limit), number="{:.3g}")
        return
    rows = []
    for size in args.sizes:
        for dims in args.dims:
            row = run(
                dims,
                size,
                args.max_n,
                args.seed,
                args.zipf,
                args.records_per_cell,
                args.time_limit,
                args.processes,
            )
            rows.append(row)
            print(f"# done: {row}", flush=True)
    print(
        f"\nPython {platform.python_version()}, {platform.machine()}, "
        f"max_n={args.max_n}, records/cell={args.records_per_cell}, zipf={args.zipf}, "
        f"audit processes={args.processes}\n"
    )
    print_rows(rows)


if __name__ == "__main__":
    main()
