"""Long chains of equalities on one column are checked as the IN lists they mean
(``planner/connectors.fold_comparisons``): the same answers as written, the same decisions as
the IN list (which an analyst may write anyway), and nothing folded that could compare
differently."""

from __future__ import annotations

import random

import duckdb
import pytest
from test_dp_query import dp_document, make_db

import sqlsdc
from sqlsdc.guard.parse import parse_statement

GROUPED = "SELECT region, COUNT(*) FROM persons WHERE {} GROUP BY region"


def _where(condition: str) -> str:
    """The WHERE clause ``parse_statement`` makes of ``condition``."""
    return parse_statement(f"SELECT 1 FROM t WHERE {condition}").args["where"].this.sql("duckdb")


def _chain(connector: str, terms) -> str:
    return f" {connector} ".join(terms)


def test_an_or_chain_of_equalities_becomes_an_in_list_where_its_first_member_stood():
    condition = _chain(
        "OR", ["y > 1", *(f"x = {i}" for i in range(20)), "z = 'a'", "-5 = x", "x = 99"]
    )
    listed = ", ".join(map(str, range(20)))
    assert _where(condition) == f"y > 1 OR x IN ({listed}, -5, 99) OR z = 'a'"


def test_an_and_chain_of_inequalities_becomes_a_negated_in_list():
    condition = _chain("AND", [f"x <> 'v{i}'" for i in range(17)])
    listed = ", ".join(f"'v{i}'" for i in range(17))
    assert _where(condition) == f"NOT x IN ({listed})"


@pytest.mark.parametrize(
    "terms",
    [
        [f"x = {i}" for i in range(16)],  # short: as written
        [f"x <> {i}" for i in range(20)],  # an OR of inequalities means no list
        [f"x > {i}" for i in range(20)],
        [f"x = {i}.5" for i in range(20)],  # decimals: a list would be typed as a whole
        [f"x = {2**63 + i}" for i in range(20)],  # beyond BIGINT
        [f"x = -{2**63 + 1 + i}" for i in range(20)],
        [f"x = y + {i}" for i in range(20)],  # not literals
        [f"x = {i} /* c */" for i in range(20)],  # comments stay where they were written
        [f"x /* c */ = {i}" for i in range(20)],
        [f"x = {'9' * 5000}{i}" for i in range(20)],  # beyond Python's digits for int()
        [f"x IS NOT DISTINCT FROM {i}" for i in range(20)],
        [f"{'x' if i % 2 else 'X'} = {i}" for i in range(32)],  # 16 of each spelling
    ],
    ids=[
        "short",
        "or-of-inequalities",
        "ranges",
        "decimals",
        "beyond-bigint",
        "beyond-bigint-negative",
        "expressions",
        "comments",
        "comments-on-columns",
        "thousands-of-digits",
        "null-safe",
        "two-spellings",
    ],
)
def test_what_could_compare_differently_or_is_short_stays_as_written(terms):
    condition = _chain("OR", terms)
    assert "IN (" not in _where(condition)


def test_an_and_chain_of_equalities_stays_as_written():
    assert "IN (" not in _where(_chain("AND", [f"x = {i}" for i in range(20)]))


def test_kinds_and_columns_get_lists_of_their_own():
    terms = [f"x = {i}" for i in range(17)] + [f"x = 's{i}'" for i in range(17)]
    terms += [f"t.x = {i}" for i in range(17)] + [f'"x" = {i}' for i in range(17)]
    where = _where(_chain("OR", terms))
    assert where.count(" IN (") == 4
    assert "x IN (0, 1," in where and "x IN ('s0', 's1'," in where
    assert "t.x IN (0," in where and '"x" IN (0,' in where


def test_chains_nested_in_parentheses_are_folded_too():
    inner = "(" + _chain("OR", [f"x = {i}" for i in range(17)]) + ")"
    where = _where(_chain("AND", [inner, "y = 1", inner]))
    assert where.count("x IN (0, 1, 2,") == 2 and where.count("(x IN") == 2


def test_rows_of_a_filter_on_several_columns_are_factored_into_an_in_list():
    """``(x = i AND y = 'a') OR ...``, the rows of a two-column filter, become one AND with the
    column that varies as an IN list, per value of the other terms, where each group's first
    member stood; short groups stay as written."""
    rows = [f"(x = {i} AND y = 'a')" for i in range(17)] + ["z > 1"]
    rows += [f"(y = 'b' AND x = {i})" for i in range(17)] + ["(x = 0 AND y = 'c')"]
    listed = ", ".join(map(str, range(17)))
    assert _where(_chain("OR", rows)) == (
        f"(x IN ({listed}) AND y = 'a') OR z > 1 OR (y = 'b' AND x IN ({listed})) "
        "OR (x = 0 AND y = 'c')"
    )
    exclusions = _chain("AND", [f"(x <> {i} OR y <> 'a')" for i in range(17)])
    assert _where(exclusions) == f"(NOT x IN ({listed}) OR y <> 'a')"


