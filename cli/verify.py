"""``sqlsdc verify``: how well an analysis of a synthetic output matches the confidential data."""

from __future__ import annotations

import click
from sqlsdc.cli.output import (
    DatabasePath,
    ExactNumber,
    format_option,
    print_frame,
    print_json,
    read_sql,
)

import sqlsdc


@click.command()
@click.argument("db", type=DatabasePath())
@click.option("--user", "-u", required=True, help="User name declared in the policy.")
@click.option("--sql", "sql", required=True, help="Query on a synthetic output (- for stdin).")
@click.option(
    "--mode",
    type=click.Choice(("interval", "noisy")),
    help="noisy: a DP value, costs epsilon per cell (analysts' only mode); interval: a decile "
    "interval, free (admins only, their default).",
)
@click.option("--epsilon", type=ExactNumber(),
              help="Noisy mode: epsilon charged per cell, e.g. 0.5 or 1/4.")  # fmt: skip
@format_option()
def verify(db: str, user: str, sql: str, mode: str | None, epsilon: str | None, fmt: str) -> None:
    """Compare a query on a released synthetic output with the same query on the confidential
    data.

    Prints, per group and estimate, the fidelity of the synthetic confidence interval to the
    confidential one (McClure and Reiter; 1 = the same interval, 0 = no overlap): for analysts
    a value with DP noise charged to their budget (--mode noisy --epsilon E), for admins also
    a decile interval such as [0.8, 0.9] (--mode interval, free). Repeating a query gives the
    same answer and costs nothing.

    \b
    For a released synthetic output syn_persons made from persons:
      sqlsdc verify DB --user analyst --mode noisy --epsilon 0.5 \\
        --sql "SELECT sex, AVG(income) FROM syn_persons GROUP BY sex"
    """
    with sqlsdc.connect(db, user=user) as con:
        answer = con.verify(read_sql(sql), mode=mode, epsilon=epsilon)
    if fmt == "json":
        print_json(answer.to_dict())
    else:
        print_frame(answer.frame().astype(str), fmt)


COMMANDS = (verify,)
