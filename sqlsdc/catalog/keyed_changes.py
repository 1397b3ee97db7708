"""A policy may not change the keyed noise of cells already released with the same keys.

The cell key method looks a cell's noise up at its cell key in the ptable, and random rounding
draws its uniform from the cell key (:mod:`sqlsdc.rewrite.ckm`, :mod:`sqlsdc.rewrite.round`).
The cell key is a function of the record keys alone, so a cell asked before and after a
policy that changes the ptable (or the magnitude parameters, or the rounding) is looked up
at the same key in two tables: each answer places the key in an interval of each table's row,
and only the counts whose two intervals meet remain. Red team s48g: persons by municipality x
sex and x education (915 cells of the 20,000-person demo) asked under ``{D: 5, V: 3, js: 2}``
and again under ``{D: 8, V: 6, js: 2}`` pinned 12 counts exactly, 8 of them counts of 2 that
``js: 2`` never shows. Two draws under independent keys (``sqlsdc rekey``, which its admin
runs knowing every released value gets a second, independent draw) are not linked so. So a
policy that changes a table's keyed rule is refused while the ledger holds cells of that
table released by such a rule since its last re-keying, the rule compared with that of every
policy version in force since then (a version without keyed noise in between resets nothing).
"""

from __future__ import annotations

from sqlsdc.catalog import store
from sqlsdc.errors import PolicyError
from sqlsdc.policy import AggregateKind, Method, Policy, load_policy

KEYED = (Method.CKM, Method.ROUND)  # the methods whose noise is a function of the cell key
MECHANISMS = ("ckm", "round")  # their cells' mechanism in the ledger


def refuse_keyed_changes(con, policy: Policy) -> None:
    """Refuse ``policy`` when it changes the keyed noise of a table whose keyed cells the
    ledger holds since its last re-keying (a policy check, :func:`sqlsdc.admin.policy_checks`).

    The new keyed rule is compared with the keyed rule of every policy version in force since
    that re-keying, not only the last: a version in between without keyed noise (threshold,
    say) would otherwise let a new ptable meet the answers of the one before it."""
    if store.current_policy(con) is None:
        return  # init: nothing released yet
    read: dict = {}  # versions since a re-keying, read once per moment (most tables: never)
    for table in policy.confidential_tables:
        rekeyed = _rekeyed_at(con, table.name)
        if rekeyed not in read:
            read[rekeyed] = _versions_since(con, rekeyed)
        versions = read[rekeyed]
        changed = [kind for kind in AggregateKind if _keyed(table, kind) is not None
                   and any(_differs(old, table.name, kind, _keyed(table, kind))
                           for old in versions)]  # fmt: skip
        if changed and _released_since(con, table.name, rekeyed):
            kinds = " and ".join(str(k.value) for k in changed)
            raise PolicyError([
                f"{policy.source}: the {kinds} of {table.name} are released with keyed noise "
                f"(cell key method or random rounding), and this policy changes it: a cell "
                "released before and again after would be looked up at the same cell key in "
                "two tables, which together pin it (red team s48g). Keep the "
                f"{kinds} protection of {table.name} as it was, or give it new keys first: "
                f"`sqlsdc rekey DB --table {table.name}` (every value then gets a second, "
                "independent draw)"
            ])  # fmt: skip


def _versions_since(con, rekeyed) -> list:
    """The policy documents in force since ``rekeyed`` (all when None): those applied after it
    and the one in force at that moment."""
    rows = con.execute(
        f"SELECT document, source FROM {store.S}.policy_versions WHERE CAST(? AS TIMESTAMP) "
        f"IS NULL OR applied_at > ? OR version = (SELECT max(version) FROM "
        f"{store.S}.policy_versions WHERE applied_at <= ?) ORDER BY version",
        [rekeyed, rekeyed, rekeyed],
    ).fetchall()
    versions = []
    for document, source in rows:
        try:
            versions.append(load_policy(document, name=source))
        except Exception:  # a version this sqlsdc no longer reads: its rule is unknown
            versions.append(None)
    return versions


