"""``sqlsdc protect``: table-protection jobs whose results are stored in the database.

One command, one method per ``--method``: cell suppression (:mod:`sqlsdc.jobs.protect`),
controlled rounding, controlled tabular adjustment and raking (:mod:`sqlsdc.jobs.adjust`).
Options that belong to another method than the one chosen are refused, not ignored.
"""

from __future__ import annotations

import contextlib
import os
import sys

import click
from sqlsdc.cli.admin import opened, writing_admin_option
from sqlsdc.cli.output import (
    ExistingFile,
    Seconds,
    checked_texts,
    format_option,
    into_option,
    print_json,
    read_sql,
    step_progress,
)

METHODS = ("suppress", "round", "cta", "ipf")
STEPS = {"suppress": 4, "round": 5, "cta": 5, "ipf": 6}  # progress steps per method
OWNERS = {  # option -> the methods it belongs to
    "secondary": ("suppress",),
    "singleton": ("suppress",),
    "cost": ("suppress",),
    "rules": ("suppress", "cta", "ipf"),
    "base": ("round",),
    "cta_method": ("cta",),
    "intervals": ("cta",),
    "margins": ("ipf",),
    "time_limit": ("suppress", "round", "cta"),
}


@click.command()
@click.argument("db", type=ExistingFile())
@click.option(
    "--sql",
    required=True,
    help="SELECT dims, SUM(measure)|COUNT(*)|COUNT(DISTINCT unit) ... GROUP BY dims",
)
@click.option(
    "--method",
    type=click.Choice(METHODS),
    default="suppress",
    show_default=True,
    help="suppress: NULL unsafe cells; round: controlled rounding to --base; cta: controlled "
    "tabular adjustment; ipf: rake to the --margins file.",
)
@click.option(
    "--secondary",
    type=click.Choice(["gauss", "optimal", "hitas"]),
    default=None,
    help="[suppress] Secondary suppression: fast Gaussian elimination (default), optimal "
    "MILP, or HiTaS.",
)
@click.option(
    "--singleton",
    type=click.Choice(
        ["anySumAudit", "anySum", "subSum", "subSumAny", "subSpace", "subSumSpace", "none"]
    ),
    default=None,
    help="[suppress] GaussSuppression's singleton method, with every --secondary: anySumAudit "
    "(anySum redone until no one-unit cell's respondent computes another primary), anySum "
    "(SSBtools' default) or subSpace (conservative: all respondents together). Default: the "
    "replaced output's, else anySumAudit.",
)
@click.option(
    "--rule",
    "rules",
    multiple=True,
    callback=lambda ctx, param, value: _checked_rules(value, param, ctx),
    help="[suppress, cta, ipf] Primary rule (repeatable): freq:N[,RANGE], nk:N,K, p:P, pq:P,Q. "
    "Default: freq with the policy's minimum frequency, plus p:10 for sums.",
)
@click.option(
    "--cost",
    type=click.Choice(["value", "frequency", "unity"]),
    default=None,
    help="[suppress] What a secondary suppression costs (default: value).",
)
@click.option(
    "--base", type=click.IntRange(2, 1_000_000), help="[round] Rounding base, e.g. 5 or 10."
)
@click.option(
    "--cta-method",
    type=click.Choice(["lp", "milp", "mdi"]),
    default=None,
    help="[cta] lp: fixed directions (default, fast); milp: free directions, optimal within "
    "--time-limit; mdi: Cox-Orelien-Shah, margins kept, other cells raked.",
)
@click.option(
    "--intervals",
    is_flag=True,
    default=None,
    help="[cta] Also store Giessing-Dittrich intervals (lower_bound, upper_bound) on the "
    "adjusted sensitive cells; this tells which cells were adjusted. Sums only; not with "
    "--cta-method milp.",
)
@click.option(
    "--margins",
    type=ExistingFile(),
    help="[ipf] CSV of margin cells: the stored table's dimension columns (code, or Total where "
    "summed over) and value; complete margins only (every region total, say).",
)
@click.option(
    "--time-limit",
    type=Seconds(),
    default=None,
    help="[suppress, round, cta] Seconds per solver call (round: for the rounding, and as "
    "long again, at least 60, for its audit). "
    "Default: 60 (round: 30); at most 86400 (a day).",
)
@into_option
@click.option("--replace", is_flag=True, help="Overwrite an existing output of that name.")
@writing_admin_option
@format_option(default="table", choices=("table", "json"))
def protect(db, sql, method, into, replace, user, fmt, **options):
    """Protect a table computed from confidential data and store it (admins only).

    \b
    suppress  primary rules mark unsafe cells, secondary suppression hides enough others that
              none can be recomputed from the margins, an attacker LP audits the result;
              suppressed values are NULL.
    round     every cell to a multiple of --base, the table still additive (controlled
              rounding; status optimal, feasible, or near_feasible when some margins had to
              leave their adjacent multiples).
    cta       every cell published; sensitive cells moved by at least their (secretly
              enlarged) protection levels, the others as little as possible, additively.
              Sums only when a cell is sensitive: a moved count gives itself back.
    ipf       sensitive cells placed at safe values, the others raked to the --margins file
              (a count table only when no cell is sensitive, as for cta).
    Every job prints its report (information loss: HD, RAD, AAD, chi2, additivity, largest
    change) and stores it in sqlsdc.outputs; the table is written only if the job succeeds.
    Cells another job's output releases (same table and aggregate, a cell of the same units
    or rows) are protected one way: only suppression jobs of the same rows may share them.

    \b
    Examples:
      sqlsdc protect demo.duckdb --into turnover --rule nk:2,85 --rule freq:3 \\
        --sql "SELECT nace, region, SUM(turnover) FROM enterprises
        WHERE size_class = 'micro' GROUP BY nace, region"
      sqlsdc protect demo.duckdb --method round --base 5 --into persons_r5 \\
        --sql "SELECT region, education, COUNT(*) FROM persons GROUP BY region, education"
      sqlsdc protect demo.duckdb --method cta --intervals --into turnover_adjusted \\
        --sql "SELECT nace, region, SUM(turnover) FROM enterprises
        WHERE size_class <> 'micro' GROUP BY nace, region"
      sqlsdc protect demo.duckdb --method ipf --margins census.csv --rule freq:5 \\
        --into persons_ipf --sql "SELECT region, education, COUNT(*) FROM persons WHERE age >= 85
        GROUP BY region, education"
    """
    from sqlsdc.jobs.session import handed_connection
    from sqlsdc.tabular.rules import parse_rule

    _check_options(method, options)
    job = {"db": db, "user": user, "sql": read_sql(sql), "into": into, "replace": replace}
    rules = [parse_rule(r) for r in options["rules"]] or None
    with _progress(method) as progress, _native_output_to_stderr(), handed_connection(db, opened()):
        report = RUNNERS[method](job, options, rules, progress)
    if method != "suppress" and report.status == "near_feasible":
        _warn_near_feasible(report)
    if fmt == "json":
        print_json(report.to_dict())
    elif method == "suppress":
        _print_suppression(report)
    else:
        _print_adjustment(report)


