"""What a research data centre's administrator met with the admin commands (new user s39): the
acting admin by default, what each audit entry cost, the audit's order, budgets of tables not
under differential privacy, and every command's help, exit codes and JSON. Real processes
(:mod:`cli_fork`) on real DuckDB files."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
from pathlib import Path

import cli_fork
import click
import duckdb
import pytest
from sqlsdc.cli import errors
from sqlsdc.cli.admin import acting_admin
from sqlsdc.cli.main import cli

REGIONS = ["r0", "r1", "r2"]
POLICY = {
    "tables": {
        "persons": {  # the cell key method (the default protection)
            "privacy_unit": "id",
            "columns": {
                "id": {"role": "identifier"},
                "region": {"role": "dimension", "domain": REGIONS},
            },
        },  # fmt: skip
        "visits": {  # differential privacy
            "privacy_unit": "id",
            "protection": {"counts": {"method": "dp", "spend": {"epsilon": 0.5}}},
            "dp": {"max_groups": 1, "max_rows": 5},
            "columns": {
                "id": {"role": "identifier"},
                "region": {"role": "dimension", "domain": REGIONS},
            },
        },  # fmt: skip
    },
    "budgets": [{"user": "ana", "epsilon": 10}],
    "users": {"chief": {"role": "admin"}, "ana": {"role": "analyst"}},
}
BY_REGION = "SELECT region, COUNT(*) AS n FROM {} GROUP BY region ORDER BY region"


def sqlsdc(*args, code=0, cwd=None, input=None):
    done = cli_fork.run([str(a) for a in args], timeout=120, cwd=cwd, input=input)
    assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    return done


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The data as loaded by the admin, before `sqlsdc init` (a copy per test)."""
    path = tmp_path_factory.mktemp("admin_ux") / "rdc.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE persons AS SELECT i AS id, 'r' || (i % 3) AS region "
                    "FROM range(300) t(i)")  # fmt: skip
        con.execute("CREATE TABLE visits AS SELECT i % 300 AS id, 'r' || (i % 3) AS region "
                    "FROM range(900) t(i)")  # fmt: skip
    return path


def _setup(data: Path, folder: Path, users: dict) -> tuple[Path, Path]:
    db, policy = folder / "rdc.duckdb", folder / "policy.json"
    shutil.copy(data, db)
    policy.write_text(json.dumps({**POLICY, "users": users}))
    return db, policy


@pytest.fixture
def one_admin(data, tmp_path) -> tuple[Path, Path]:
    """An uninitialised database and a policy whose only admin is ``chief``."""
    return _setup(data, tmp_path, POLICY["users"])


@pytest.fixture(scope="module")
def initialised(data, tmp_path_factory) -> Path:
    """The data after ``sqlsdc init`` with the policy whose only admin is ``chief``: made once
    (a forked ``init`` per test was ~0.2 s of CPU each, 15 tests), copied for each test."""
    db, policy = _setup(data, tmp_path_factory.mktemp("admin_ux_init"), POLICY["users"])
    sqlsdc("init", db, "--policy", policy)
    return db


@pytest.fixture
def db(initialised, tmp_path, copy_database) -> Path:
    """A copy of :func:`initialised` (``tmp_path/demo.duckdb``) that the test may change."""
    return copy_database(initialised, tmp_path)


def test_the_only_admin_acts_by_default_in_every_admin_command(one_admin, tmp_path):
    """`--as` defaulted to `admin`: a policy whose only admin is chief needed `--as chief` in
    every command. Now that admin is the default, in init (from the policy file), the commands
    on the database and budget's subcommands alike, and is who the records name."""
    db, policy = one_admin
    assert "policy version 1 applied" in sqlsdc("init", db, "--policy", policy).stdout
    sqlsdc("policy", "apply", db, policy)
    history = json.loads(sqlsdc("policy", "show", db, "--history", "--format", "json").stdout)
    assert [v["applied_by"] for v in history] == ["chief", "chief"]
    sqlsdc("audit", db)
    sqlsdc("rekey", db, "--yes")
    sqlsdc("budget", db, "grant", "--for", "ana", "--epsilon", "1", "--reason", "study")
    events = json.loads(sqlsdc("budget", db, "--history", "--format", "json").stdout)
    assert [e["admin"] for e in events] == ["chief"]
    sqlsdc("server-user", "add", db, "ana", "--password-stdin", input="a long passphrase\n")
    assert json.loads(sqlsdc("server-user", "list", db, "--format", "json").stdout)[0][
        "set_by"] == "chief"  # fmt: skip
    out = tmp_path / "release.duckdb"
    sqlsdc("publish", db, out, "--for", "ana", "--query", f"r={BY_REGION.format('persons')}")
    denied = sqlsdc("audit", db, "--as", "ana", code=errors.DENIED)  # naming one still checks
    assert "user 'ana' is not an admin in the policy in force (admins: chief)" in denied.stderr


