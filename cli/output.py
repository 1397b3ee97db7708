"""Shared output options and printing for the CLI (``--format table|csv|json``)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from sqlsdc.errors import Error, NotFoundError

if TYPE_CHECKING:
    import pandas as pd

FORMATS = ("table", "csv", "json")


class NamedPath(click.Path):
    """A path that names something: an empty one (``''``, e.g. an unset shell variable) is a
    usage error (exit code 2). It was read as the current folder, so that ``sqlsdc query ''``
    said "is a folder", ``init ''`` "cannot open database .", ``demo --db ''`` " exists" and
    ``ptable -o ''`` wrote to stdout instead."""

    def convert(self, value, param, ctx):
        self.named(value, param, ctx)
        return super().convert(value, param, ctx)

    def named(self, value, param, ctx) -> None:
        """Fail on an empty path, before any check of what it names."""
        if isinstance(value, str) and value == "":
            self.fail("'' is an empty path; name a file", param, ctx)


class ExistingFile(NamedPath):
    """An existing file argument (``ExistingFile()``) whose absence is
    a "not found" (exit code 8) in every command, as a missing database is for ``sqlsdc query``,
    rather than click's usage error."""

    def __init__(self) -> None:
        super().__init__(exists=True, dir_okay=False)

    def convert(self, value, param, ctx):
        self.named(value, param, ctx)
        _not_a_folder(value, param)
        if not os.path.lexists(value):
            if param is not None and param.name == "db":
                raise NotFoundError(  # as sqlsdc.engines.duckdb.open_database says it
                    f"database {value} does not exist; create it with `sqlsdc init` or "
                    "`sqlsdc demo`"
                )
            raise NotFoundError(f"file {value} does not exist")
        return super().convert(value, param, ctx)


class DatabasePath(NamedPath):
    """A database argument that may not exist yet (``query``, ``explain``, ``verify``: the
    open says so); a folder is no database file there either (exit code 8, not click's usage
    error)."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False)

    def convert(self, value, param, ctx):
        self.named(value, param, ctx)
        _not_a_folder(value, param)
        return super().convert(value, param, ctx)


def _not_a_folder(value, param) -> None:
    """A folder named as a file (the database, a policy): not found, as a text file named as
    the database is (it was click's usage error, exit 2)."""
    if not os.path.isdir(value):
        return
    if param is not None and param.name == "db":
        raise NotFoundError(f"{value} is a folder, not a DuckDB database file; name the "
                            "database file made by `sqlsdc init` or `sqlsdc demo`")  # fmt: skip
    raise NotFoundError(f"{value} is a folder, not a file")


class Seconds(click.FloatRange):
    """A positive, finite number of seconds: click's FloatRange lets NaN through (it compares
    false with every bound), and a server started with --statement-timeout nan refused every
    session."""

    name = "seconds"

    def __init__(self) -> None:
        super().__init__(min=0, min_open=True)

    def convert(self, value, param, ctx):
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return seconds


class ExactNumber(click.ParamType):
    """An exact number such as 0.5, 1e-6 or 1/3 (an epsilon), checked for its form where the
    command line is read, as ``sqlsdc budget`` checks its amounts: a value that is no number is
    a usage error (exit code 2) in every command (``synthesize --epsilon nan`` was exit 1 where
    ``budget grant --epsilon nan`` was 2). The text is passed on as written; whether its value
    fits (positive, within a range) is the command's to say."""

    name = "number"

    def convert(self, value, param, ctx):
        from sqlsdc.mechanisms.accountant import parse_exact  # not at start-up

        try:
            parse_exact(str(value), param.name if param is not None else "value")
        except ValueError as e:
            self.fail(str(e), param, ctx)
        return value


class NameList(click.ParamType):
    """Comma-separated column names (``--columns``, ``--keys``) as a list. A value that names
    none (``''`` or ``,``, e.g. an unset shell variable) is a usage error: it was read as the
    option left out, so ``synthesize --columns ''`` synthesised every column."""

    name = "names"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        names = [n.strip() for n in str(value).split(",") if n.strip()]
        if not names:
            self.fail(
                f"{value!r} names no column: name at least one, or leave the option out for "
                "the default",
                param,
                ctx,
            )
        return names


def _plain_name(ctx, param, value: str) -> str:
    if not value.isidentifier():  # as the jobs check it (sqlsdc.jobs.job, .anonymize)
        raise click.BadParameter(f"{value!r} must be a plain name (letters, digits, _)", ctx, param)
    return value


# --into of the jobs that store protected.NAME: a name with a space or a semicolon is a usage
# error (exit code 2) before the database is opened, as other malformed values are
into_option = click.option(
    "--into",
    required=True,
    callback=_plain_name,
    help="Name of the stored table (protected.NAME).",
)


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
        click.echo(frame_json(frame))
    elif frame.empty:
        click.echo("(no rows)" if len(frame.columns) else "(no columns)")
    else:
        shown = frame.astype(object).where(frame.notna(), "NULL")
        click.echo(shown.to_string(index=False, max_colwidth=60))


def print_result(cursor, fmt: str) -> None:
    """Write a guarded result: JSON from its Python values (exact integers, dates as dates,
    intervals as text; NaN and ±inf as null), a table or CSV from its DataFrame with HUGEINT
    columns (sums of integers) as exact integers instead of DuckDB's floats."""
    if fmt == "json":
        names = [d[0] for d in cursor.description]
        rows = cursor.fetchall()
        records = [dict(zip(names, map(_json_value, row), strict=True)) for row in rows]
        click.echo(json.dumps(records, allow_nan=False, default=str, separators=(",", ":")))
        return
    import pandas as pd

    frame, table = cursor.df(), None
    for i, (_name, kind, *_rest) in enumerate(cursor.description):
        if kind in ("HUGEINT", "UHUGEINT"):
            table = table or cursor.arrow()
            values = [None if v is None else int(v) for v in table.column(i).to_pylist()]
            frame.isetitem(i, pd.Series(values, dtype=object))
    print_frame(frame, fmt)


def _json_value(value):
    """A result value as JSON: inside lists, structs and maps too (a NaN in a list ended
    ``--format json`` as an internal error)."""
    import datetime as dt
    import decimal

    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):  # a struct, or a map whose keys JSON writes as text
        return {k if isinstance(k, str) else json.dumps(_json_value(k), default=str):
                _json_value(v) for k, v in value.items()}  # fmt: skip
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            return None
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (dt.date, dt.time)):  # datetime is a date
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        import pandas as pd

        return str(pd.Timedelta(value))
    return value


