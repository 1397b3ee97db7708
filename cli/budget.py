"""``sqlsdc budget``: differential-privacy budgets: what is left, grants and resets."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

import click
from sqlsdc.cli.admin import acting_admin_option, opened
from sqlsdc.cli.output import ExistingFile, format_option, print_frame, print_json

from sqlsdc.errors import Error

if TYPE_CHECKING:
    from sqlsdc.catalog import budget as ledger


def _decimal(x: Fraction | str | None) -> str | None:
    """Exact text (:func:`sqlsdc.mechanisms.accountant.exact_text`): a finite decimal where
    there is one ("0.25"), else "p/q". Every amount ``sqlsdc budget`` prints is written so
    (limits, spending, grants, history, ledger): the history showed "3/10" where the status
    showed "0.3" for the same charge."""
    from sqlsdc.mechanisms.accountant import exact_text  # not at start-up: 12 ms of --help

    return None if x is None else exact_text(Fraction(x))


KINDS = ("epsilon", "rho", "delta")
LEDGER_ROWS = 100  # charges `budget --ledger` lists by default
MAX_LEDGER = 1_000_000  # and at most, as `audit --limit`
STATUS_COLUMNS = ("user", "table") + tuple(
    f"{kind}_{part}" for kind in KINDS for part in ("limit", "spent", "remaining")
)


def _rows(statuses) -> list[dict]:
    rows = []
    for s in statuses:
        row = {"user": s.key.user, "table": s.key.table}
        for kind in KINDS:
            row[f"{kind}_limit"] = _decimal(getattr(s.limit, kind))
            row[f"{kind}_spent"] = _decimal(getattr(s.spent, kind))
            row[f"{kind}_remaining"] = _decimal(getattr(s.remaining, kind))
        rows.append(row)
    return rows


def _amounts(rows: list[dict]) -> list[dict]:
    """History or ledger rows with their amounts (stored as exact fractions) as decimals."""
    return [{k: _decimal(v) if k in KINDS else v for k, v in row.items()} for row in rows]


def _open_with_catalog(db: str, *, read_only: bool):
    from sqlsdc.catalog import store
    from sqlsdc.engines import duckdb as engine

    con = engine.open_database(db, read_only=read_only)
    if store.current_policy(con) is None:
        missing = store.no_catalog(db, con)
        con.close()
        raise missing
    return con


class _BudgetGroup(click.Group):
    """``budget DB [OPTIONS]`` shows budgets, ``budget DB grant|reset [OPTIONS]`` changes them:
    options after DB belong to the group unless a subcommand follows DB. ``budget grant
    --help`` (and ``budget DB grant --help`` before DB exists) shows the subcommand's help;
    ``budget grant DB ...`` says that DB comes first (click read "grant" as the database)."""

    def parse_args(self, ctx, args):
        named = next((a for a in args[:2] if a in self.commands), None)
        if named is not None and any(a in ("-h", "--help") for a in args):
            command = self.commands[named]
            rest = args[args.index(named) + 1 :]
            if isinstance(command, click.Group) and rest and rest[0] in command.commands:
                inner = command.make_context(named, [], parent=ctx, resilient_parsing=True)
                command.commands[rest[0]].make_context(rest[0], ["--help"], parent=inner)
            command.make_context(named, ["--help"], parent=ctx)  # exits
        if args and args[0] in self.commands and not Path(args[0]).exists():
            raise click.UsageError(
                f"name the database first: sqlsdc budget DB {args[0]} [OPTIONS]", ctx
            )
        if not (len(args) >= 2 and args[1] in self.commands):
            ctx.allow_interspersed_args = True
        return super().parse_args(ctx, args)


@click.group(cls=_BudgetGroup, invoke_without_command=True)
@click.argument("db", type=ExistingFile())
@click.option(
    "--for",
    "--user",
    "-u",
    "who",
    help="Only the budgets that apply to this user; --user is the older spelling.",
)
@click.option("--history", is_flag=True, help="List the grants and resets (the audit trail).")
@click.option("--ledger", "show_ledger", is_flag=True, help="List the charges, newest first.")
@click.option("--limit", type=click.IntRange(1, MAX_LEDGER), metavar="N",
              help=f"With --ledger: the newest N charges (default {LEDGER_ROWS}; a note on "
              "stderr says when there are more).")  # fmt: skip
@format_option(choices=("table", "json"))
@click.pass_context
def budget(
    ctx, db: str, who: str | None, history: bool, show_ledger: bool, limit: int | None, fmt: str
) -> None:
    """Privacy budgets: limit, spent and remaining per user and table.

    A row's user or table '*' means all users or all tables: (alice, *) bounds what alice
    spends over all tables, (*, persons) what all users together spend on persons. Every
    budget that applies to a query must allow it; a kind (ε, ρ, or the δ of private group
    selection) that no budget bounds cannot be spent at all. Empty limits mean "not limited by
    this row". The policy's cell limits (cells of the other methods per period) are under
    `cells` (admins only): `sqlsdc budget DB cells --help`.

    \b
    Examples:
      sqlsdc budget demo.duckdb
      sqlsdc budget demo.duckdb --for analyst --format json
      sqlsdc budget demo.duckdb grant --for analyst --epsilon 1 --reason "Q3 study" --as admin
      sqlsdc budget demo.duckdb grant --for analyst --delta 1e-6 --reason "..." --as admin
      sqlsdc budget demo.duckdb set --for analyst --table benefits --epsilon 5 --reason "..."
      sqlsdc budget demo.duckdb reset --for analyst --reason "new quarter" --as admin
      sqlsdc budget demo.duckdb cells --for analyst --as admin
    """
    ctx.obj = {"db": db}
    if ctx.invoked_subcommand is not None:
        return
    if history and show_ledger:
        raise click.UsageError("--history and --ledger are two listings: give one")
    if limit is not None and not show_ledger:
        raise click.UsageError("--limit is for --ledger (the charges)")
    from sqlsdc.catalog import budget as ledger
    from sqlsdc.catalog import budget_admin, store
    from sqlsdc.policy import load_policy

    con = _open_with_catalog(db, read_only=True)
    try:
        if history:
            rows = _amounts(budget_admin.budget_events(con, user=who))
        elif show_ledger:
            limit = limit or LEDGER_ROWS
            rows = _amounts(budget_admin.spend_ledger(con, user=who, limit=limit + 1))
            more = len(rows) > limit  # it showed the newest 100 without a word (new user s39)
            rows = rows[:limit]
        else:
            _version, document, source = store.current_policy(con)
            policy = load_policy(document, name=source)
            if who is not None and who != ledger.ALL and policy.user(who) is None:
                known = ", ".join(sorted(policy.users)) or "none"  # a row was made up for it
                raise click.BadParameter(  # a user revoked: where its record is (new user s39)
                    f"{who!r} is not a user of the policy in force ({known}); what a former "
                    f"user was charged and granted: --ledger --for {who} and --history --for "
                    f"{who}",
                    param_hint="--for",
                )
            limits = ledger.policy_limits(policy)
            rows = _rows(ledger.budget_status(con, limits, user=who))
    finally:
        con.close()
    if show_ledger and more:
        click.echo(f"sqlsdc: the newest {limit} charges; --limit N for more", err=True)
    if fmt == "json":
        print_json(rows)
        return
    import pandas as pd  # the table's layout; not for JSON

    if history or show_ledger:
        print_frame(pd.DataFrame(rows), fmt)
    else:
        frame = pd.DataFrame(rows, columns=list(STATUS_COLUMNS))
        print_frame(frame.astype(object).where(frame.notna(), "-"), fmt)


def _target(policy, user: str | None, table: str | None) -> ledger.BudgetKey:
    from sqlsdc.catalog import budget as ledger

    if user is None and table is None:
        raise click.UsageError("name the budget: --user NAME and/or --table NAME ('*' = all)")
    user, table = user or ledger.ALL, (table or ledger.ALL).lower()
    if user != ledger.ALL and policy.user(user) is None:
        known = ", ".join(sorted(policy.users)) or "none"
        raise click.BadParameter(f"{user!r} is not a user of the policy in force ({known})",
                                 param_hint="--for")  # fmt: skip
    if table != ledger.ALL and policy.declared(table).is_public:  # not declared: not found (8)
        known = ", ".join(t.name for t in policy.confidential_tables) or "none"
        raise Error(f"{table!r} is a public table: no budget applies to it (the confidential "
                    f"tables: {known})")  # fmt: skip
    return ledger.BudgetKey(user, table)


def _not_dp(policy, key: ledger.BudgetKey) -> str | None:
    """A note when ``key`` names a table that is not under differential privacy: its queries
    spend no budget, only DP syntheses of it (``sqlsdc synthesize --epsilon``) do. A grant to
    (alice, persons) on a CKM table answered about budget layering only (new user s39)."""
    from sqlsdc.catalog import budget as ledger

    table = None if key.table == ledger.ALL else policy.table(key.table)
    if table is None or table.differentially_private:
        return None
    return (f"table {table.name!r} is not under differential privacy in the policy in force: "
            "its queries spend no budget; only differentially private syntheses of it "
            "(`sqlsdc synthesize --epsilon`) do")  # fmt: skip


def _unspent(policy, key: ledger.BudgetKey, amounts: dict) -> str | None:
    """A note when ``amounts`` give ρ or δ that no table ``key`` covers is charged under the
    policy in force: the limit is recorded (it bounds that kind if a later policy version
    spends it) and allows nothing now. `grant --rho` on the demo, whose DP table spends ε
    only, printed "rho: limit none -> 1" as if analysts could now spend ρ (new user s44g). ε
    is never noted: DP syntheses (`sqlsdc synthesize --epsilon`) spend it on any table."""
    from sqlsdc.catalog import budget as ledger

    every = key.table == ledger.ALL
    tables = policy.confidential_tables if every else [policy.table(key.table)]
    spent = set().union(*(t.budget_kinds for t in tables))
    unspent = " or ".join(k for k in ("rho", "delta") if amounts.get(k) and k not in spent)
    if not unspent:
        return None
    what = f"no table spends {unspent}" if every else f"table {key.table!r} spends no {unspent}"
    how = {"rho": "`spend: {rho: ...}`", "delta": "`groups: private`"}
    ways = " or ".join(how[k] for k in unspent.split(" or "))
    return (
        f"{what} under the policy in force: the limit is recorded but allows nothing until "
        f"a policy version spends it ({ways})"
    )


def _admin_session(db: str, admin: str):
    """A read-write connection to ``db`` (the one opened to find the acting admin, when it
    was: the file is opened once) and the policy in force, ``admin`` checked."""
    from sqlsdc.admin import require_admin
    from sqlsdc.catalog import store
    from sqlsdc.policy import load_policy

    con = opened()
    if con is None:
        con = _open_with_catalog(db, read_only=False)
    elif store.current_policy(con) is None:
        raise store.no_catalog(db, con)
    try:
        current = require_admin(con, admin)
    except BaseException:
        con.close()
        raise
    return con, load_policy(current[1], name=current[2])


def _amount(text: str | None, name: str, *, zero: bool = False) -> Fraction | None:
    """An amount in the range a policy's budget may have (``parse_amount``; δ below 1)."""
    from sqlsdc.catalog.budget_admin import parse_amount

    try:
        return parse_amount(text, name, zero=zero)
    except (TypeError, ValueError) as e:
        raise click.BadParameter(str(e), param_hint=f"--{name}") from None


