"""The catalog inside real DuckDB files: init, record keys, versions, secrets, audit and ledger."""

from __future__ import annotations

import copy
import json
import re
import shutil

import cli_fork
import duckdb
import pytest
from scipy import stats

import sqlsdc
from sqlsdc.catalog import store
from sqlsdc.catalog.setup import unit_index_name
from sqlsdc.engines.duckdb import open_database
from sqlsdc.policy import load_policy

PEOPLE = 20_000

POLICY = {
    "tables": {
        "people": {
            "privacy_unit": "id",
            "columns": {
                "id": {"role": "identifier"},
                "hh": {"role": "identifier"},
                "town": {"role": "dimension"},
                "salary": {"role": "measure", "bounds": [0, 500000]},
            },
        },
        "towns": {"kind": "public"},
    },
    "users": {
        "root": {"role": "admin"},
        "ana": {"role": "analyst"},
        **{name: {"role": "admin"} for name in ("alice", "bob", "admin0", "admin1", "admin2")},
    },
}

ADD = "INSERT INTO people (id, hh, town, salary) VALUES "

CATALOG_TABLES = {"meta", "policy_versions", "secrets", "audit", "ledger"}


def policy(**table_changes) -> dict:
    """POLICY with some tables replaced (value None removes the table)."""
    document = copy.deepcopy(POLICY)
    for name, spec in table_changes.items():
        if spec is None:
            del document["tables"][name]
        else:
            document["tables"][name] = spec
    return document


def query(path, sql, params=None):
    con = open_database(path)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def execute(path, *statements):
    con = open_database(path)
    try:
        for statement in statements:
            con.execute(statement)
    finally:
        con.close()


def columns_of(path, table) -> list[str]:
    return [r[0] for r in query(path, f'DESCRIBE "{table}"')]


def rkeys(path, table="people") -> dict[int, int]:
    return dict(query(path, f'SELECT id, __rkey FROM "{table}"'))


def secret_rows(path):
    return query(path, "SELECT name, material FROM sqlsdc.secrets")


@pytest.fixture(scope="module")
def small_template(tmp_path_factory):
    """A small hand-made database: people (20,000 rows, 50 households, 7 towns) and towns,
    built once; :func:`db` copies it (a copy ~1 ms, a build ~60 ms: an opening, the rows,
    the close)."""
    path = tmp_path_factory.mktemp("catalog") / "small.duckdb"
    execute(
        path,
        "CREATE TABLE people (id BIGINT, hh BIGINT, town VARCHAR, salary DOUBLE)",
        f"INSERT INTO people SELECT range, range % 50, 't' || (range % 7), range * 3.0 "
        f"FROM range({PEOPLE})",
        "CREATE TABLE towns AS SELECT 't' || range AS town, range * 100 AS population "
        "FROM range(7)",
    )
    return path


@pytest.fixture
def db(small_template, tmp_path):
    """A private copy of :func:`small_template` (no catalog yet) that the test changes."""
    path = tmp_path / "small.duckdb"
    shutil.copy(small_template, path)
    return path


# --- init --------------------------------------------------------------------------------------


def test_init_creates_the_catalog(db):
    report = sqlsdc.init(db, POLICY, applied_by="root")
    assert report.version == 1
    assert report.secret_created
    tables = {
        r[0]
        for r in query(db, "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'sqlsdc'")
    }
    assert tables >= CATALOG_TABLES
    assert query(db, "SELECT value FROM sqlsdc.meta WHERE key = 'catalog_version'") == [("1",)]
    assert query(db, "SELECT count(*) FROM sqlsdc.audit") == [(0,)]
    assert query(db, "SELECT count(*) FROM sqlsdc.ledger") == [(0,)]


def test_init_accepts_a_policy_file(db, tmp_path):
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(POLICY), "utf-8")
    assert sqlsdc.init(db, path, applied_by="alice").version == 1
    assert query(db, "SELECT applied_by, source FROM sqlsdc.policy_versions") == [
        ("alice", "policy.json")
    ]


def test_init_acts_as_the_only_admin_and_asks_among_several(db):
    """As the CLI's ``--as``: the only admin by default. Before, the first admin declared
    acted, whichever the file listed first, where the CLI asked which one."""
    several = copy.deepcopy(POLICY)
    with pytest.raises(sqlsdc.errors.AccessDenied,
                       match=r"6 admins \(root, alice, bob, admin0, admin1, admin2\): name the "
                             r"acting one with applied_by="):  # fmt: skip
        sqlsdc.init(db, several)
    assert query(db, "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'sqlsdc'") == [(0,)]
    one = copy.deepcopy(POLICY)
    one["users"] = {"analyst": {"role": "analyst"}, "chief": {"role": "admin"}}
    assert sqlsdc.init(db, one).version == 1
    several["users"]["chief"] = {"role": "admin"}
    assert sqlsdc.init(db, several).version == 2  # the policy in force has one admin: chief
    with pytest.raises(sqlsdc.errors.AccessDenied, match="7 admins"):
        sqlsdc.init(db, one)  # now several in force
    assert query(db, "SELECT version, applied_by FROM sqlsdc.policy_versions ORDER BY 1") == [
        (1, "chief"), (2, "chief")]  # fmt: skip


def test_record_keys_for_every_row(db):
    report = sqlsdc.init(db, POLICY, applied_by="root")
    assert report.keyed_rows == {"people": PEOPLE}
    types = dict(query(db, "SELECT column_name, column_type FROM (DESCRIBE people)"))
    assert types["__rkey"] == "UINTEGER"
    nulls, low, high, distinct = query(
        db,
        "SELECT count(*) FILTER (WHERE __rkey IS NULL), min(__rkey), max(__rkey), "
        "count(DISTINCT __rkey) FROM people",
    )[0]
    assert nulls == 0
    assert 0 <= low < high < 2**32
    # 20,000 draws from 2^32 values collide about 0.05 times on average
    assert distinct >= PEOPLE - 5


