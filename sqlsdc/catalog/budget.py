"""Privacy budgets in the catalog: limits, grants and resets, the enforced spend ledger, and the
cache of DP cells already released.

Budgets are kept per :class:`BudgetKey` ``(user, table)``, where ``'*'`` means "all": ``(alice,
*)`` bounds what alice spends over all tables, ``(*, persons)`` what all users together spend on
``persons`` (what colluding analysts learn about its units), ``(alice, persons)`` both at once.
A query by user U on tables T is charged against every key that applies to it: ``(U, *)``,
``(*, *)`` and, for each t in T, ``(U, t)`` and ``(*, t)``.

Limits come from two places: the ``limits`` argument (the policy's budgets, supplied by the
caller) and administrators' grants and sets stored in ``sqlsdc.budget_events``; a key's limit
is the policy limit plus every grant for that key, where a set replaces it (for the kinds it
names) at that point. Three kinds are limited separately: epsilon, rho and
delta (spent by private group selection; deltas add up by basic composition, Dwork and Roth
2014, Theorem 3.16). A limit of ``None`` for a kind means the key does not constrain that kind,
but every kind a query spends must be bounded by at least one applicable limit: a database
without budgets spends nothing, and a query with a delta needs a delta budget (fail closed). A
reset starts a key's spending afresh (only that exact key), recorded with who, when and why like
every grant.

Enforcement (:func:`charge`) runs in one transaction: it first updates the single row of
``budget_lock`` (so concurrent charges in one process conflict and are retried one after the
other: DuckDB's first-updater-wins), then reads the limits and what was spent, refuses with
:class:`sqlsdc.errors.BudgetExhausted` if any applicable key would be exceeded, and otherwise
appends one ``budget_spend`` row and the new cells to ``dp_cells``, then commits. The row's
counter counts every write of the budget tables (charges and administrators' events bump it in
their transactions), so a caller's :class:`BudgetState` from its previous charge is reused
while nobody else has written since, instead of reading the events and summing the ledger
again. A guarded connection's charge (no query id, no cells) that its current state allows is
sent as one statement: the bump, the ledger row and the pending audit entry; its decision
stands only if the bump's counter says that nobody wrote since the state, else it is rolled
back and made again from what the transaction reads (one statement's work instead of three).

Crash safety: :func:`charge` returns only after COMMIT, and DuckDB has written the commit to its
write-ahead log by then, so a process killed at any later point (before or while it returns the
result) leaves the spend recorded, with an audit entry that says so (written in the charge's
transaction, replaced by the query's outcome when it is recorded). Callers must therefore charge
*before* handing any noisy value to the user; a process killed before COMMIT has recorded nothing
and returned nothing.

Consistent noise: ``dp_cells`` holds every released DP cell per (user, policy version, cell
hash) with its noisy value, and every *statistic* a user has paid for and been released (the
identity of one statistic over all cells of a canonical population, value 0; see
:func:`sqlsdc.mechanisms.dp_cells.statistic_identity`). The guard charges a query's statistics
that were not paid before *before* it computes any exact cell (:func:`charge`), so a query
that then fails or times out has paid; the cells drawn afterwards are cached with
:func:`~sqlsdc.catalog.dp_cache.cache_cells`, in the transaction that records the query's
answer, and the statistics with them: a query stopped before then pays again when asked again.
:func:`~sqlsdc.catalog.dp_cache.cached_cells` looks both up.

The cache of released DP cells is :mod:`sqlsdc.catalog.dp_cache`; administrators' grants, sets,
resets and the listings are :mod:`sqlsdc.catalog.budget_admin`; the tables themselves
:mod:`sqlsdc.catalog.budget_tables`.

Example:
    >>> import duckdb
    >>> from sqlsdc.catalog.store import ensure_catalog
    >>> con = duckdb.connect(); ensure_catalog(con)
    >>> limits = {BudgetKey("alice"): BudgetLimit(epsilon=Fraction(1))}
    >>> charge(con, user="alice", tables=["persons"], cost=PrivacyCost(epsilon=Fraction(3, 4)),
    ...        query_id=1, limits=limits, sql="SELECT COUNT(*) FROM persons").cost.epsilon
    Fraction(3, 4)
    >>> [s.remaining.epsilon for s in budget_status(con, limits)]
    [Fraction(1, 4)]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction

from sqlsdc.catalog.budget_tables import (
    BUMP,
    SPEND_COLUMNS,
    S,
    bump,
    delta_of,
    ensure_budget_catalog,
    has_budget_tables,
)
from sqlsdc.catalog.dp_cache import cached_cells, insert_cells
from sqlsdc.catalog.store import CHARGED_PENDING, now, pending_entry, record_query
from sqlsdc.engines.duckdb import EngineError, one, parsed, rollback
from sqlsdc.errors import BudgetExhausted, OperationalError
from sqlsdc.mechanisms.accountant import BudgetLimit, PrivacyCost, amount_text
from sqlsdc.mechanisms.dp_cells import CellRecord

__all__ = [
    "ALL",
    "BudgetKey",
    "BudgetState",
    "BudgetStatus",
    "Charge",
    "PolicyChanged",
    "budget_status",
    "charge",
    "effective_limits",
    "has_charge",
    "policy_limits",
    "is_conflict",
    "note_policy",
    "spent",
]

ALL = "*"
_CONFLICT_RETRIES = 20


@dataclass(frozen=True, order=True, slots=True)
class BudgetKey:
    """Whose and which spending a limit bounds; ``'*'`` means all users or all tables."""

    user: str = ALL
    table: str = ALL

    def __post_init__(self) -> None:
        if not isinstance(self.user, str) or not self.user:
            raise ValueError(f"budget user must be a non-empty name or '*', got {self.user!r}")
        if not isinstance(self.table, str) or not self.table:
            raise ValueError(f"budget table must be a non-empty name or '*', got {self.table!r}")
        object.__setattr__(self, "table", self.table.lower())

    def applies_to(self, user: str, tables: Iterable[str]) -> bool:
        return self.user in (ALL, user) and (self.table == ALL or self.table in tables)

    def describe(self) -> str:
        who = "all users" if self.user == ALL else f"user {self.user!r}"
        where = "all tables" if self.table == ALL else f"table {self.table!r}"
        return f"{who} on {where}"


@dataclass(frozen=True, slots=True, repr=False)
class BudgetStatus:
    """One budget that applies to a user: its limit, what was spent and what remains. Shown
    in the amounts every output writes, ``<budget of user 'ana' on all tables: epsilon limit
    2.5, spent 0.5, remaining 2>``: a notebook showed ``Fraction(22, 5)`` (new user s38)."""

    key: BudgetKey
    limit: BudgetLimit
    spent: PrivacyCost
    remaining: BudgetLimit

    def __repr__(self) -> str:
        def text(x: Fraction | None) -> str:
            return "none" if x is None else amount_text(x)

        parts = [
            f"{kind} limit {text(getattr(self.limit, kind))}, spent "
            f"{text(getattr(self.spent, kind))}, remaining {text(getattr(self.remaining, kind))}"
            for kind in ("epsilon", "rho", "delta")
            if getattr(self.limit, kind) is not None or getattr(self.spent, kind)
        ]
        return f"<budget of {self.key.describe()}: {'; '.join(parts) or 'no limit'}>"


@dataclass(frozen=True, slots=True)
class Charge:
    """One row of the spend ledger."""

    seq: int
    query_id: int
    user: str
    tables: tuple[str, ...]
    cost: PrivacyCost
    cells: int
    charged_at: datetime


@dataclass
class BudgetState:
    """What one guarded connection last read of the budget tables: the administrators' events
    (``grants``, ``resets``: :func:`_events`) and what some keys have spent, as of ``writes``,
    the counter of ``budget_lock`` that every charge and every administrator's event bumps in
    its own transaction. A charge whose bump returns ``writes + 1`` knows that nothing was
    written since (its transaction would have conflicted with a write not yet committed), so
    it reuses the state instead of reading the events and summing the ledger, which grows with
    every charge. Any other value (another connection, process or admin wrote) reads afresh.
    Used under the caller's charge lock; a new opening of the file starts a new state."""

    writes: int = 0  # the counter starts at 1: nothing is known yet
    grants: dict[BudgetKey, list] = field(default_factory=dict)
    resets: dict[BudgetKey, int] = field(default_factory=dict)
    spent: dict[BudgetKey, PrivacyCost] = field(default_factory=dict)

    def read(self, con, writes: int, policy_version: int | None = None) -> None:
        """Be the state just before this charge's bump to ``writes``, reading only if needed.
        Raises :class:`PolicyChanged` if a policy other than ``policy_version`` (the caller's,
        whose limits it charges against) was applied since (:func:`note_policy`)."""
        if self.writes and writes == self.writes + 1:
            return
        self.writes = 0  # nothing known while reading: a read that fails (an interrupt) must
        if policy_version is not None:  # not leave old events under a new counter
            check_policy(con, policy_version)
        self.grants, self.resets = _events(con)
        self.spent = {}
        self.writes = writes - 1

    def spent_of(self, con, keys) -> dict[BudgetKey, PrivacyCost]:
        """What each key has spent; keys not known yet are summed from the ledger."""
        missing = [k for k in keys if k not in self.spent]
        if missing:
            self.spent.update(_spent(con, missing, self.resets))
        return {k: self.spent[k] for k in keys}

    def charged(self, writes: int, user: str, tables: tuple[str, ...], row: PrivacyCost) -> None:
        """After the charge that bumped the counter to ``writes`` committed ``row``."""
        self.writes = writes
        for key in self.spent:
            if key.applies_to(user, tables):
                self.spent[key] = self.spent[key] + row