def _suppress(job, options, rules, progress):
    from sqlsdc.jobs.protect import protect_query

    return protect_query(
        **job,
        method=options["secondary"] or "gauss",
        singleton=options["singleton"],
        rules=rules,
        cost=options["cost"] or "value",
        time_limit=options["time_limit"] or 60.0,
        progress=progress,
    )


def _round(job, options, rules, progress):
    from sqlsdc.jobs.adjust import round_query

    limit = options["time_limit"] or 30.0
    return round_query(**job, base=options["base"], time_limit=limit, progress=progress)


def _cta(job, options, rules, progress):
    from sqlsdc.jobs.adjust import cta_query

    return cta_query(
        **job,
        rules=rules,
        method=options["cta_method"] or "lp",
        time_limit=options["time_limit"] or 60.0,
        intervals=bool(options["intervals"]),
        progress=progress,
    )


def _ipf(job, options, rules, progress):
    from sqlsdc.jobs.adjust import ipf_query

    return ipf_query(**job, rules=rules, margins=options["margins"], progress=progress)


def _checked_rules(texts: tuple[str, ...], param, ctx) -> tuple[str, ...]:
    """The ``--rule`` texts, each checked where the command line is read: a malformed rule
    (``bogus``, ``freq``, ``freq:0``, ``nk:1,200``) is a usage error (exit code 2) naming the
    option, as ``--base 0`` is, before the database is opened (it was exit code 1)."""
    if not texts:
        return texts
    from sqlsdc.policy.rule_syntax import rule_arguments  # not at start-up

    return checked_texts(texts, param, ctx, rule_arguments)


RUNNERS = {"suppress": _suppress, "round": _round, "cta": _cta, "ipf": _ipf}
REQUIRED = {"round": ("base", "--base B (an integer >= 2)"), "ipf": ("margins", "--margins FILE")}


