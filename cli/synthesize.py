"""``sqlsdc synthesize``: synthetic records stored as protected.NAME (issue 19).

A thin command over :func:`sqlsdc.synth.synthesize`; the methods are in :mod:`sqlsdc.synth`.
"""

from __future__ import annotations

import json

import click
from sqlsdc.cli.admin import opened, writing_admin_option
from sqlsdc.cli.output import (
    ExactNumber,
    ExistingFile,
    NameList,
    format_option,
    into_option,
    print_json,
    read_sql,
)


def _names(text: str | None) -> list[str] | None:
    return [c.strip() for c in text.split(",") if c.strip()] if text else None


def _assignments(values, what: str) -> dict[str, list[str]]:
    """``COL=A,B,C`` options as ``{col: [A, B, C]}``."""
    out = {}
    for value in values:
        column, sep, rest = value.partition("=")
        if not sep or not column.strip() or not rest.strip():
            raise click.BadParameter(f"{value!r}: write {what} as COLUMN=A,B,...")
        out[column.strip()] = [v.strip() for v in rest.split(",")]
    return out


def _zero(text: str) -> dict[str, str | None]:
    """``col=level,col2=level2`` (``NULL``: the missing level) as a structural zero."""
    zero = {}
    for part in text.split(","):
        column, sep, level = part.partition("=")
        if not sep or not column.strip():
            raise click.BadParameter(f"{text!r}: write a structural zero as COL=LEVEL[,COL=LEVEL]")
        zero[column.strip()] = None if level.strip().upper() == "NULL" else level.strip()
    return zero


def _option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise click.BadParameter(f"{text!r}: write a method option as KEY=VALUE")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


@click.command()
@click.argument("db", type=ExistingFile())
@click.option("--from", "source", metavar="TABLE", help="A confidential table of the policy.")
@click.option("--sql", metavar="QUERY", help="A SELECT whose rows are the records ('-': stdin); "
              "not for DP methods.")  # fmt: skip
@into_option
@click.option("--method", required=True,
              type=click.Choice(["dp-ipf", "dp-catall", "parametric", "cart"]),
              help="dp-ipf (Raab: noisy margins + IPF), dp-catall (noisy full table), "
                   "parametric (Gaussian copula), cart (sequential CART).")  # fmt: skip
@click.option("--columns", type=NameList(),
              help="Variables to synthesise, comma-separated (default: all but identifiers; "
              "DP: the table's dimension columns).")  # fmt: skip
@click.option("--epsilon", type=ExactNumber(),
              help="DP methods: the budget the job spends (exact: 1, 0.5, 1/2).")  # fmt: skip
@click.option("--margins", "margins", multiple=True, metavar="COL,COL[,COL]",
              help="dp-ipf: a margin set (repeatable; default all two-way).")  # fmt: skip
@click.option("--bins", multiple=True, metavar="COL=B0,B1,...",
              help="DP: bin a numeric column at these breaks (repeatable).")  # fmt: skip
@click.option("--levels", multiple=True, metavar="COL=A,B,...",
              help="DP: the public levels of a column (repeatable; default: the policy's "
                   "domain).")  # fmt: skip
@click.option("--missing", help="DP: columns whose missing values are a level, comma-separated.")
@click.option(
    "--zero",
    "zeros",
    multiple=True,
    metavar="COL=LEVEL[,COL=LEVEL]",
    help="DP: a structural zero, cells that cannot occur (repeatable; NULL: missing).",
)
@click.option("--stratify", metavar="COL", help="DP: fit each level of COL on its own.")
@click.option("--max-cells", type=click.IntRange(1), default=10_000_000, show_default=True,
              help="DP: the largest full table (per stratum) the job builds.")  # fmt: skip
@click.option("--no-projection", is_flag=True,
              help="dp-ipf: skip the consistency projection of the noisy margins ([RA] as "
                   "published).")  # fmt: skip
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="A method option (repeatable), e.g. cart's min_leaf=5.")  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the keyed draws.")
@click.option("--copies", type=click.IntRange(1), default=1, show_default=True,
              help="Synthetic copies, in one table with a synthetic_copy column.")  # fmt: skip
