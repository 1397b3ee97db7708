"""Administrators' grants of cells and resets of the policy's cell limits, and their listing.

``sqlsdc budget DB cells grant|reset`` (:mod:`sqlsdc.cli.budget_cells`) calls these. A grant
adds cells to one limit for its current period only; a reset starts one limit's period afresh
(the use counted from now, the period's grants and a refusal's end dropped; cells released
before stay free, as the entries are kept). Each writes one row of ``cell_limit_events`` (who,
when, why; numbered with the budget events) in a transaction that also updates the use's lock
row (:func:`sqlsdc.catalog.cell_limits.lock_use`): a query of that user counting new cells at
the same time conflicts and is run again after it, so neither reads the other half-done (a
charge started before a reset would otherwise write its cells before the reset's time, and
they would not count). The lasting limits are the policy's: a grant never changes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlsdc.catalog import cell_limits
from sqlsdc.catalog.budget import is_conflict
from sqlsdc.catalog.cell_grants import EVENTS, S, events_present, holder
from sqlsdc.catalog.store import ensure_catalog, now
from sqlsdc.engines import duckdb as engine
from sqlsdc.errors import Error, OperationalError
from sqlsdc.policy import CellLimit, Policy

MAX_CELLS = 1_000_000_000  # the most a policy's limit may allow (policy.schema.json)
RETRIES = 20  # a transaction conflicting with a concurrent charge is run again


@dataclass(frozen=True)
class Change:
    """One event: its number, the limit, and the limit's use before and after it."""

    seq: int
    user: str
    limit: CellLimit
    before: cell_limits.Usage
    after: cell_limits.Usage


def describe(limit: CellLimit, user: str) -> str:
    """``user 'analyst' on table 'persons' per day`` (all users together / all tables)."""
    who = "all users together" if holder(limit, user) == "*" else f"user {user!r}"
    table = "all tables" if limit.table == "*" else f"table {limit.table!r}"
    return f"{who} on {table} per {limit.per}"


def targets(policy: Policy, user: str, table: str | None = None,
            per: str | None = None) -> tuple[CellLimit, ...]:  # fmt: skip
    """The limits of ``policy`` whose use ``user`` holds (``*``: the limits of all users
    together; a user's own otherwise), on ``table`` and per ``per`` when given. Raises
    :class:`~sqlsdc.errors.Error` naming the limits there are when none matches."""
    if not policy.cell_limits:
        raise Error("the policy in force has no cell limits (`cell_limits`): there is nothing "
                    "to grant or reset; a policy version with them sets them")  # fmt: skip
    own = [lim for lim in policy.cell_limits if lim.user == user]
    table = None if table is None else table.lower()
    found = tuple(lim for lim in own if (table is None or lim.table == table)
                  and (per is None or lim.per == per))  # fmt: skip
    if found:
        return found
    whose = (
        "there is no cell limit of all users together"
        if user == "*"
        else f"user {user!r} has no cell limit of their own"
    )
    wanted = "".join([f" on table {table!r}" if table else "", f" per {per}" if per else ""])
    listed = "; ".join(f"{describe(lim, lim.user)}: {lim.cells:,} cells"
                       for lim in policy.cell_limits)  # fmt: skip
    together = user != "*" and any(lim.user == "*" for lim in policy.cell_limits)
    shared = " (a limit of all users together: --for '*')" if together else ""
    raise Error(f"{whose}{wanted} in the policy in force; its cell limits: {listed}{shared}")


def _usage(con, policy: Policy, user: str, limit: CellLimit, at: datetime) -> cell_limits.Usage:
    return next(u for u in cell_limits.usage(con, policy, user, at) if u.limit == limit)


