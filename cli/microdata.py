"""``sqlsdc anonymize`` and ``sqlsdc microdata-report``: protected microdata files (issue 20).

Thin commands over :mod:`sqlsdc.jobs.anonymize`; the methods are in :mod:`sqlsdc.microdata`.
"""

from __future__ import annotations

import contextlib
import os

import click
from sqlsdc.cli.admin import admin_option, opened, writing_admin_option
from sqlsdc.cli.output import (
    ExistingFile,
    NamedPath,
    NameList,
    checked_texts,
    format_option,
    into_option,
    print_json,
    read_sql,
    step_progress,
)

from sqlsdc.errors import Error, NotFoundError


@click.command()
@click.argument("db", type=ExistingFile())
@click.option("--from", "source", metavar="TABLE", help="A confidential table of the policy.")
@click.option("--sql", metavar="QUERY", help="A SELECT whose rows are the records ('-': stdin).")
@into_option
@click.option(
    "--step",
    "--steps",
    "steps",
    multiple=True,
    required=True,
    callback=lambda ctx, param, value: _checked_steps(value, param, ctx),
    metavar="METHOD:COLUMNS[:K=V,...]",
    help="A step, applied in the order given (repeatable): microaggregate:income:k=5"
    "[,method=optimal]; pram:education:p=0.8[,invariant=1]; noise:income:c=0.1; "
    "rankswap:income:p=5[,top=5,bottom=5]; shuffle:income[:given=age]; "
    "topcode:income:upper=200000; "
    "recode:age:breaks=15/30/45/65; "
    "suppress:region,sex,age:k=3[,importance=1/2/3].",
)
@click.option(
    "--keys",
    type=NameList(),
    help="Key variables (quasi-identifiers) for the risk report, comma-separated "
    "(default: the table's dimension columns).",
)
@click.option("--weights", help="Sampling-weight column (default: the policy's weight column).")
@click.option("--household", help="Household identifier column, for household risk.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the keyed draws.")
@click.option("--replace", is_flag=True, help="Overwrite an existing output of that name.")
@writing_admin_option
@format_option(default="table", choices=("table", "json"))
def anonymize(db, source, sql, into, steps, keys, weights, household, seed, replace, user, fmt):
    """Anonymise records and store them as protected.NAME (admins only).

    Direct identifiers and internal columns are left out; the steps run in order, random ones
    drawing from the database's secret and --seed (same seed, same output); the table, its
    report (risk before and after on the key variables, information loss) and an audit entry
    are stored together. `sqlsdc publish` releases it; `sqlsdc microdata-report` shows the
    report again. The file releases exact counts by every column no perturbative step changed
    (recoded ones by their bands), so it is refused where, next to an exact table of the same
    table stored before it (suppression, CTA, IPF), a cell of one less a cell of the other
    would count fewer units than the minimum frequency: bands that the table's population
    follows (a break at 85 next to `WHERE age >= 85`) tell nothing new. A cell of a column
    that local suppression blanked shows fewer records than it holds, so the table's cell less
    the file's would count the blanked ones there: refused as well when they are few.
    Keys that name a level of a hierarchy of the policy (region) must name the finest level
    the file shows (municipality): a neighbour who knows the one knows the other.

    \b
    Example:
      sqlsdc anonymize demo.duckdb --into persons_sdc \\
        --sql "SELECT sex, age, education, occupation, income FROM persons" \\
        --step recode:age:breaks=15/30/45/65/85 \\
        --step suppress:sex,age,education:k=3 \\
        --step microaggregate:income:k=5 --keys sex,age,education
    """
    from sqlsdc.jobs.anonymize import STEPS
    from sqlsdc.jobs.anonymize import anonymize as run
    from sqlsdc.jobs.session import handed_connection

    if (source is None) == (sql is None):
        raise click.UsageError("give either --from TABLE or --sql QUERY")
    quiet = contextlib.nullcontext(None)
    bar = quiet if fmt == "json" else step_progress(f"anonymize {into}", STEPS)
    with bar as say, handed_connection(db, opened()):
        report = run(
            db,
            user=user,
            into=into,
            steps=list(steps),
            source=source,
            sql=read_sql(sql) if sql is not None else None,
            keys=keys,
            weights=weights,
            household=household,
            seed=seed,
            replace=replace,
            progress=say,
        )
    if fmt == "json":
        print_json(report.to_dict())
    else:
        _print(report.to_dict())


@click.command("microdata-report")
@click.argument("db", type=ExistingFile())
@click.argument("names", nargs=-1, required=True)
@click.option("--plot", type=NamedPath(dir_okay=False), metavar="FILE",
              help="Write the risk–utility plot of the files (.png or .html).")  # fmt: skip
