"""Shared output options and printing for the CLI (``--format table|csv|json``)."""

from __future__ import annotations

import json
import sys

import click

FORMATS = ("table", "csv", "json")


def format_option(default: str = "table", choices=FORMATS):
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(choices),
        default=default,
        show_default=True,
        help="Output format.",
    )


def print_frame(frame, fmt: str) -> None:
    """Write a DataFrame to stdout as an aligned table, CSV or JSON records."""
    frame = frame.convert_dtypes()  # integers stay integers next to NULLs
    if fmt == "csv":
        frame.to_csv(sys.stdout, index=False)
    elif fmt == "json":
        click.echo(frame.to_json(orient="records", date_format="iso", default_handler=str))
    elif frame.empty:
        click.echo("(no rows)" if len(frame.columns) else "(no columns)")
    else:
        shown = frame.astype(object).where(frame.notna(), "NULL")
        click.echo(shown.to_string(index=False, max_colwidth=60))


def print_json(value) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


def read_sql(sql: str) -> str:
    """The SQL argument, or standard input when it is ``-``."""
    return sys.stdin.read() if sql == "-" else sql
