"""Objects the policy does not declare do not exist for analysts, and the engine's words never
reach them.

The database here holds what an analyst must not learn about: an undeclared column and a
column declared ``hidden`` in the public ``regions`` table, a hidden and an undeclared column in
the confidential ``persons`` table, an undeclared table, a view, a sequence, a user type, a
schema, and sqlsdc's own catalog. Every attack is run twice, once naming the existing object and
once naming one that exists nowhere, and the two outcomes must be the same (with the name
swapped): a refusal whose text differed would tell the analyst what exists. Engine failures
(conversion errors, broken catalog writes, a duplicate key in the audit log or the budget
ledger) must reach the analyst as one sqlsdc message, the engine's text going to the audit log
only. The statement timeout is the policy's, and a connection can only shorten it.
"""

from __future__ import annotations

import re
import shutil

import pytest

import sqlsdc
from sqlsdc.catalog import store
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import NotFoundError
from sqlsdc.policy import load_policy

SECRET = 4242424  # the value of every hidden column: it must never come back

HIDDEN_COLUMNS = {  # table -> (undeclared column, column declared hidden)
    "regions": ("secret_col", "code_hidden"),
    "persons": ("undeclared_col", "nin"),
}
MISSING_COLUMN = "nosuch_col"

# name of an existing hidden object -> name of one that exists nowhere
HIDDEN_TABLES = {"secret_t": "nosuch_t", "hidden_v": "nosuch_v", "hidden_seq": "nosuch_seq"}
HIDDEN_SCHEMAS = {"hs": "nosuch_schema", "sqlsdc": "nosuch_catalog", "main": "nosuch_main"}


def hidden_policy(threshold_document: dict) -> dict:
    document = threshold_document
    document["tables"]["regions"]["columns"]["code_hidden"] = {"role": "hidden"}
    document["tables"]["persons"]["columns"]["nin"] = {"role": "hidden"}
    document["limits"] = {"statement_timeout_seconds": 60}
    return document


@pytest.fixture(scope="module")
def hidden_db(pristine_demo_db, tmp_path_factory, copy_database):
    """The demo database with hidden objects around the declared ones."""
    path = copy_database(pristine_demo_db, tmp_path_factory.mktemp("hidden"))
    con = open_database(path)
    try:
        document = store.current_policy(con)[1]
        for table, columns in HIDDEN_COLUMNS.items():
            for column in columns:
                con.execute(f"ALTER TABLE {table} ADD COLUMN {column} BIGINT DEFAULT {SECRET}")
        con.execute(f"CREATE TABLE secret_t AS SELECT {SECRET} AS a, 'R01' AS region")
        con.execute(f"CREATE VIEW hidden_v AS SELECT {SECRET} AS a")
        con.execute("CREATE SEQUENCE hidden_seq")
        con.execute("CREATE TYPE mood AS ENUM ('R01', 'R02')")
        con.execute("CREATE SCHEMA hs")
        con.execute(f"CREATE TABLE hs.regions AS SELECT 'R01' AS region, {SECRET} AS a")
        con.execute(f"CREATE MACRO hidden_m(x) AS x + {SECRET}")
    finally:
        con.close()
    sqlsdc.admin.apply(path, load_policy(hidden_policy(document)), user="admin")
    return path


@pytest.fixture(scope="module")
def guarded(hidden_db):
    con = sqlsdc.connect(hidden_db, user="analyst")
    yield con
    con.close()


def outcome(con, sql: str) -> tuple:
    """What the analyst sees: the rows, or the error's class and message (query ids dropped)."""
    try:
        rows = con.execute(sql).fetchall()
    except sqlsdc.Error as e:
        return (type(e).__name__, _without_query_id(str(e)))
    assert not any(SECRET in row for row in rows), f"a hidden value came back: {sql}"
    return ("rows", rows)


def _without_query_id(message: str) -> str:
    return re.sub(r" \(query \d+\)", "", message)


