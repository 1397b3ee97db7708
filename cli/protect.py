"""``sqlsdc protect``: table-protection jobs whose results are stored in the database."""

from __future__ import annotations

import click
from sqlsdc.cli.admin import admin_option
from sqlsdc.cli.output import format_option, print_json, read_sql

from sqlsdc.tabular.job import OUTPUT_SCHEMA, protect_query
from sqlsdc.tabular.rules import parse_rule


@click.command()
@click.argument("db", type=click.Path(exists=True, dir_okay=False))
@click.option("--sql", required=True, help="SELECT dims, SUM(measure)|COUNT(*) ... GROUP BY dims")
@click.option(
    "--method",
    type=click.Choice(["suppress"]),
    default="suppress",
    show_default=True,
    help="Protection method.",
)
@click.option(
    "--secondary",
    type=click.Choice(["gauss", "optimal", "hitas"]),
    default="gauss",
    show_default=True,
    help="Secondary suppression: fast Gaussian elimination, optimal MILP, or HiTaS.",
)
@click.option(
    "--rule",
    "rules",
    multiple=True,
    help="Primary rule (repeatable): freq:N[,RANGE], nk:N,K, p:P, pq:P,Q. "
    "Default: freq with the policy's minimum frequency, plus p:10 for sums.",
)
@click.option(
    "--cost",
    type=click.Choice(["value", "frequency", "unity"]),
    default="value",
    show_default=True,
    help="What a secondary suppression costs.",
)
@click.option(
    "--time-limit", type=float, default=60.0, show_default=True, help="Seconds per solver call."
)
@click.option("--into", required=True, help=f"Name of the stored table ({OUTPUT_SCHEMA}.NAME).")
@click.option("--replace", is_flag=True, help="Overwrite an existing output of that name.")
@admin_option
@format_option(default="table", choices=("table", "json"))
def protect(db, sql, method, secondary, rules, cost, time_limit, into, replace, user, fmt):
    """Protect a table by cell suppression and store it (admins only).

    Primary rules mark unsafe cells, secondary suppression hides enough others that no unsafe
    cell can be recomputed from the margins, and an attacker LP audits the result: it is
    stored only if every unsafe cell keeps its protection interval. Suppressed values are NULL.

    \b
    Example:
      sqlsdc protect demo.duckdb --into turnover \\
        --sql "SELECT nace, region, SUM(turnover) FROM enterprises GROUP BY nace, region" \\
        --rule nk:2,85 --rule freq:3
    """
    if fmt != "json":
        click.echo("computing cells, primary and secondary suppression, audit ...", err=True)
    report = protect_query(
        db,
        user,
        read_sql(sql),
        into=into,
        method=secondary,
        rules=[parse_rule(r) for r in rules] or None,
        cost=cost,
        time_limit=time_limit,
        replace=replace,
    )
    if fmt == "json":
        print_json(report.to_dict())
        return
    click.echo(f"stored {report.name}: {report.cells} cells")
    click.echo(f"  primary suppressions:   {report.primary}")
    secondary_text = f"{report.secondary} ({report.method}, cost {report.cost:g})"
    click.echo(f"  secondary suppressions: {secondary_text}")
    fired = ", ".join(f"{k} {v}" for k, v in sorted(report.rules_fired.items())) or "none"
    click.echo(f"  rules fired: {fired}")
    exact = "exact" if report.audit_exact else "LP bounds"
    click.echo(f"  audit: {'passed' if report.audit_passed else 'FAILED'} ({exact})")


COMMANDS = (protect,)
