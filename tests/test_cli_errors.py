"""Every failure of the ``sqlsdc`` command ends in one message and its class's exit code, never a
traceback (ISSUE18 must-have 3); files are never overwritten without --force and are written
atomically; JSON output is strict JSON. Real processes on real DuckDB files: forked with sqlsdc
imported (:mod:`cli_fork`), and the exit codes once more through a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cli_fork
import pytest
from sqlsdc.cli import errors
from sqlsdc.cli.main import cli

import sqlsdc
from sqlsdc.errors import BudgetExhausted, InternalError, OperationalError

DEMO_POLICY = str(Path(sqlsdc.__file__).parent / "demo" / "policy.yaml")


def run(*args, cwd=None, stdin=None):
    return cli_fork.run(args, cwd=cwd, input=stdin, timeout=300)


def run_interpreter(*args, stdin=None):
    """``python -m sqlsdc.cli ARGS`` in a new interpreter."""
    return subprocess.run([sys.executable, "-m", "sqlsdc.cli", *map(str, args)],
                          capture_output=True, text=True, input=stdin, timeout=300)  # fmt: skip


def strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def failed(result, code: int, words: str):
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and words in result.stderr, result.stderr
    assert "sqlsdc: " in result.stderr or code == errors.USAGE


@pytest.fixture
def db(fresh_demo_db):
    return fresh_demo_db


def test_each_class_has_its_own_exit_code(db, tmp_path):
    q = ("query", db, "-u", "analyst")
    failed(run("querry"), 2, "No such command")
    failed(run(*q, "SELEC region FROM persons"), errors.SYNTAX, "syntax error: ")
    failed(run(*q, "SELECT income FROM persons"), errors.REFUSED, "refused: ")
    failed(run("protect", db, "--into", "x", "--sql", "SELEC 1"), errors.SYNTAX,
           "syntax error: the job's SQL does not parse")  # as a query's (was 1)  # fmt: skip
    failed(run("risk", db, "SELECT region, COUNT(*) AS n FROM persons GROUP BY region", "--count",
               "region"), errors.ERROR, "region is a group key")  # was 70  # fmt: skip
    failed(run("query", tmp_path / "none.duckdb", "-u", "a", "SELECT 1"), errors.NOT_FOUND,
           "not found: database")  # fmt: skip
    failed(run(*q[:2], "-u", "nobody", "SELECT 1"), errors.DENIED, "access denied: ")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tables: 3\n")
    failed(run("policy", "validate", bad), errors.INVALID_POLICY, "invalid policy:")
    deep = "SELECT COUNT(*) FROM persons WHERE " + "(" * 3000 + "age = 1" + ")" * 3000
    failed(run(*q, "-", stdin=deep), errors.SYNTAX, "too complex")
    # the same through a new interpreter (its own stack and recursion limit; an exit status
    # through a new interpreter: also test_cli.py's test_subprocess_entry_point)
    failed(run_interpreter(*q, "-", stdin=deep), errors.SYNTAX, "too complex")


def test_a_pyformat_parameter_is_a_syntax_error_that_names_the_markers(db):
    """``%s`` (psycopg's style) in a query: exit 6 with the markers sqlsdc takes (new user s38)."""
    done = run("query", db, "-u", "analyst", "SELECT sex, COUNT(*) FROM persons WHERE region = %s "
               "GROUP BY sex")  # fmt: skip
    failed(done, errors.SYNTAX, "%s is a parameter marker of other drivers")
    assert "write ? for each parameter" in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("audit", "{missing}"),
        ("budget", "{missing}"),
        ("policy", "show", "{missing}"),
        ("policy", "apply", "{missing}", "{policy}"),
        ("publish", "{missing}", "{tmp}/r.duckdb"),
        ("protect", "{missing}", "--into", "x", "--sql", "SELECT 1"),
        ("policy", "validate", "{missing}"),
        ("policy", "apply", "{db}", "{missing}"),
        ("init", "{tmp}/new.duckdb", "--policy", "{missing}"),
    ],
)
def test_a_missing_database_or_file_is_not_found_in_every_command(args, db, tmp_path):
    """A wrong path is exit 8 'not found' in every command, as `sqlsdc query` says it (before,
    most commands gave click's usage error 2, and a missing policy file 'invalid policy' 4)."""
    names = {"missing": tmp_path / "nope.x", "tmp": tmp_path, "db": db,
             "policy": tmp_path / "p.yaml"}  # fmt: skip
    (tmp_path / "p.yaml").write_text("tables: {}\n")
    result = run(*(a.format(**names) for a in args))
    failed(result, errors.NOT_FOUND, f"{tmp_path / 'nope.x'} does not exist")


