"""The shadow catalog: an in-memory DuckDB that holds a PostgreSQL catalog and no data.

A server session answers ``pg_catalog`` and ``information_schema`` queries here, after
:mod:`sqlsdc.server.catalog` has mapped their table names to the schemas below (``pgc`` for
``pg_catalog``, ``isc`` for ``information_schema``). Every row is written from the visibility
model (:func:`sqlsdc.server.visible.visible_tables`): the tables the user may query, their
allowed columns with PostgreSQL types and comments. Nothing else is in this database: no data
table, no row count (``reltuples`` is -1 and ``relpages`` 0, as PostgreSQL shows a table never
analysed), no statistic, index or constraint, and no ``sqlsdc`` schema. The functions clients
call (``format_type``, ``pg_table_is_visible``, ``obj_description`` …) are macros over these
tables. DuckDB's own ``pg_catalog`` emulation is never reached: its type ids are DuckDB's, not
PostgreSQL's, and it would list the engine's objects.
"""

from __future__ import annotations

import re

from sqlsdc.engines import duckdb as engine
from sqlsdc.server.visible import VisibleTable

PG_CATALOG, PUBLIC, INFORMATION_SCHEMA = 11, 2200, 13_000
FIRST_OID = 16_384  # PostgreSQL's first oid of user objects
SERVER_VERSION = "15.0"
DATABASE_OID = 16_383
MEMORY_LIMIT = "128MB"  # per session; the catalog is a few hundred rows, a query's work is bounded
INSERT_ROWS = 256  # rows of the catalog written by one statement (_insert)

# name, oid, array oid, length, category, SQL display name (format_type)
_TYPES = (
    ("bool", 16, 1000, 1, "B", "boolean"),
    ("bytea", 17, 1001, -1, "U", "bytea"),
    ("char", 18, 1002, 1, "Z", '"char"'),
    ("name", 19, 1003, 64, "S", "name"),
    ("int8", 20, 1016, 8, "N", "bigint"),
    ("int2", 21, 1005, 2, "N", "smallint"),
    ("int2vector", 22, 1006, -1, "A", "int2vector"),
    ("int4", 23, 1007, 4, "N", "integer"),
    ("regproc", 24, 1008, 4, "N", "regproc"),
    ("text", 25, 1009, -1, "S", "text"),
    ("oid", 26, 1028, 4, "N", "oid"),
    ("oidvector", 30, 1013, -1, "A", "oidvector"),
    ("json", 114, 199, -1, "U", "json"),
    ("float4", 700, 1021, 4, "N", "real"),
    ("float8", 701, 1022, 8, "N", "double precision"),
    ("unknown", 705, 0, -2, "X", "unknown"),
    ("bpchar", 1042, 1014, -1, "S", "character"),
    ("varchar", 1043, 1015, -1, "S", "character varying"),
    ("date", 1082, 1182, 4, "D", "date"),
    ("time", 1083, 1183, 8, "D", "time without time zone"),
    ("timestamp", 1114, 1115, 8, "D", "timestamp without time zone"),
    ("timestamptz", 1184, 1185, 8, "D", "timestamp with time zone"),
    ("interval", 1186, 1187, 16, "T", "interval"),
    ("numeric", 1700, 1231, -1, "N", "numeric"),
    ("regclass", 2205, 2210, 4, "N", "regclass"),
    ("regtype", 2206, 2211, 4, "N", "regtype"),
    ("uuid", 2950, 2951, 16, "U", "uuid"),
)
TYPE_OIDS = {name: oid for name, oid, *_ in _TYPES}

# DuckDB type (first word) -> PostgreSQL type; unknown types (ENUM, LIST, STRUCT…) are text
_FROM_DUCKDB = {
    "BOOLEAN": "bool", "TINYINT": "int2", "SMALLINT": "int2", "INTEGER": "int4",
    "BIGINT": "int8", "HUGEINT": "numeric", "UTINYINT": "int2", "USMALLINT": "int4",
    "UINTEGER": "int8", "UBIGINT": "numeric", "UHUGEINT": "numeric", "FLOAT": "float4",
    "DOUBLE": "float8", "DECIMAL": "numeric", "VARCHAR": "varchar", "BLOB": "bytea",
    "DATE": "date", "TIME": "time", "TIMESTAMP": "timestamp", "INTERVAL": "interval",
    "UUID": "uuid", "JSON": "json", "TIMESTAMP WITH TIME ZONE": "timestamptz",
}  # fmt: skip