class PolicyChanged(OperationalError):
    """A charge's limits come from a policy that is no longer in force."""


def check_policy(con, policy_version: int) -> None:
    """Raise :class:`PolicyChanged` if a policy other than ``policy_version`` is in force."""
    (current,) = one(con, f"SELECT max(version) FROM {S}.policy_versions")
    if current is not None and current != policy_version:
        raise PolicyChanged(
            f"policy version {current} was applied since this connection read version "
            f"{policy_version}; nothing was charged or run: run the query again"
        )


def note_policy(con) -> None:
    """Count a policy's application as a write of the budget tables (its budgets are limits),
    in the caller's transaction: a connection of this process that read the previous policy
    then learns it at its next charge (:meth:`BudgetState.read`) instead of spending under
    the old limits until it opens the file again."""
    bump(con)


def policy_limits(policy) -> dict[BudgetKey, BudgetLimit]:
    """The limits a policy's ``budgets`` declare (grants in the catalog come on top)."""
    return {
        BudgetKey(b.user, b.table): BudgetLimit(b.epsilon, b.rho, b.delta) for b in policy.budgets
    }


def _cost(eps: str | None, rho: str | None, delta: str | None) -> PrivacyCost:
    return PrivacyCost(Fraction(eps or 0), Fraction(rho or 0), Fraction(delta or 0))


