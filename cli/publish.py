"""``sqlsdc publish``: write the release database that BI tools read."""

from __future__ import annotations

import click
from sqlsdc.cli.admin import admin_option
from sqlsdc.cli.output import ExistingFile, NamedPath, format_option, print_json

# Kept in step with sqlsdc.engines.release_storage (not imported: `--help` stays fast).
OLDEST_READER = "v1.0.0"


@click.command()
@click.argument("db", type=ExistingFile())
@click.argument("out", type=NamedPath(dir_okay=False))
@click.option(
    "--query",
    "queries",
    multiple=True,
    metavar="NAME=SQL",
    help="Also publish the protected result of a guarded query as table NAME (repeatable).",
)
@click.option(
    "--for",
    "analyst",
    default=None,
    metavar="USER",
    help="User the --query queries run as, audited and charged to (default: the acting "
    "administrator).",
)
@click.option(
    "--include",
    "include",
    multiple=True,
    metavar="NAME",
    help="Also publish the synthetic or anonymised file NAME, which the policy does not list "
    "under releases: (repeatable).",
)
@click.option(
    "--storage-version",
    "storage",
    default=OLDEST_READER,
    show_default=True,
    metavar="VERSION",
    help="Oldest DuckDB release that must open OUT: v1.0.0 ... v2.0.0 (a patch release such as "
    "v1.1.3 names its minor release), or 'latest' (only this DuckDB and newer).",
)
@click.option(
    "--parquet",
    type=NamedPath(file_okay=False),
    default=None,
    metavar="DIR",
    help="Also write every table as DIR/NAME.parquet with DIR/manifest.json (DIR must be new, "
    "or --replace).",
)
@click.option(
    "--force",
    "--replace",
    "replace",
    is_flag=True,
    help="Overwrite OUT (and DIR) if they exist, once no other process has OUT open read-write.",
)
@admin_option
@format_option(default="table", choices=("table", "json"))
def publish(db, out, queries, analyst, include, storage, parquet, replace, user, fmt):
    """Write OUT, a DuckDB file holding only protected outputs (admins only).

    It holds the tables of `sqlsdc protect` jobs, the suppression pattern of every table the
    policy protects by suppression, the synthetic and anonymised files the policy lists under
    `releases:` (others only with --include NAME: candidates stored to be compared stay out),
    and the results of --query, as plain tables with a `release_contents` table describing
    them: no confidential table, internal column, ledger or secret. Point BI tools at OUT,
    read-only: duckdb:///OUT?access_mode=read_only. OUT opens in DuckDB 1.0.0 and newer (see
    --storage-version); --parquet DIR is for every other reader.

    As everywhere, --as names the acting administrator and --for the user acted for (here: the
    user whose queries are published).

    \b
    Example:
      sqlsdc publish demo.duckdb release.duckdb --as admin --for analyst \\
        --query "persons_by_region=SELECT region, COUNT(*) AS n FROM persons GROUP BY region" \\
        --parquet release-parquet
    """
    from sqlsdc.release import publish as publish_release

    named = {}
    for item in queries:
        name, sep, sql = item.partition("=")
        if not sep or not sql.strip():
            raise click.BadParameter(f"{item!r}: write NAME=SQL", param_hint="--query")
        named[name.strip()] = sql
    progress = None if fmt == "json" else (lambda message: click.echo(message, err=True))
    report = publish_release(
        db,
        out,
        user,
        queries=named,
        analyst=analyst,
        include=include,
        replace=replace,
        storage=storage,
        parquet=parquet,
        progress=progress,
    )
    if fmt == "json":
        print_json(report.to_dict())
        return
    readers = "this DuckDB" if report.storage_version == "latest" else report.storage_version
    click.echo(
        f"wrote {report.path} (policy version {report.policy_version}, "
        f"for DuckDB {readers} and newer):"
    )
    for table in report.tables:
        click.echo(f"  {table.table}: {table.rows} rows ({table.source}, {table.method})")
    for left in report.withheld:
        click.echo(f"  withheld {left.table} ({left.method}): not listed under releases: "
                   "(publish it with --include)")  # fmt: skip
    if report.parquet:
        click.echo(f"wrote {report.parquet}/: one Parquet file per table and manifest.json")


COMMANDS = (publish,)
