"""The floor of a DP query's fixed cost: DuckDB doing by hand what the guard sends it.

One guarded connection asks 8-cell DP counts with a new filter each (charged, drawn, cached;
each text explained just before, untimed, as a client's Describe before Execute), as the
``dp small, new cells, open`` query of ``bench_dp_noise.py``. The engine calls of one of
them are recorded (statement, parameters; registrations with their Arrow tables) and
replayed on a plain DuckDB connection to a copy of the same database, opened and hardened as
the guard opens its own (``engines.duckdb.open_database``, ``harden``): the same statements in
the same order, with fresh cache keys and the ids the replayed charge draws, so that every
write is a new row as in the guard. Guarded query and replay alternate in one process, so
that both see the same load; each is timed in process CPU (``time.process_time_ns``: all
threads, DuckDB's workers among them).

With ``--new-text`` the texts are not explained beforehand: each guarded query pays the check
of its new text too, and the recorded calls include DuckDB's table list of the new stage
text (``get_table_names``), which the replay asks again; the floor is then that of a new
statement text.

With ``--one-transaction`` a third side replays the same calls without the charge's COMMIT and
the answer's BEGIN: the floor of a design that charged, computed the exact cells and recorded
the answer in one transaction (issue 17's idea, session 46). It is not what the guard may do
(a statement interrupted inside a DuckDB transaction aborts it, charge included: see
``tests/test_dp_one_commit.py``); it bounds what that design could save.

Printed: the calls replayed, the p10, quartiles and median of each side, and the ratio
guard / floor.

Usage: python benchmarks/dp_floor.py DP_HARNESS_DB [--queries 100] [--new-text]
       [--one-transaction]
(the ``harness.duckdb`` that ``bench_dp_noise.py`` builds in its ``--workdir``; copied first).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import sqlsdc
from sqlsdc.engines import duckdb as engine

RECORDED: list[tuple[str, object, tuple]] | None = None  # (method, statement, arguments)
RECORDED_CALLS = ("execute", "register", "unregister", "get_table_names", "_submit")


class RecordingConnection:
    """A DuckDB connection that records what is sent to the engine while RECORDED is a list."""

    def __init__(self, con):
        self._con = con

    def execute(self, sql, *args, **kwargs):
        if RECORDED is not None:
            RECORDED.append(("execute", getattr(sql, "query", sql), args))
        return self._con.execute(sql, *args, **kwargs)

    def __getattr__(self, name):
        attr = getattr(self._con, name)
        if name not in RECORDED_CALLS or RECORDED is None:
            return attr

        def recorded(*args, **kwargs):
            RECORDED.append((name, None, args))
            return attr(*args, **kwargs)

        return recorded


def _fresh(value, ids: dict):
    """A parameter for the replay: new cache keys (bytes), the replay's own ids."""
    if isinstance(value, bytes):
        return os.urandom(len(value))
    if isinstance(value, list):
        return [_fresh(v, ids) for v in value]
    if type(value) is int and value in ids:
        return ids[value]
    return value


def replay(con, calls, ids_of_charge: tuple[int, int]) -> None:
    """Send ``calls`` to ``con`` as the guard sent them."""
    ids: dict[int, int] = {}
    for method, sql, args in calls:
        args = tuple(_fresh(a, ids) for a in args)
        if method == "execute":
            result = con.execute(sql, *args)
            if sql.startswith("INSERT INTO sqlsdc.budget_spend"):
                seq, query_id = result.fetchone()
                ids = {ids_of_charge[0]: seq, ids_of_charge[1]: query_id}
            elif "RETURNING" in sql:
                result.fetchall()
        elif method == "_submit":
            reader = con._submit(*args).arrow_reader()
            for _batch in reader:
                pass
            reader.close()
        else:
            getattr(con, method)(*args)


def one_transaction(calls):
    """``calls`` without the first COMMIT (the charge's) and the BEGIN after it (the answer's)."""
    texts = [sql for _method, sql, _args in calls]
    end = texts.index("COMMIT")
    begin = texts.index("BEGIN TRANSACTION", end)
    return [call for i, call in enumerate(calls) if i not in (end, begin)]


def main() -> None:
    global RECORDED
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", type=Path)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--new-text", action="store_true", help="no explain before each query")
    parser.add_argument(
        "--one-transaction",
        action="store_true",
        help="also replay the calls without the charge's COMMIT and answer's BEGIN",
    )
    args = parser.parse_args()
    opened = engine.open_database
    engine.open_database = lambda *a, **k: RecordingConnection(opened(*a, **k))
    clock = time.process_time_ns
    sqls = [f"SELECT region, COUNT(*) FROM persons WHERE age2 <> 'none {i}' GROUP BY region"
            for i in range(args.queries + 30)]  # fmt: skip
    guard_ns, floor_ns, one_ns = [], [], []
    with tempfile.TemporaryDirectory() as workdir:
        path, raw_path = Path(workdir) / "guard.duckdb", Path(workdir) / "raw.duckdb"
        shutil.copy(args.database, path)
        shutil.copy(args.database, raw_path)
        raw = opened(raw_path, writes_data=False)
        engine.harden(raw)
        with sqlsdc.connect(path, "u1") as con:
            con.execute("SELECT region, COUNT(*) FROM persons GROUP BY region").fetchall()
            for sql in sqls[:29]:  # warm-up: ids well above the small numbers of a query
                con.explain(sql)
                con.execute(sql).fetchall()
            if not args.new_text:
                con.explain(sqls[29])
            RECORDED = []
            con.execute(sqls[29]).fetchall()
            calls, RECORDED = RECORDED, None
            seq, query_id = con._con.execute(
                "SELECT seq, query_id FROM sqlsdc.budget_spend ORDER BY seq DESC LIMIT 1"
            ).fetchone()
            for _ in range(5):
                replay(raw, calls, (seq, query_id))
            for sql in sqls[30:]:
                if not args.new_text:
                    con.explain(sql)
                start = clock()
                con.execute(sql).fetchall()
                guard_ns.append(clock() - start)
                start = clock()
                replay(raw, calls, (seq, query_id))
                floor_ns.append(clock() - start)
                if args.one_transaction:
                    start = clock()
                    replay(raw, one_transaction(calls), (seq, query_id))
                    one_ns.append(clock() - start)
        raw.close()
    print(f"{len(calls)} engine calls replayed:")
    for method, sql, args in calls:
        text = sql or (args[0] if args and isinstance(args[0], str) else "")
        print(f"  {method} {' '.join(text.split())[:70]}")
    print("\n| | p10 ms | p25 ms | median ms | p75 ms |\n|---|---:|---:|---:|---:|")
    sides = [("guard", guard_ns), ("floor (raw DuckDB)", floor_ns)]
    if one_ns:
        sides.append((f"one transaction ({len(one_transaction(calls))} calls)", one_ns))
    for name, values in sides:
        ordered = sorted(values)
        at = [ordered[int(p * (len(ordered) - 1))] / 1e6 for p in (0.1, 0.25, 0.75)]
        print(f"| {name} | {at[0]:.2f} | {at[1]:.2f} | {statistics.median(values) / 1e6:.2f} | "
              f"{at[2]:.2f} |")  # fmt: skip
    print(f"\nratio guard / floor (medians): "
          f"{statistics.median(guard_ns) / statistics.median(floor_ns):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