def test_record_keys_look_uniform(db):
    sqlsdc.init(db, POLICY, applied_by="root")
    bins = dict(query(db, "SELECT __rkey >> 28 AS bin, count(*) FROM people GROUP BY bin"))
    observed = [bins.get(b, 0) for b in range(16)]
    assert sum(observed) == PEOPLE
    result = stats.chisquare(observed, f_exp=[PEOPLE / 16] * 16)
    assert result.pvalue > 1e-4, observed
    # the low bits too (a key built from a few random bytes would fail here)
    low = dict(query(db, "SELECT __rkey & 15 AS bin, count(*) FROM people GROUP BY bin"))
    assert stats.chisquare([low.get(b, 0) for b in range(16)]).pvalue > 1e-4


def test_chi_square_check_rejects_non_uniform_keys():
    """The uniformity check above is not vacuous: keys below 2^31 (top bit never set) fail it,
    and so does a 20 % excess in one bin."""
    half = [PEOPLE // 8] * 8 + [0] * 8
    assert stats.chisquare(half, f_exp=[PEOPLE / 16] * 16).pvalue < 1e-4
    skewed = [1500] + [1233] * 15
    skewed[-1] += PEOPLE - sum(skewed)
    assert stats.chisquare(skewed, f_exp=[PEOPLE / 16] * 16).pvalue < 1e-4


def test_public_tables_get_no_record_keys(db):
    report = sqlsdc.init(db, POLICY, applied_by="root")
    assert "towns" not in report.keyed_rows
    assert "__rkey" not in columns_of(db, "towns")
    assert columns_of(db, "towns") == ["town", "population"]


def test_reinit_keeps_keys_and_keys_only_new_rows(db):
    sqlsdc.init(db, POLICY, applied_by="root")
    before = rkeys(db)
    execute(
        db,
        "INSERT INTO people (id, hh, town, salary) "
        f"SELECT range, 1, 't1', 5 FROM range({PEOPLE}, {PEOPLE + 50})",
    )
    report = sqlsdc.init(db, POLICY, applied_by="root")
    assert report.keyed_rows == {"people": 50}
    after = rkeys(db)
    assert len(after) == PEOPLE + 50
    assert all(after[i] == key for i, key in before.items())
    assert all(after[i] is not None for i in range(PEOPLE, PEOPLE + 50))
    assert sqlsdc.init(db, POLICY, applied_by="root").keyed_rows == {"people": 0}
    assert rkeys(db) == after


def test_policy_versions_increase(db):
    assert [sqlsdc.init(db, POLICY, applied_by=f"admin{i}").version for i in range(3)] == [1, 2, 3]
    rows = query(
        db,
        "SELECT version, applied_by, source, document FROM sqlsdc.policy_versions ORDER BY version",
    )
    assert [(v, by, src) for v, by, src, _ in rows] == [
        (1, "admin0", "<policy>"),
        (2, "admin1", "<policy>"),
        (3, "admin2", "<policy>"),
    ]
    assert json.loads(rows[-1][3]) == POLICY


def test_current_policy_is_the_latest_version(db):
    sqlsdc.init(db, POLICY, applied_by="root")
    second = policy(towns={"kind": "public", "description": "v2"})
    sqlsdc.init(db, second, applied_by="root")
    con = open_database(db)
    try:
        version, document, source = store.current_policy(con)
    finally:
        con.close()
    assert (version, document, source) == (2, second, "<policy>")


def test_policy_history_lists_versions(db):
    sqlsdc.init(db, POLICY, applied_by="alice")
    sqlsdc.init(db, load_policy(POLICY, name="policy.yaml"), applied_by="bob")
    con = open_database(db)
    try:
        history = store.policy_history(con)
    finally:
        con.close()
    assert [(v, by, src) for v, _, by, src, _ in history] == [
        (1, "alice", "<policy>"),
        (2, "bob", "policy.yaml"),
    ]
    assert history[0][4] == history[1][4]  # same document, same sha256
    assert history[0][1] <= history[1][1]


def test_secret_is_32_bytes_created_once(db):
    assert sqlsdc.init(db, POLICY, applied_by="root").secret_created
    ((name, secret),) = secret_rows(db)
    assert name == "prf"
    assert isinstance(secret, bytes) and len(secret) == 32
    assert len(set(secret)) > 8  # not a constant fill
    execute(db, ADD + "(99999, 1, 't1', 1.0)")
    report = sqlsdc.init(db, POLICY, applied_by="root")
    assert not report.secret_created
    assert secret_rows(db) == [("prf", secret)]


def test_secrets_differ_between_databases(tmp_path):
    secrets = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.duckdb"
        execute(path, "CREATE TABLE towns AS SELECT 't1' AS town")
        sqlsdc.init(path, policy(people=None), applied_by="root")
        secrets.append(secret_rows(path)[0][1])
    assert secrets[0] != secrets[1]


# --- init refuses policies that do not fit the database ---------------------------------------


def test_privacy_unit_with_nulls_is_refused(db):
    execute(db, ADD + "(NULL, 1, 't1', 1.0), (NULL, 2, 't2', 2.0)")
    with pytest.raises(
        sqlsdc.PolicyError, match=r"\Apolicy\.yaml: tables\.people\.privacy_unit: 2 rows have no id"
    ):
        sqlsdc.init(db, load_policy(POLICY, name="policy.yaml"), applied_by="root")
    assert "__rkey" not in columns_of(db, "people")
    assert query(db, "SELECT count(*) FROM duckdb_schemas() WHERE schema_name = 'sqlsdc'") == [(0,)]


def test_missing_table_is_refused_listing_the_tables(db):
    bad = policy(firms={"privacy_unit": "fid", "columns": {"fid": {"role": "identifier"}}})
    with pytest.raises(
        sqlsdc.PolicyError,
        match=r"\Apolicy\.yaml: tables\.firms: no such table in the database "
        r"\(tables: people, towns\)\Z",
    ):
        sqlsdc.init(db, load_policy(bad, name="policy.yaml"), applied_by="root")


def test_missing_column_is_refused_listing_the_columns(db):
    bad = copy.deepcopy(POLICY)
    bad["tables"]["people"]["columns"]["age"] = {"role": "dimension"}
    with pytest.raises(
        sqlsdc.PolicyError,
        match=r"\A<policy>: tables\.people\.columns\.age: no such column in the table "
        r"\(columns: id, hh, town, salary\)\Z",
    ):
        sqlsdc.init(db, bad, applied_by="root")


def test_a_measure_must_be_a_numeric_column(db):
    """A text column declared a measure (or weight) was applied, and then every SUM of it was
    refused: the policy validated but its measure could never be used."""
    bad = copy.deepcopy(POLICY)
    bad["tables"]["people"]["columns"]["town"] = {"role": "measure", "bounds": [0, 10]}
    with pytest.raises(
        sqlsdc.PolicyError,
        match=r"\A<policy>: tables\.people\.columns\.town: a measure must be a numeric column "
        r".*; town is VARCHAR",
    ):
        sqlsdc.init(db, bad, applied_by="root")


def test_applying_the_same_dp_policy_again_says_it_redraws_the_noise(db):
    """A new version of an unchanged policy draws every DP cell afresh (the noise is keyed by
    the version): ``init`` or ``policy apply`` run again says so, and only then (new user s39)."""
    dp = policy(people={**POLICY["tables"]["people"], "protection": {
        "counts": {"method": "dp", "spend": {"epsilon": 0.1}}}})  # fmt: skip
    assert sqlsdc.init(db, dp, applied_by="root").notes == []
    again = sqlsdc.init(db, dp, applied_by="root")
    assert again.version == 2
    assert again.notes == [
        "the policy is the same as version 1; differential-privacy noise is keyed by the policy "
        "version, so every DP cell asked again is drawn afresh and charged again"
    ]
    assert sqlsdc.init(db, POLICY, applied_by="root").notes == []  # a change
    # the same, without DP: nothing is redrawn
    assert sqlsdc.init(db, POLICY, applied_by="root").notes == []


def test_apply_tells_which_measures_cannot_be_summed(db):
    """A DECIMAL(23, 1) measure (BIGINT * 100.0 in DuckDB) validates and applies, and the guard
    refuses every SUM and AVG of it (cast or not): the admin now hears it at apply time."""
    execute(db, "CREATE TABLE wide AS SELECT id, id * 100.0 AS salary FROM people")
    wide = policy(
        wide={
            "privacy_unit": "id",
            "columns": {
                "id": {"role": "identifier"},
                "salary": {"role": "measure", "bounds": [0, 10**6]},
            },
        }
    )
    report = sqlsdc.init(db, wide, applied_by="root")
    assert report.notes == [
        "wide.salary is DECIMAL(23,1): SUM and AVG of it are refused (store it as DOUBLE, "
        "BIGINT or DECIMAL(18, s))"
    ]


def test_apply_tells_which_suppressed_means_are_never_published(tmp_path):
    """Under suppression an AVG is published only when every unit of the table has a value: a
    new user's export shares with some missing were NULL in every cell, and nothing had said
    why. ``sqlsdc init`` (a real process) now notes it; the query shows what it means."""

    import yaml

    db = tmp_path / "firms.duckdb"
    with duckdb.connect(db) as raw:
        raw.execute("CREATE TABLE firms AS SELECT range AS id, ['C', 'G'][range % 2 + 1] AS nace, "
                    "range::DOUBLE AS turnover, CASE WHEN range % 10 > 0 THEN 0.5 END AS export "
                    "FROM range(200)")  # fmt: skip
    measure = {"role": "measure", "bounds": [0, 1000]}
    rules = {"method": "suppress", "rules": ["freq:3"]}
    document = {"tables": {"firms": {
        "privacy_unit": "id", "protection": {"counts": rules, "magnitudes": rules},
        "suppression": {"dimensions": ["nace"]}, "columns": {
            "id": {"role": "identifier"}, "nace": {"role": "dimension"}, "turnover": measure,
            "export": measure}}},
        "users": {"chief": {"role": "admin"}, "ana": {"role": "analyst"}}}  # fmt: skip
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(document))
    done = cli_fork.run(["init", db, "--policy", tmp_path / "p.yaml", "--as", "chief"],
                        timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        "  note: firms.export has no value for 20 of 200 units: under suppression its AVG is "
        "published only when every unit has one, so it is NULL in every cell (SUM and COUNT are "
        "published); fill the missing values, or leave those units out, where means are wanted\n"
    )  # turnover, which every unit has, is not named
    with sqlsdc.connect(db, "ana") as con:
        rows = con.execute("SELECT nace, AVG(export), SUM(export), AVG(turnover) FROM firms "
                           "GROUP BY nace ORDER BY nace").fetchall()  # fmt: skip
    published = [(avg, total, mean is not None) for _nace, avg, total, mean in rows]
    assert published == [(None, 40.0, True), (None, 50.0, True)]