KINDS = (("epsilon", "ε"), ("rho", "ρ"), ("delta", "δ"))
"""The kinds of privacy loss limited separately, with the symbols messages use."""


def _tables(tables: Iterable[str]) -> tuple[str, ...]:
    if isinstance(tables, str):
        tables = [tables]
    names = tuple(sorted({t.lower() for t in tables}))
    if not names or not all(names):
        raise ValueError(f"a charge needs the tables the query reads, got {list(tables)!r}")
    if ALL in names:
        raise ValueError("'*' is not a table name")
    return names


# --- limits and spending ---------------------------------------------------------------------


def _events(con) -> tuple[dict[BudgetKey, list], dict[BudgetKey, int]]:
    """Every key's changes of limit in order (``("grant", PrivacyCost)`` adds to it, ``("set",
    BudgetLimit)`` replaces the kinds it names) and the ``seq`` of its last reset, from one read
    of the (small) table of administrators' events."""
    changes: dict[BudgetKey, list] = {}
    resets: dict[BudgetKey, int] = {}
    delta = delta_of(con)
    if delta is None:
        return changes, resets
    rows = con.execute(
        f"SELECT action, user_name, table_name, epsilon, rho, {delta}, seq "
        f"FROM {S}.budget_events ORDER BY seq"
    ).fetchall()
    for action, user, table, eps, rho, dlt, seq in rows:
        key = BudgetKey(user, table)
        if action == "grant":
            changes.setdefault(key, []).append((action, _cost(eps, rho, dlt)))
        elif action == "set":
            amounts = (None if x is None else Fraction(x) for x in (eps, rho, dlt))
            changes.setdefault(key, []).append((action, BudgetLimit(*amounts)))
        else:
            resets[key] = seq
    return changes, resets


