"""Benchmark of back-end jobs' cost on a small table: CPU per job kind and DuckDB statements.

Builds the tests' jobs demo (20,000 persons, threshold policy, a fixed PRF secret), then runs
each job kind on a fresh copy (``--repeat`` times, the minimum CPU reported): a suppression,
a controlled rounding, a CTA, an IPF, an anonymised file of every column, a parametric
synthesis, ``publish`` of one suppression job, and a second suppression job next to a first
(the differencing checks against a stored output). CPU is the process's (DuckDB's threads
included); statements are those the job sends through ``open_database``'s connection. The
floor, measured in the same run on the same copy: plain DuckDB opening the file, running the
job's own source query and closing it (``raw ms``; the ratio is the job's CPU over it).

Usage: python benchmarks/bench_jobs_fixed_cost.py [--repeat 3] [--only suppress,round]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import duckdb
import pandas as pd
from bench_output_history import _policy as threshold_policy  # the tests' threshold policy

from sqlsdc.demo.build import build_demo_database
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines.duckdb import open_database
from sqlsdc.jobs.adjust import cta_query, ipf_query, round_query
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.jobs.protect import protect_query
from sqlsdc.release import publish
from sqlsdc.synth.job import synthesize
from sqlsdc.tabular.rules import FrequencyRule

OLD = "SELECT region, education, COUNT(*) FROM persons WHERE age >= 85 GROUP BY region, education"
TURNOVER = "SELECT nace, region, SUM(turnover) FROM enterprises GROUP BY nace, region"
SENIORS = "SELECT * FROM persons WHERE region = 'R01' AND age >= 65"


def template(folder: Path) -> Path:
    path = folder / "jobs.duckdb"
    build_demo_database(path, persons=20_000, seed=7, policy=threshold_policy())
    con = open_database(path)
    try:
        con.execute("UPDATE sqlsdc.secrets SET material = ? WHERE name = 'prf'", [bytes(range(32))])
        regions = con.execute("SELECT region, 'Total' AS education, sum(income) * 1.02 AS value "
                              "FROM persons WHERE age >= 85 GROUP BY region").df()  # fmt: skip
        levels = con.execute("SELECT 'Total' AS region, education, sum(income) AS value "
                             "FROM persons WHERE age >= 85 GROUP BY education").df()  # fmt: skip
    finally:
        con.close()
    levels["value"] = levels["value"] * regions["value"].sum() / levels["value"].sum()
    pd.concat([regions, levels]).to_csv(folder / "margins.csv", index=False)
    return path


def jobs(folder: Path) -> dict:
    """Each job kind: (setup run before the clock starts, the job)."""
    income = OLD.replace("COUNT(*)", "SUM(income)")
    first = lambda db: protect_query(db, "admin", OLD, into="j0", rules=[FrequencyRule(5)])  # noqa: E731
    return {
        "suppress": (None, first),
        "round": (None, lambda db: round_query(db, "admin", OLD, into="j", base=5)),
        "cta": (None, lambda db: cta_query(db, "admin", TURNOVER, into="j")),
        "ipf": (
            None,
            lambda db: ipf_query(
                db,
                "admin",
                income,
                into="j",
                rules=[FrequencyRule(10)],
                margins=folder / "margins.csv",
            ),
        ),  # fmt: skip
        "anonymize": (
            None,
            lambda db: anonymize(
                db,
                user="admin",
                into="j",
                sql=SENIORS,
                seed=7,
                steps=["recode:age:breaks=65/75/85", "microaggregate:income:k=5"],
            ),
        ),  # fmt: skip
        "synthesize": (
            None,
            lambda db: synthesize(
                db,
                user="admin",
                source="persons",
                into="j",
                method="parametric",
                columns=["region", "sex", "age", "income"],
                seed=1,
            ),
        ),  # fmt: skip
        "publish": (first, lambda db: publish(db, db.with_suffix(".release.duckdb"), "admin")),
        "second suppress": (
            first,
            lambda db: protect_query(
                db, "admin", OLD.replace("education", "sex"), into="k", rules=[FrequencyRule(5)]
            ),
        ),
    }


FLOORS = {  # the source query each job reads: what plain DuckDB does for it
    "suppress": OLD,
    "round": OLD,
    "cta": TURNOVER,
    "ipf": OLD.replace("COUNT(*)", "SUM(income)"),
    "anonymize": SENIORS,
    "synthesize": "SELECT region, sex, age, income FROM persons",
    "publish": OLD,
    "second suppress": OLD.replace("education", "sex"),
}


def raw_cpu(db: Path, sql: str) -> float:
    """CPU seconds of plain DuckDB opening ``db``, fetching ``sql`` and closing."""
    start = time.process_time()
    con = duckdb.connect(str(db), read_only=True)
    con.execute(sql).fetchall()
    con.close()
    return time.process_time() - start


def counted(run) -> int:
    """The statements ``run`` sends through :class:`sqlsdc.engines.duckdb.LockedConnection`."""
    calls = [0]
    real = engine.LockedConnection.execute

    def execute(self, *args, **kwargs):
        calls[0] += 1
        return real(self, *args, **kwargs)

    engine.LockedConnection.execute = execute
    try:
        run()
    finally:
        engine.LockedConnection.execute = real
    return calls[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        source = template(folder)
        print(f"{'job':18} {'CPU ms (min)':>12} {'statements':>10} {'raw ms':>7} {'ratio':>6}")
        for name, (setup, job) in jobs(folder).items():
            if args.only and name not in args.only.split(","):
                continue
            times, raws, statements = [], [], 0
            for i in range(args.repeat):
                db = folder / f"run{i}.duckdb"
                shutil.copyfile(source, db)
                raws.append(raw_cpu(db, FLOORS[name]))
                if setup is not None:
                    setup(db)
                if i == 0:  # counted once, timed in the other runs (and in this one)
                    start = time.process_time()
                    statements = counted(lambda db=db, job=job: job(db))
                else:
                    start = time.process_time()
                    job(db)
                times.append(time.process_time() - start)
            job_ms, raw_ms = min(times) * 1000, min(raws) * 1000
            print(f"{name:18} {job_ms:12.0f} {statements:10d} {raw_ms:7.1f} {job_ms / raw_ms:6.0f}")


if __name__ == "__main__":
    main()