def test_a_suppression_dimension_without_a_value_is_a_policy_problem(tmp_path):
    """A region missing in some rows: init applied the policy, and every query of the table
    then failed (exit 1). `sqlsdc init` (a real process) now refuses it with the recoding to
    do, and applies once it is done (new user s38)."""

    import yaml

    db = tmp_path / "firms.duckdb"
    with duckdb.connect(db) as raw:
        raw.execute("CREATE TABLE firms AS SELECT range AS id, ['C', 'G'][range % 2 + 1] AS nace, "
                    "CASE WHEN range % 7 > 0 THEN 'N' END AS region FROM range(70)")  # fmt: skip
    rules = {"method": "suppress"}
    document = {"tables": {"firms": {
        "privacy_unit": "id", "protection": {"counts": rules},
        "suppression": {"dimensions": ["nace", "region"]}, "columns": {
            "id": {"role": "identifier"}, "nace": {"role": "dimension"},
            "region": {"role": "dimension"}}}},
        "users": {"chief": {"role": "admin"}}}  # fmt: skip
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(document))
    command = ["init", db, "--policy", tmp_path / "p.yaml", "--as", "chief"]
    done = cli_fork.run(command, timeout=300)
    assert done.returncode == 4
    assert "tables.firms.suppression.dimensions: region has no value in 10 rows; suppression " \
        "needs a code in every row: recode them in the database, e.g. UPDATE firms SET region " \
        "= 'unknown' WHERE region IS NULL" in done.stderr  # fmt: skip
    execute(db, "UPDATE firms SET region = 'unknown' WHERE region IS NULL")
    done = cli_fork.run(command, timeout=300)
    assert done.returncode == 0, done.stderr


