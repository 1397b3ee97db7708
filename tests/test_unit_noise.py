"""Permanent per-unit noise for CKM magnitudes (s45a): the split-triangular factor, its SQL,
the policy's ``unit_noise`` and the guarded sums that use it."""

from __future__ import annotations

import copy
import random
import re
import statistics
from importlib import resources

import duckdb
import numpy as np
import pytest
import sqlglot
import yaml
from scipy import stats
from sqlglot import exp

import sqlsdc
from sqlsdc.mechanisms.ckm import MIX_PRIME, MixKeys, keyed_mix
from sqlsdc.mechanisms.parameters import UnitNoise
from sqlsdc.mechanisms.unit_noise import cdf, factor, salt_name, uniform, unit_factor
from sqlsdc.policy import AggregateKind, load_policy, validate_document
from sqlsdc.rewrite.unit_noise import unit_factor_sql

D2 = UnitNoise(1.05, 1.15)  # Massell, Zayatz & Funk's D2: [0.85, 0.95] ∪ [1.05, 1.15]
KEYS = MixKeys.from_secret(b"a test secret of 32 bytes, fixed")


def _factors(n: int, noise: UnitNoise, measure: str = "t.x") -> list[float]:
    rng = random.Random(45)
    return [unit_factor(rng.getrandbits(32), measure, noise, KEYS) for _ in range(n)]


def test_factors_follow_the_split_triangular_distribution():
    """KS test of 20,000 units' factors (random record keys through the secret mix) against
    the split triangular's distribution function; every factor in (2−b, 2−a) ∪ (a, b) and
    E|m − 1| = (a − 1) + (b − a)/3 (seed_2006_microdata.md T10)."""
    for noise in (D2, UnitNoise(1.1, 1.2)):
        factors = _factors(20_000, noise)
        assert all(noise.a < abs(m - 1) + 1 < noise.b for m in factors)
        result = stats.kstest(factors, np.vectorize(lambda v, n=noise: cdf(v, n)))
        assert result.pvalue > 0.01, result
        expected = (noise.a - 1) + (noise.b - noise.a) / 3
        assert statistics.mean(abs(m - 1) for m in factors) == pytest.approx(expected, abs=0.002)
        assert 0.48 < sum(m > 1 for m in factors) / len(factors) < 0.52


def test_the_inverse_distribution_function_at_its_ends_and_middle():
    assert factor(1e-12, D2) == pytest.approx(0.85, abs=1e-5)
    assert factor(0.5 - 1e-12, D2) == pytest.approx(0.95, abs=1e-5)
    assert factor(0.5 + 1e-12, D2) == pytest.approx(1.05, abs=1e-5)
    assert factor(1 - 1e-12, D2) == pytest.approx(1.15, abs=1e-5)
    for u in (0.01, 0.2, 0.49, 0.51, 0.8, 0.99):
        assert cdf(factor(u, D2), D2) == pytest.approx(u, abs=1e-12)
    assert uniform(0) > 0 and uniform(MIX_PRIME - 1) < 1


def test_one_factor_per_unit_and_measure():
    """A unit's factor is a function of its record key, the measure and the secret: the same
    for every call, different for another unit, another measure or another secret."""
    rkey = 123_456_789
    m = unit_factor(rkey, "enterprises.turnover", D2, KEYS)
    assert unit_factor(rkey, "enterprises.turnover", D2, KEYS) == m
    assert unit_factor(rkey + 1, "enterprises.turnover", D2, KEYS) != m
    assert unit_factor(rkey, "enterprises.employees", D2, KEYS) != m
    other = MixKeys.from_secret(b"another secret of 32 bytes, too!")
    assert unit_factor(rkey, "enterprises.turnover", D2, other) != m
    assert salt_name("persons.income") == "unit:persons.income"
    assert keyed_mix(rkey, "unit:persons.income", KEYS) != keyed_mix(
        rkey, "sum:persons.income", KEYS
    )  # a stream apart from the statistic keys of the same records


def test_the_sql_factor_is_the_reference_bit_for_bit():
    """The rewrite's factor (DuckDB) equals :func:`unit_factor` on 5,000 record keys."""
    con = duckdb.connect()
    con.execute(
        "CREATE SCHEMA sqlsdc; CREATE TABLE sqlsdc.ckm_mix (k_square BIGINT, k_scale BIGINT, "
        "k_shift BIGINT, k_final BIGINT); CREATE TABLE t (rk UINTEGER)"
    )
    con.execute("INSERT INTO sqlsdc.ckm_mix VALUES (?, ?, ?, ?)", list(vars(KEYS).values()))
    rng = random.Random(7)
    keys = [rng.getrandbits(32) for _ in range(4_998)] + [0, 2**32 - 1]
    con.executemany("INSERT INTO t VALUES (?)", [[k] for k in keys])
    m = unit_factor_sql(exp.column("rk", "t"), "t.x", D2)
    sql = f"SELECT rk, {m.sql('duckdb')} FROM t LEFT JOIN sqlsdc.ckm_mix AS __mix ON TRUE"
    rows = con.execute(sql).fetchall()
    assert len(rows) == len(keys)
    assert all(v == unit_factor(k, "t.x", D2, KEYS) for k, v in rows)


