"""Cell suppression in the query path (policy ``method: suppress``), on a real demo database.

Queries read their cells from the table's protected universe: the tests compare published cells
with the raw data, check that every primary cell is hidden, that the same cell has one status in
every query, that no combination of releases reveals a primary cell (an attacker LP over all of
them), and that new data or rules never publish what an earlier pattern hid.
"""

from __future__ import annotations

import json
import shutil

import cli_fork
import numpy as np
import pandas as pd
import pytest

import sqlsdc
from sqlsdc import admin
from sqlsdc.engines.duckdb import open_database
from sqlsdc.policy import load_policy
from sqlsdc.tabular import audit


@pytest.fixture(scope="module")
def suppress_db(suppress_template, tmp_path_factory, copy_database):
    return copy_database(suppress_template, tmp_path_factory.mktemp("suppress-shared"))


@pytest.fixture(scope="module")
def guarded(suppress_db):
    con = sqlsdc.connect(suppress_db, user="analyst")
    yield con
    con.close()


@pytest.fixture(scope="module")
def raw(suppress_db, guarded):
    con = open_database(suppress_db)
    yield con
    con.close()


def rows(con, sql: str) -> pd.DataFrame:
    return con.execute(sql).df()


def test_published_cells_are_exact_and_primary_cells_hidden(guarded, raw):
    sql = (
        "SELECT nace, region, COUNT(*) AS n, SUM(turnover) AS t FROM enterprises "
        "GROUP BY nace, region ORDER BY nace, region"
    )
    protected = rows(guarded, sql)
    truth = raw.sql(sql).df()
    assert protected[["nace", "region"]].equals(truth[["nace", "region"]])
    shown = protected["n"].notna()
    assert (protected.loc[shown, "n"] == truth.loc[shown, "n"]).all()
    assert (truth.loc[truth["n"] < 3, "n"].index.isin(protected.index[~shown])).all()
    assert protected["n"].isna().sum() >= (truth["n"] < 3).sum() > 0
    shown_t = protected["t"].notna()
    assert np.allclose(protected.loc[shown_t, "t"], truth.loc[shown_t, "t"])
    top = raw.sql(
        "SELECT nace, region, max(turnover) / sum(turnover) AS share FROM enterprises "
        "GROUP BY nace, region ORDER BY nace, region"
    ).df()
    dominated = (top["share"] > 0.60) | (truth["n"] < 3)
    assert protected.loc[dominated.to_numpy(), "t"].isna().all()
    status = guarded.execute(sql).cell_status()
    assert (status["t"] == np.where(shown_t, "published", "suppressed")).all()


def test_same_cell_same_answer_in_every_query(guarded):
    full = rows(
        guarded,
        "SELECT nace, region, COUNT(*) AS n, SUM(turnover) AS t FROM enterprises "
        "GROUP BY CUBE(nace, region)",
    )
    by_cell = {(_key(r.nace), _key(r.region)): (r.n, r.t) for r in full.itertuples()}
    for nace in ["A", "C", "N"]:
        sliced = rows(
            guarded,
            f"SELECT region, SUM(turnover) AS t, COUNT(*) AS n FROM enterprises "
            f"WHERE nace = '{nace}' GROUP BY ROLLUP(region)",
        )
        for r in sliced.itertuples():
            n, t = by_cell[(nace, _key(r.region))]
            assert _same(r.n, n) and _same(r.t, t)
    single = rows(
        guarded,
        "SELECT COUNT(*) AS n, SUM(turnover) AS t FROM enterprises "
        "WHERE region = 'R02' AND nace = 'C'",
    )
    n, t = by_cell[("C", "R02")]
    assert _same(single["n"][0], n) and _same(single["t"][0], t)
    total = rows(guarded, "SELECT SUM(turnover) AS t, COUNT(*) AS n FROM enterprises")
    assert _same(total["t"][0], by_cell[(None, None)][1])


