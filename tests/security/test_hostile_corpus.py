"""Hostile SQL corpus: every statement here must be refused with ``sqlsdc.PolicyViolation``.

Each statement is a plausible attack on the demo database (tables ``persons``, ``households``,
``enterprises``; public ``regions``) by an analyst who can only send SQL text. Statements are
grouped by the channel they try; the group name and a short label form the test id.

The target person used in singling-out attacks is the only person matching ``TARGET`` in the
demo data (seed 7, 20,000 persons): municipality R08-M018, female, 43, craft trades.

A refusal with another error (OperationalError after the query was accepted and failed while
running, for instance) fails the test on purpose: a query that fails for some data and not for
other data is itself an error side channel.
"""

from __future__ import annotations

import zlib

import pytest

import sqlsdc
from sqlsdc.catalog import store
from sqlsdc.engines.duckdb import open_database

# The one person in the demo data with these quasi-identifiers.
TARGET = "municipality = 'R08-M018' AND sex = 'F' AND age = 43 AND occupation = 'craft_trades'"

FILE_READERS = [
    ("read_csv", "SELECT * FROM read_csv('/etc/passwd')"),
    ("read_csv_auto", "SELECT COUNT(*) FROM read_csv_auto('/etc/passwd')"),
    ("read_parquet", "SELECT * FROM read_parquet('/tmp/raw.parquet')"),
    ("parquet_scan", "SELECT COUNT(*) FROM parquet_scan('/tmp/raw.parquet')"),
    ("read_json", "SELECT * FROM read_json('/tmp/x.json')"),
    ("read_json_auto", "SELECT * FROM read_json_auto('/tmp/x.json')"),
    ("read_text", "SELECT * FROM read_text('/etc/hostname')"),
    ("read_blob", "SELECT * FROM read_blob('/etc/hostname')"),
    ("glob", "SELECT * FROM glob('/tmp/*')"),
    ("glob_scalar", "SELECT glob('/tmp/*')"),
    ("quoted_file_table", "SELECT * FROM '/etc/passwd'"),
    ("file_csv_table", "SELECT COUNT(*) FROM 'file.csv'"),
    ("file_parquet_table", "SELECT region, COUNT(*) FROM 'persons.parquet' GROUP BY region"),
    ("sniff_csv", "SELECT * FROM sniff_csv('/etc/passwd')"),
    ("parquet_metadata", "SELECT * FROM parquet_metadata('/tmp/raw.parquet')"),
    (
        "file_join",
        "SELECT p.region, COUNT(*) FROM persons p JOIN read_csv('/tmp/x.csv') x "
        "ON p.region = x.region GROUP BY p.region",
    ),
    (
        "file_in_subquery",
        "SELECT COUNT(*) FROM persons WHERE region IN (SELECT region FROM read_csv('/tmp/x.csv'))",
    ),
    ("file_in_cte", "WITH f AS (SELECT * FROM read_parquet('/tmp/x.parquet')) SELECT * FROM f"),
    ("httpfs_url", "SELECT * FROM read_parquet('https://example.com/x.parquet')"),
]

STATEMENTS = [
    ("copy_to", "COPY persons TO '/tmp/leak.csv'"),
    ("copy_query_to", "COPY (SELECT * FROM persons) TO '/tmp/leak.parquet' (FORMAT parquet)"),
    ("copy_from", "COPY persons FROM '/tmp/evil.csv'"),
    ("export_database", "EXPORT DATABASE '/tmp/dump'"),
    ("import_database", "IMPORT DATABASE '/tmp/dump'"),
    ("attach", "ATTACH '/tmp/other.duckdb' AS other"),
    ("attach_memory", "ATTACH ':memory:' AS scratch"),
    ("detach", "DETACH demo"),
    ("install", "INSTALL httpfs"),
    ("load", "LOAD parquet"),
    ("set_external_access", "SET enable_external_access = true"),
    ("set_lock", "SET lock_configuration = false"),
    ("set_threads", "SET threads = 1"),
    ("set_variable", "SET VARIABLE x = (SELECT MAX(income) FROM persons)"),
    ("reset", "RESET lock_configuration"),
    ("pragma_table_info", "PRAGMA table_info('persons')"),
    ("pragma_database_list", "PRAGMA database_list"),
    ("call_pragma", "CALL pragma_table_info('persons')"),
    ("call_duckdb_tables", "CALL duckdb_tables()"),
    ("use", "USE sqlsdc"),
    ("checkpoint", "CHECKPOINT"),
    ("force_checkpoint", "FORCE CHECKPOINT"),
    ("vacuum", "VACUUM"),
    ("analyze", "ANALYZE persons"),
    ("describe", "DESCRIBE persons"),
    ("show_tables", "SHOW TABLES"),
    ("show_all_tables", "SHOW ALL TABLES"),
    ("summarize", "SUMMARIZE persons"),
    ("explain", "EXPLAIN SELECT * FROM persons"),
    ("explain_analyze", "EXPLAIN ANALYZE SELECT region, COUNT(*) FROM persons GROUP BY region"),
    ("begin", "BEGIN TRANSACTION"),
    ("commit", "COMMIT"),
    ("rollback", "ROLLBACK"),
    ("prepare", "PREPARE leak AS SELECT * FROM persons"),
    ("execute_prepared", "EXECUTE leak"),
    ("deallocate", "DEALLOCATE leak"),
    ("select_into", "SELECT * INTO stolen FROM persons"),
    ("from_first", "FROM persons"),
    ("values", "VALUES (1, 2)"),
    ("grant", "GRANT SELECT ON persons TO analyst"),
]

DDL_DML = [
    ("create_table_as", "CREATE TABLE stolen AS SELECT * FROM persons"),
    ("create_temp_table", "CREATE TEMP TABLE t AS SELECT income FROM persons"),
    ("create_view", "CREATE VIEW v AS SELECT * FROM persons"),
    (
        "create_or_replace_view",
        "CREATE OR REPLACE VIEW regions AS SELECT region, income AS name, "
        "person_id AS population FROM persons",
    ),
    ("create_macro_round", "CREATE MACRO round(a, b) AS a"),
    ("create_temp_macro_count", "CREATE TEMP MACRO count(x) AS 100"),
    ("create_macro_table", "CREATE MACRO m() AS TABLE SELECT * FROM persons"),
    ("create_function", "CREATE FUNCTION f(x) AS x + 1"),
    ("create_secret", "CREATE SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')"),
    ("create_persistent_secret", "CREATE PERSISTENT SECRET s (TYPE s3, KEY_ID 'a', SECRET 'b')"),
    ("create_schema", "CREATE SCHEMA evil"),
    ("create_sequence", "CREATE SEQUENCE s"),
    ("create_index", "CREATE INDEX i ON persons(income)"),
    ("create_type", "CREATE TYPE t AS ENUM ('a')"),
    ("drop_table", "DROP TABLE persons"),
    ("drop_schema", "DROP SCHEMA sqlsdc CASCADE"),
    ("drop_macro", "DROP MACRO round"),
    ("alter_table_add", "ALTER TABLE persons ADD COLUMN x INTEGER"),
    ("alter_table_rename", "ALTER TABLE persons RENAME TO persons_old"),
    ("alter_column_type", "ALTER TABLE persons ALTER income TYPE VARCHAR"),
    ("insert", "INSERT INTO persons (person_id) VALUES (99999999)"),
    ("insert_audit", "INSERT INTO sqlsdc.audit SELECT * FROM sqlsdc.audit"),
    ("update", "UPDATE persons SET income = 0"),
    ("update_policy", "UPDATE sqlsdc.policy_versions SET document = '{}'"),
    ("delete", "DELETE FROM persons"),
    ("delete_audit", "DELETE FROM sqlsdc.audit"),
    ("truncate", "TRUNCATE persons"),
    (
        "merge",
        "MERGE INTO persons USING regions ON persons.region = regions.region "
        "WHEN MATCHED THEN DELETE",
    ),
    ("comment_on", "COMMENT ON TABLE persons IS 'x'"),
]

