"""Cell limits: how many distinct non-DP cells a user, and all users together, may be released
from a table per period (the policy's ``cell_limits``), enforced in the answer's transaction.

Why: answers with bounded noise to many different overlapping populations reconstruct the data
(Dinur & Nissim 2003, "Revealing information while preserving privacy", PODS: O(n log² n)
subset counts with o(√n) noise recover almost all of n secret bits; Dwork & Roth 2014, §8.1).
The cell key method gives the same population the same noise, but every subset of a
municipality's ages is another population with independent noise: 300 counts of random halves
of the ages 0..99 recovered the number of tertiary-educated persons at 98 of 100 ages of a
municipality (red team s49i, ``benchmarks/reconstruction.py``). No bounded-noise method survives
unlimited questions; what the policy can bound, as ε bounds DP, is how many it answers.

What counts: a cell is one released value of one group, as the ledger identifies it (the
query's canonical aggregation, its aggregates included, the group's keys, the output column):
every ledger row of the query whose mechanism is not ``dp`` (counts, sums, suppressed and
derived values alike), once per table of the query and its data version. So ``COUNT(*)`` and
``SUM(income)`` by sex are 4 cells, and a ``COUNT(*)`` beside a ``SUM`` is another cell than the
same ``COUNT(*)`` alone (charged again: more than needed, never less). A cell released to the
user before over the same data is free, whenever it was (its entry is kept); over changed data
(another :func:`~sqlsdc.engines.duckdb_schema.data_version`, as DP cells are named by it) it
describes other data and counts again: free forever, a statement answered once gave a fresh
noisy answer over every reload of the data, uncounted. A limit of user ``*`` counts the
distinct cells released to anyone in the period. An administrator's grants and resets of a
period (:mod:`sqlsdc.catalog.cell_grants`) are read only where a limit would be passed or a
period has ended.
Values of one answer that share an identity (its GROUP BY has a key it does not show: the
counts of 155 municipalities without their names, in municipality order, were one cell, red
team s50d) are counted one each, as the cells a statement hides are, once per statement.

Refusal without an oracle: the number of new cells is known only once the answer is computed,
so a refusal says something about the data (that the answer had more new cells than were left).
A refusal therefore ends the user's period on every limit it passed (an *end mark*, written
after the answer's transaction rolled back, before the refusal is audited): one bit per user,
limit and period. Its message states no number but the limit's: the new cells count the
groups a HAVING or LIMIT hid and the use those of earlier statements, exactly, so "would release
11 new cells" or "10 left" was an exact count of a population's groups (red team s49n). After
that, a statement is answered only if the user was answered the same
statement (fingerprint) before and it releases no new cell, a decision that does not depend on
which cells the data holds.

Cost (a guarded query's recording transaction, session 50): a statement answered before on
this opening of the file whose cells were all seen costs no statement (:class:`Known`; a
dashboard asking again); otherwise one look-up by key of the cells not known and of the end
marks, and, when a cell is new, one INSERT of the new cells (and of the statement's hidden
cells), an UPDATE of the lock row per user limited (an upsert for a user's first charge) and
one aggregate over the period's entries. The cells come from the ledger INSERT's parameters
(a result of up to 1,024 rows; larger ones, and Spark's, are read back from the ledger).
Queries of tables without a limit cost nothing.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlsdc.catalog.cell_grants import adjustments
from sqlsdc.catalog.schema import CATALOG_SCHEMA, CELL_ALLOWANCE
from sqlsdc.catalog.store import admin_names
from sqlsdc.engines.duckdb import parsed
from sqlsdc.errors import BudgetExhausted
from sqlsdc.policy import CellLimit, Policy

S = CATALOG_SCHEMA
TABLE = CELL_ALLOWANCE

_SEP = chr(31)  # a unit separator: never in a user, table or column name or a JSON identity

# the query's cells from its ledger rows, per table and its data version: their keys for the
# user, their hashes without the user, and how many of the query's values share the cell's
# identity (more than one when the answer does not show every group key); $1 query id, $2 user,
# $3 tables, $4 their versions
_CELLS = f"""SELECT sha256(concat_ws('{_SEP}', $2::VARCHAR, t.name, t.version, l.cell,
                         l.column_name)),
       t.name, sha256(concat_ws('{_SEP}', t.name, t.version, l.cell, l.column_name)), l.n