def effective_limits(
    con, limits: Mapping[BudgetKey, BudgetLimit] | None = None
) -> dict[BudgetKey, BudgetLimit]:
    """Every key's limit: the given (policy) limit changed by the administrators' grants and
    sets, in the order they were made."""
    return _with_grants(limits, _events(con)[0])


def _with_grants(limits, changes) -> dict[BudgetKey, BudgetLimit]:
    result = dict(limits or {})
    for key, steps in changes.items():
        limit = result.get(key, BudgetLimit())
        for action, amount in steps:
            limit = limit + amount if action == "grant" else _replaced(limit, amount)
        result[key] = limit
    return result


def _replaced(limit: BudgetLimit, new: BudgetLimit) -> BudgetLimit:
    """``limit`` with the kinds that ``new`` bounds set to ``new``'s values."""
    kinds = [kind for kind, _symbol in KINDS]
    return BudgetLimit(*(getattr(new if getattr(new, k) is not None else limit, k) for k in kinds))


def spent(con, key: BudgetKey) -> PrivacyCost:
    """What the queries ``key`` covers have spent since its last reset."""
    return _spent(con, [key])[key]


def _spent(con, keys: list[BudgetKey], resets=None) -> dict[BudgetKey, PrivacyCost]:
    """:func:`spent` of every key in one statement (``resets``: :func:`_events`' second part,
    read when not given). The ledger is summed in SQL per distinct cost, so exact fractions
    are added once per distinct cost, not once per charge."""
    total = {key: PrivacyCost() for key in keys}
    delta = delta_of(con) if keys else None
    if delta is None:
        return total
    if resets is None:
        resets = _events(con)[1]
    if len(keys) > _KEYS_APART:
        rows = con.execute(
            f"""SELECT k.u, k.t, s.epsilon, s.rho, {delta}, count(*)
            FROM (SELECT unnest(?) AS u, unnest(?) AS t, unnest(?) AS since) AS k,
            {S}.budget_spend s WHERE s.seq > k.since AND (k.u = '*' OR s.user_name = k.u)
            AND (k.t = '*' OR list_contains(s.tables, k.t)) GROUP BY ALL""",
            [[k.user for k in keys], [k.table for k in keys], [resets.get(k, 0) for k in keys]],
        ).fetchall()
        spent_by = [
            (BudgetKey(user, table), eps, rho, dlt, n) for user, table, eps, rho, dlt, n in rows
        ]
    else:
        parts, params = [], []
        for i, key in enumerate(keys):
            where = ["seq > ?"]
            params.append(resets.get(key, 0))
            for column, value in (
                ("user_name = ?", key.user),
                ("list_contains(tables, ?)", key.table),
            ):
                if value != ALL:
                    where.append(column)
                    params.append(value)
            condition = " AND ".join(where)
            parts.append(f"SELECT {i} AS k, epsilon, rho, {delta}, count(*) "
                         f"FROM {S}.budget_spend WHERE {condition} GROUP BY ALL")  # fmt: skip
        rows = con.execute(parsed(" UNION ALL ".join(parts)), params).fetchall()
        spent_by = [(keys[i], eps, rho, dlt, n) for i, eps, rho, dlt, n in rows]
    for key, eps, rho, dlt, n in spent_by:
        total[key] = total[key] + _cost(eps, rho, dlt) * n
    return total


_KEYS_APART = 8
"""Up to this many keys (a charge has at most four), :func:`_spent` sums each with a filter of
its own, in one statement of UNION ALL parts (0.8 ms); more (``sqlsdc budget`` over every
user) are joined with the ledger in one pass, which DuckDB plans slowly (3-7 ms for two keys)."""


def budget_status(
    con,
    limits: Mapping[BudgetKey, BudgetLimit] | None = None,
    *,
    user: str | None = None,
) -> list[BudgetStatus]:
    """Limit, spent and remaining for every key with a limit, and ``(user, *)`` for every user
    who spent something; with ``user``, only the keys that apply to that user."""
    lims = effective_limits(con, limits)
    keys = set(lims)
    if delta_of(con) is not None:
        spenders = con.execute(f"SELECT DISTINCT user_name FROM {S}.budget_spend").fetchall()
        keys |= {BudgetKey(u) for (u,) in spenders}
    if user is not None:
        keys = {k for k in keys if k.user in (ALL, user)}
        keys.add(BudgetKey(user))
    used = _spent(con, sorted(keys))
    out = []
    for key, cost in used.items():
        limit = lims.get(key, BudgetLimit())
        out.append(BudgetStatus(key, limit, cost, limit.remaining(cost)))
    return out