# Catalog tables the answers refer to by oid (``'pg_class'::regclass``)
CATALOG_TABLE_OIDS = {
    "pg_type": 1247, "pg_attribute": 1249, "pg_proc": 1255, "pg_class": 1259,
    "pg_database": 1262, "pg_namespace": 2615, "pg_constraint": 2606, "pg_index": 2610,
    "pg_description": 2609, "pg_am": 2601, "pg_attrdef": 2604, "pg_trigger": 2620,
}  # fmt: skip

# name -> DDL columns; every table the catalog offers (any other is not a catalog table)
PG_TABLES = {
    "pg_namespace": "oid BIGINT, nspname VARCHAR, nspowner BIGINT, nspacl VARCHAR[]",
    "pg_class": (
        "oid BIGINT, relname VARCHAR, relnamespace BIGINT, reltype BIGINT, reloftype BIGINT, "
        "relowner BIGINT, relam BIGINT, relfilenode BIGINT, reltablespace BIGINT, "
        "relpages INTEGER, reltuples REAL, relallvisible INTEGER, reltoastrelid BIGINT, "
        "relhasindex BOOLEAN, relisshared BOOLEAN, relpersistence VARCHAR, relkind VARCHAR, "
        "relnatts SMALLINT, relchecks SMALLINT, relhasrules BOOLEAN, relhastriggers BOOLEAN, "
        "relhassubclass BOOLEAN, relrowsecurity BOOLEAN, relforcerowsecurity BOOLEAN, "
        "relispopulated BOOLEAN, relreplident VARCHAR, relispartition BOOLEAN, "
        "relrewrite BIGINT, relfrozenxid BIGINT, relminmxid BIGINT, relacl VARCHAR[], "
        "reloptions VARCHAR[], relpartbound VARCHAR"
    ),
    "pg_attribute": (
        "attrelid BIGINT, attname VARCHAR, atttypid BIGINT, attstattarget INTEGER, "
        "attlen SMALLINT, attnum SMALLINT, attndims INTEGER, attcacheoff INTEGER, "
        "atttypmod INTEGER, attbyval BOOLEAN, attalign VARCHAR, attstorage VARCHAR, "
        "attcompression VARCHAR, attnotnull BOOLEAN, atthasdef BOOLEAN, atthasmissing BOOLEAN, "
        "attidentity VARCHAR, attgenerated VARCHAR, attisdropped BOOLEAN, attislocal BOOLEAN, "
        "attinhcount INTEGER, attcollation BIGINT, attacl VARCHAR[], attoptions VARCHAR[], "
        "attfdwoptions VARCHAR[], attmissingval VARCHAR"
    ),
    "pg_type": (
        "oid BIGINT, typname VARCHAR, typnamespace BIGINT, typowner BIGINT, typlen SMALLINT, "
        "typbyval BOOLEAN, typtype VARCHAR, typcategory VARCHAR, typispreferred BOOLEAN, "
        "typisdefined BOOLEAN, typdelim VARCHAR, typrelid BIGINT, typsubscript VARCHAR, "
        "typelem BIGINT, typarray BIGINT, typinput VARCHAR, typoutput VARCHAR, "
        "typreceive VARCHAR, typsend VARCHAR, typmodin VARCHAR, typmodout VARCHAR, "
        "typanalyze VARCHAR, typalign VARCHAR, typstorage VARCHAR, typnotnull BOOLEAN, "
        "typbasetype BIGINT, typtypmod INTEGER, typndims INTEGER, typcollation BIGINT, "
        "typdefaultbin VARCHAR, typdefault VARCHAR, typacl VARCHAR[], display VARCHAR"
    ),
    "pg_description": "objoid BIGINT, classoid BIGINT, objsubid INTEGER, description VARCHAR",
    "pg_constraint": (
        "oid BIGINT, conname VARCHAR, connamespace BIGINT, contype VARCHAR, "
        "condeferrable BOOLEAN, condeferred BOOLEAN, convalidated BOOLEAN, conrelid BIGINT, "
        "contypid BIGINT, conindid BIGINT, conparentid BIGINT, confrelid BIGINT, "
        "confupdtype VARCHAR, confdeltype VARCHAR, confmatchtype VARCHAR, conislocal BOOLEAN, "
        "coninhcount INTEGER, connoinherit BOOLEAN, conkey SMALLINT[], confkey SMALLINT[], "
        "conpfeqop BIGINT[], conppeqop BIGINT[], conffeqop BIGINT[], conexclop BIGINT[], "
        "conbin VARCHAR"
    ),
    "pg_index": (
        "indexrelid BIGINT, indrelid BIGINT, indnatts SMALLINT, indnkeyatts SMALLINT, "
        "indisunique BOOLEAN, indnullsnotdistinct BOOLEAN, indisprimary BOOLEAN, "
        "indisexclusion BOOLEAN, indimmediate BOOLEAN, indisclustered BOOLEAN, "
        "indisvalid BOOLEAN, indcheckxmin BOOLEAN, indisready BOOLEAN, indislive BOOLEAN, "
        "indisreplident BOOLEAN, indkey SMALLINT[], indcollation BIGINT[], indclass BIGINT[], "
        "indoption SMALLINT[], indexprs VARCHAR, indpred VARCHAR"
    ),
    "pg_attrdef": "oid BIGINT, adrelid BIGINT, adnum SMALLINT, adbin VARCHAR",
    "pg_am": "oid BIGINT, amname VARCHAR, amhandler VARCHAR, amtype VARCHAR",
    "pg_opclass": (
        "oid BIGINT, opcmethod BIGINT, opcname VARCHAR, opcnamespace BIGINT, opcowner BIGINT, "
        "opcfamily BIGINT, opcintype BIGINT, opcdefault BOOLEAN, opckeytype BIGINT"
    ),
    "pg_collation": (
        "oid BIGINT, collname VARCHAR, collnamespace BIGINT, collowner BIGINT, "
        "collprovider VARCHAR, collisdeterministic BOOLEAN, collencoding INTEGER, "
        "collcollate VARCHAR, collctype VARCHAR"
    ),
    "pg_sequence": (
        "seqrelid BIGINT, seqtypid BIGINT, seqstart BIGINT, seqincrement BIGINT, "
        "seqmax BIGINT, seqmin BIGINT, seqcache BIGINT, seqcycle BOOLEAN"
    ),
    "pg_inherits": "inhrelid BIGINT, inhparent BIGINT, inhseqno INTEGER, inhdetachpending BOOLEAN",
    "pg_database": (
        "oid BIGINT, datname VARCHAR, datdba BIGINT, encoding INTEGER, datlocprovider VARCHAR, "
        "datistemplate BOOLEAN, datallowconn BOOLEAN, datconnlimit INTEGER, "
        "datcollate VARCHAR, datctype VARCHAR, daticulocale VARCHAR, datacl VARCHAR[], "
        "dattablespace BIGINT"
    ),
    "pg_roles": (
        "oid BIGINT, rolname VARCHAR, rolsuper BOOLEAN, rolinherit BOOLEAN, "
        "rolcreaterole BOOLEAN, rolcreatedb BOOLEAN, rolcanlogin BOOLEAN, "
        "rolreplication BOOLEAN, rolconnlimit INTEGER, rolvaliduntil TIMESTAMP, "
        "rolbypassrls BOOLEAN, rolconfig VARCHAR[]"
    ),
    "pg_user": (
        "usename VARCHAR, usesysid BIGINT, usecreatedb BOOLEAN, usesuper BOOLEAN, "
        "userepl BOOLEAN, usebypassrls BOOLEAN, valuntil TIMESTAMP, useconfig VARCHAR[]"
    ),
    "pg_tablespace": "oid BIGINT, spcname VARCHAR, spcowner BIGINT, spcacl VARCHAR[]",
    "pg_settings": "name VARCHAR, setting VARCHAR, unit VARCHAR, category VARCHAR, "
    "short_desc VARCHAR, context VARCHAR, vartype VARCHAR, source VARCHAR",
    "pg_proc": (
        "oid BIGINT, proname VARCHAR, pronamespace BIGINT, proowner BIGINT, prokind VARCHAR, "
        "prorettype BIGINT, proargtypes BIGINT[], proretset BOOLEAN, prolang BIGINT"
    ),
    "pg_enum": "oid BIGINT, enumtypid BIGINT, enumsortorder REAL, enumlabel VARCHAR",
    "pg_range": "rngtypid BIGINT, rngsubtype BIGINT, rngmultitypid BIGINT",
    "pg_extension": "oid BIGINT, extname VARCHAR, extowner BIGINT, extversion VARCHAR",
    "pg_trigger": "oid BIGINT, tgrelid BIGINT, tgname VARCHAR, tgisinternal BOOLEAN",
    "pg_rewrite": "oid BIGINT, rulename VARCHAR, ev_class BIGINT",
    "pg_policy": "oid BIGINT, polname VARCHAR, polrelid BIGINT, polcmd VARCHAR, "
    "polpermissive BOOLEAN, polroles BIGINT[], polqual VARCHAR, polwithcheck VARCHAR",
    "pg_depend": "classid BIGINT, objid BIGINT, objsubid INTEGER, refclassid BIGINT, "
    "refobjid BIGINT, refobjsubid INTEGER, deptype VARCHAR",
    "pg_foreign_table": "ftrelid BIGINT, ftserver BIGINT",
    "pg_partitioned_table": "partrelid BIGINT, partstrat VARCHAR",
    "pg_statistic_ext": "oid BIGINT, stxrelid BIGINT, stxname VARCHAR, stxnamespace BIGINT, "
    "stxkind VARCHAR[], stxstattarget INTEGER",
    "pg_publication": "oid BIGINT, pubname VARCHAR, puballtables BOOLEAN",
    "pg_publication_namespace": "oid BIGINT, pnpubid BIGINT, pnnspid BIGINT",
    "pg_publication_rel": "oid BIGINT, prpubid BIGINT, prrelid BIGINT, prqual VARCHAR, "
    "prattrs SMALLINT[]",
    "pg_matviews": "schemaname VARCHAR, matviewname VARCHAR, definition VARCHAR",
    "pg_indexes": "schemaname VARCHAR, tablename VARCHAR, indexname VARCHAR, "
    "tablespace VARCHAR, indexdef VARCHAR",
}

