"""``sqlsdc query`` and ``sqlsdc explain``: guarded queries from the command line."""

from __future__ import annotations

import os

import click
from sqlsdc.cli.output import (
    DatabasePath,
    StatementCommand,
    format_option,
    print_frame,
    print_json,
    print_result,
    read_sql,
)

import sqlsdc

db_argument = click.argument("db", type=DatabasePath())
user_option = click.option("--user", "-u", required=True, help="User name declared in the policy.")


@click.command(cls=StatementCommand)
@db_argument
@click.argument("sql")
@user_option
@format_option()
@click.option(
    "--status",
    is_flag=True,
    help="Print the status of every aggregate cell (published, suppressed...) instead of its "
    "value, beside the group keys.",
)
def query(db: str, sql: str, user: str, fmt: str, status: bool) -> None:
    """Run one guarded SQL query (use - to read it from stdin).

    \b
    Example:
      sqlsdc query sqlsdc-demo.duckdb --user analyst \\
        "SELECT sex, COUNT(*) AS n, AVG(income) FROM persons GROUP BY sex"
    Suppressed cells print as NULL; --status shows why.
    """
    _database_first(db)
    with sqlsdc.connect(db, user=user) as con:
        cursor = con.execute(read_sql(sql))
        if status:
            print_frame(_keys_and_status(cursor), fmt)
        else:
            print_result(cursor, fmt)


def _keys_and_status(cursor):
    """The status of every cell, with each group key's value where its status is ``key`` (a
    row of statuses alone would not say which group it is)."""
    status = cursor.cell_status()
    values = cursor.df()
    shown = status.astype(object)
    for i in range(status.shape[1]):
        keys = (status.iloc[:, i] == "key").to_numpy()
        if keys.any():
            column = shown.iloc[:, i].to_numpy(copy=True)
            column[keys] = values.iloc[:, i].astype(object).to_numpy()[keys]
            shown.isetitem(i, column)
    return shown


@click.command(cls=StatementCommand)
@db_argument
@click.argument("sql")
@user_option
@format_option(default="text", choices=("text", "json"))
def explain(db: str, sql: str, user: str, fmt: str) -> None:
    """Show how a query would be protected, without reading any data.

    \b
    Example:
      sqlsdc explain sqlsdc-demo.duckdb --user analyst \\
        "SELECT region, COUNT(*) FROM persons GROUP BY region"
    """
    _database_first(db)
    with sqlsdc.connect(db, user=user) as con:
        protected = con.explain(read_sql(sql))
    if fmt == "json":
        print_json(protected.to_dict())
    else:
        click.echo(str(protected))


def _database_first(db: str) -> None:
    """A statement where the database belongs (the arguments swapped) is a usage error that
    says so, not "database SELECT ... does not exist"."""
    words = db.split(None, 1)
    if words and words[0].upper() in ("SELECT", "WITH", "FROM") and not os.path.exists(db):
        raise click.UsageError("the database comes first: sqlsdc query DB --user U SQL")


COMMANDS = (query, explain)