MACRO_SHADOWING = [
    (
        "macro_then_select",
        "CREATE MACRO sum(x) AS 1; SELECT region, SUM(income) FROM persons GROUP BY region",
    ),
    ("temp_macro_coalesce", "CREATE TEMP MACRO coalesce(a, b) AS a"),
    ("or_replace_macro", "CREATE OR REPLACE MACRO lower(s) AS s"),
    ("macro_case", 'CREATE MACRO "COUNT"(x) AS 99'),
    ("schema_macro", "CREATE MACRO main.greatest(a, b) AS a"),
    ("call_user_function", "SELECT region, my_macro(income) FROM persons GROUP BY region"),
]

METADATA = [
    ("duckdb_tables", "SELECT * FROM duckdb_tables()"),
    ("duckdb_columns", "SELECT table_name, column_name FROM duckdb_columns()"),
    ("duckdb_settings", "SELECT * FROM duckdb_settings()"),
    ("duckdb_secrets", "SELECT * FROM duckdb_secrets()"),
    ("duckdb_functions", "SELECT function_name FROM duckdb_functions()"),
    ("duckdb_views", "SELECT sql FROM duckdb_views()"),
    ("duckdb_indexes", "SELECT * FROM duckdb_indexes()"),
    ("duckdb_databases", "SELECT * FROM duckdb_databases()"),
    ("duckdb_extensions", "SELECT * FROM duckdb_extensions()"),
    ("pragma_table_info_fn", "SELECT * FROM pragma_table_info('persons')"),
    ("pragma_storage_info", "SELECT * FROM pragma_storage_info('persons')"),
    ("current_setting", "SELECT current_setting('lock_configuration')"),
    (
        "current_setting_in_agg",
        "SELECT region, COUNT(*) FROM persons WHERE current_setting('threads') > 0 GROUP BY region",
    ),
    ("current_database", "SELECT current_database()"),
    ("current_schema", "SELECT current_schema()"),
    ("current_user", "SELECT current_user"),
    ("version", "SELECT version()"),
    ("getvariable", "SELECT getvariable('x')"),
    ("getenv", "SELECT getenv('HOME')"),
    ("information_schema_tables", "SELECT * FROM information_schema.tables"),
    ("information_schema_columns", "SELECT column_name FROM information_schema.columns"),
    ("pg_catalog_pg_class", "SELECT * FROM pg_catalog.pg_class"),
    ("pg_namespace", "SELECT * FROM pg_namespace"),
    ("sqlite_master", "SELECT * FROM sqlite_master"),
    ("duckdb_catalog_view", "SELECT * FROM duckdb_tables"),
    ("typeof_probe", "SELECT region, typeof(income) FROM persons GROUP BY region"),
    ("which_secret", "SELECT which_secret('s3://x', 's3')"),
]

INTERNAL_NAMES = [
    ("rowid", "SELECT rowid FROM persons"),
    ("rowid_group", "SELECT rowid, COUNT(*) FROM persons GROUP BY rowid"),
    ("rowid_where", "SELECT COUNT(*) FROM persons WHERE rowid = 5"),
    ("rkey_output", "SELECT __rkey FROM persons"),
    ("rkey_group", "SELECT __rkey, COUNT(*) FROM persons GROUP BY __rkey"),
    ("rkey_sum", "SELECT region, SUM(__rkey) FROM persons GROUP BY region"),
    ("rkey_where", "SELECT region, COUNT(*) FROM persons WHERE __rkey < 1000 GROUP BY region"),
    ("rkey_quoted", 'SELECT COUNT(*) FROM persons GROUP BY "__RKEY"'),
    (
        "rkey_in_cte",
        "WITH x AS (SELECT __rkey AS k, region FROM persons) "
        "SELECT region, COUNT(*) FROM x GROUP BY region",
    ),
    ("cells_alias", "SELECT region, COUNT(*) AS __cells FROM persons GROUP BY region"),
    ("status_alias", "SELECT region, COUNT(*) AS __sdc_status_0 FROM persons GROUP BY region"),
    ("unit_alias", "SELECT region, COUNT(*) AS __u0 FROM persons GROUP BY region"),
    ("reserved_cte", "WITH __cells AS (SELECT region FROM regions) SELECT * FROM __cells"),
    ("reserved_table_alias", "SELECT __t.region, COUNT(*) FROM persons __t GROUP BY __t.region"),
    ("regions_rkey", "SELECT __rkey FROM regions"),
]

CATALOG_SCHEMA = [
    ("secrets", "SELECT * FROM sqlsdc.secrets"),
    ("secrets_count", "SELECT COUNT(*) FROM sqlsdc.secrets"),
    ("ledger", "SELECT * FROM sqlsdc.ledger"),
    ("audit", "SELECT sql_text FROM sqlsdc.audit"),
    ("policy_versions", "SELECT document FROM sqlsdc.policy_versions"),
    ("meta", "SELECT * FROM sqlsdc.meta"),
    ("secrets_unqualified", "SELECT * FROM secrets"),
    ("audit_unqualified", "SELECT COUNT(*) FROM audit"),
    (
        "secrets_in_subquery",
        "SELECT region, COUNT(*) FROM persons WHERE region IN "
        "(SELECT name FROM sqlsdc.secrets) GROUP BY region",
    ),
    ("sequence_nextval", "SELECT nextval('sqlsdc.query_ids')"),
]

QUALIFIED_NAMES = [
    ("main_persons", "SELECT region, COUNT(*) FROM main.persons GROUP BY region"),
    ("catalog_main_persons", "SELECT region, COUNT(*) FROM demo.main.persons GROUP BY region"),
    ("memory_main", "SELECT COUNT(*) FROM memory.main.persons"),
    ("system_main", "SELECT * FROM system.main.duckdb_tables"),
    ("temp_main", "SELECT * FROM temp.main.t"),
    ("quoted_qualified", 'SELECT region, COUNT(*) FROM "demo"."main"."persons" GROUP BY region'),
    ("qualified_regions", "SELECT * FROM main.regions"),
    (
        "qualified_join",
        "SELECT p.region, COUNT(*) FROM persons p JOIN main.households h "
        "ON p.household_id = h.household_id GROUP BY p.region",
    ),
    (
        "qualified_in_cte",
        "WITH x AS (SELECT * FROM main.persons) SELECT region, COUNT(*) FROM x GROUP BY region",
    ),
    ("information_schema_qualified", "SELECT * FROM demo.information_schema.tables"),
]

DYNAMIC_SQL = [
    ("query", "SELECT * FROM query('SELECT * FROM persons')"),
    ("query_table", "SELECT * FROM query_table('persons')"),
    ("query_table_list", "SELECT * FROM query_table(['persons', 'households'])"),
    ("query_scalar", "SELECT query('SELECT 1')"),
    (
        "query_in_join",
        "SELECT r.region, COUNT(*) FROM regions r "
        "JOIN query_table('persons') p ON r.region = p.region GROUP BY r.region",
    ),
]

SAMPLING = [
    ("using_sample", "SELECT region, COUNT(*) FROM persons USING SAMPLE 5 GROUP BY region"),
    ("using_sample_rows", "SELECT * FROM persons USING SAMPLE 1 ROWS"),
    ("tablesample", "SELECT region, AVG(income) FROM persons TABLESAMPLE 1% GROUP BY region"),
    ("tablesample_reservoir", "SELECT COUNT(*) FROM persons TABLESAMPLE reservoir(3 ROWS)"),
    (
        "sample_in_derived",
        "SELECT SUM(income) FROM (SELECT income FROM persons USING SAMPLE 3 ROWS) t",
    ),
]

