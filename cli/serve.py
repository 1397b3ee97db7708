"""``sqlsdc serve`` (the PostgreSQL-protocol server) and ``sqlsdc server-user`` (its users)."""

from __future__ import annotations

import os
import sys

import click
from sqlsdc.cli.admin import admin_option
from sqlsdc.cli.output import CommandFirst, ExistingFile, Seconds, format_option, print_json

db_argument = click.argument("db", type=ExistingFile())


@click.command()
@db_argument
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=5433, show_default=True, type=click.IntRange(0, 65535),
              help="TCP port (0: any free port; the one chosen is printed).")  # fmt: skip
@click.option(
    "--tls-cert",
    type=ExistingFile(),
    help="TLS certificate chain (PEM); clients then connect with sslmode=require.",
)
@click.option("--tls-key", type=ExistingFile(),
              help="Private key of the certificate (PEM).")  # fmt: skip
@click.option("--insecure", is_flag=True,
              help="Accept connections without TLS (authentication is still SCRAM; statements "
              "and results cross the network in clear).")  # fmt: skip
@click.option("--idle-timeout", type=Seconds(),
              help="Close sessions idle this many seconds.")  # fmt: skip
@click.option("--write-timeout", type=Seconds(), default=60.0, show_default=True,
              help="Close sessions whose client reads nothing of what the server writes for this "
              "many seconds (a client that stops reading holds its session and what it keeps; "
              "what it was answered stays charged and audited).")  # fmt: skip
@click.option(
    "--statement-timeout",
    type=Seconds(),
    help="Stop statements after this many seconds (at most the policy's limit).",
)
@click.option("--max-connections", default=100, show_default=True, type=click.IntRange(1),
              help="Logged-in sessions at once; one more login is refused (53300).")  # fmt: skip
@click.option("--max-connections-per-user", type=click.IntRange(1),
              help="Sessions one user may hold at once (default: half of --max-connections), "
              "so that one login cannot lock the other users out.")  # fmt: skip
@click.option("--max-failed-logins-per-address", default=30, show_default=True,
              type=click.IntRange(1),
              help="Unsuccessful logins one client address (an IPv6 one's /64) may begin a "
              "minute, whatever the user names; beyond, its logins are refused until a minute "
              "passes. Each user name also has 10 a minute from one address.")  # fmt: skip
@click.option(
    "--workers",
    default=8,
    show_default=True,
    type=click.IntRange(1),
    help="Statements running at once (a thread pool); others wait their turn.",
)
def serve(db: str, host: str, port: int, tls_cert, tls_key, insecure: bool, idle_timeout,
          write_timeout, statement_timeout, max_connections: int, max_connections_per_user,
          workers: int, max_failed_logins_per_address: int) -> None:  # fmt: skip
    """Serve DB to PostgreSQL clients (psql, JDBC, BI tools): every statement passes the guard.

    Users log in with SCRAM-SHA-256 as the policy users an admin gave a password with
    `sqlsdc server-user add`; each session runs as its user, with its role and budget.

    \b
    To try it on the demo (a server runs until stopped):
      sqlsdc server-user add sqlsdc-demo.duckdb analyst
      sqlsdc serve sqlsdc-demo.duckdb --insecure &
      psql "host=127.0.0.1 port=5433 user=analyst dbname=demo"
    """
    import asyncio
    import logging

    from sqlsdc.engines import file_lock
    from sqlsdc.server.serve import Server, ServerSettings

    file_lock.on_long_wait = None  # sessions' turns at the file: no line per waiting statement
    logging.basicConfig(level=logging.WARNING, format="sqlsdc serve: %(message)s")
    if os.environ.get("SQLSDC_SERVER_TIMING") == "1":  # benchmarks/server/bench_server.py
        logging.getLogger("sqlsdc.server.timing").setLevel(logging.DEBUG)
    server = Server(ServerSettings(db, host, port, tls_cert, tls_key, insecure, idle_timeout,
                                   statement_timeout, max_connections, workers,
                                   max_connections_per_user, write_timeout,
                                   max_failed_logins_per_address))  # fmt: skip

    def ready(address: str, bound: int) -> None:
        mode = "TLS" if tls_cert else "without TLS (--insecure)"
        click.echo(f"sqlsdc serve: listening on {address}:{bound} {mode}; Ctrl-C stops", err=True)
        click.echo(f"{address}:{bound}")
        sys.stdout.flush()

    try:
        asyncio.run(server.serve_forever(ready))
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