@click.option("--force", is_flag=True, help="Overwrite an existing --plot file.")
@admin_option
@format_option(default="table", choices=("table", "json"))
def microdata_report(db, names, plot, force, user, fmt):
    """Risk before/after and information loss of anonymised tables (admins only).

    With one NAME, its stored report; with several (the same records anonymised with other
    settings), a risk–utility comparison, and with --plot a picture of it to choose from.

    \b
    Example:
      sqlsdc microdata-report demo.duckdb persons_sdc --format json

    \b
    After anonymising the same records as k3, k5 and k10 (three settings):
      sqlsdc microdata-report demo.duckdb k3 k5 k10 --plot tradeoff.html
    """
    from sqlsdc.jobs.anonymize import stored_report
    from sqlsdc.microdata.tradeoff import plot_tradeoff, tradeoff

    if plot and os.path.lexists(plot) and not force:
        raise Error(f"{plot} exists; pass --force to overwrite it")
    if plot and not os.path.isdir(os.path.dirname(os.path.abspath(plot))):
        raise NotFoundError(f"cannot write {plot}: its folder does not exist")
    reports = [stored_report(db, name, user=user) for name in names]
    rows = tradeoff(reports)
    if plot:
        click.echo(f"wrote {plot_tradeoff(rows, plot)}", err=True)
    if fmt == "json":
        print_json(reports[0] if len(reports) == 1 else rows)
    elif len(reports) == 1:
        _print(reports[0])
    else:
        _print_tradeoff(rows)


def _checked_steps(texts: tuple[str, ...], param, ctx) -> tuple[str, ...]:
    """The ``--step`` texts, each checked where the command line is read: an unknown method,
    no column, a parameter not NAME=VALUE, unknown or missing is a usage error (exit code 2),
    as a malformed ``protect --rule`` is; it was exit code 1, after the database was opened
    (new user s44g). Values that do not fit the data (k larger than the records) stay 1."""
    from sqlsdc.microdata.steps import parse_step  # not at start-up (MicrodataError: a ValueError)

    return checked_texts(texts, param, ctx, parse_step)


def _print_tradeoff(rows: list[dict]) -> None:
    click.echo(f"{'file':28}{'exp. re-id.':>12}{'global risk':>12}{'fk < 3':>8}"
               f"{'linkage':>9}{'IL':>9}{'suppr.':>8}{'PRAM':>7}")  # fmt: skip
    for r in rows:
        specs = [("expected_reidentifications", ".1f", 12), ("global_risk", ".4f", 12),
                 ("below_3", "d", 8), ("linkage", ".1%", 9), ("information_loss", ".3f", 9),
                 ("suppressed", "d", 8), ("pram_changed", "d", 7)]  # fmt: skip
        cells = [_fmt(r[key], spec, width) for key, spec, width in specs]
        click.echo(f"{r['name']:28}" + "".join(cells))


def _fmt(value, spec: str, width: int) -> str:
    return f"{'–':>{width}}" if value is None else f"{value:>{width}{spec}}"


def _step_summary(step: dict) -> str:
    """What a step did, in a few words (the JSON report has everything)."""
    if "suppressed" in step:
        done = ", ".join(f"{c} {n}" for c, n in step["suppressed"].items() if n) or "none"
        return f"  (suppressed: {done})"
    if "il" in step:
        return f"  (IL {step['il']:.3f})"
    changed = [f"{c} {v['changed']}" for c, v in step.items() if isinstance(v, dict)]
    return f"  (changed: {', '.join(changed)})" if changed else ""


def _print(r: dict) -> None:
    click.echo(f"stored {r['name']}: {r['records']} records, {len(r['columns'])} columns")
    if r["dropped"]:
        click.echo(f"  left out: {', '.join(r['dropped'])}")
    click.echo(f"  seed {r['seed']}; steps:")
    for step in r["steps"]:
        click.echo(f"    {step['step']}{_step_summary(step)}")
    if r["before"]:
        b, a = r["before"], r["after"]
        weights = f", weights {r['weights']}" if r["weights"] else ""
        click.echo(f"  risk on {', '.join(r['keys'])}{weights}:")
        click.echo(f"    {'':30}{'before':>10} {'after':>10}")
        rows = [("sample uniques", "sample_uniques", "d")]
        rows += [(f"records with fk < {k}", ("violations", k), "d") for k in b["violations"]]
        rows += [
            ("expected re-identifications", "expected_reidentifications", ".1f"),
            ("global risk", "global_risk", ".4f"),
            ("largest individual risk", "max_risk", ".4f"),
        ]
        if b.get("households"):
            expected = ("households", "expected_reidentifications")
            rows += [("expected households re-identified", expected, ".1f")]
        if b.get("suda"):
            rows += [("records with an MSU (SUDA)", ("suda", "records_with_msu"), "d"),
                     ("largest SUDA score", ("suda", "max_score"), ".0f")]  # fmt: skip
        for label, key, spec in rows:
            x, y = (d[key[0]][key[1]] if isinstance(key, tuple) else d[key] for d in (b, a))
            click.echo(f"    {label:30}{x:>10{spec}} {y:>10{spec}}")
    if r["information_loss"]:
        click.echo("  information loss (IL = 100·SSE/SST on z-scores):")
        click.echo(f"    {'':30}{'IL':>10} {'IL1s':>10}")
        for column, loss in r["information_loss"].items():
            click.echo(f"    {column:30}{loss['il']:>10.3f} {loss['il1s']:>10.4f}")
    link = r.get("linkage")
    if link:
        click.echo(
            f"  record linkage on {', '.join(link['columns'])}: {link['euclidean']:.1%} of "
            f"{link['records']} records linked to their original (Euclidean), "
            f"{link['mahalanobis']:.1%} (Mahalanobis); interval disclosure "
            f"{link['interval_disclosure']:.1f} %"
        )


COMMANDS = (anonymize, microdata_report)