_SCHEMATA = (("pg_catalog", PG_CATALOG), ("public", PUBLIC), ("information_schema",
             INFORMATION_SCHEMA))  # fmt: skip


def pg_type(duckdb_type: str) -> tuple[str, int]:
    """The PostgreSQL type name and type modifier of a DuckDB column type."""
    text = duckdb_type.upper().strip()
    match = re.fullmatch(r"DECIMAL\((\d+),\s*(\d+)\)", text)
    if match:
        precision, scale = int(match[1]), int(match[2])
        return "numeric", ((precision << 16) | scale) + 4
    if text.endswith("]") or "(" in text and not text.startswith("DECIMAL"):
        return "text", -1  # lists, structs, maps, enums: shown as text
    return _FROM_DUCKDB.get(text, "text"), -1


def build(tables: tuple[VisibleTable, ...], *, user: str, database: str, settings: dict):
    """A hardened in-memory DuckDB holding the catalog of ``tables`` and nothing else."""
    con = engine.memory_database(memory_limit=MEMORY_LIMIT, threads=1)
    for schema in ("pgc", "isc"):
        con.execute(f"CREATE SCHEMA {schema}")
    for name, columns in PG_TABLES.items():
        con.execute(f"CREATE TABLE pgc.{name} ({columns})")
    _fill(con, tables, user=user, database=database, settings=settings)
    _functions(con, user=user, database=database)
    _information_schema(con)
    return con


