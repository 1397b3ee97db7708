"""CLI start-up stays fast: ``sqlsdc --help`` and ``sqlsdc CMD --help`` import no heavy module.

A timing assertion would flake on a busy machine; what makes start-up slow is importing duckdb,
pandas, sqlglot, OR-Tools, numba or scipy at module level, so that is what is asserted.
Timings are in benchmarks/README.md ("CLI start-up").
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "duckdb", "numpy", "pandas", "ortools", "numba", "sqlglot", "scipy", "pyarrow", "jsonschema",
)  # fmt: skip

# Runs the CLI in-process with the given arguments and reports which heavy modules it loaded.
PROBE = """
import json, sys
from sqlsdc.cli.main import cli
try:
    cli.main(args=sys.argv[1:], prog_name="sqlsdc", standalone_mode=False)
except SystemExit:
    pass
heavy = [m for m in {heavy!r} if m in sys.modules]
print("HEAVY=" + json.dumps(heavy), file=sys.stderr)
"""


def _heavy_after(*args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("HEAVY=")]
    return json.loads(line.removeprefix("HEAVY="))


def test_importing_the_cli_loads_no_heavy_module():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys, sqlsdc.cli.main; print([m for m in {HEAVY!r} if m in sys.modules])",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "[]"


def test_sqlsdc_help_runs_in_a_subprocess():
    done = subprocess.run(
        [sys.executable, "-m", "sqlsdc.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "Usage: " in done.stdout and "query" in done.stdout


def _commands() -> list[list[str]]:
    from sqlsdc.cli.main import cli

    paths = []
    for name, command in cli.commands.items():
        paths.append([name])
        paths.extend([name, sub] for sub in getattr(command, "commands", {}))
    return paths


@pytest.mark.parametrize("path", [[]] + _commands(), ids=lambda p: " ".join(p) or "sqlsdc")
def test_help_of_every_command_loads_no_heavy_module(path, tmp_path):
    args = path
    if path[:1] == ["budget"] and len(path) == 2:  # `budget DB grant`: the database comes first
        (tmp_path / "x.duckdb").touch()
        args = ["budget", str(tmp_path / "x.duckdb"), path[1]]
    assert _heavy_after(*args, "--help") == []


def test_a_guarded_query_loads_no_job_solver(demo_db):
    """``sqlsdc query`` imports the guard, which imports :mod:`sqlsdc.jobs.patterns`; the jobs
    package names its jobs lazily, so a query loads neither numba (microaggregation) nor
    OR-Tools (the jobs' solvers): their import was a third of a CLI query's CPU (new user
    s40h; benchmarks/README.md)."""
    sql = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"
    heavy = _heavy_after("query", str(demo_db), "--user", "analyst", sql)
    assert "duckdb" in heavy  # the query ran
    assert "numba" not in heavy and "ortools" not in heavy