def test_every_database_problem_is_reported(db):
    bad = copy.deepcopy(POLICY)
    bad["tables"]["people"]["columns"]["age"] = {"role": "dimension"}
    bad["tables"]["firms"] = {"kind": "public"}
    with pytest.raises(sqlsdc.PolicyError) as info:
        sqlsdc.init(db, bad, applied_by="root")
    assert [p.split(":")[1].strip() for p in info.value.problems] == [
        "tables.people.columns.age",
        "tables.firms",
    ]


def test_confidential_view_is_refused(db):
    execute(db, "CREATE VIEW rich AS SELECT * FROM people WHERE salary > 100")
    bad = policy(rich={"privacy_unit": "id", "columns": {"id": {"role": "identifier"}}})
    with pytest.raises(
        sqlsdc.PolicyError,
        match=r"tables\.rich: a confidential relation must be a table, not a view",
    ):
        sqlsdc.init(db, bad, applied_by="root")


def test_invalid_policy_is_refused_before_touching_the_database(db):
    bad = copy.deepcopy(POLICY)
    bad["users"] = {"ana": {"role": "analyst"}}
    with pytest.raises(sqlsdc.PolicyError, match="declare at least one user with role admin"):
        sqlsdc.init(db, bad, applied_by="root")
    assert "__rkey" not in columns_of(db, "people")


# --- the privacy unit --------------------------------------------------------------------------


def test_unique_unit_gets_a_unique_index(db):
    report = sqlsdc.init(db, POLICY, applied_by="root")
    assert report.unit_per_row == {"people": True}
    indexes = query(
        db, "SELECT index_name, table_name, is_unique, expressions FROM duckdb_indexes()"
    )
    assert indexes == [(unit_index_name("people", "id"), "people", True, "[id]")]
    assert unit_index_name("people", "id") == "__sqlsdc_unit_people__id"
    with pytest.raises(duckdb.ConstraintException, match="[Dd]uplicate key"):
        execute(db, ADD + "(7, 1, 't1', 1.0)")
    with pytest.raises(duckdb.ConstraintException, match="NOT NULL"):
        execute(db, ADD + "(NULL, 1, 't1', 1.0)")


def test_non_unique_unit_has_no_index(db):
    by_household = copy.deepcopy(POLICY)
    by_household["tables"]["people"]["privacy_unit"] = "hh"
    report = sqlsdc.init(db, by_household, applied_by="root")
    assert report.unit_per_row == {"people": False}
    assert query(db, "SELECT count(*) FROM duckdb_indexes()") == [(0,)]
    execute(db, ADD + "(1, 1, 't1', 1.0)")  # duplicates stay allowed


def test_changing_the_unit_to_a_non_unique_column_is_detected(tmp_path):
    """The unit index of the old unit must not make the new, non-unique unit look unique.

    Here each town has 200 rows but only 5 households: with households as the unit and k = 10,
    every town count must be suppressed.
    """
    path = tmp_path / "u.duckdb"
    execute(
        path,
        "CREATE TABLE people (id BIGINT, hh BIGINT NOT NULL, town VARCHAR, salary DOUBLE)",
        "INSERT INTO people SELECT range, range // 40, 't' || (range // 200), 1.0 FROM range(400)",
        "CREATE TABLE towns AS SELECT 't1' AS town",
    )
    assert sqlsdc.init(path, POLICY, applied_by="root").unit_per_row == {"people": True}
    by_household = copy.deepcopy(POLICY)
    by_household["tables"]["people"]["privacy_unit"] = "hh"
    report = sqlsdc.init(path, by_household, applied_by="root")
    with sqlsdc.connect(path, user="ana") as con:
        counts = con.execute("SELECT town, COUNT(*) AS n FROM people GROUP BY town").fetchall()
    assert sorted(counts) == [("t0", None), ("t1", None)]
    assert report.unit_per_row == {"people": False}


def test_changing_the_unit_to_a_nullable_column_does_not_crash(db):
    sqlsdc.init(db, POLICY, applied_by="root")
    by_household = copy.deepcopy(POLICY)
    by_household["tables"]["people"]["privacy_unit"] = "hh"
    report = sqlsdc.init(db, by_household, applied_by="root")
    assert report.unit_per_row == {"people": False}


def test_table_with_an_existing_index(db):
    """DuckDB cannot ALTER a table that has an index; init must handle or explain that."""
    execute(db, "CREATE INDEX people_town ON people (town)")
    try:
        report = sqlsdc.init(db, POLICY, applied_by="root")
    except sqlsdc.Error as error:
        assert "tables.people" in str(error)
    else:
        assert report.keyed_rows == {"people": PEOPLE}


# --- atomicity ---------------------------------------------------------------------------------


def test_apply_is_atomic(db, monkeypatch):
    execute(db, "CREATE TABLE firms AS SELECT range AS fid FROM range(30)")
    sqlsdc.init(db, POLICY, applied_by="root")
    keys = rkeys(db)

    def fail(*args, **kwargs):
        raise sqlsdc.InternalError("simulated failure while storing the policy")

    monkeypatch.setattr(store, "store_policy", fail)
    grown = policy(firms={"privacy_unit": "fid", "columns": {"fid": {"role": "identifier"}}})
    execute(db, ADD + "(99999, 1, 't1', 1.0)")
    with pytest.raises(sqlsdc.InternalError, match="simulated failure"):
        sqlsdc.init(db, grown, applied_by="root")
    assert query(db, "SELECT version FROM sqlsdc.policy_versions") == [(1,)]
    assert "__rkey" not in columns_of(db, "firms")
    assert query(db, "SELECT count(*) FROM duckdb_indexes() WHERE table_name = 'firms'") == [(0,)]
    assert query(db, "SELECT __rkey FROM people WHERE id = 99999") == [(None,)]
    assert {i: k for i, k in rkeys(db).items() if i != 99999} == keys


