"""``sqlsdc server-user``: passwords stored as SCRAM keys only, for policy users only, by admins
only; the keys agree with an independent SCRAM implementation (scramp)."""

from __future__ import annotations

import shutil
import subprocess

import cli_fork
import duckdb
import pytest

from sqlsdc.server.auth import make_keys, saslprep


def _cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return cli_fork.run(["server-user", *args], input=stdin, timeout=60)


@pytest.fixture
def db(pristine_demo_db, tmp_path):
    copy = tmp_path / "demo.duckdb"
    shutil.copy(pristine_demo_db, copy)
    return copy


def test_add_list_passwd_remove(db, sqlsdc_in_process):
    """Each command in a real process; the two refusals in this one."""
    password = "a long secret 123"
    assert (
        _cli("add", str(db), "analyst", "--password-stdin", stdin=password + "\n").returncode == 0
    )
    listed = _cli("list", str(db), "--format", "json")
    assert '"user": "analyst"' in listed.stdout and '"set_by": "admin"' in listed.stdout
    with duckdb.connect(str(db), read_only=True) as con:
        row = con.execute("SELECT * FROM sqlsdc.server_users").fetchall()
    assert len(row) == 1
    assert password.encode() not in repr(row).encode()
    keys = make_keys(password, salt=bytes(row[0][2]))
    assert (bytes(row[0][3]), bytes(row[0][4])) == (keys.stored_key, keys.server_key)
    again = sqlsdc_in_process("server-user", "add", db, "analyst", "--password-stdin",
                              input=password + "\n")  # fmt: skip
    assert again.returncode == 1 and "exists" in again.stderr
    assert _cli("passwd", str(db), "analyst", "--password-stdin",
                stdin="another secret 456\n").returncode == 0  # fmt: skip
    assert _cli("remove", str(db), "analyst").returncode == 0
    gone = sqlsdc_in_process("server-user", "remove", db, "analyst")
    assert gone.returncode == 8 and "no server user 'analyst'" in gone.stderr


def test_only_policy_users_and_only_admins(db, sqlsdc_in_process):
    """The first refusal in a real process, the others in this one."""
    stranger = _cli("add", str(db), "mallory", "--password-stdin", stdin="whatever 12345\n")
    assert stranger.returncode == 5 and "not declared in the policy" in stranger.stderr
    by_analyst = sqlsdc_in_process("server-user", "add", db, "analyst", "--user", "analyst",
                                   "--password-stdin", input="whatever 12345\n")  # fmt: skip
    assert by_analyst.returncode == 5 and "not an admin" in by_analyst.stderr
    short = sqlsdc_in_process("server-user", "add", db, "analyst", "--password-stdin",
                              input="short\n")  # fmt: skip
    assert short.returncode == 1 and "shorter than 8 characters" in short.stderr
    piped = sqlsdc_in_process("server-user", "add", db, "analyst", input="a long secret 123\n")
    assert piped.returncode == 2 and "give it on the first line of stdin with --password-stdin" \
        in piped.stderr  # not a prompt echoing the input, then "Aborted!"  # fmt: skip


def test_keys_match_scramp():
    scramp = pytest.importorskip("scramp")
    keys = make_keys("pässwörd 12")
    salt, stored, server, count = scramp.ScramMechanism("SCRAM-SHA-256").make_auth_info(
        "pässwörd 12", iteration_count=4096, salt=keys.salt
    )
    assert (stored, server, count) == (keys.stored_key, keys.server_key, keys.iterations)
    assert saslprep("a\u00a0b\u00ad") == "a b"  # RFC 4013: non-ASCII space mapped, soft hyphen gone


def test_an_empty_list_says_so_and_the_command_comes_first(db):
    """`server-user list DB` printed nothing at all with no users, and `server-user DB list`
    (budget's order) said "No such command 'DB'" (new user s44g)."""
    empty = _cli("list", str(db))
    assert empty.returncode == 0
    assert empty.stdout == "(no server users: add one with `sqlsdc server-user add DB NAME`)\n"
    assert _cli("list", str(db), "--format", "json").stdout.strip() == "[]"
    swapped = _cli(str(db), "list")
    assert swapped.returncode == 2
    assert f"the command comes first: sqlsdc server-user list {db} ..." in swapped.stderr
    assert "No such command 'bogus'" in _cli("bogus").stderr


def test_remove_refuses_new_logins_and_open_sessions_go_on_as_its_help_says(db):
    """`server-user remove --help` said "its open sessions end at their next login": they go
    on (README, "Users"), and its help now says so and how to end them (new user s47f)."""
    psycopg = pytest.importorskip("psycopg")
    from tests.server.conftest import add_server_user, start_server, stop_server, wait_until

    helped = _cli("remove", "--help")
    assert "end at their next login" not in helped.stdout
    assert "new logins refused; open sessions go on" in helped.stdout
    assert "remove NAME from the policy's `users:` and apply it" in " ".join(helped.stdout.split())
    add_server_user(db)
    running = start_server(db, "--insecure")
    try:
        with psycopg.connect(running.dsn(), autocommit=True) as open_session:
            assert _cli("remove", str(db), "analyst").returncode == 0

            def refused() -> bool:
                try:
                    psycopg.connect(running.dsn()).close()
                except psycopg.OperationalError as e:
                    return "password authentication failed" in str(e)
                return False

            assert wait_until(refused, timeout=10)
            rows = open_session.execute("SELECT COUNT(*) AS n FROM regions").fetchall()
            assert rows == [(8,)]
    finally:
        stop_server(running)