def _key(code):
    return None if pd.isna(code) else code


def _same(a, b) -> bool:
    return (pd.isna(a) and pd.isna(b)) or a == b


def test_grouping_sets_rollup_and_having_follow_sql(guarded, raw):
    sql = (
        "SELECT region, nace, COUNT(*) AS n FROM enterprises "
        "GROUP BY GROUPING SETS ((region, nace), (region), ()) ORDER BY region, nace"
    )
    protected = rows(guarded, sql)
    truth = raw.sql(sql).df()
    assert protected[["region", "nace"]].equals(truth[["region", "nace"]])
    having = rows(
        guarded,
        "SELECT nace, COUNT(*) AS n FROM enterprises GROUP BY nace HAVING COUNT(*) >= 60 "
        "ORDER BY n DESC LIMIT 3",
    )
    assert len(having) == 3 and having["n"].is_monotonic_decreasing
    assert (having["n"] >= 60).all()


def test_avg_is_published_with_its_sum_and_count(guarded, raw):
    sql = (
        "SELECT nace, AVG(turnover) AS a, SUM(turnover) AS t, COUNT(*) AS n "
        "FROM enterprises GROUP BY nace ORDER BY nace"
    )
    protected = rows(guarded, sql)
    truth = raw.sql(sql).df()
    shown = protected["a"].notna()
    assert np.allclose(protected.loc[shown, "a"], truth.loc[shown, "a"])
    assert (protected.loc[shown, "t"].notna() & protected.loc[shown, "n"].notna()).all()
    assert protected.loc[protected["t"].isna(), "a"].isna().all()


def test_hierarchy_levels_and_filters(guarded, raw):
    by_region = rows(
        guarded, "SELECT region, COUNT(*) AS n FROM persons GROUP BY region ORDER BY region"
    )
    truth = raw.sql(
        "SELECT region, COUNT(*) AS n FROM persons GROUP BY region ORDER BY region"
    ).df()
    assert by_region["region"].tolist() == truth["region"].tolist()
    shown = by_region["n"].notna()
    assert (by_region.loc[shown, "n"] == truth.loc[shown, "n"]).all()
    sql = (
        "SELECT municipality, sex, COUNT(*) AS n FROM persons WHERE region = 'R03' "
        "GROUP BY municipality, sex ORDER BY municipality, sex"
    )
    protected, truth = rows(guarded, sql), raw.sql(sql).df()
    assert protected[["municipality", "sex"]].equals(truth[["municipality", "sex"]])
    shown = protected["n"].notna()
    assert (protected.loc[shown, "n"] == truth.loc[shown, "n"]).all()
    assert protected.loc[(truth["n"] < 5).to_numpy(), "n"].isna().all()
    one = truth.iloc[0]
    cell = rows(
        guarded,
        f"SELECT region, COUNT(*) AS n FROM persons WHERE municipality = '{one.municipality}' "
        f"AND sex = '{one.sex}' GROUP BY region",
    )
    assert cell["region"].tolist() == ["R03"]
    assert _same(cell["n"][0], protected["n"][0])


def test_empty_selection_answers_like_sql(guarded):
    assert guarded.execute("SELECT COUNT(*) FROM enterprises WHERE nace = 'ZZ'").fetchall() == [
        (0,)
    ]
    assert guarded.execute(
        "SELECT SUM(turnover) FROM enterprises WHERE nace = 'ZZ' AND nace = 'A'"
    ).fetchall() == [(None,)]
    assert (
        guarded.execute(
            "SELECT region, COUNT(*) FROM enterprises WHERE nace = 'ZZ' GROUP BY region"
        ).fetchall()
        == []
    )


