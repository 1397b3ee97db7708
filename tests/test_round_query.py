"""Per-cell rounding (``method: round``, Cox & Kim 2006) in the guarded query path.

Four copies of one population, one per rounding rule, so that the same cells can be compared
across rules and with the raw values. ``blocks`` has exactly 5 persons per block (4,000 blocks):
the cells of the statistical tests. A sum is rounded mean before sum: its cell of n contributors
(rows of non-zero value) and exact sum S publishes R(S·n̂/n), n̂ the cell's published count of
its non-zero rows, ``COUNT(*) ... WHERE income <> 0`` (:func:`mbs_value`).
"""

from __future__ import annotations

import copy
import math

import duckdb
import numpy as np
import pandas as pd
import pytest

import sqlsdc
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import PolicyViolation
from sqlsdc.mechanisms.rounding import round_conventional
from sqlsdc.policy import load_policy

N = 20_000
RULES = {
    "p_conv": ("conventional", 10),
    "p_mod": ("modified_conventional", 4),
    "p_zero": ("zero_restricted", 5),
    "persons": ("unbiased", 10),
}
K = 3


def person_columns(name: str) -> dict:
    pid = (
        {"role": "identifier"}
        if name == "persons"
        else {"role": "identifier", "references": "persons.pid"}
    )
    return {
        "pid": pid,
        "region": {"role": "dimension"},
        "age": {"role": "dimension"},
        "block": {"role": "dimension"},
        "income": {"role": "measure"},
        "balance": {"role": "measure"},
        "huge": {"role": "measure"},
    }


def round_document() -> dict:
    tables = {
        name: {
            "privacy_unit": "pid",
            "columns": person_columns(name),
            "protection": {
                "min_frequency": K,
                "counts": {"method": "round", "base": base, "rounding": rule},
                # rounding itself is tested here: no dominance rule suppresses a block
                "magnitudes": {"method": "round", "base": base, "rounding": rule, "dominance": []},
            },
        }
        for name, (rule, base) in RULES.items()
    }
    tables["plain"] = {  # same rows, threshold: joins with it mix methods
        "privacy_unit": "pid",
        "columns": person_columns("other"),
        "protection": {"min_frequency": K},
    }
    tables["mixed"] = {
        "privacy_unit": "pid",
        "columns": person_columns("other"),
        "protection": {
            "counts": {"method": "ckm", "ptable": {"D": 2, "V": 1}},
            "magnitudes": {"method": "round", "base": 10},
        },
    }
    tables["exact"] = {  # counts exact (threshold): a sum is its own rounding, n̂ = n
        "privacy_unit": "pid",
        "columns": person_columns("other"),
        "protection": {
            "min_frequency": K,
            "counts": {"method": "threshold"},
            "magnitudes": {
                "method": "round",
                "base": 4,
                "rounding": "modified_conventional",
                "dominance": [],
            },
        },
    }
    tables["exact10"] = {  # persons' magnitudes rule, exact counts: no one count of a join
        **tables["exact"],
        "protection": {"min_frequency": K, "counts": {"method": "threshold"},
                       "magnitudes": tables["persons"]["protection"]["magnitudes"]},
    }  # fmt: skip
    tables["lookup"] = {  # public: its listed columns are readable as they are
        "kind": "public",
        "key": "code",
        "columns": {"code": {"role": "dimension"}, "label": {"role": "dimension"}},
    }
    return {
        "tables": tables,
        "users": {
            "admin": {"role": "admin"},
            "ana": {"role": "analyst"},
            "bob": {"role": "analyst"},
        },  # fmt: skip
    }


