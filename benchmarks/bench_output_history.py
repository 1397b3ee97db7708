"""CPU time of two session-39 changes to the back-end jobs, A/B in one run.

1. The differencing check with the outputs' history (:mod:`sqlsdc.jobs.output_history`): a
   suppression job of a table next to one anonymised file, and next to the same file after it
   was replaced ``versions - 1`` times (every version compared).
2. A suppression job of a sum whose unit counts ``n`` are audited with its sums
   (:mod:`sqlsdc.jobs.sum_counts`): CPU time and cells hidden, with and without the counts'
   audit (the second by ``audit_counts`` bypassed for the run).

    python benchmarks/bench_output_history.py [persons] [versions]

Builds its own demo databases (threshold policy as the tests' ``jobs_demo_db``; default 20,000
persons, 4 versions) in a temporary folder.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import TabularError
from sqlsdc.jobs import protect
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.jobs.protect import protect_query
from sqlsdc.policy import load_policy
from sqlsdc.tabular.rules import FrequencyRule

JOB = ("SELECT region, education, COUNT(*) FROM persons WHERE age >= 85 "
       "GROUP BY region, education")  # fmt: skip
SUM = ("SELECT nace, region, SUM(turnover) FROM enterprises WHERE employees >= 10 "
       "GROUP BY nace, region")  # fmt: skip


def _policy():
    document = demo_policy().document_dict()
    document["protection"] = {"min_frequency": 10, "counts": {"method": "threshold"},
                              "magnitudes": {"method": "threshold"}}  # fmt: skip
    for table in document["tables"].values():
        table.pop("protection", None)
        table.pop("dp", None)
    return load_policy(document, name="threshold-demo-policy")


BREAKS = ["65/75/85", "65/70/85", "65/80/85", "65/75/85/90", "65/72/85", "65/78/85/95"]


def _file(db: Path, version: int, replace: bool) -> None:
    """Version ``version`` of the seniors file: other bands below 85 (distinct exact tables,
    each compared), always a band starting at 85 (the job is stored)."""
    anonymize(db, user="admin", into="seniors", replace=replace, seed=version,
              sql="SELECT * FROM persons WHERE region = 'R01' AND age >= 65",
              steps=[f"recode:age:breaks={BREAKS[version % len(BREAKS)]}",
                     "microaggregate:income:k=5"])  # fmt: skip


def _cpu(function) -> float:
    start = time.process_time()
    try:
        function()
    except TabularError as refusal:  # the check's refusal costs as much: still measured
        print("  refused:", str(refusal)[:600])
    return time.process_time() - start


def _hidden(db: Path, name: str) -> int:
    con = open_database(db)
    try:
        return con.sql(f"SELECT count(*) FROM protected.{name} WHERE status <> 'published'"
                       ).fetchall()[0][0]  # fmt: skip
    finally:
        con.close()


def main(persons: int, versions: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-history-"))
    try:
        template = folder / "template.duckdb"
        build_demo_database(template, persons=persons, seed=7, policy=_policy())
        one, many = folder / "one.duckdb", folder / "many.duckdb"
        shutil.copy(template, one)
        shutil.copy(template, many)
        _file(one, 0, replace=False)
        for version in range(versions):
            _file(many, version, replace=version > 0)
        for round_ in range(2):  # the second round: warm caches
            for db, label in ((one, "1 version"), (many, f"{versions} versions")):
                seconds = _cpu(lambda db=db, round_=round_: protect_query(
                    db, "admin", JOB, into=f"job_{round_}", rules=[FrequencyRule(5)]))  # fmt: skip
                print(f"job next to a file, {label}: {seconds:.2f} s CPU")
        shutil.copy(template, one)
        shutil.copy(template, many)
        audited = _cpu(lambda: protect_query(one, "admin", SUM, into="turnover"))
        kept = protect.audit_counts
        protect.audit_counts = lambda table, rules, result, *_a, **_k: result
        try:
            alone = _cpu(lambda: protect_query(many, "admin", SUM, into="turnover"))
        finally:
            protect.audit_counts = kept
        print(
            f"sum job, counts audited: {audited:.2f} s CPU, {_hidden(one, 'turnover')} cells "
            f"hidden; sums only: {alone:.2f} s CPU, {_hidden(many, 'turnover')} hidden"
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000,
         int(sys.argv[2]) if len(sys.argv) > 2 else 4)  # fmt: skip
