"""DuckDB's ``hash`` in numpy (:mod:`sqlsdc.engines.duckdb_hash`, the Spark engine's UDF for the
keyed choices of DP) against DuckDB's own, CPU time for the same rows, measured in the same run.

The rows are what a DP unit row cap hashes: ``hash(record key, key, measure)`` with a UINTEGER
record key, a VARCHAR key (3 to 20 characters) and a DOUBLE measure; and a DECIMAL(8, 2)
measure in place of the DOUBLE. The numpy side starts from Arrow arrays (what Spark hands an
Arrow UDF) and checks its result equals DuckDB's. Medians of --repeat runs; DuckDB on one
thread (``SET threads = 1``), as the UDF runs on one core per Spark task.

Usage: python benchmarks/bench_duckdb_hash.py [--rows 1000000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import duckdb
import numpy as np

from sqlsdc.engines.duckdb_hash import duckdb_hash

SETUP = """
SET threads = 1;
CREATE TABLE r AS SELECT
  CAST(hash(range) % 4294967296 AS UINTEGER) AS rk,
  repeat(chr(CAST(97 + hash(range, 1) % 26 AS INTEGER)), CAST(3 + hash(range, 2) % 18 AS INTEGER))
    || CAST(range % 1000 AS VARCHAR) AS k,
  CAST(hash(range, 3) % 100000 AS DOUBLE) / 7 AS x,
  CAST(CAST(hash(range, 4) % 1000000 AS DOUBLE) / 100 AS DECIMAL(8, 2)) AS m
FROM range(?)
"""


def cpu(function, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.process_time()
        result = function()
        times.append(time.process_time() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    con = duckdb.connect()
    con.execute(SETUP, [args.rows])
    for columns in (["rk", "k", "x"], ["rk", "k", "m"], ["rk"], ["k"]):
        arrow = con.sql(f"SELECT {', '.join(columns)} FROM r").to_arrow_table()
        arrays = [arrow.column(c).combine_chunks() for c in columns]
        sql = f"SELECT hash({', '.join(columns)}) AS h FROM r"
        duck_s, duck = cpu(lambda sql=sql: con.sql(sql).to_arrow_table(), args.repeat)
        numpy_s, mine = cpu(lambda arrays=arrays: duckdb_hash(arrays), args.repeat)
        assert (np.asarray(duck["h"].to_numpy(), dtype=np.uint64) == mine).all()
        print(f"hash({', '.join(columns)}) over {args.rows:,} rows: DuckDB {duck_s:.3f} s CPU, "
              f"numpy {numpy_s:.3f} s CPU ({numpy_s / duck_s:.1f}x), equal")  # fmt: skip
    con.close()


if __name__ == "__main__":
    main()
