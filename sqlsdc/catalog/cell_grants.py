"""Administrators' grants and resets of the policy's cell limits, as they bear on a period.

A cell limit (:mod:`sqlsdc.catalog.cell_limits`) is a budget of cells per calendar period. An
administrator may grant a user more cells for the current period (``sqlsdc budget DB cells
grant``) or reset it (``... cells reset``: its use counted from now, its grants and the end a
refusal set dropped); each is a row of ``sqlsdc.cell_limit_events`` with who, when and why
(:mod:`sqlsdc.catalog.cell_limit_admin` writes them). A lasting change of a limit is a policy
change (``cell_limits`` in the policy); a grant or reset holds for its period only.

Both only ever allow more, so a charge that reads them before a concurrent grant commits is
stricter, never laxer, than the admin's decision; they are read only where a limit would be
passed or a period has ended (:func:`adjustments`), so the common answer costs nothing more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlsdc.catalog.schema import CATALOG_SCHEMA, CELL_LIMIT_EVENTS
from sqlsdc.engines.duckdb import parsed
from sqlsdc.policy import CellLimit

S = CATALOG_SCHEMA
EVENTS = CELL_LIMIT_EVENTS


@dataclass(frozen=True)
class Adjustment:
    """What administrators changed of one limit in one period: the cells granted since its
    last reset (or its start), when that reset was (None: none; the use is counted from then)
    and how many grants and resets there were (an end set by a refusal that saw fewer, a
    grant or reset it did not see, is lifted)."""

    granted: int = 0
    since: datetime | None = None
    events: int = 0


def holder(limit: CellLimit, user: str) -> str:
    """Whose use ``limit`` counts for ``user``: the user's own, or all users' (``*``)."""
    return "*" if limit.user == "*" else user


def events_present(con) -> bool:
    """Whether the catalog has the events table (catalogs made before it have none until an
    admin command or a policy apply brings them up to date: then nothing was granted)."""
    return (
        con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() AND "
            "schema_name = $1 AND table_name = $2",
            [S, EVENTS],
        ).fetchone()[0]
        > 0
    )


_EVENTS = f"""SELECT user_name, limit_table, per, period_start, action, cells, event_at
FROM {S}.{EVENTS} WHERE user_name IN ($1, '*') AND period_start IN (SELECT unnest($2))
ORDER BY seq"""


def adjustments(con, user: str, limits: Sequence[CellLimit],
                starts: Sequence[datetime]) -> list[Adjustment]:  # fmt: skip
    """The administrators' changes of each of ``limits`` (as they bind ``user``) in its period
    starting at the matching one of ``starts``, in the caller's transaction."""
    if not limits or not events_present(con):
        return [Adjustment() for _ in limits]
    rows = con.execute(parsed(_EVENTS), [user, sorted(set(starts))]).fetchall()
    found = []
    for limit, start in zip(limits, starts, strict=True):
        key = (holder(limit, user), limit.table, limit.per, start)
        granted, since, events = 0, None, 0
        for name, table, per, begun, action, cells, at in rows:  # oldest first
            if (name, table, per, begun) != key:
                continue
            events += 1
            if action == "reset":
                granted, since = 0, at
            else:
                granted += cells
        found.append(Adjustment(granted, since, events))
    return found