MULTI_STATEMENT_AND_COMMENTS = [
    ("select_then_drop", "SELECT 1; DROP TABLE persons"),
    (
        "agg_then_select_star",
        "SELECT region, COUNT(*) FROM persons GROUP BY region; SELECT * FROM persons",
    ),
    ("trailing_set", "SELECT 1; SET lock_configuration = false"),
    ("line_comment_hides_group", "SELECT region, income FROM persons -- GROUP BY region"),
    ("block_comment_hides_group", "SELECT income /* , COUNT(*) */ FROM persons"),
    ("comment_inside_keyword", "SELECT * FROM per/**/sons"),
    ("newline_comment_statement", "SELECT 1 --\n; DELETE FROM persons"),
    ("nested_block_comment", "/* /* */ SELECT * FROM persons */ SELECT income FROM persons"),
    ("semicolon_in_comment", "SELECT income FROM persons /* ; */"),
    ("empty_statement", "   "),
    ("only_comment", "-- nothing"),
]

QUOTING_AND_CASE = [
    ("upper_table", 'SELECT * FROM "PERSONS"'),
    ("mixed_case_column", 'SELECT "Persons"."INCOME" FROM persons "Persons"'),
    ("upper_income_group", 'SELECT "INCOME", COUNT(*) FROM persons GROUP BY "INCOME"'),
    ("upper_person_id", 'SELECT "PERSON_ID", COUNT(*) FROM "Persons" GROUP BY "PERSON_ID"'),
    ("cyrillic_table", "SELECT * FROM p\u0435rsons"),
    ("cyrillic_column", "SELECT \u0456ncome FROM persons"),
    ("fullwidth_table", "SELECT COUNT(*) FROM \uff50ersons"),
    ("zero_width_space", 'SELECT COUNT(*) FROM "persons\u200b"'),
    ("trailing_space_name", 'SELECT * FROM "persons "'),
    ("backtick_quoting", "SELECT `income` FROM `persons`"),
    ("bracket_quoting", "SELECT [income] FROM [persons]"),
]

CTE_SHADOWING = [
    (
        "cte_named_persons",
        "WITH persons AS (SELECT * FROM regions) "
        "SELECT region, COUNT(*) FROM persons GROUP BY region",
    ),
    ("cte_upper_persons", 'WITH "PERSONS" AS (SELECT 1 AS x) SELECT * FROM "PERSONS"'),
    (
        "cte_named_regions",
        "WITH regions AS (SELECT region, income AS name FROM persons) SELECT * FROM regions",
    ),
    (
        "nested_cte_shadow",
        "WITH a AS (WITH households AS (SELECT * FROM persons) "
        "SELECT * FROM households) SELECT region, COUNT(*) FROM a "
        "GROUP BY region",
    ),
    (
        "recursive_cte",
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r "
        "WHERE n < 10) SELECT * FROM r",
    ),
    ("materialized_cte", "WITH x AS MATERIALIZED (SELECT income FROM persons) SELECT * FROM x"),
]

ROW_LEVEL_OUTPUT = [
    ("select_star", "SELECT * FROM persons"),
    ("select_income", "SELECT income FROM persons"),
    ("select_region_income", "SELECT region, income FROM persons"),
    ("select_distinct_income", "SELECT DISTINCT income FROM persons"),
    # DISTINCT of dimensions is answered as their GROUP BY (tests/test_bi_patterns.py); a
    # measure is no group key
    ("select_distinct_target_income", f"SELECT DISTINCT age, income FROM persons WHERE {TARGET}"),
    ("distinct_on", "SELECT DISTINCT ON (region) region, income FROM persons"),
    ("limit_one", "SELECT income FROM persons LIMIT 1"),
    ("where_target", f"SELECT income FROM persons WHERE {TARGET}"),
    (
        "order_limit_subquery",
        "SELECT COUNT(*) FROM (SELECT income FROM persons ORDER BY income DESC LIMIT 1) t",
    ),
    (
        "offset_subquery",
        "SELECT SUM(income) FROM (SELECT income FROM persons ORDER BY income LIMIT 1 OFFSET 5) t",
    ),
    ("row_number", "SELECT region, ROW_NUMBER() OVER (ORDER BY income) FROM persons"),
    (
        "row_number_in_derived",
        "SELECT region, SUM(r) FROM (SELECT region, ROW_NUMBER() OVER "
        "(ORDER BY income) AS r FROM persons) t GROUP BY region",
    ),
    (
        "lag_income",
        "SELECT region, COUNT(*) FROM (SELECT region, LAG(income) OVER "
        "(ORDER BY income) AS prev FROM persons) t GROUP BY region",
    ),
    ("sum_over_window", "SELECT SUM(income) OVER (PARTITION BY region) FROM persons"),
    (
        "sum_over_in_agg",
        "SELECT region, SUM(income) OVER (PARTITION BY region) FROM persons GROUP BY region",
    ),
    ("rank_income", "SELECT RANK() OVER (ORDER BY income) FROM persons"),
    (
        "qualify",
        "SELECT region FROM persons QUALIFY ROW_NUMBER() OVER "
        "(PARTITION BY region ORDER BY income DESC) = 1",
    ),
    (
        "qualify_in_agg",
        "SELECT region, COUNT(*) FROM persons GROUP BY region QUALIFY SUM(income) > 0",
    ),
    ("first_value_window", "SELECT FIRST_VALUE(income) OVER (ORDER BY income DESC) FROM persons"),
    ("rows_of_households", "SELECT size, tenure FROM households"),
    ("rows_of_enterprises", "SELECT nace, turnover FROM enterprises WHERE size_class = 'large'"),
    (
        "join_rows",
        "SELECT p.income, h.size FROM persons p JOIN households h "
        "ON p.household_id = h.household_id",
    ),
    ("exists_rows", f"SELECT * FROM regions WHERE EXISTS (SELECT 1 FROM persons WHERE {TARGET})"),
    (
        "lateral",
        "SELECT r.region, x.income FROM regions r, LATERAL (SELECT income FROM "
        "persons p WHERE p.region = r.region LIMIT 1) x",
    ),
    (
        "cross_join_lateral_agg",
        "SELECT r.region, x.s FROM regions r CROSS JOIN LATERAL "
        "(SELECT SUM(income) AS s FROM persons p "
        "WHERE p.region = r.region) x",
    ),
    ("array_agg_rows", "SELECT region, ARRAY_AGG(income) FROM persons GROUP BY region"),
]

UNPROTECTED_AGGREGATES = [
    ("min_income", "SELECT region, MIN(income) FROM persons GROUP BY region"),
    ("max_income", "SELECT MAX(income) FROM persons"),
    ("max_turnover", "SELECT nace, MAX(turnover) FROM enterprises GROUP BY nace"),
    ("first", "SELECT region, FIRST(income) FROM persons GROUP BY region"),
    ("last", "SELECT region, LAST(income) FROM persons GROUP BY region"),
    ("any_value", "SELECT region, ANY_VALUE(income) FROM persons GROUP BY region"),
    ("arg_max", "SELECT region, ARG_MAX(age, income) FROM persons GROUP BY region"),
    ("arg_min", "SELECT region, ARG_MIN(income, age) FROM persons GROUP BY region"),
    ("list", "SELECT region, LIST(income) FROM persons GROUP BY region"),
    ("string_agg", "SELECT region, STRING_AGG(occupation, ',') FROM persons GROUP BY region"),
    ("median", "SELECT region, MEDIAN(income) FROM persons GROUP BY region"),
    ("quantile_cont", "SELECT region, QUANTILE_CONT(income, 0.99) FROM persons GROUP BY region"),
    ("quantile_disc", "SELECT QUANTILE_DISC(income, 1.0) FROM persons"),
    ("mode", "SELECT region, MODE(income) FROM persons GROUP BY region"),
    ("approx_quantile", "SELECT APPROX_QUANTILE(income, 0.999) FROM persons"),
    ("approx_count_distinct", "SELECT APPROX_COUNT_DISTINCT(income) FROM persons"),
    ("stddev", "SELECT region, STDDEV(income) FROM persons GROUP BY region"),
    ("variance", "SELECT VARIANCE(turnover) FROM enterprises"),
    ("bit_or", "SELECT BIT_OR(age) FROM persons"),
    ("histogram", "SELECT HISTOGRAM(income) FROM persons"),
    (
        "max_in_derived",
        "SELECT m FROM (SELECT region, MAX(income) AS m FROM persons GROUP BY region) t",
    ),
    ("max_over_window", "SELECT region, MAX(income) OVER () FROM persons GROUP BY region"),
    ("count_distinct_income", "SELECT region, COUNT(DISTINCT income) FROM persons GROUP BY region"),
    ("sum_distinct_income", "SELECT region, SUM(DISTINCT income) FROM persons GROUP BY region"),
    (
        "avg_filter",
        "SELECT region, AVG(income) FILTER (WHERE age > 90) FROM persons GROUP BY region",
    ),
    ("product", "SELECT region, PRODUCT(income) FROM persons GROUP BY region"),
    ("kurtosis", "SELECT region, KURTOSIS(income) FROM persons GROUP BY region"),
]

