"""A new user's SQL files on the command line (session 46, issue 18 must-have 3): a query saved
as "UTF-8 with BOM" (Windows editors do) is read as the query, through ``-`` or
``"$(cat q.sql)"``, and ``risk`` reads ``-`` from stdin as ``query`` and ``explain`` do.
Real processes (:mod:`cli_fork`) on a copy of the demo database."""

from __future__ import annotations

import json

import cli_fork
import pytest
from sqlsdc.cli import errors

SQL = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region ORDER BY region"
BOM = "\ufeff"


@pytest.fixture(scope="module")
def db(pristine_demo_db, tmp_path_factory, copy_database):
    return copy_database(pristine_demo_db, tmp_path_factory.mktemp("first_hour"))


@pytest.mark.parametrize("via", ["stdin", "argument"])
def test_a_query_saved_with_a_byte_order_mark_is_answered(db, via):
    """Was exit 6, "could not be parsed: Invalid expression / Unexpected token (line 1,
    column 14)": the BOM reached the parser as a character before SELECT."""
    argv = ["query", str(db), "--user", "analyst", "--format", "json"]
    if via == "stdin":
        result = cli_fork.run([*argv, "-"], input=BOM + SQL, timeout=60)
    else:
        result = cli_fork.run([*argv, BOM + SQL], timeout=60)
    assert result.returncode == errors.OK, result.stderr[-600:]
    plain = cli_fork.run([*argv, SQL], timeout=60)
    assert json.loads(result.stdout) == json.loads(plain.stdout)  # the same protected answer
    assert [row["region"] for row in json.loads(result.stdout)][:2] == ["R01", "R02"]


def test_risk_reads_its_sql_from_stdin(db):
    """``risk DB -`` parsed "-" as the statement: "syntax error: NEG is incomplete" (exit 6),
    though ``query`` and ``explain`` read ``-`` from stdin."""
    argv = ["risk", str(db), "-", "--count", "n", "--format", "json"]
    result = cli_fork.run(argv, input=BOM + SQL, timeout=60)
    assert result.returncode == errors.OK, result.stderr[-600:]
    measures = json.loads(result.stdout)
    assert measures["cells"] == 8  # the demo's regions
    direct = cli_fork.run([*argv[:2], SQL, *argv[3:]], timeout=60)
    assert json.loads(direct.stdout)["cells"] == 8
