"""Benchmark of ``sqlsdc serve`` against the embedded guarded connection, measured in one run.

Reports:
  embedded ms     ``con.execute(sql).fetchall()`` on a guarded connection in this process, median
  server ms       the same statement through the server with psycopg 3 (extended protocol,
                  one round trip per query), median
  overhead ms     per statement, in the same sample (target: <= 2 ms median for a small
                  aggregate): the server logs, for each statement, the time spent in the
                  guarded connection and the time from the first message received to the last
                  byte written (``SQLSDC_SERVER_TIMING=1``, durations only); the overhead is
                  server total - guard (inside the server) and client round trip - guard (the
                  whole path: socket, protocol, psycopg), median and 95th percentile
  throughput      statements per second with 32 clients, each its own connection and thread
  idle memory     growth of the server's resident memory per idle authenticated connection

The server is a real ``sqlsdc serve`` subprocess on a free port (``--insecure``, loopback).

Usage: python benchmarks/server/bench_server.py [--persons 100000] [--repeat 200] [--clients 32]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

import sqlsdc
from sqlsdc.demo.build import build_demo_database
from sqlsdc.server.auth import set_password

SMALL_AGGREGATE = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"
PASSWORD = "benchmark password"
TIMING = re.compile(r"guard_ms=([0-9.]+) total_ms=([0-9.]+)")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _ms(run) -> float:
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) * 1000


def _read_timings(stream, timings: list) -> None:
    """The server's timing lines (``guard_ms=… total_ms=…``), in order, from its stderr."""
    for line in stream:
        match = TIMING.search(line)
        if match:
            timings.append((float(match[1]), float(match[2])))


def _percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--persons", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--idle", type=int, default=50)
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="bench-server-"))
    db = folder / "demo.duckdb"
    build_demo_database(db, persons=args.persons, seed=1)
    set_password(db, "admin", "analyst", PASSWORD, new=True)

    # the embedded connection first, alone: a DuckDB file is opened by one process at a time
    # (a second process waits for the first to release it), so the two are not interleaved
    with sqlsdc.connect(db, user="analyst") as embedded:
        embedded.execute(SMALL_AGGREGATE).fetchall()
        embedded_times = [_ms(lambda: embedded.execute(SMALL_AGGREGATE).fetchall())
                          for _ in range(args.repeat)]  # fmt: skip
    time.sleep(1.5)  # the file is released

    server = subprocess.Popen(
        [sys.executable, "-m", "sqlsdc.cli", "serve", str(db), "--port", "0", "--insecure",
         "--workers", "8", "--max-connections", "200"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "SQLSDC_SERVER_TIMING": "1", "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    timings: list[tuple[float, float]] = []  # (guard ms, server total ms), one per statement
    threading.Thread(target=_read_timings, args=(server.stderr, timings), daemon=True).start()
    host, port = server.stdout.readline().strip().rsplit(":", 1)
    dsn = (f"host={host} port={port} user=analyst password='{PASSWORD}' dbname=demo "
           "sslmode=disable")  # fmt: skip
    try:
        with psycopg.connect(dsn, autocommit=True) as remote:
            remote.execute(SMALL_AGGREGATE).fetchall()
            time.sleep(0.2)
            timings.clear()
            server_times = [_ms(lambda: remote.execute(SMALL_AGGREGATE).fetchall())
                            for _ in range(args.repeat)]  # fmt: skip
        time.sleep(0.5)  # the last timing lines
        statements = [t for t in timings if t[0] > 0]  # the connect's SET etc. have no guard
        assert len(statements) == args.repeat, (len(statements), args.repeat)
        inside = [total - guard for guard, total in statements]
        round_trip = [client - guard for client, (guard, _) in zip(server_times, statements,
                                                                   strict=True)]  # fmt: skip
        embedded_ms, server_ms = statistics.median(embedded_times), statistics.median(server_times)
        guard_ms = statistics.median(guard for guard, _ in statements)

        counts = [0] * args.clients
        stop = time.monotonic() + args.seconds

        def client(i: int) -> None:
            with psycopg.connect(dsn, autocommit=True) as con:
                barrier.wait()
                while time.monotonic() < stop:
                    con.execute(SMALL_AGGREGATE).fetchall()
                    counts[i] += 1

        barrier = threading.Barrier(args.clients)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        throughput = sum(counts) / args.seconds

        time.sleep(2.0)  # idle connections release the file after 1 s
        before = _rss_kib(server.pid)
        idle = [psycopg.connect(dsn, autocommit=True) for _ in range(args.idle)]
        time.sleep(2.0)
        after = _rss_kib(server.pid)
        for con in idle:
            con.close()

        print(f"persons {args.persons}, query: {SMALL_AGGREGATE}")
        print(f"embedded ms (median of {args.repeat})  {embedded_ms:8.2f}")
        print(f"server ms   (median of {args.repeat})  {server_ms:8.2f}")
        print(f"guard ms in the server (median)   {guard_ms:8.2f}")
        print(
            f"overhead ms, server total - guard  median {statistics.median(inside):6.3f}  "
            f"p95 {_percentile(inside, 95):6.3f}"
        )
        print(
            f"overhead ms, round trip - guard    median {statistics.median(round_trip):6.3f}  "
            f"p95 {_percentile(round_trip, 95):6.3f}"
        )
        print(f"difference of medians (two phases) {server_ms - embedded_ms:6.2f}")
        print(
            f"throughput, {args.clients} clients, {args.seconds:g} s  {throughput:8.1f} queries/s "
            f"(min per client {min(counts)}, max {max(counts)})"
        )
        print(
            f"idle memory per connection       {(after - before) / args.idle:8.0f} KiB "
            f"({args.idle} connections)"
        )
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
