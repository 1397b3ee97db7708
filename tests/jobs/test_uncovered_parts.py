"""The differencing check's parts of split inner cells by signatures (``jobs/uncovered.py``,
:func:`_parts`) against the first formulation, which paired every cell of the cut with the rows
of the cover's inner cells it meets: the same ``__parts`` and the same findings on random
tables (units of several rows in different cells, NULL keys on both sides, populations, sums
with zeros and NULLs, known outsiders)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import duckdb
import pytest
from sqlglot import exp

from sqlsdc.jobs.uncovered import _same, _statement

SIGNATURE_CTES = ("__sig", "__sets", "__m", "__t", "__own", "__parts")


def _pairwise_parts(keys: list[str], inner: list[str]) -> list[tuple[str, exp.Select]]:
    """The first formulation of ``__parts`` (sessions 38-40): every cell of the cut (``__hits``)
    paired with the rows of the split inner cells in the cover's inner cells it meets, outside
    the cell."""
    n = len(keys)
    in_cell = [
        exp.or_(
            exp.BitwiseAnd(
                this=exp.column("__g", "h"), expression=exp.Literal.number(1 << (n - 1 - j))
            ).neq(0),
            exp.NullSafeEQ(this=exp.column(k, "r"), expression=exp.column(k, "h")),
        )
        for j, k in enumerate(keys)
    ]
    elsewhere = exp.not_(exp.and_(*in_cell)) if keys else exp.false()
    met = (
        exp.select(
            exp.column("__g", "h"),
            *(exp.column(k, "h").as_(f"__h{j}") for j, k in enumerate(keys)),
            *(exp.column(k, "r") for k in keys),
            exp.Count(this=exp.Distinct(expressions=[exp.column("__u", "r")])).as_("__met"),
        )
        .from_(exp.to_table("__split").as_("r"))
        .join(exp.to_table("__hits").as_("h"), on=_same("r", "h", inner), join_type="inner")
        .where(exp.and_(exp.column("__in_c", "r"), exp.column("__in_v", "r"), elsewhere))
        .group_by(
            exp.column("__g", "h"),
            *(exp.column(k, "h") for k in keys),
            *(exp.column(k, "r") for k in keys),
        )
    )
    parts = (
        exp.select(
            exp.column("__g", "m"),
            *(exp.column(f"__h{j}", "m").as_(k) for j, k in enumerate(keys)),
            exp.Sum(this=exp.column("__met", "m")).as_("__part"),
        )
        .from_(exp.to_table("__met").as_("m"))
        .join(exp.to_table("__whole").as_("w"), on=_same("m", "w", keys), join_type="inner")
        .where(exp.column("__met", "m") < exp.column("__all", "w"))
        .group_by(exp.column("__g", "m"), *(exp.column(f"__h{j}", "m") for j in range(n)))
    )
    return [("__met", met), ("__parts", parts)]


def _with_pairwise(select: exp.Select, keys: list[str], inner: list[str]) -> exp.Select:
    """``select`` with its signature CTEs replaced by the pairwise ones."""
    oracle = select.copy()
    ctes = oracle.args["with_"].expressions
    kept = [c for c in ctes if c.alias not in SIGNATURE_CTES]
    for name, body in _pairwise_parts(keys, inner):
        kept.append(exp.CTE(this=body, alias=exp.TableAlias(this=exp.to_identifier(name)),
                            materialized=True))  # fmt: skip
    oracle.args["with_"].set("expressions", kept)
    return oracle


def _nonzero_parts(select: exp.Select, keys: list[str]) -> exp.Select:
    """The rows of ``__parts`` with units, under ``select``'s CTEs."""
    parts = exp.select("__g", *keys, "__part").from_("__parts").where("__part <> 0")
    parts.set("with_", select.args["with_"].copy())
    return parts


def _table(con, rng: random.Random) -> None:
    def value(domain):
        return rng.choice([*domain, None]) if rng.random() < 0.15 else rng.choice(domain)

    rows = []
    for unit in range(rng.randint(20, 90)):
        for _ in range(rng.choice([1, 1, 1, 2, 3])):  # a unit's rows may lie in other cells
            rows.append((unit, value("pq"), value("xyz"), value("ABC"), value("DE"),
                         rng.randint(0, 9), rng.choice([0, 0, 5, 7, None])))  # fmt: skip
    con.execute("CREATE OR REPLACE TABLE t (u INT, a VARCHAR, b VARCHAR, v VARCHAR, w VARCHAR, "
                "age INT, x INT)")  # fmt: skip
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?)", rows)