def assert_alike(con, template: str, existing: str, missing: str, *, refused: bool = True):
    """The query naming ``existing`` ends exactly as the one naming ``missing``."""
    seen = outcome(con, template.format(name=existing))
    expected = outcome(con, template.format(name=missing))
    assert _named(seen, existing) == _named(expected, missing), template
    if refused:
        assert seen[0] == "PolicyViolation", (template, seen)


def _named(seen: tuple, name: str) -> tuple:
    """An outcome with ``name`` (in any case) replaced by a placeholder."""
    return tuple(
        re.sub(re.escape(name), "<name>", part, flags=re.I) if isinstance(part, str) else part
        for part in seen
    )


# --- columns -------------------------------------------------------------------------------

PUBLIC_COLUMN_ATTACKS = [
    "SELECT {name} FROM regions",
    "SELECT regions.{name} FROM regions",
    "SELECT r.{name} FROM regions AS r",
    "SELECT region FROM regions WHERE {name} = 4242424",
    "SELECT region FROM regions WHERE {name} IS NOT NULL",
    "SELECT {name}, COUNT(*) FROM regions GROUP BY {name}",
    "SELECT region FROM regions ORDER BY {name}",
    "SELECT region, MAX(population) FROM regions GROUP BY region HAVING MAX({name}) > 0",
    "SELECT COUNT(*) FROM regions a JOIN regions b ON a.{name} = b.{name}",
    "SELECT COUNT(*) FROM regions a JOIN regions b USING ({name})",
    "SELECT region FROM regions WHERE region IN (SELECT region FROM regions WHERE {name} > 0)",
    "SELECT (SELECT MAX({name}) FROM regions) AS m",
    "SELECT * REPLACE ({name} AS population) FROM regions",
    "SELECT * EXCLUDE ({name}) FROM regions",
    "SELECT CASE WHEN {name} > 0 THEN 1 ELSE 0 END AS x FROM regions",
    "WITH c AS (SELECT * FROM regions) SELECT c.{name} FROM c",
    "SELECT s.{name} FROM (SELECT * FROM regions) AS s",
    "SELECT p.region, COUNT(*) FROM persons p JOIN regions r ON p.region = r.region "
    "WHERE r.{name} > 0 GROUP BY p.region",
    "SELECT region, COUNT(*) FROM regions GROUP BY ROLLUP (region, {name})",
    "SELECT region, ROW_NUMBER() OVER (PARTITION BY {name}) AS n FROM regions",
    "SELECT region, SUM(population) OVER (ORDER BY {name}) AS s FROM regions",
    "SELECT COUNT(*) FILTER (WHERE {name} > 0) AS n FROM regions",
    "SELECT COUNT(DISTINCT {name}) AS n FROM regions",
    "SELECT region FROM regions LIMIT {name}",
    "SELECT region FROM regions a JOIN regions b USING (region) WHERE {name} IN (1, 2)",
    "SELECT region FROM regions GROUP BY region HAVING {name} > 0",
    "SELECT region FROM regions GROUP BY ALL HAVING COUNT({name}) > 0",
    'SELECT "{name}" FROM regions',
    "SELECT region FROM regions WHERE region = 'R01' OR {name} = 1",
]

CONFIDENTIAL_COLUMN_ATTACKS = [
    "SELECT region, COUNT(*) FROM persons WHERE {name} > 0 GROUP BY region",
    "SELECT region, SUM({name}) FROM persons GROUP BY region",
    "SELECT {name}, COUNT(*) FROM persons GROUP BY {name}",
    "SELECT COUNT(DISTINCT {name}) FROM persons",
    "SELECT p.region, COUNT(*) FROM persons p JOIN regions r ON p.{name} = r.population "
    "GROUP BY p.region",
    "SELECT region, COUNT(*) FROM (SELECT * FROM persons) AS s WHERE s.{name} > 0 GROUP BY 1",
]