FROM (SELECT cell, column_name, count(*) AS n FROM {S}.ledger
      WHERE query_id = $1 AND mechanism <> 'dp' GROUP BY cell, column_name) AS l,
     (SELECT unnest($3::VARCHAR[]) AS name, unnest($4::VARCHAR[]) AS version) AS t"""

# rows given as lists: $1 keys, $2 user, $3 tables, $4 hashes, $5 cells, $6 time, $7 query id
_ADD = f"""INSERT INTO {S}.{TABLE}
SELECT unnest($1::VARCHAR[]), $2::VARCHAR, unnest($3::VARCHAR[]), unnest($4::VARCHAR[]),
       unnest($5::BIGINT[]), $6, $7"""


class CellLimitReached(BudgetExhausted):
    """A cell limit would be passed; ``ends`` are the end marks (entry, user, limit, the
    admins' grants and resets of the limit's period the refusal saw) that the refusal writes
    once the answer's transaction is rolled back (:func:`end_periods`)."""

    def __init__(self, message: str, ends: tuple[tuple[str, str, str, int], ...]):
        super().__init__(message)
        self.ends = ends


@dataclass(frozen=True)
class Usage:
    """A limit and what was used of it in the current period."""

    limit: CellLimit
    used: int
    start: datetime
    resets: datetime
    ended: bool = False
    granted: int = 0  # cells an admin granted for the period (since its last reset)
    since: datetime | None = None  # the period's last reset by an admin: used counts from it


def period(per: str, at: datetime) -> tuple[datetime, datetime]:
    """The UTC calendar period ``per`` (hour, day, week from Monday, month) holding ``at``:
    its start and the start of the next."""
    if per == "hour":
        start = at.replace(minute=0, second=0, microsecond=0)
        return start, start + timedelta(hours=1)
    day = at.replace(hour=0, minute=0, second=0, microsecond=0)
    if per == "day":
        return day, day + timedelta(days=1)
    if per == "week":
        start = day - timedelta(days=day.weekday())
        return start, start + timedelta(days=7)
    start = day.replace(day=1)
    following = (start + timedelta(days=32)).replace(day=1)
    return start, following


def applicable(policy: Policy, user: str, tables) -> tuple[CellLimit, ...]:
    """The limits that bound a query of ``user`` on ``tables``: the user's and all users'
    (``*``), on one of the tables or on all (``*``)."""
    names = {t.lower() for t in tables}
    return tuple(
        limit for limit in policy.cell_limits
        if limit.user in (user, "*") and (limit.table == "*" or limit.table in names)
    )  # fmt: skip


_FOUND = f"SELECT entry FROM {S}.{TABLE} WHERE entry IN (SELECT unnest($1::VARCHAR[]))"


def _digest(*parts: str) -> str:
    return hashlib.sha256(_SEP.join(parts).encode()).hexdigest()


_LOCK = (
    f"INSERT INTO {S}.{TABLE} VALUES ($1, $2, '', NULL, 0, $3, $4) ON CONFLICT (entry) "
    "DO UPDATE SET released_at = excluded.released_at, query_id = excluded.query_id"
)
# the lock row when it exists (:func:`lock_use`)
_LOCKED = f"UPDATE {S}.{TABLE} SET released_at = $2, query_id = $3 WHERE entry = $1"


def lock_use(con, user: str, at: datetime, query_id: int = -1) -> None:
    """Update the lock row of ``user``'s use (``*``: all users'), in the caller's transaction:
    every transaction counting new cells for them, and an admin's grant or reset, updates it,
    so two at once conflict and the second is run again after the first. By key when the row
    exists (every charge but a user's first: the same "Conflict on update" as the upsert's,
    DuckDB 2.0, at 0.55 ms of CPU against 1.5-2 ms for the upsert)."""
    entry = _lock_entry(user)
    (updated,) = con.execute(parsed(_LOCKED), [entry, at, query_id]).fetchone()
    if not updated:  # the first charge: a concurrent first one conflicts on the key
        con.execute(parsed(_LOCK), [entry, user, at, query_id])