def test_with_several_admins_naming_one_is_required(data, tmp_path):
    """With several admins none is the default: a usage error names them (exit code 2), and a
    new database is not created."""
    users = {**POLICY["users"], "deputy": {"role": "admin"}}
    db, policy = _setup(data, tmp_path, users)
    new = tmp_path / "new.duckdb"
    refused = sqlsdc("init", new, "--policy", policy, code=errors.USAGE)
    assert "the policy has 2 admins (chief, deputy): name the acting one with --as" in (
        refused.stderr)  # fmt: skip
    assert not new.exists()
    sqlsdc("init", db, "--policy", policy, code=errors.USAGE)
    sqlsdc("init", db, "--policy", policy, "--as", "deputy")
    for args in (("audit", db), ("outputs", db), ("rekey", db, "--yes"),
                 ("budget", db, "reset", "--for", "ana", "--reason", "r")):  # fmt: skip
        refused = sqlsdc(*args, code=errors.USAGE)
        assert "(chief, deputy): name the acting one with --as" in refused.stderr
    sqlsdc("budget", db, "reset", "--for", "ana", "--reason", "r", "--as", "deputy")
    missing = sqlsdc("audit", tmp_path / "missing.duckdb", code=errors.NOT_FOUND)
    assert "missing.duckdb" in missing.stderr


@pytest.mark.parametrize("command", [["audit", "--limit", "5"], ["outputs"]])
def test_a_reading_admin_command_opens_the_database_once(db, monkeypatch, command):
    """``audit`` and ``outputs`` opened the file to find the acting admin, then again to
    answer (~30 ms of CPU of each command): now they answer from the first opening, with the
    output they give when the admin is named (and the command opens the file itself)."""
    from click.testing import CliRunner

    from sqlsdc.engines import duckdb as engine

    opened = []
    real = engine.open_database

    def counted(*args, **kwargs):
        opened.append(kwargs.get("read_only"))
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "open_database", counted)
    sqlsdc("query", db, "--user", "ana", BY_REGION.format("persons"))
    runner = CliRunner()
    found = runner.invoke(cli, [command[0], str(db), *command[1:], "--format", "json"])
    assert found.exit_code == 0, found.output
    assert opened == [True]
    named = runner.invoke(cli, [command[0], str(db), *command[1:], "--format", "json",
                                "--as", "chief"])  # fmt: skip
    assert named.exit_code == 0 and named.stdout == found.stdout
    assert opened == [True, True]


WRITES = {
    "rekey": ["rekey", "{db}", "--yes"],
    "policy apply": ["policy", "apply", "{db}", "{policy}"],
    "budget grant": ["budget", "{db}", "grant", "--for", "ana", "--epsilon", "1", "--reason", "r"],
    "budget set": ["budget", "{db}", "set", "--for", "ana", "--epsilon", "5", "--reason", "r"],
    "budget reset": ["budget", "{db}", "reset", "--for", "ana", "--reason", "r"],
    "protect": ["protect", "{db}", "--sql", BY_REGION.format("persons"), "--method", "round",
                "--base", "5", "--into", "rounded"],
    "synthesize": ["synthesize", "{db}", "--from", "persons", "--into", "copy",
                   "--method", "parametric", "--seed", "1"],
}  # fmt: skip


@pytest.fixture
def openings(monkeypatch) -> list:
    """Whether each opening of the database file is read-only, in order."""
    from sqlsdc.engines import duckdb as engine

    opened = []
    real = engine.open_database

    def counted(*args, **kwargs):
        opened.append(kwargs.get("read_only", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "open_database", counted)
    return opened


@pytest.mark.parametrize("name", list(WRITES))
def test_a_writing_admin_command_opens_the_database_once(one_admin, openings, name):
    """Commands that write (rekey, policy apply, budget grant/set/reset, the jobs) opened the
    file read-only to find the acting admin, closed it, and opened it again read-write: now
    they write through the read-write connection opened to find the admin. Named with --as,
    the admin is not looked up, and the command opens the file itself, once."""
    from click.testing import CliRunner

    db, policy = one_admin
    sqlsdc("init", db, "--policy", policy)
    args = [a.format(db=db, policy=policy) for a in WRITES[name]]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 0, done.output
    assert openings == [False]
    if name in ("protect", "synthesize"):
        args += ["--replace"]
    named = CliRunner().invoke(cli, [*args, "--as", "chief"])
    assert named.exit_code == 0, named.output
    assert openings == [False, False]


def test_rekey_that_asks_does_not_hold_the_file_while_asking(db, openings, monkeypatch):
    """Without --yes, rekey asks first: the file is opened read-only to find the admin and
    let go, and opened read-write only once the question is answered (a read-write opening
    kept from the options on would hold the file, and every analyst, for as long as the
    question stays unanswered)."""
    from click.testing import CliRunner

    asked = []

    def answer(*_args, **_kwargs):
        asked.append(list(openings))
        return True

    monkeypatch.setattr(click, "confirm", answer)
    monkeypatch.setattr("sqlsdc.cli.admin._can_ask", lambda: True)
    done = CliRunner().invoke(cli, ["rekey", str(db)])
    assert done.exit_code == 0, done.output
    assert asked == [[True]] and openings == [True, False]


def test_rekey_without_a_terminal_says_to_pass_yes(db):
    """With nobody to answer its question (a script, a scheduler), rekey said only "Aborted!"
    (exit 1, s47f); it is a usage error that names the option."""
    done = sqlsdc("rekey", db, code=2, input="")
    assert "pass --yes" in done.stderr
    assert "Aborted" not in done.stderr


def _commands(command: click.Command, path: str = "sqlsdc"):
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, f"{path} {name}")