IDENTIFIERS = [
    ("output_person_id", "SELECT person_id, COUNT(*) FROM persons GROUP BY person_id"),
    ("group_household_id", "SELECT household_id, SUM(income) FROM persons GROUP BY household_id"),
    (
        "group_enterprise_id",
        "SELECT enterprise_id, SUM(turnover) FROM enterprises GROUP BY enterprise_id",
    ),
    ("group_holding_id", "SELECT holding_id, SUM(turnover) FROM enterprises GROUP BY holding_id"),
    ("group_id_mod", "SELECT person_id % 10, COUNT(*) FROM persons GROUP BY person_id % 10"),
    (
        "group_id_cast",
        "SELECT CAST(person_id AS VARCHAR), COUNT(*) FROM persons "
        "GROUP BY CAST(person_id AS VARCHAR)",
    ),
    (
        "group_id_substring",
        "SELECT region, COUNT(*) FROM persons "
        "GROUP BY region, SUBSTRING(CAST(person_id AS VARCHAR), 1, 2)",
    ),
    (
        "where_person_id",
        "SELECT region, SUM(income) FROM persons WHERE person_id = 1 GROUP BY region",
    ),
    (
        "where_id_range",
        "SELECT COUNT(*), SUM(income) FROM persons WHERE person_id BETWEEN 1 AND 10",
    ),
    (
        "where_id_in",
        "SELECT SUM(income) FROM persons WHERE person_id IN (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)",
    ),
    ("where_id_expression", "SELECT SUM(income) FROM persons WHERE CAST(person_id AS DOUBLE) < 12"),
    ("where_holding", "SELECT SUM(turnover) FROM enterprises WHERE holding_id = 1000008"),
    (
        "having_identifier",
        "SELECT region, COUNT(*) FROM persons GROUP BY region HAVING MAX(person_id) > 5",
    ),
    (
        "order_by_identifier",
        "SELECT region, COUNT(*) FROM persons GROUP BY region ORDER BY person_id",
    ),
    ("sum_identifier", "SELECT region, SUM(person_id) FROM persons GROUP BY region"),
    ("avg_identifier", "SELECT region, AVG(household_id) FROM persons GROUP BY region"),
    (
        "count_distinct_id_mod",
        "SELECT region, COUNT(DISTINCT person_id % 2) FROM persons GROUP BY region",
    ),
    (
        "count_distinct_holding",
        "SELECT nace, COUNT(DISTINCT holding_id) FROM enterprises GROUP BY nace",
    ),
    (
        "sum_identifier_in_case",
        "SELECT region, SUM(CASE WHEN person_id = 1 THEN income "
        "ELSE 0 END) FROM persons GROUP BY region",
    ),
    (
        "id_through_cte",
        "WITH x AS (SELECT person_id AS region FROM persons) "
        "SELECT region, COUNT(*) FROM x GROUP BY region",
    ),
    (
        "id_through_derived_rename",
        "SELECT r, COUNT(*) FROM (SELECT person_id AS r FROM persons) t GROUP BY r",
    ),
    (
        "id_expression_in_derived",
        "SELECT region, COUNT(*) FROM (SELECT region, "
        "person_id + 0 AS p FROM persons) t GROUP BY region",
    ),
    (
        "id_output_from_join",
        "SELECT h.household_id, COUNT(*) FROM persons p JOIN households h "
        "ON p.household_id = h.household_id GROUP BY h.household_id",
    ),
    (
        "where_alias_of_id",
        "SELECT region, COUNT(*) FROM (SELECT person_id AS pid, region "
        "FROM persons WHERE pid = 5) t GROUP BY region",
    ),
    (
        "id_in_window_order",
        "SELECT region, COUNT(*), ROW_NUMBER() OVER (ORDER BY person_id) "
        "FROM persons GROUP BY region",
    ),
]

MEASURES_GROUPED = [
    ("group_income", "SELECT income, COUNT(*) FROM persons GROUP BY income"),
    ("group_turnover", "SELECT turnover, COUNT(*) FROM enterprises GROUP BY turnover"),
    ("group_weight", "SELECT weight, COUNT(*) FROM persons GROUP BY weight"),
    ("group_employees", "SELECT employees, COUNT(*) FROM enterprises GROUP BY employees"),
    (
        "group_income_round",
        "SELECT ROUND(income, -3), COUNT(*) FROM persons GROUP BY ROUND(income, -3)",
    ),
    (
        "group_income_case",
        "SELECT CASE WHEN income > 100000 THEN 'rich' ELSE 'other' END AS c, "
        "COUNT(*) FROM persons GROUP BY 1",
    ),
    ("group_by_ordinal_measure", "SELECT income, COUNT(*) FROM persons GROUP BY 1"),
    ("group_by_all_measure", "SELECT turnover, COUNT(*) FROM enterprises GROUP BY ALL"),
    (
        "group_measure_via_derived",
        "SELECT b, COUNT(*) FROM (SELECT FLOOR(income / 1000) AS b FROM persons) t GROUP BY b",
    ),
    (
        "group_measure_via_cte",
        "WITH t AS (SELECT region AS r, income AS x FROM persons) "
        "SELECT x, COUNT(*) FROM t GROUP BY x",
    ),
    (
        "group_measure_rollup",
        "SELECT region, income, COUNT(*) FROM persons GROUP BY ROLLUP(region, income)",
    ),
    (
        "group_measure_grouping_sets",
        "SELECT region, turnover, COUNT(*) FROM enterprises "
        "GROUP BY GROUPING SETS ((region), (turnover))",
    ),
    ("measure_output_unaggregated", "SELECT region, income FROM persons GROUP BY region, income"),
    (
        "measure_in_having",
        "SELECT region, COUNT(*) FROM persons GROUP BY region HAVING income > 10",
    ),
    ("measure_order_by", "SELECT region, COUNT(*) FROM persons GROUP BY region ORDER BY income"),
    ("sum_text_dimension", "SELECT region, SUM(municipality) FROM persons GROUP BY region"),
    ("avg_text_dimension", "SELECT region, AVG(education) FROM persons GROUP BY region"),
    ("sum_boolean", "SELECT region, SUM(CAST(age > 90 AS DOUBLE)) FROM persons GROUP BY region"),
]

