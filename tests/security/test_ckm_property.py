"""Property test of the cell key rewrite: the random queries of ``test_property`` on the CKM
demo database are refused, or answered with every group present once and counts within the
ptable's bounds (|noise| <= D, no count in 1..js). Any other exception fails the test, so this
also exercises the CKM frame on every shape the grammar produces (CTEs, derived tables, ROLLUP,
CUBE, HAVING-free filters, ORDER BY, LIMIT)."""

from __future__ import annotations

import sqlglot
from hypothesis import HealthCheck, event, given, note, settings
from test_property import MIN_FREQUENCY, Query, queries, recomputable

import sqlsdc
from sqlsdc.guard.validate import validate_release
from sqlsdc.policy import AggregateKind


def check_counts(query: Query, rows, raw, D: int, js: int) -> None:
    aggregates = [(p, i) for p, i in enumerate(query.items) if i.kind == "aggregate"]
    key_positions = {i.column: p for p, i in enumerate(query.items) if i.kind == "column"}
    select = list(query.keys) + [i.sql() for _, i in aggregates]
    check = f"SELECT {', '.join(select)} FROM persons"
    if query.where:
        check += f" WHERE {query.where}"
    if query.mode == "group":
        check += f" GROUP BY {', '.join(query.keys)}"
    elif query.mode in ("rollup", "cube"):
        check += f" GROUP BY {query.mode.upper()}({', '.join(query.keys)})"
    note(f"unguarded check: {check}")
    expected = {
        tuple(r[: len(query.keys)]): r[len(query.keys) :] for r in raw.execute(check).fetchall()
    }
    released = set()
    for row in rows:
        key = tuple(row[key_positions[k]] for k in query.keys)
        assert key in expected and key not in released, key
        released.add(key)
        for (position, item), value in zip(aggregates, expected[key], strict=True):
            got = row[position]
            if item.function == "COUNT" and not item.distinct:
                assert abs(got - value) <= D and not 0 < got <= js, (key, item.sql(), got, value)
    if not query.limited:  # only groups of fewer than k units may be dropped (nested results)
        persons = raw.execute(
            check.replace(", ".join(select), ", ".join([*query.keys, "COUNT(*)"]), 1)
        ).fetchall()
        small = {tuple(r[:-1]) for r in persons if r[-1] < MIN_FREQUENCY}
        assert set(expected) - released <= small, "groups missing from the protected result"


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(query=queries())
def test_ckm_refuses_or_perturbs_within_the_ptable(ckm, raw_ckm, query):
    note(f"query: {query.sql}")
    try:
        cursor = ckm.execute(query.sql)
    except sqlsdc.PolicyViolation:
        event("refused")
        return
    event("accepted")
    rows = cursor.fetchall()
    # the final validator proves the emitted SQL as the engine reads it, not only the tree
    validate_release(sqlglot.parse_one(cursor.explain().sql, read="duckdb"), ckm._context.policy)
    for item, column in zip(query.items, cursor.explain().columns, strict=True):
        expected = ("key", "public") if item.kind == "column" else ("ckm", "derived")
        assert column.mechanism in expected, (item, column)
    if recomputable(query):
        event("recomputed")
        ptable = ckm.policy.table("persons").rule(AggregateKind.COUNTS).ptable
        check_counts(query, rows, raw_ckm, ptable.D, ptable.js)