def test_no_combination_of_releases_reveals_a_primary_cell(guarded, raw):
    """The attacker collects every cell any query shows and solves for the hidden ones."""
    queries = [
        "SELECT nace, region, SUM(turnover) AS v FROM enterprises GROUP BY CUBE(nace, region)",
        "SELECT nace, SUM(turnover) AS v FROM enterprises GROUP BY nace",
        "SELECT region, SUM(turnover) AS v FROM enterprises GROUP BY region",
    ]
    queries += [
        f"SELECT region, SUM(turnover) AS v FROM enterprises WHERE nace = '{c}' GROUP BY region"
        for c in "ABCDEFGH"
    ]
    seen: dict[tuple, float] = {}
    for sql in queries:
        result = guarded.execute(sql).df()
        where_nace = sql.split("nace = '")[1][0] if "nace = '" in sql else None
        for r in result.to_dict("records"):
            key = (r.get("nace", where_nace), r.get("region"))
            seen.setdefault(key, r["v"])
            assert _same(seen[key], r["v"])
    truth = raw.sql(
        "SELECT nace, region, SUM(turnover) AS value, COUNT(*) AS n, max(turnover) AS top "
        "FROM enterprises GROUP BY CUBE(nace, region)"
    ).df()
    truth[["nace", "region"]] = truth[["nace", "region"]].fillna("Total")
    published = {
        ("Total" if k[0] is None else k[0], "Total" if k[1] is None else k[1])
        for k, v in seen.items()
        if not pd.isna(v)
    }
    cells = truth.assign(
        status=[
            "published" if (r.nace, r.region) in published else "primary"
            for r in truth.itertuples()
        ]
    )
    intervals = audit(cells[["nace", "region", "n", "value", "status"]], ["nace", "region"])
    hidden = intervals[intervals["status"] != "published"]
    sensitive = (truth["n"] < 3) | (truth["top"] > 0.6 * truth["value"])
    attacked = hidden[sensitive.loc[hidden.index]]
    assert len(attacked) > 0
    # every sensitive cell stays uncertain: the attacker's interval is wider than 1 % of it
    assert ((attacked["hi"] - attacked["lo"]) > 0.01 * attacked["value"]).all()


def test_pattern_is_computed_once_and_recorded(guarded, raw):
    guarded.execute("SELECT nace, COUNT(*) FROM enterprises GROUP BY nace").fetchall()
    first = raw.sql("SELECT fingerprint, created_at, report FROM sqlsdc.suppressions "
                    "WHERE table_name = 'enterprises'").fetchall()  # fmt: skip
    guarded.execute("SELECT region, SUM(employees) FROM enterprises GROUP BY region").fetchall()
    second = raw.sql("SELECT fingerprint, created_at, report FROM sqlsdc.suppressions "
                     "WHERE table_name = 'enterprises'").fetchall()  # fmt: skip
    assert first == second and len(first) == 1
    report = json.loads(first[0][2])
    assert set(report["aggregates"]) == {"count", "employees", "turnover"}
    assert all(a["audit_passed"] for a in report["aggregates"].values())


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT nace, COUNT(*) FROM enterprises WHERE employees > 10 GROUP BY nace", "WHERE"),
        ("SELECT nace, COUNT(*) FROM enterprises WHERE nace <> 'A' GROUP BY nace", "WHERE"),
        ("SELECT nace, COUNT(*) FROM enterprises WHERE nace IN ('A', 'B') GROUP BY nace", "WHERE"),
        ("SELECT size_class, COUNT(*) FROM enterprises GROUP BY size_class", "universe"),
        ("SELECT nace, COUNT(*) FROM enterprises WHERE size_class = 'micro' GROUP BY nace",
         "universe"),
        ("SELECT nace, COUNT(region) FROM enterprises GROUP BY nace", "not a protected"),
        ("SELECT nace, COUNT(DISTINCT region) FROM enterprises GROUP BY nace",
         "not a protected"),
        ("SELECT e.nace, COUNT(*) FROM enterprises e JOIN regions r ON e.region = r.region "
         "GROUP BY e.nace", "one table"),
        ("WITH c AS (SELECT nace, COUNT(*) AS n FROM enterprises GROUP BY nace) "
         "SELECT SUM(n) FROM c", "result"),
        ("SELECT MAX(n) FROM (SELECT nace, COUNT(*) AS n FROM enterprises GROUP BY nace) s",
         "result"),
    ],
)  # fmt: skip
def test_shapes_outside_the_universe_are_refused(guarded, sql, message):
    with pytest.raises(sqlsdc.PolicyViolation, match=message):
        guarded.execute(sql)


