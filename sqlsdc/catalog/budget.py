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
again.

Crash safety: :func:`charge` returns only after COMMIT, and DuckDB has written the commit to its
write-ahead log by then, so a process killed at any later point (before or while it returns the
result) leaves the spend recorded, with an audit entry that says so (written in the charge's
transaction, replaced by the query's outcome when it is recorded). Callers must therefore charge
*before* handing any noisy value to the user; a process killed before COMMIT has recorded nothing
and returned nothing.

Consistent noise: ``dp_cells`` holds every released DP cell per (user, policy version, cell
hash) with its noisy value, and every *statistic* a user has paid for (the identity of one
statistic over all cells of a canonical population, value 0; see
:func:`sqlsdc.mechanisms.dp_cells.statistic_identity`). The guard charges a query's statistics
that were not paid before *before* it computes any exact cell (:func:`charge` with the
statistics as ``cells``), so a query that then fails or times out has paid; the cells drawn
afterwards are cached with :func:`cache_cells`, in the transaction that records the query's
answer. :func:`cached_cells` looks both up.

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

import contextlib
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction

import pyarrow as pa

from sqlsdc.catalog.schema import CATALOG_SCHEMA
from sqlsdc.catalog.store import CHARGED_PENDING, dp_cell_entry, ensure_catalog, now, record_query
from sqlsdc.engines.duckdb import EngineError, described, one, parsed, rollback
from sqlsdc.errors import BudgetExhausted, Error, OperationalError
from sqlsdc.mechanisms.accountant import BudgetLimit, PrivacyCost, amount_text, fraction
from sqlsdc.mechanisms.dp_cells import CellRecord
from sqlsdc.policy.load import AMOUNT_RANGES

__all__ = [
    "ALL",
    "BudgetKey",
    "BudgetState",
    "BudgetStatus",
    "Charge",
    "PolicyChanged",
    "budget_events",
    "budget_status",
    "cache_cells",
    "cached_cells",
    "released_groups",
    "charge",
    "effective_limits",
    "ensure_budget_catalog",
    "grant",
    "has_charge",
    "parse_amount",
    "policy_limits",
    "is_conflict",
    "note_policy",
    "reset",
    "set_limit",
    "spend_ledger",
    "spent",
]

S = CATALOG_SCHEMA
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
    _bump(con)


def policy_limits(policy) -> dict[BudgetKey, BudgetLimit]:
    """The limits a policy's ``budgets`` declare (grants in the catalog come on top)."""
    return {
        BudgetKey(b.user, b.table): BudgetLimit(b.epsilon, b.rho, b.delta) for b in policy.budgets
    }


def _text(x: Fraction | None) -> str | None:
    return None if x is None else str(x)


def _cost(eps: str | None, rho: str | None, delta: str | None) -> PrivacyCost:
    return PrivacyCost(Fraction(eps or 0), Fraction(rho or 0), Fraction(delta or 0))


_KINDS = (("epsilon", "ε"), ("rho", "ρ"), ("delta", "δ"))


_WITH_BUDGET_TABLES: weakref.WeakSet = weakref.WeakSet()


def _has_budget_tables(con, *, in_transaction: bool = True) -> bool:
    """Whether the catalog has the budget tables in their current layout (``dp_cells`` keyed by
    ``entry``, a ``delta`` column in the ledger and the events); remembered per connection once
    true (the tables are never dropped), since every charge and cache look-up asks.
    ``in_transaction`` False: the tables are described one by one (1-2 ms) instead of listing
    the engine's columns (~12 ms on a newly opened database), which only a statement outside a
    transaction may do (:func:`~sqlsdc.engines.duckdb.described`)."""
    if con in _WITH_BUDGET_TABLES:
        return True
    if in_transaction:
        (found,) = one(
            con,
            "SELECT count(*) FROM duckdb_columns() WHERE database_name = current_database() "
            "AND schema_name = ? AND ((table_name = 'dp_cells' AND column_name = 'entry') OR "
            "(table_name IN ('budget_spend', 'budget_events') AND column_name = 'delta'))",
            [S],
        )
        current = found == 3
    else:
        tables = described(con, ["dp_cells", "budget_spend", "budget_events"], S)
        columns = {table: {c for c, _type, _key in rows} for table, rows in tables.items()}
        current = "entry" in columns.get("dp_cells", ()) and all(
            "delta" in columns.get(table, ()) for table in ("budget_spend", "budget_events")
        )
    if current:
        _WITH_BUDGET_TABLES.add(con)
    return current


def remember_budget_tables(con) -> None:
    """Note that ``con``'s catalog has the budget tables in their current layout: an earlier
    opening of the same file found or made them (:func:`ensure_budget_catalog`), and they are
    never dropped. (Were the file replaced by one of an older layout, a charge's statements
    fail, and the query with them.)"""
    _WITH_BUDGET_TABLES.add(con)


def _delta_of(con) -> str | None:
    """How the ledger's and events' delta is read: ``"delta"``; ``"'0'"`` in a catalog from
    before delta was accounted (a read-only connection cannot bring it up to date, and its rows
    spent no delta); None if the catalog has no budget tables at all."""
    if _has_budget_tables(con):
        return "delta"
    (tables, deltas) = one(
        con,
        "SELECT count(DISTINCT table_name), count(*) FILTER (column_name = 'delta') "
        "FROM duckdb_columns() WHERE database_name = current_database() AND schema_name = ? "
        "AND table_name IN ('budget_spend', 'budget_events')",
        [S],
    )
    if tables < 2:
        return None
    return "delta" if deltas == 2 else "'0'"


def ensure_budget_catalog(con) -> None:
    """Create the budget tables if this catalog predates them (needs a writable connection;
    called outside a transaction)."""
    if not _has_budget_tables(con, in_transaction=False):
        try:
            con.execute("BEGIN TRANSACTION")
            try:
                ensure_catalog(con)
                con.execute("COMMIT")
            except BaseException:
                rollback(con)
                raise
        except EngineError:  # another connection created them at the same moment
            if not _has_budget_tables(con, in_transaction=False):
                raise


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
    delta = _delta_of(con)
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
    kinds = [kind for kind, _symbol in _KINDS]
    return BudgetLimit(*(getattr(new if getattr(new, k) is not None else limit, k) for k in kinds))


def spent(con, key: BudgetKey) -> PrivacyCost:
    """What the queries ``key`` covers have spent since its last reset."""
    return _spent(con, [key])[key]


def _spent(con, keys: list[BudgetKey], resets=None) -> dict[BudgetKey, PrivacyCost]:
    """:func:`spent` of every key in one statement (``resets``: :func:`_events`' second part,
    read when not given). The ledger is summed in SQL per distinct cost, so exact fractions
    are added once per distinct cost, not once per charge."""
    total = {key: PrivacyCost() for key in keys}
    delta = _delta_of(con) if keys else None
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
    if _delta_of(con) is not None:
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
    for kind, symbol in _KINDS:
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
    for attempt in range(_CONFLICT_RETRIES):
        con.execute(parsed("BEGIN TRANSACTION"))
        try:
            # First statement: takes the snapshot and the lock row, so a charge committed by
            # another connection after our snapshot makes this one conflict and retry.
            writes = _bump(con)
            if attempt and cells and _all_paid(con, user, policy_version, cells):
                rollback(con)  # the charge we conflicted with paid these statistics
                return None
            state.read(con, writes, policy_version)
            lims = {
                k: v
                for k, v in _with_grants(limits, state.grants).items()
                if k.applies_to(user, tables)
            }
            used = state.spent_of(con, list(lims))
            refusal = _refusal(user, tables, cost, lims, used)
            if refusal is not None:
                binding = _binding_remaining(cost, lims, used)
                raise BudgetExhausted(refusal, requested=cost, remaining=binding)
            at = now()
            query = "?" if query_id is not None else f"nextval('{S}.query_ids')"
            amounts = [str(cost.epsilon), str(cost.rho), str(cost.delta)]
            (seq, charged) = one(
                con,
                parsed(
                    f"INSERT INTO {S}.budget_spend ({', '.join(_SPEND_COLUMNS)}) VALUES "
                    f"(nextval('{S}.budget_seq'), {query}, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "RETURNING seq, query_id"
                ),
                [*([query_id] if query_id is not None else []), at, user, list(tables),
                 *amounts, len(cells), policy_version],
            )  # fmt: skip
            if cells:
                _insert_cells(con, user, policy_version, charged, at, cells,
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
            if is_conflict(e) and attempt + 1 < _CONFLICT_RETRIES:
                time.sleep(0.005 * (attempt + 1))
                continue
            raise _spend_failure(e) from None
        except BaseException:
            rollback(con)
            raise
    raise Error("could not record the privacy spend: too many concurrent charges; try again")


def has_charge(con, query_id: int) -> bool:
    """Whether the ledger holds a charge of ``query_id`` (it committed)."""
    if not _has_budget_tables(con):
        return False
    return one(con, f"SELECT 1 FROM {S}.budget_spend WHERE query_id = ?", [query_id]) is not None


def _bump(con) -> int:
    """Count one write of the budget tables on ``budget_lock``'s row; the new count. The first
    write creates the row; two first writes conflict on its key."""
    bumped = con.execute(parsed(_BUMP)).fetchall()
    if bumped:
        return bumped[0][0]
    con.execute(f"INSERT INTO {S}.budget_lock VALUES (1, 1)")
    return 1


_BUMP = f"UPDATE {S}.budget_lock SET charges = charges + 1 WHERE id = 1 RETURNING charges"


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
    for kind, _symbol in _KINDS:
        bounded = [k for k in lims if getattr(lims[k], kind) is not None]
        left = [getattr(lims[k].remaining(used[k]), kind) for k in bounded]
        tightest[kind] = min(left) if left else Fraction(0)
    return BudgetLimit(**tightest)


def _insert_cells(
    con,
    user,
    policy_version,
    query_id,
    at,
    cells: list[CellRecord],
    *,
    skip_cached: bool,
    returning: bool = False,
) -> list[tuple]:
    """Cache the new cells. A concurrent query of the same user may have cached some of them
    since they were looked up (with the same values: the noise is a function of the cell);
    the retry after that key conflict (``skip_cached``) leaves those out. With ``returning``
    cells cached before are skipped, and the entries inserted are returned."""
    if skip_cached:
        have = cached_cells(con, user, policy_version, [c.identity.digest for c in cells])
        cells = [c for c in cells if c.identity.digest not in have]
    digests = [c.identity.digest for c in cells]
    columns = [[dp_cell_entry(user, policy_version, d) for d in digests], digests,
               [c.identity.text for c in cells], [c.column for c in cells],
               [c.statistic.value for c in cells], [str(c.value) for c in cells]]  # fmt: skip
    if len(cells) == 1:  # a charge's one statistic: a row of values, no unnest (0.2 ms less)
        insert = _INSERT_CELL_RETURNING if returning else _INSERT_CELL
        entry, *rest = (column[0] for column in columns)
        result = con.execute(parsed(insert), [entry, user, policy_version, *rest, query_id, at])
        return result.fetchall() if returning else []
    if len(cells) <= _LISTED_ENTRIES:
        insert = _INSERT_CELLS_RETURNING if returning else _INSERT_CELLS
        entry, *rest = columns
        result = con.execute(parsed(insert), [entry, user, policy_version, *rest, query_id, at])
        return result.fetchall() if returning else []
    names = ("entry", "cell_hash", "cell", "column_name", "statistic", "value")
    table = pa.table([pa.array(c, type) for c, type in zip(columns, _CELL_TYPES, strict=True)],
                     names=names)  # fmt: skip
    insert = _INSERT_VIEW_RETURNING if returning else _INSERT_VIEW
    with _registered(con, _CELLS_VIEW, table):
        result = con.execute(parsed(insert), [user, policy_version, query_id, at])
        return result.fetchall() if returning else []


_CELL_VALUES = (
    "SELECT unnest(?::BLOB[]), ?, ?, unnest(?), unnest(?), unnest(?), unnest(?), unnest(?), ?, ?"
)
_INSERT_CELLS = f"INSERT INTO {S}.dp_cells {_CELL_VALUES}"
_INSERT_CELLS_RETURNING = f"INSERT OR IGNORE INTO {S}.dp_cells {_CELL_VALUES} RETURNING entry"
_CELL_ROW = "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"  # the same columns, one row
_INSERT_CELL = f"INSERT INTO {S}.dp_cells {_CELL_ROW}"
_INSERT_CELL_RETURNING = f"INSERT OR IGNORE INTO {S}.dp_cells {_CELL_ROW} RETURNING entry"

# More than _LISTED_ENTRIES cells go to the cache as a registered Arrow table: binding a list
# parameter converts it value by value (58 ms for 9,456 cells, 21 ms from Arrow; the same rows)
_CELLS_VIEW = "__sqlsdc_cached_cells"
_CELL_TYPES = (pa.binary(), pa.string(), pa.string(), pa.string(), pa.string(), pa.string())
_VIEW_VALUES = (
    f"SELECT entry, ?, ?, cell_hash, cell, column_name, statistic, value, ?, ? FROM {_CELLS_VIEW}"
)
_INSERT_VIEW = f"INSERT INTO {S}.dp_cells {_VIEW_VALUES}"
_INSERT_VIEW_RETURNING = f"INSERT OR IGNORE INTO {S}.dp_cells {_VIEW_VALUES} RETURNING entry"
_WANTED_VIEW = "__sqlsdc_wanted_cells"


@contextmanager
def _registered(con, name: str, table: pa.Table):
    """``table`` registered on ``con`` as ``name`` while the block runs. A statement that
    fails inside a transaction aborts it, and DuckDB then refuses the unregistration too: the
    statement's own error is the one raised (the next registration of ``name`` replaces the
    table, and closing the connection drops it)."""
    con.register(name, table)
    try:
        yield
    finally:
        with contextlib.suppress(EngineError):
            con.unregister(name)


def cache_cells(
    con,
    *,
    user: str,
    policy_version: int,
    query_id: int,
    cells: Iterable[CellRecord],
    paid_by: Charge | None = None,
    again: bool = False,
    releases: Iterable[tuple[str, str]] = (),
) -> None:
    """Cache the cells a query drew after its statistics were charged (nothing is spent here:
    the statistics are paid); ``paid_by``'s ledger row then counts them. ``releases``:
    (digest, keys) of the groups private selections released
    (:func:`sqlsdc.guard.dp_release.release_digest`), read back by :func:`released_groups`.

    Runs inside the caller's transaction, the one that records the query's audit entry, so
    that the cells, the answer's record and the answer go together. The cells are those the
    query did not find cached; one cached meanwhile by a concurrent query of the same user
    makes the transaction conflict (:func:`is_conflict`), and the caller runs it ``again``:
    cells cached by then are left as they are (the values are equal: the noise is a function
    of the cell; INSERT OR IGNORE, 1 ms dearer than the first attempt's plain INSERT)."""
    cells = list({c.identity.digest: c for c in cells}.values())
    inserted = 0
    if cells:
        inserted = len(_insert_cells(con, user, policy_version, query_id, now(), cells,
                                     skip_cached=False, returning=again))  # fmt: skip
        inserted = inserted if again else len(cells)
    if paid_by is not None:
        con.execute(parsed(_SPEND_CELLS), [inserted, paid_by.seq])
    for digest, keys in releases:
        entry = dp_cell_entry(user, policy_version, digest)
        con.execute(parsed(_INSERT_RELEASE),
                    [entry, user, policy_version, digest, keys, query_id, now()])  # fmt: skip


_SPEND_CELLS = f"UPDATE {S}.budget_spend SET cells = ? WHERE seq = ?"
_INSERT_RELEASE = (
    f"INSERT OR IGNORE INTO {S}.dp_cells VALUES (?, ?, ?, ?, ?, 'released groups', 'release', "
    "'0', ?, ?)"
)


def released_groups(con, user: str, policy_version: int, digest: str) -> str | None:
    """The keys of the groups a private selection released to ``user`` under
    ``policy_version`` (:func:`cache_cells`' ``releases``), or None."""
    if not _has_budget_tables(con):
        return None
    row = one(con, f"SELECT cell FROM {S}.dp_cells WHERE entry = ?",
              [dp_cell_entry(user, policy_version, digest)])  # fmt: skip
    return None if row is None else row[0]


def cached_cells(
    con, user: str, policy_version: int, digests: Iterable[str]
) -> dict[str, Fraction]:
    """Noisy values already released to ``user`` under ``policy_version``, by cell digest."""
    digests = list(dict.fromkeys(digests))
    if not digests or not _has_budget_tables(con):
        return {}
    entries = [dp_cell_entry(user, policy_version, d) for d in digests]
    if len(entries) <= _LISTED_ENTRIES:  # a list of constants: a filter, no join over the cache
        listed = f"{_LOOK_UP} ({', '.join('?' * len(entries))})"
        rows = con.execute(parsed(listed), entries).fetchall()
    else:
        with _registered(con, _WANTED_VIEW, pa.table({"entry": pa.array(entries, pa.binary())})):
            rows = con.execute(parsed(_LOOK_UP_VIEW)).fetchall()
    return {h: _value(v) for h, v in rows}


def _value(text: str) -> Fraction:
    """``Fraction(text)`` of a cached value, which :func:`_insert_cells` wrote as
    ``str(Fraction)``: an integer's digits are read as an ``int``, four times faster than
    the general parse (a repeated query of thousands of cells reads thousands)."""
    if text.isdecimal() or (text[:1] == "-" and text[1:].isdecimal()):
        return Fraction(int(text))
    return Fraction(text)


_LISTED_ENTRIES = 256
"""Up to this many cells, :func:`cached_cells` lists the keys as constants, which DuckDB
filters the cache with (about 1 ms at 300,000 cached cells, against 3.4 ms for the semi-join
that larger look-ups use), and :func:`_insert_cells` sends them as list parameters. More are
looked up and cached through a registered Arrow table: a list parameter is converted value
by value (a look-up of 9,456 cells: 28 against 13 ms)."""
_LOOK_UP = f"SELECT cell_hash, value FROM {S}.dp_cells WHERE entry IN"
_LOOK_UP_VIEW = f"{_LOOK_UP} (SELECT entry FROM {_WANTED_VIEW})"


# --- administration --------------------------------------------------------------------------


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


def _event(con, admin: str, action: str, key: BudgetKey, cost, reason: str) -> int:
    """Record a grant (``cost``: the PrivacyCost added), a set (``cost``: the BudgetLimit, None
    for the kinds it leaves) or a reset (``cost`` None), inside the caller's transaction; it
    counts as a write of the budget tables (:func:`_bump`), so no charge reuses a
    :class:`BudgetState` read before it."""
    _bump(con)
    (seq,) = one(con, f"SELECT nextval('{S}.budget_seq')")
    if isinstance(cost, BudgetLimit):
        amounts = [_text(getattr(cost, kind)) for kind, _symbol in _KINDS]
    else:
        amounts = [_text(getattr(cost, kind)) if cost and getattr(cost, kind) else None
                   for kind, _symbol in _KINDS]  # fmt: skip
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
                         for kind, _symbol in _KINDS if getattr(cost, kind)})  # fmt: skip
    for kind, symbol in _KINDS:
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
    if all(getattr(limit, kind) is None for kind, _symbol in _KINDS):
        raise ValueError("a budget set needs an epsilon, rho or delta limit")
    if limit.delta is not None and limit.delta >= 1:
        raise ValueError(f"a delta limit must be below 1 (delta 1 allows anything): {limit.delta}")
    _check_ceiling(key, {kind: getattr(limit, kind) for kind, _symbol in _KINDS})
    return _recorded(con, admin, "set", reason,
                     lambda: _event(con, admin, "set", key, limit, reason))  # fmt: skip