def test_sql_golden_of_the_factor():
    """The factor's SQL: the mix salted by ``unit:t.x``, u = (y + ½)/p, the inverse CDF."""
    sql = unit_factor_sql(exp.column("rk", "t"), "t.x", D2).sql("duckdb")
    salt = re.search(r"CAST\(t\.rk AS BIGINT\) \+ (\d+)\)", sql).group(1)
    from sqlsdc.mechanisms.ckm import statistic_salt

    assert int(salt) == statistic_salt("unit:t.x")
    y = (
        f"((((CAST(t.rk AS BIGINT) + {salt}) % 2147483647 * ((CAST(t.rk AS BIGINT) + {salt}) "
        "% 2147483647) + __mix.k_square) % 2147483647 * __mix.k_scale + __mix.k_shift) "
        f"% 2147483647 * ((((CAST(t.rk AS BIGINT) + {salt}) % 2147483647 * ((CAST(t.rk AS "
        f"BIGINT) + {salt}) % 2147483647) + __mix.k_square) % 2147483647 * __mix.k_scale + "
        "__mix.k_shift) % 2147483647) + __mix.k_final) % 2147483647"
    )
    assert sql == (
        f"(1 + CASE WHEN {y} < 1073741823 THEN -1 ELSE 1 END * (1.49999999999999911e-01 - "
        f"9.99999999999998668e-02 * SQRT(1 - ABS(2 * ((CAST({y} AS DOUBLE) + "
        "5.00000000000000000e-01) / 2147483647) - 1))))"
    )
    assert sqlglot.parse_one(sql, read="spark") is not None


# -- the policy ------------------------------------------------------------------------------


def _demo_document() -> dict:
    text = resources.files("sqlsdc.demo").joinpath("policy.yaml").read_text("utf-8")
    return yaml.safe_load(text)


def _problems(noise, where=("protection", "magnitudes")) -> list[str]:
    document = copy.deepcopy(_demo_document())
    node = document
    for part in where:
        node = node[part]
    node["unit_noise"] = noise
    return validate_document(document)


def test_the_demo_policy_asks_for_unit_noise_on_persons_and_enterprises():
    policy = load_policy(_demo_document())
    for table in ("persons", "enterprises"):
        rule = policy.table(table).rule(AggregateKind.MAGNITUDES)
        assert rule.magnitude.unit_noise == UnitNoise(1.05, 1.15)
    assert policy.table("persons").rule(AggregateKind.COUNTS).magnitude is None


@pytest.mark.parametrize(
    ("noise", "message"),
    [
        ({"a": 1.2, "b": 1.1}, "protection.magnitudes.unit_noise: needs a < b"),
        ({"a": 1.1, "b": 1.1}, "protection.magnitudes.unit_noise: needs a < b"),
        ({"a": 1.0, "b": 1.1}, "protection.magnitudes.unit_noise.a: "),
        ({"a": 1.05, "b": 2.0}, "protection.magnitudes.unit_noise.b: "),
        ({"a": 1.05}, "protection.magnitudes.unit_noise: "),
        ({"a": 1.05, "b": 1.15, "c": 1}, "protection.magnitudes.unit_noise: "),
        ({"a": 1.05, "b": float("nan")}, "protection.magnitudes.unit_noise.b: "),
    ],
)
def test_invalid_unit_noise_is_refused(noise, message):
    problems = _problems(noise)
    assert any(p.startswith(message) for p in problems), problems


def test_unit_noise_only_for_ckm_magnitudes():
    problems = _problems({"a": 1.05, "b": 1.15}, ("protection", "counts"))
    assert "protection.counts: unit_noise only apply to magnitudes" in problems
    document = copy.deepcopy(_demo_document())
    document["tables"]["benefits"]["protection"]["magnitudes"]["unit_noise"] = {"a": 1.1, "b": 1.2}
    problems = validate_document(document)
    assert "tables.benefits.protection.magnitudes: unit_noise do not apply to method dp" in str(
        problems
    ), problems