def _recorded(con, policy: Policy, user: str, limit: CellLimit,
              write: Callable[[cell_limits.Usage, datetime], int]) -> Change:  # fmt: skip
    """Run ``write`` (the event's insert, given the use before and the time) with the lock row
    updated, in one transaction, run again if a concurrent charge conflicts."""
    for attempt in range(RETRIES):
        con.execute("BEGIN TRANSACTION")
        try:
            ensure_catalog(con)
            at = now()
            before = _usage(con, policy, user, limit, at)
            cell_limits.lock_use(con, holder(limit, user), at)
            seq = write(before, at)
            con.execute("COMMIT")
        except (engine.duckdb.TransactionException, engine.duckdb.ConstraintException) as e:
            engine.rollback(con)  # the lock row written by a concurrent charge first
            if not is_conflict(e):
                raise
            if attempt + 1 == RETRIES:
                raise OperationalError(
                    f"{describe(limit, user)}: queries counting cells kept it busy for "
                    f"{RETRIES} tries; nothing was changed, run the command again"
                ) from None
            time.sleep(0.005 * (attempt + 1))  # about 1 s in all
            continue
        except BaseException:
            engine.rollback(con)
            raise
        return Change(seq, user, limit, before, _usage(con, policy, user, limit, now()))
    raise AssertionError("unreachable")


def _event(con, admin: str, action: str, user: str, limit: CellLimit, start: datetime,
           cells: int, reason: str, at: datetime) -> int:  # fmt: skip
    (seq,) = engine.one(con, f"SELECT nextval('{S}.budget_seq')")
    con.execute(
        f"INSERT INTO {S}.{EVENTS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [seq, at, admin, action, holder(limit, user), limit.table, limit.per, start, cells,
         reason.strip()],
    )  # fmt: skip
    return seq


def _checked(admin: str, reason: str, action: str) -> None:
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(f"a cell {action} needs a reason (it is kept in the audit trail)")
    if not isinstance(admin, str) or not admin:
        raise ValueError(f"a cell {action} needs the acting administrator's name")


def grant(con, policy: Policy, *, admin: str, user: str, limit: CellLimit, cells: int,
          reason: str) -> Change:  # fmt: skip
    """Grant ``cells`` more to ``limit`` as it binds ``user`` (``*``: all users together), for
    its current period only. The caller checks that ``admin`` is an administrator."""
    _checked(admin, reason, "grant")
    if isinstance(cells, bool) or not isinstance(cells, int) or cells < 1:
        raise ValueError(f"a cell grant must be a whole number of cells, at least 1: {cells!r}")

    def write(before: cell_limits.Usage, at: datetime) -> int:
        if limit.cells + before.granted + cells > MAX_CELLS:
            total = limit.cells + before.granted + cells
            raise Error(f"{describe(limit, user)}: the limit would be {total:,} cells this "
                        f"{limit.per}, above {MAX_CELLS:,}, the most a limit may allow (as in "
                        "a policy)")  # fmt: skip
        return _event(con, admin, "grant", user, limit, before.start, cells, reason, at)

    return _recorded(con, policy, user, limit, write)


def reset(con, policy: Policy, *, admin: str, user: str, limits, reason: str) -> list[Change]:
    """Start each of ``limits`` (as it binds ``user``) afresh in its current period: its use
    counted from now, its grants and a refusal's end dropped; one event each (``cells``: the
    use it cleared). The caller checks that ``admin`` is an administrator."""
    _checked(admin, reason, "reset")
    changes = []
    for limit in limits:

        def write(before: cell_limits.Usage, at: datetime, limit=limit) -> int:
            return _event(con, admin, "reset", user, limit, before.start, before.used, reason,
                          at)  # fmt: skip

        changes.append(_recorded(con, policy, user, limit, write))
    return changes


EVENT_COLUMNS = ("seq", "event_at", "admin", "action", "user_name", "limit_table", "per",
                 "period_start", "cells", "reason")  # fmt: skip


def events(con, *, user: str | None = None) -> list[dict]:
    """The grants and resets of cell limits, oldest first (``user``: of that user's own limits
    and of those of all users together)."""
    if not events_present(con):
        return []
    where, params = ("WHERE user_name IN (?, '*')", [user]) if user else ("", [])
    rows = con.execute(
        f"SELECT {', '.join(EVENT_COLUMNS)} FROM {S}.{EVENTS} {where} ORDER BY seq", params
    ).fetchall()
    return [dict(zip(EVENT_COLUMNS, r, strict=True)) for r in rows]