def test_a_folder_named_as_a_file_is_not_found(tmp_path):
    """As a text file named as the database is (it was click's usage error, exit 2)."""
    for args, words in [
        (("query", tmp_path, "-u", "analyst", "SELECT 1"), "is a folder, not a DuckDB database"),
        (("audit", tmp_path), "is a folder, not a DuckDB database"),
        (("policy", "validate", tmp_path), f"{tmp_path} is a folder, not a file"),
    ]:
        failed(run(*args), errors.NOT_FOUND, words)


NOT_A_DATABASE = {
    "text": ("hello\n", "is not a DuckDB database file"),
    "sqlite": (None, "is a SQLite database, not a DuckDB one"),
    "empty": ("", "is an empty file, not a DuckDB database"),
    "plain": (None, "has no sqlsdc catalog; run `sqlsdc init"),  # DuckDB's, not sqlsdc's
    # microdata named as the database (new user s38: `sqlsdc init businesses.csv`)
    "csv": (
        "id,nace\n1,C\n",
        "is a CSV file, not a database; load it into a DuckDB database "
        "first (in DuckDB: CREATE TABLE csv AS FROM 'csv.csv'",
    ),
    "parquet": (
        None,
        "is a Parquet file, not a database; load it into a DuckDB database first "
        "(in DuckDB: CREATE TABLE parquet AS FROM 'parquet.duckdb'",
    ),  # by its bytes
}
OPENING_COMMANDS = [
    ("query", "{db}", "-u", "analyst", "SELECT 1"),
    ("explain", "{db}", "-u", "analyst", "SELECT 1"),
    ("audit", "{db}"),
    ("budget", "{db}"),
    ("budget", "{db}", "grant", "--for", "analyst", "--epsilon", "1", "--reason", "r"),
    ("policy", "show", "{db}"),
    ("policy", "apply", "{db}", "{policy}"),
    ("init", "{db}", "--policy", "{policy}"),
    ("risk", "{db}", "SELECT region, COUNT(*) AS n FROM persons GROUP BY region", "--count", "n"),
    ("rekey", "{db}", "--yes"),
    ("protect", "{db}", "--into", "x", "--sql", "SELECT 1"),
    ("anonymize", "{db}", "--from", "persons", "--into", "x", "--step", "pram:region:p=0.8"),
    ("microdata-report", "{db}", "x"),
    ("publish", "{db}", "{tmp}/out.duckdb"),
    ("verify", "{db}", "--user", "analyst", "--sql", "SELECT 1"),
    ("serve", "{db}", "--insecure", "--port", "0"),
    ("server-user", "list", "{db}"),
    ("server-user", "add", "{db}", "analyst", "--password-stdin"),
    ("synthesize", "{db}", "--from", "persons", "--into", "y", "--method", "cart"),
    ("synth-report", "{db}", "--table", "y"),
]


@pytest.fixture(params=sorted(NOT_A_DATABASE))
def not_a_database(request, tmp_path) -> tuple[object, str]:
    """A file that is no sqlsdc database, and what the message says of it."""
    import sqlite3

    import duckdb

    text, words = NOT_A_DATABASE[request.param]
    path = tmp_path / f"{request.param}.{'csv' if request.param == 'csv' else 'duckdb'}"
    if request.param == "parquet":
        duckdb.execute(f"COPY (SELECT 1 AS id) TO '{path}' (FORMAT parquet)")
    elif request.param == "sqlite":
        with sqlite3.connect(path) as con:
            con.execute("CREATE TABLE persons (region TEXT)")
    elif request.param == "plain":
        duckdb.connect(str(path)).close()
    else:
        path.write_text(text)
    return path, words


