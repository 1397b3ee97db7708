"""Administrators' changes of privacy budgets, and the listings of the budget tables.

A grant raises a key's limit, a set gives it a limit of its own, a reset starts its spending
afresh; each is recorded in ``budget_events`` with who, when and why, in a transaction of its
own that bumps the write counter (:func:`sqlsdc.catalog.budget_tables.bump`), so no charge
reuses limits read before it (:class:`sqlsdc.catalog.budget.BudgetState`). The listings
(:func:`budget_events`, :func:`spend_ledger`, :func:`charged_by_query`) read the events and the
ledger for ``sqlsdc budget`` and ``sqlsdc audit``; :func:`parse_amount` reads an amount from
the command line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction

from sqlsdc.catalog.budget import ALL, KINDS, BudgetKey, effective_limits
from sqlsdc.catalog.budget_tables import SPEND_COLUMNS, S, bump, delta_of
from sqlsdc.catalog.store import ensure_catalog, now
from sqlsdc.engines.duckdb import one, rollback
from sqlsdc.mechanisms.accountant import BudgetLimit, PrivacyCost, fraction
from sqlsdc.policy.validate import AMOUNT_RANGES

__all__ = [
    "budget_events",
    "charged_by_query",
    "grant",
    "parse_amount",
    "reset",
    "set_limit",
    "spend_ledger",
]


def _recorded(con, admin: str, action: str, reason: str, record) -> int:
    """Run ``record`` (which checks the change and writes it with :func:`_event`) in one
    transaction; its event's seq. The catalog is brought up to date first (older catalogs:
    their event table learns the 'set' action)."""
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(f"a budget {action} needs a reason (it is kept in the audit trail)")
    if not isinstance(admin, str) or not admin:
        raise ValueError(f"a budget {action} needs the acting administrator's name")
    con.execute("BEGIN TRANSACTION")
    try:
        ensure_catalog(con)
        seq = record()
        con.execute("COMMIT")
    except BaseException:
        rollback(con)
        raise
    return seq


def _text(x: Fraction | None) -> str | None:
    return None if x is None else str(x)


def _event(con, admin: str, action: str, key: BudgetKey, cost, reason: str) -> int:
    """Record a grant (``cost``: the PrivacyCost added), a set (``cost``: the BudgetLimit, None
    for the kinds it leaves) or a reset (``cost`` None), inside the caller's transaction; it
    counts as a write of the budget tables (:func:`~sqlsdc.catalog.budget_tables.bump`), so no
    charge reuses a :class:`~sqlsdc.catalog.budget.BudgetState` read before it."""
    bump(con)
    (seq,) = one(con, f"SELECT nextval('{S}.budget_seq')")
    if isinstance(cost, BudgetLimit):
        amounts = [_text(getattr(cost, kind)) for kind, _symbol in KINDS]
    else:
        amounts = [_text(getattr(cost, kind)) if cost and getattr(cost, kind) else None
                   for kind, _symbol in KINDS]  # fmt: skip
    con.execute(
        f"INSERT INTO {S}.budget_events ({', '.join(_EVENT_COLUMNS)}) VALUES "
        "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [seq, now(), admin, action, key.user, key.table, *amounts, reason.strip()],
    )
    return seq


def grant(
    con,
    *,
    admin: str,
    key: BudgetKey,
    cost: PrivacyCost,
    reason: str,
    limits: Mapping[BudgetKey, BudgetLimit] | None = None,
) -> int:
    """Raise ``key``'s limit by ``cost`` (recorded with who, when and why); returns its seq.

    A grant only ever adds to an allowance. A kind that ``key`` does not limit yet would get a
    new limit of just the grant; when another budget already bounds that kind for the same
    users or tables (e.g. ``(*, *)`` with 48.8 left), that new limit would cut the allowance
    (to 0.8 after 1.2 spent), so the grant is refused and names the budget to grant to.
    ``limits``: the policy's limits (grants in the catalog are added). The caller checks that
    ``admin`` is an administrator (the CLI does).
    """
    if cost.is_zero:
        raise ValueError("a grant needs a positive epsilon, rho or delta")
    if cost.delta >= 1:
        raise ValueError(f"a delta grant must be below 1 (delta 1 allows anything): {cost.delta}")
    return _recorded(con, admin, "grant", reason,
                     lambda: _grant(con, admin, key, cost, reason, limits))  # fmt: skip


def _grant(con, admin: str, key: BudgetKey, cost: PrivacyCost, reason: str, limits) -> int:
    lims = effective_limits(con, limits)
    own = lims.get(key, BudgetLimit())
    _check_ceiling(key, {kind: (getattr(own, kind) or 0) + getattr(cost, kind)
                         for kind, _symbol in KINDS if getattr(cost, kind)})  # fmt: skip
    for kind, symbol in KINDS:
        if not getattr(cost, kind) or getattr(lims.get(key, BudgetLimit()), kind) is not None:
            continue
        bounded = [k for k, lim in lims.items() if getattr(lim, kind) is not None]
        binding = sorted(k for k in bounded if k != key and _overlap(k, key))
        if binding:
            names = "; ".join(k.describe() for k in binding)
            raise ValueError(
                f"{key.describe()} has no {symbol} budget of its own; its {symbol} is bounded by "
                f"{names}. A grant here would create a new, smaller limit of {getattr(cost, kind)} "
                "instead of adding to the allowance; grant to that budget instead, or give "
                "this one a limit of its own with `sqlsdc budget DB set`"
            )
    return _event(con, admin, "grant", key, cost, reason)


def set_limit(con, *, admin: str, key: BudgetKey, limit: BudgetLimit, reason: str) -> int:
    """Set ``key``'s own limit of the kinds ``limit`` bounds (recorded with who, when and why,
    like grants); returns its seq.

    This is how an allowance of its own is given under a shared budget (e.g. analyst at ε 5
    under ``(*, benefits)`` at 50), which a grant refuses because it would cut the shared
    allowance. Every budget that applies to a query must still allow it, so a limit set above a
    shared one is not spendable beyond the shared one. Later grants add to the limit set.
    """
    if all(getattr(limit, kind) is None for kind, _symbol in KINDS):
        raise ValueError("a budget set needs an epsilon, rho or delta limit")
    if limit.delta is not None and limit.delta >= 1:
        raise ValueError(f"a delta limit must be below 1 (delta 1 allows anything): {limit.delta}")
    _check_ceiling(key, {kind: getattr(limit, kind) for kind, _symbol in KINDS})
    return _recorded(con, admin, "set", reason,
                     lambda: _event(con, admin, "set", key, limit, reason))  # fmt: skip


def _check_ceiling(key: BudgetKey, limits: Mapping[str, Fraction | None]) -> None:
    """A grant or set leaves every limit within what a policy's budget may allow
    (``sqlsdc.policy.validate.AMOUNT_RANGES``): a limit no policy would validate is no limit."""
    for kind, symbol in KINDS:
        value = limits.get(kind)
        ceiling = AMOUNT_RANGES[f"budget {kind}"][1]
        if value is not None and kind != "delta" and value > ceiling:
            raise ValueError(
                f"{key.describe()}: the {symbol} limit would be {_decimal(value)}, above "
                f"{_decimal(ceiling)}, the most a budget may allow (as in a policy)"
            )


def _decimal(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"


def _overlap(a: BudgetKey, b: BudgetKey) -> bool:
    """Whether some query is covered by both budgets."""
    return (ALL in (a.user, b.user) or a.user == b.user) and (
        ALL in (a.table, b.table) or a.table == b.table
    )


def reset(con, *, admin: str, key: BudgetKey, reason: str) -> int:
    """Start ``key``'s spending afresh: what it covered so far no longer counts against it.

    Resetting gives analysts new budget over the same data; their total privacy loss is the sum
    over all periods (the ledger keeps every charge). Returns the event's seq.
    """
    return _recorded(con, admin, "reset", reason,
                     lambda: _event(con, admin, "reset", key, None, reason))  # fmt: skip


_EVENT_COLUMNS = ("seq", "event_at", "admin", "action", "user_name", "table_name", "epsilon",
                  "rho", "delta", "reason")  # fmt: skip


def _select(columns: tuple[str, ...], delta: str) -> str:
    return ", ".join(f"{delta} AS delta" if c == "delta" else c for c in columns)


def budget_events(con, *, user: str | None = None) -> list[dict]:
    """The audit trail of grants and resets, oldest first."""
    delta = delta_of(con)
    if delta is None:
        return []
    where, params = ("WHERE user_name IN (?, '*')", [user]) if user else ("", [])
    rows = con.execute(
        f"SELECT {_select(_EVENT_COLUMNS, delta)} FROM {S}.budget_events {where} ORDER BY seq",
        params,
    ).fetchall()
    return [dict(zip(_EVENT_COLUMNS, r, strict=True)) for r in rows]


def spend_ledger(con, *, user: str | None = None, limit: int = 100) -> list[dict]:
    """The newest charges first."""
    delta = delta_of(con)
    if delta is None:
        return []
    where, params = ("WHERE user_name = ?", [user]) if user else ("", [])
    rows = con.execute(
        f"SELECT {_select(SPEND_COLUMNS, delta)} FROM {S}.budget_spend {where} "
        "ORDER BY seq DESC LIMIT ?",
        [*params, limit],
    ).fetchall()
    return [dict(zip(SPEND_COLUMNS, r, strict=True)) for r in rows]


def charged_by_query(con, query_ids: Iterable[int]) -> dict[int, PrivacyCost]:
    """What the ledger charged each of ``query_ids`` (the audit log's ids), summed over its
    charges; ids with no charge (not a DP query, refused, or every cell already released) are
    absent. ``sqlsdc audit`` shows it beside each entry: the log did not say what a query
    cost (new user s39)."""
    ids = sorted(set(query_ids))
    delta = delta_of(con)
    if not ids or delta is None:
        return {}
    rows = con.execute(
        f"SELECT query_id, epsilon, rho, {delta} FROM {S}.budget_spend "
        "WHERE list_contains(?, query_id)",
        [ids],
    ).fetchall()
    charged: dict[int, PrivacyCost] = {}
    for query_id, *amounts in rows:
        cost = PrivacyCost(*map(Fraction, amounts))
        charged[query_id] = charged.get(query_id, PrivacyCost()) + cost
    return charged


def parse_amount(text: str | None, name: str, *, zero: bool = False) -> Fraction | None:
    """A budget amount from the command line ("1", "0.5", "1/3"); None if not given. Amounts
    are positive and at least the smallest budget a policy may give (``AMOUNT_RANGES``: a
    grant of rho 1e-400 was taken, changed nothing a query can spend, and left a 400-digit
    limit in every listing); with ``zero`` (a limit, not a grant) 0 is allowed too."""
    if text is None:
        return None
    value = fraction(text, name)
    if value < 0 or (value == 0 and not zero):
        raise ValueError(f"{name} must be {'>=' if zero else '>'} 0, got {text}")
    floor, ceiling, reached = AMOUNT_RANGES[f"budget {name}"]
    if 0 < value < floor:
        raise ValueError(
            f"{name} must be 0 or at least {_decimal(floor)}, got {text}"
            if zero
            else f"{name} must be at least {_decimal(floor)}, got {text}"
        )
    if value > ceiling or (value == ceiling and not reached):  # not 1e400 echoed in 401 digits
        raise ValueError(
            f"{name} must be at most {_decimal(ceiling)}, the most a budget may allow, got {text}"
            if reached
            else f"{name} must be below {_decimal(ceiling)}, got {text}"
        )
    return value