def _lock_entry(user: str) -> str:
    return hashlib.sha256(_SEP.join(("lock", user)).encode()).hexdigest()


def _confidential(policy: Policy, name: str) -> bool:
    declared = policy.table(name.split(".")[-1])
    return declared is None or not declared.is_public


def _end_entry(user: str, limit: CellLimit, start: datetime) -> str:
    text = _SEP.join(("end", user, limit.user, limit.table, limit.per, start.isoformat()))
    return hashlib.sha256(text.encode()).hexdigest()


def _used(con, limits: tuple[CellLimit, ...], user: str, starts) -> tuple[int, ...]:
    """One aggregate per limit over the entries of its period: the user's cells, or the
    distinct cells of everyone (``*``)."""
    parts, params = [], []
    for limit, start in zip(limits, starts, strict=True):
        table = "" if limit.table == "*" else f" AND table_name = '{limit.table}'"
        since = f"released_at >= ?{table} AND cell_hash IS NOT NULL"
        if limit.user == "*":  # distinct cells, and the hidden cells of statements (cells > 1)
            parts.append(
                f"count(DISTINCT cell_hash) FILTER (WHERE {since} AND cells = 1) + "
                f"coalesce(sum(cells) FILTER (WHERE {since} AND cells > 1), 0)"
            )
            params += [start, start]
        else:
            parts.append(f"coalesce(sum(cells) FILTER (WHERE user_name = ? AND {since}), 0)")
            params += [user, start]
    text = f"SELECT {', '.join(parts)} FROM {S}.{TABLE}"  # one text per policy: parsed once
    return tuple(int(n) for n in con.execute(parsed(text), params).fetchone())


@dataclass
class Known:
    """What one opening of the database saw committed that no statement removes: entries of
    the cell allowance (a cell released to the user, a statement's hidden cells charged) and
    the statements (fingerprints) answered to the user. A repeated query whose entries are all
    known and that was answered before releases no new cell and is answered even after a
    refusal ended the period (:func:`charge_cells`): it is decided without a statement. Kept
    per opening of the file (:meth:`sqlsdc.guard.holding.FileHolding._open`), bounded."""

    writers: int | None = None  # engine.data_writers when the file was opened (or last seen)
    entries: set[str] = field(default_factory=set)
    answered: set[tuple[str, str]] = field(default_factory=set)  # (user, fingerprint)

    def add(self, entries, answered: tuple[str, str] | None = None) -> None:
        if len(self.entries) + len(self.answered) > KNOWN_LIMIT:
            self.entries.clear()
            self.answered.clear()
        self.entries.update(entries)
        if answered is not None:
            self.answered.add(answered)


KNOWN_LIMIT = 100_000  # entries and fingerprints kept per opening (64-character keys: ~15 MB)


def _cells(con, user: str, names: list[str], data: list[str], query_id: int, released):
    """The query's cells as ``(key for the user, table, hash without the user, values of the
    answer with this identity)``, per table and its data version: from ``released`` (its
    ledger rows as written, :func:`sqlsdc.catalog.store.record_release`), else read back from
    the ledger; the key as :data:`_CELLS` writes it (sha256 of the same UTF-8 text)."""
    if released is None:
        return con.execute(parsed(_CELLS), [query_id, user, names, data]).fetchall()
    pairs = Counter((cell, column) for cell, column, mechanism in released if mechanism != "dp")
    return [(_digest(user, name, version, cell, column), name,
             _digest(name, version, cell, column), n)
            for (cell, column), n in sorted(pairs.items())
            for name, version in zip(names, data, strict=True)]  # fmt: skip


