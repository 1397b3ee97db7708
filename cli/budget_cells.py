"""``sqlsdc budget DB cells``: the policy's cell limits as budgets: use, grants and resets.

A cell limit is a budget of cells per period (:mod:`sqlsdc.catalog.cell_limits`), so it is
administered beside the DP budgets, under ``budget``, with the same options (``--for``,
``--reason``, ``--as``, ``--format``, ``--history``) and the same before -> after report.
Unlike ``sqlsdc budget DB``, showing the use is for admins only: a user's use counts the
groups HAVING and LIMIT hid, exactly (red team s49n).
"""

from __future__ import annotations

import click
from sqlsdc.cli.admin import acting_admin, acting_admin_option, opened
from sqlsdc.cli.output import format_option, print_frame, print_json

from sqlsdc.errors import Error

PERIODS = ("hour", "day", "week", "month")


def _policy_user(policy, user: str) -> str:
    """``user`` if the policy in force has them (or ``*``), else a usage error (exit 2)."""
    if user != "*" and policy.user(user) is None:
        known = ", ".join(sorted(policy.users)) or "none"
        raise click.BadParameter(f"{user!r} is not a user of the policy in force ({known})",
                                 param_hint="--for")  # fmt: skip
    return user


def _db(ctx: click.Context) -> str:
    """The DB argument of ``budget`` (``budget DB cells ...``)."""
    while "db" not in ctx.params:
        ctx = ctx.parent
    return ctx.params["db"]


class _CellsGroup(click.Group):
    """``cells`` alone is ``cells show`` with its defaults."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["show", *args]  # `cells --for analyst`: the listing's options
        return super().parse_args(ctx, args)


@click.group(cls=_CellsGroup, invoke_without_command=True)
@click.pass_context
def cells(ctx) -> None:
    """Cell limits as budgets: each user's use this period, grants and resets (admins only).

    A policy's cell_limits bound how many distinct cells (one released value of one group;
    the same cell again over the same data is free) a user, or all users together ('*'), may
    be released from a table per calendar period. `cells` (or `cells show`) lists each
    user's use; `cells grant` gives a user more cells for the current period, `cells reset`
    starts their period afresh. The lasting limits are the policy's: change them with a
    policy version.

    \b
    Examples:
      sqlsdc budget demo.duckdb cells --for analyst
      sqlsdc budget demo.duckdb cells grant --for analyst -t persons --cells 500 --reason "..."
      sqlsdc budget demo.duckdb cells reset --for analyst --reason "test queries by mistake"
      sqlsdc budget demo.duckdb cells show --history --format json
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(show)


@cells.command()
@click.option("--for", "--user", "-u", "who", help="Only the limits that bind this user.")
@click.option("--history", is_flag=True, help="List the grants and resets (the audit trail).")
@acting_admin_option("--as", "--admin", "admin", reads=True)
@format_option()
@click.pass_context
def show(ctx, who: str | None, history: bool, admin: str | None, fmt: str = "table") -> None:
    """Each user's use of the policy's cell limits this period (admins only: a use counts the
    groups a HAVING or LIMIT hid, exactly).

    CELLS is the policy's limit, GRANTED what an admin granted for the current period (`cells
    grant`), USED the distinct cells released since the period's start (or an admin's reset),
    LEFT = CELLS + GRANTED - USED; ENDED says a refused query ended the user's period: until
    RESETS_AT, or an admin's grant or reset, only statements answered before are answered.

    \b
    Examples:
      sqlsdc budget demo.duckdb cells show --for analyst --format json
      sqlsdc budget demo.duckdb cells show --history
    """
    from sqlsdc.cli.budget import _open_with_catalog

    from sqlsdc import admin as admins
    from sqlsdc.catalog import cell_limit_admin
    from sqlsdc.policy import load_policy

    db = _db(ctx)
    if admin is None:  # `cells` alone: the option was not read
        admin = acting_admin(ctx, None, None, reads=True)
    con = opened()  # the one opened to find the admin, unless --as named them
    own = con is None
    if own:
        con = _open_with_catalog(db, read_only=True)
    try:
        current = admins.require_admin(con, admin)
        policy = load_policy(current[1], name=current[2])
        if who is not None:
            _policy_user(policy, who)
        if history:
            import pandas as pd

            events = cell_limit_admin.events(con, user=who)
            print_frame(pd.DataFrame(events, columns=list(cell_limit_admin.EVENT_COLUMNS)), fmt)
            return
        if not policy.cell_limits:
            click.echo("sqlsdc: the policy in force has no cell limits (`cell_limits`)",
                       err=True)  # fmt: skip
        print_frame(admins.cell_limit_usage(db, admin, who=who, con=con), fmt)
    finally:
        if own:
            con.close()


def _state(usage) -> dict:
    left = 0 if usage.ended else max(usage.limit.cells + usage.granted - usage.used, 0)
    return {"cells": usage.limit.cells, "granted": usage.granted, "used": usage.used,
            "left": left, "ended": usage.ended if usage.limit.user != "*" else None}  # fmt: skip


