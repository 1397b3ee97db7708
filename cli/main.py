"""The ``sqlsdc`` command: administration, guarded queries and the demo.

Exit codes: one per class of failure (``sqlsdc.cli.errors.EXIT_CODES``, shown by ``--help``).
"""

from __future__ import annotations

import errno
import os
import select
import signal
import sys

import click
from sqlsdc.cli.errors import classify, epilog

from sqlsdc import __version__
from sqlsdc.errors import interrupted_by_user


class SqlsdcGroup(click.Group):
    """Turns every error of a command into a message on stderr and its class's exit code;
    no traceback reaches the user."""

    def resolve_command(self, ctx, args):
        """The command to run, refused before it does anything (a query charged, a job
        stored) when its output could not be written: stdout was closed (``>&-``)."""
        name, command, rest = super().resolve_command(ctx, args)
        if isinstance(sys.stdout, ClosedStdout) and command is not None:
            if command.name in FAILS_AT_ITS_WRITE:
                pass  # ClosedStdout fails it there
            elif command.name in WRITES_NO_OUTPUT:
                # its one line (the port) goes nowhere, as asked; None failed its flush
                sys.stdout = open(os.devnull, "w", encoding="utf-8")  # (exit code 70)
            else:
                sys.stdout.write("")  # fails: exit code 9, on stderr
        return name, command, rest

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click's own usage errors (exit code 2), --help and aborts
        except BrokenPipeError as e:
            if _stdout_is_closed():  # `sqlsdc ... | head`: the reader has what it wanted, and
                raise  # click ends quietly with exit code 1 (no "failed: broken pipe")
            _fail(*classify(e))
        except Exception as e:  # noqa: BLE001 - the one place errors become exit codes
            if interrupted_by_user(e):  # Ctrl-C inside a DuckDB statement: as anywhere else
                raise click.Abort from None
            _fail(*classify(e))


def _stdout_is_closed() -> bool:
    """Whether the reader of stdout has gone away (a pipe without reader polls as an error)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _fd, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), or no real stdout
        return False


# Commands that print nothing needed on stdout: `serve` prints its address there for scripts
# (also on stderr), and is started with stdout closed as a daemon
WRITES_NO_OUTPUT = frozenset({"serve"})
# Commands that change nothing before they print, and print nothing in some use: `ptable -o
# FILE` writes the file only, and runs with stdout closed; `ptable` fails at its first write
FAILS_AT_ITS_WRITE = frozenset({"ptable"})


class ClosedStdout:
    """sys.stdout when the command was started with stdout closed (``sqlsdc ptable >&-``):
    every write fails, so that the command fails (exit code 9, on stderr) instead of losing
    its output and exiting 0, which Python's sys.stdout of None did silently (new user
    s46i)."""

    encoding = "utf-8"

    def write(self, _text: str) -> int:
        raise OSError(errno.EBADF, "cannot write the output: standard output is closed")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _guard_closed_streams() -> None:
    """Fill closed descriptors 0-2 with /dev/null, so that no file the command opens (a
    database) takes descriptor 1 or 2, where anything printed below Python would land in
    it; and make a closed stdout fail on the first write (:class:`ClosedStdout`)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            if fd == 1:
                sys.stdout = ClosedStdout()


def _fail(message: str, code: int) -> None:
    click.echo(f"sqlsdc: {message}", err=True)
    sys.exit(code)


@click.group(
    cls=SqlsdcGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=epilog()
)
@click.version_option(__version__, prog_name="sqlsdc")
def cli() -> None:
    """Statistical disclosure control in SQL.

    \b
    Start with the demo:
      sqlsdc demo
      sqlsdc query sqlsdc-demo.duckdb --user analyst \\
        "SELECT region, COUNT(*) FROM persons GROUP BY region"
    Then your own data (README, "Your own data"): load it into a DuckDB file, describe
    it in a policy (examples: python -m sqlsdc.schemas), and
      sqlsdc policy validate my-policy.yaml
      sqlsdc init my.duckdb --policy my-policy.yaml --as ADMIN
    """


def _register() -> None:
    from sqlsdc.cli import admin, budget, demo, microdata, protect, publish, query, synthesize
    from sqlsdc.cli import serve as serve_commands

    for module in (demo, admin, query, protect, publish, budget, microdata, synthesize,
                   serve_commands):  # fmt: skip
        for command in module.COMMANDS:
            cli.add_command(command)
    cli.add_command(__import__("sqlsdc.cli.ptable", fromlist=["ptable"]).ptable)
    cli.add_command(__import__("sqlsdc.cli.verify", fromlist=["verify"]).verify)
    cli.add_command(__import__("sqlsdc.cli.synth_report", fromlist=["x"]).synth_report)


_register()


def _stop_on_sigterm() -> None:
    """SIGTERM (``kill``, ``timeout``, a scheduler, systemd) stops a command as Ctrl-C does, so
    that it cleans up: the interpreter's default ended it at once, and a demo, job or
    publication stopped so left its half-written temporary file and lock file behind."""

    def stop(_signal, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def _say_when_waiting() -> None:
    """A command waiting for a database file another process holds (up to a minute) says so
    on stderr after two seconds, rather than look hung."""
    from sqlsdc.engines import file_lock

    def say(path, wait: float) -> None:
        click.echo(f"sqlsdc: waiting for {path}: another process has it open (up to "
                   f"{wait:g} s) ...", err=True)  # fmt: skip

    file_lock.on_long_wait = say


def main() -> None:
    _guard_closed_streams()
    _stop_on_sigterm()
    _say_when_waiting()
    try:
        cli(prog_name="sqlsdc")
    except OSError as e:  # --version or --help with stdout closed: before any command
        if not isinstance(sys.stdout, ClosedStdout):
            raise
        _fail(*classify(e))
