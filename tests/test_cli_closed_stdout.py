"""A command started with stdout closed (``sqlsdc ptable ... >&-``) fails, exit code 9 with a
message on stderr, instead of losing its output and exiting 0 (session 46, new user s46i);
a command that prints data fails before it runs, so a query is not charged for an answer
nobody can read. Real interpreters: the closed descriptor is the process's own."""

from __future__ import annotations

import signal
import subprocess
import sys

import duckdb
import pytest

QUERY = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"


def _run_closed(*args: str) -> subprocess.CompletedProcess:
    """``python -m sqlsdc.cli ARGS >&-``."""
    return subprocess.run(
        ["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "sqlsdc.cli", *args],
        capture_output=False, stderr=subprocess.PIPE, text=True, timeout=120,
    )  # fmt: skip


def _audited(db) -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT COUNT(*) FROM sqlsdc.audit").fetchone()[0]


@pytest.mark.parametrize(
    "args",
    [
        ("ptable", "--D", "3", "--V", "1"),  # main: exit 0, the table lost
        ("ptable", "--D", "3", "--V", "1", "--format", "json"),
        ("--version",),
        ("ptable", "--help"),
    ],
)
def test_output_that_cannot_be_written_fails(args):
    done = _run_closed(*args)
    assert done.returncode == 9, done.stderr
    assert "standard output is closed" in done.stderr
    assert "Traceback" not in done.stderr


def test_commands_on_a_database_fail_before_they_run(fresh_demo_db):
    before = _audited(fresh_demo_db)
    db = str(fresh_demo_db)
    for args in (
        ("query", db, "--user", "analyst", QUERY),  # main: exit 0, audited and charged
        ("query", db, "--user", "analyst", "--format", "json", QUERY),
        ("explain", db, "--user", "analyst", QUERY),
        ("audit", db, "--as", "admin"),
        ("budget", db, "--for", "analyst"),
        ("policy", "show", db),
    ):
        done = _run_closed(*args)
        assert (done.returncode, done.stderr.strip()) == (
            9, "sqlsdc: failed: cannot write the output: standard output is closed"
        ), args  # fmt: skip
    assert _audited(fresh_demo_db) == before  # nothing ran: no query audited or charged


def test_serve_runs_with_stdout_closed(fresh_demo_db):
    """A daemon started with stdout closed: the address is on stderr too (main: "internal
    error: AttributeError: 'NoneType' object has no attribute 'flush'", exit code 70)."""
    server = subprocess.Popen(
        ["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "sqlsdc.cli", "serve",
         str(fresh_demo_db), "--port", "0", "--insecure"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert "listening on 127.0.0.1:" in server.stderr.readline()
        server.send_signal(signal.SIGINT)
        assert server.wait(60) == 0
        assert "error" not in server.stderr.read()
    finally:
        server.kill()
        server.wait()


def test_a_ptable_written_to_a_file_needs_no_stdout(tmp_path):
    target = tmp_path / "ptable.txt"
    done = _run_closed("ptable", "--D", "3", "--V", "1", "-o", str(target))
    assert done.returncode == 0, done.stderr
    assert target.read_text().startswith(" i  j")
