"""Where the fixed cost of a DP (or CKM) query goes: the engine's statements, and the guard's
Python.

On a shared machine whole-query timings swing 2-3x with the load; the split is steadier. Every
engine connection the guard opens is wrapped: each statement it sends (``execute``,
``register``, ``unregister``, ``get_table_names``, ``_submit``) and the reading of streamed
answers is timed as engine time; the rest of a query's time is the guard's Python (check
cache look-up, pricing, noise, identities, Arrow tables, ledger rows). Timed per query over
``--queries`` 8-cell DP counts with a new filter each (charged, drawn, cached) on one open
connection, after a warm-up and with every query's check cached, as the ``dp small, new
cells, open`` query of ``bench_dp_noise.py``. Printed: the 10th percentile (the least loaded
queries), the quartiles and the median of each part, then the median time of each statement
in the order the guard sends them.

With ``--cpu`` every time is the process's CPU time (``time.process_time_ns``: all its
threads, DuckDB's workers among them) instead of the wall clock: steadier when other jobs
share the cores, but blind to waits (a COMMIT's sync of the write-ahead log).

With ``--new-text`` the texts are not checked beforehand: each query pays the check of its
new text (parse, analysis, rewrite, validation), timed apart as a third part (``check``) and
left out of the guard's Python.

With ``--cached`` the query is the first one repeated: its 8 cells answered from the cache
(nothing charged, no exact cells), as ``count_statements.py``'s ``dp cached``.

With ``--ckm`` the database is a ``sqlsdc demo`` one and the query the CKM count by region of
``bench_guard.py --fixed-cost``, repeated (check cached); with ``--new-text`` too, that count
with a new filter each time (``WHERE age >= i``), its check timed apart.

Usage: python benchmarks/dp_time_split.py DP_HARNESS_DB [--queries 60] [--cpu] [--new-text]
       python benchmarks/dp_time_split.py DP_HARNESS_DB --cached [--queries 60] [--cpu]
       python benchmarks/dp_time_split.py --ckm DEMO_DB [--queries 60] [--cpu] [--new-text]
(the ``harness.duckdb`` that ``bench_dp_noise.py`` builds in its ``--workdir``, or a demo
database; copied first).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import sqlsdc
from sqlsdc.engines import duckdb as engine
from sqlsdc.guard.connection import Connection

TIMED = ("register", "unregister", "get_table_names", "_submit")
LOG: list[tuple[str, int]] = []  # (statement, nanoseconds)
_clock = time.perf_counter_ns  # time.process_time_ns with --cpu


class TimedConnection:
    """A DuckDB connection that times what it sends to the engine."""

    def __init__(self, con):
        self._con = con

    def execute(self, sql, *args, **kwargs):
        start = _clock()
        try:
            return self._con.execute(sql, *args, **kwargs)
        finally:
            text = " ".join(getattr(sql, "query", sql).split())
            LOG.append((text[:64], _clock() - start))

    def __getattr__(self, name):
        attr = getattr(self._con, name)
        if name not in TIMED:
            return attr

        def timed(*args, **kwargs):
            start = _clock()
            try:
                return attr(*args, **kwargs)
            finally:
                LOG.append((name, _clock() - start))

        return timed


def _timed_batches(batches):
    def read(reader):
        stream = batches(reader)
        while True:
            start = _clock()
            batch = next(stream, None)
            LOG.append(("(streamed batches)", _clock() - start))
            if batch is None:
                return
            yield batch

    return read


def _percentile(values: list[float], p: float) -> float:
    return sorted(values)[int(p * (len(values) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", type=Path)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--cpu", action="store_true", help="process CPU time, not wall time")
    parser.add_argument("--new-text", action="store_true", help="each query's check timed too")
    parser.add_argument("--ckm", action="store_true", help="the CKM count of a demo database")
    parser.add_argument("--cached", action="store_true", help="the DP query's cells cached")
    args = parser.parse_args()
    if args.cpu:
        global _clock
        _clock = time.process_time_ns
    opened = engine.open_database
    engine.open_database = lambda *a, **k: TimedConnection(opened(*a, **k))
    engine._batches = _timed_batches(engine._batches)
    checks: list[int] = []  # nanoseconds of each check (--new-text)
    checked = Connection._checked

    def timed_check(self, *a, **k):
        start = _clock()
        try:
            return checked(self, *a, **k)
        finally:
            checks.append(_clock() - start)

    if args.new_text:
        Connection._checked = timed_check
    sqls = [f"SELECT region, COUNT(*) FROM persons WHERE age2 <> 'none {i}' GROUP BY region"
            for i in range(args.queries)]  # fmt: skip
    user, first = "u1", "SELECT region, COUNT(*) FROM persons GROUP BY region"
    if args.cached:
        sqls = [first] * args.queries
    if args.ckm:
        user, first = "analyst", "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"
        sqls = [first] * args.queries
        if args.new_text:
            sqls = [f"SELECT region, COUNT(*) AS n FROM persons WHERE age >= {i} GROUP BY region"
                    for i in range(args.queries)]  # fmt: skip
    spans, walls, check_ns = [], [], []
    with tempfile.TemporaryDirectory() as workdir:
        path = Path(workdir) / "split.duckdb"
        shutil.copy(args.database, path)
        with sqlsdc.connect(path, user) as con:
            con.execute(first).fetchall()
            if not args.new_text:
                for sql in sqls:
                    con.explain(sql)
            checks.clear()
            for sql in sqls:
                first, checked_before = len(LOG), len(checks)
                start = _clock()
                con.execute(sql).fetchall()
                walls.append(_clock() - start)
                spans.append((first, len(LOG)))
                check_ns.append(sum(checks[checked_before:]))
    engine_ns = [sum(t for _s, t in LOG[a:b]) for a, b in spans]
    python = [w - e - c for w, e, c in zip(walls, engine_ns, check_ns, strict=True)]
    parts = {"engine": engine_ns, "python": python, "query": walls}
    if args.new_text:
        parts = {"check": check_ns, **parts}
    print("| part | p10 ms | p25 ms | median ms | p75 ms |\n|---|---:|---:|---:|---:|")
    for name, values in parts.items():
        print(f"| {name} | {_percentile(values, 0.1) / 1e6:.2f} | "
              f"{_percentile(values, 0.25) / 1e6:.2f} | {statistics.median(values) / 1e6:.2f} | "
              f"{_percentile(values, 0.75) / 1e6:.2f} |")  # fmt: skip
    by_place: dict[tuple[str, int], list[int]] = collections.defaultdict(list)
    for a, b in spans:
        seen: collections.Counter = collections.Counter()
        for text, ns in LOG[a:b]:
            seen[text] += 1
            by_place[(text, seen[text])].append(ns)
    a, b = spans[len(spans) // 2]
    calls = sum(text != "(streamed batches)" for text, _ns in LOG[a:b])
    print(f"\n{calls} engine calls in a query, then the reading of streamed answers\n")
    print("| statement | median ms |\n|---|---:|")
    seen = collections.Counter()
    for text, _ns in LOG[a:b]:
        seen[text] += 1
        print(f"| `{text}` | {statistics.median(by_place[(text, seen[text])]) / 1e6:.3f} |")


if __name__ == "__main__":
    main()
