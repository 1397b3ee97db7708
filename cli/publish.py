"""``sqlsdc publish``: write the release database that BI tools read."""

from __future__ import annotations

import click
from sqlsdc.cli.admin import acting_admin_option
from sqlsdc.cli.output import format_option, print_json

from sqlsdc.errors import Error


@click.command()
@click.argument("db", type=click.Path(exists=True, dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option(
    "--query",
    "queries",
    multiple=True,
    metavar="NAME=SQL",
    help="Also publish the protected result of a guarded query as table NAME (repeatable).",
)
@click.option(
    "--as",
    "analyst",
    default=None,
    help="User the queries run as (default: the acting administrator).",
)
@click.option("--force", "--replace", "replace", is_flag=True, help="Overwrite OUT if it exists.")
@acting_admin_option("--admin", "--user", "-u")  # its --as names the analyst
@format_option(default="table", choices=("table", "json"))
def publish(db, out, queries, analyst, replace, user, fmt):
    """Write OUT, a DuckDB file holding only protected outputs (admins only).

    It holds the tables of `sqlsdc protect` jobs, the suppression pattern of every table the
    policy protects by suppression, and the results of --query, as plain tables with a
    `release_contents` table describing them: no confidential table, internal column, ledger or
    secret. Point BI tools at OUT, read-only: duckdb:///OUT?access_mode=read_only.

    \b
    Example:
      sqlsdc publish demo.duckdb release.duckdb \\
        --query "persons_by_region=SELECT region, COUNT(*) AS n FROM persons GROUP BY region"
    """
    from sqlsdc.release import publish as publish_release

    named = {}
    for item in queries:
        name, sep, sql = item.partition("=")
        if not sep or not sql.strip():
            raise Error(f"--query {item!r}: write NAME=SQL")
        named[name.strip()] = sql
    progress = None if fmt == "json" else (lambda message: click.echo(message, err=True))
    report = publish_release(
        db, out, user, queries=named, analyst=analyst, replace=replace, progress=progress
    )
    if fmt == "json":
        print_json(report.to_dict())
        return
    click.echo(f"wrote {report.path} (policy version {report.policy_version}):")
    for table in report.tables:
        click.echo(f"  {table.table}: {table.rows} rows ({table.source}, {table.method})")


COMMANDS = (publish,)