def _differs(old, name: str, kind: AggregateKind, new) -> bool:
    """Whether policy version ``old`` (None: unreadable) had another keyed rule for ``kind``
    of table ``name`` than ``new``."""
    if old is None:
        return True
    table = old.tables.get(name)
    if table is None or table.is_public:
        return False
    before = _keyed(table, kind)
    return before is not None and before != new


def _keyed(table, kind: AggregateKind):
    """What a keyed rule's noise depends on besides the cell key, or None when not keyed."""
    rule = table.protection.get(kind)
    if rule is None or rule.method not in KEYED:
        return None
    return (rule.method, rule.ptable, rule.magnitude, rule.base, rule.rounding)


def _rekeyed_at(con, table: str):
    """When ``table`` was last given new record keys (None: never)."""
    return con.execute(
        f"SELECT max(event_at) FROM {store.S}.key_events WHERE lower(table_name) = lower(?) "
        "AND action = 'rekeyed'",
        [table],
    ).fetchone()[0]


def _released_since(con, table: str, rekeyed) -> bool:
    """Whether the ledger holds a keyed cell of ``table`` released after ``rekeyed``, or an
    analyst's query of it was answered since under a policy version that gave it keyed noise
    (:func:`_asked_since`)."""
    return _in_ledger(con, table, rekeyed) or _asked_since(con, table, rekeyed)


def _in_ledger(con, table: str, rekeyed) -> bool:
    """Whether the ledger holds a keyed cell of ``table`` released after ``rekeyed``."""
    found = con.execute(
        f"SELECT count(*) FROM (SELECT 1 FROM {store.S}.ledger WHERE mechanism IN "
        f"({', '.join('?' for _ in MECHANISMS)}) AND starts_with(cell, '{{\"tables\":[') "
        "AND contains(lower(split_part(cell, ']', 1)), ?) "
        "AND (CAST(? AS TIMESTAMP) IS NULL OR released_at > ?) LIMIT 1)",
        [*MECHANISMS, f'"{table.lower()}"', rekeyed, rekeyed],
    ).fetchone()[0]
    return found > 0


def _asked_since(con, table: str, rekeyed) -> bool:
    """Whether the audit log holds a query answered after ``rekeyed`` whose text names
    ``table`` (a substring: errs on the side of "yes") under a policy version that gave the
    table keyed noise (an unreadable version counts). The ledger has no keyed row of what a
    query releases through its keyed cells without showing them: ``HAVING COUNT(*) = 5``
    lists the cells whose noisy count is 5 (12 of 332 municipality x sex cells, every one
    right) and an aggregate over a derived table of cells (``SELECT m, s, MAX(n) FROM
    (SELECT m, s, COUNT(*) AS n ... GROUP BY ALL) GROUP BY ALL``) shows every noisy count of
    the groups it keeps (246 of 332, the ledger's mechanism "derived"): asked so before and
    after a new ptable, the cells were pinned as in s48g, and the policy was applied (red
    team s48o). Jobs' entries (a JSON request, or "... job stored ...") release no keyed
    cell."""
    rows = con.execute(
        f"SELECT DISTINCT v.document, v.source FROM {store.S}.audit a LEFT JOIN "
        f"{store.S}.policy_versions v ON v.version = a.policy_version "
        "WHERE a.decision = 'accepted' AND contains(lower(a.sql_text), ?) "
        "AND NOT starts_with(ltrim(a.sql_text), '{') "
        "AND (a.reason IS NULL OR a.reason NOT LIKE '%job%stored %') "
        "AND (CAST(? AS TIMESTAMP) IS NULL OR a.logged_at > ?)",
        [table.lower(), rekeyed, rekeyed],
    ).fetchall()
    for document, source in rows:
        try:
            old = load_policy(document, name=source)
        except Exception:  # no version, or one this sqlsdc no longer reads: keyed or not
            return True
        declared = old.tables.get(table)
        if declared is not None and not declared.is_public:
            if any(_keyed(declared, kind) is not None for kind in AggregateKind):
                return True
    return False