ERROR_SIDE_CHANNELS = [
    (
        "int_overflow",
        "SELECT region, COUNT(*) FROM persons WHERE age * 1000000000 > 0 GROUP BY region",
    ),
    (
        "int_overflow_in_sum",
        "SELECT region, SUM(income + age * 1000000000) FROM persons GROUP BY region",
    ),
    ("intdiv_zero", "SELECT region, COUNT(*) FROM persons WHERE age // 0 > 1 GROUP BY region"),
    ("intdiv_column", "SELECT region, COUNT(*) FROM persons WHERE 100 // age > 1 GROUP BY region"),
    ("mod_zero", "SELECT region, COUNT(*) FROM persons WHERE age % 0 = 1 GROUP BY region"),
    ("mod_column", "SELECT region, COUNT(*) FROM persons WHERE 100 % age = 1 GROUP BY region"),
    (
        "cast_text_to_int",
        "SELECT region, COUNT(*) FROM persons WHERE CAST(education AS INTEGER) > 0 GROUP BY region",
    ),
    ("implicit_cast", "SELECT region, COUNT(*) FROM persons WHERE education = 5 GROUP BY region"),
    (
        "text_vs_number",
        "SELECT region, COUNT(*) FROM persons WHERE occupation > age GROUP BY region",
    ),
    (
        "case_cast_error",
        "SELECT region, COUNT(*) FROM persons WHERE CASE WHEN income > 1e6 "
        "THEN CAST('x' AS INT) ELSE 0 END = 0 GROUP BY region",
    ),
    (
        "case_cast_column_error",
        f"SELECT COUNT(*) FROM persons WHERE CASE WHEN {TARGET} "
        "THEN CAST(occupation AS INT) ELSE 0 END = 0",
    ),
    (
        "error_function",
        "SELECT region, COUNT(*) FROM persons WHERE CASE WHEN income > 1e6 "
        "THEN error('boom') END IS NULL GROUP BY region",
    ),
    ("raise_function", "SELECT COUNT(*) FROM persons WHERE raise_error('x') IS NULL"),
    ("negate_int", "SELECT region, COUNT(*) FROM persons WHERE -age < 0 GROUP BY region"),
    ("abs_int", "SELECT region, COUNT(*) FROM persons WHERE ABS(age) > 0 GROUP BY region"),
    (
        "cast_double_to_int",
        "SELECT region, COUNT(*) FROM persons "
        "WHERE CAST(income * 1e20 AS INTEGER) > 0 GROUP BY region",
    ),
    (
        "cast_to_decimal",
        "SELECT region, SUM(CAST(income AS DECIMAL(4, 0))) FROM persons GROUP BY region",
    ),
    (
        "cast_to_date",
        "SELECT region, COUNT(*) FROM persons "
        "WHERE CAST(occupation AS DATE) IS NULL GROUP BY region",
    ),
    (
        "coalesce_mixed",
        "SELECT region, COUNT(*) FROM persons "
        "WHERE COALESCE(education, age) IS NULL GROUP BY region",
    ),
    (
        "in_mixed_types",
        "SELECT region, COUNT(*) FROM persons WHERE occupation IN (1, 2) GROUP BY region",
    ),
    (
        "between_mixed",
        "SELECT region, COUNT(*) FROM persons WHERE education BETWEEN 1 AND 3 GROUP BY region",
    ),
    ("like_on_number", "SELECT region, COUNT(*) FROM persons WHERE age LIKE '4%' GROUP BY region"),
    (
        "case_mixed_branches",
        "SELECT region, COUNT(*) FROM persons WHERE CASE WHEN income > 1 "
        "THEN age ELSE education END IS NULL GROUP BY region",
    ),
    (
        "const_overflow",
        "SELECT region, COUNT(*) FROM persons WHERE CASE WHEN income > 1e6 "
        "THEN 9223372036854775807 + 1 END IS NULL GROUP BY region",
    ),
    # Pass the totality check but fail in DuckDB for some rows only: each one is an oracle on
    # whether the target's income exceeds 40,000 (it does; with 60,000 the same query runs).
    (
        "substring_offset_range",
        "SELECT region, COUNT(*) FROM persons WHERE "
        f"SUBSTRING(education, CASE WHEN {TARGET} AND income > 40000 "
        "THEN 9223372036854775807 ELSE 1 END) = 'x' GROUP BY region",
    ),
    (
        "substring_length_range",
        "SELECT region, COUNT(*) FROM persons WHERE "
        f"SUBSTRING(education, 1, CASE WHEN {TARGET} AND income > 40000 "
        "THEN 4294967296 ELSE 1 END) = 'x' GROUP BY region",
    ),
    (
        "cast_double_to_float",
        "SELECT region, COUNT(*) FROM persons "
        "WHERE CAST(income * 1e33 AS FLOAT) > 0 GROUP BY region",
    ),
    (
        "cast_float_target",
        f"SELECT COUNT(*) FROM persons WHERE CAST(CASE WHEN {TARGET} "
        "THEN income * 1e34 ELSE 0 END AS FLOAT) > 0",
    ),
    (
        "decimal_literal_overflow",
        f"SELECT COUNT(*) FROM persons WHERE CASE WHEN {TARGET} "
        "AND income > 40000 THEN age ELSE 0 END "
        "* 9999999999999999999999999999999999999.9 > 0",
    ),
    (
        "decimal_sum_overflow",
        "SELECT nace, SUM(employees * "
        "9999999999999999999999999999999999.9) FROM enterprises "
        "GROUP BY nace",
    ),
    (
        "string_literal_cast_lazy",
        f"SELECT region, COUNT(*) FROM persons WHERE CASE WHEN "
        f"{TARGET} AND income > 40000 THEN age = 'x' ELSE false END "
        "GROUP BY region",
    ),
    (
        "string_literal_vs_measure",
        f"SELECT COUNT(*) FROM persons WHERE CASE WHEN {TARGET} "
        "AND income > 40000 THEN income = 'x' ELSE false END",
    ),
]

SUBQUERIES = [
    (
        "correlated_scalar",
        "SELECT region, (SELECT SUM(income) FROM persons p2 "
        "WHERE p2.region = r.region) FROM regions r",
    ),
    (
        "correlated_exists",
        "SELECT COUNT(*) FROM regions r WHERE EXISTS "
        "(SELECT 1 FROM persons p WHERE p.region = r.region "
        "AND p.income > 1000000)",
    ),
    (
        "correlated_in_where",
        "SELECT region, COUNT(*) FROM persons p WHERE income > "
        "(SELECT AVG(income) FROM persons q WHERE q.region = p.region) "
        "GROUP BY region",
    ),
    (
        "in_subquery_rows",
        "SELECT region, COUNT(*) FROM persons WHERE household_id IN "
        "(SELECT household_id FROM persons WHERE income > 1000000) "
        "GROUP BY region",
    ),
    (
        "in_subquery_regions",
        "SELECT * FROM regions WHERE region IN (SELECT region FROM persons WHERE income > 1200000)",
    ),
    (
        "exists_target",
        "SELECT COUNT(*) FROM regions WHERE EXISTS "
        f"(SELECT 1 FROM persons WHERE {TARGET} AND income > 40000)",
    ),
    (
        "not_exists",
        "SELECT * FROM regions WHERE NOT EXISTS "
        "(SELECT income FROM persons WHERE income > 1200000)",
    ),
    ("scalar_raw_value", "SELECT (SELECT income FROM persons LIMIT 1)"),
    (
        "scalar_in_where",
        f"SELECT * FROM regions WHERE population > (SELECT income FROM persons WHERE {TARGET})",
    ),
    ("any_subquery", "SELECT * FROM regions WHERE population < ANY (SELECT income FROM persons)"),
    (
        "subquery_in_group",
        "SELECT COUNT(*) FROM persons GROUP BY (SELECT income FROM persons LIMIT 1)",
    ),
    ("subquery_in_limit", f"SELECT * FROM regions LIMIT (SELECT age FROM persons WHERE {TARGET})"),
]

SET_OPERATIONS = [
    ("union_rows", "SELECT region FROM regions UNION SELECT income::VARCHAR FROM persons"),
    ("union_all_rows", "SELECT income FROM persons UNION ALL SELECT income FROM persons"),
    (
        "union_in_derived",
        "SELECT COUNT(*) FROM (SELECT income FROM persons "
        "UNION SELECT turnover FROM enterprises) t",
    ),
    (
        "intersect_rows",
        "SELECT region FROM regions INTERSECT SELECT region FROM persons WHERE income > 1200000",
    ),
    (
        "except_rows",
        "SELECT region FROM regions EXCEPT SELECT region FROM persons "
        f"WHERE {TARGET} AND income > 40000",
    ),
    (
        "union_by_name",
        "SELECT region, COUNT(*) AS n FROM persons GROUP BY region "
        "UNION BY NAME SELECT region, COUNT(*) AS n FROM persons GROUP BY region",
    ),
    (
        "union_agg_and_rows",
        "SELECT region, COUNT(*) FROM persons GROUP BY region "
        "UNION ALL SELECT region, age FROM persons",
    ),
]

