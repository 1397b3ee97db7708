"""A policy may not change the keyed noise of cells already released with the same keys.

The cell key method looks a cell's noise up at its cell key in the ptable, and random rounding
draws its uniform from the cell key (:mod:`sqlsdc.rewrite.ckm`, :mod:`sqlsdc.rewrite.round`).
The cell key is a function of the record keys alone, so a cell asked before and after a
policy that changes the ptable (or the magnitude parameters, or the rounding) is looked up
at the same key in two tables: each answer places the key in an interval of each table's row,
and only the counts whose two intervals meet remain. Red team s48g: municipality x sex (327
cells of the 20,000-person demo) asked under ``{D: 5, V: 3, js: 2}`` and again under
``{D: 8, V: 6, js: 2}`` pinned 2 counts exactly, one of them a count of 2 that ``js: 2``
never shows. Two draws under independent keys (``sqlsdc rekey``, which its admin runs knowing
every released value gets a second, independent draw) are not linked so. So a policy that
changes a table's keyed rule is refused while the ledger holds cells of that table released
by such a rule since its last re-keying.
"""

from __future__ import annotations

from sqlsdc.catalog import store
from sqlsdc.errors import PolicyError
from sqlsdc.policy import AggregateKind, Method, Policy, load_policy

KEYED = (Method.CKM, Method.ROUND)  # the methods whose noise is a function of the cell key
MECHANISMS = ("ckm", "round")  # their cells' mechanism in the ledger


def refuse_keyed_changes(con, policy: Policy) -> None:
    """Refuse ``policy`` when it changes the keyed noise of a table whose keyed cells the
    ledger holds since its last re-keying (a policy check, :func:`sqlsdc.admin.policy_checks`)."""
    current = store.current_policy(con)
    if current is None:
        return  # init: nothing released yet
    before = load_policy(current[1], name=current[2])
    for table in policy.confidential_tables:
        old = before.tables.get(table.name)
        if old is None or old.is_public:
            continue
        changed = [kind for kind in AggregateKind if _keyed(old, kind) is not None
                   and _keyed(table, kind) not in (None, _keyed(old, kind))]  # fmt: skip
        if changed and _released_since_rekey(con, table.name):
            kinds = " and ".join(str(k.value) for k in changed)
            raise PolicyError([
                f"{policy.source}: the {kinds} of {table.name} are released with keyed noise "
                f"(cell key method or random rounding), and this policy changes it: a cell "
                "released before and again after would be looked up at the same cell key in "
                "two tables, which together pin it (red team s48g). Keep the "
                f"{kinds} protection of {table.name} as it is, or give it new keys first: "
                f"`sqlsdc rekey DB --table {table.name}` (every value then gets a second, "
                "independent draw)"
            ])  # fmt: skip


def _keyed(table, kind: AggregateKind):
    """What a keyed rule's noise depends on besides the cell key, or None when not keyed."""
    rule = table.protection.get(kind)
    if rule is None or rule.method not in KEYED:
        return None
    return (rule.method, rule.ptable, rule.magnitude, rule.base, rule.rounding)


def _released_since_rekey(con, table: str) -> bool:
    """Whether the ledger holds a keyed cell of ``table`` released after its last re-keying."""
    rekeyed = con.execute(
        f"SELECT max(event_at) FROM {store.S}.key_events WHERE lower(table_name) = lower(?) "
        "AND action = 'rekeyed'",
        [table],
    ).fetchone()[0]
    found = con.execute(
        f"SELECT count(*) FROM (SELECT 1 FROM {store.S}.ledger WHERE mechanism IN "
        f"({', '.join('?' for _ in MECHANISMS)}) AND starts_with(cell, '{{\"tables\":[') "
        "AND contains(lower(split_part(cell, ']', 1)), ?) "
        "AND (CAST(? AS TIMESTAMP) IS NULL OR released_at > ?) LIMIT 1)",
        [*MECHANISMS, f'"{table.lower()}"', rekeyed, rekeyed],
    ).fetchone()[0]
    return found > 0