def make_db(path) -> None:
    rng = np.random.default_rng(2006)
    persons = pd.DataFrame(
        {
            "pid": np.arange(N),
            "region": rng.choice(["N", "S", "E", "W"], N, p=[0.4, 0.3, 0.2, 0.1]),
            "age": rng.integers(0, 90, N),
            "block": np.arange(N) // 5,
            "income": rng.integers(0, 5000, N),
        }
    )
    persons["balance"] = persons["income"] - 2500  # negative values too
    persons["huge"] = persons["income"] * 1e36  # DOUBLE, sums beyond HUGEINT (2^127)
    persons.loc[:1, "region"] = "tiny"  # 2 persons: below min_frequency
    lookup = pd.DataFrame({"code": ["N", "S"], "label": ["north", "south"]})
    con = duckdb.connect(str(path))
    con.register("frame", persons)
    for name in (*RULES, "plain", "mixed", "exact", "exact10"):
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM frame")
    con.register("lk", lookup)
    con.execute("CREATE TABLE lookup AS SELECT * FROM lk")
    con.close()
    sqlsdc.init(path, round_document())


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("round") / "round.duckdb"
    make_db(path)
    return path


@pytest.fixture(scope="module")
def raw(db):
    con = open_database(db)  # sqlsdc's settings: DuckDB shares one instance per file
    yield con
    con.close()


@pytest.fixture(scope="module")
def ana(db):
    con = sqlsdc.connect(db, user="ana")
    yield con
    con.close()


def rows(con, sql) -> dict:
    """{key: value} of a two-column result (ints where exact)."""
    return {k: (None if v is None else _num(v)) for k, v in con.execute(sql).fetchall()}


def _num(v):
    return int(v) if float(v) == int(v) else float(v)


def by_block(con, table, aggregate="SUM(income)") -> tuple[np.ndarray, np.ndarray]:
    out = rows(con, f"SELECT block, {aggregate} FROM {table} GROUP BY block")
    keys = np.array(sorted(out))
    return keys, np.array([out[k] for k in keys], dtype=float)


def mbs_value(ana, raw, table, measure="income") -> tuple[np.ndarray, np.ndarray]:
    """(blocks, S·n̂/n) of SUM(measure) by block: the value its rounding rounds, with S the
    exact sum, n its contributors (rows of non-zero value) and n̂ their published count (0/1
    where there are none: S is 0)."""
    keys, total = by_block_sql(raw, f"SELECT block, SUM({measure}) FROM {table} GROUP BY block")
    contributors = f"SELECT block, COUNT(*) FROM {table} WHERE {measure} <> 0 GROUP BY block"
    n, shown = rows(raw, contributors), rows(ana, contributors)
    ratio = np.array([shown.get(k, 0) / n.get(k, 1) for k in keys], dtype=float)
    return keys, total * ratio


def by_block_sql(con, sql) -> tuple[np.ndarray, np.ndarray]:
    out = rows(con, sql)
    keys = np.array(sorted(out))
    return keys, np.array([out[k] for k in keys], dtype=float)


# -- published values ----------------------------------------------------------------------------


@pytest.mark.parametrize("table", list(RULES))
@pytest.mark.parametrize("aggregate", ["COUNT(*)", "SUM(income)"])
def test_values_are_adjacent_multiples_of_the_base(ana, raw, table, aggregate):
    """Counts round to an adjacent multiple of the exact count, sums of the mean times the
    published count (mean before sum)."""
    rule, base = RULES[table]
    sql = f"SELECT age, {aggregate} FROM {table} GROUP BY age"
    protected = rows(ana, sql)
    exact = rows(raw, sql)
    if aggregate.startswith("SUM"):
        contributors = f"SELECT age, COUNT(*) FROM {table} WHERE income <> 0 GROUP BY age"
        shown, n = rows(ana, contributors), rows(raw, contributors)
        exact = {age: total * shown.get(age, 0) / n.get(age, 1) for age, total in exact.items()}
    assert protected.keys() == exact.keys() and len(exact) == 90
    for age, value in protected.items():
        assert value % base == 0
        assert abs(value - exact[age]) < base  # adjacent: the multiple below or above
        if rule == "zero_restricted" and exact[age] % base == 0:
            assert value == exact[age]