def _reason(_ctx, _param, text: str) -> str:
    """A blank --reason is a usage error here (the ledger refuses it: reported as a bug)."""
    if not text.strip():
        raise click.BadParameter("say why (it is kept in the audit trail)")
    return text


_target_options = [
    click.option(
        "--for",
        "--user",
        "-u",
        "user",
        help="User whose budget changes ('*' = all users); --user is the older spelling.",
    ),
    click.option("--table", "-t", "table", help="Table whose budget changes ('*' = all tables)."),
    click.option(
        "--reason", required=True, callback=_reason, help="Why (kept in the audit trail)."
    ),
    acting_admin_option("--as", "--admin", "admin", writes=True),
    format_option(choices=("table", "json")),
]


def _status(con, policy, key: ledger.BudgetKey) -> ledger.BudgetStatus:
    from sqlsdc.catalog import budget as ledger
    from sqlsdc.mechanisms.accountant import PrivacyCost

    statuses = ledger.budget_status(con, ledger.policy_limits(policy))
    found = [s for s in statuses if s.key == key]
    if found:
        return found[0]
    none = ledger.BudgetLimit()
    return ledger.BudgetStatus(key, none, PrivacyCost(), none)


def _change(
    before: ledger.BudgetStatus, after: ledger.BudgetStatus, *, spent: bool = False
) -> list[str]:
    """One line per kind that changed: limit and remaining, before -> after, and with
    ``spent`` (a reset) what was spent. A reset of a budget whose limit left nothing (spent
    0.3 of a limit set to 0) changes what was spent, not what remains: it said "nothing was
    spent" (new user s39). A grant or set shows no spending: a budget row it creates counts
    earlier charges, which that does not change."""
    lines = []
    for kind in KINDS:
        old = [getattr(s, kind) for s in (before.limit, before.spent, before.remaining)]
        new = [getattr(s, kind) for s in (after.limit, after.spent, after.remaining)]
        if not spent:
            old[1] = new[1]
        if old != new:
            show = [[_decimal(x) if x is not None else "none" for x in v] for v in (old, new)]
            paid = f"; spent {show[0][1]} -> {show[1][1]}" if old[1] != new[1] else ""
            lines.append(
                f"  {kind}: limit {show[0][0]} -> {show[1][0]}{paid}; "
                f"remaining {show[0][2]} -> {show[1][2]}"
            )
    return lines


