"""``sqlsdc synth-report``: utility and disclosure of a stored synthetic table (issue 19).

A thin command over :func:`sqlsdc.synth.report.synth_report`.
"""

from __future__ import annotations

import click
from sqlsdc.cli.admin import opened, writing_admin_option
from sqlsdc.cli.output import ExistingFile, NamedPath, NameList, format_option, print_json

from sqlsdc.errors import Error


@click.command("synth-report")
@click.argument("db", type=ExistingFile())
@click.option("--table", required=True, metavar="protected.NAME", help="The synthetic table.")
@click.option(
    "--against",
    metavar="TABLE",
    help="A confidential table of the policy to compare with (default: the source query the "
    "synthesis job stored).",
)
@click.option(
    "--keys", type=NameList(), help="Key variables (what an intruder knows), comma-separated."
)
@click.option("--target", help="A sensitive variable: TCAP and DiSCO for --keys.")
@click.option(
    "--out",
    type=NamedPath(file_okay=False),
    help="Folder of the report (default: NAME_report/ next to DB).",
)
@click.option("--force", is_flag=True, help="Overwrite the report files of an earlier run.")
@writing_admin_option
@format_option(default="text", choices=("text", "json"))
def synth_report(db, table, against, keys, target, out, force, user, fmt):
    """Utility and disclosure risk of a synthetic table (admins only: it reads the data).

    Writes report.json, report.html and, with matplotlib (the `report` extra), the plots
    utility_pairs.png (two-way U of every pair) and marginals.png.

    \b
    After `sqlsdc synthesize demo.duckdb --from persons --into persons_syn --method cart`:
      sqlsdc synth-report demo.duckdb --table protected.persons_syn \\
        --keys region,sex,age --target occupation
    """
    from sqlsdc.jobs.session import handed_connection
    from sqlsdc.synth.report import report_folder
    from sqlsdc.synth.report import synth_report as run

    folder = report_folder(db, table, out)
    if (folder / "report.json").exists() and not force:
        raise Error(f"{folder} holds a report; pass --force to overwrite it, or --out another")
    with handed_connection(db, opened()):
        result = run(db, table, user=user, against=against, keys=keys, target=target,
                     out=out)  # fmt: skip
    if fmt == "json":
        from sqlsdc.synth.report import _jsonable

        print_json(_jsonable(result))
        return
    u, d = result["utility"], result["disclosure"]
    ru = d["replicated_uniques"]
    click.echo(f"{result['table']}: {result['records']['synthetic']} synthetic records against "
               f"{result['records']['original']} original ({result['source']})")  # fmt: skip
    click.echo(f"  SDMetrics quality score      {u['quality']['score']:.4f}")
    click.echo(f"  two-way U mean / worst       {u['two_way']['mean']:.3f} / "
               f"{u['two_way']['worst']:.3f} ({u['two_way']['worst_table']})")  # fmt: skip
    if u["three_way"]:
        click.echo(f"  three-way U mean / worst     {u['three_way']['mean']:.3f} / "
                   f"{u['three_way']['worst']:.3f}")  # fmt: skip
    click.echo(f"  propensity pMSE ratio        {u['propensity']['ratio']:.3f}")
    click.echo(f"  identical to an original     {d['identical_share']:.2%}")
    click.echo(f"  replicated uniques           {ru['ru']:.2f}% of records "
               f"({ru['replicated']} of {ru['uniques']} uniques)")  # fmt: skip
    if "tcap" in d:
        click.echo(f"  TCAP (baseline)              {d['tcap']['tcap']} "
                   f"({d['tcap']['baseline']:.3f}); DiSCO {d['disco']['disco']:.2f}%")  # fmt: skip
    for kind, path in result["files"].items():
        click.echo(f"  {kind}: {path}")


COMMANDS = (synth_report,)