def test_select_star_of_a_public_table_is_its_declared_columns(guarded):
    cursor = guarded.execute("SELECT * FROM regions ORDER BY region")
    assert [d[0] for d in cursor.description] == ["region", "name", "population"]
    for sql in ("SELECT regions.* FROM regions", "SELECT r.* FROM regions r",
                "WITH c AS (SELECT * FROM regions) SELECT * FROM c",
                "SELECT * FROM (SELECT * FROM regions) s",
                "SELECT * FROM regions a JOIN regions b USING (region)"):  # fmt: skip
        names = [d[0] for d in guarded.execute(sql).description]
        assert not {"secret_col", "code_hidden"} & set(names), sql


def test_natural_join_uses_declared_columns_only(guarded, hidden_db):
    """DuckDB would join on every common column, hidden ones too; the guard writes the join
    out over the declared ones."""
    explained = guarded.explain("SELECT COUNT(*) AS n FROM regions a NATURAL JOIN regions b")
    assert "secret_col" not in explained.sql and "code_hidden" not in explained.sql


@pytest.mark.parametrize("template", PUBLIC_COLUMN_ATTACKS)
@pytest.mark.parametrize("column", HIDDEN_COLUMNS["regions"])
def test_hidden_columns_of_a_public_table_do_not_exist(guarded, template, column):
    star = "* EXCLUDE" in template or "* REPLACE" in template  # alike, refused or not
    assert_alike(guarded, template, column, MISSING_COLUMN, refused=not star)


@pytest.mark.parametrize("template", CONFIDENTIAL_COLUMN_ATTACKS)
@pytest.mark.parametrize("column", HIDDEN_COLUMNS["persons"])
def test_hidden_columns_of_a_confidential_table_do_not_exist(guarded, template, column):
    assert_alike(guarded, template, column, MISSING_COLUMN)


# --- tables, schemas, types, CTEs ----------------------------------------------------------

TABLE_ATTACKS = [
    "SELECT * FROM {name}",
    "SELECT COUNT(*) FROM {name}",
    "SELECT x.a FROM {name} AS x",
    "SELECT region FROM regions JOIN {name} USING (region)",
    "SELECT region FROM regions WHERE region IN (SELECT region FROM {name})",
    "SELECT region FROM regions WHERE EXISTS (SELECT 1 FROM {name})",
    "SELECT (SELECT COUNT(*) FROM {name}) AS n",
    "SELECT region, COUNT(*) FROM persons WHERE EXISTS (SELECT 1 FROM {name}) GROUP BY region",
    "WITH c AS (SELECT * FROM {name}) SELECT * FROM c",
    "SELECT {name}.a FROM regions",
    "SELECT {name} FROM regions",
    "SELECT {name}.nextval AS v",
    # a CTE is visible only in its own query: beyond it the name is the catalog's
    "SELECT s.a FROM (WITH {name} AS (SELECT 1 AS a) SELECT a FROM {name}) AS s, {name}",
    "SELECT a FROM (WITH {name} AS (SELECT 1 AS a) SELECT a FROM {name}) UNION ALL "
    "SELECT a FROM {name}",
    "WITH c AS (SELECT * FROM {name}), {name} AS (SELECT 1 AS a) SELECT * FROM c",
    "WITH {name} AS (SELECT * FROM {name}) SELECT * FROM {name}",
]

CTE_AND_ALIAS_USES = [  # accepted whatever the name: the CTE or alias shadows the catalog
    "WITH {name} AS (SELECT region FROM regions) SELECT * FROM {name} ORDER BY 1",
    "WITH {name} AS (SELECT region FROM persons) "
    "SELECT region, COUNT(*) FROM {name} GROUP BY region ORDER BY 1",
    "WITH {name} AS (SELECT 1 AS a), c AS (SELECT * FROM {name}) SELECT * FROM c",
    "SELECT {name}.region FROM regions AS {name} ORDER BY 1",
    "SELECT region, COUNT(*) FROM persons AS {name} GROUP BY region ORDER BY 1",
    "SELECT {name}.region FROM (SELECT region FROM regions) AS {name} ORDER BY 1",
]