def test_newer_catalog_is_refused_without_a_new_version(db):
    sqlsdc.init(db, POLICY, applied_by="root")
    execute(
        db,
        "UPDATE sqlsdc.meta SET value = '99' WHERE key = 'catalog_version'",
        ADD + "(99999, 1, 't1', 1.0)",
    )
    with pytest.raises(sqlsdc.Error, match=r"catalog version 99, newer than this sqlsdc"):
        sqlsdc.init(db, POLICY, applied_by="root")
    assert query(db, "SELECT version FROM sqlsdc.policy_versions") == [(1,)]
    assert query(db, "SELECT __rkey FROM people WHERE id = 99999") == [(None,)]


def test_refused_policy_leaves_no_new_version(db):
    sqlsdc.init(db, POLICY, applied_by="root")
    bad = copy.deepcopy(POLICY)
    bad["tables"]["people"]["columns"]["age"] = {"role": "dimension"}
    with pytest.raises(sqlsdc.PolicyError, match="no such column"):
        sqlsdc.init(db, bad, applied_by="root")
    assert query(db, "SELECT version FROM sqlsdc.policy_versions") == [(1,)]


# --- audit log and ledger, through the guarded connection -------------------------------------

ACCEPTED = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"
SMALL_CELLS = (
    "SELECT municipality, COUNT(*) AS n, AVG(income) AS mean FROM persons GROUP BY municipality"
)
PUBLIC = "SELECT * FROM regions"
REFUSED = "SELECT * FROM persons"

AUDIT_COLUMNS = (
    "query_id, user_name, policy_version, decision, reason, fingerprint, sql_text, rows_returned"
)


def audit_rows(path) -> list[dict]:
    """The audit log, oldest first, read without the TIMESTAMPTZ column."""
    names = [c.strip() for c in AUDIT_COLUMNS.split(",")]
    rows = query(path, f"SELECT {AUDIT_COLUMNS} FROM sqlsdc.audit ORDER BY query_id")
    return [dict(zip(names, row, strict=True)) for row in rows]


def ledger_rows(path, query_id) -> list[tuple]:
    return query(
        path,
        "SELECT user_name, fingerprint, cell, column_name, mechanism, status "
        "FROM sqlsdc.ledger WHERE query_id = ? ORDER BY cell, column_name",
        [query_id],
    )


def run_session(path):
    """Run two accepted protected queries, a public one and a refused one as ``analyst``."""
    with sqlsdc.connect(path, user="analyst") as con:
        first = con.execute(ACCEPTED)
        accepted = (first.query_id, first.fetchall(), first.explain().fingerprint)
        second = con.execute(SMALL_CELLS)
        small = (second.query_id, second.fetchall(), second.cell_status())
        public = con.execute(PUBLIC)
        public_result = (public.query_id, public.fetchall())
        with pytest.raises(sqlsdc.PolicyViolation, match="row-level output"):
            con.execute(REFUSED)
    return accepted, small, public_result


def test_audit_log_records_every_decision(fresh_demo_db):
    (qid1, rows1, fingerprint), (qid2, rows2, _), (qid3, rows3) = run_session(fresh_demo_db)
    log = audit_rows(fresh_demo_db)
    assert [e["decision"] for e in log] == ["accepted", "accepted", "accepted", "refused"]
    assert [e["query_id"] for e in log[:3]] == [qid1, qid2, qid3]
    assert [e["sql_text"] for e in log] == [ACCEPTED, SMALL_CELLS, PUBLIC, REFUSED]
    assert {e["user_name"] for e in log} == {"analyst"}
    assert {e["policy_version"] for e in log} == {1}
    for entry, rows in zip(log[:3], (rows1, rows2, rows3), strict=True):
        assert entry["reason"] is None
        assert entry["rows_returned"] == len(rows)
        assert entry["fingerprint"]
    assert log[0]["fingerprint"] == fingerprint
    refused = log[3]
    assert refused["reason"].startswith("row-level output of confidential tables is not allowed")
    assert refused["rows_returned"] is None
    assert refused["fingerprint"] is None


def test_store_audit_entries(fresh_demo_db):
    run_session(fresh_demo_db)
    con = open_database(fresh_demo_db)
    try:
        newest_first = store.audit_entries(con)
        refusals = store.audit_entries(con, decision="refused")
        by_other = store.audit_entries(con, user="admin")
        limited = store.audit_entries(con, limit=2)
    finally:
        con.close()
    assert [e["decision"] for e in newest_first] == ["refused", "accepted", "accepted", "accepted"]
    assert [e["sql_text"] for e in refusals] == [REFUSED]
    assert refusals[0]["reason"] and refusals[0]["user_name"] == "analyst"
    assert newest_first[-1]["rows_returned"] == 8
    assert by_other == []
    assert len(limited) == 2
    assert newest_first[0]["logged_at"] >= newest_first[-1]["logged_at"]