@pytest.mark.parametrize(
    "rows",
    [
        [f"(x = {i} AND y = 'a')" for i in range(16)],  # short
        [f"(x = {i} AND y = {i})" for i in range(20)],  # nothing in common
        [f"(x = {i} AND y > 1)" for i in range(20)],  # a term that is not an equality
        [f"(x = {i} AND y = 'a' /* c */)" for i in range(20)],
        [f"(x = {i} AND x = 1)" for i in range(20)],  # the column twice
        [f"(x = {i} OR y = 'a')" for i in range(20)],  # an OR of ORs is one chain already
        [f"(x = {i} AND y = {'0' * (i % 2)}1)" for i in range(32)],  # 01 is not 1 as written
        [
            "(" + _chain("AND", [f"c{j} = 1" for j in range(9)] + [f"x = {i}"]) + ")"
            for i in range(20)
        ],  # fmt: skip
    ],
    ids=[
        "short",
        "no-common-part",
        "range",
        "comment",
        "column-twice",
        "or",
        "spelling",
        "long-rows",
    ],  # fmt: skip
)
def test_rows_that_could_compare_differently_or_are_few_stay_as_written(rows):
    assert "IN (" not in _where(_chain("OR", rows))


# --- the same answers: DuckDB evaluates the folded tree as it evaluates the chain -------------

DATA = """
CREATE TABLE t AS SELECT
    CASE WHEN i % 11 = 0 THEN NULL ELSE i % 40 - 10 END AS n,
    CASE WHEN i % 13 = 0 THEN NULL ELSE 'v' || (i % 30) END AS s,
    CASE WHEN i % 17 = 0 THEN NULL ELSE DATE '2020-01-01' + (i % 25)::INT END AS d,
    CASE WHEN i % 7 = 0 THEN NULL ELSE lpad((i % 20)::VARCHAR, 2, '0') END AS padded,
    (i % 9)::SMALLINT AS small
FROM range(600) AS r(i)
"""
LITERALS = {
    "n": lambda r: str(r.randint(-12, 35)),
    "s": lambda r: f"'v{r.randint(0, 35)}'",
    "d": lambda r: f"'2020-01-{r.randint(1, 31):02d}'",
    "padded": lambda r: r.choice([f"'{r.randint(0, 25):02d}'", f"'{r.randint(0, 25)}'"]),
    "small": lambda r: str(r.choice([r.randint(-3, 12), 40_000, 2**62])),
}


def _random_chain(rng: random.Random) -> str:
    connector = rng.choice(["OR", "AND"])
    comparison = "=" if connector == "OR" else "<>"
    columns = rng.sample(list(LITERALS), rng.randint(1, 3))
    terms = []
    for _ in range(rng.randint(17, 80)):
        column = rng.choice(columns)
        literal = LITERALS[column](rng)
        term = (
            f"{column} {comparison} {literal}"
            if rng.random() < 0.8
            else (f"{literal} {comparison} {column}")
        )
        terms.append(term if rng.random() < 0.9 else f"small > {rng.randint(0, 8)}")
    return _chain(connector, terms)


def _random_rows(rng: random.Random) -> str:
    """An OR of ANDs of equalities (or its dual), many of whose rows share all terms but one."""
    connector, inner, comparison = rng.choice([("OR", "AND", "="), ("AND", "OR", "<>")])
    columns = rng.sample(list(LITERALS), rng.randint(2, 3))
    shared = {c: [LITERALS[c](rng) for _ in range(rng.randint(1, 2))] for c in columns}
    rows = []
    for _ in range(rng.randint(20, 50)):
        varying = columns[rng.random() < 0.2]
        terms = [
            f"{c} {comparison} {LITERALS[c](rng) if c == varying else rng.choice(shared[c])}"
            for c in rng.sample(columns, len(columns))
        ]
        rows.append("(" + _chain(inner, terms) + ")" if rng.random() < 0.95 else "small > 3")
    return _chain(connector, rows)