SCHEMA_ATTACKS = [
    "SELECT * FROM {name}.regions",
    "SELECT * FROM {name}.secrets",
    "SELECT * FROM {name}.audit",
    "SELECT region FROM regions WHERE region IN (SELECT region FROM {name}.regions)",
    "SELECT {name}.regions.region FROM regions",
    "SELECT region FROM regions WHERE {name}.regions.population > 0",
    "SELECT region, COUNT(*) FROM persons WHERE {name}.persons.age > 0 GROUP BY region",
]

SYSTEM_NAMES = ["information_schema", "pg_catalog", "duckdb_tables", "duckdb_columns",
                "pg_tables", "sqlite_master", "temp", "system"]  # fmt: skip


@pytest.mark.parametrize("template", TABLE_ATTACKS)
@pytest.mark.parametrize(("existing", "missing"), HIDDEN_TABLES.items())
def test_undeclared_tables_are_refused_alike(guarded, template, existing, missing):
    assert_alike(guarded, template, existing, missing)


@pytest.mark.parametrize("template", CTE_AND_ALIAS_USES)
@pytest.mark.parametrize(
    "name", [*HIDDEN_TABLES, "duckdb_tables", "pg_tables", "mood", "sqlsdc", "information_schema"]
)
def test_ctes_and_aliases_named_like_hidden_objects_behave_like_any_name(guarded, template, name):
    seen = outcome(guarded, template.format(name=name))
    assert seen == outcome(guarded, template.format(name="nosuch_t"))
    assert seen[0] == "rows"


def test_the_engine_check_does_not_exempt_a_cte_name_out_of_its_scope(guarded):
    """Defence in depth: DuckDB's parser reports the tables a statement reads with CTE scopes
    resolved, so a table named like a CTE of another scope is a table, and refused."""
    import sqlglot

    from sqlsdc.engines.duckdb_schema import tables_read_by
    from sqlsdc.guard.validate import check_engine_tables

    sql = "SELECT * FROM (WITH secret_t AS (SELECT 1 AS a) SELECT a FROM secret_t) AS s, secret_t"
    read = tables_read_by(guarded._con, sql)
    assert read == {"secret_t"}
    with pytest.raises(sqlsdc.InternalError, match="undeclared table secret_t"):
        check_engine_tables(read, sqlglot.parse_one(sql, read="duckdb"), guarded.policy)


@pytest.mark.parametrize("template", SCHEMA_ATTACKS)
@pytest.mark.parametrize(("existing", "missing"), HIDDEN_SCHEMAS.items())
def test_qualified_names_are_refused_alike(guarded, template, existing, missing):
    assert_alike(guarded, template, existing, missing)


@pytest.mark.parametrize("name", SYSTEM_NAMES)
def test_system_catalogs_are_refused_like_missing_tables(guarded, name):
    assert_alike(guarded, "SELECT * FROM {name}", name, "nosuch_t")
    assert_alike(guarded, "SELECT * FROM {name}.tables", name, "nosuch_schema")


@pytest.mark.parametrize(
    "template",
    [
        "SELECT CAST(region AS {name}) AS x FROM regions",
        "SELECT region::{name} AS x FROM regions",
        "SELECT TRY_CAST(region AS {name}) AS x FROM regions",
        "SELECT CAST(region AS {name}[]) AS x FROM regions",
        "SELECT region, COUNT(*) FROM persons WHERE CAST(region AS {name}) = 'R01' GROUP BY 1",
    ],
)
def test_user_types_are_refused_alike(guarded, template):
    assert_alike(guarded, template, "mood", "nosuch_type")


def test_user_macros_are_refused_alike(guarded):
    assert_alike(guarded, "SELECT {name}(population) AS x FROM regions", "hidden_m", "nosuch_m")


# --- engine errors -------------------------------------------------------------------------


ENGINE_WORDS = ("Error:", "Exception", "Duplicate", "duplicate key", "Catalog", "Binder",
                "Constraint", "Conversion", "LINE 1", "Did you mean")  # fmt: skip


def _withheld(error: sqlsdc.Error) -> None:
    """sqlsdc's message, with no engine text, and no engine exception in the traceback."""
    text = str(error)
    for engine_words in ENGINE_WORDS:
        assert engine_words not in text, text
    assert error.__cause__ is None and (error.__suppress_context__ or error.__context__ is None)