def _insert(con, table: str, rows: list[tuple]) -> None:
    """``rows`` into ``table``, :data:`INSERT_ROWS` to a statement (the values travel as
    parameters). ``executemany`` ran the insert once per row, ~1 ms each: two thirds of the
    ~150 ms a session's first catalog query took to build this catalog of the demo."""
    for start in range(0, len(rows), INSERT_ROWS):
        chunk = rows[start : start + INSERT_ROWS]
        marks = ", ".join([f"({', '.join('?' * len(chunk[0]))})"] * len(chunk))
        con.execute(f"INSERT INTO {table} VALUES {marks}", [v for row in chunk for v in row])


def _fill(con, tables, *, user: str, database: str, settings: dict) -> None:
    schemata = [(oid, name, 10, None) for name, oid in _SCHEMATA]
    if any(t.schema == "protected" for t in tables):
        schemata.append((PUBLIC + 1, "protected", 10, None))
    _insert(con, "pgc.pg_namespace", schemata)
    types = []
    for name, oid, array, length, category, display in _TYPES:
        types.append(
            (
                oid,
                name,
                PG_CATALOG,
                10,
                length,
                length > 0,
                "b",
                category,
                False,
                True,
                ",",
                0,
                None,
                0,
                array,
                None,
                None,
                None,
                None,
                None,
                None,
                None,
                "i",
                "p",
                False,
                0,
                -1,
                0,
                0,
                None,
                None,
                None,
                display,
            )
        )
        if array:
            types.append(
                (
                    array,
                    f"_{name}",
                    PG_CATALOG,
                    10,
                    -1,
                    False,
                    "b",
                    "A",
                    False,
                    True,
                    ",",
                    0,
                    None,
                    oid,
                    0,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    "i",
                    "x",
                    False,
                    0,
                    -1,
                    0,
                    0,
                    None,
                    None,
                    None,
                    f"{display}[]",
                )
            )
    _insert(con, "pgc.pg_type", types)
    classes, attributes, descriptions = [], [], []
    namespaces = {"public": PUBLIC, "protected": PUBLIC + 1}
    for oid, table in enumerate(tables, start=FIRST_OID):
        kind = "v" if table.is_view else "r"
        classes.append((oid, table.name, namespaces[table.schema], 0, 0, 10, 0 if table.is_view
                        else 2, 0, 0, 0, -1.0, 0, 0, False, False, "p", kind,
                        len(table.columns), 0, table.is_view, False, False, False, False, True,
                        "d", False, 0, 0, 0, None, None, None))  # fmt: skip
        if table.comment:
            descriptions.append((oid, CATALOG_TABLE_OIDS["pg_class"], 0, table.comment))
        for number, column in enumerate(table.columns, start=1):
            name, typmod = pg_type(column.type)
            type_oid = TYPE_OIDS[name]
            length = next(t[3] for t in _TYPES if t[1] == type_oid)
            attributes.append((oid, column.name, type_oid, -1, length, number, 0, -1, typmod,
                               length > 0, "i", "p", "", False, False, False, "", "", False,
                               True, 0, 0, None, None, None, None))  # fmt: skip
            if column.comment:
                descriptions.append((oid, CATALOG_TABLE_OIDS["pg_class"], number, column.comment))
    _insert(con, "pgc.pg_class", classes)
    _insert(con, "pgc.pg_attribute", attributes)
    _insert(con, "pgc.pg_description", descriptions)
    _insert(con, "pgc.pg_am", [(2, "heap", "heap_tableam_handler", "t"),
                           (403, "btree", "bthandler", "i")])  # fmt: skip
    _insert(con, "pgc.pg_database", [(DATABASE_OID, database, 10, 6, "c", False, True, -1, "C",
                                  "C", None, None, 1663)])  # fmt: skip
    _insert(con, "pgc.pg_roles", [(10, user, False, True, False, False, True, False, -1, None,
                               False, None)])  # fmt: skip
    _insert(con, "pgc.pg_user", [(user, 10, False, False, False, False, None, None)])
    _insert(con, "pgc.pg_tablespace", [(1663, "pg_default", 10, None)])
    set_settings(con, settings)


