"""The example policies in schemas/examples/ are complete, and each one is applied and queried.

``demo.yaml`` is the demo policy itself (``sqlsdc/demo/policy.yaml``); ``suppress.yaml`` is that
policy with enterprises protected by suppression and nothing else changed (the benefits table and
the budgets included); ``minimal.yaml`` initialises a database of its own.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import cli_fork
import duckdb
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "schemas" / "examples"
DEMO_POLICY = ROOT / "sqlsdc" / "demo" / "policy.yaml"


def sqlsdc_cli(*args: str) -> subprocess.CompletedProcess:
    return cli_fork.run(args, timeout=300)


def _document(path: Path) -> dict:
    return yaml.safe_load(path.read_text("utf-8"))


def test_every_example_is_tested_here():
    assert {p.name for p in EXAMPLES.glob("*.yaml")} == {
        "demo.yaml",
        "minimal.yaml",
        "suppress.yaml",
    }


def test_demo_example_is_the_demo_policy():
    assert (EXAMPLES / "demo.yaml").read_text("utf-8") == DEMO_POLICY.read_text("utf-8")


def test_suppress_example_changes_only_the_enterprises_protection():
    demo, suppress = _document(DEMO_POLICY), _document(EXAMPLES / "suppress.yaml")
    demo_enterprises = demo["tables"].pop("enterprises")
    enterprises = suppress["tables"].pop("enterprises")
    assert suppress == demo  # benefits, budgets, users and every other table as in the demo
    assert {k: v for k, v in enterprises.items() if k not in ("protection", "suppression")} == {
        k: v for k, v in demo_enterprises.items() if k != "protection"
    }
    assert enterprises["protection"]["counts"]["method"] == "suppress"
    assert enterprises["suppression"]["dimensions"] == ["nace", "region"]


@pytest.fixture
def demo_copy(ckm_db, tmp_path) -> Path:
    copy = tmp_path / "demo.duckdb"
    shutil.copy(ckm_db, copy)
    return copy


@pytest.mark.parametrize("name", ["demo.yaml", "suppress.yaml"])
def test_demo_examples_apply_and_answer(demo_copy, name, sqlsdc_in_process):
    """Applied by a real process; the queries run in this one (each command has its own
    real-process tests)."""
    applied = sqlsdc_cli("policy", "apply", demo_copy, EXAMPLES / name, "--user", "admin")
    assert applied.returncode == 0, applied.stderr
    assert "policy version 2 applied" in applied.stdout
    for sql in (
        "SELECT region, COUNT(*) AS n, SUM(turnover) AS t FROM enterprises GROUP BY region",
        "SELECT scheme, COUNT(*) AS n FROM benefits GROUP BY scheme",
        "SELECT sex, COUNT(*) AS n, AVG(income) AS m FROM persons GROUP BY sex",
    ):
        done = sqlsdc_in_process("query", demo_copy, "--user", "analyst", "--format", "csv", sql)
        assert done.returncode == 0, (sql, done.stderr)
        assert len(done.stdout.splitlines()) >= 3
    budget = sqlsdc_in_process("budget", demo_copy, "--format", "json")
    assert budget.returncode == 0, budget.stderr
    assert '"table": "benefits"' in budget.stdout


def test_minimal_example_initialises_its_own_database(tmp_path):
    db = tmp_path / "minimal.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute(
            "CREATE TABLE people AS SELECT i AS id, 'T' || (i % 3) AS town, "
            "1000.0 * i AS salary FROM range(300) t(i)"
        )
        con.execute("CREATE TABLE towns AS SELECT 'T' || i AS town, 100 * i AS population "
                    "FROM range(3) t(i)")  # fmt: skip
    done = sqlsdc_cli("init", db, "--policy", EXAMPLES / "minimal.yaml", "--user", "owner")
    assert done.returncode == 0, done.stderr
    # minimal.yaml has an admin only: its confidential table is read through the admin's guard
    done = sqlsdc_cli(
        "query", db, "--user", "owner", "--format", "csv",
        "SELECT town, COUNT(*) AS n FROM people GROUP BY town ORDER BY town",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["town,n", "T0,100", "T1,100", "T2,100"]