def _check_ceiling(key: BudgetKey, limits: Mapping[str, Fraction | None]) -> None:
    """A grant or set leaves every limit within what a policy's budget may allow
    (``sqlsdc.policy.load.AMOUNT_RANGES``): a limit no policy would validate is no limit."""
    for kind, symbol in _KINDS:
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
_SPEND_COLUMNS = ("seq", "query_id", "charged_at", "user_name", "tables", "epsilon", "rho",
                  "delta", "cells", "policy_version")  # fmt: skip


def _select(columns: tuple[str, ...], delta: str) -> str:
    return ", ".join(f"{delta} AS delta" if c == "delta" else c for c in columns)


def budget_events(con, *, user: str | None = None) -> list[dict]:
    """The audit trail of grants and resets, oldest first."""
    delta = _delta_of(con)
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
    delta = _delta_of(con)
    if delta is None:
        return []
    where, params = ("WHERE user_name = ?", [user]) if user else ("", [])
    rows = con.execute(
        f"SELECT {_select(_SPEND_COLUMNS, delta)} FROM {S}.budget_spend {where} "
        "ORDER BY seq DESC LIMIT ?",
        [*params, limit],
    ).fetchall()
    return [dict(zip(_SPEND_COLUMNS, r, strict=True)) for r in rows]


def charged_by_query(con, query_ids: Iterable[int]) -> dict[int, PrivacyCost]:
    """What the ledger charged each of ``query_ids`` (the audit log's ids), summed over its
    charges; ids with no charge (not a DP query, refused, or every cell already released) are
    absent. ``sqlsdc audit`` shows it beside each entry: the log did not say what a query
    cost (new user s39)."""
    ids = sorted(set(query_ids))
    delta = _delta_of(con)
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
    if value > ceiling or (value == ceiling and not reached):  # 1e400 was shown in 401 digits
        raise ValueError(
            f"{name} must be at most {_decimal(ceiling)}, the most a budget may allow, got {text}"
            if reached
            else f"{name} must be below {_decimal(ceiling)}, got {text}"
        )
    return value