def frame_json(frame: pd.DataFrame) -> str:
    """JSON records of ``frame``; NaN and ±inf become null (JSON has no such numbers). Times
    keep their microseconds, as the table and CSV show them (pandas' default cut them to
    milliseconds: the audit log's JSON could not order entries of one millisecond nor match
    the ledger's times; new user s39)."""
    finite = frame.replace([math.inf, -math.inf], None)
    return finite.to_json(orient="records", date_format="iso", date_unit="us",
                          default_handler=str)  # fmt: skip


def print_json(value) -> None:
    """Write ``value`` as strict JSON: NaN and ±inf become null, times ISO 8601 as
    :func:`frame_json` writes them (``2026-11-29T00:00:00.000000``), other objects their text.
    ``sqlsdc budget --history --format json`` wrote ``2026-11-29 00:00:00`` where ``budget
    cells show --history`` wrote the ISO form (review of s50)."""
    click.echo(json.dumps(_finite(value), indent=2, default=str, allow_nan=False))


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dt.datetime):
        return value.isoformat(timespec="microseconds")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def checked_texts(texts: tuple[str, ...], param, ctx, check) -> tuple[str, ...]:
    """``texts`` of a repeatable option, each given to ``check`` where the command line is
    read: a ValueError (a malformed ``--rule`` or ``--step``) is a usage error naming the
    option (exit code 2), before the database is opened."""
    for text in texts:
        try:
            check(text)
        except ValueError as e:
            raise click.BadParameter(str(e), ctx=ctx, param=param) from None
    return texts


class CommandFirst(click.Group):
    """``server-user DB list`` or ``policy DB show`` (the order ``budget DB grant`` takes)
    says the command comes first; it said "No such command 'DB'" (new user s44g)."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and args[1:2] and args[1] in self.commands:
            raise click.UsageError(
                f"the command comes first: sqlsdc {ctx.info_name} {args[1]} {args[0]} ...", ctx
            )
        return super().resolve_command(ctx, args)


class StatementCommand(click.Command):
    """A command whose SQL is an argument: a statement that starts with a comment
    (``"-- persons by region\nSELECT ..."``) is that argument, not an option. click read it
    as one: "No such option '-- persons by region ...'" (new user s44g). An argument that
    starts with ``-`` and has a space or line break before any ``=`` names no option; it is
    passed after ``--``."""

    def parse_args(self, ctx, args):
        def statement(arg: str) -> bool:
            name = arg.split("=", 1)[0]
            return arg.startswith("-") and any(c.isspace() for c in name)

        statements = [a for a in args if statement(a)]
        if statements and "--" not in args:
            args = [a for a in args if not statement(a)] + ["--", *statements]
        return super().parse_args(ctx, args)


def read_sql(sql: str) -> str:
    """The SQL argument, or standard input when it is ``-``, without a leading byte-order mark.

    A file saved as "UTF-8 with BOM" (Windows editors do) starts with U+FEFF; read through
    ``-`` or ``"$(cat q.sql)"`` it was "could not be parsed: Unexpected token (line 1,
    column 14)" (exit 6), a position in a statement that has no error.

    Raises:
        SqlSyntaxError: bytes that are not UTF-8 (Python keeps them as lone surrogates).
    """
    from sqlsdc.guard.parse import check_unicode  # imports sqlglot: only when a query runs

    text = sys.stdin.read() if sql == "-" else sql
    check_unicode(text)
    return text.removeprefix("\ufeff")


def write_file(path: str | Path, text: str, *, force: bool) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file in the same folder, then a
    rename): readers see the old file or the whole new one, and a failure leaves nothing
    half-written. An existing file is replaced only with ``force``; ``/dev/stdout`` or a named
    pipe is written into (:func:`sqlsdc.files.written_into`)."""
    from sqlsdc.files import write_atomically, written_into

    path = Path(path)
    if path.exists() and not force and not written_into(path):
        raise Error(f"{path} exists; pass --force to overwrite it")
    if not path.parent.is_dir():
        raise NotFoundError(f"cannot write {path}: folder {path.parent} does not exist")

    write_atomically(path, text)


@contextlib.contextmanager
def step_progress(label: str, total: int):
    """A step callback for a job of ``total`` steps, called with each step's name as it
    starts: a progress bar on a terminal, one ``[k/total] step ...`` line per step otherwise;
    always on stderr, so that ``--format json`` output stays clean (issue 18: progress on
    every job longer than a few seconds)."""
    if not sys.stderr.isatty():
        done = [0]

        def line(step: str) -> None:
            done[0] += 1
            click.echo(f"[{min(done[0], total)}/{total}] {step} ...", err=True)

        yield line
        return
    with click.progressbar(length=total, label=label, file=sys.stderr,
                           item_show_func=lambda s: s) as bar:  # fmt: skip
        started = [False]

        def advance(step: str) -> None:
            bar.update(1 if started[0] else 0, step)
            started[0] = True

        yield advance
        bar.update(total - bar.pos, "done")
