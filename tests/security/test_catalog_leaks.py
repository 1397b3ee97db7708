"""Attacks on the server's catalog (sqlsdc.server.catalog): with an analyst's session, no
catalog query names a hidden column or the sqlsdc schema, counts rows, reads a setting of the
engine, a file or a DuckDB function, or mixes catalog and data."""

from __future__ import annotations

import pytest

import sqlsdc


@pytest.fixture(scope="module")
def catalog(module_analyst):
    """One analyst's session catalog for the module (its shadow built once): the tests only
    ask catalog questions and are refused; none sets or changes what the next one sees."""
    from sqlsdc.server.catalog import SessionCatalog

    catalog = SessionCatalog(module_analyst)
    yield catalog
    catalog.close()


def all_text(answer) -> str:
    return " ".join(str(v) for row in answer.table.to_pylist() for v in row.values())


def test_no_hidden_column_record_key_or_sqlsdc_schema_is_listed(catalog, demo_db):
    names = all_text(catalog.answer(
        "SELECT c.relname, a.attname, n.nspname FROM pg_catalog.pg_attribute a "
        "JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"))  # fmt: skip
    everything = names + all_text(catalog.answer(
        "SELECT * FROM information_schema.columns")) + all_text(catalog.answer(
        "SELECT * FROM pg_catalog.pg_namespace")) + all_text(catalog.answer(
        "SELECT * FROM pg_catalog.pg_description"))  # fmt: skip
    assert "__" not in everything  # record keys and sqlsdc's own columns
    assert "sqlsdc" not in everything.replace("(sqlsdc)", "")
    with sqlsdc.connect(demo_db, user="admin") as admin:  # an analyst is shown no stored schema
        stored = set(admin.stored_schemas("main")["persons"])
    visible = {r["attname"] for r in catalog.answer(
        "SELECT a.attname FROM pg_catalog.pg_attribute a, pg_catalog.pg_class c "
        "WHERE c.oid = a.attrelid AND c.relname = 'persons'").table.to_pylist()}  # fmt: skip
    assert visible < stored  # the stored table has columns the analyst never sees


def test_row_counts_and_sizes_are_never_shown(catalog):
    rows = catalog.answer(
        "SELECT reltuples, relpages, pg_catalog.pg_total_relation_size(oid) AS size "
        "FROM pg_catalog.pg_class").table.to_pylist()  # fmt: skip
    assert rows and all(r == {"reltuples": -1.0, "relpages": 0, "size": 0} for r in rows)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM pg_catalog.pg_stats",
        "SELECT * FROM pg_catalog.pg_stat_user_tables",
        "SELECT * FROM pg_catalog.pg_statistic",
        "SELECT * FROM pg_catalog.pg_class, persons",
        "SELECT relname FROM pg_catalog.pg_class WHERE relname IN (SELECT region FROM persons)",
        "SELECT * FROM pg_catalog.pg_class, read_csv('/etc/passwd')",
        "SELECT duckdb_tables() FROM pg_catalog.pg_class",
        "SELECT getenv('HOME') FROM pg_catalog.pg_class",
        "SELECT * FROM pg_catalog.pg_class, sqlsdc.secrets",
        "SELECT read_text('/etc/passwd') FROM pg_catalog.pg_namespace",
        "SELECT system.main.current_setting('threads') FROM pg_catalog.pg_class",
        "SELECT * FROM information_schema.character_sets",
    ],
)
def test_catalog_statements_that_reach_beyond_the_catalog_are_refused(catalog, sql):
    with pytest.raises(sqlsdc.PolicyViolation):
        catalog.answer(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM duckdb_settings()",
        "SELECT current_setting('threads') FROM persons",
        "SELECT * FROM sqlsdc.secrets",
        "SELECT getenv('HOME')",
        "PRAGMA database_list",
        "ATTACH '/tmp/x.duckdb'",
    ],
)
def test_other_statements_go_to_the_guard(catalog, sql):
    assert catalog.answer(sql) is None  # the guard refuses them with its own reasons


def test_engine_settings_are_not_readable(catalog):
    answer = catalog.answer("SELECT current_setting('enable_external_access')")
    assert answer.table.column(0).to_pylist() == [None]  # sessions' strings only


def test_the_shadow_cannot_read_files_even_if_asked_directly(catalog):
    shadow = catalog._catalog()
    with pytest.raises(sqlsdc.engines.duckdb.EngineError):
        shadow.execute("SELECT * FROM read_csv('/etc/passwd')").fetchall()