def _report(
    fmt: str,
    action: str,
    seq: int,
    key: ledger.BudgetKey,
    amounts: dict,
    before: ledger.BudgetStatus,
    after: ledger.BudgetStatus,
    text: str,
    unchanged: str,
    note: str | None,
) -> None:
    """What a grant, set or reset did: a line and the changes, or with --format json one
    object: the event, the budget, the amounts given, its state before and after and notes
    (:func:`_not_dp`; on stderr in a table)."""
    if fmt == "json":
        print_json({
            "action": action, "event": seq, "user": key.user, "table": key.table,
            **{kind: _decimal(amounts.get(kind)) for kind in KINDS},
            "before": _state(before), "after": _state(after), "notes": [note] if note else [],
        })  # fmt: skip
        return
    click.echo(text)
    for line in _change(before, after, spent=action == "reset") or [unchanged]:
        click.echo(line)
    if note:
        click.echo(f"  note: {note}", err=True)


def _state(status: ledger.BudgetStatus) -> dict:
    """A budget's limit, spent and remaining per kind, as ``sqlsdc budget --format json``."""
    row = _rows([status])[0]
    return {k: v for k, v in row.items() if k not in ("user", "table")}


def _given(amounts: dict) -> str:
    """``epsilon 1/3, delta 0.000001``: the amounts given, in the listings' spelling."""
    return ", ".join(f"{k} {_decimal(v)}" for k, v in amounts.items() if v is not None)