def test_every_acting_admin_option_is_resolved_by_one_function():
    """Every command that takes --as resolves it the same way (:func:`acting_admin`): budget's
    subcommands had an option of their own, defaulting to `admin`."""
    taking = []
    for path, command in _commands(cli):
        for param in command.params:
            if "--as" in getattr(param, "opts", ()):
                resolved = getattr(param.callback, "func", param.callback)  # a partial's
                assert resolved is acting_admin and param.default is None, path
                taking.append(path.removeprefix("sqlsdc "))
    assert {"init", "policy apply", "audit", "rekey", "risk", "publish", "budget grant",
            "budget set", "budget reset", "server-user add", "server-user list", "protect",
            "synthesize", "synth-report", "anonymize", "budget cells show", "budget cells grant",
            "budget cells reset"} <= set(taking)  # fmt: skip


def test_audit_shows_what_each_query_was_charged(db):
    """Each entry with the budget its query was charged (ε, ρ, δ from the ledger, by query
    id), in the table, CSV and JSON; nothing where nothing was charged."""
    sqlsdc("query", db, "--user", "ana", BY_REGION.format("visits"))
    sqlsdc("query", db, "--user", "ana", BY_REGION.format("persons"))
    sqlsdc("query", db, "--user", "ana", "SELECT * FROM visits", code=errors.REFUSED)
    entries = json.loads(sqlsdc("audit", db, "--format", "json").stdout)
    charged = [(e["decision"], e["epsilon"], e["rho"], e["delta"]) for e in entries]
    assert charged == [("refused", None, None, None), ("accepted", None, None, None),
                       ("accepted", "0.5", "0", "0")]  # fmt: skip
    ledger = json.loads(sqlsdc("budget", db, "--ledger", "--format", "json").stdout)
    assert [c["query_id"] for c in ledger] == [entries[2]["query_id"]]
    rows = list(csv.DictReader(io.StringIO(sqlsdc("audit", db, "--format", "csv").stdout)))
    assert [(r["epsilon"], r["rho"], r["delta"]) for r in rows] == [
        ("", "", ""), ("", "", ""), ("0.5", "0", "0")]  # fmt: skip
    header, *lines = sqlsdc("audit", db).stdout.splitlines()
    assert header.split()[-4:] == ["rows_returned", "epsilon", "rho", "delta"]
    assert lines[-1].split()[-4:] == ["3", "0.5", "0", "0"]
    assert lines[0].split()[-3:] == ["NULL", "NULL", "NULL"]


def test_audit_lists_entries_in_the_order_they_were_logged(db, tmp_path):
    """A publication draws its id before the queries it runs and is logged after them: listed
    by id, its entry (27) came after its query's (28) though logged later. The listing is in
    the order entries were logged, as --since and --until select them."""
    sqlsdc("query", db, "--user", "ana", BY_REGION.format("persons"))
    sqlsdc("publish", db, tmp_path / "release.duckdb", "--for", "ana",
           "--query", f"by_region={BY_REGION.format('persons')}")  # fmt: skip
    entries = json.loads(sqlsdc("audit", db, "--format", "json").stdout)
    assert [e["user_name"] for e in entries] == ["chief", "ana", "ana"]
    publication, its_query, first = (e["query_id"] for e in entries)
    assert first < publication < its_query  # the publication's id drawn first
    times = [e["logged_at"] for e in entries]
    assert times == sorted(times, reverse=True)
    table = sqlsdc("audit", db).stdout.splitlines()
    assert [int(line.split()[0]) for line in table[1:]] == [publication, its_query, first]
    newest = json.loads(sqlsdc("audit", db, "--limit", "1", "--format", "json").stdout)
    assert [e["query_id"] for e in newest] == [publication]
    assert "order they were logged" in sqlsdc("audit", "--help").stdout