def test_conventional_equals_the_hand_formula(ana, raw):
    keys, protected = by_block(ana, "p_conv", "COUNT(*)")
    _, exact = by_block(raw, "p_conv", "COUNT(*)")
    by_hand = np.floor(exact / 10) * 10 + np.where(exact % 10 >= 5, 10, 0)
    assert np.array_equal(protected, by_hand)
    assert np.array_equal(protected, round_conventional(exact, 10))  # the reference rule
    # a sum: the rule applied to S·n̂/n, here 2S (5 persons a block, published as 10), or 0
    # where one of them has income 0 (4 contributors, published as 0)
    _, protected = by_block(ana, "p_conv")
    _, x = mbs_value(ana, raw, "p_conv")
    _, total = by_block(raw, "p_conv")
    _, contributors = by_block(raw, "p_conv", "COUNT(NULLIF(income, 0))")
    assert 0 < (contributors == 4).sum() < 10 and (contributors >= 4).all()
    assert np.array_equal(x, np.where(contributors == 5, 2 * total, 0))
    assert np.array_equal(protected, round_conventional(x, 10))


def test_negative_sums_round_by_floor_and_remainder(ana, raw):
    """A sum of negative values rounds to an adjacent multiple by the same rule (R(x) = qB +
    R(r) with q the floor, not the truncation), mean before sum as any other."""
    keys, protected = by_block(ana, "p_conv", "SUM(balance)")
    _, x = mbs_value(ana, raw, "p_conv", measure="balance")
    assert (x < 0).sum() > 1000
    assert np.array_equal(protected, round_conventional(x, 10))
    _, zero = by_block(ana, "p_zero", "SUM(balance)")
    _, x = mbs_value(ana, raw, "p_zero", measure="balance")
    assert np.all(zero % 5 == 0) and np.all(np.abs(zero - x) < 5)


def test_a_sum_keeps_its_type_and_a_huge_one_does_not_fail(ana, raw):
    """Integers sum to HUGEINT multiples of the base; floating-point values to DOUBLE ones,
    which may lie beyond HUGEINT (a cast there would fail for such data only, an error that
    tells it): 1e36 times the incomes, summed by region, near 1e43."""
    sql = "SELECT region, SUM({}) AS s FROM persons GROUP BY region ORDER BY region"
    types = {
        measure: ana.execute(sql.format(measure)).arrow().schema.field("s").type
        for measure in ("income", "huge")
    }
    assert str(types["income"]).startswith("decimal128(38") and str(types["huge"]) == "double"
    huge = dict(ana.execute(sql.format("huge")).fetchall())
    exact = dict(raw.execute(sql.format("huge")).fetchall())
    shown = {k: v for k, v in huge.items() if v is not None}
    assert len(shown) == 4 and all(1e41 < v < 1e44 for v in shown.values())
    assert all(abs(v / exact[k] - 1) < 0.01 for k, v in shown.items())


def test_modified_conventional_only_randomises_halves(ana, raw):
    """On ``exact``, whose counts are exact: the sum's rounded value is S itself, a quarter
    of them halves of the base 4 (the mean-before-sum values of ``p_mod`` seldom are)."""
    keys, protected = by_block(ana, "exact")
    _, exact = by_block(raw, "exact")
    r = exact % 4
    assert np.array_equal(protected[r != 2], round_conventional(exact[r != 2], 4))
    up = protected[r == 2] > exact[r == 2]
    assert 0.4 < up.mean() < 0.6 and len(up) > 500  # halves go up or down, 1/2 each


def test_zero_restricted_leaves_multiples_and_flips_a_fair_coin(ana, raw):
    _, protected = by_block(ana, "p_zero")
    _, exact = mbs_value(ana, raw, "p_zero")
    multiple = exact % 5 == 0
    assert multiple.sum() > 500 and np.array_equal(protected[multiple], exact[multiple])
    up = protected[~multiple] > exact[~multiple]
    z = (up.sum() - up.size / 2) / math.sqrt(up.size / 4)
    assert abs(z) < 4


def z_bias(protected: np.ndarray, exact: np.ndarray, base: int) -> float:
    """z of Σ(R(x) - x) under unbiased rounding: E = 0, Var(R(x) - x) = r(B - r) per cell."""
    r = exact % base
    return float((protected - exact).sum() / math.sqrt((r * (base - r)).sum()))