def _refusal(user: str, tables: tuple[str, ...], cost: PrivacyCost, lims, used) -> str | None:
    """Why ``cost`` cannot be spent, or None if every applicable limit allows it."""
    for kind, symbol in KINDS:
        amount = getattr(cost, kind)
        if not amount:
            continue
        bounded = [k for k in lims if getattr(lims[k], kind) is not None]
        if not bounded:
            return (
                f"no {symbol} budget applies to user {user!r} on {', '.join(tables)}, so this "
                f"query's {symbol} = {amount_text(amount)} cannot be spent (fail closed); an "
                "administrator "
                f"can grant one: sqlsdc budget DB grant --for {user} --{kind} AMOUNT --reason ..."
            )
        for key in sorted(bounded):
            limit = getattr(lims[key], kind)
            have = getattr(used[key], kind)
            if have + amount > limit:
                left = max(limit - have, Fraction(0))
                return (
                    f"privacy budget exhausted for {key.describe()}: this query needs "
                    f"{symbol} = {amount_text(amount)} but only {symbol} = {amount_text(left)} "
                    f"remains (limit {amount_text(limit)}, spent {amount_text(have)}); ask for "
                    "cells already released (they cost nothing) or ask "
                    "an administrator for a grant (sqlsdc budget DB grant)"
                )
    return None


def is_conflict(error: Exception) -> bool:
    """A concurrent transaction got there first (retrying is safe)."""
    text = str(error).lower()
    return "conflict" in text or "duplicate key" in text or "constraint violat" in text