def test_a_file_that_is_no_database_is_not_found_in_every_command(
    not_a_database, tmp_path, sqlsdc_in_process
):
    """A text file, a SQLite database, an empty file or a DuckDB file without the catalog,
    named as the database: exit 8 'not found' with what the file is, in every command that
    opens one (a file that is not DuckDB's was exit 1, "not a DuckDB database of this version,
    or it is open in this process with other settings"; a catalog missing exit 1 too).

    Each command runs as a real (forked) process for one kind of file, the n-th command for
    the kind n modulo 6, so that every command is a process once over the six cases; the
    others run in this process through click (the same command and error handling: a
    traceback fails the test), not 120 processes for the same messages."""
    path, words = not_a_database
    kind = sorted(NOT_A_DATABASE).index(path.stem)
    names = {"db": path, "tmp": tmp_path, "policy": DEMO_POLICY}
    for number, args in enumerate(OPENING_COMMANDS):
        if args[0] == "init" and "catalog" in words:
            continue  # init makes the catalog: it is the remedy
        args = [a.format(**names) for a in args]
        if number % len(NOT_A_DATABASE) == kind:
            result = run(*args, stdin="a long password\n")
        else:
            result = sqlsdc_in_process(*args, input="a long password\n")
        failed(result, errors.NOT_FOUND, f"sqlsdc: not found: {path}")
        assert words in result.stderr, (args, result.stderr)
    if path.stat().st_size and "catalog" not in words:  # not DuckDB's by its first bytes:
        assert not Path(f"{path}.lock").exists()  # the open stops before making its lock file
    # through a new interpreter once (the entry point's own handling)
    failed(run_interpreter("audit", path), errors.NOT_FOUND, words)


def test_a_failed_admin_lookup_leaves_no_connection_open_in_the_process(
    tmp_path, sqlsdc_in_process
):
    """A command whose acting admin is looked up on a connection it keeps (``audit``, a
    read-only one) and that fails there closes it: click does not close a context whose options
    failed, so the read-only DuckDB instance stayed in the process, and the next read-write
    opening of the file in it failed with "it is open in this process with other settings"."""
    import duckdb

    from sqlsdc.engines.duckdb import open_database

    path = tmp_path / "plain.duckdb"
    duckdb.connect(str(path)).close()  # a DuckDB file without sqlsdc's catalog
    failed(sqlsdc_in_process("audit", path), errors.NOT_FOUND, "has no sqlsdc catalog")
    open_database(path).close()  # read-write, in this process
    grant = ("budget", path, "grant", "--for", "analyst", "--epsilon", "1", "--reason", "r")
    failed(sqlsdc_in_process(*grant), errors.NOT_FOUND, "has no sqlsdc catalog")


def test_codes_are_distinct_and_documented():
    codes = [code for code, _meaning in errors.EXIT_CODES]
    assert len(codes) == len(set(codes))
    help_text = run("--help").stdout
    for code, meaning in errors.EXIT_CODES:
        assert f"{code:>2}  {meaning}" in help_text


@pytest.mark.parametrize(
    ("error", "code", "words"),
    [
        (BudgetExhausted("epsilon 1 asked, 0 left"), errors.BUDGET, "budget exhausted: epsilon"),
        (
            BudgetExhausted("privacy budget exhausted for you"),
            errors.BUDGET,
            "privacy budget exhausted for you",
        ),  # said once, not after the label too
        (OperationalError("stopped: timeout"), errors.OPERATIONAL, "failed: stopped"),
        (InternalError("x"), errors.INTERNAL, "internal error: x"),
        (ZeroDivisionError("division by zero"), errors.INTERNAL, "ZeroDivisionError"),
        (PermissionError(13, "Permission denied", "/r/x"), errors.OPERATIONAL, "/r/x: permission"),
        (FileNotFoundError(2, "No such file", "/r/y"), errors.NOT_FOUND, "not found: /r/y"),
        # `sqlsdc demo --persons 10000000000` was "internal error: MemoryError ... a bug"
        (
            MemoryError("Unable to allocate 74.5 GiB"),
            errors.OPERATIONAL,
            "failed: out of memory (Unable to allocate 74.5 GiB)",
        ),  # fmt: skip
    ],
)
def test_classify_maps_the_remaining_classes(error, code, words):
    message, got = errors.classify(error)
    assert got == code and words in message and message.count("exhausted") <= 1