def test_the_pattern_table_cannot_be_read_directly(guarded):
    for sql in (
        "SELECT * FROM sqlsdc.suppressed__enterprises",
        "SELECT COUNT(*) FROM sqlsdc.suppressed__enterprises",
        "SELECT * FROM (SELECT * FROM sqlsdc.suppressed__enterprises) AS __cells",
    ):
        with pytest.raises(sqlsdc.Error):
            guarded.execute(sql)


def test_mixing_suppression_with_another_method_is_refused(
    suppress_template, make_suppress_document, tmp_path
):
    path = tmp_path / "mixed.duckdb"
    shutil.copy(suppress_template, path)
    document = make_suppress_document()
    document["tables"]["enterprises"]["protection"]["counts"] = {"method": "threshold"}
    admin.apply(path, load_policy(document), "admin")
    with sqlsdc.connect(path, user="analyst") as con:
        with pytest.raises(sqlsdc.PolicyViolation, match="separate queries"):
            con.execute("SELECT nace, COUNT(*), SUM(turnover) FROM enterprises GROUP BY nace")
        assert con.execute("SELECT nace, SUM(turnover) FROM enterprises GROUP BY nace").fetchall()
        with pytest.raises(sqlsdc.PolicyViolation, match="counts"):
            con.execute("SELECT nace, AVG(turnover) FROM enterprises GROUP BY nace")


def _pattern(con, table: str) -> pd.DataFrame:
    return con.sql(f"SELECT * FROM sqlsdc.suppressed__{table}").df()


def test_new_data_never_publishes_what_an_earlier_pattern_hid(suppress_template, tmp_path):
    """The ledger's promise across releases: differencing old and new answers recovers nothing."""
    path = tmp_path / "changing.duckdb"
    shutil.copy(suppress_template, path)
    sql = "SELECT nace, region, COUNT(*) AS n FROM enterprises GROUP BY CUBE(nace, region)"
    with sqlsdc.connect(path, user="analyst") as con:
        before = con.execute(sql).df()
    raw = open_database(path)
    try:
        old = _pattern(raw, "enterprises")
        # a new enterprise in the largest cell: its margins change, nothing else does
        raw.execute(
            "INSERT INTO enterprises SELECT max(enterprise_id) + 1, NULL, 'A', 'R02', 'micro', "
            "3, 100000, 12345 FROM enterprises"
        )
    finally:
        raw.close()
    with sqlsdc.connect(path, user="analyst") as con:
        after = con.execute(sql).df()
    raw = open_database(path)
    try:
        new = _pattern(raw, "enterprises")
        report = json.loads(
            raw.sql("SELECT report FROM sqlsdc.suppressions WHERE table_name = 'enterprises'")
            .fetchall()[0][0]
        )
    finally:
        raw.close()
    merged = old.merge(new, on=["__level", "nace", "region"], suffixes=("_old", "_new"))
    assert len(merged) == len(old) == len(new)
    hidden_before = merged["count__status_old"] != "published"
    assert (merged.loc[hidden_before, "count__status_new"] != "published").all()
    assert report["aggregates"]["count"]["kept_from_earlier"] == int(hidden_before.sum())
    unchanged = merged["count__value_old"] == merged["count__value_new"]
    assert unchanged.sum() > 0
    key = ["nace", "region"]
    joined = before.merge(after, on=key, suffixes=("_before", "_after"), how="outer")
    changed = joined["n_before"].notna() & joined["n_after"].notna()
    changed &= joined["n_before"] != joined["n_after"]
    assert set(map(tuple, joined.loc[changed, key].fillna("*").values)) <= {
        ("A", "R02"), ("A", "*"), ("*", "R02"), ("*", "*")
    }


