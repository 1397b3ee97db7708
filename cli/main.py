"""The ``sqlsdc`` command: administration, guarded queries and the demo.

Exit codes: 0 success, 1 error, 2 usage error, 3 query refused by the policy, 4 invalid policy,
5 access denied.
"""

from __future__ import annotations

import sys

import click

from sqlsdc import __version__
from sqlsdc.errors import AccessDenied, Error, PolicyError, PolicyViolation

EXIT_ERROR, EXIT_REFUSED, EXIT_POLICY, EXIT_DENIED = 1, 3, 4, 5


class SqlsdcGroup(click.Group):
    """Turns every sqlsdc error into a one-line message on stderr and a meaningful exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except PolicyViolation as e:
            _fail(f"refused: {e}", EXIT_REFUSED)
        except PolicyError as e:
            _fail(f"invalid policy:\n{e}", EXIT_POLICY)
        except AccessDenied as e:
            _fail(f"access denied: {e}", EXIT_DENIED)
        except Error as e:
            _fail(str(e), EXIT_ERROR)


def _fail(message: str, code: int) -> None:
    click.echo(f"sqlsdc: {message}", err=True)
    sys.exit(code)


@click.group(cls=SqlsdcGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sqlsdc")
def cli() -> None:
    """Statistical disclosure control in SQL.

    \b
    Start with the demo:
      sqlsdc demo
      sqlsdc query sqlsdc-demo.duckdb --user analyst \\
        "SELECT region, COUNT(*) FROM persons GROUP BY region"
    """


def _register() -> None:
    from sqlsdc.cli import admin, budget, demo, microdata, protect, publish, query

    for module in (demo, admin, query, protect, publish, budget, microdata):
        for command in module.COMMANDS:
            cli.add_command(command)
    cli.add_command(__import__("sqlsdc.cli.ptable", fromlist=["ptable"]).ptable)


_register()


def main() -> None:
    cli(prog_name="sqlsdc")
