"""The differencing checks' groupings over per-cell counts (session 48, s48h) against their
groupings over rows: where each unit lies in one finest cell
(:func:`sqlsdc.jobs.unit_cells.one_cell_each`), ``additive`` aggregates the rows by their
finest cells first and the CUBEs add those up. The same findings, the same intermediate
tables (hits, sizes, cells, cover), the same union counts, on random tables of one row per
unit (NULL keys on both sides, populations, sums with zeros and NULLs); and where a unit has
rows in several cells the check says so and the rows are counted as before."""

from __future__ import annotations

import random
from types import SimpleNamespace

import duckdb
import pytest
from sqlglot import exp

from sqlsdc.jobs import cell_unions
from sqlsdc.jobs.uncovered import _additive, _statement
from sqlsdc.jobs.unit_cells import one_cell_each

CTES = ("__hits", "__sizes", "__cells", "__covered", "__whole")


def _table(con, rng: random.Random, rows_per_unit=(1,)) -> None:
    def value(domain):
        return rng.choice([*domain, None]) if rng.random() < 0.15 else rng.choice(domain)

    rows = []
    for unit in range(rng.randint(40, 160)):
        for _ in range(rng.choice(rows_per_unit)):
            rows.append((unit, value("pq"), value("xyz"), value("ABC"), value("DE"),
                         rng.randint(0, 9), rng.choice([0, 0, 5, 7, None])))  # fmt: skip
    con.execute("CREATE OR REPLACE TABLE t (u INT, a VARCHAR, b VARCHAR, v VARCHAR, w VARCHAR, "
                "age INT, x INT)")  # fmt: skip
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?)", rows)


def _where(rng: random.Random):
    return rng.choice([None, exp.column("age") >= rng.randint(1, 6),
                       exp.column("age") < rng.randint(3, 9)])  # fmt: skip


def _side(rng: random.Random, columns: list[list[str]]) -> tuple:
    names = rng.choice(columns)
    return _where(rng), [(n, exp.column(n)) for n in names], rng.random() < 0.2


def _rows_of(con, select: exp.Select, name: str) -> list:
    """The rows of the CTE ``name`` of ``select``, sorted."""
    query = exp.select("*").from_(name)
    query.set("with_", select.args["with_"].copy())
    return sorted(con.execute(query.sql("duckdb")).fetchall(), key=repr)


@pytest.mark.parametrize("seed", range(6))
def test_smallest_difference_over_cells_is_the_one_over_rows(seed):
    rng = random.Random(seed)
    con = duckdb.connect(config={"threads": 1})
    found = 0
    try:
        _table(con, rng)
        for case in range(12):
            if case >= 4 and found:
                break
            spec = SimpleNamespace(unit="u", table="t", measure=rng.choice([None, "x"]))
            cut = _side(rng, [["a"], ["a", "b"], ["b", "a", "w"], []])
            cover = _side(rng, [["v"], ["v", "w"], [], ["a"]])
            assert _additive(con, spec, cut, cover)
            least = rng.choice([2, 3, 5, 1000])
            rows = _statement(spec, cut, cover, least)
            cells = _statement(spec, cut, cover, least, additive=True)
            for name in CTES:
                assert _rows_of(con, cells, name) == _rows_of(con, rows, name), name
            expected = con.execute(rows.sql("duckdb")).fetchall()
            assert con.execute(cells.sql("duckdb")).fetchall() == expected
            found += bool(expected)
    finally:
        con.close()
    assert found  # a finding in every seed's cases


@pytest.mark.parametrize("seed", range(6))
def test_union_of_cells_over_cells_is_the_one_over_rows(seed):
    rng = random.Random(seed)
    con = duckdb.connect(config={"threads": 1})
    counts = []
    try:
        _table(con, rng)
        for _ in range(6):
            measure = rng.choice([None, "x"])
            cells = SimpleNamespace(unit="u", table="t", measure=measure, where=_where(rng),
                                    dims=tuple(rng.choice(["a", "ab", "abw", "av"])))  # fmt: skip
            inner = SimpleNamespace(unit="u", table="t", measure=measure, where=_where(rng),
                                    dims=tuple(rng.choice(["v", "vw", "a", "w"])))  # fmt: skip
            keys, inner_keys = cell_unions._keys(cells), cell_unions._keys(inner)
            assert cell_unions._additive(con, cells, inner, keys, inner_keys)
            for shared in (True, False):
                old = cell_unions._union_query(cells, inner, keys, inner_keys, shared)
                new = cell_unions._union_query(cells, inner, keys, inner_keys, shared,
                                               additive=True)  # fmt: skip
                expected = con.execute(old.sql("duckdb")).fetchall()
                assert con.execute(new.sql("duckdb")).fetchall() == expected
                counts.append(expected[0][0])
    finally:
        con.close()
    assert any(counts)


def test_units_of_several_cells_keep_the_count_over_rows():
    """A unit with rows in two cells (a household's persons): its cells' counts do not add
    up, so the checks count distinct units over rows."""
    con = duckdb.connect(config={"threads": 1})
    try:
        con.execute("CREATE TABLE t AS SELECT * FROM (VALUES (1, 'p'), (1, 'q'), (2, 'p')) "
                    "v(u, a)")  # fmt: skip
        rows = exp.select("u", "a").from_("t")
        assert not one_cell_each(con, rows, "u", ["a"])
        assert one_cell_each(con, rows.where("u = 2"), "u", ["a"])
        assert one_cell_each(con, rows.where("false"), "u", ["a"])
        spec = SimpleNamespace(unit="u", table="t", measure=None)
        cut = (None, [("a", exp.column("a"))], False)
        assert not _additive(con, spec, cut, (None, [], False))
        rng = random.Random(7)
        _table(con, rng, rows_per_unit=(1, 2, 3))
        cut = (None, [("a", exp.column("a"))], False)
        assert not _additive(con, spec, cut, (None, [("v", exp.column("v"))], False))
    finally:
        con.close()
