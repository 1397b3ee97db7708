"""The most rows an answer over noisy cells can have, from data-independent facts alone
(:mod:`sqlsdc.guard.answer_bound`): what it multiplies, what it caps, what it cannot bound."""

from __future__ import annotations

import math

import pytest
import sqlglot

from sqlsdc.guard.answer_bound import answer_rows

CELLS = {"c": (10, frozenset({"__g0"})), "d": (7, frozenset({"__g0", "__g1"}))}
PUBLIC = {"lookup": (3, frozenset({"code"})), "plain": (4, frozenset())}


def _public(table):
    return PUBLIC.get(table.name.lower()) if not table.db else None


def bound(sql: str) -> float:
    return answer_rows(sqlglot.parse_one(sql, read="duckdb"), CELLS, _public)


@pytest.mark.parametrize(
    "sql, rows",
    [
        ("SELECT __g0 FROM c WHERE __a0 > 3", 10),
        ("SELECT * FROM c, d", 70),
        ("SELECT * FROM c JOIN d ON c.__g0 = d.__g0", 7),  # c unique on it: at most d's rows
        ("SELECT * FROM c JOIN d ON c.__a0 = d.__g0", 70),  # d is unique on both keys only
        ("SELECT * FROM d JOIN c ON c.__g0 = d.__g0", 7),
        ("SELECT * FROM d JOIN c USING (__g0)", 7),
        ("SELECT * FROM c LEFT JOIN lookup AS l ON c.__g0 = l.code", 10),
        ("SELECT * FROM c FULL JOIN lookup AS l ON c.__g0 = l.code", 13),
        ("SELECT * FROM c JOIN plain AS p ON c.__g0 = p.code", 4),
        ("SELECT * FROM c JOIN plain AS p ON c.__a0 = p.code", 40),
        ("SELECT * FROM c JOIN lookup AS l ON c.__a0 > l.code", 30),
        (
            "SELECT * FROM (SELECT __g0 AS k FROM c) AS a JOIN (SELECT __g0 AS k, __a0 FROM c) "
            "AS b ON a.k = b.k",
            10,
        ),  # unique keys through derived tables, renamed
        ("SELECT * FROM c AS a JOIN (SELECT __a0 AS k FROM c) AS b ON a.__a0 = b.k", 100),
        (
            "SELECT * FROM c JOIN (SELECT __a0, COUNT(*) FROM d GROUP BY __a0) AS g "
            "ON c.__a0 = g.__a0",
            10,
        ),  # grouped: unique on its keys
        ("SELECT COUNT(*) FROM c, d", 1),
        ("SELECT * FROM c, sqlsdc.ckm_mix", 10),
        (
            "SELECT * FROM (SELECT s.*, e.v FROM c AS s LEFT JOIN sqlsdc.ptable_entries AS e "
            "ON e.lo <= s.__a0 AND e.hi > s.__a0) AS x JOIN d ON d.__a0 = x.__g0",
            7,
        ),
        ("SELECT SUM(__a0) OVER () FROM c", 10),  # a window is no aggregate of rows
        ("SELECT * FROM c, d LIMIT 5", 5),
        ("SELECT __g0 FROM c UNION SELECT __g0 FROM d", 17),
        ("WITH x AS (SELECT * FROM c) SELECT * FROM x AS a, x AS b", 100),
        ("SELECT * FROM (VALUES (1), (2)) AS v(x), c", 20),
    ],
)
def test_bounds(sql, rows):
    assert bound(sql) == rows


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT UNNEST(range(__a0)) FROM c",  # a list per cell: rows per element
        "SELECT SUM(__a0) OVER (PARTITION BY UNNEST([1, 2])) FROM c",
        "SELECT * FROM c, range(10) AS r",
        "SELECT * FROM c, persons",  # neither noisy cells nor a public table
        "SELECT * FROM c, sqlsdc.ptable_entries",  # a lookup, but not joined on a tile
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT * FROM r",
    ],
)
def test_what_it_cannot_bound_is_unbounded(sql):
    assert bound(sql) == math.inf


def test_group_by_all_claims_no_unique_key():
    grouped = "(SELECT __a0, __g0 FROM c GROUP BY ALL)"
    assert bound(f"SELECT * FROM c JOIN {grouped} AS g ON c.__a0 = g.__a0") == 100