def test_a_budget_of_a_table_not_under_dp_says_so(db):
    """A grant on persons (the cell key method) answered about budget layering without saying
    that persons is not under differential privacy; budgets still bound DP syntheses of it."""
    note = ("table 'persons' is not under differential privacy in the policy in force: its "
            "queries spend no budget; only differentially private syntheses of it")  # fmt: skip
    refused = sqlsdc("budget", db, "grant", "--for", "ana", "--table", "persons",
                     "--epsilon", "1", "--reason", "r", code=errors.ERROR)  # fmt: skip
    assert refused.stderr.startswith(f"sqlsdc: {note}")
    assert "has no ε budget of its own" in refused.stderr
    done = sqlsdc("budget", db, "set", "--for", "ana", "--table", "persons", "--epsilon", "1",
                  "--reason", "synthesis")  # fmt: skip
    assert "set the limit of user 'ana' on table 'persons'" in done.stdout
    assert f"note: {note}" in done.stderr
    shown = json.loads(
        sqlsdc(
            "budget",
            db,
            "grant",
            "--for",
            "ana",
            "--table",
            "persons",
            "--epsilon",
            "1",
            "--reason",
            "r",
            "--format",
            "json",
        ).stdout
    )
    assert shown["notes"][0].startswith(note)  # fmt: skip
    dp = sqlsdc("budget", db, "set", "--for", "ana", "--table", "visits", "--epsilon", "2",
                "--reason", "r")  # fmt: skip
    assert dp.stderr == ""
    every = json.loads(sqlsdc("budget", db, "reset", "--for", "ana", "--reason", "r",
                              "--format", "json").stdout)  # fmt: skip
    assert every["notes"] == []


def test_outputs_lists_the_stored_outputs_of_jobs(db):
    """An admin had no listing of what jobs stored (only DuckDB on `sqlsdc.outputs`): `sqlsdc
    outputs` lists them, with the job's query id and what it was charged."""
    assert sqlsdc("outputs", db).stdout.strip() == "(no rows)"
    sqlsdc("budget", db, "grant", "--for", "chief", "--epsilon", "2", "--reason", "synthesis")
    sqlsdc("synthesize", db, "--from", "visits", "--into", "syn", "--method", "dp-catall",
           "--epsilon", "1", "--columns", "region")  # fmt: skip
    (stored,) = json.loads(sqlsdc("outputs", db, "--format", "json").stdout)
    assert {k: v for k, v in stored.items() if k != "created_at"} == {
        "name": "protected.syn", "method": "synthesize", "created_by": "chief",
        "policy_version": 1, "query_id": stored["query_id"],
        "sql_text": "SELECT region FROM visits", "epsilon": "1", "rho": "0", "delta": "0",
    }  # fmt: skip
    (job,) = json.loads(sqlsdc("audit", db, "--limit", "1", "--format", "json").stdout)
    assert job["query_id"] == stored["query_id"] and job["epsilon"] == "1"
    header, row = sqlsdc("outputs", db).stdout.splitlines()
    assert header.split()[:2] == ["name", "method"] and row.split()[-3:] == ["1", "0", "0"]
    assert "protected.syn,synthesize," in sqlsdc("outputs", db, "--format", "csv").stdout


def test_every_command_help_has_an_example():
    """Each command's --help shows a command line to start from (init, policy, rekey, budget
    grant and reset and server-user had none)."""
    example = re.compile(r"^\s+(echo .+ \| )?sqlsdc \w", re.M)
    assert [
        path for path, command in _commands(cli) if not example.search(command.help or "")
    ] == []


def test_the_readme_lists_the_exit_codes_of_the_command():
    """README's table of exit codes has the codes `sqlsdc --help` shows, each with the meaning's
    first words (a usage error is 2, access denied 5 ...)."""
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text("utf-8")
    table = dict(re.findall(r"^\| (\d+) \| (.+) \|$", text, re.M))
    assert sorted(map(int, table)) == sorted(code for code, _ in errors.EXIT_CODES)
    for code, meaning in errors.EXIT_CODES:
        assert table[str(code)].startswith(re.split(r" \(|:", meaning)[0]), code


@pytest.mark.parametrize(
    "args",
    [("audit", "{db}"), ("budget", "{db}"), ("budget", "{db}", "--ledger"),
     ("budget", "{db}", "--history"), ("policy", "show", "{db}"),
     ("policy", "show", "{db}", "--history"), ("server-user", "list", "{db}"),
     ("outputs", "{db}")],
)  # fmt: skip
def test_listings_of_data_take_format_json(db, args):
    """Every admin listing of data writes JSON with --format json."""
    done = sqlsdc(*[str(db) if a == "{db}" else a for a in args], "--format", "json")
    json.loads(done.stdout)