@click.group("server-user", cls=CommandFirst)
def server_user() -> None:
    """Passwords of the users who log in to `sqlsdc serve` (stored as SCRAM keys).

    At a terminal `add` and `passwd` ask for the password twice; a script gives it on the
    first line of stdin with --password-stdin.

    \b
    Example:
      sqlsdc server-user list demo.duckdb
    """


def _password(from_stdin: bool) -> str:
    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    if not sys.stdin.isatty():  # a script: the prompt would echo, read its input, then abort
        raise click.UsageError("no terminal to ask for the password: give it on the first "
                               "line of stdin with --password-stdin")  # fmt: skip
    return click.prompt("Password", hide_input=True, confirmation_prompt=True)


password_stdin = click.option("--password-stdin", is_flag=True,
                              help="Read the password from the first line of stdin.")  # fmt: skip


def _done(fmt: str, name: str, action: str, text: str) -> None:
    print_json({"user": name, "action": action}) if fmt == "json" else click.echo(text)


@server_user.command("add")
@db_argument
@click.argument("name")
@admin_option
@password_stdin
@format_option(choices=("table", "json"))
def add(db: str, name: str, user: str, password_stdin: bool, fmt: str) -> None:
    """Let policy user NAME log in to the server with a password (asked twice at a terminal;
    a script gives it with --password-stdin).

    \b
    Example:
      echo "$ANALYST_PASSWORD" | sqlsdc server-user add demo.duckdb analyst --password-stdin
    """
    from sqlsdc.server import auth

    auth.set_password(db, user, name, _password(password_stdin), new=True)
    _done(fmt, name, "added", f"server user {name} added")


@server_user.command("passwd")
@db_argument
@click.argument("name")
@admin_option
@password_stdin
@format_option(choices=("table", "json"))
def passwd(db: str, name: str, user: str, password_stdin: bool, fmt: str) -> None:
    """Change the password of server user NAME (asked twice at a terminal; a script gives it
    with --password-stdin).

    \b
    Example:
      echo "$ANALYST_PASSWORD" | sqlsdc server-user passwd demo.duckdb analyst --password-stdin
    """
    from sqlsdc.server import auth

    auth.set_password(db, user, name, _password(password_stdin), new=False)
    _done(fmt, name, "password_changed", f"password of server user {name} changed")


@server_user.command("remove")
@db_argument
@click.argument("name")
@admin_option
@format_option(choices=("table", "json"))
def remove(db: str, name: str, user: str, fmt: str) -> None:
    """Remove server user NAME (new logins refused; open sessions go on).

    A running server refuses NAME's logins from a second later; sessions already open go on.
    To end those too, remove NAME from the policy's `users:` and apply it (`sqlsdc policy
    apply`): they are refused at their next statement.

    \b
    Example:
      sqlsdc server-user remove demo.duckdb analyst
    """
    from sqlsdc.server import auth

    auth.remove(db, user, name)
    _done(fmt, name, "removed", f"server user {name} removed")


@server_user.command("list")
@db_argument
@admin_option
@format_option(default="table", choices=("table", "json"))
def list_users(db: str, user: str, fmt: str) -> None:
    """List server users (names and when their password was set; never a key).

    \b
    Example:
      sqlsdc server-user list demo.duckdb --format json
    """
    from sqlsdc.server import auth

    users = auth.list_users(db, user)
    if fmt == "json":
        print_json(users)
        return
    if not users:  # it printed nothing, which read as a failure (new user s44g)
        click.echo("(no server users: add one with `sqlsdc server-user add DB NAME`)")
    for row in users:
        note = "" if row["in_policy"] else "  (not in the policy: cannot log in)"
        click.echo(f"{row['user']}  set {row['password_set_at']} by {row['set_by']}{note}")


COMMANDS = (serve, server_user)
