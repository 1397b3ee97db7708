"""Administration commands: ``init``, ``policy validate|show|apply``, ``audit``."""

from __future__ import annotations

import click
import yaml
from sqlsdc.cli.output import format_option, print_frame, print_json

from sqlsdc import admin
from sqlsdc.catalog import init as init_database
from sqlsdc.policy import load_policy

admin_option = click.option(
    "--user",
    "-u",
    default="admin",
    show_default=True,
    help="Acting administrator (must have role admin in the policy in force).",
)


def _report(report) -> None:
    click.echo(f"policy version {report.version} applied")
    for table, rows in report.keyed_rows.items():
        unit = "one row per unit" if report.unit_per_row[table] else "several rows per unit"
        click.echo(f"  {table}: {rows} new record keys; {unit}")
    if report.secret_created:
        click.echo("  created the PRF secret")


@click.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.option(
    "--policy",
    "policy_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Policy YAML file.",
)
@admin_option
def init(db: str, policy_file: str, user: str) -> None:
    """Create the sqlsdc catalog in DB and apply the policy.

    Gives every row of every confidential table a secret record key, creates the PRF secret and
    stores the policy as version 1. Running it again on an initialised database applies the
    policy as a new version and keys rows added since.
    """
    _report(init_database(db, load_policy(policy_file), applied_by=user))


@click.group()
def policy() -> None:
    """Validate, show and apply policies."""


@policy.command()
@click.argument("file", type=click.Path(dir_okay=False))
def validate(file: str) -> None:
    """Check a policy file against the schema and its own rules (no database needed)."""
    load_policy(file)
    click.echo(f"{file}: valid")


@policy.command()
@click.argument("db", type=click.Path(exists=True, dir_okay=False))
@format_option(default="yaml", choices=("yaml", "json"))
@click.option("--history", is_flag=True, help="List all applied versions instead.")
def show(db: str, fmt: str, history: bool) -> None:
    """Print the policy in force (or the version history)."""
    version, document, versions = admin.show(db)
    if history:
        rows = [
            dict(zip(("version", "applied_at", "applied_by", "source", "sha256"), v, strict=True))
            for v in versions
        ]
        print_json(rows) if fmt == "json" else click.echo(yaml.safe_dump(rows, sort_keys=False))
        return
    if fmt == "json":
        print_json({"version": version, "policy": document})
    else:
        click.echo(f"# policy version {version}")
        click.echo(yaml.safe_dump(document, sort_keys=False), nl=False)


@policy.command()
@click.argument("db", type=click.Path(exists=True, dir_okay=False))
@click.argument("file", type=click.Path(dir_okay=False))
@admin_option
def apply(db: str, file: str, user: str) -> None:
    """Apply FILE to DB as a new policy version (earlier versions are kept)."""
    _report(admin.apply(db, file, user))


@click.command()
@click.argument("db", type=click.Path(exists=True, dir_okay=False))
@admin_option
@click.option("--who", help="Only queries of this user.")
@click.option("--decision", type=click.Choice(["accepted", "refused", "failed"]))
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1))
@format_option()
def audit(db: str, user: str, who: str | None, decision: str | None, limit: int, fmt: str) -> None:
    """Show the audit log: every query, accepted, refused or failed, newest first."""
    frame = admin.audit(db, user, who=who, decision=decision, limit=limit)
    if fmt == "table":
        frame = frame.drop(columns=["fingerprint"])
        frame["sql_text"] = frame["sql_text"].str.replace(r"\s+", " ", regex=True)
    print_frame(frame, fmt)


COMMANDS = (init, policy, audit)