def set_settings(con, settings: dict[str, str]) -> None:
    """Replace the session settings ``pg_settings`` and ``current_setting`` show (values
    travel as parameters: nothing of them is SQL)."""
    con.execute("DELETE FROM pgc.pg_settings")
    _insert(con, "pgc.pg_settings", [(name, str(value), None, "Client Connection Defaults", "",
                                  "user", "string", "session")
                                 for name, value in settings.items()])  # fmt: skip


def _information_schema(con) -> None:
    """``information_schema`` views over the ``pgc`` tables (the SQL standard's columns that
    JDBC, Metabase and Superset read)."""
    con.execute("""CREATE VIEW isc.schemata AS
        SELECT current_database() AS catalog_name, nspname AS schema_name,
               pg_get_userbyid(nspowner) AS schema_owner, NULL AS default_character_set_catalog,
               NULL AS default_character_set_schema, NULL AS default_character_set_name,
               NULL AS sql_path
        FROM pgc.pg_namespace""")
    con.execute("""CREATE VIEW isc.tables AS
        SELECT current_database() AS table_catalog, n.nspname AS table_schema,
               c.relname AS table_name,
               CASE c.relkind WHEN 'v' THEN 'VIEW' ELSE 'BASE TABLE' END AS table_type,
               NULL AS self_referencing_column_name, NULL AS reference_generation,
               NULL AS user_defined_type_catalog, NULL AS user_defined_type_schema,
               NULL AS user_defined_type_name, 'NO' AS is_insertable_into, 'NO' AS is_typed,
               NULL AS commit_action
        FROM pgc.pg_class c JOIN pgc.pg_namespace n ON n.oid = c.relnamespace""")
    con.execute("""CREATE VIEW isc.views AS
        SELECT table_catalog, table_schema, table_name, NULL AS view_definition,
               'NONE' AS check_option, 'NO' AS is_updatable, 'NO' AS is_insertable_into
        FROM isc.tables WHERE table_type = 'VIEW'""")
    con.execute("""CREATE VIEW isc.columns AS
        SELECT current_database() AS table_catalog, n.nspname AS table_schema,
               c.relname AS table_name, a.attname AS column_name,
               a.attnum::INTEGER AS ordinal_position, NULL AS column_default,
               CASE WHEN a.attnotnull THEN 'NO' ELSE 'YES' END AS is_nullable,
               CASE WHEN t.typcategory = 'A' THEN 'ARRAY' ELSE t.display END AS data_type,
               NULL::INTEGER AS character_maximum_length,
               NULL::INTEGER AS character_octet_length,
               CASE WHEN t.typname = 'numeric' AND a.atttypmod > 0
                    THEN ((a.atttypmod - 4) >> 16)::INTEGER
                    WHEN t.typname IN ('int2', 'int4', 'int8')
                    THEN (t.typlen * 8 - 1)::INTEGER
                    WHEN t.typname IN ('float4', 'float8')
                    THEN CASE t.typname WHEN 'float4' THEN 24 ELSE 53 END END
                    AS numeric_precision,
               CASE WHEN t.typname IN ('numeric') THEN NULL ELSE 2 END AS numeric_precision_radix,
               CASE WHEN t.typname = 'numeric' AND a.atttypmod > 0
                    THEN ((a.atttypmod - 4) & 65535)::INTEGER
                    WHEN t.typname IN ('int2', 'int4', 'int8') THEN 0 END AS numeric_scale,
               NULL::INTEGER AS datetime_precision, NULL AS interval_type,
               current_database() AS udt_catalog, 'pg_catalog' AS udt_schema,
               t.typname AS udt_name, 'NO' AS is_identity, 'NEVER' AS is_generated,
               'NO' AS is_updatable, a.attnum::INTEGER AS dtd_identifier
        FROM pgc.pg_attribute a JOIN pgc.pg_class c ON c.oid = a.attrelid
        JOIN pgc.pg_namespace n ON n.oid = c.relnamespace
        JOIN pgc.pg_type t ON t.oid = a.atttypid""")
    for name, columns in {
        "table_constraints": "constraint_catalog, constraint_schema, constraint_name, "
        "table_catalog, table_schema, table_name, constraint_type, is_deferrable, "
        "initially_deferred, enforced",
        "key_column_usage": "constraint_catalog, constraint_schema, constraint_name, "
        "table_catalog, table_schema, table_name, column_name, ordinal_position, "
        "position_in_unique_constraint",
        "referential_constraints": "constraint_catalog, constraint_schema, constraint_name, "
        "unique_constraint_catalog, unique_constraint_schema, unique_constraint_name, "
        "match_option, update_rule, delete_rule",
        "constraint_column_usage": "table_catalog, table_schema, table_name, column_name, "
        "constraint_catalog, constraint_schema, constraint_name",
        "routines": "specific_catalog, specific_schema, specific_name, routine_catalog, "
        "routine_schema, routine_name, routine_type, data_type",
        "sequences": "sequence_catalog, sequence_schema, sequence_name, data_type",
    }.items():
        select = ", ".join(f"NULL::VARCHAR AS {c.strip()}" for c in columns.split(","))
        con.execute(f"CREATE VIEW isc.{name} AS SELECT {select} WHERE false")