def charge(
    con,
    *,
    user: str,
    tables: Iterable[str],
    cost: PrivacyCost,
    query_id: int | None,
    limits: Mapping[BudgetKey, BudgetLimit] | None = None,
    cells: Iterable[CellRecord] = (),
    policy_version: int | None = None,
    state: BudgetState | None = None,
    sql: str,
    fingerprint: str | None = None,
    drawn: Callable[[int], object] | None = None,
) -> Charge | None:
    """Check and record one query's spend, cache its new cells and write its audit entry, in
    one transaction.

    The audit entry (``failed``, :data:`~sqlsdc.catalog.store.CHARGED_PENDING`) stands for the
    query until its outcome replaces it (:func:`~sqlsdc.catalog.store.record_query` under the
    charge's query id): a process killed after the charge, at any point, leaves every charge
    with an entry, and an outcome is only ever written for a charge that committed.

    Args:
        con: a writable DuckDB connection to the protected database, not inside a transaction.
        user: the analyst.
        tables: the confidential tables the query reads.
        cost: what the query's new cells cost (``ZERO`` if all were cached: nothing happens).
        query_id: the audit log's id of the query; None draws the next one in the charge's
            transaction (the returned row has it), saving a commit of its own.
        limits: the policy's limits by key (grants in the catalog are added).
        cells: the newly drawn cells (:attr:`NoisyCells.new_cells`), cached for this user.
        policy_version: the policy the cells were drawn under (required with ``cells``).
        state: the caller's :class:`BudgetState`, kept from charge to charge (None: read all).
        sql: the statement charged (the text of its audit entry).
        fingerprint: the statement's fingerprint, for its audit entry.
        drawn: called with the query id before the charge commits, so that a caller stopped
            at any point (Ctrl-C as COMMIT returns) knows the id its entry has or gets.

    Returns:
        The ledger row, or None for a zero cost, and None when a charge it conflicted with
        (another process) paid every one of its statistics first: they are not paid twice.

    Raises:
        BudgetExhausted: an applicable limit would be exceeded, or no limit bounds a kind the
            query spends; ``requested`` is the cost, ``remaining`` what the binding key has
            left (a :class:`BudgetLimit`). Nothing is recorded.
        OperationalError: the ledger write failed, or conflicted with concurrent charges on
            each of its tries (about 1 s: another transaction held ``budget_lock``). Nothing is
            recorded.
        ValueError: cells without a cost or without a policy version.
    """
    tables = _tables(tables)
    cells = list(cells)
    if cost.is_zero:
        if cells:
            raise ValueError("new DP cells must be paid for: a charge with cells needs a cost")
        return None
    if cells and policy_version is None:
        raise ValueError("caching cells needs the policy version they were drawn under")
    try:
        ensure_budget_catalog(con)
    except EngineError as e:
        raise _spend_failure(e) from None
    state = state if state is not None else BudgetState()
    conflict = None  # the engine's text of the last conflict
    amounts = [str(cost.epsilon), str(cost.rho), str(cost.delta)]
    for attempt in range(_CONFLICT_RETRIES):
        con.execute(parsed("BEGIN TRANSACTION"))
        seq = None  # the ledger row's, once written
        try:
            at = now()
            known = None  # a guarded connection's charge, decided by what it knows: one statement
            first = not attempt and query_id is None and not cells
            if first and _decided(state, limits, user, tables, cost):
                spend = [at, user, list(tables), *amounts, 0, policy_version]
                entry = pending_entry(user, policy_version, sql, fingerprint)
                known = _charge_known(con, state, spend, entry)
            if known is not None:
                writes, seq, charged = known
            else:
                # First statement: takes the snapshot and the lock row, so a charge committed
                # by another connection after our snapshot makes this one conflict and retry.
                writes = bump(con)
                if attempt and cells and _all_paid(con, user, policy_version, cells):
                    rollback(con)  # the charge we conflicted with paid these statistics
                    return None
                state.read(con, writes, policy_version)
                lims = _applicable(limits, state, user, tables)
                used = state.spent_of(con, list(lims))
                refusal = _refusal(user, tables, cost, lims, used)
                if refusal is not None:
                    binding = _binding_remaining(cost, lims, used)
                    raise BudgetExhausted(refusal, requested=cost, remaining=binding)
                query = "?" if query_id is not None else f"nextval('{S}.query_ids')"
                (seq, charged) = one(
                    con,
                    parsed(
                        f"INSERT INTO {S}.budget_spend ({', '.join(SPEND_COLUMNS)}) VALUES "
                        f"(nextval('{S}.budget_seq'), {query}, ?, ?, ?, ?, ?, ?, ?, ?) "
                        "RETURNING seq, query_id"
                    ),
                    [*([query_id] if query_id is not None else []), at, user, list(tables),
                     *amounts, len(cells), policy_version],
                )  # fmt: skip
                if cells:
                    insert_cells(con, user, policy_version, charged, at, cells,
                                  skip_cached=attempt > 0)  # fmt: skip
                record_query(con, charged, user, policy_version, "failed", sql,
                             reason=CHARGED_PENDING, fingerprint=fingerprint,
                             new_id=query_id is None)  # fmt: skip
            if drawn is not None:
                drawn(charged)
            con.execute(parsed("COMMIT"))
            state.charged(writes, user, tables, _cost(*amounts))  # as the ledger will sum it
            return Charge(seq, charged, user, tables, cost, len(cells), at)
        except BudgetExhausted:
            rollback(con)
            raise
        except EngineError as e:
            rollback(con)
            if seq is not None and _kept(con, seq):  # the COMMIT kept it, then raised
                state.charged(writes, user, tables, _cost(*amounts))
                return Charge(seq, charged, user, tables, cost, len(cells), at)
            if not is_conflict(e):
                raise _spend_failure(e) from None
            conflict = f"{type(e).__name__}: {e}"  # for the audit log, as any engine failure
            if attempt + 1 < _CONFLICT_RETRIES:
                time.sleep(0.005 * (attempt + 1))
        except BaseException:
            rollback(con)
            raise
    raise OperationalError(  # each attempt conflicted
        "could not record the privacy spend: too many concurrent charges; nothing was charged, "
        "try again",
        detail=conflict,
    )


def _applicable(limits, state: BudgetState, user: str, tables) -> dict[BudgetKey, BudgetLimit]:
    """The limits (the policy's, with the administrators' events of ``state``) that apply to
    ``user`` on ``tables``."""
    return {
        k: v for k, v in _with_grants(limits, state.grants).items() if k.applies_to(user, tables)
    }


