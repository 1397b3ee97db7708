"""``sqlsdc ptable``: generate a maximum-entropy perturbation table for the Cell Key Method."""

from __future__ import annotations

import sys

import click
from sqlsdc.cli.output import NamedPath, frame_json, write_file

EXIT_USAGE = 2


def _classes(icat: str | None) -> tuple[int, ...] | None:
    try:
        return tuple(int(c) for c in icat.split(",")) if icat else None
    except ValueError:
        raise ValueError(
            f"--icat must be integers separated by commas, e.g. 1,3,5; got {icat!r}"
        ) from None


def _render(frame, fmt: str) -> str:
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "json":
        return frame_json(frame) + "\n"
    return frame.to_string(index=False, float_format=lambda x: f"{x:.8g}") + "\n"


@click.command()
@click.option("--D", "-D", "D", type=int, required=True, help="Largest noise |v| (integer >= 1).")
@click.option("--V", "-V", "V", type=float, required=True, help="Noise variance (> 0).")
@click.option("--js", type=int, default=0, show_default=True, help="Never publish counts 1..JS.")
@click.option("--pstay", type=float, default=None, help="Lower bound on P(no change), 0 < P < 1.")
@click.option("--optim", type=int, default=1, show_default=True, help="1-3: var <= V; 4: var = V.")
@click.option(
    "--mono/--no-mono", default=True, show_default=True, help="Probabilities rise up to v = 0."
)
@click.option(
    "--table",
    type=click.Choice(["cnts", "nums"]),
    default="cnts",
    show_default=True,
    help="Frequency counts or magnitudes.",
)
@click.option("--step", type=int, default=1, show_default=True, help="Noise grid 1/STEP (nums).")
@click.option("--icat", default=None, help="Magnitude classes, comma-separated [default: 1,D].")
@click.option(
    "--type",
    "type_",
    type=click.Choice(["all", "even", "odd"]),
    default="all",
    show_default=True,
    help="Row label of a magnitude table (parity tables).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["tauargus", "csv", "json", "table"]),
    default="table",
    show_default=True,
    help="Output format (tauargus: the file τ-ARGUS reads).",
)
@click.option("--check", is_flag=True, help="Print the per-row checks (R's empResults) instead.")
@click.option("--output", "-o", type=NamedPath(dir_okay=False), help="Write to FILE, not stdout.")
@click.option("--force", is_flag=True, help="Overwrite the --output file if it exists.")
def ptable(D, V, js, pstay, optim, mono, table, step, icat, type_, fmt, check, output, force):
    """Generate a perturbation table (ptable) for the Cell Key Method.

    Maximum-entropy noise with mean 0 and variance V, at most D, as the R package ptable
    (create_cnt_ptable, create_num_ptable) and τ-ARGUS use it. Each row i lists the targets j,
    their probabilities p and the cumulative key intervals; counts >= the last row use it.

    \b
    Examples:
      sqlsdc ptable --D 5 --V 3 --js 2
      sqlsdc ptable --D 5 --V 3 --js 2 --pstay 0.5 --format tauargus -o ptable.txt
      sqlsdc ptable --D 5 --V 1 --table nums --step 2 --icat 1,5 --format csv
      sqlsdc ptable --D 2 --V 1 --check
    """
    from sqlsdc.mechanisms.ptable import PTableParams, create_ptable
    from sqlsdc.mechanisms.ptable_files import to_tauargus

    try:
        classes = _classes(icat)
        params = PTableParams(D, V, js, pstay, optim, mono, table, step, classes, type_)
        pt = create_ptable(params)
        if check:
            text = _render(pt.self_check(), "table" if fmt == "tauargus" else fmt)
        elif fmt == "tauargus":
            text = to_tauargus(pt)
        else:
            text = _render(pt.to_frame(), fmt)
    except ValueError as e:  # PTableError (a sqlsdc.Error) or a bad --icat: a usage error
        click.echo(f"sqlsdc: {e}", err=True)
        sys.exit(EXIT_USAGE)
    if output:
        write_file(output, text, force=force)
    else:
        click.echo(text, nl=False)


COMMANDS = [ptable]