def test_unbiased_rounding_is_unbiased_over_many_cells(ana, raw):
    keys, protected = by_block(ana, "persons")
    _, x = mbs_value(ana, raw, "persons")
    assert len(keys) == N // 5 >= 2000
    assert abs(z_bias(protected, x, 10)) < 4
    # the frequency of rounding up given r is r/B (pooled over r = 1..9, χ²-free check per r),
    # over the blocks of 5 contributors, whose x is 2S or 0: even remainders only (a block with
    # an income 0 has 4, and x = 2.5·S or 0 by its count's coin)
    _, contributors = by_block(raw, "persons", "COUNT(NULLIF(income, 0))")
    protected, x = protected[contributors == 5], x[contributors == 5]
    r = x % 10
    assert set(r) == {0, 2, 4, 6, 8}
    for rem in (2, 4, 6, 8):
        up = (protected[r == rem] > x[r == rem]).mean()
        n = (r == rem).sum()
        assert abs(up - rem / 10) < 4 * math.sqrt(rem / 10 * (1 - rem / 10) / n)


def test_a_sum_is_unbiased_with_its_counts_rounding(ana, raw):
    """Unbiased rules for both: E[R(S·n̂/n)] = S, the count's coin (the cell key) independent
    of the sum's (the key rotated). A block of 5 publishes n̂ = 0 or 10 (1/2 each), so x = 0
    or 2S: Var(published - S) = S² + E[r(B - r)] per cell."""
    _, protected = by_block(ana, "persons")
    _, total = by_block(raw, "persons")
    _, x = mbs_value(ana, raw, "persons")
    assert 0.45 < (x == 0).mean() < 0.55
    r = x % 10
    z = (protected - total).sum() / math.sqrt((total**2 + r * (10 - r)).sum())
    assert abs(z) < 4


def test_the_bias_test_detects_a_biased_rule(ana, raw):
    """The test above can fail: conventional rounding with even B (biased up at r = B/2, Cox &
    Kim Table 1) of the counts of the same blocks (5 each, all published as 10) is far outside
    the bound."""
    _, protected = by_block(ana, "p_conv", "COUNT(*)")
    _, exact = by_block(raw, "p_conv", "COUNT(*)")
    assert z_bias(protected, exact, 10) > 6


# -- same cell, same answer ---------------------------------------------------------------------


def test_the_same_cell_rounds_the_same_way_everywhere(db, ana):
    grouped = rows(ana, "SELECT region, COUNT(*) FROM persons GROUP BY region")
    total = {"N": grouped["N"]}
    rephrased = [
        "SELECT 'N', COUNT(*) FROM persons WHERE region = 'N'",
        "SELECT 'N', COUNT(DISTINCT pid) FROM persons WHERE region = 'N' AND age >= 0",
        "SELECT r, COUNT(*) FROM (SELECT region AS r FROM persons) t WHERE r = 'N' GROUP BY r",
        "SELECT region, COUNT(*) AS n FROM persons GROUP BY ROLLUP (region) HAVING region = 'N'",
        "SELECT p.region, COUNT(*) FROM persons p JOIN lookup l ON p.region = l.code "
        "WHERE l.label = 'north' GROUP BY p.region",
    ]
    for sql in rephrased:
        assert rows(ana, sql) == total, sql
    with sqlsdc.connect(db, user="bob") as bob:
        assert rows(bob, "SELECT region, COUNT(*) FROM persons GROUP BY region") == grouped
    sums = "SELECT block, SUM(income) FROM persons WHERE block < 300 GROUP BY block"
    assert rows(ana, sums) == rows(ana, sums.replace("block < 300", "block <= 299"))


# -- the rest of the query sees rounded values only -------------------------------------------


