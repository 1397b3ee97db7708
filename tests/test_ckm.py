"""The cell key method end to end on the demo database (real DuckDB file, shipped demo policy).

Expected values are computed independently: cell keys and top contributions straight from the
raw rows, noise from the stored ptable, perturbation by the per-cell reference functions of
``sqlsdc.mechanisms.ckm`` (a restatement of cellKey's ``.perturb_cell_flex``).
"""

from __future__ import annotations

import json
import math
import shutil

import cli_fork
import numpy as np
import pyarrow as pa
import pytest

import sqlsdc
from sqlsdc.catalog import store
from sqlsdc.catalog.ptables import load_ptables, stored_entries
from sqlsdc.engines.duckdb import open_database
from sqlsdc.mechanisms.ckm import (
    Lookup,
    MixKeys,
    perturb_count,
    perturb_magnitude,
    published_value,
    statistic_key,
    utility_risk,
)
from sqlsdc.mechanisms.unit_noise import unit_factor
from sqlsdc.policy import AggregateKind, load_policy

M = 2**32


@pytest.fixture(scope="module")
def reference(raw_ckm, ckm):
    """Raw access, the policy and the stored ptables (as Lookup tables)."""
    refs = load_ptables(raw_ckm, ckm.policy)
    tables = {
        k: Lookup.from_table(stored_entries(raw_ckm, r.ptable_id), step=k[1].step)
        for k, r in refs.items()
    }
    return raw_ckm, ckm.policy, refs, tables


def _check_refs(con, refs) -> None:
    """Each reference's rows and last-row noise are the stored entries' (read here with pandas,
    apart from ``load_ptables``): every row ``i`` ascending, and the ``(v, p)`` of row
    ``max_i`` in the ptable's first type (parity tables store an even and an odd one), by
    ``v``; the noise sums to probability 1."""
    assert refs
    for ref in refs.values():
        frame = stored_entries(con, ref.ptable_id).to_pandas()
        assert ref.classes == tuple(sorted(frame["i"].unique()))
        last = frame[(frame["type"] == frame["type"].min()) & (frame["i"] == ref.max_i)]
        assert ref.noise == tuple(sorted(zip(last["v"], last["p"], strict=True)))
        assert sum(p for _v, p in ref.noise) == pytest.approx(1.0)


def test_ptable_references_are_the_stored_entries(reference):
    con, _policy, refs, _tables = reference
    _check_refs(con, refs)


def _rule(policy, table, kind):
    return policy.table(table).rule(kind)


def _expected_counts(reference, sql_cells):
    con, policy, refs, tables = reference
    rule = _rule(policy, "persons", AggregateKind.COUNTS)
    key = ("counts", rule.ptable)
    rows = con.execute(sql_cells).fetchall()
    return {
        tuple(r[:-2]): perturb_count(r[-2], int(r[-1]) % M, tables[key], refs[key].max_i)
        for r in rows
    }


def test_counts_are_the_reference_perturbation(ckm, reference):
    got = ckm.execute(
        "SELECT region, sex, COUNT(*) AS n FROM persons GROUP BY region, sex"
    ).fetchall()
    expected = _expected_counts(
        reference,
        "SELECT region, sex, count(*), sum(__rkey) FROM persons GROUP BY region, sex",
    )
    assert {(r, s): n for r, s, n in got} == expected
    raw = dict(
        ((r, s), n)
        for r, s, n in reference[0]
        .execute("SELECT region, sex, count(*) FROM persons GROUP BY ALL")
        .fetchall()
    )
    deviations = [expected[k] - raw[k] for k in raw]
    assert any(d != 0 for d in deviations) and max(map(abs, deviations)) <= 5


def test_no_small_positive_count_below_js(ckm, reference):
    js = _rule(reference[1], "persons", AggregateKind.COUNTS).ptable.js
    rows = ckm.execute(
        "SELECT municipality, age, COUNT(*) FROM persons GROUP BY municipality, age"
    ).fetchall()
    small = [n for *_k, n in rows if 0 < n <= js]
    assert js == 2 and len(rows) > 1000 and not small