def test_stricter_rules_keep_earlier_suppressions(
    suppress_template, make_suppress_document, tmp_path
):
    path = tmp_path / "rules.duckdb"
    shutil.copy(suppress_template, path)
    sql = "SELECT nace, region, COUNT(*) AS n FROM enterprises GROUP BY nace, region"
    with sqlsdc.connect(path, user="analyst") as con:
        before = con.execute(sql).df()
    admin.apply(path, load_policy(make_suppress_document(counts=["freq:4"])), "admin")
    with sqlsdc.connect(path, user="analyst") as con:
        after = con.execute(sql).df()
    merged = before.merge(after, on=["nace", "region"], suffixes=("_b", "_a"))
    assert merged.loc[merged["n_b"].isna(), "n_a"].isna().all()
    # cells of 3 were published under freq:3; they are known, so they stay as they were
    assert (merged.loc[merged["n_a"].notna(), "n_a"] >= 3).all()
    threes = merged["n_a"] == 3
    assert threes.any() and (merged.loc[threes, "n_b"] == 3).all()


def test_spark_refuses_suppressed_queries(guarded):
    from sqlsdc.guard.spark import run_protected

    sql = "SELECT nace, COUNT(*) FROM enterprises GROUP BY nace"
    assert guarded.explain(sql).suppressed == ("enterprises",)
    with pytest.raises(sqlsdc.NotSupportedError, match="DuckDB"):
        run_protected(guarded, None, sql)


def test_a_table_whose_columns_are_named_in_capitals(tmp_path):
    """Dimensions NACE and Region as a CSV names them: every query of the table, and `sqlsdc
    publish`, was an internal error (KeyError 'nace', exit 70): the pattern's cells were looked
    up in lower case, DuckDB named them as the table spells them (new user s38). Real
    processes."""

    import duckdb
    import yaml

    db = tmp_path / "caps.duckdb"
    with duckdb.connect(db) as con:
        con.execute("CREATE TABLE Firms AS SELECT 'F' || range AS FirmID, ['C', 'G'][range % 2 "
                    "+ 1] AS NACE, ['N', 'S'][range // 2 % 2 + 1] AS Region, range::DOUBLE AS "
                    "Turnover FROM range(300)")  # fmt: skip
    rules = {"method": "suppress", "rules": ["freq:3"]}
    policy = {"protection": {"counts": rules, "magnitudes": rules}, "tables": {"Firms": {
        "privacy_unit": "FirmID", "suppression": {"dimensions": ["NACE", "Region"]},
        "columns": {"FirmID": {"role": "identifier"}, "NACE": {"role": "dimension"},
                    "Region": {"role": "dimension"},
                    "Turnover": {"role": "measure", "bounds": [0, 1000]}}}},
        "users": {"chief": {"role": "admin"}, "ana": {"role": "analyst"}}}  # fmt: skip
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(policy))
    sqlsdc.init(db, tmp_path / "p.yaml", applied_by="chief")

    def cli(*args):
        return cli_fork.run(args, timeout=300)

    cube = "SELECT NACE, Region, COUNT(*) AS n, SUM(Turnover) AS t FROM Firms GROUP BY CUBE "
    asked = cli("query", db, "--user", "ana", "--format", "json", cube + "(NACE, Region)")
    assert asked.returncode == 0, asked.stderr
    cells = json.loads(asked.stdout)
    assert len(cells) == 9 and sum(c["n"] for c in cells if c["NACE"] is None) == 600
    published = cli("publish", db, tmp_path / "release.duckdb", "--as", "chief")
    assert published.returncode == 0, published.stderr
    assert "suppressed_firms: 9 rows" in published.stdout