def _with_target_options(f):
    for option in reversed(_target_options):
        f = option(f)
    return f


@budget.command()
@_with_target_options
@click.option("--epsilon", help="ε to add (exact: 1, 0.5 or 1/3).")
@click.option("--rho", help="ρ (zCDP) to add (exact: 1, 0.5 or 1/3).")
@click.option("--delta", help="δ of private group selection to add (exact, below 1: 1e-6).")
@click.pass_obj
def grant(obj, user, table, reason, admin, fmt, epsilon, rho, delta) -> None:
    """Raise a budget by ε, ρ and/or δ (admins only; recorded with who, when and why).

    A budget with no limit of a kind of its own ("none") gets one of the amount granted: as a
    kind that no budget bounds cannot be spent, this allows spending it, within every other
    budget that applies. A table that is not under differential privacy is noted as such (its
    queries spend no budget, only DP syntheses of it do), and so is a ρ or δ that no table
    covered spends under the policy in force: the limit is recorded and allows nothing until a
    policy version spends that kind.

    \b
    Examples:
      sqlsdc budget demo.duckdb grant --for analyst --epsilon 1 --reason "Q3 study"
      sqlsdc budget demo.duckdb grant --for analyst --delta 1e-6 --reason "private groups"
    """
    from sqlsdc.catalog import budget as ledger
    from sqlsdc.catalog import budget_admin
    from sqlsdc.mechanisms.accountant import PrivacyCost  # not at start-up: 12 ms of --help

    eps, r = _amount(epsilon, "epsilon"), _amount(rho, "rho")
    d = _amount(delta, "delta")
    if eps is None and r is None and d is None:
        raise click.UsageError("give --epsilon, --rho and/or --delta")
    added = PrivacyCost(eps or 0, r or 0, d or 0)
    con, policy = _admin_session(obj["db"], admin)
    try:
        key = _target(policy, user, table)
        before = _status(con, policy, key)
        note = _not_dp(policy, key) or _unspent(policy, key, {"rho": r, "delta": d})
        try:
            seq = budget_admin.grant(con, admin=admin, key=key, cost=added, reason=reason,
                                     limits=ledger.policy_limits(policy))  # fmt: skip
        except ValueError as e:
            raise Error(f"{note}. {e}" if note else str(e)) from None
        after = _status(con, policy, key)
    finally:
        con.close()
    amounts = {"epsilon": eps, "rho": r, "delta": d}
    text = f"granted {_given(amounts)} to {key.describe()} (event {seq})"
    _report(fmt, "grant", seq, key, amounts, before, after, text, "  unchanged", note)