JOINS = [
    (
        "person_id_eq_household_id",
        "SELECT p.region, COUNT(*) FROM persons p JOIN households h "
        "ON p.person_id = h.household_id GROUP BY p.region",
    ),
    (
        "enterprise_eq_holding",
        "SELECT a.nace, COUNT(*) FROM enterprises a JOIN enterprises b "
        "ON a.enterprise_id = b.holding_id GROUP BY a.nace",
    ),
    (
        "person_eq_enterprise",
        "SELECT e.nace, SUM(p.income) FROM persons p JOIN enterprises e "
        "ON p.person_id = e.enterprise_id GROUP BY e.nace",
    ),
    (
        "join_on_id_expression",
        "SELECT p.region, COUNT(*) FROM persons p JOIN households h "
        "ON p.household_id = h.household_id + 1 GROUP BY p.region",
    ),
    (
        "join_on_id_or",
        "SELECT p.region, COUNT(*) FROM persons p JOIN households h "
        "ON p.household_id = h.household_id OR p.age > 90 GROUP BY p.region",
    ),
    (
        "join_key_and_id_literal",
        "SELECT p.region, COUNT(*) FROM persons p JOIN households h "
        "ON p.household_id = h.household_id AND h.household_id = 1 "
        "GROUP BY p.region",
    ),
    (
        "join_id_inequality",
        "SELECT p.region, COUNT(*) FROM persons p JOIN households h "
        "ON p.household_id < h.household_id GROUP BY p.region",
    ),
    (
        "join_using",
        "SELECT region, COUNT(*) FROM persons JOIN households USING (household_id) GROUP BY region",
    ),
    (
        "asof_join",
        "SELECT p.region, COUNT(*) FROM persons p ASOF JOIN households h "
        "ON p.household_id >= h.household_id GROUP BY p.region",
    ),
    # Pairs rows by storage position: row order (= person_id order) becomes a filter.
    (
        "positional_join",
        "SELECT COUNT(*), SUM(p.income) FROM persons p POSITIONAL JOIN "
        "households h WHERE h.region IS NOT NULL",
    ),
    (
        "semi_join",
        "SELECT * FROM regions r SEMI JOIN persons p ON r.region = p.region AND p.income > 1200000",
    ),
    (
        "anti_join",
        "SELECT * FROM regions r ANTI JOIN persons p ON r.region = p.region AND p.income > 1200000",
    ),
]

EXPRESSION_TRICKS = [
    (
        "struct_pack",
        "SELECT region, COUNT(*) FROM persons GROUP BY region, struct_pack(a := income)",
    ),
    ("row_struct", "SELECT region, COUNT(ROW(person_id, income)) FROM persons GROUP BY region"),
    ("struct_literal", "SELECT {'a': income} FROM persons"),
    ("list_literal", "SELECT [income, age] FROM persons"),
    ("list_value", "SELECT region, COUNT(*) FROM persons GROUP BY region, list_value(income)"),
    ("list_extract", "SELECT region, SUM([income][1]) FROM persons GROUP BY region"),
    (
        "lambda",
        "SELECT region, SUM(list_sum(list_transform([income], x -> x * 2))) "
        "FROM persons GROUP BY region",
    ),
    (
        "json_object",
        "SELECT region, COUNT(*) FROM persons GROUP BY region, json_object('i', income)",
    ),
    ("to_json", "SELECT to_json(p) FROM persons p"),
    ("table_as_struct", "SELECT region, COUNT(DISTINCT p) FROM persons p GROUP BY region"),
    (
        "regexp_matches",
        "SELECT region, COUNT(*) FROM persons "
        "WHERE regexp_matches(occupation, '(a+)+$') GROUP BY region",
    ),
    (
        "regexp_extract",
        "SELECT regexp_extract(occupation, '.*') AS o, COUNT(*) FROM persons GROUP BY o",
    ),
    ("hash", "SELECT hash(person_id) % 10 AS h, COUNT(*) FROM persons GROUP BY h"),
    ("md5", "SELECT md5(CAST(income AS VARCHAR)) AS h, COUNT(*) FROM persons GROUP BY h"),
    ("random", "SELECT region, SUM(income) FROM persons WHERE random() < 0.001 GROUP BY region"),
    ("setseed", "SELECT setseed(0.5)"),
    ("unnest", "SELECT unnest([1, 2, 3])"),
    ("columns_star", "SELECT COLUMNS('.*') FROM persons"),
    ("star_exclude", "SELECT * EXCLUDE (income) FROM persons"),
    ("star_replace", "SELECT * REPLACE (income * 2 AS income) FROM persons"),
    ("unknown_function", "SELECT region, totally_unknown(income) FROM persons GROUP BY region"),
    (
        "system_qualified_function",
        "SELECT region, system.main.max(income) FROM persons GROUP BY region",
    ),
    ("format", "SELECT format('{}', income) FROM persons"),
    (
        "try_wrapper",
        "SELECT region, COUNT(*) FROM persons WHERE TRY(age // 0) IS NULL GROUP BY region",
    ),
    (
        "collate",
        "SELECT region, COUNT(*) FROM persons GROUP BY region "
        "ORDER BY region COLLATE nocase, income",
    ),
]

TABLE_FUNCTIONS_AND_VALUES = [
    ("range", "SELECT * FROM range(10)"),
    ("generate_series", "SELECT * FROM generate_series(1, 10)"),
    (
        "range_join",
        "SELECT r.range, COUNT(*) FROM persons p JOIN range(100) r "
        "ON p.age = r.range GROUP BY r.range",
    ),
    ("unnest_table", "SELECT * FROM unnest([1, 2, 3])"),
    ("values_table", "SELECT * FROM (VALUES (1), (2)) t(x)"),
    (
        "values_join",
        "SELECT v.x, COUNT(*) FROM persons p JOIN (VALUES ('R01')) v(x) "
        "ON p.region = v.x GROUP BY v.x",
    ),
    ("pivot", "PIVOT persons ON region USING SUM(income)"),
    (
        "pivot_in_select",
        "SELECT * FROM (PIVOT persons ON sex USING SUM(income) GROUP BY municipality)",
    ),
    ("unpivot", "UNPIVOT enterprises ON employees, turnover INTO NAME k VALUE v"),
    ("unpivot_in_select", "SELECT * FROM (UNPIVOT households ON size INTO NAME k VALUE v)"),
    ("test_all_types", "SELECT * FROM test_all_types()"),
    ("repeat_row", "SELECT * FROM repeat_row(1, num_rows := 3)"),
]

# Cells with fewer than 10 units are NULL, but their group rows are still returned: the
# presence of a group key is an unprotected one-bit answer about the people behind it (here:
# does the target earn more than 40,000? With 60,000 the group disappears).
# Aggregates whose arguments make every row a "contributor" while only one row matters, and
# arithmetic on protected cells that recovers what suppression or refusals hide.
THRESHOLD_BYPASS = [
    ("sum_case_else_zero", f"SELECT SUM(CASE WHEN {TARGET} THEN income ELSE 0 END) FROM persons"),
    (
        "avg_case_else_zero",
        f"SELECT AVG(CASE WHEN {TARGET} THEN income ELSE 0 END) * COUNT(*) FROM persons",
    ),
    (
        "sum_coalesce_zero",
        f"SELECT region, SUM(COALESCE(CASE WHEN {TARGET} THEN income END, "
        "0)) FROM persons GROUP BY region",
    ),
    (
        "sum_boolean_times_measure",
        "SELECT SUM(income * CAST(municipality = 'R08-M018' AND "
        "sex = 'F' AND age = 43 AND occupation = 'craft_trades' "
        "AS DOUBLE)) FROM persons",
    ),
    ("sum_weight_case", f"SELECT SUM(weight * CASE WHEN {TARGET} THEN 1 ELSE 0 END) FROM persons"),
    (
        "count_via_sum",
        f"SELECT SUM(CASE WHEN {TARGET} THEN 1 ELSE 0 END + income * 0) FROM persons",
    ),
    (
        "max_via_power_mean",
        "SELECT region, POW(SUM(POW(income / 1000000.0, 200.0)), "
        "1.0 / 200) * 1000000 FROM persons GROUP BY region",
    ),
    (
        "max_turnover_via_power_mean",
        "SELECT nace, POW(SUM(POW(turnover / 100000000000.0, "
        "100.0)), 0.01) * 100000000000 FROM enterprises "
        "GROUP BY nace",
    ),
]