def _check_options(method: str, options: dict) -> None:
    """Refuse options of other methods, and ask for the ones this method needs."""
    if method in REQUIRED and options[REQUIRED[method][0]] is None:
        raise click.UsageError(f"--method {method} needs {REQUIRED[method][1]}")
    for option, owners in OWNERS.items():
        given = options[option]
        if given not in (None, False, ()) and method not in owners:
            flag = "--rule" if option == "rules" else "--" + option.replace("_", "-")
            raise click.UsageError(
                f"{flag} belongs to --method {' or '.join(owners)}, not {method}"
            )


def _progress(method: str):
    """A step callback for the job (:func:`~sqlsdc.cli.output.step_progress`)."""
    return step_progress(f"protect ({method})", STEPS[method])


@contextlib.contextmanager
def _native_output_to_stderr():
    """Send what native solver code writes to file descriptor 1 to stderr while the job runs:
    HiGHS's MIP solver prints debug lines even with ``output_flag=false``, and stdout must hold
    only the report (``--format json`` is parsed by scripts)."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no real descriptor 1 (embedded use)
        yield
        return
    os.dup2(2, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _warn_near_feasible(report) -> None:
    violations = report.details.get("violations") or []
    shown = "; ".join(str(v) for v in violations[:3])
    click.secho(
        f"WARNING: NEAR-FEASIBLE ROUNDING: {len(violations)} margin(s) lie beyond their adjacent "
        f"multiples of {report.details.get('base')} (by up to {report.details.get('max_excess'):g})"
        f", e.g. {shown}. The table is additive but not zero-restricted.",
        err=True,
        fg="red",
        bold=True,
    )


def _print_suppression(report) -> None:
    click.echo(f"stored {report.name}: {report.cells} cells")
    click.echo(f"  primary suppressions:   {report.primary}")
    singleton = "" if report.singleton == "anySumAudit" else f", singletons {report.singleton}"
    secondary_text = f"{report.secondary} ({report.method}{singleton}, cost {report.cost:g})"
    click.echo(f"  secondary suppressions: {secondary_text}")
    fired = ", ".join(f"{k} {v}" for k, v in sorted(report.rules_fired.items())) or "none"
    click.echo(f"  rules fired: {fired}")
    exact = "exact" if report.audit_exact else "LP bounds"
    click.echo(f"  audit: {'passed' if report.audit_passed else 'FAILED'} ({exact})")


def _print_adjustment(report) -> None:
    d, q = report.details, report.quality
    left_out = report.cells - report.stored
    note = f"; {left_out} published as 0 are not stored" if left_out else ""
    click.echo(f"stored {report.name}: {report.stored} rows ({report.cells} cells{note})")
    how = {
        "round": lambda: f"base {d['base']}, {len(d['violations'])} margin(s) relaxed",
        "cta": lambda: (
            f"{d['method']} ({d['solver']}), gap {_gap(d['gap'])}, "
            f"intervals {'yes' if d['intervals'] else 'no'}"
        ),
        "ipf": lambda: (
            f"{d['margins_given']} margin cells, {d['iterations']} IPF cycles, "
            f"margin error {d['max_margin_error']:.2g}"
        ),
    }[report.method]()
    click.echo(f"  {report.method}: {report.status}; {how}")
    if report.sensitive is not None:
        click.echo(f"  sensitive cells: {report.sensitive}")
    # HD, RAD, AAD and chi2 are of the inner cells; additivity and the largest change of
    # every cell, margins too: two headings, or a largest change at a Total cell would seem to
    # be an inner cell's
    for heading, rows in (
        ("quality (inner cells)", (("hd", "Hellinger distance HD"), ("rad", "RAD"),
                                   ("aad", "AAD"), ("chi2", "chi2 (Cox-Kim)"))),
        ("every cell, margins included", (("max_additivity_error", "additivity error"),
                                          ("max_abs_change", "largest change"))),
    ):  # fmt: skip
        click.echo(f"  {heading}:")
        for key, label in rows:
            value = q.get(key)
            text = "n/a" if value is None or value != value else f"{value:.6g}"
            click.echo(f"    {label + ':':24}{text}")
    if q.get("max_abs_change_cell") is not None:
        click.echo(f"    {'at cell:':24}{q['max_abs_change_cell']}")


COMMANDS = (protect,)


def _gap(gap: float) -> str:
    """The solver's relative optimality gap; rounding noise below 1e-9 is shown as 0."""
    return "0" if abs(gap) < 1e-9 else f"{gap:.2g}"