@budget.command(name="set")
@_with_target_options
@click.option("--epsilon", help="The ε limit (exact: 5, 0.5 or 1/3; 0 forbids ε spending).")
@click.option("--rho", help="The ρ (zCDP) limit (exact).")
@click.option("--delta", help="The δ limit of private group selection (exact, below 1).")
@click.pass_obj
def set_limit(obj, user, table, reason, admin, fmt, epsilon, rho, delta) -> None:
    """Set a budget's own limit of ε, ρ and/or δ (admins only; recorded with who, when, why).

    This gives a user an allowance of their own under a shared budget, e.g. analyst at ε 5 on
    benefits under the (*, benefits) budget of 50, which `grant` refuses (a grant there would
    cut the shared allowance). Every budget that applies must allow a query, so the shared
    budget still binds. Kinds not given keep their limit; later grants add to the new limit.

    \b
    Example:
      sqlsdc budget demo.duckdb set --for analyst -t benefits --epsilon 5 --reason "pilot"
    """
    from sqlsdc.catalog import budget_admin
    from sqlsdc.mechanisms.accountant import BudgetLimit

    if user is None:
        raise click.UsageError("name whose limit to set: --for USER ('*' = all users)")
    amounts = {
        "epsilon": _amount(epsilon, "epsilon", zero=True),
        "rho": _amount(rho, "rho", zero=True),
        "delta": _amount(delta, "delta", zero=True),
    }
    if all(v is None for v in amounts.values()):
        raise click.UsageError("give --epsilon, --rho and/or --delta")
    con, policy = _admin_session(obj["db"], admin)
    try:
        key = _target(policy, user, table)
        before = _status(con, policy, key)
        note = _not_dp(policy, key) or _unspent(policy, key, amounts)
        try:
            seq = budget_admin.set_limit(con, admin=admin, key=key, reason=reason,
                                         limit=BudgetLimit(**amounts))  # fmt: skip
        except ValueError as e:
            raise Error(f"{note}. {e}" if note else str(e)) from None
        after = _status(con, policy, key)
    finally:
        con.close()
    _report(fmt, "set", seq, key, amounts, before, after,
            f"set the limit of {key.describe()} to {_given(amounts)} (event {seq})",
            "  unchanged: the limit was already that", note)  # fmt: skip


@budget.command()
@_with_target_options
@click.pass_obj
def reset(obj, user, table, reason, admin, fmt) -> None:
    """Start a budget's spending afresh (admins only; recorded with who, when and why).

    Only the named budget is reset: resetting (alice, *) leaves (*, persons) as it was. The
    ledger keeps every charge, so the total privacy loss stays visible.

    \b
    Example:
      sqlsdc budget demo.duckdb reset --for analyst --reason "new quarter"
    """
    from sqlsdc.catalog import budget_admin

    con, policy = _admin_session(obj["db"], admin)
    try:
        key = _target(policy, user, table)
        before = _status(con, policy, key)
        seq = budget_admin.reset(con, admin=admin, key=key, reason=reason)
        after = _status(con, policy, key)
        note = _not_dp(policy, key)
    finally:
        con.close()
    _report(fmt, "reset", seq, key, {}, before, after,
            f"reset the spending of {key.describe()} (event {seq}); limits unchanged",
            "  nothing was spent: remaining unchanged", note)  # fmt: skip


def _cells():
    from sqlsdc.cli.budget_cells import cells  # the cell limits' commands, beside the budgets'

    budget.add_command(cells)


_cells()
COMMANDS = (budget,)