def test_a_yaml_policy_locates_the_unit_noise_problem(tmp_path):
    text = resources.files("sqlsdc.demo").joinpath("policy.yaml").read_text("utf-8")
    bad = text.replace("unit_noise: {a: 1.05, b: 1.15}\ntables:", "unit_noise: {a: 1.2, b: 1.1}\n"
                       "tables:")  # fmt: skip
    assert bad != text
    path = tmp_path / "policy.yaml"
    path.write_text(bad, "utf-8")
    line = 1 + next(i for i, t in enumerate(bad.splitlines()) if "{a: 1.2, b: 1.1}" in t)
    with pytest.raises(sqlsdc.PolicyError, match=rf"line {line}, column \d+: .*needs a < b"):
        load_policy(path)


# -- back-end jobs -------------------------------------------------------------------------------


def test_a_jobs_sums_carry_the_same_factors(ckm, raw_ckm):
    """A protection job's cells (:func:`sqlsdc.jobs.tabulation.cells_sql`) of a unit-noised
    measure are sums of x·m with the factors of the query path (the Python reference here),
    never the stored sums; a count job and a stored output's SQL parse as before."""
    from sqlsdc.demo.build import demo_policy
    from sqlsdc.jobs.tabulation import cells_sql, parse_job

    policy = demo_policy()
    spec = parse_job("SELECT nace, SUM(turnover) FROM enterprises GROUP BY nace", policy)
    assert spec.unit_noise == D2
    cells = {r["nace"]: r["value"] for r in raw_ckm.sql(cells_sql(spec, 2)).to_arrow_table()
             .to_pylist()}  # fmt: skip
    keys = MixKeys(*raw_ckm.execute("SELECT * FROM sqlsdc.ckm_mix").fetchall()[0])
    expected, stored = {}, {}
    for nace, x, rkey in raw_ckm.execute(
        "SELECT nace, turnover, __rkey FROM enterprises"
    ).fetchall():
        m = unit_factor(rkey, "enterprises.turnover", D2, keys)
        expected[nace] = expected.get(nace, 0.0) + float(x) * m
        stored[nace] = stored.get(nace, 0) + x
    assert cells.keys() == expected.keys() and len(cells) >= 5
    for nace, value in cells.items():
        assert value == pytest.approx(expected[nace], rel=1e-9)
        assert value != pytest.approx(stored[nace], rel=1e-9)  # noise may land within 1e-4
    counted = parse_job("SELECT nace, COUNT(*) FROM enterprises GROUP BY nace", policy)
    assert counted.rows and counted.unit_noise is None


def test_a_self_join_sums_with_the_factors_of_the_instance_it_reads(ckm):
    """persons joined to itself on its identifier: ``SUM(a.income)`` takes the factors of the
    instance ``a`` (the record keys it reads), the same cells as the table read once."""
    plain = dict(ckm.execute("SELECT region, SUM(income) FROM persons GROUP BY 1").fetchall())
    joined = ckm.execute(
        "SELECT a.region, SUM(a.income) FROM persons a JOIN persons b "
        "ON a.person_id = b.person_id GROUP BY 1"
    ).fetchall()
    assert len(joined) == len(plain) >= 5
    for region, value in joined:
        assert value == pytest.approx(plain[region], rel=1e-12)


def test_explain_states_the_unit_noise(ckm):
    explained = ckm.explain(
        "SELECT region, COUNT(*) AS n, SUM(income) AS s FROM persons GROUP BY 1"
    )
    described = {c.name: c.to_dict() for c in explained.columns}
    assert described["s"]["unit_noise"] == {"a": 1.05, "b": 1.15}
    assert "unit_noise" not in described["n"]
    assert (
        "s: ckm (each value times its unit's permanent factor in [0.85, 0.95] ∪ [1.05, 1.15])"
        in (str(explained))
    )


def test_a_jobs_audit_knows_the_bounds_of_noised_contributions():
    """What a reader knows of one noised contribution x·m for x in the policy's [lo, hi] is
    [lo, hi] times the factors' range [2 − b, b]: a suppression job's audit of a unit-noised
    sum reasons with it (x·m reaches 1.15·hi under D2; an audit assuming hi reasoned on a
    region the true table may lie outside)."""
    from types import SimpleNamespace

    from sqlsdc.demo.build import demo_policy
    from sqlsdc.jobs.protect import _noised_bounds
    from sqlsdc.jobs.tabulation import parse_job

    assert D2.noised_bounds(0, 1000) == pytest.approx((0, 1150))
    assert D2.noised_bounds(100, 1000) == pytest.approx((85, 1150))
    assert D2.noised_bounds(-10, 10) == pytest.approx((-11.5, 11.5))
    policy = demo_policy()
    for sql, expected in (
        ("SELECT nace, SUM(employees) FROM enterprises GROUP BY nace", (0, 115_000)),
        ("SELECT region, SUM(income) FROM persons GROUP BY region", (0, 1_150_000)),
    ):
        job = SimpleNamespace(policy=policy, spec=parse_job(sql, policy))
        assert _noised_bounds(job) == pytest.approx(expected)