CELL_R01 = [
    "SELECT region, COUNT(*) FROM persons GROUP BY region",
    "SELECT COUNT(*) AS n, region FROM persons GROUP BY region",
    "SELECT region, COUNT(region) FROM persons GROUP BY 1",
    "SELECT region, COUNT(DISTINCT person_id) FROM persons GROUP BY region",
    "SELECT region, COUNT(*) FROM persons WHERE age >= 0 GROUP BY region",
    "SELECT region, COUNT(*) FROM persons WHERE region = 'R01' GROUP BY region",
    "SELECT region, municipality, COUNT(*) FROM persons GROUP BY ROLLUP (region, municipality)",
    "SELECT region, sex, COUNT(*) FROM persons GROUP BY GROUPING SETS ((region), (region, sex))",
    "WITH p AS (SELECT region, person_id FROM persons) "
    "SELECT region, COUNT(*) FROM p GROUP BY region",
    "SELECT p.region, COUNT(DISTINCT p.person_id) FROM persons p "
    "JOIN households h ON p.household_id = h.household_id GROUP BY p.region",
    # every person has a household: the join's rows are the same persons, so the same cell
    "SELECT p.region, COUNT(*) FROM persons p "
    "JOIN households h ON p.household_id = h.household_id GROUP BY p.region",
    "SELECT p.region, COUNT(*) FROM households h "
    "JOIN persons p ON h.household_id = p.household_id GROUP BY p.region",
    "SELECT r.region, COUNT(*) FROM persons p JOIN regions r ON p.region = r.region "
    "GROUP BY r.region",
]


def _region_total(con, sql):
    result = con.execute(sql)
    names = [d[0] for d in result.description]
    frame = result.df()
    region = next(c for c in frame.columns if "region" in c.lower())
    count = next(c for c in frame.columns if c not in (region, "sex", "municipality"))
    rows = frame[frame[region] == "R01"]
    for other in ("sex", "municipality"):
        if other in names:
            rows = rows[rows[other].isna()]
    assert len(rows) == 1, sql
    return int(rows[count].iloc[0])


def test_the_same_cell_has_the_same_value_in_every_query(ckm, ckm_db):
    values = {sql: _region_total(ckm, sql) for sql in CELL_R01}
    with sqlsdc.connect(ckm_db, "admin") as other_session:
        values["other user"] = _region_total(other_session, CELL_R01[0])
    assert len(set(values.values())) == 1, values


def test_magnitude_cell_is_consistent_across_queries(ckm):
    queries = [
        "SELECT region, SUM(income) FROM persons GROUP BY region",
        "SELECT SUM(income) AS s, region FROM persons WHERE age >= 0 GROUP BY region",
        "SELECT region, SUM(income), GROUPING(sex) AS level FROM persons "
        "GROUP BY ROLLUP (region, sex)",
        "WITH p AS (SELECT * FROM persons) SELECT region, SUM(income) FROM p GROUP BY region",
    ]
    values = set()
    for sql in queries:
        frame = ckm.execute(sql).df()
        frame = frame[frame["region"] == "R02"]
        if "level" in frame:  # the region's total, not one of its sexes
            frame = frame[frame["level"] == 1]
        column = next(c for c in frame.columns if c not in ("region", "level"))
        values.add(float(frame[column].iloc[0]))
    # equal up to the summation order of floating-point SUM, which differs between query plans
    assert max(values) - min(values) <= 1e-12 * max(values), values


def _mix_keys(con) -> MixKeys:
    """The secret constants of the statistic keys (test only: read from the catalog)."""
    ((material,),) = con.execute(
        "SELECT material FROM sqlsdc.secrets WHERE name = 'prf'"
    ).fetchall()
    return MixKeys.from_secret(bytes(material))


def _noised(con, table: str, measure: str, noise) -> str:
    """A copy of ``table`` whose ``measure`` is each value times its unit's permanent factor
    (:func:`sqlsdc.mechanisms.unit_noise.unit_factor`, computed here in Python from the record
    key and the secret), registered on ``con``: the contributions the sums add up (s45a)."""
    rows = con.sql(f"SELECT * FROM {table}").to_arrow_table()
    keys = _mix_keys(con)
    factors = [
        unit_factor(k, f"{table}.{measure}", noise, keys) for k in rows["__rkey"].to_pylist()
    ]
    values = [
        None if x is None else float(x) * f
        for x, f in zip(rows[measure].to_pylist(), factors, strict=True)
    ]
    position = rows.column_names.index(measure)
    noised = rows.set_column(position, measure, pa.array(values, pa.float64()))
    name = f"__noised_{table}_{measure}"
    con.register(name, noised)
    return name