def charge_cells(con, policy: Policy, *, user: str, tables, query_id: int, fingerprint: str,
                 at: datetime, versions: Callable[[str], str],
                 hidden: Callable[[], tuple[int, bool]] | None = None,
                 released=None, known: Known | None = None) -> None:  # fmt: skip
    """Count the new cells of ``query_id`` (its ledger rows, already written in this
    transaction; ``released``: those rows as ``(cell, column_name, mechanism)``, when the
    caller has them) against the limits that apply; raise :class:`CellLimitReached` (the
    caller rolls back) when one would be passed or the user's period on one has ended.
    ``versions`` gives a table's data version
    (:func:`sqlsdc.engines.duckdb_schema.data_version`): a cell is free again only over the
    same data. ``hidden`` gives the cells the query computed without releasing them one by
    one, and whether it ran a count to know (:mod:`sqlsdc.guard.hidden_cells`), charged once
    per statement text, table and data version. ``known``: what this opening saw committed
    before; a statement answered before whose entries are all known costs no statement."""
    names = sorted({t.lower() for t in tables if _confidential(policy, t)})
    limits = applicable(policy, user, names)
    if not limits:
        return
    data = [versions(name) for name in names]
    cells = _cells(con, user, names, data, query_id, released)
    opaque = [(_digest("opaque", user, name, version, fingerprint), name)
              for name, version in zip(names, data, strict=True)]  # fmt: skip
    # values of the answer sharing one ledger identity with another (a GROUP BY key not shown:
    # ``SELECT COUNT(*) ... GROUP BY municipality`` released 155 counts as one cell, red team
    # s50d) are cells no identity tells apart: charged with the statement's hidden cells
    shared = sum(n - 1 for _, name, _, n in cells if name == names[0])
    opaque_asked = hidden is not None or shared > 0
    entries = [c[0] for c in cells] + ([k for k, _ in opaque] if opaque_asked else [])
    answered = known is not None and (user, fingerprint) in known.answered
    if answered and known.entries.issuperset(entries):
        return  # no new cell, answered before: answered whether or not a period ended
    periods = [period(limit.per, at) for limit in limits]
    ends = [
        _end_entry(user, limit, start) for limit, (start, _) in zip(limits, periods, strict=True)
    ]
    # one look-up by key: which cells were released to the user before, the periods a
    # refusal ended, whether this statement's hidden cells were charged before (then its
    # groups are not counted again); what this opening saw committed is not asked again
    asked = [k for k in entries if known is None or k not in known.entries] + ends
    found = {e for (e,) in con.execute(parsed(_FOUND), [asked]).fetchall()}
    if known is not None:
        found |= known.entries.intersection(entries)
        known.add(found.difference(ends))  # committed: in this transaction's snapshot
    fresh = [(key, name, hashed, 1) for key, name, hashed, _ in cells if key not in found]
    new = len(fresh)
    ended = found.intersection(ends)
    if ended:  # an admin's grant or reset after the refusal lifts its end
        ended -= _lifted(con, user, limits, periods, ends, ended)
    unseen = [(k, name) for k, name in opaque if k not in found] if opaque_asked else []
    count, counted = hidden() if unseen and hidden is not None else (0, False)
    count += shared if unseen else 0
    if count or counted:  # 0 too when counted: the statement's groups are not counted again
        fresh += [(k, name, _digest(k, "cells"), count) for k, name in unseen]
        new += len(unseen) * count
    if fresh:  # one INSERT; a concurrent query of the user adding one first conflicts: run again
        con.execute(parsed(_ADD), [[r[0] for r in fresh], user, [r[1] for r in fresh],
                           [r[2] for r in fresh], [r[3] for r in fresh], at, query_id])  # fmt: skip
    if ended:
        limit, (_, resets) = next((lim, p) for lim, p, e in zip(limits, periods, ends, strict=True)
                                  if e in ended)  # fmt: skip
        if new == 0 and _answered_before(con, user, fingerprint, query_id):
            return
        raise CellLimitReached(
            f"cell limit reached: {_said(limit, user)} ended with a refused query; until "
            f"{resets:%Y-%m-%d %H:%M} UTC only statements answered to you before are answered "
            f"again. {_whom(policy)}",
            (),
        )
    if new == 0:
        return
    # one row per user that every transaction counting new cells for them updates: two at
    # once conflict and the second is run again after the first, so neither passes unseen;
    # under a limit of all users, one row shared by all (two users at once each saw the other's
    # cells missing and passed it together: 16 cells under a limit of 10, red team s49n)
    # (a statement each: two rows in one INSERT ... ON CONFLICT DO UPDATE, by VALUES or by
    # unnest, cost 7-9 ms of CPU here, DuckDB 2.0)
    for locked in sorted({user} | ({"*"} if any(lim.user == "*" for lim in limits) else set())):
        lock_use(con, locked, at, query_id)
    used = _used(con, limits, user, [s for s, _ in periods])
    passed = [(limit, n, p) for limit, n, p in zip(limits, used, periods, strict=True)
              if n > limit.cells]  # fmt: skip
    if passed:  # within what an admin granted or reset in the period, it is not passed
        passed = _granted_passed(con, user, passed)
    if not passed:
        return
    limit, _, (_, resets), change = passed[0]
    # no number from the data or the use: the new cells count the groups a HAVING or LIMIT
    # hid, exactly, and the use those of earlier statements (red team s49n); the policy's
    # limit and an admin's grant are no data
    granted = f" and the {change.granted:,} granted" if change.granted else ""
    raise CellLimitReached(
        f"cell limit reached: this query's new cells (of tables {', '.join(names)}) would "
        f"pass {_said(limit, user)}, {limit.cells:,} distinct cells a {limit.per}{granted}; "
        f"nothing was released, and this ends the {limit.per} on this limit for you: until "
        f"{resets:%Y-%m-%d %H:%M} UTC only statements answered to you before are answered "
        f"again (cells released before are free). {_whom(policy)}",
        tuple(
            (_end_entry(user, lim, p[0]), user, lim.table, change.events)
            for lim, _, p, change in passed
        ),  # fmt: skip
    )


