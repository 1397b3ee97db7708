"""Engine round trips and commits per guarded query: a measure of the fixed cost that load
on a shared machine does not blur (timings there vary 2-4x from one minute to the next).

Every engine connection the guard opens is wrapped in a counter of statements (``execute``,
``register``, ``unregister``, ``get_table_names``), of COMMITs and of autocommitted
``nextval`` calls (each a commit of its own). Counted per query over 10 queries, after a
warm-up query on the same connection and with every query's check cached:

  ckm repeated          the CKM count by region of ``bench_guard.py --fixed-cost``
  ckm new text          that count with a new filter each (its check cached beforehand, as a
                        client's Describe before Execute does; the defence-in-depth table
                        check asks DuckDB once per new protected SQL text)
  dp cached             an 8-cell DP count by region, repeated (cells from the cache)
  dp new cells, open    8-cell DP counts with a new filter each (charged, drawn, cached)
  dp new cells, new connection
                        the 8-cell DP count by a new user on a new connection each (its
                        first query: the opening's data version, secret and budget state)

Usage: python benchmarks/count_statements.py CKM_DEMO_DB DP_HARNESS_DB
(a ``sqlsdc demo`` database, and the ``harness.duckdb`` that ``bench_dp_noise.py`` builds in
its ``--workdir``; both are copied first).
"""

from __future__ import annotations

import collections
import shutil
import sys
import tempfile
from pathlib import Path

import sqlsdc
from sqlsdc.engines import duckdb as engine

COUNTS: collections.Counter = collections.Counter()
COUNTED = ("register", "unregister", "get_table_names", "_submit")  # _submit: a streamed answer


class CountingConnection:
    """A DuckDB connection that counts what is sent to the engine."""

    def __init__(self, con):
        self._con = con

    def execute(self, sql, *args, **kwargs):
        COUNTS["statements"] += 1
        sql = getattr(sql, "query", sql)  # the text of a parsed statement
        head = sql.split(None, 1)[0].upper()
        COUNTS["commits"] += head == "COMMIT"
        COUNTS["autocommitted nextval"] += head == "SELECT" and "nextval(" in sql
        return self._con.execute(sql, *args, **kwargs)

    def __getattr__(self, name):
        COUNTS["statements"] += name in COUNTED
        return getattr(self._con, name)


def counted(label: str, source: Path, user: str, statements: list[str], workdir: Path) -> None:
    path = workdir / f"{label.replace(' ', '_')}.duckdb"
    shutil.copy(source, path)
    with sqlsdc.connect(path, user) as con:
        con.execute(statements[0]).fetchall()
        for sql in statements[1:]:
            con.explain(sql)
        COUNTS.clear()
        for sql in statements[1:]:
            con.execute(sql).fetchall()
    _report(label, len(statements) - 1)


def counted_fresh(label: str, source: Path, users: list[str], sql: str, workdir: Path) -> None:
    """The first query of each user, each on a connection of its own (opened uncounted)."""
    path = workdir / f"{label.replace(' ', '_').replace(',', '')}.duckdb"
    shutil.copy(source, path)
    with sqlsdc.connect(path, users[0]) as con:  # the check of the text, cached for the others
        con.execute(sql).fetchall()
    connections = [sqlsdc.connect(path, user) for user in users[1:]]
    COUNTS.clear()
    for con in connections:
        con.execute(sql).fetchall()
        con.close()
    _report(label, len(users) - 1)


def _report(label: str, n: int) -> None:
    kinds = ("statements", "commits", "autocommitted nextval")
    print(f"| {label} | " + " | ".join(f"{COUNTS[k] / n:.1f}" for k in kinds) + " |")


def main() -> None:
    ckm_db, dp_db = (Path(a) for a in sys.argv[1:3])
    opened = engine.open_database
    engine.open_database = lambda *a, **k: CountingConnection(opened(*a, **k))
    ckm = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"
    ckm_new = [f"SELECT region, COUNT(*) AS n FROM persons WHERE age >= {i} GROUP BY region"
               for i in range(10)]  # fmt: skip
    small = "SELECT region, COUNT(*) FROM persons GROUP BY region"
    new = [f"SELECT region, COUNT(*) FROM persons WHERE age2 <> 'none {i}' GROUP BY region"
           for i in range(10)]  # fmt: skip
    print("| query | statements | commits | autocommitted nextval |")
    print("|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as workdir:
        counted("ckm repeated", ckm_db, "analyst", [ckm] * 11, Path(workdir))
        counted("ckm new text", ckm_db, "analyst", [ckm, *ckm_new], Path(workdir))
        counted("dp cached", dp_db, "u0", [small] * 11, Path(workdir))
        counted("dp new cells, open", dp_db, "u1", [small, *new], Path(workdir))
        fresh = [f"u{i}" for i in range(2, 13)]  # users who have asked nothing
        counted_fresh("dp new cells, new connection", dp_db, fresh, small, Path(workdir))


if __name__ == "__main__":
    main()