# What BI tools send, read as what it means (s41g): SELECT DISTINCT as the GROUP BY of its
# outputs, x = ANY(list) as x IN (list); each is then refused as the form it is read as.
BI_FORMS = [
    ("distinct_with_identifier", "SELECT DISTINCT region, person_id FROM persons"),
    ("distinct_ordered_by_measure", "SELECT DISTINCT region FROM persons ORDER BY income"),
    (
        "distinct_with_window",
        "SELECT DISTINCT region, ROW_NUMBER() OVER (ORDER BY income) FROM persons",
    ),
    ("distinct_of_weight", f"SELECT DISTINCT weight FROM persons WHERE {TARGET}"),
    (
        "distinct_in_subquery",
        "SELECT COUNT(*) FROM (SELECT DISTINCT income FROM persons WHERE region = 'R01') t",
    ),
    (
        "any_array_off_break",
        f"SELECT COUNT(*) FROM persons WHERE {TARGET} AND income = ANY(ARRAY[49455.39])",
    ),
    ("any_array_identifier", "SELECT COUNT(*) FROM persons WHERE person_id = ANY(ARRAY[1, 2])"),
    ("any_array_of_column", "SELECT COUNT(*) FROM persons WHERE region = ANY(ARRAY[sex, 'R01'])"),
    ("any_array_mixed_types", "SELECT COUNT(*) FROM persons WHERE region = ANY(['R01', 1])"),
]

CATEGORIES = {
    "file": FILE_READERS,
    "statement": STATEMENTS,
    "ddl_dml": DDL_DML,
    "macro": MACRO_SHADOWING,
    "metadata": METADATA,
    "internal": INTERNAL_NAMES,
    "catalog": CATALOG_SCHEMA,
    "qualified": QUALIFIED_NAMES,
    "dynamic": DYNAMIC_SQL,
    "sampling": SAMPLING,
    "multi": MULTI_STATEMENT_AND_COMMENTS,
    "quoting": QUOTING_AND_CASE,
    "cte": CTE_SHADOWING,
    "rows": ROW_LEVEL_OUTPUT,
    "unprotected_agg": UNPROTECTED_AGGREGATES,
    "identifier": IDENTIFIERS,
    "measure_grouped": MEASURES_GROUPED,
    "error_channel": ERROR_SIDE_CHANNELS,
    "subquery": SUBQUERIES,
    "set_op": SET_OPERATIONS,
    "join": JOINS,
    "expression": EXPRESSION_TRICKS,
    "table_fn": TABLE_FUNCTIONS_AND_VALUES,
    "threshold_bypass": THRESHOLD_BYPASS,
    "bi_forms": BI_FORMS,
}

# Known limits of the threshold baseline, kept as strict xfails so that the suite says so and
# notices when a mechanism closes them: a root-level table shows the keys of suppressed cells
# (like a published table marks them), and cells can be differenced (no secondary suppression,
# no perturbation yet). Both are documented in the README ("Threat model and limits").
# The two that selected one person through a condition on a measure are closed by class breaks.
CLOSED_LIMITS = [
    (
        "suppressed_row_presence",
        "SELECT sex, COUNT(*) FROM persons WHERE municipality = "
        "'R08-M018' AND age = 43 AND occupation = 'craft_trades' "
        "AND income > 40000 GROUP BY sex",
    ),
    (
        "keys_with_sum",
        "SELECT municipality, sex, age, occupation, SUM(income) FROM persons "
        "WHERE income BETWEEN 49455 AND 49456 GROUP BY ALL",
    ),
]
"""Former limits of the threshold baseline, closed by class breaks on measure conditions."""

KNOWN_LIMITS = [
    (
        "having_suppressed",
        "SELECT sex, COUNT(*) FROM persons WHERE municipality = 'R08-M018' "
        "AND age = 43 GROUP BY sex HAVING COUNT(*) IS NULL",
    ),
    (
        "difference_of_cells",
        "SELECT SUM(income) - SUM(CASE WHEN NOT (municipality = "
        "'R08-M018' AND sex = 'F' AND age = 43 AND occupation = "
        "'craft_trades') THEN income END) FROM persons",
    ),
    (
        "difference_of_scalar_subqueries",
        "SELECT (SELECT SUM(income) FROM persons) - (SELECT SUM(income) FROM persons "
        f"WHERE NOT ({TARGET}))",
    ),
    (
        "avg_times_count_difference",
        "SELECT AVG(income) * COUNT(income) - SUM(CASE WHEN NOT "
        f"({TARGET}) THEN income END) FROM persons",
    ),
    # Margin minus published cells recovers the suppressed cell (no secondary suppression).
    (
        "rollup_complement",
        "SELECT sex, COUNT(*), SUM(income) FROM persons WHERE municipality = "
        "'R01-M022' AND occupation = 'clerks' GROUP BY ROLLUP(sex)",
    ),
]

CORPUS = [
    pytest.param(sql, id=f"{category}-{label}")
    for category, statements in CATEGORIES.items()
    for label, sql in statements
]


@pytest.fixture
def analyst(module_analyst):
    """The corpus shares one connection: every statement is refused before it runs."""
    return module_analyst