def _side(rng: random.Random, columns: list[list[str]]) -> tuple:
    where = rng.choice([None, exp.column("age") >= rng.randint(1, 6),
                        exp.column("age") < rng.randint(3, 9)])  # fmt: skip
    names = rng.choice(columns)
    return where, [(n, exp.column(n)) for n in names], rng.random() < 0.2


@pytest.mark.parametrize("seed", range(8))
def test_signature_parts_are_the_pairwise_parts(seed):
    """About two cases in five have parts and three in five a finding (12 seeds, 60 cases)."""
    rng = random.Random(seed)
    con = duckdb.connect(config={"threads": 1})
    try:
        _table(con, rng)
        for _ in range(4):
            spec = SimpleNamespace(unit="u", table="t", measure=rng.choice([None, "x"]))
            cut = _side(rng, [["a"], ["a", "b"], ["b", "a"], []])
            cover = _side(rng, [["v"], ["v", "w"], [], ["a"]])
            keys = [f"__c{j}" for j in range(len(cut[1]))]
            inner = [f"__v{j}" for j in range(len(cover[1]))]
            select = _statement(spec, cut, cover, rng.choice([2, 3, 5, 1000]))
            oracle = _with_pairwise(select, keys, inner)
            found = con.execute(_nonzero_parts(select, keys).sql("duckdb")).fetchall()
            expected = con.execute(_nonzero_parts(oracle, keys).sql("duckdb")).fetchall()
            assert sorted(found, key=repr) == sorted(expected, key=repr)
            assert (con.execute(select.sql("duckdb")).fetchall()
                    == con.execute(oracle.sql("duckdb")).fetchall())  # fmt: skip
    finally:
        con.close()


def _hierarchy(con, rng: random.Random) -> None:
    """Units of one to three rows; a municipality ``m`` within a region ``r`` (with a few rows
    whose region is NULL or whose municipality is), sex ``s``, education ``e``."""

    def value(domain):
        return rng.choice([*domain, None]) if rng.random() < 0.15 else rng.choice(domain)

    rows = []
    for unit in range(rng.randint(15, 70)):
        for _ in range(rng.choice([1, 1, 2, 3])):
            m = value("mnopqr")
            region = None if m is None or rng.random() < 0.05 else ("R1" if m in "mno" else "R2")
            rows.append((unit, region, m, value("FM"), value("xyz"), rng.randint(0, 9),
                         rng.choice([0, 3, 7, None])))  # fmt: skip
    con.execute("CREATE OR REPLACE TABLE t (u INT, r VARCHAR, m VARCHAR, s VARCHAR, e VARCHAR, "
                "age INT, x INT)")  # fmt: skip
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?)", rows)


@pytest.mark.parametrize("seed", range(4))
def test_signature_parts_on_hierarchies_of_three_keys(seed):
    """Cuts of three keys over a hierarchy (region, municipality) against covers that share
    keys with them (red team s41k: 180 such cases, 86 with a finding, no difference)."""
    rng = random.Random(seed)
    con = duckdb.connect(config={"threads": 1})
    try:
        _hierarchy(con, rng)
        wheres = [None, exp.column("age") >= 4, exp.column("r").eq(exp.Literal.string("R1")),
                  exp.column("m").is_(exp.null())]  # fmt: skip
        for _ in range(3):
            spec = SimpleNamespace(unit="u", table="t", measure=rng.choice([None, "x"]))
            cut = (rng.choice(wheres),
                   [(n, exp.column(n)) for n in rng.choice(["rms", "mse", "rm", "sre"])],
                   rng.random() < 0.2)  # fmt: skip
            cover = (rng.choice(wheres),
                     [(n, exp.column(n)) for n in rng.choice(["r", "ms", "re", "esm", "m"])],
                     rng.random() < 0.2)  # fmt: skip
            keys = [f"__c{j}" for j in range(len(cut[1]))]
            inner = [f"__v{j}" for j in range(len(cover[1]))]
            select = _statement(spec, cut, cover, rng.choice([2, 3, 5, 1000]))
            oracle = _with_pairwise(select, keys, inner)
            found = con.execute(_nonzero_parts(select, keys).sql("duckdb")).fetchall()
            expected = con.execute(_nonzero_parts(oracle, keys).sql("duckdb")).fetchall()
            assert sorted(found, key=repr) == sorted(expected, key=repr)
            assert (con.execute(select.sql("duckdb")).fetchall()
                    == con.execute(oracle.sql("duckdb")).fetchall())  # fmt: skip
    finally:
        con.close()