def test_ledger_has_one_row_per_released_protected_cell(fresh_demo_db):
    (qid1, rows1, fingerprint), (qid2, rows2, status2), (qid3, _) = run_session(fresh_demo_db)
    ledger = ledger_rows(fresh_demo_db, qid1)
    assert len(ledger) == len(rows1)
    assert {(u, f, c, m, s) for u, f, _, c, m, s in ledger} == {
        ("analyst", fingerprint, "n", "threshold", "published")
    }
    cells = [json.loads(row[2]) for row in ledger]
    assert sorted(c["keys"]["region"] for c in cells) == sorted(r[0] for r in rows1)
    assert all(c["tables"] == ["persons"] for c in cells)

    ledger = ledger_rows(fresh_demo_db, qid2)
    assert len(ledger) == 2 * len(rows2)  # two protected columns per row
    statuses = {row[5] for row in ledger}
    assert statuses == {"published", "suppressed"}
    released = {
        (json.loads(cell)["keys"]["municipality"], column): status
        for _, _, cell, column, _, status in ledger
    }
    for row, (_, cell_status) in zip(rows2, status2.iterrows(), strict=True):
        municipality, n, mean = row
        assert released[(municipality, "n")] == cell_status["n"]
        assert released[(municipality, "mean")] == cell_status["mean"]
        assert (n is None) == (cell_status["n"] == "suppressed")
    assert ledger_rows(fresh_demo_db, qid3) == []  # public values are not ledgered
    refused_id = audit_rows(fresh_demo_db)[-1]["query_id"]
    assert ledger_rows(fresh_demo_db, refused_id) == []


# --- secrets never leave the catalog -----------------------------------------------------------

PROBES = [
    "SELECT * FROM sqlsdc.secrets",
    "SELECT material FROM sqlsdc.secrets",
    "SELECT hex(material) FROM sqlsdc.secrets",
    "SELECT COUNT(*) FROM sqlsdc.secrets",
    "SELECT * FROM secrets",
    "SELECT * FROM main.sqlsdc.secrets",
    "SELECT * FROM query_table('sqlsdc.secrets')",
    "SELECT * FROM query('SELECT * FROM sqlsdc.secrets')",
    "SELECT region, COUNT(*) FROM persons WHERE region IN (SELECT hex(material) FROM "
    "sqlsdc.secrets) GROUP BY region",
    "SELECT * FROM regions, sqlsdc.secrets",
    "WITH s AS (SELECT * FROM sqlsdc.secrets) SELECT * FROM s",
    "SELECT * FROM duckdb_tables()",
    "SELECT * FROM sqlsdc.audit",
    "SELECT region, SUM(__rkey) FROM persons GROUP BY region",
]

ALLOWED = [
    ACCEPTED,
    SMALL_CELLS,
    PUBLIC,
    "SELECT sex, SUM(income) AS total, COUNT(*) AS n FROM persons GROUP BY sex",
]


def test_secret_never_appears(fresh_demo_db):
    ((_, secret),) = secret_rows(fresh_demo_db)
    forms = {secret.hex(), secret.hex().upper(), secret.decode("latin-1")}
    seen = []
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        with pytest.raises(sqlsdc.PolicyViolation):
            con.execute("SELECT * FROM sqlsdc.secrets")
        for sql in PROBES:
            try:
                cursor = con.execute(sql)
            except sqlsdc.Error as error:
                seen.append(str(error))
            else:
                seen.append(repr(cursor.fetchall()))
        for sql in ALLOWED:
            cursor = con.execute(sql)
            seen.append(repr(cursor.fetchall()))
            seen.append(cursor.df().to_csv())
            seen.append(cursor.cell_status().to_csv())
            seen.append(str(cursor.explain()))
            for row in cursor.arrow().to_pylist():
                assert secret not in row.values()
    assert len(seen) == len(PROBES) + 4 * len(ALLOWED)
    for text in seen:
        for form in forms:
            assert form not in text


def test_catalog_and_keys_are_not_queryable(fresh_demo_db):
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        for sql in PROBES:
            with pytest.raises(sqlsdc.PolicyViolation):
                con.execute(sql)


# --- connecting --------------------------------------------------------------------------------


def test_undeclared_user_is_denied(demo_db):
    with pytest.raises(sqlsdc.AccessDenied, match=r"user 'mallory' is not declared"):
        sqlsdc.connect(demo_db, user="mallory")


def test_database_without_catalog(db):
    with pytest.raises(sqlsdc.Error, match=r"no sqlsdc catalog; run `sqlsdc init"):
        sqlsdc.connect(db, user="ana")
    sqlsdc.init(db, POLICY, applied_by="root")
    with sqlsdc.connect(db, user="ana") as con:
        assert con.policy_version == 1
        assert con.execute("SELECT COUNT(*) AS n FROM people").fetchall() == [(PEOPLE,)]


def test_connecting_to_a_missing_file_does_not_create_it(tmp_path):
    path = tmp_path / "typo.duckdb"
    with pytest.raises(sqlsdc.Error, match="sqlsdc init"):
        sqlsdc.connect(path, user="analyst")
    assert not path.exists()


def _ledger_rows(result, monkeypatch, parameter_rows, tables=("t",), population="p"):
    monkeypatch.setattr(store, "PARAMETER_ROWS", parameter_rows)
    con = duckdb.connect()
    con.execute(f"CREATE SCHEMA {store.S}")
    con.execute(next(d for d in store.DDL if f"{store.S}.ledger" in d))
    keys = [(name, i) for i, name in enumerate(result.column_names[:-2])]
    n = result.num_columns
    cells = [("value", n - 2, "ckm", None), ("value_again", n - 2, "ckm", n - 1)]
    store.record_release(con, result, tables=list(tables), keys=keys, cells=cells,
                         population=population, query_id=7, user="u", fingerprint="f")  # fmt: skip
    rows = con.execute(
        f"SELECT query_id, cell, column_name, mechanism, status FROM {store.S}.ledger ORDER BY ALL"
    ).fetchall()
    con.close()
    return rows