def test_a_noised_sum_beside_a_distinct_count_is_answered_as_each_alone(ckm):
    """Both need the secret mix in the rows' select (the unit noise of the sum, the keys of the
    distinct count): it is joined once (two joins of ``__mix`` failed in the engine, CI of
    session 45); each value is the one its statistic gets alone."""
    where = "FROM persons WHERE region = 'R01'"
    both = ckm.execute(f"SELECT SUM(income), COUNT(DISTINCT household_id) {where}").fetchall()
    alone = [ckm.execute(f"SELECT {s} {where}").fetchone()[0]
             for s in ("SUM(income)", "COUNT(DISTINCT household_id)")]  # fmt: skip
    assert both == [tuple(alone)]


def _cte_chain(depth: int, column: str) -> str:
    """A statement reading ``persons`` through ``depth`` CTEs, each a self-join of the one
    before (every path through them is ``2 ** depth`` long), comparing ``column`` at the end."""
    ctes = ["c0 AS (SELECT age, income FROM persons)"]
    for i in range(1, depth + 1):
        ctes.append(
            f"c{i} AS (SELECT a.{column} + b.{column} AS {column} "
            f"FROM c{i - 1} AS a JOIN c{i - 1} AS b USING ({column}))"
        )
    return f"WITH {', '.join(ctes)} SELECT COUNT(*) FROM c{depth} WHERE {column} > 3"


def test_the_noised_conditions_follow_each_cte_output_once():
    """Which unit-noised column a compared column is, is found once per CTE output, not once
    per path through the CTEs that read each other: a CKM frame's CTEs do, and following every
    path made one statement with a scalar subquery ~3 million calls and ~25 s of CPU in the
    rewrite (tests/test_guard_size.py's moved WHEREs: 50 s). Twelve self-joined CTEs: one
    lookup of the policy, not 4,096, and the same answers (not noised; refused)."""
    from sqlsdc.demo.build import demo_policy
    from sqlsdc.errors import PolicyViolation
    from sqlsdc.rewrite.noised_conditions import noise_conditions, policy_lookup

    base, lookups = policy_lookup(demo_policy()), []

    def lookup(table: str, column: str):
        lookups.append((table, column))
        return base(table, column)

    sql = _cte_chain(12, "age")
    assert not noise_conditions(sqlglot.parse_one(sql, read="duckdb"), lookup, lambda: sql)
    assert lookups == [("persons", "age")]
    sql = _cte_chain(12, "income")  # read through a CTE: refused, as before
    with pytest.raises(PolicyViolation, match="carries a permanent noise factor per unit"):
        noise_conditions(sqlglot.parse_one(sql, read="duckdb"), lookup, lambda: sql)
    assert lookups == [("persons", "age"), ("persons", "income")]


def test_the_noised_conditions_list_each_selects_sources_once(monkeypatch):
    """The relations a select reads are listed once per select, not once per compared column:
    red team s31's join of 2,048 readings of persons (4,094 columns compared in its ONs) made
    8.4 million such listings of one source, ~14 s of CPU of that test's ~17 (quadratic). 256
    readings: 256 listings (130,816 before), and the same conversion: the income compared
    in the WHERE is noised, its select joins the mix first, the identifiers stay as written."""
    from sqlsdc.demo.build import demo_policy
    from sqlsdc.rewrite import noised_conditions

    listed, unwrapped = [], noised_conditions._unwrapped

    def counted(source):
        listed.append(source)
        return unwrapped(source)

    monkeypatch.setattr(noised_conditions, "_unwrapped", counted)
    joins = " ".join(
        f"JOIN persons AS p{i} ON p0.person_id = p{i}.person_id" for i in range(1, 256)
    )
    sql = (
        f"SELECT p0.region, COUNT(*) FROM persons AS p0 {joins} "
        "WHERE p255.income >= 20000 GROUP BY p0.region"
    )
    tree = sqlglot.parse_one(sql, read="duckdb")
    lookup = noised_conditions.policy_lookup(demo_policy())
    assert noised_conditions.noise_conditions(tree, lookup, lambda: sql)
    assert len(listed) == 256
    assert tree.args["joins"][0].this.alias == noised_conditions.MIX
    assert [j.this.alias for j in tree.args["joins"][1:]] == [f"p{i}" for i in range(1, 256)]
    where = tree.args["where"].this
    assert isinstance(where, exp.GTE) and not isinstance(where.this, exp.Column)
    assert {c.sql() for c in where.this.find_all(exp.Column)} >= {"p255.income", "p255.__rkey"}
    assert all(
        j.args["on"].sql() == f"p0.person_id = p{i}.person_id"
        for i, j in enumerate(tree.args["joins"][1:], 1)
    )