def test_budget_exhausted_and_a_bug_reach_the_user_as_messages(monkeypatch):
    """Through the real command group (click's runner: the raised errors need no database)."""
    from click.testing import CliRunner
    from sqlsdc.cli import query as query_module

    def exhausted(*_a, **_k):
        raise BudgetExhausted("epsilon 1 asked, 0 left")

    monkeypatch.setattr(query_module.sqlsdc, "connect", exhausted)
    result = CliRunner().invoke(cli, ["query", "x.duckdb", "-u", "a", "SELECT 1"])
    assert result.exit_code == errors.BUDGET and "budget exhausted" in result.output

    def bug(*_a, **_k):
        raise KeyError("oops")

    monkeypatch.setattr(query_module.sqlsdc, "connect", bug)
    result = CliRunner().invoke(cli, ["query", "x.duckdb", "-u", "a", "SELECT 1"])
    assert result.exit_code == errors.INTERNAL and "this is a bug" in result.output


def test_ctrl_c_inside_a_duckdb_statement_aborts_like_ctrl_c_anywhere(monkeypatch):
    """DuckDB's own answer to SIGINT (a job calls it directly) was reported as a bug in sqlsdc;
    tests/test_engine.py sends the real signal."""
    from click.testing import CliRunner
    from sqlsdc.cli import query as query_module

    def interrupted(*_a, **_k):
        raise RuntimeError("Query interrupted")

    monkeypatch.setattr(query_module.sqlsdc, "connect", interrupted)
    result = CliRunner().invoke(cli, ["query", "x.duckdb", "-u", "a", "SELECT 1"])
    assert result.exit_code == 1 and "Aborted!" in result.output
    assert "bug" not in result.output


def test_an_interrupt_inside_duckdbs_scan_of_the_demo_tables_is_an_interrupt():
    """DuckDB wraps a KeyboardInterrupt raised while it reads a registered Arrow object in an
    InvalidInputException ("reading the stream ... failed"): the demo's build reported Ctrl-C
    or SIGTERM landing there as an internal error (exit 70; seen once in CI in the test
    below); it is an interrupt again."""
    import duckdb
    import pyarrow as pa

    from sqlsdc.demo.data import write_tables

    schema = pa.schema([("x", pa.int64())])

    def batches():
        yield pa.record_batch([pa.array([1, 2])], schema=schema)
        raise KeyboardInterrupt

    con = duckdb.connect()
    try:
        with pytest.raises(KeyboardInterrupt):
            write_tables(con, {"t": pa.RecordBatchReader.from_batches(schema, batches())})
    finally:
        con.close()