@pytest.mark.parametrize(
    ("chains", "seed", "count", "least_folded", "least_selections"),
    [(_random_chain, 20261126, 400, 250, 50), (_random_rows, 20261127, 60, 20, 25)],
    ids=["chains", "rows-of-several-columns"],
)
def test_folded_chains_have_the_same_truth_values_as_written(
    chains, seed, count, least_folded, least_selections
):
    """Random chains over columns with NULLs (integers, strings, dates, strings compared as
    written and as numbers would be, a SMALLINT compared with wider integers): on every row,
    DuckDB gives the tree the guard checks the truth value (true, false or NULL) of the chain.
    Chains of comparisons become IN lists; ORs of ANDs of equalities (and ANDs of ORs of
    ``<>``) are factored."""
    con = duckdb.connect()
    con.execute(DATA)
    rng = random.Random(seed)
    folded_some, selected = 0, set()
    for _ in range(count):
        chain = chains(rng)
        folded = _where(chain)
        folded_some += " IN (" in folded
        differ, true = con.execute(
            f"SELECT count(*) FILTER (WHERE ({chain}) IS DISTINCT FROM ({folded})), "
            f"count(*) FILTER (WHERE {chain}) FROM t"
        ).fetchone()
        assert differ == 0, chain
        selected.add(true)
    assert folded_some > least_folded and len(selected) > least_selections  # varied


# --- the same decisions as the IN list an analyst could write ----------------------------------


@pytest.mark.parametrize(
    ("terms", "refusal"),
    [
        ([f"region = {i}" for i in range(20)], "could raise an error for some confidential"),
        ([f"person_id = {i}" for i in range(20)], "identifier"),
        ([f"secret_column = {i}" for i in range(20)], "name resolution failed"),
    ],
    ids=["cast-of-confidential-values", "identifier", "unknown-column"],
)
def test_a_refused_comparison_is_refused_in_a_long_chain(analyst, terms, refusal):
    for chain in (_chain("OR", terms), _chain("AND", [t.replace("=", "<>") for t in terms])):
        with pytest.raises(sqlsdc.PolicyViolation, match=refusal):
            analyst.explain(GROUPED.format(chain))


def test_a_refused_comparison_is_refused_in_factored_rows(analyst):
    rows = [f"(sex = 'F' AND region = {i})" for i in range(20)]
    with pytest.raises(sqlsdc.PolicyViolation, match="could raise an error for some confidential"):
        analyst.explain(GROUPED.format(_chain("OR", rows)))
    rows = [f"(sex = 'F' AND person_id = {i})" for i in range(20)]
    with pytest.raises(sqlsdc.PolicyViolation, match="identifier"):
        analyst.explain(GROUPED.format(_chain("OR", rows)))


def test_a_chain_and_its_in_list_are_one_population(analyst):
    """Written either way, a filter selects one population: the same protected SQL and the
    same cell identity, so neither way gives a second noise draw over the same cells."""
    values = [f"'R0{i % 9 + 1}'" for i in range(18)] + [f"'R{i:02d}'" for i in range(10, 30)]
    chain = analyst.explain(GROUPED.format(_chain("OR", [f"region = {v}" for v in values])))
    listed = analyst.explain(GROUPED.format(f"region IN ({', '.join(values)})"))
    assert (chain.fingerprint, chain.population) == (listed.fingerprint, listed.population)
    rows = analyst.execute(GROUPED.format(_chain("OR", [f"region = {v}" for v in values])))
    assert sorted(rows.fetchall()) == sorted(
        analyst.execute(GROUPED.format(f"region IN ({', '.join(values)})")).fetchall()
    )


def test_under_dp_the_other_spelling_is_the_cached_answer(tmp_path):
    """The chain and its IN list are one statistic: asked the other way, the answer comes back
    from the cache, the same values, with nothing charged."""
    path = tmp_path / "dp.duckdb"
    make_db(path, dp_document())
    ages = list(range(20, 60))
    chain = " OR ".join(f"age = {a}" for a in ages)
    listed = f"age IN ({', '.join(map(str, ages))})"
    sql = "SELECT region, COUNT(*) FROM persons WHERE {} GROUP BY region ORDER BY region"
    with sqlsdc.connect(path, "ana") as con:
        first = con.execute(sql.format(chain)).fetchall()
        spent = {s.key: s.spent for s in con.remaining_budget()}
        assert con.execute(sql.format(listed)).fetchall() == first
        assert {s.key: s.spent for s in con.remaining_budget()} == spent
        other = con.execute(sql.format(listed.replace("20,", "19,"))).fetchall()
        assert {s.key: s.spent for s in con.remaining_budget()} != spent  # a new statistic
    assert len(first) == 4 and other != first