def test_corpus_is_large_and_distinct():
    statements = [p.values[0] for p in CORPUS]
    assert len(statements) >= 130
    assert len(set(statements)) == len(statements)
    assert len({p.id for p in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("sql", CORPUS)
def test_hostile_statement_is_refused(analyst, sql):
    with pytest.raises(sqlsdc.PolicyViolation):
        analyst.execute(sql)


@pytest.mark.parametrize("sql", [pytest.param(sql, id=label) for label, sql in CLOSED_LIMITS])
def test_former_limit_is_refused(analyst, sql):
    with pytest.raises(sqlsdc.PolicyViolation, match="class breaks"):
        analyst.execute(sql)


@pytest.mark.xfail(strict=True, reason="threshold baseline: key disclosure and differencing")
@pytest.mark.parametrize("sql", [pytest.param(sql, id=label) for label, sql in KNOWN_LIMITS])
def test_known_limit_of_the_threshold_baseline(analyst, sql):
    with pytest.raises(sqlsdc.PolicyViolation):
        analyst.execute(sql)


# Group existence used as data (IN, EXISTS, COUNT(*) over groups) is not refused but protected:
# groups of fewer than 10 units are dropped, so the answer is the same whether or not the
# target person (income 49,455.39) passes the filter.
EXISTENCE_ORACLES = [
    pytest.param(
        "SELECT COUNT(*) FROM regions WHERE region IN (SELECT region FROM "
        "(SELECT region, COUNT(*) AS n FROM persons WHERE "
        f"{TARGET} AND income > {{t}} GROUP BY region) t)",
        id="in_grouped_subquery",
    ),
    pytest.param(
        "SELECT COUNT(*) FROM regions WHERE EXISTS (SELECT COUNT(*) "
        f"FROM persons WHERE {TARGET} AND income > {{t}} GROUP BY sex)",
        id="exists_grouped_subquery",
    ),
    pytest.param(
        "SELECT COUNT(*) FROM (SELECT sex, COUNT(*) AS n FROM persons WHERE "
        f"{TARGET} AND income > {{t}} GROUP BY sex) t",
        id="count_of_groups",
    ),
    pytest.param(
        f"SELECT COUNT(*) FROM (SELECT sex FROM persons WHERE {TARGET} AND income > {{t}} "
        "GROUP BY sex) t",
        id="count_of_key_only_groups",
    ),
]


@pytest.mark.parametrize("template", EXISTENCE_ORACLES)
def test_group_existence_is_not_an_oracle(analyst, raw, template):
    """Cut points around the target's income are refused (not class breaks); at the class
    breaks around it the answer does not depend on which side of the target they are."""
    (target_income,) = raw.execute(f"SELECT income FROM persons WHERE {TARGET}").fetchone()
    for t in (target_income - 10_000, target_income + 10_000):
        with pytest.raises(sqlsdc.PolicyViolation, match="class breaks"):
            analyst.execute(template.format(t=t))
    answers = {analyst.execute(template.format(t=t)).fetchall()[0][0] for t in (20_000, 50_000)}
    assert len(answers) == 1, f"the answer depends on the target's income: {answers}"


# Parameters are bound as literals before any check, so they cannot smuggle SQL in.
PARAMETERIZED = [
    pytest.param("SELECT income FROM persons WHERE region = ?", ["R01"], id="row-level"),
    pytest.param("SELECT COUNT(*) FROM ?", ["persons"], id="table-name-parameter"),
    pytest.param("SELECT COUNT(*) FROM read_csv(?)", ["/etc/passwd"], id="file-parameter"),
    pytest.param("SELECT ? FROM persons", ["income"], id="column-name-parameter"),
    pytest.param(
        "SELECT income, COUNT(*) FROM persons GROUP BY ?", [1], id="ordinal-parameter-measure"
    ),
    pytest.param(
        "SELECT region, SUM(income) FROM persons WHERE person_id = ? GROUP BY region",
        [1],
        id="identifier-filter",
    ),
    pytest.param(
        "SELECT region, COUNT(*) FROM persons WHERE age * ? > 0 GROUP BY region",
        [1000000000],
        id="overflow-through-parameter",
    ),
    pytest.param(
        "SELECT region, COUNT(*) FROM persons WHERE age // ? > 0 GROUP BY region",
        [0],
        id="zero-divisor-through-parameter",
    ),
    pytest.param(
        "SELECT region, COUNT(*) FROM persons WHERE age // $d > 0 GROUP BY region",
        {"d": 0},
        id="named-zero-divisor",
    ),
]


@pytest.mark.parametrize(("sql", "params"), PARAMETERIZED)
def test_hostile_parameters_are_refused(analyst, sql, params):
    with pytest.raises(sqlsdc.PolicyViolation):
        analyst.execute(sql, params)


def test_injected_parameter_text_is_only_a_literal(analyst):
    sql = "SELECT region, COUNT(*) FROM persons WHERE region = ? GROUP BY region"
    rows = analyst.execute(sql, ["R01' OR 1=1; DROP TABLE persons; --"]).fetchall()
    assert rows == []
    assert analyst.execute("SELECT COUNT(*) FROM persons").fetchone()[0] is not None


# ---------------------------------------------------------------- refusal messages
MESSAGES = [
    pytest.param("SELECT income FROM persons", r"aggregate", id="row-level"),
    pytest.param(
        "SELECT income, COUNT(*) FROM persons GROUP BY income", r"measure", id="measure-grouped"
    ),
    pytest.param("SELECT * FROM read_csv('/etc/passwd')", r"table functions", id="table-function"),
    pytest.param(
        "SELECT region, COUNT(*) FROM main.persons GROUP BY region",
        r"qualified",
        id="qualified-name",
    ),
    pytest.param(
        "SELECT person_id, COUNT(*) FROM persons GROUP BY person_id",
        r"identifier",
        id="identifier-grouped",
    ),
    pytest.param(
        "SELECT region, MAX(income) FROM persons GROUP BY region",
        r"MAX over confidential values",
        id="max",
    ),
    pytest.param("SELECT 1; DROP TABLE persons", r"2 statements", id="multi-statement"),
    pytest.param("DROP TABLE persons", r"DROP statements are not allowed", id="ddl"),
    pytest.param("SELECT * FROM secrets", r"not declared in the policy", id="undeclared"),
    pytest.param(
        "WITH persons AS (SELECT 1 AS x) SELECT * FROM persons", r"shadows", id="cte-shadowing"
    ),
    pytest.param(
        "SELECT region, COUNT(*) FROM persons WHERE age // 0 > 1 GROUP BY region",
        r"could raise an error",
        id="error-side-channel",
    ),
    pytest.param(
        "SELECT region, (SELECT SUM(income) FROM persons p2 WHERE p2.region = "
        "r.region) FROM regions r",
        r"correlated",
        id="correlated",
    ),
    pytest.param(
        "SELECT __rkey, COUNT(*) FROM persons GROUP BY __rkey",
        r"reserved|resolution",
        id="internal-column",
    ),
    pytest.param(
        "SELECT region FROM regions UNION SELECT region FROM persons",
        r"UNION of confidential rows",
        id="set-operation",
    ),
    pytest.param(
        "SELECT region, current_setting('threads') FROM regions",
        r"is not allowed",
        id="metadata-function",
    ),
]


@pytest.mark.parametrize(("sql", "pattern"), MESSAGES)
def test_refusal_message_is_helpful(analyst, sql, pattern):
    with pytest.raises(sqlsdc.PolicyViolation, match=pattern) as refused:
        analyst.execute(sql)
    assert refused.value.reason
    assert refused.value.sql == sql or refused.value.sql is None


def test_refusals_carry_a_hint(analyst):
    with pytest.raises(sqlsdc.PolicyViolation) as refused:
        analyst.execute("SELECT region, income FROM persons")
    assert "GROUP BY" in refused.value.hint
    assert "COUNT" in refused.value.hint


# ---------------------------------------------------------------- audit log
AUDITED = [
    pytest.param("SELECT * FROM persons", id="row-level"),
    pytest.param("COPY persons TO '/tmp/leak.csv'", id="copy"),
    pytest.param("SELECT * FROM read_parquet('/tmp/x.parquet')", id="file-reader"),
    pytest.param("SELECT 1; DROP TABLE persons", id="multi-statement"),
    pytest.param("SELECT person_id, COUNT(*) FROM persons GROUP BY person_id", id="identifier"),
]


@pytest.mark.parametrize("sql", AUDITED)
def test_refused_query_is_audited(demo_db, sql):
    marker = f"-- audit probe {zlib.crc32(sql.encode())}"
    statement = f"{sql} {marker}" if ";" not in sql else f"{marker}\n{sql}"
    with sqlsdc.connect(demo_db, user="analyst") as con:
        with pytest.raises(sqlsdc.PolicyViolation) as refused:
            con.execute(statement)
    db = open_database(demo_db)
    try:
        entries = store.audit_entries(db, user="analyst", decision="refused", limit=1000)
    finally:
        db.close()
    mine = [e for e in entries if e["sql_text"] == statement]
    assert len(mine) == 1, entries[:3]
    entry = mine[0]
    assert entry["decision"] == "refused"
    assert entry["reason"]
    assert entry["reason"] == str(refused.value)
    assert entry["user_name"] == "analyst"
    assert entry["fingerprint"] is None
    assert entry["rows_returned"] is None


def test_refusals_get_increasing_query_ids(demo_db):
    with sqlsdc.connect(demo_db, user="analyst") as con:
        for sql in ("SELECT income FROM persons -- first", "SELECT income FROM persons -- second"):
            with pytest.raises(sqlsdc.PolicyViolation):
                con.execute(sql)
    db = open_database(demo_db)
    try:
        entries = store.audit_entries(db, user="analyst", decision="refused", limit=1000)
    finally:
        db.close()
    ids = {e["sql_text"]: e["query_id"] for e in entries}
    assert ids["SELECT income FROM persons -- first"] < ids["SELECT income FROM persons -- second"]
