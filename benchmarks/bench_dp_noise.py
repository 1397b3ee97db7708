"""Noise on many cells, the fixed cost of a DP query, and where a query's time goes.

  noise 11k cells   ``dp_cells.add_noise`` on 11,000 exact COUNT cells (discrete Laplace): the
                    vectorised samplers (``batch_samplers``: all cells at once, numpy int64)
                    against the per-cell scalar samplers they replace (same values: checked)
  fixed cost        a DP query with 8 cells (count of persons by region) by a user who has
                    not seen them (noise drawn, budget charged; a new connection each time)
                    and by one who has (cache), and 8 new cells on one open connection (a new
                    filter each time), against the same SQL on raw DuckDB: what a query costs
                    beyond the engine
  mid-size query    SUM of income by municipality x 2-year age band (9,456 cells): end to
                    end, the engine's part (the exact bounded cells and the final SQL, timed
                    on a raw connection) and the rest (Python: check, noise, charge, audit)

The data and policy are those of the side-by-side harness (``benchmarks/peers/run.py``).
``--profile`` prints cProfile's top functions (cumulative) of one fixed-cost query and one
mid-size query.

Usage: python benchmarks/bench_dp_noise.py [--persons 100000] [--repeat 7] [--workdir DIR]
       [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

import sqlsdc
from sqlsdc.engines.duckdb import open_database
from sqlsdc.mechanisms import dp_cells
from sqlsdc.mechanisms.accountant import Bounding, PrivacyCost, Statistic, calibrate
from sqlsdc.mechanisms.batch_samplers import discrete_laplace_many
from sqlsdc.mechanisms.dp_cells import CellMechanism, CellSpace, add_noise
from sqlsdc.mechanisms.prf import KeyedStream
from sqlsdc.mechanisms.samplers import discrete_laplace

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
import run as harness  # noqa: E402

SECRET = b"benchmark secret, not for production"
SMALL = "SELECT region, COUNT(*) FROM persons GROUP BY region"
MID = "SELECT municipality, age2, SUM(income) FROM persons GROUP BY municipality, age2"


def _median(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def noise_cells(n: int, repeat: int) -> dict:
    """Seconds to noise n COUNT cells: the samplers alone (one fresh keyed stream per cell) and
    all of ``add_noise`` (identities, digests, streams, draws, exact values), each with the
    vectorised samplers and with the scalar ones they replace (same values: checked)."""
    frame = pd.DataFrame({"municipality": np.arange(n) % 197, "age2": np.arange(n) // 197,
                          "v": np.arange(n) % 50})  # fmt: skip
    space = CellSpace.of("persons", ["municipality", "age2"])
    count = calibrate(Statistic.COUNT, Bounding(), PrivacyCost(epsilon=1))
    mechanisms = {"v": CellMechanism("*", count)}
    base = KeyedStream(SECRET, "bench")
    streams = [base.derive(i) for i in range(n)]

    def scalar_many(scale, fresh):
        return [discrete_laplace(scale, s) for s in fresh]

    def noise():
        return add_noise(frame, space, mechanisms, secret=SECRET, policy_version=1).values["v"]

    vectorised = noise()
    out = {
        "sampler, vectorised": _median(lambda: discrete_laplace_many(count.scale, streams), repeat),
        "sampler, scalar": _median(
            lambda: scalar_many(count.scale, [s.derive() for s in streams]), repeat
        ),  # fmt: skip
        "add_noise, vectorised": _median(noise, repeat),
    }
    dp_cells.discrete_laplace_many = scalar_many  # the per-cell path, for comparison only
    try:
        assert noise() == vectorised, "the vectorised samplers must draw the scalar values"
        out["add_noise, scalar"] = _median(noise, repeat)
    finally:
        dp_cells.discrete_laplace_many = discrete_laplace_many
    return out


def query_times(path: Path, repeat: int, profile: bool) -> dict:
    """Medians of the queries of the module docstring. The raw connection that times DuckDB
    alone is opened as a reader (``writes_data=False``): a connection of the process that may
    write data makes every guarded DP query read its data versions again (as it must), which
    an analyst's process does not have open."""
    raw = open_database(path, writes_data=False)
    with sqlsdc.connect(path, "admin") as con:
        stages = {sql: con.explain(sql).dp_stages[0].sql for sql in (SMALL, MID)}
    out = {"raw small": _median(lambda: raw.execute(SMALL).fetchall(), repeat)}
    users = iter(f"u{i}" for i in range(10**6))
    # fresh users: every run draws and charges; one warm-up first
    with sqlsdc.connect(path, next(users)) as con:
        con.execute(SMALL).fetchall()

    def fresh(sql):
        with sqlsdc.connect(path, next(users)) as con:
            start = time.perf_counter()
            con.execute(sql).fetchall()
            return time.perf_counter() - start

    out["dp small, new cells"] = statistics.median(fresh(SMALL) for _ in range(repeat))
    with sqlsdc.connect(path, "u0") as con:
        out["dp small, cached cells"] = _median(lambda: con.execute(SMALL).fetchall(), repeat)
    with sqlsdc.connect(path, next(users)) as con:  # one connection, new cells every time
        out["dp small, new cells, open"] = statistics.median(
            _new_cells_on(con, i) for i in range(repeat)
        )
    out["dp mid, new cells"] = statistics.median(fresh(MID) for _ in range(repeat))
    out["engine mid (exact cells)"] = _median(lambda: raw.execute(stages[MID]).fetchall(), repeat)
    out["raw mid"] = _median(lambda: raw.execute(MID).fetchall(), repeat)
    raw.close()
    if profile:
        for label, sql in (("fixed cost (8 new cells)", SMALL), ("mid-size (9,456 cells)", MID)):
            with sqlsdc.connect(path, next(users)) as con:
                profiler = cProfile.Profile()
                profiler.enable()
                con.execute(sql).fetchall()
                profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(28)
            print(f"--- profile: {label}\n" + text.getvalue().split("\n\n", 2)[-1])
    return out


def _new_cells_on(con, i: int) -> float:
    """Seconds of an 8-cell query whose filter makes new statistics (charged, drawn, cached) on
    a connection already open (its check done first: the fixed cost without the per-opening
    reads of the secret and the data version, nor the check of a new text)."""
    sql = f"SELECT region, COUNT(*) FROM persons WHERE age2 <> 'none {i}' GROUP BY region"
    con.explain(sql)
    start = time.perf_counter()
    con.execute(sql).fetchall()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--persons", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--cells-only", action="store_true", help="only the 11k-cell noise")
    args = parser.parse_args()
    for name, seconds in noise_cells(11_000, args.repeat).items():
        print(f"noise 11,000 cells, {name:<22} {seconds * 1000:8.1f} ms")
    if args.cells_only:
        return
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dpnoise-"))
    workdir.mkdir(parents=True, exist_ok=True)
    domain = harness.prepare(workdir, args.persons)
    path = harness.build_sqlsdc(workdir, domain, 3 * args.repeat + 5)  # analysts u0, u1, ...
    times = query_times(path, args.repeat, args.profile)
    for name, seconds in times.items():
        print(f"{name:<28} {seconds * 1000:8.1f} ms")
    mid_python = times["dp mid, new cells"] - times["engine mid (exact cells)"]
    print(f"{'mid: beyond the engine':<28} {mid_python * 1000:8.1f} ms")
    print(f"{'fixed cost: small - raw':<28} "
          f"{(times['dp small, new cells'] - times['raw small']) * 1000:8.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