def _report(fmt: str, action: str, changes, given: int | None, text) -> None:
    """What a grant or reset did: per limit a line and its state before -> after, or with
    --format json a list of objects (one per event)."""
    if fmt == "json":
        print_json([{
            "action": action, "event": c.seq, "user": c.user if c.limit.user != "*" else "*",
            "table": c.limit.table, "per": c.limit.per, "cells": given,
            "period_start": c.after.start, "resets_at": c.after.resets,
            "before": _state(c.before), "after": _state(c.after),
        } for c in changes])  # fmt: skip
        return
    for c in changes:
        click.echo(text(c))
        old, new = _state(c.before), _state(c.after)
        for key in ("granted", "used", "left", "ended"):
            if old[key] != new[key] or key == "left":
                click.echo(f"  {key}: {_shown(old[key])} -> {_shown(new[key])}")


def _shown(value) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "-"}[value]
    return f"{value:,}"


_options = [
    click.option(
        "--for",
        "--user",
        "-u",
        "user",
        required=True,
        help="User whose limit changes ('*': a limit of all users).",
    ),  # fmt: skip
    click.option(
        "--table",
        "-t",
        "table",
        help="The limit's table ('*': all tables); needed when the user has limits on several.",
    ),  # fmt: skip
    click.option(
        "--per",
        type=click.Choice(PERIODS),
        help="The limit's period; needed when the user has several limits on the table.",
    ),  # fmt: skip
    click.option("--reason", required=True, help="Why (kept in the audit trail)."),
    acting_admin_option("--as", "--admin", "admin", writes=True),
    format_option(choices=("table", "json")),
]


def _with_options(f):
    for option in reversed(_options):
        f = option(f)
    return f


def _session(ctx, admin: str, user: str, reason: str):
    from sqlsdc.cli.budget import _admin_session

    if not reason.strip():  # the events refuse it: a usage error here
        raise click.BadParameter("say why (it is kept in the audit trail)", param_hint="--reason")
    con, policy = _admin_session(_db(ctx), admin)
    try:
        _policy_user(policy, user)
    except BaseException:
        con.close()
        raise
    return con, policy


@cells.command()
@_with_options
@click.option("--cells", "count", required=True, type=click.IntRange(1, 1_000_000_000),
              help="How many more distinct cells, for the current period only.")  # fmt: skip
@click.pass_context
def grant(ctx, user, table, per, reason, admin, fmt, count) -> None:
    """Grant a user more cells of a cell limit for its current period (admins only; recorded
    with who, when and why).

    The limit is the user's own in the policy in force (--for '*': a limit of all users
    together), named by --table and --per where the user has several. The grant ends with the
    period: the next period has the policy's limit again (a lasting change is a policy
    version). It adds to every grant of the period since its last reset, and lifts the end a
    refused query set: the user's next query is counted against the limit plus the grants.
    Every other limit that binds the user still applies.

    \b
    Example:
      sqlsdc budget demo.duckdb cells grant --for analyst --table persons --cells 500 \\
        --reason "Q3 tables" --as admin
    """
    from sqlsdc.catalog import cell_limit_admin

    con, policy = _session(ctx, admin, user, reason)
    try:
        found = cell_limit_admin.targets(policy, user, table, per)
        if len(found) > 1:
            names = "; ".join(cell_limit_admin.describe(lim, user) for lim in found)
            raise click.UsageError(f"{user!r} has {len(found)} such limits ({names}): name one "
                                   "with --table and --per")  # fmt: skip
        change = cell_limit_admin.grant(con, policy, admin=admin, user=user, limit=found[0],
                                        cells=count, reason=reason)  # fmt: skip
    except ValueError as e:
        raise Error(str(e)) from None
    finally:
        con.close()
    _report(fmt, "grant", [change], count,
            lambda c: f"granted {count:,} cells to the limit of "
            f"{cell_limit_admin.describe(c.limit, c.user)} ({c.limit.cells:,} cells) until "
            f"{c.after.resets:%Y-%m-%d %H:%M} UTC (event {c.seq})")  # fmt: skip


@cells.command()
@_with_options
@click.pass_context
def reset(ctx, user, table, per, reason, admin, fmt) -> None:
    """Start a user's period on their cell limits afresh (admins only; recorded with who,
    when and why).

    Every limit of the user's own (--for '*': of all users together), or those named by
    --table and --per: the use is counted from now, the period's grants are dropped and the end
    a refused query set is lifted. Cells released before stay free (a statement answered
    before costs nothing again), and the audit log keeps every query. For a user whose
    queries were a mistake, say, not to raise a limit: that is a policy version's.

    \b
    Example:
      sqlsdc budget demo.duckdb cells reset --for analyst --reason "test run" --as admin
    """
    from sqlsdc.catalog import cell_limit_admin

    con, policy = _session(ctx, admin, user, reason)
    try:
        found = cell_limit_admin.targets(policy, user, table, per)
        changes = cell_limit_admin.reset(con, policy, admin=admin, user=user, limits=found,
                                         reason=reason)  # fmt: skip
    except ValueError as e:
        raise Error(str(e)) from None
    finally:
        con.close()
    _report(fmt, "reset", changes, None,
            lambda c: f"reset the period of {cell_limit_admin.describe(c.limit, c.user)} "
            f"({c.limit.cells:,} cells, until {c.after.resets:%Y-%m-%d %H:%M} UTC): its use "
            f"counted from now (event {c.seq})")  # fmt: skip
