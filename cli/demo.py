"""``sqlsdc demo``: build the demo database and show what the guard does."""

from __future__ import annotations

import time
from pathlib import Path

import click
from sqlsdc.cli.output import NamedPath

from sqlsdc.demo import DEFAULT_PERSONS, DEFAULT_SEED
from sqlsdc.errors import Error

MAX_PERSONS = 100_000_000  # 10**20 could not be sized by numpy: a bug report, not a message
STEPS = ("households", "persons", "enterprises", "regions", "record keys and catalog")


@click.command()
@click.option(
    "--db",
    default="sqlsdc-demo.duckdb",
    show_default=True,
    type=NamedPath(dir_okay=False),
    help="Where to write the demo database.",
)
@click.option(
    "--persons",
    default=DEFAULT_PERSONS,
    show_default=True,
    type=click.IntRange(100, MAX_PERSONS),
    help="Number of persons to generate.",
)
@click.option(
    "--seed",
    default=DEFAULT_SEED,
    show_default=True,
    type=click.IntRange(0),
    help="Random seed; the same seed gives the same data.",
)
@click.option("--no-queries", is_flag=True, help="Only build the database.")
@click.option("--force", is_flag=True,
              help="Replace DB if it exists, once no other process has it open.")  # fmt: skip
def demo(db: str, persons: int, seed: int, no_queries: bool, force: bool) -> None:
    """Build a synthetic population with a ready policy and run guarded queries.

    \b
    The database has persons, households, enterprises, benefits (confidential) and regions
    (public), users `admin` and `analyst`. Afterwards try:
      sqlsdc query sqlsdc-demo.duckdb --user analyst \\
        "SELECT sex, COUNT(*) FROM persons GROUP BY sex"
    """
    from sqlsdc.demo.build import build_demo_database
    from sqlsdc.demo.showcase import run_showcase

    if Path(db).exists() and not force:
        raise Error(f"{db} exists; pass --force to replace it, or choose another --db")
    started = time.perf_counter()
    stderr = click.get_text_stream("stderr")  # stdout keeps only the report
    with click.progressbar(length=len(STEPS), label=f"building {db}", file=stderr) as bar:
        report = build_demo_database(
            db, persons=persons, seed=seed, progress=lambda _step, _n: bar.update(1)
        )
    elapsed = time.perf_counter() - started
    click.echo(
        f"built {db}: {persons:,} persons, policy version {report.version}, "
        f"{sum(report.keyed_rows.values()):,} record keys in {elapsed:.1f} s"
    )
    if not no_queries:
        run_showcase(db, click.echo)
        click.echo(f"\nAudit log: sqlsdc audit {db}    Policy: sqlsdc policy show {db}")


COMMANDS = (demo,)