def test_ledger_rows_are_the_same_from_parameters_and_from_a_registered_view(monkeypatch):
    """Small results go to the ledger as list parameters, large or nested ones as a registered
    Arrow view; a cell's identity (its JSON key values) must not depend on which."""
    import datetime as dt
    from decimal import Decimal

    import pyarrow as pa

    plain = pa.table({
        "s": pa.array(["a", "é", None]),
        "i8": pa.array([1, -2, None], pa.int8()),
        "u64": pa.array([2**63, 0, 5], pa.uint64()),
        "f32": pa.array([1.1, float("nan"), -0.0], pa.float32()),
        "f64": pa.array([1 / 3, 1e300, None]),
        "d": pa.array([Decimal("1.500"), Decimal("-0.001"), None], pa.decimal128(18, 3)),
        "wide": pa.array([Decimal(10**30), Decimal(-1), Decimal(0)], pa.decimal128(38, 0)),
        "b": pa.array([True, None, False]),
        "day": pa.array([dt.date(2020, 1, 2), None, dt.date(1, 1, 1)]),
        "ts": pa.array([dt.datetime(2020, 1, 2, 3, 4, 5, 123456), None, None], pa.timestamp("us")),
        "value": pa.array([10, None, 3]),
        "status": pa.array(["published", "suppressed", "published"]),
    })  # fmt: skip
    assert all(store._plain(field.type) for field in plain.schema)  # parameters, at 1024 rows
    from_parameters = _ledger_rows(plain, monkeypatch, parameter_rows=1024)
    from_view = _ledger_rows(plain, monkeypatch, parameter_rows=0)
    assert from_parameters == from_view and len(from_view) == 6
    cell = json.loads(from_view[0][1])
    assert set(cell["keys"]) == set(plain.column_names[:-2]) and cell["tables"] == ["t"]
    assert [r[4] for r in from_view].count("suppressed") == 2  # NULL value, and the status column

    nested = plain.append_column("tz", pa.array([dt.datetime(2020, 1, 1, tzinfo=dt.UTC)] * 3))
    nested = nested.append_column("none", pa.nulls(3))
    nested = nested.select([*plain.column_names[:-2], "tz", "none", "value", "status"])
    assert _ledger_rows(nested, monkeypatch, 1024) == _ledger_rows(nested, monkeypatch, 0)


def test_identities_written_in_python_are_duckdbs_text_or_left_to_duckdb():
    """:mod:`sqlsdc.catalog.identity_text` writes a ledger identity only where its text is
    DuckDB's, byte for byte: every ASCII character and a few others, as a key value, a key
    name, a table and a population, and integers at the ends of their ranges."""
    from sqlsdc.catalog.identity_text import identities

    con = duckdb.connect()
    texts = [chr(c) for c in range(128)] + ["é", "\u2028", "a/b", "", "R01", "x y~{}[]:,"]
    integers = [0, -1, 2**63 - 1, -(2**63), 2**64 - 1]
    written = 0
    for value in [*texts, *integers, None]:
        kind = "UBIGINT" if isinstance(value, int) and value >= 2**63 else (
            "HUGEINT" if isinstance(value, int) else "TEXT")  # fmt: skip
        for tables, population, name in ((["t"], None, "k"), (["a", "b"], "p", "k"),
                                          ([str(value)], "p", "k"), (["t"], str(value), "k"),
                                          (["t"], None, str(value))):  # fmt: skip
            ours = identities(tables, population, [name], [[value]], 1)
            scope = "'population', ?::TEXT, " if population is not None else ""
            duck = con.execute(
                f"SELECT CAST(json_object('tables', to_json(?::TEXT[]), {scope}'keys', "
                f"json_object(?::TEXT, ?::{kind})) AS TEXT)",
                [tables, *([population] if population is not None else []), name, value],
            ).fetchone()[0]
            assert ours is None or ours == [duck], (value, tables, population, name)
            written += ours is not None
    assert written > 400  # printable ASCII but " and \ is written in Python
    assert identities(["t"], None, ["k"], [[True]], 1) is None  # DuckDB writes true
    assert identities(["t"], None, ["k"], [[1.5]], 1) is None
    assert identities(["t"], "p", [], [], 2) == ['{"tables":["t"],"population":"p","keys":{}}'] * 2
    assert con.execute("SELECT CAST(json_object('tables', to_json(['t']), 'population', 'p', "
                       "'keys', json_object()) AS TEXT)").fetchone()[0] == (
        '{"tables":["t"],"population":"p","keys":{}}')  # fmt: skip


def test_ledger_rows_are_the_same_with_identities_written_in_python(monkeypatch):
    """The ledger rows of a small result whose keys are plain (text, integers, NULL) are the
    same whether DuckDB writes their identities or Python does; a result with a key that is
    not plain is left to DuckDB whole."""
    import pyarrow as pa

    from sqlsdc.catalog import identity_text

    written = identity_text.identities
    calls = []

    def spied(*args):
        calls.append(written(*args))
        return calls[-1]

    plain = pa.table({
        "s": pa.array(["R01", "a b", None]),
        "i": pa.array([1, -(2**62), None], pa.int64()),
        "u": pa.array([2**64 - 1, 0, 5], pa.uint64()),
        "value": pa.array([10, None, 3]),
        "status": pa.array(["published", "suppressed", "published"]),
    })  # fmt: skip
    quoted = plain.set_column(0, "s", pa.array(['say "hi"', "back\\slash", "é"]))
    no_keys = plain.select(["value", "status"])
    for result in (plain, quoted, no_keys):
        for tables, population in ((("t",), "p"), (("a", "b"), None)):
            monkeypatch.setattr(identity_text, "identities", lambda *a: None)
            by_duckdb = _ledger_rows(result, monkeypatch, 1024, tables, population)
            calls.clear()
            monkeypatch.setattr(identity_text, "identities", spied)
            by_python = _ledger_rows(result, monkeypatch, 1024, tables, population)
            assert by_python == by_duckdb and len(by_duckdb) == 6
            assert calls and (calls[0] is None) == (result is quoted)