def test_engine_failures_read_the_same_whatever_failed(hidden_db, tmp_path):
    """A conversion error on public data and a duplicate key in the audit log: one message."""
    path = tmp_path / "audit.duckdb"
    shutil.copy(hidden_db, path)
    with sqlsdc.connect(path, user="analyst") as con:
        with pytest.raises(sqlsdc.OperationalError) as conversion:
            con.execute("SELECT CAST(name AS INTEGER) AS x FROM regions")
        _withheld(conversion.value)
        raw = open_database(path)
        try:  # the next query ids are taken: recording the next query fails on the key
            (next_id,) = raw.execute(f"SELECT max(query_id) FROM {store.S}.audit").fetchone()
            for offset in range(1, 40):
                store.record_query(raw, next_id + offset, "intruder", None, "refused", "x")
        finally:
            raw.close()
        failures = []
        for sql in ("SELECT region, COUNT(*) FROM persons GROUP BY region",  # accepted
                    "SELECT * FROM secret_t",  # refused
                    "SELECT CAST(name AS INTEGER) AS x FROM regions"):  # fails  # fmt: skip
            with pytest.raises(sqlsdc.OperationalError) as failure:
                con.execute(sql)
            _withheld(failure.value)
            failures.append(_without_query_id(str(failure.value)))
        assert len(set(failures) | {_without_query_id(str(conversion.value))}) == 1


def test_engine_text_goes_to_the_audit_log(hidden_db):
    with sqlsdc.connect(hidden_db, user="analyst") as con:
        with pytest.raises(sqlsdc.OperationalError) as failure:
            con.execute("SELECT CAST(name AS INTEGER) AS x FROM regions")
        query_id = int(str(failure.value).split("(query ")[1].split(")")[0])
    raw = open_database(hidden_db)
    try:
        entry = next(e for e in store.audit_entries(raw) if e["query_id"] == query_id)
    finally:
        raw.close()
    assert entry["decision"] == "failed" and "Could not convert" in entry["reason"]


def test_a_broken_catalog_at_connect_is_sqlsdc_s_message(ckm_db, tmp_path):
    path = tmp_path / "broken.duckdb"
    shutil.copy(ckm_db, path)
    raw = open_database(path)
    try:
        raw.execute(f"DROP TABLE {store.S}.ptable_entries")  # CKM noise is read at connect
    finally:
        raw.close()
    with pytest.raises(sqlsdc.OperationalError, match="cannot open broken.duckdb") as failure:
        sqlsdc.connect(path, user="analyst")
    _withheld(failure.value)


def test_a_file_that_is_not_a_database_is_sqlsdc_s_message(tmp_path):
    path = tmp_path / "notes.duckdb"
    path.write_text("not a database\n" * 1000)
    with pytest.raises(NotFoundError, match="is not a DuckDB database file") as failure:
        sqlsdc.connect(path, user="analyst")
    _withheld(failure.value)


def test_a_ledger_duplicate_key_is_sqlsdc_s_message(ckm_db, tmp_path):
    """The DP budget ledger refuses a charge on a duplicate key: nothing of the engine's
    message (which quotes the key) reaches the analyst; the audit log keeps it."""
    path = tmp_path / "dp.duckdb"
    shutil.copy(ckm_db, path)
    raw = open_database(path)
    try:
        raw.execute(f"CREATE TABLE {store.S}.taken AS SELECT nextval('{store.S}.budget_seq') AS s")
        (taken,) = raw.execute(f"SELECT s FROM {store.S}.taken").fetchone()
        for seq in range(taken + 1, taken + 200):  # more than a charge's retries
            raw.execute(
                f"INSERT INTO {store.S}.budget_spend VALUES "
                f"({seq}, 0, now(), 'x', ['benefits'], '0', '0', '0', 0, 1)"
            )
    finally:
        raw.close()
    with sqlsdc.connect(path, user="analyst") as con:
        with pytest.raises(sqlsdc.Error, match="could not record the privacy spend") as failure:
            con.execute("SELECT scheme, COUNT(*) AS n FROM benefits GROUP BY scheme")
    _withheld(failure.value)
    raw = open_database(path)
    try:
        reasons = [e["reason"] or "" for e in store.audit_entries(raw)]
    finally:
        raw.close()
    assert any("Duplicate key" in r or "duplicate key" in r for r in reasons)


