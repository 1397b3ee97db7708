"""CPU time of the differencing check's blanked cells next to its other differences.

Run on a database that holds an anonymised file of the README (``seniors_r01``: R01 aged
65-89, municipalities blanked by local suppression) on the default demo of a million persons:

    python benchmarks/bench_blanked_cells.py sqlsdc-demo.duckdb

For each table (a suppression job's SQL, not run), the CPU time of
``smallest_difference`` (the populations' differences) and of ``blanked_difference`` (the
cells the file's blanked values leave short), and the same file without its blanked columns
(a file without local suppression: no query).
"""

from __future__ import annotations

import dataclasses
import sys
import time

from sqlsdc.catalog import store
from sqlsdc.engines.duckdb import open_database
from sqlsdc.jobs.blanked_cells import blanked_difference
from sqlsdc.jobs.differencing import min_frequency
from sqlsdc.jobs.record_files import stored_files
from sqlsdc.jobs.tabulation import parse_job
from sqlsdc.jobs.uncovered import smallest_difference
from sqlsdc.policy import load_policy

TABLES = [
    "SELECT region, municipality, education, COUNT(*) FROM persons WHERE age >= 90 "
    "GROUP BY region, municipality, education",
    "SELECT region, education, COUNT(*) FROM persons WHERE age >= 85 GROUP BY region, education",
    "SELECT municipality, sex, COUNT(*) FROM persons WHERE age >= 65 GROUP BY municipality, sex",
    "SELECT region, COUNT(*) FROM persons GROUP BY region",
]


def cpu(function, *args) -> tuple[float, object]:
    start = time.process_time()
    result = function(*args)
    return time.process_time() - start, result


def main(db: str) -> None:
    con = open_database(db)
    _version, document, source = store.current_policy(con)
    policy = load_policy(document, name=source)
    files = [f for f in stored_files(con, policy, "persons") if f.blanked]
    for file in files:
        print(file.label, "blanked:", sorted(file.blanked))
        plain = dataclasses.replace(file, blanked=frozenset())
        for sql in TABLES:
            spec = parse_job(sql, policy)
            least = min_frequency(policy, spec.table)
            t_diff, _ = cpu(smallest_difference, con, spec, file, least)
            t_blank, found = cpu(blanked_difference, con, spec, file, least)
            t_none, _ = cpu(blanked_difference, con, spec, plain, least)
            print(f"  {sql[:60]}...: differences {t_diff:.3f}s, blanked cells {t_blank:.3f}s "
                  f"({'found' if found else 'none'}), without blanked {t_none:.4f}s")  # fmt: skip
    con.close()


if __name__ == "__main__":
    main(sys.argv[1])