def _expected_magnitudes(reference, table, measure, key_sql, where=""):
    con, policy, refs, tables = reference
    counts_rule = _rule(policy, table, AggregateKind.COUNTS)
    rule = _rule(policy, table, AggregateKind.MAGNITUDES)
    m = rule.magnitude
    count_key = ("counts", counts_rule.ptable)
    main = tables[("magnitudes", rule.ptable)]
    source = _noised(con, table, measure, m.unit_noise) if m.unit_noise else table
    rows = con.execute(
        f"""SELECT {key_sql} AS k, sum({measure}),
                   count(nullif({measure}, 0)), sum(CASE WHEN {measure} <> 0 THEN __rkey END),
                   count({measure}), sum(CASE WHEN {measure} IS NOT NULL THEN __rkey END),
                   list({measure} ORDER BY abs({measure}) DESC NULLS LAST, __rkey),
                   count(*), sum(__rkey)
            FROM {source} AS {table} {where} GROUP BY ALL"""
    ).fetchall()
    counts, max_i = tables[count_key], refs[count_key].max_i
    expected, present = {}, set()
    for k, total, n, keysum, n_all, keysum_all, values, rows_n, rows_key in rows:
        # a group appears when the perturbed count of all its rows (units) is positive
        if perturb_count(rows_n, int(rows_key) % M, counts, max_i):
            present.add(k)
        if keysum_all is None:  # no value: the magnitude is not perturbed
            continue
        # the mean's denominator: the protected count of every non-NULL value, zeros included
        n_all_hat = perturb_count(n_all, int(keysum_all) % M, counts, max_i)
        # the sum's contributors are the records of non-zero value (cellKey: use_zero_rkeys
        # FALSE): their key, count, protected count and largest values make its noise
        key = int(keysum or 0) % M
        n_hat = perturb_count(n, key, counts, max_i)
        top = [v for v in values if v][: m.top_k]
        small, m1sq = None, None
        if m.small_cells is not None:
            small = tables[("small_cells", m.small_cells)]
            m1sq = refs[("small_cells", m.small_cells)].m1sq
        # the magnitude's own key: the cell key plus the salt of its statistic (``sum:table.x``)
        salted = statistic_key(key, f"sum:{table}.{measure}", _mix_keys(con))
        x_hat = perturb_magnitude(float(total), top, salted, n, m, main, small, m1sq, n_hat)
        # published to PUBLISHED_BITS bits, as the frame does (red team s40a)
        published = published_value(x_hat / n * n_hat) if n_hat > 0 else 0.0
        expected[k] = (published, n_hat, n_all_hat)
    return expected, m, present


@pytest.mark.parametrize(
    "table, measure, key",
    [("persons", "income", "municipality"), ("enterprises", "turnover", "nace")],
    ids=["income top_k=1", "turnover top_k=2"],
)
def test_magnitudes_are_the_reference_perturbation(ckm, reference, table, measure, key):
    expected, m, _present = _expected_magnitudes(reference, table, measure, key)
    got = ckm.execute(
        f"SELECT {key}, SUM({measure}), AVG({measure}) FROM {table} GROUP BY {key}"
    ).fetchall()
    # a query that counts nothing shows a group when its first sum's protected count of
    # non-NULL values is positive
    assert {r[0] for r in got} == {k for k, (_s, _n, n_all_hat) in expected.items() if n_all_hat}
    for k, published_sum, published_avg in got:
        total, _n_hat, n_all_hat = expected[k]
        assert published_sum == pytest.approx(total, rel=1e-9)
        # the published sum over the protected count of the mean's values, zeros included
        assert published_avg == pytest.approx(total / n_all_hat, rel=1e-9)
    raw = dict(
        reference[0].execute(f"SELECT {key}, sum({measure}) FROM {table} GROUP BY ALL").fetchall()
    )
    changed = [k for k, s, _a in got if s and not math.isclose(s, raw[k], rel_tol=1e-12)]
    assert len(changed) >= 0.9 * len(got)  # v = 0 has probability about 0.03 per cell (step 12)