def _decided(state: BudgetState, limits, user: str, tables, cost: PrivacyCost) -> bool:
    """Whether ``state`` alone, as of the connection's last charge, allows ``cost``: every
    applicable key's spend is known there and none would be exceeded. The decision stands only
    if nobody wrote the budget tables since, which the bump of the charge's one statement says
    (:func:`_charge_known`); else it is made again from what the transaction reads. A refusal
    is always made from what a transaction reads (a grant may have come since)."""
    if not state.writes:
        return False
    lims = _applicable(limits, state, user, tables)
    if any(k not in state.spent for k in lims):
        return False
    return _refusal(user, tables, cost, lims, {k: state.spent[k] for k in lims}) is None


def _charge_known(con, state: BudgetState, spend: list, entry: list) -> tuple | None:
    """A charge :func:`_decided` allowed, in one statement of the open transaction: the bump of
    ``budget_lock``, the ledger row (``spend``: ``charged_at`` ... ``policy_version``, its ids
    drawn) and the pending audit entry (``entry``: :func:`~sqlsdc.catalog.store.pending_entry`),
    three statements' work for one (0.3-0.7 ms less CPU; DuckDB runs each data-modifying CTE
    once, whether read or not). Returns ``(writes, seq, query_id)``, or None after rolling it
    back and beginning a new transaction when the counter says that someone wrote the budget
    tables since ``state`` (the decision is then made afresh); a conflict raises as
    :func:`bump` does."""
    row = one(con, parsed(_CHARGE_KNOWN), [*spend, *entry])
    if row is not None and row[0] == state.writes + 1:
        return row
    rollback(con)
    con.execute(parsed("BEGIN TRANSACTION"))
    return None


_CHARGE_KNOWN = (
    f"WITH bumped AS ({BUMP}), "
    f"spent AS (INSERT INTO {S}.budget_spend ({', '.join(SPEND_COLUMNS)}) VALUES "
    f"(nextval('{S}.budget_seq'), nextval('{S}.query_ids'), ?, ?, ?, ?, ?, ?, ?, ?) "
    "RETURNING seq, query_id), "
    f"pending AS (INSERT INTO {S}.audit SELECT query_id, ?, ?, ?, ?, ?, ?, ?, ? FROM spent "
    "RETURNING query_id) "
    "SELECT bumped.charges, spent.seq, spent.query_id FROM bumped, spent"
)


def _kept(con, seq: int) -> bool:
    """Whether the ledger holds the charge row ``seq``: DuckDB may raise from a COMMIT it has
    written (an interrupt, a server's cancel, as it ends: 7 of 60 interrupted commits), and
    that charge is paid; told "could not record the privacy spend" and asked again, the
    statement paid twice (red team s48b). Read after the rollback; a failed read is "no"."""
    try:
        return one(con, f"SELECT 1 FROM {S}.budget_spend WHERE seq = ?", [seq]) is not None
    except EngineError:
        return False


def has_charge(con, query_id: int) -> bool:
    """Whether the ledger holds a charge of ``query_id`` (it committed)."""
    if not has_budget_tables(con):
        return False
    return one(con, f"SELECT 1 FROM {S}.budget_spend WHERE query_id = ?", [query_id]) is not None


def _all_paid(con, user: str, policy_version: int, cells: list[CellRecord]) -> bool:
    """Whether every statistic of a charge is paid already (a concurrent query of the same user,
    in another process, asked it first)."""
    digests = {c.identity.digest for c in cells}
    return set(cached_cells(con, user, policy_version, digests)) >= digests


def _spend_failure(error: Exception) -> OperationalError:
    """sqlsdc's message for a failed ledger write; the engine's text only in ``detail``."""
    return OperationalError(
        "could not record the privacy spend; the engine's message is withheld; an admin can "
        "read it with `sqlsdc audit`",
        detail=f"{type(error).__name__}: {error}",
    )


def _binding_remaining(cost: PrivacyCost, lims, used) -> BudgetLimit:
    """The tightest remaining budget among the applicable limits, per kind (0 where no limit
    bounds a kind: nothing of it can be spent)."""
    tightest = {}
    for kind, _symbol in KINDS:
        bounded = [k for k in lims if getattr(lims[k], kind) is not None]
        left = [getattr(lims[k].remaining(used[k]), kind) for k in bounded]
        tightest[kind] = min(left) if left else Fraction(0)
    return BudgetLimit(**tightest)