@click.option("--rows", type=click.IntRange(0), help="Records per copy (default: as many as "
              "the source, which must then be every row of a protected table; DP: the "
              "estimated count).")  # fmt: skip
@click.option("--replace", is_flag=True, help="Overwrite an existing output of that name.")
@writing_admin_option
@format_option(default="table", choices=("table", "json"))
def synthesize(db, source, sql, into, method, columns, epsilon, margins, bins, levels, missing,
               zeros, stratify, max_cells, no_projection, options, seed, copies, rows, replace,
               user, fmt):  # fmt: skip
    """Synthesise records and store them as protected.NAME (admins only).

    Direct identifiers and record keys are never synthesised. DP methods compute noisy
    margins in SQL and charge --epsilon to the privacy budget of the table (as DP queries
    do; budget exhausted: nothing is stored); every variable needs public levels (--levels,
    --bins or a `domain:` in the policy). Random draws come from the database's secret and
    --seed: same seed, same data. The table, its report, a view synthetic.NAME and an audit
    entry are stored together; `sqlsdc publish` releases it, and the policy's `releases:`
    lets analysts read it row by row. cart smooths every measure of the policy by default
    (synthpop's smoothing="density"; --option smoothing=false, or a list leaving a measure
    out, warns that its values are then original ones; a measure too concentrated to smooth
    is refused: top-code or round it). A DP job, once a budget applies to the table:
    --method dp-ipf --epsilon 1 --columns sex,education,age --bins age=0,15,30,45,65,111.

    \b
    Example:
      sqlsdc synthesize demo.duckdb --from persons --into persons_copula --method parametric
    """
    from sqlsdc.jobs.session import handed_connection
    from sqlsdc.synth import synthesize as run

    if (source is None) == (sql is None):
        raise click.UsageError("give either --from TABLE or --sql QUERY")
    say = None if fmt == "json" else (lambda message: click.echo(message, err=True))
    with handed_connection(db, opened()):
        report = run(
            db,
            user=user,
            into=into,
            method=method,
            source=source,
            sql=read_sql(sql) if sql is not None else None,
            columns=columns,
            epsilon=epsilon,
            margins=[_names(m) for m in margins] or None,
            bins=_assignments(bins, "--bins"),
            levels=_assignments(levels, "--levels"),
            missing=_names(missing) or (),
            zeros=[_zero(z) for z in zeros],
            stratify=stratify,
            max_cells=max_cells,
            project=not no_projection,
            options=dict(_option(o) for o in options),
            seed=seed,
            copies=copies,
            rows=rows,
            replace=replace,
            progress=say,
        )
    for warning in report.details.get("warnings") or []:  # stderr, whatever the format
        click.echo(warning, err=True)
    if fmt == "json":
        print_json(report.to_dict())
        return
    r = report.to_dict()
    click.echo(f"stored {r['name']} (view {r['view']}): {r['records']} records, "
               f"{len(r['columns'])} columns, method {r['method']}, seed {r['seed']}"
               + (f", {r['copies']} copies" if r["copies"] > 1 else ""))  # fmt: skip
    if r["dropped"]:
        click.echo(f"  left out: {', '.join(r['dropped'])}")
    if r["epsilon"] is not None:
        p = r["parameters"]
        click.echo(f"  ε = {r['epsilon']} charged; {len(p['margins'])} margins, discrete "
                   f"Laplace scale {p['scale']}, at most {p['rows_per_unit']} row(s) per "
                   f"{p['unit']}")  # fmt: skip
    for note in r["details"].get("notes") or []:
        click.echo(f"  {note}")
    fit = r["details"].get("ipf")
    for part in fit if isinstance(fit, list) else [fit] if fit else []:
        where = f"stratum {part['stratum']}: " if "stratum" in part else ""
        state = "converged" if part["converged"] else "did NOT converge"
        click.echo(f"  {where}IPF {state} in {part['iterations']} iterations "
                   f"(last change {part['last_change']:.2g})")  # fmt: skip


COMMANDS = (synthesize,)
