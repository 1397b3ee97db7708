"""Whether each unit of a set of rows lies in one cell of their finest cross-classification.

The differencing checks count a cell's units as distinct units (``COUNT(DISTINCT unit)``,
the number and sum of hashes of its units) for every grouping of a release's columns (a
``CUBE``). Distinct counts over raw rows cost a hash table per grouping set: 64 of them over
a file of six exact columns, each over every row (a synthetic file of the 1,000,000-person
demo next to a job: 88 s + 86 s of CPU, session 47's new-user test). Where every unit lies in
one cell of the finest cross-classification (all keys, all population flags), the distinct
units of a coarser cell are the disjoint union of those of its finest cells, so the counts
(and sums of hashes) add up: the rows are aggregated once by the finest cells and the CUBE
runs on those cells. :func:`one_cell_each` tells whether that holds in the data now; where it
does not (a unit of several rows in different cells: a household's persons), the checks keep
counting over rows, with the same result either way.
"""

from __future__ import annotations

from sqlglot import exp


def one_cell_each(con, rows: exp.Select, unit: str, cells: list[str]) -> bool:
    """Whether each non-NULL value of the column ``unit`` of ``rows`` (a SELECT) lies in one
    combination of the columns ``cells`` (NULL as a value): the number of (cell, unit) pairs
    is the number of units. ``rows`` becomes part of the query (not copied)."""
    keys = [exp.column(c) for c in cells]
    distinct = exp.Count(this=exp.Distinct(expressions=[exp.column(unit)]))
    per_cell = exp.select(distinct.copy().as_("__c")).from_("__t")
    per_cell = per_cell.group_by(*keys) if keys else per_cell
    pairs = exp.select(exp.Sum(this=exp.column("__c"))).from_(per_cell.subquery("__p"))
    units = exp.select(distinct.copy()).from_("__t")
    zero = exp.Literal.number(0)
    same = exp.Coalesce(this=pairs.subquery(), expressions=[zero]).eq(units.subquery())
    # ``rows`` goes into the query as it is (its callers build it for this check alone): a
    # copy of it would be copied again when the query is written
    query = exp.select(same).with_("__t", as_=rows, materialized=True, copy=False)
    return bool(con.execute(query.sql("duckdb")).fetchall()[0][0])
