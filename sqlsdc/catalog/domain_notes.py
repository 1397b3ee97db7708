"""A note when a dimension of a differentially private table with public groups holds NULLs.

Under ``dp: {groups: public}`` (the default) a DP result releases the groups of the declared
``domain`` only, and a domain lists values, never NULL: the rows without a value fall in no
group of a ``GROUP BY`` of that column, while every total counts them. On an office's own
events table, 339 of 911 events had no channel: grouped by channel, web and shop added up to
a third less than the total, with nothing saying where the rest went (new user s48e). Told
when the policy is applied, with how to give them a group of their own.
"""

from __future__ import annotations

from sqlsdc.engines.duckdb import one
from sqlsdc.policy import ColumnRole, GroupKeys, Policy


def unlisted_nulls(con, policy: Policy) -> list[str]:
    """A note per DP dimension with a domain, public groups, and rows without a value."""
    notes = []
    for table in policy.confidential_tables:
        public = table.dp is None or table.dp.groups is GroupKeys.PUBLIC
        if not (table.differentially_private and public):
            continue
        for column, spec in table.columns.items():
            if spec.role is not ColumnRole.DIMENSION or spec.domain is None:
                continue
            (nulls,) = one(con, f'SELECT count(*) FROM "{table.name}" WHERE "{column}" IS NULL')
            if nulls:
                notes.append(
                    f"{table.name}.{column} has no value in {nulls} rows: a DP result grouped "
                    "by it releases the groups of its domain only, so they are in no group "
                    "(totals count them); give them a code, e.g. UPDATE "
                    f"{table.name} SET {column} = 'unknown' WHERE {column} IS NULL, and add "
                    "it to the domain"
                )
    return notes
