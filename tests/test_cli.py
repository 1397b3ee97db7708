"""The CLI through click's runner and through real subprocesses."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import cli_fork
import pytest
from click.testing import CliRunner
from sqlsdc.cli.main import cli

PERSONS_BY_SEX = "SELECT sex, COUNT(*) AS n FROM persons GROUP BY sex ORDER BY sex"


def run(*args, code=0, input=None):
    result = CliRunner().invoke(cli, list(map(str, args)), input=input, catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


def test_every_command_has_help():
    names = list(cli.commands)
    assert {"demo", "init", "policy", "query", "explain", "audit"} <= set(names)
    for name in names:
        assert "Usage:" in run(name, "--help").output
    for sub in ("validate", "show", "apply"):
        assert "Usage:" in run("policy", sub, "--help").output


def test_query_formats(demo_db):
    table = run("query", demo_db, "--user", "analyst", PERSONS_BY_SEX).output
    assert "sex" in table and "F" in table
    rows = json.loads(
        run("query", demo_db, "-u", "analyst", PERSONS_BY_SEX, "--format", "json").output
    )
    assert [r["sex"] for r in rows] == ["F", "M"] and all(r["n"] > 0 for r in rows)
    csv = run("query", demo_db, "-u", "analyst", PERSONS_BY_SEX, "--format", "csv").output
    assert csv.splitlines()[0] == "sex,n"
    status = run("query", demo_db, "-u", "analyst", PERSONS_BY_SEX, "--status").output
    assert [line.split() for line in status.splitlines()] == [
        ["sex", "n"],
        ["F", "published"],
        ["M", "published"],
    ]  # the keys' values beside their cells' statuses
    stdin = run("query", demo_db, "-u", "analyst", "-", "--format", "json", input=PERSONS_BY_SEX)
    assert json.loads(stdin.output) == rows


def test_a_statement_that_starts_with_a_comment_is_the_sql_argument(demo_db):
    """`sqlsdc query DB -u U "-- by sex\nSELECT ..."` said "No such option '-- by sex ...'"
    (exit 2) in query, explain and risk (new user s44g): it is the SQL, before or after the
    options; a misspelt option is still one."""
    commented = f"-- persons by sex\n{PERSONS_BY_SEX}"
    expected = run("query", demo_db, "-u", "analyst", PERSONS_BY_SEX, "--format", "csv").output
    assert run("query", demo_db, "-u", "analyst", commented, "--format", "csv").output == expected
    assert run("query", demo_db, commented, "-u", "analyst", "--format", "csv").output == expected
    assert "  n: threshold" in run("explain", demo_db, "-u", "analyst", commented).output
    risk = f"-- risk\n{PERSONS_BY_SEX.replace(' ORDER BY sex', '')}"
    assert "cells" in run("risk", demo_db, risk, "--count", "n").output
    bogus = run("query", demo_db, "-u", "analyst", PERSONS_BY_SEX, "--bogus", code=2).output
    assert "No such option '--bogus'" in bogus


def test_refusal_exit_code_and_message(demo_db):
    result = CliRunner().invoke(
        cli, ["query", str(demo_db), "-u", "analyst", "SELECT * FROM persons"]
    )
    assert result.exit_code == 3
    assert "refused: row-level output" in result.output
    assert "Traceback" not in result.output


def test_unknown_user_is_denied(demo_db):
    result = CliRunner().invoke(cli, ["query", str(demo_db), "-u", "mallory", PERSONS_BY_SEX])
    assert result.exit_code == 5 and "not declared" in result.output


def test_explain_json(demo_db):
    out = run("explain", demo_db, "-u", "analyst", PERSONS_BY_SEX, "--format", "json").output
    explained = json.loads(out)
    assert [c["mechanism"] for c in explained["columns"]] == ["key", "threshold"]
    assert "__cells" in explained["sql"]


def test_policy_validate_show_apply_and_audit(fresh_demo_db, tmp_path):
    from sqlsdc.demo.build import demo_policy

    policy_file = tmp_path / "policy.yaml"
    import yaml

    document = dict(demo_policy().document)
    document["protection"] = {"min_frequency": 20}
    policy_file.write_text(yaml.safe_dump(document))
    assert "valid" in run("policy", "validate", policy_file).output
    assert "policy version 2 applied" in run("policy", "apply", fresh_demo_db, policy_file).output
    shown = run("policy", "show", fresh_demo_db).output
    assert shown.startswith("# policy version 2") and "min_frequency: 20" in shown
    history = json.loads(
        run("policy", "show", fresh_demo_db, "--history", "--format", "json").output
    )
    assert [h["version"] for h in history] == [1, 2]
    run("query", fresh_demo_db, "-u", "analyst", PERSONS_BY_SEX)
    CliRunner().invoke(cli, ["query", str(fresh_demo_db), "-u", "analyst", "SELECT * FROM persons"])
    entries = json.loads(run("audit", fresh_demo_db, "--format", "json").output)
    assert [e["decision"] for e in entries[:2]] == ["refused", "accepted"]
    assert entries[0]["policy_version"] == 2
    denied = CliRunner().invoke(cli, ["audit", str(fresh_demo_db), "--user", "analyst"])
    assert denied.exit_code == 5
    # --since (included) and --until (excluded), in UTC as logged_at (new user s39)
    import datetime as dt

    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}", e["logged_at"])
               for e in entries)  # fmt: skip  # microseconds, as the table shows (were ms)
    day = dt.date.fromisoformat(entries[0]["logged_at"][:10])
    newest = dt.datetime.fromisoformat(entries[0]["logged_at"]).replace(microsecond=0)

    def logged(*times):
        shown = run("audit", fresh_demo_db, *times, "--format", "json").output
        return [e["query_id"] for e in json.loads(shown)]

    assert logged("--since", day) == [e["query_id"] for e in entries]
    assert logged("--until", day) == []
    assert logged("--since", day + dt.timedelta(days=1)) == []
    since = [
        e["query_id"]
        for e in entries
        if dt.datetime.fromisoformat(e["logged_at"]) >= newest and e["user_name"] == "analyst"
    ]
    assert logged("--since", str(newest), "--who", "analyst") == since
    assert entries[0]["query_id"] not in logged("--until", str(newest))
    one = CliRunner().invoke(cli, ["audit", str(fresh_demo_db), "--limit", "1", "--format", "csv"])
    assert one.exit_code == 0 and len(one.stdout.splitlines()) == 2  # header and the newest
    assert one.stderr == "sqlsdc: the newest 1 entries; --limit N for more\n"
    every = CliRunner().invoke(cli, ["audit", str(fresh_demo_db), "--limit", str(len(entries))])
    assert every.exit_code == 0 and every.stderr == ""  # no more than shown: no note
    bad = CliRunner().invoke(cli, ["audit", str(fresh_demo_db), "--since", "yesterday"])
    assert bad.exit_code == 2 and "does not match the formats" in bad.output


def test_invalid_policy_exit_code(tmp_path):
    bad = tmp_path / "policy.yaml"
    bad.write_text(
        "tables:\n  persons:\n    privacy_unit: id\n    columns:\n      id: {role: identifier}\n"
        "      income: {role: measure, bounds: [10, 5]}\nusers:\n  a: {role: admin}\n"
    )
    result = CliRunner().invoke(cli, ["policy", "validate", str(bad)])
    assert result.exit_code == 4
    expected = (
        "policy.yaml: line 6, column 31: tables.persons.columns.income.bounds: lower bound 10 "
        "is above upper bound 5"
    )
    assert expected in result.output


def test_init_on_a_plain_database(tmp_path):
    import duckdb

    db = tmp_path / "plain.duckdb"
    con = duckdb.connect(str(db))
    con.execute(
        "CREATE TABLE people AS SELECT range AS id, range % 3 AS town, 1.5 AS salary "
        "FROM range(100)"
    )
    con.execute("CREATE TABLE towns AS SELECT 1 AS town")
    con.close()
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "tables:\n  people:\n    privacy_unit: id\n    columns:\n      id: {role: identifier}\n"
        "      town: {role: dimension}\n      salary: {role: measure, bounds: [0, 10]}\n"
        "  towns: {kind: public}\nusers:\n  owner: {role: admin}\n  ana: {role: analyst}\n"
    )
    out = run("init", db, "--policy", policy, "--user", "owner").output
    assert "people: 100 new rows keyed; one row per unit" in out
    rows = json.loads(
        run(
            "query",
            db,
            "-u",
            "ana",
            "SELECT town, COUNT(*) AS n FROM people GROUP BY town ORDER BY town",
            "--format",
            "json",
        ).output
    )
    assert [r["n"] for r in rows] == [34, 33, 33]


def test_help_and_the_installed_examples_lead_to_your_own_data(tmp_path):
    """`sqlsdc --help` named only the demo; it now says how to start on one's own data, and
    `python -m sqlsdc.schemas` prints where the installed schema and example policies are (a
    pip install has no checkout's schemas/ folder), each of which validates (new user s38)."""
    shown = subprocess.run([sys.executable, "-m", "sqlsdc.cli", "--help"], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert "sqlsdc init my.duckdb --policy my-policy.yaml --as ADMIN" in shown.stdout
    assert "python -m sqlsdc.schemas" in shown.stdout
    where = subprocess.run([sys.executable, "-m", "sqlsdc.schemas"], capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    paths = [Path(line) for line in where.stdout.splitlines()]
    assert where.returncode == 0 and paths[0].name == "policy.schema.json"
    assert {p.name for p in paths[1:]} >= {"minimal.yaml", "demo.yaml"}
    for example in paths[1:]:
        assert "valid" in run("policy", "validate", example).output


def test_schemas_module_has_help_and_refuses_other_arguments(tmp_path):
    """`python -m sqlsdc.schemas --help` printed the paths, as did any other argument (new
    user s44g): --help says what it prints, a wrong argument is a usage error (exit 2)."""

    def schemas(*args):
        argv = [sys.executable, "-m", "sqlsdc.schemas", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)

    shown = schemas("--help")
    assert shown.returncode == 0 and "usage: python -m sqlsdc.schemas" in shown.stdout
    assert "JSON Schema" in shown.stdout and "policy.schema.json" not in shown.stdout.split()
    wrong = schemas("--bogus")
    assert wrong.returncode == 2 and "unrecognized arguments: --bogus" in wrong.stderr
    assert wrong.stdout == "" and "Traceback" not in wrong.stderr


def test_init_counts_the_rows_it_keys(tmp_path):
    """Six rows of three units: init said "6 new record keys" where the units have three; it
    now says what it counted, the rows keyed (new user s38). A real process."""
    import duckdb

    db = tmp_path / "v.duckdb"
    with duckdb.connect(db) as con:
        con.execute("CREATE TABLE visits AS SELECT range // 2 AS id, range % 2 AS q FROM range(6)")
    (tmp_path / "p.yaml").write_text(
        "tables:\n  visits:\n    privacy_unit: id\n    columns:\n      id: {role: identifier}\n"
        "      q: {role: dimension}\nusers:\n  owner: {role: admin}\n"
    )
    done = cli_fork.run(["init", str(db), "--policy", str(tmp_path / "p.yaml"), "--as", "owner"],
                        timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "  visits: 6 new rows keyed; several rows per unit\n" in done.stdout


def test_policy_show_writes_the_policy_as_its_files_are_written(demo_db, tmp_path):
    """In the schema's order with a column's role first and short values on one line (it was
    sorted, one value per line: ``budgets`` first, ``bounds`` before ``role``); what it prints
    is the policy in force and applies as it is (new user s38). A real process."""
    import yaml

    shown = cli_fork.run(["policy", "show", str(demo_db)], timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("# policy version ")
    assert "      person_id: {role: identifier}\n" in shown.stdout
    assert "        role: measure\n        bounds: [0, 1000000]\n" in shown.stdout
    top = [line.split(":")[0] for line in shown.stdout.splitlines() if line[:1].isalpha()]
    assert top.index("protection") < top.index("tables") < top.index("users")
    stored = cli_fork.run(["policy", "show", str(demo_db), "--format", "json"], timeout=120)
    assert yaml.safe_load(shown.stdout) == json.loads(stored.stdout)["policy"]
    (tmp_path / "shown.yaml").write_text(shown.stdout)
    valid = cli_fork.run(["policy", "validate", str(tmp_path / "shown.yaml")], timeout=120)
    assert valid.returncode == 0, valid.stderr


@pytest.mark.parametrize(
    "args, code", [(["--help"], 0), (["query", "missing.duckdb", "-u", "a", "SELECT 1"], 8)]
)
def test_subprocess_entry_point(args, code, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "sqlsdc.cli", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr


def test_demo_in_a_subprocess(tmp_path):
    """The console script builds a demo; a query on it in a process of its own (forked with
    sqlsdc imported: the entry point's start-up is the first command's)."""
    db = tmp_path / "demo.duckdb"
    result = subprocess.run(
        ["sqlsdc", "demo", "--db", str(db), "--persons", "5000", "--seed", "3"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "published" in result.stdout and "refused:" in result.stdout
    assert "ACCEPTED (unexpected)" not in result.stdout
    query = cli_fork.run(
        ["query", db, "--user", "analyst", PERSONS_BY_SEX, "--format", "json"], timeout=120
    )
    assert query.returncode == 0 and len(json.loads(query.stdout)) == 2


def test_query_prints_values_as_they_are(demo_db):
    """The CLI printed a DataFrame: a DATE was a timestamp in JSON, an INTERVAL
    "<DateOffset: days=3, ...>" and a HUGEINT a float with other digits (12345678901234567168.0)."""
    sql = (
        "SELECT DATE '2020-01-01' AS d, INTERVAL 3 DAY AS i, 12345678901234567890::HUGEINT AS h, "
        "1.50::DECIMAL(4, 2) AS dec, NULL::INTEGER AS missing, CAST('nan' AS DOUBLE) AS nan"
    )
    (row,) = json.loads(run("query", demo_db, "-u", "analyst", sql, "--format", "json").output)
    assert row == {"d": "2020-01-01", "i": "3 days 00:00:00", "h": 12345678901234567890,
                   "dec": 1.5, "missing": None, "nan": None}  # fmt: skip
    csv = run("query", demo_db, "-u", "analyst", sql, "--format", "csv").output
    assert csv.splitlines()[1] == "2020-01-01,3 days,12345678901234567890,1.5,,"
    table = run("query", demo_db, "-u", "analyst", sql).output
    assert "12345678901234567890" in table and "DateOffset" not in table and "NULL" in table


def test_json_holds_nested_values_too(tmp_path):
    """A public table's list and struct values: a NaN inside a list ended --format json as an
    internal error (exit 70, "Out of range float values are not JSON compliant")."""
    import duckdb

    import sqlsdc

    db = tmp_path / "nested.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE persons AS SELECT 1 AS id")
    nested = "{'a': 'inf'::DOUBLE, 'b': 2.50::DECIMAL(10, 2), 'c': [DATE '2020-01-02']}"
    con.execute(f"CREATE TABLE codes AS SELECT ['nan'::DOUBLE, 1.5] AS l, {nested} AS s")
    con.close()
    sqlsdc.init(db, {
        "tables": {"persons": {"privacy_unit": "id", "columns": {"id": {"role": "identifier"}}},
                   "codes": {"kind": "public", "columns": {"l": {"role": "dimension"},
                                                           "s": {"role": "dimension"}}}},
        "users": {"root": {"role": "admin"}, "alice": {"role": "analyst"}},
    }, applied_by="root")  # fmt: skip
    out = run("query", db, "-u", "alice", "SELECT * FROM codes", "--format", "json").output
    assert json.loads(out) == [{"l": [None, 1.5], "s": {"a": None, "b": 2.5, "c": ["2020-01-02"]}}]


def test_swapped_arguments_are_a_usage_error_that_says_so(demo_db):
    result = run("query", PERSONS_BY_SEX, demo_db, "-u", "analyst", code=2)
    assert "the database comes first: sqlsdc query DB --user U SQL" in result.output


def test_policy_db_show_says_the_command_comes_first(demo_db):
    """`sqlsdc policy DB show` (budget's order) said "No such command 'DB'" (new user s44g)."""
    swapped = run("policy", demo_db, "show", code=2).output
    assert f"the command comes first: sqlsdc policy show {demo_db} ..." in swapped
    assert "No such command 'bogus'" in run("policy", "bogus", code=2).output