def _granted_passed(con, user: str, passed: list) -> list:
    """Of ``passed`` (limit, use, period), those still passed with the admins' grants and
    resets of the period (:mod:`sqlsdc.catalog.cell_grants`): the use counted from the last
    reset, against the limit plus the cells granted since; each with what it saw of them (an
    :class:`~sqlsdc.catalog.cell_grants.Adjustment`: its refusal states the cells granted and
    keeps how many grants and resets it saw). Read only here: the common answer, within the
    policy's limit, costs nothing more. Grants and resets only allow more, so a grant committed
    after this read makes the charge stricter, never laxer (and lifts the end the refusal
    sets: :func:`_lifted`)."""
    limits = [lim for lim, _, _ in passed]
    changes = adjustments(con, user, limits, [p[0] for _, _, p in passed])
    still = []
    for (limit, n, p), change in zip(passed, changes, strict=True):
        if change.since is not None:
            (n,) = _used(con, (limit,), user, [change.since])
        if n > limit.cells + change.granted:
            still.append((limit, n, p, change))
    return still


def _lifted(con, user: str, limits, periods, ends: list[str], ended: set[str]) -> set[str]:
    """The end marks of ``ended`` whose refusal did not see every grant or reset of their
    limit's period (a mark keeps how many it saw as its ``cells``, which no use counts: its
    hash is NULL): lifted, the limit counts again. A grant committed while the refused query
    ran, unseen by it, lifts its end too."""
    marks = dict(con.execute(
        f"SELECT entry, cells FROM {S}.{TABLE} WHERE entry IN (SELECT unnest($1))",
        [sorted(ended)]).fetchall())  # fmt: skip
    chosen = [(lim, p[0], e) for lim, p, e in zip(limits, periods, ends, strict=True)
              if e in ended]  # fmt: skip
    changes = adjustments(con, user, [c[0] for c in chosen], [c[1] for c in chosen])
    return {e for (_, _, e), change in zip(chosen, changes, strict=True)
            if change.events > marks[e]}  # fmt: skip


def _said(limit: CellLimit, user: str) -> str:
    who = "all users together" if limit.user == "*" else f"user {user!r}"
    table = "all tables" if limit.table == "*" else f"table {limit.table!r}"
    return f"the policy's cell limit of {who} on {table} per {limit.per}"


def _whom(policy: Policy) -> str:
    admins = admin_names(policy)
    return (
        f"Ask an administrator ({', '.join(admins)}) to raise cell_limits in the policy; "
        "answers to unlimited questions with bounded noise reconstruct the data, differential "
        "privacy (a table's method dp) bounds them by a budget instead"
    )


def _answered_before(con, user: str, fingerprint: str, query_id: int) -> bool:
    row = con.execute(
        f"SELECT 1 FROM {S}.audit WHERE user_name = $1 AND fingerprint = $2 AND decision = "
        "'accepted' AND query_id <> $3 LIMIT 1",
        [user, fingerprint, query_id],
    ).fetchone()
    return row is not None