def test_having_and_order_by_see_rounded_values(ana, raw):
    sql = "SELECT block, COUNT(*) FROM p_zero WHERE block < 50 GROUP BY block"
    assert set(rows(raw, sql).values()) == {5}
    # every block has 5 persons (a multiple: stays 5), so HAVING on 5 keeps them all
    assert len(rows(ana, sql.replace("GROUP BY block", "GROUP BY block HAVING COUNT(*) = 5"))) == 50
    sums = "SELECT block, SUM(income) AS s FROM persons WHERE block < 400 GROUP BY block"
    protected = rows(ana, sums)
    exact = rows(raw, sums)
    kept = rows(ana, sums.replace("GROUP BY block", "GROUP BY block HAVING SUM(income) % 10 = 0"))
    assert kept == protected  # every rounded value is a multiple, whatever the raw one
    assert sum(v % 10 == 0 for v in exact.values()) < len(exact) / 2
    ordered = ana.execute(sums + " ORDER BY s DESC, block LIMIT 20").fetchall()
    expected = sorted(protected.items(), key=lambda kv: (-kv[1], kv[0]))[:20]
    assert [(b, _num(s)) for b, s in ordered] == expected


def test_a_query_over_rounded_cells_counts_the_groups_the_guard_shows(ana):
    """Where an outer query counts the groups, their presence is decided on the group's count
    ``__n``, which the frame carries on (it dropped the group's key with the cell keys once: a
    binder error for every such query)."""
    for inner in ("SUM(income) AS s", "COUNT(*) AS s"):
        sql = f"SELECT COUNT(*) FROM (SELECT block, {inner} FROM persons GROUP BY block) AS t"
        assert ana.execute(sql).fetchall() == [(N // 5,)]  # 5 persons each, k = 3: all shown


def test_small_cells_are_suppressed(ana, raw):
    assert rows(raw, "SELECT region, COUNT(*) FROM persons GROUP BY region")["tiny"] == 2
    cur = ana.execute("SELECT region, COUNT(*) AS n FROM persons GROUP BY region ORDER BY region")
    result = dict(cur.fetchall())
    assert result["tiny"] is None and all(v % 10 == 0 for k, v in result.items() if k != "tiny")
    assert sorted(cur.cell_status()["n"]) == ["published"] * 4 + ["suppressed"]


def test_explain_names_the_mechanism(ana):
    plan = ana.explain("SELECT region, COUNT(*) AS n, SUM(income) AS s FROM p_mod GROUP BY region")
    described = {c["name"]: c for c in plan.to_dict()["columns"]}
    assert described["n"]["mechanism"] == "round"
    assert (described["n"]["base"], described["n"]["rounding"]) == (4, "modified_conventional")
    assert "n: round (base 4, modified_conventional; min_frequency 3)" in str(plan)


# -- policy validation -------------------------------------------------------------------------


def policy_with(counts: dict) -> dict:
    document = copy.deepcopy(round_document())
    document["tables"]["persons"]["protection"]["counts"] = counts
    return document


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        ({"method": "round"}, r"persons\.protection\.counts\.base: method round needs the"),
        ({"method": "threshold", "base": 5}, r"counts: base only apply to method round"),
        (
            {"method": "ckm", "ptable": {"D": 2, "V": 1}, "rounding": "unbiased"},
            r"counts: rounding only apply to method round",
        ),
        ({"method": "round", "base": 5, "ptable": {"D": 2, "V": 1}}, r"ptable do not apply to"),
        ({"method": "round", "base": 1}, r"base"),
        ({"method": "round", "base": 5, "rounding": "stochastic"}, r"rounding"),
        ({"method": "dp", "spend": {"epsilon": 1}, "base": 5}, r"base do not apply to method dp"),
    ],
)
def test_policy_errors(counts, message):
    with pytest.raises(sqlsdc.PolicyError, match=message):
        load_policy(policy_with(counts))


def test_policy_defaults_to_unbiased_rounding():
    rule = load_policy(policy_with({"method": "round", "base": 3})).table("persons").rule
    from sqlsdc.policy import AggregateKind, Method, Rounding

    counts = rule(AggregateKind.COUNTS)
    assert (counts.method, counts.base, counts.rounding) == (Method.ROUND, 3, Rounding.UNBIASED)
    assert counts.min_frequency == K


# -- abuse (tests/security style): reading around the rounding ---------------------------------