def test_a_small_cell_is_perturbed_as_one_contribution_its_mean(reference):
    """With its protected count n̂ below ``mean_below`` (3·D + js + 1 of the counts' ptable:
    18) a cell of n equal values a is n times the singleton of a, μ_c included, so its mean has
    one noise for every such n; from n̂ 18 on it is cellKey's, the noise of the largest value
    without μ_c (red team s40a: the mean a + d/n told small counts). Decided by n̂, not n (red
    team s41i: the floor at n < 13 was a bit of n). Tables without CKM counts keep cellKey's
    noise."""
    _con, policy, _refs, tables = reference
    rule = _rule(policy, "persons", AggregateKind.MAGNITUDES)
    m, main = rule.magnitude, tables[("magnitudes", rule.ptable)]
    assert m.mean_below == 3 * 5 + 2 + 1
    a = 94.0
    for key in range(7, M, M // 40):
        one = perturb_magnitude(a, [a], key, 1, m, main)
        for n, n_hat in ((2, 3), (5, 10), (12, 17), (13, 17), (20, 17)):
            floored = perturb_magnitude(a * n, [a] * n, key, n, m, main, protected=n_hat)
            assert floored / n == pytest.approx(one)
        if one == 0:  # key 7, v = -4 - 1/24: 94 - 18.8·(0.5 + 4.04) = 0.46·|x_delta| < 0.5
            assert main.interpolated("all", 4.0, key) < -4 - 1 / 48  # REMAINDER_FLOOR (s42j)
            continue
        for n in (13, 20):
            noise = abs(perturb_magnitude(a * n, [a] * n, key, n, m, main, protected=18) - a * n)
            assert noise == pytest.approx(abs(one - a) - m.p_small * a * m.mu_c, abs=1e-9)
    with pytest.raises(ValueError, match="protected count"):
        perturb_magnitude(a * 2, [a] * 2, 7, 2, m, main)
    document = json.loads(json.dumps(policy.document_dict()))
    document["protection"]["counts"] = {"method": "threshold"}
    threshold = _rule(load_policy(document), "persons", AggregateKind.MAGNITUDES)
    assert threshold.magnitude.mean_below == 0


def test_average_is_protected_sum_over_protected_count(ckm):
    rows = ckm.execute(
        "SELECT municipality, SUM(income), COUNT(income), AVG(income) FROM persons "
        "GROUP BY municipality"
    ).fetchall()
    for _m, total, count, mean in rows:
        if count:
            assert mean * count == pytest.approx(total, rel=1e-9)
        else:
            assert mean is None and total == 0


def test_rollup_margins_use_the_top_contributor_of_each_grouping_set(ckm, reference):
    expected, _m, _present = _expected_magnitudes(reference, "persons", "income", "'all'")
    frame = ckm.execute(
        "SELECT region, SUM(income) AS s FROM persons GROUP BY ROLLUP (region)"
    ).df()
    grand = frame[frame["region"].isna()]["s"].iloc[0]
    assert grand == pytest.approx(expected["all"][0], rel=1e-9)


def test_having_order_and_limit_see_only_protected_values(ckm):
    full = dict(
        ckm.execute("SELECT municipality, COUNT(*) FROM persons GROUP BY municipality").fetchall()
    )
    threshold = sorted(full.values())[len(full) // 2]
    having = dict(
        ckm.execute(
            "SELECT municipality, COUNT(*) FROM persons GROUP BY municipality "
            f"HAVING COUNT(*) >= {threshold}"
        ).fetchall()
    )
    assert having == {k: v for k, v in full.items() if v >= threshold}
    top = ckm.execute(
        "SELECT municipality, COUNT(*) AS n FROM persons GROUP BY municipality "
        "ORDER BY n DESC, municipality LIMIT 5"
    ).fetchall()
    ranked = sorted(full.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    assert top == ranked


def test_explain_and_accuracy_report_the_ptable_noise(ckm):
    cursor = ckm.execute("SELECT region, COUNT(*) AS n, SUM(income) AS s FROM persons GROUP BY 1")
    described = {c.name: c for c in cursor.explain().columns}
    assert described["n"].mechanism == "ckm" and described["s"].mechanism == "ckm"
    assert described["n"].to_dict()["noise_variance"] == pytest.approx(3.0, abs=1e-6)
    assert described["n"].to_dict()["max_deviation"] <= 5
    accuracy = cursor.cell_accuracy(0.95)
    assert set(accuracy["column"]) == {"n"} and len(accuracy) == cursor.rowcount
    assert (accuracy["low"] <= accuracy["value"]).all()
    assert (accuracy["value"] <= accuracy["high"]).all()
    assert ((accuracy["high"] - accuracy["low"]) <= 10).all()
    assert set(cursor.cell_status()["n"]) == {"published"}


def test_rekeying_changes_the_noise_and_is_recorded(ckm_db, tmp_path):
    path = tmp_path / "rekey.duckdb"
    shutil.copy(ckm_db, path)
    sql = "SELECT municipality, COUNT(*) FROM persons GROUP BY municipality"
    with sqlsdc.connect(path, "analyst") as con:
        before = dict(con.execute(sql).fetchall())
    report = sqlsdc.admin.rekey(path, "admin", tables=["persons"])
    assert report == {"persons": 20_000}
    with sqlsdc.connect(path, "analyst") as con:
        after = dict(con.execute(sql).fetchall())
    # groups published as 0 are left out: compare on all groups, missing ones as 0
    groups = after.keys() | before.keys()
    assert sum(after.get(k, 0) != before.get(k, 0) for k in groups) > len(groups) // 3
    con = open_database(path)
    try:
        events = con.execute(
            "SELECT table_name, action, rows_keyed, by_user FROM sqlsdc.key_events "
            "WHERE action = 'rekeyed'"
        ).fetchall()
        distinct = con.execute("SELECT count(DISTINCT __rkey) = count(*) FROM persons").fetchall()[
            0
        ][0]
    finally:
        con.close()
    assert events == [("persons", "rekeyed", 20_000, "admin")] and distinct


def test_rekeying_is_for_admins_only(ckm_db):
    with pytest.raises(sqlsdc.AccessDenied):
        sqlsdc.admin.rekey(ckm_db, "analyst")


def test_a_missing_ptable_entry_releases_nothing(ckm_db, tmp_path):
    path = tmp_path / "broken.duckdb"
    shutil.copy(ckm_db, path)
    con = open_database(path)
    (ledger_before,) = con.execute("SELECT count(*) FROM sqlsdc.ledger").fetchall()[0]
    con.execute(
        "DELETE FROM sqlsdc.ptable_entries WHERE (ptable_id, i) IN "
        "(SELECT ptable_id, max_i FROM sqlsdc.ptables WHERE kind = 'counts')"
    )
    con.close()
    with sqlsdc.connect(path, "analyst") as guarded:
        with pytest.raises(sqlsdc.InternalError, match="nothing was released"):
            guarded.execute("SELECT region, COUNT(*) FROM persons GROUP BY region")
        audit = guarded._con.execute(
            "SELECT decision FROM sqlsdc.audit ORDER BY query_id DESC LIMIT 1"
        ).fetchall()
    assert audit == [("refused",)]
    con = open_database(path)
    try:
        (ledger,) = con.execute("SELECT count(*) FROM sqlsdc.ledger").fetchall()[0]
    finally:
        con.close()
    assert ledger == ledger_before


def test_ckm_rules_need_a_stored_ptable(ckm_db, tmp_path):
    path = tmp_path / "unstored.duckdb"
    shutil.copy(ckm_db, path)
    con = open_database(path)
    document = con.execute(
        "SELECT document FROM sqlsdc.policy_versions ORDER BY version DESC LIMIT 1"
    ).fetchall()[0][0]
    policy = load_policy(__import__("json").loads(document))
    changed = policy.document_dict()
    changed["protection"]["counts"]["ptable"]["V"] = 2.5  # buildable, never stored
    store.store_policy(con, changed, "hand-edited", "test")  # bypasses apply: no ptable generated
    con.close()
    with sqlsdc.connect(path, "analyst") as guarded:
        with pytest.raises(sqlsdc.PolicyViolation, match="sqlsdc policy apply"):
            guarded.execute("SELECT region, COUNT(*) FROM persons GROUP BY region")


def test_ptables_are_stored_once_and_tile_the_keys(reference):
    con, _policy, refs, _tables = reference
    rows = con.execute(
        "SELECT ptable_id, type, i, min(lo), max(hi), sum(hi - lo), sum(p) "
        "FROM sqlsdc.ptable_entries GROUP BY ALL"
    ).fetchall()
    assert rows and all(
        lo == 0 and hi == M and width == M for _p, _t, _i, lo, hi, width, _s in rows
    )
    assert all(abs(s - 1) < 1e-6 for *_r, s in rows)
    assert len(refs) == con.execute("SELECT count(*) FROM sqlsdc.ptables").fetchall()[0][0]


def test_utility_and_risk_measures_on_a_released_table(ckm, reference):
    raw = (
        reference[0]
        .execute("SELECT municipality, sex, count(*) FROM persons GROUP BY ALL ORDER BY 1, 2")
        .fetchall()
    )
    protected = dict(
        ((m, s), n)
        for m, s, n in ckm.execute(
            "SELECT municipality, sex, COUNT(*) FROM persons GROUP BY municipality, sex"
        ).fetchall()
    )
    counts = np.array([n for *_k, n in raw], float)
    perturbed = np.array([protected.get((m, s), 0) for m, s, _n in raw], float)  # 0: left out
    measures = utility_risk(counts, perturbed)
    assert 0 < measures["U"] < 0.05
    assert 0 < measures["hellinger"] < 0.05
    assert measures["U"] == pytest.approx(np.abs(perturbed - counts).sum() / counts.sum())


def test_cli_risk_and_rekey(ckm_db, tmp_path):
    path = tmp_path / "cli.duckdb"
    shutil.copy(ckm_db, path)
    sql = "SELECT municipality, COUNT(*) AS n, SUM(income) AS s FROM persons GROUP BY 1"
    risk = cli_fork.run(["risk", path, sql, "--count", "n", "--value", "s", "--format", "json"])
    assert risk.returncode == 0, risk.stderr
    measures = json.loads(risk.stdout)
    assert 0 < measures["U"] < 0.1 and 0 <= measures["hellinger"] < 0.1
    assert type(measures["cells"]) is int  # a count of cells, not 8.0
    typo = cli_fork.run(["risk", path, sql, "--count", "count"])
    assert typo.returncode == 1, typo.stderr
    assert "no result column count; its columns: municipality, n, s" in typo.stderr
    denied = cli_fork.run(["rekey", path, "--user", "analyst", "--yes"])
    assert denied.returncode == 5 and "not an admin" in denied.stderr
    done = cli_fork.run(["rekey", path, "--table", "persons", "--yes"])
    assert done.returncode == 0 and "persons: 20000 rows re-keyed" in done.stdout


@pytest.mark.parametrize(
    "top",
    [{}, {"top_k": 2, "epsilon": [1, 0.5], "ptable": {"D": 4, "V": 1, "step": 12}}],
    ids=["top_k=1", "top_k=2"],
)
def test_small_cells_parity_and_scrambled_keys_match_the_reference(tmp_path, top):
    """The optional parts of magnitude CKM: a small-cells ptable (household sizes 1..3 are below
    its separation point z_s ≈ 3.5; 3.2 with ε (1, 0.5)), even/odd ptables and scrambled keys
    (same_key false), against the per-cell reference; with top_k 2 (no parity, which needs
    top_k 1) the second contribution, below z_s, adds nothing (τ-ARGUS)."""
    from sqlsdc.demo.build import build_demo_database, demo_policy

    document = demo_policy().document_dict()
    document["protection"]["magnitudes"] = {
        "method": "ckm",
        "ptable": {"D": 4, "V": 1, "step": 12, "parity": True},
        "flex": {"fp": 20000, "p_small": 0.2, "p_large": 0.05, "q": 2},
        "same_key": False,
        "small_cells": {"D": 2, "V": 0.5},
    } | top
    path = tmp_path / "variants.duckdb"
    build_demo_database(path, persons=20_000, seed=7, policy=load_policy(document))
    with sqlsdc.connect(path, "analyst") as con:
        got = con.execute(
            "SELECT municipality, SUM(size) FROM households WHERE size <= 2 GROUP BY municipality"
        ).fetchall()
        policy = con.policy
    raw = open_database(path)
    try:
        refs = load_ptables(raw, policy)
        _check_refs(raw, refs)
        types = {frozenset(stored_entries(raw, r.ptable_id).column("type").to_pylist())
                 for r in refs.values()}  # fmt: skip
        assert frozenset({"even", "odd"}) in types or top
        tables = {
            k: Lookup.from_table(stored_entries(raw, r.ptable_id), step=k[1].step)
            for k, r in refs.items()
        }
        expected, m, _present = _expected_magnitudes(
            (raw, policy, refs, tables), "households", "size", "municipality", "WHERE size <= 2"
        )
    finally:
        raw.close()
    assert m.small_cells is not None and not m.same_key
    for k, published in got:
        assert published == pytest.approx(expected[k][0], rel=1e-9), k


def test_join_cell_keys_sum_the_records_counted(ckm):
    """A join along declared keys whose rows are one table's rows sums that table's keys (no
    DISTINCT); a join that could repeat rows is refused before any cell key is built."""
    along_key = "FROM households h JOIN persons p ON h.household_id = p.household_id"
    assert (
        "SUM(DISTINCT" not in ckm.explain(f"SELECT p.region, COUNT(*) {along_key} GROUP BY 1").sql
    )
    pairs = "FROM persons p JOIN persons q ON p.household_id = q.household_id"
    with pytest.raises(sqlsdc.PolicyViolation, match="can repeat rows of p"):
        ckm.explain(f"SELECT p.region, COUNT(*) AS n {pairs} GROUP BY p.region")