# --- the statement timeout -----------------------------------------------------------------


def test_the_timeout_is_the_policy_s(guarded):
    assert guarded.timeout == 60
    with pytest.raises(AttributeError):
        guarded.timeout = 10**9


@pytest.mark.parametrize("asked", [61, 10**9, float("inf")])
def test_an_analyst_cannot_raise_the_timeout(hidden_db, asked):
    with pytest.raises(sqlsdc.AccessDenied, match="above the policy's statement timeout of 60 s"):
        sqlsdc.connect(hidden_db, user="analyst", timeout=asked)


@pytest.mark.parametrize("asked", [0, -1, float("nan"), True, "600", None])
def test_a_timeout_must_be_a_positive_number(hidden_db, asked):
    if asked is None:  # not given: the policy's
        with sqlsdc.connect(hidden_db, user="analyst", timeout=asked) as con:
            assert con.timeout == 60
        return
    with pytest.raises(sqlsdc.ProgrammingError, match="positive number of seconds"):
        sqlsdc.connect(hidden_db, user="analyst", timeout=asked)


def test_a_connection_may_shorten_the_timeout(hidden_db):
    with sqlsdc.connect(hidden_db, user="analyst", timeout=2.5) as con:
        assert con.timeout == 2.5
        assert con.execute("SELECT COUNT(*) AS n FROM regions").fetchall() == [(8,)]


def test_a_statement_over_the_policy_s_timeout_is_stopped(hidden_db, tmp_path):
    path = tmp_path / "short.duckdb"
    shutil.copy(hidden_db, path)
    raw = open_database(path)
    try:
        document = store.current_policy(raw)[1]
    finally:
        raw.close()
    document["limits"] = {"statement_timeout_seconds": 1}
    sqlsdc.admin.apply(path, load_policy(document), user="admin")
    heavy = "SELECT COUNT(*) AS n FROM " + ", ".join(f"regions r{i}" for i in range(13))
    with sqlsdc.connect(path, user="analyst") as con:
        with pytest.raises(sqlsdc.OperationalError, match="statement timeout") as stopped:
            con.execute(heavy)
    _withheld(stopped.value)


@pytest.mark.parametrize(
    ("limits", "problem"),
    [
        ({"statement_timeout_seconds": 0},
         "limits.statement_timeout_seconds: 0 is below the minimum 1"),
        ({"statement_timeout_seconds": -5},
         "limits.statement_timeout_seconds: -5 is below the minimum 1"),
        ({"statement_timeout_seconds": 1e-9},  # every statement would time out
         "limits.statement_timeout_seconds: 1e-09 is below the minimum 1"),
        ({"statement_timeout_seconds": 100000},
         "limits.statement_timeout_seconds: 100000 is above the maximum 86400"),
        ({"statement_timeout_seconds": "30"},
         "limits.statement_timeout_seconds: expected number, got str '30'"),
        ({"timeout": 5}, "limits: unknown key(s) timeout; allowed here: "
                         "max_statement_characters, statement_timeout_seconds"),
    ],
)  # fmt: skip
def test_the_policy_s_timeout_is_validated(limits, problem):
    document = {"tables": {"t": {"kind": "public", "columns": {"a": {"role": "dimension"}}}},
                "users": {"root": {"role": "admin"}}, "limits": limits}  # fmt: skip
    with pytest.raises(sqlsdc.PolicyError) as error:
        load_policy(document, name="p.yaml")
    assert str(error.value) == f"p.yaml: {problem}"
    shorter = {**document, "limits": {"statement_timeout_seconds": 2.5}}
    assert load_policy(shorter).statement_timeout == 2.5
    default = {k: v for k, v in document.items() if k != "limits"}
    assert load_policy(default).statement_timeout == 300