def test_differencing_recovers_no_more_than_rounding_allows(ana, raw):
    """COUNT(age = a) = COUNT(all) - COUNT(age <> a): both terms are rounded, so the guess is a
    multiple of the base and is exact only where the raw count already is a multiple."""
    total = rows(ana, "SELECT 1, COUNT(*) FROM persons")[1]
    hits = multiples = 0
    for age in range(0, 90, 3):
        others = rows(ana, f"SELECT 1, COUNT(*) FROM persons WHERE age <> {age}")[1]
        exact = rows(raw, f"SELECT 1, COUNT(*) FROM persons WHERE age = {age}")[1]
        guess = total - others
        assert guess % 10 == 0 and abs(guess - exact) < 20
        hits += guess == exact
        multiples += exact % 10 == 0
    assert hits <= multiples < 30 / 2


def test_repeating_and_rephrasing_cannot_average_the_rounding_away(ana, raw):
    """Unbiased rounding is unbiased over cells, not over repetitions: the same cell asked in
    many forms always gives the same value, so averaging the answers gives nothing back."""
    forms = [
        "SELECT 1, SUM(income) FROM persons WHERE region = '{r}'",
        "SELECT 1, SUM(income) FROM persons WHERE region IN ('{r}')",
        "SELECT 1, SUM(CAST(income AS DOUBLE)) FROM persons WHERE region = '{r}'",
        "SELECT 1, SUM(income) FROM persons WHERE region = '{r}' AND age < 1000",
        "SELECT 1, SUM(income) AS s FROM persons WHERE '{r}' = region",
    ]
    for region in ("N", "S", "E", "W"):
        exact = rows(raw, forms[0].format(r=region))[1]
        answers = {rows(ana, sql.format(r=region))[1] for sql in forms}
        assert len(answers) == 1
        answer = answers.pop()
        assert answer % 10 == 0 and (answer != exact or exact % 10 == 0)


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT region, SUM(__rkey) FROM persons GROUP BY region", r"__rkey"),
        ("SELECT __rkey FROM persons", r"__rkey"),
        (
            "SELECT region, SUM(income) FROM mixed GROUP BY region",
            r"counts of mixed are protected by the cell key method",
        ),
        (
            "SELECT p.region, SUM(p.income) FROM persons p JOIN exact10 q ON p.pid = q.pid "
            "GROUP BY p.region",
            r"are not all rounded \(or all exact\) by one rule",
        ),
        (
            "SELECT p.region, COUNT(*) FROM persons p JOIN plain q ON p.pid = q.pid "
            "GROUP BY p.region",
            r"different methods or parameters",
        ),
        (
            "SELECT p.region, SUM(p.income) FROM persons p JOIN p_conv q ON p.pid = q.pid "
            "GROUP BY p.region",
            r"different methods or parameters",
        ),
    ],
)
def test_keys_and_mixed_methods_are_refused(ana, sql, message):
    with pytest.raises(PolicyViolation, match=message):
        ana.execute(sql)


def test_a_mixed_table_answers_counts_and_refuses_rounded_sums(ana):
    """Beside CKM counts a rounded sum has no rounded count to be published over, and rounded
    by itself a sum of pinned values (v·n) tells the count the noise hides."""
    counts = rows(ana, "SELECT region, COUNT(*) FROM mixed GROUP BY region")
    assert counts.keys() <= {"N", "S", "E", "W", "tiny"} and len(counts) >= 4
    with pytest.raises(PolicyViolation, match="which tells the count n the noise hides"):
        ana.execute("SELECT age, SUM(age) FROM mixed WHERE age = 80 GROUP BY age")


def test_beside_exact_counts_a_sum_is_its_own_rounding(ana, raw):
    """Under the threshold rule the counts are published exactly, so n̂ = n and the sum is
    rounded as it is: R(S)."""
    _, protected = by_block(ana, "exact")
    _, exact = by_block(raw, "exact")
    assert np.all(protected % 4 == 0) and np.all(np.abs(protected - exact) < 4)
    assert rows(ana, "SELECT 1, COUNT(*) FROM exact WHERE block < 7")[1] == 35