def _functions(con, *, user: str, database: str) -> None:
    """PostgreSQL's catalog functions as macros over the shadow's tables. They are created in
    ``main``, ahead of DuckDB's built-ins of the same name on the search path; the catalog
    module lets a statement call only these and a list of plain SQL functions."""
    quoted_user = user.replace("'", "''")
    version = f"PostgreSQL {SERVER_VERSION} (sqlsdc) on x86_64-pc-linux-gnu, compiled by sqlsdc"
    macros = {
        "version()": f"'{version}'",
        "current_schema()": "'public'",
        "current_schemas(implicit)": "CASE WHEN implicit THEN ['pg_catalog', 'public'] "
        "ELSE ['public'] END",
        "current_database()": f"'{database.replace(chr(39), chr(39) * 2)}'",
        "current_user_name()": f"'{quoted_user}'",
        "pg_backend_pid()": "0",
        "pg_get_userbyid(id)": f"'{quoted_user}'",
        "pg_table_is_visible(id)": "coalesce((SELECT sdc_c.relnamespace = 2200 FROM pgc.pg_class "
        "sdc_c WHERE sdc_c.oid = id), false)",
        "pg_type_is_visible(id)": "true",
        "pg_collation_is_visible(id)": "true",
        "pg_function_is_visible(id)": "true",
        "format_type(id, typmod)": "CASE WHEN id IN (1700) AND typmod > 4 THEN "
        "'numeric(' || ((typmod - 4) >> 16) || ',' || ((typmod - 4) & 65535) || ')' "
        "ELSE (SELECT sdc_t.display FROM pgc.pg_type sdc_t WHERE sdc_t.oid = id) END",
        "sdc_regtype_name(id)": "(SELECT sdc_t.display FROM pgc.pg_type sdc_t "
        "WHERE sdc_t.oid = id)",
        "to_regtype(name)": "(SELECT sdc_t.oid FROM pgc.pg_type sdc_t WHERE sdc_t.typname = "
        "lower(name) OR sdc_t.display = lower(name) ORDER BY sdc_t.oid LIMIT 1)",
        "sdc_regclass(name)": "coalesce((SELECT sdc_c.oid FROM pgc.pg_class sdc_c JOIN "
        "pgc.pg_namespace sdc_n ON sdc_n.oid = sdc_c.relnamespace WHERE sdc_c.relname = name "
        "OR sdc_n.nspname || '.' || sdc_c.relname = name LIMIT 1), (SELECT sdc_o.oid FROM "
        "sdc_catalog_oids sdc_o WHERE sdc_o.relname = replace(name, 'pg_catalog.', '')))",
        "to_regclass(name)": "sdc_regclass(name)",
        "obj_description(id, catalog)": "(SELECT sdc_d.description FROM pgc.pg_description "
        "sdc_d WHERE sdc_d.objoid = id AND sdc_d.objsubid = 0)",
        "col_description(id, number)": "(SELECT sdc_d.description FROM pgc.pg_description "
        "sdc_d WHERE sdc_d.objoid = id AND sdc_d.objsubid = number)",
        "shobj_description(id, catalog)": "NULL::VARCHAR",
        "pg_get_expr(expr, relation)": "NULL::VARCHAR",
        "pg_get_constraintdef(id)": "NULL::VARCHAR",
        "pg_get_indexdef(id)": "NULL::VARCHAR",
        "pg_get_viewdef(id)": "NULL::VARCHAR",
        "pg_get_serial_sequence(relation, column_name)": "NULL::VARCHAR",
        "pg_get_partkeydef(id)": "NULL::VARCHAR",
        "pg_get_statisticsobjdef_columns(id)": "NULL::VARCHAR",
        "pg_relation_is_publishable(id)": "false",
        "pg_encoding_to_char(encoding)": "'UTF8'",
        "pg_relation_size(id)": "0::BIGINT",
        "pg_total_relation_size(id)": "0::BIGINT",
        "pg_table_size(id)": "0::BIGINT",
        "pg_indexes_size(id)": "0::BIGINT",
        "pg_size_pretty(size)": "'0 bytes'",
        "has_table_privilege(a)": "true",
        "has_schema_privilege(a)": "true",
        "has_database_privilege(a)": "true",
        "has_column_privilege(a)": "true",
        "pg_has_role(a)": "true",
        "current_setting(setting_name)": "(SELECT sdc_s.setting FROM pgc.pg_settings "
        "sdc_s WHERE lower(sdc_s.name) = lower(setting_name))",
        # set_config(name, value, is_local) as PostgreSQL answers it when the value is the
        # setting's own (asyncpg's set_config('jit', 'off', false) before it introspects a
        # type); a catalog query changes no setting, so any other value is refused (SET does)
        "set_config(setting_name, new_value, is_local)": "CASE WHEN (SELECT sdc_s.setting "
        "FROM pgc.pg_settings sdc_s WHERE lower(sdc_s.name) = lower(setting_name)) = "
        "new_value THEN new_value ELSE error('set_config changes no setting; use SET') END",
        "array_upper(a, dimension)": "len(a)",
        "array_lower(a, dimension)": "CASE WHEN len(a) > 0 THEN 1 END",
        # information_schema._pg_expandarray: one (x, n) row per element (x the element, n its
        # 1-based position), a set-returning function in the select list (pgjdbc's
        # getPrimaryKeys/getIndexInfo); unnest keeps PostgreSQL's lock-step of such functions
        "_pg_expandarray(arr)": "unnest(list_transform(generate_series(1, len(arr)), "
        "lambda i: {'x': arr[i], 'n': i}))",
    }
    overloads = {  # a second signature of some functions
        "pg_get_expr": "(expr, relation, pretty) AS NULL::VARCHAR",
        "pg_get_constraintdef": "(id, pretty) AS NULL::VARCHAR",
        "pg_get_indexdef": "(id, number, pretty) AS NULL::VARCHAR",
        "pg_get_viewdef": "(id, pretty) AS NULL::VARCHAR",
        "has_table_privilege": "(a, b) AS true, (a, b, c) AS true",
        "has_schema_privilege": "(a, b) AS true, (a, b, c) AS true",
        "has_database_privilege": "(a, b) AS true, (a, b, c) AS true",
        "has_column_privilege": "(a, b, c) AS true, (a, b, c, d) AS true",
        "pg_has_role": "(a, b) AS true, (a, b, c) AS true",
        "current_setting": "(setting_name, missing_ok) AS (SELECT sdc_s.setting FROM "
        "pgc.pg_settings sdc_s WHERE lower(sdc_s.name) = lower(setting_name))",
    }
    con.execute("CREATE TABLE sdc_catalog_oids (relname VARCHAR, oid BIGINT)")
    _insert(con, "sdc_catalog_oids", list(CATALOG_TABLE_OIDS.items()))
    for signature, body in macros.items():
        name = signature.split("(")[0]
        extra = f", {overloads[name]}" if name in overloads else ""
        con.execute(f"CREATE MACRO {signature} AS {body}{extra}")


MACROS = frozenset(
    {
        "version", "current_schema", "current_schemas", "current_database", "current_user_name",
        "pg_backend_pid", "pg_get_userbyid", "pg_table_is_visible", "pg_type_is_visible",
        "pg_collation_is_visible", "pg_function_is_visible", "format_type", "sdc_regtype_name",
        "to_regtype", "sdc_regclass", "to_regclass", "obj_description", "col_description",
        "shobj_description", "pg_get_expr", "pg_get_constraintdef", "pg_get_indexdef",
        "pg_get_viewdef", "pg_get_serial_sequence", "pg_get_partkeydef",
        "pg_get_statisticsobjdef_columns", "pg_relation_is_publishable", "pg_encoding_to_char",
        "pg_relation_size", "pg_total_relation_size", "pg_table_size", "pg_indexes_size",
        "pg_size_pretty", "has_table_privilege", "has_schema_privilege",
        "has_database_privilege", "has_column_privilege", "pg_has_role", "current_setting",
        "set_config", "array_upper", "array_lower", "_pg_expandarray",
    }
)  # fmt: skip
"""The functions :func:`build` defines; the catalog module allows calls of these by name."""