def end_periods(con, refusal: CellLimitReached, query_id: int | None, at: datetime) -> None:
    """Write ``refusal``'s end marks (in their own transaction, after the answer's rolled
    back): the user's period on each limit it passed is over, until an admin's grant or reset
    the refusal did not see (each mark keeps how many it saw); a mark lifted so is set again."""
    if not refusal.ends:
        return
    con.execute(
        f"INSERT INTO {S}.{TABLE} SELECT e.entry, e.user_name, e.table_name, NULL, e.seen, $2, "
        "$3 FROM (SELECT unnest($1::STRUCT(entry VARCHAR, user_name VARCHAR, table_name "
        "VARCHAR, seen BIGINT)[]) AS e) ON CONFLICT (entry) DO UPDATE SET cells = "
        "excluded.cells, released_at = excluded.released_at, query_id = excluded.query_id",
        [[{"entry": e, "user_name": u, "table_name": t, "seen": n}
          for e, u, t, n in refusal.ends], at, query_id if query_id is not None else -1],
    )  # fmt: skip


def usage(con, policy: Policy, user: str, at: datetime) -> list[Usage]:
    """What ``user`` used of every limit that names them (or all users) in its current period,
    and whether a refusal ended it (``sqlsdc audit --json``'s ``cell_limits``)."""
    limits = tuple(lim for lim in policy.cell_limits if lim.user in (user, "*"))
    if not limits:
        return []
    periods = [period(limit.per, at) for limit in limits]
    changes = adjustments(con, user, limits, [s for s, _ in periods])
    # the use from the period's start, or from an admin's last reset in it
    starts = [c.since or s for c, (s, _) in zip(changes, periods, strict=True)]
    used = _used(con, limits, user, starts)
    ends = [_end_entry(user, lim, p[0]) for lim, p in zip(limits, periods, strict=True)]
    ended = {e for (e,) in con.execute(
        f"SELECT entry FROM {S}.{TABLE} WHERE entry IN (SELECT unnest($1::VARCHAR[]))",
        [ends]).fetchall()}  # fmt: skip
    if ended:
        ended -= _lifted(con, user, limits, periods, ends, ended)
    rows = zip(limits, used, periods, ends, changes, strict=True)
    return [Usage(lim, int(n), s, r, e in ended, c.granted, c.since)
            for lim, n, (s, r), e, c in rows]  # fmt: skip


def retire_cells(con, table: str) -> int:
    """Make the cells released from ``table`` new again (``sqlsdc rekey`` gave its units new
    record keys: every value asked again is an independent draw), keeping their use in their
    periods: their entries and hashes are renamed with a salt of this call, so that no later
    look-up finds them and a limit of all users counts the next release apart. Returns the
    entries retired. Why: re-asked after a rekey, 80 of 93 counts of a statement came back
    with new noise, free as cells released before (red team s50d). Set-based, in the caller's
    transaction: the renamed copies inserted, then the rows they copy deleted (the rows went
    through Python, every allowance row of the table: review of s50d)."""
    salt = os.urandom(16).hex()
    ours = "table_name = $1 AND cell_hash IS NOT NULL"
    (added,) = con.execute(
        f"INSERT INTO {S}.{TABLE} SELECT sha256(entry || '{_SEP}' || $2), user_name, "
        f"table_name, sha256(cell_hash || '{_SEP}' || $2), cells, released_at, query_id "
        f"FROM {S}.{TABLE} WHERE {ours}",
        [table.lower(), salt],
    ).fetchone()
    # the rows renamed above: those whose renamed entry is now in the table (a renamed row's
    # own renaming is not, unless sha256 collides)
    (removed,) = con.execute(
        f"DELETE FROM {S}.{TABLE} WHERE {ours} AND sha256(entry || '{_SEP}' || $2) IN "
        f"(SELECT entry FROM {S}.{TABLE} WHERE {ours})",
        [table.lower(), salt],
    ).fetchone()
    if removed != added:  # never: the caller's transaction is rolled back, nothing retired
        raise RuntimeError(f"retiring {table}'s cells renamed {added} entries, removed {removed}")
    return added