def test_sigterm_stops_a_command_as_ctrl_c_does_and_leaves_no_file(tmp_path):
    """`kill`, `timeout` or a scheduler stops a command with SIGTERM: the interpreter's default
    ended it at once, and a demo stopped while building left its half-built
    `.NAME.PID.building` file (megabytes) and a lock file beside the target."""
    import signal
    import time

    target = tmp_path / "d.duckdb"
    process = cli_fork.popen(  # its own process (forked with sqlsdc imported), signalled below
        ["demo", "--db", target, "--persons", "1000000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not any(p.name.endswith(".building") for p in tmp_path.iterdir()):
            assert process.poll() is None and time.monotonic() < deadline, "no building file"
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        process.wait(120)
        err = process.stderr.read()
    finally:
        process.kill()
    assert process.returncode == errors.ERROR and "Aborted!" in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_reader_that_stops_reading_ends_the_command_quietly(db):
    """`sqlsdc ... | head`: the reader closing the pipe is no engine failure; the command ends
    with click's quiet exit code 1, not "sqlsdc: failed: broken pipe" (exit code 9)."""
    for args in (
        ["ptable", "--D", 5, "--V", 3, "--js", 2],
        ["query", db, "-u", "analyst", "SELECT region, COUNT(*) FROM persons GROUP BY 1"],
    ):
        reader, writer = os.pipe()
        os.close(reader)  # gone before anything is written
        with os.fdopen(writer, "wb") as pipe:
            process = cli_fork.popen(args, stdout=pipe, stderr=subprocess.PIPE, text=True)
        err = process.stderr.read()
        assert process.wait(300) == errors.ERROR and err == "", err
    refused = cli_fork.popen(
        ["query", db, "-u", "analyst", "SELECT * FROM persons"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert refused.wait(300) == errors.REFUSED and "refused" in refused.stderr.read()


def test_a_command_waiting_for_the_file_says_so(db):
    """A process outside sqlsdc holds the database: the command waits for its turn (up to a
    minute), and after two seconds says so on stderr, instead of looking hung."""
    assert run("--version").returncode == 0  # the fork server up first: it takes seconds
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
         "print('held', flush=True); time.sleep(6)", str(db)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        waited = run("audit", db, "--limit", 1)
    finally:
        holder.kill()
    assert waited.returncode == 0, waited.stderr
    assert f"sqlsdc: waiting for {db}: another process has it open (up to 60 s) ..." in \
        waited.stderr  # fmt: skip


def test_demo_never_replaces_a_file_without_force(tmp_path):
    target = tmp_path / "mine.duckdb"
    target.write_text("my work")
    failed(run("demo", "--db", target, "--persons", 100, "--no-queries"), errors.ERROR, "--force")
    assert target.read_text() == "my work"
    done = run("demo", "--db", target, "--persons", 100, "--no-queries", "--force")
    assert done.returncode == 0, done.stderr
    assert target.read_bytes()[:4] != b"my w"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.duckdb"]  # nothing left over


def test_missing_folders_are_reported(tmp_path):
    missing = tmp_path / "no" / "such"
    failed(run("demo", "--db", missing / "d.duckdb", "--persons", 100), errors.NOT_FOUND,
           "does not exist")  # fmt: skip
    failed(run("ptable", "--D", 2, "--V", 1, "-o", missing / "p.txt"), errors.NOT_FOUND,
           "does not exist")  # fmt: skip


def test_publish_into_a_missing_folder_charges_nothing(db, tmp_path):
    """The folders are checked before any query runs: a DP --query would be charged and then
    lost with the release, and the engine's own error was reported as a bug in sqlsdc."""
    budget = ("budget", db, "--for", "analyst", "--format", "json")
    before = strict_json(run(*budget).stdout)
    dp = "b=SELECT scheme, COUNT(*) AS n FROM benefits GROUP BY scheme"
    missing = tmp_path / "no" / "such"
    publish = ("publish", db, "--for", "analyst", "--query", dp)
    failed(run(*publish, missing / "r.duckdb"), errors.NOT_FOUND,
           f"folder {missing} does not exist")  # fmt: skip
    failed(run(*publish, tmp_path / "r.duckdb", "--parquet", missing / "pq"), errors.NOT_FOUND,
           f"folder {missing} does not exist")  # fmt: skip
    assert strict_json(run(*budget).stdout) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.duckdb", "demo.duckdb.lock"]


def _unwritable_folder():
    """A folder that exists and takes no new file, even for root: /proc (Linux) or /sys."""
    import tempfile

    for folder in ("/proc", "/sys"):
        try:
            handle, probe = tempfile.mkstemp(dir=folder)
        except OSError:
            return folder
        os.close(handle)
        os.unlink(probe)
    pytest.skip("no folder here refuses new files")


def test_publish_into_a_folder_that_takes_no_file_charges_nothing(db, tmp_path):
    """A folder that exists but takes no file (read-only, no permission) is found before any
    query runs: the engine's error came after the DP --query was charged, as a bug in sqlsdc."""
    folder = _unwritable_folder()
    budget = ("budget", db, "--for", "analyst", "--format", "json")
    before = strict_json(run(*budget).stdout)
    dp = "b=SELECT scheme, COUNT(*) AS n FROM benefits GROUP BY scheme"
    publish = ("publish", db, "--for", "analyst", "--query", dp)
    failed(run(*publish, f"{folder}/r.duckdb"), errors.OPERATIONAL,
           f"folder {folder} takes no new file")  # fmt: skip
    failed(run(*publish, tmp_path / "r.duckdb", "--parquet", f"{folder}/pq"), errors.OPERATIONAL,
           f"cannot write {folder}/pq")  # fmt: skip
    assert strict_json(run(*budget).stdout) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.duckdb", "demo.duckdb.lock"]


def test_a_file_into_a_folder_that_takes_no_file_is_one_clear_failure():
    """ptable -o (and microdata-report --plot, the same writer) into such a folder: "not
    found: /proc/.p.txt.x8k2.tmp" named a temporary file, and a folder that exists."""
    folder = _unwritable_folder()
    result = run("ptable", "--D", 2, "--V", 1, "-o", f"{folder}/p.txt")
    failed(result, errors.OPERATIONAL, f"cannot write {folder}/p.txt: folder {folder} takes no")
    assert ".tmp" not in result.stderr


def test_a_failed_init_of_a_new_file_leaves_no_file(tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "tables:\n  t:\n    privacy_unit: id\n    columns:\n      id: {role: identifier}\n"
        "users:\n  owner: {role: admin}\n"
    )
    new = tmp_path / "new.duckdb"
    failed(run("init", new, "--policy", policy, "--as", "admin"), errors.DENIED, "not an admin")
    failed(run("init", new, "--policy", policy), errors.INVALID_POLICY,  # owner: the only admin
           "no such table in the database (tables: none; load the data first")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]


def test_an_admin_command_without_as_names_the_admins(db):
    """A database whose admin is not called `admin` (schemas/examples/minimal.yaml: `owner`):
    `sqlsdc audit DB` said only "user 'admin' is not an admin", not whom to name with --as."""
    failed(run("audit", db, "--as", "analyst"), errors.DENIED,
           "user 'analyst' is not an admin in the policy in force (admins: admin); name one "
           "with --as")  # fmt: skip


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders"
)
def test_a_read_only_folder_is_a_clear_failure(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        result = run("demo", "--db", folder / "d.duckdb", "--persons", 100, "--no-queries")
        assert result.returncode in (errors.OPERATIONAL, errors.ERROR), result.stderr
        assert "Traceback" not in result.stderr
        result = run("ptable", "--D", 2, "--V", 1, "-o", folder / "p.txt")
        failed(result, errors.OPERATIONAL, "permission denied")
    finally:
        folder.chmod(0o755)


def test_ptable_output_is_written_atomically_and_not_overwritten(tmp_path):
    out = tmp_path / "p.txt"
    out.write_text("keep")
    failed(run("ptable", "--D", 2, "--V", 1, "-o", out), errors.ERROR, "--force")
    assert out.read_text() == "keep"
    assert run("ptable", "--D", 2, "--V", 1, "-o", out, "--force").returncode == 0
    shown = run("ptable", "--D", 2, "--V", 1, "-o", "/dev/stdout")  # no file to overwrite:
    assert shown.returncode == 0 and "p" in shown.stdout  # written into, not renamed over
    assert "keep" not in out.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["p.txt"]


def test_publish_refuses_an_existing_file_and_leaves_no_partial(db, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "release.duckdb"
    out.write_text("old")
    failed(run("publish", db, out), errors.ERROR, "--force")
    assert out.read_text() == "old"
    refused = run("publish", db, out, "--force", "--query", "t=SELECT income FROM persons")
    failed(refused, errors.REFUSED, "refused")
    assert out.read_text() == "old"
    assert sorted(p.name for p in folder.iterdir()) == ["release.duckdb"]


def test_every_json_output_is_strict_json(db, sqlsdc_in_process):
    """The first command in a real process; the others in this one (the same stdout)."""
    q = ("--user", "analyst", "--format", "json")
    empty_avg = "SELECT region, AVG(income) AS a, COUNT(*) AS n FROM persons GROUP BY region"
    outputs = [run("query", db, *q, empty_avg)]
    outputs += [
        sqlsdc_in_process(*args)
        for args in [
            ("query", db, *q, "--status", empty_avg),
            ("explain", db, *q, empty_avg),
            ("policy", "show", db, "--format", "json"),
            ("policy", "show", db, "--format", "json", "--history"),
            ("audit", db, "--format", "json"),
            ("ptable", "--D", 2, "--V", 1, "--format", "json"),
            ("ptable", "--D", 2, "--V", 1, "--format", "json", "--check"),
            ("budget", db, "--format", "json"),
            ("risk", db, "SELECT region, COUNT(*) AS n FROM persons GROUP BY region",
             "--count", "n", "--format", "json"),
            # the commands that write: ISSUE18 asked for --format json on each
            ("policy", "validate", DEMO_POLICY, "--format", "json"),
            ("policy", "apply", db, DEMO_POLICY, "--format", "json"),
            ("init", db, "--policy", DEMO_POLICY, "--format", "json"),
            ("rekey", db, "--yes", "--format", "json"),
            ("budget", db, "grant", "--for", "analyst", "--epsilon", "1/3", "--reason", "r",
             "--format", "json"),
            ("budget", db, "set", "--for", "analyst", "--epsilon", "2", "--reason", "r",
             "--format", "json"),
            ("budget", db, "reset", "--for", "analyst", "--reason", "r", "--format", "json"),
        ]
    ]  # fmt: skip
    added = sqlsdc_in_process("server-user", "add", db, "analyst", "--password-stdin",
                              "--format", "json", input="a long password\n")  # fmt: skip
    assert strict_json(added.stdout) == {"user": "analyst", "action": "added"}
    applied = [strict_json(r.stdout) for r in outputs[-6:-4]]  # apply, then init on the catalog
    assert [a["version"] for a in applied] == [2, 3] and not applied[1]["secret_created"]
    assert strict_json(outputs[-4].stdout)["rekeyed_rows"]["persons"] == 20000
    for result in outputs:
        assert result.returncode == 0, (result.args, result.stderr)
        strict_json(result.stdout)


def test_print_json_turns_nan_and_inf_into_null(capsys):
    from sqlsdc.cli.output import print_json

    print_json({"a": float("nan"), "b": [float("inf"), 1.5], "c": -float("inf")})
    assert strict_json(capsys.readouterr().out) == {"a": None, "b": [None, 1.5], "c": None}


def test_a_failed_write_leaves_the_old_file(tmp_path):
    from sqlsdc.cli.output import write_file

    out = tmp_path / "f.txt"
    out.write_text("old")

    with pytest.raises(TypeError):
        write_file(out, 12345, force=True)  # not text: the write fails half-way
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_serve_refuses_a_database_without_the_catalog(tmp_path):
    """A mistyped path or the release file: the server listened and refused every login."""
    import duckdb

    plain = tmp_path / "plain.duckdb"
    duckdb.connect(str(plain)).close()
    result = cli_fork.run(["serve", plain, "--insecure", "--port", 0], timeout=60)  # it served
    failed(result, errors.NOT_FOUND, "has no sqlsdc catalog")


def test_serve_on_a_taken_port_says_where(db):
    """asyncio's words ("error while attempting to bind on address ...") or, for a host that
    does not resolve, only "name or service not known": now which address, and why."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("serve", db, "--insecure", "--port", port)
    failed(result, errors.OPERATIONAL, f"cannot listen on 127.0.0.1:{port}: address already in use")


def test_a_keyboard_interrupt_duckdb_wrapped_is_an_interruption():
    """A SIGTERM landing while DuckDB read a registered Arrow object came back as DuckDB's
    InvalidInputException "... failed: KeyboardInterrupt: " and ended in "internal error"
    (exit code 70, once in CI): it is the user's interruption, as Ctrl-C anywhere else."""
    import duckdb

    from sqlsdc.errors import interrupted_by_user

    wrapped = duckdb.InvalidInputException(
        "Invalid Input Error: reading the schema of the object registered as 'x' failed: "
        "KeyboardInterrupt: "
    )
    assert interrupted_by_user(wrapped)
    assert interrupted_by_user(RuntimeError("Query interrupted"))
    assert not interrupted_by_user(duckdb.InvalidInputException("Invalid Input Error: bad"))
    assert not interrupted_by_user(ValueError("failed: KeyboardInterrupt: "))