def test_a_domain_must_hold_values_of_its_columns_type(db):
    """A text code declared for an integer column was applied, and a DP query over it released
    noise for cells that match no row and left the real groups out."""
    bad = copy.deepcopy(POLICY)
    bad["tables"]["people"]["columns"]["hh"] = {"role": "dimension", "domain": ["h1", 2.5, 3]}
    with pytest.raises(sqlsdc.PolicyError) as refused:
        sqlsdc.init(db, bad, applied_by="root")
    text = str(refused.value)
    assert "tables.people.columns.hh.domain: 'h1' is not a value of the column's type" in text
    assert "2.5 is not a value" in text and "3 is not" not in text
    fine = copy.deepcopy(POLICY)
    fine["tables"]["people"]["columns"]["hh"] = {"role": "dimension", "domain": [1, 2, 3]}
    fine["tables"]["people"]["columns"]["town"] = {"role": "dimension", "domain": ["t1", "t2"]}
    sqlsdc.init(db, fine, applied_by="root")


def test_text_that_casts_to_a_columns_type_is_refused_in_its_domain(tmp_path):
    """``domain: ['1', '2']`` for an INTEGER column (or '2020-01-01' for a DATE) passed the
    check, as DuckDB casts the text, but the DP release matches declared values to the
    engine's by value: no group matched, every count was noise around 0 (keys typed as
    text), and ``[1, '1', 2]`` failed after the charge with pyarrow's ArrowInvalid (red team
    s41b). Unquoted numbers are the groups' counts."""
    db = tmp_path / "grades.duckdb"
    with duckdb.connect(db) as raw:
        raw.execute("CREATE TABLE pupils AS SELECT range AS id, range % 2 + 1 AS grade, "
                    "DATE '2020-01-01' + (range % 2)::INTEGER AS day FROM range(2000)")  # fmt: skip

    def document(grade, day=None) -> dict:
        columns = {"id": {"role": "identifier"}, "grade": {"role": "dimension", "domain": grade}}
        columns["day"] = {"role": "dimension"} if day is None else {"role": "dimension",
                                                                     "domain": day}  # fmt: skip
        table = {"privacy_unit": "id", "columns": columns,
                 "protection": {"counts": {"method": "dp", "spend": {"epsilon": 1}}}}  # fmt: skip
        return {"tables": {"pupils": table}, "budgets": [{"user": "ana", "epsilon": 10}],
                "users": {"root": {"role": "admin"}, "ana": {"role": "analyst"}}}  # fmt: skip

    refusals = {
        ("1", "2"): "'1' is not a value of the column's type BIGINT (it is text: write it "
        "unquoted, 1)",
        (1, "1", 2): "'1' is not a value of the column's type BIGINT",
    }
    for grade, message in refusals.items():
        with pytest.raises(sqlsdc.PolicyError, match=re.escape(message)):
            sqlsdc.init(db, document(list(grade)), applied_by="root")
    with pytest.raises(sqlsdc.PolicyError, match="'2020-01-01' is not a value of the column's "
                       r"type DATE \(a policy writes it as text"):  # fmt: skip
        sqlsdc.init(db, document([1, 2], ["2020-01-01", "2020-01-02"]), applied_by="root")
    sqlsdc.init(db, document([1, 2]), applied_by="root")
    with sqlsdc.connect(db, "ana") as con:
        counts = dict(con.execute("SELECT grade, COUNT(*) FROM pupils GROUP BY grade").fetchall())
    assert set(counts) == {1, 2} and all(abs(n - 1000) < 40 for n in counts.values())


def test_numbers_in_the_domain_of_a_text_column_are_refused(tmp_path):
    """``domain: [01, 02, 10]`` for NACE codes '01', '02', '10': YAML reads numbers 1, 2, 10,
    init applied them, and every DP count of the column was noise around 0 (no group matched
    a code). `sqlsdc init` (a real process) now says to quote them; quoted, the counts are the
    codes' (new user s38)."""

    db = tmp_path / "codes.duckdb"
    with duckdb.connect(db) as raw:
        raw.execute("CREATE TABLE firms AS SELECT range AS id, ['01', '02', '10'][range % 3 + 1] "
                    "AS nace FROM range(600)")  # fmt: skip
    text = (
        "protection:\n  counts: {method: dp, spend: {epsilon: 1}}\ntables:\n  firms:\n"
        "    privacy_unit: id\n    columns:\n      id: {role: identifier}\n"
        "      nace: {role: dimension, domain: DOMAIN}\nbudgets:\n  - {user: ana, epsilon: 10}\n"
        "users:\n  chief: {role: admin}\n  ana: {role: analyst}\n"
    )
    command = ["init", db, "--policy", tmp_path / "p.yaml", "--as", "chief"]
    (tmp_path / "p.yaml").write_text(text.replace("DOMAIN", "[01, 02, 10]"))
    done = cli_fork.run(command, timeout=300)
    assert done.returncode == 4
    assert "tables.firms.columns.nace.domain: 1 is not text, and the column holds text: write " \
        "the codes in quotes, '1' (YAML reads 01 as the number 1, so '01' needs them too)" \
        in done.stderr and "10 is not text" in done.stderr  # fmt: skip
    (tmp_path / "p.yaml").write_text(text.replace("DOMAIN", "[NO, '02', '10']"))  # Norway
    done = cli_fork.run(command, timeout=300)
    assert done.returncode == 4 and "mixes true/false with other values; give one kind of " \
        "value (YAML reads NO, yes, on and off as true or false: quote such codes, 'NO')" \
        in done.stderr  # fmt: skip
    (tmp_path / "p.yaml").write_text(text.replace("DOMAIN", "[NO, YES]"))  # all true or false
    done = cli_fork.run(command, timeout=300)
    assert done.returncode == 4 and "False is not text, and the column holds text: write the " \
        "codes in quotes, YAML reads NO, yes, on and off as true or false: quote such codes, " \
        "'NO'" in done.stderr  # fmt: skip
    (tmp_path / "p.yaml").write_text(text.replace("DOMAIN", "['01', '02', '10']"))
    done = cli_fork.run(command, timeout=300)
    assert done.returncode == 0, done.stderr
    with sqlsdc.connect(db, "ana") as con:
        counts = dict(con.execute("SELECT nace, COUNT(*) FROM firms GROUP BY nace").fetchall())
    assert set(counts) == {"01", "02", "10"} and all(150 < n < 250 for n in counts.values())
