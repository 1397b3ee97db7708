"""An embedded SQLAlchemy dialect over the guarded connection: ``sqlsdc:///path.duckdb?user=u``.

pandas ``read_sql``, ``sqlalchemy.inspect``, Jupyter SQL magics and other SQLAlchemy-based tools
use sqlsdc without a server. Statements are compiled with SQLAlchemy's PostgreSQL compiler
(DuckDB reads PostgreSQL's syntax) and every one passes the guard; reflection lists what the
user may see (:func:`sqlsdc.server.visible.visible_tables`), never DuckDB's own catalog: no
primary key, foreign key or index is shown. A refusal is raised as a PEP 249
``ProgrammingError`` that is also a :class:`sqlsdc.PolicyViolation`, with the guard's message
(SQLAlchemy wraps it in ``sqlalchemy.exc.ProgrammingError``; ``.orig`` is the refusal).

Needs SQLAlchemy 2 (``pip install 'sqlsdc[sqlalchemy]'``).

Example:
    >>> import pandas as pd, sqlalchemy  # doctest: +SKIP
    >>> url = "sqlsdc:///sqlsdc-demo.duckdb?user=analyst"
    >>> engine = sqlalchemy.create_engine(url)  # doctest: +SKIP
    >>> sql = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"
    >>> pd.read_sql(sql, engine)  # doctest: +SKIP
"""

from __future__ import annotations

import types

from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.engine import default, reflection

import sqlsdc
from sqlsdc.errors import PolicyViolation, ProgrammingError
from sqlsdc.guard.connection import Connection
from sqlsdc.guard.cursor import Cursor
from sqlsdc.server.shadow import pg_type
from sqlsdc.server.visible import visible_tables


class RefusedQuery(ProgrammingError, PolicyViolation):
    """A statement the guard refused, as PEP 249's ``ProgrammingError``; the message, reason,
    hint and statement are the guard's."""

    def __init__(self, refusal: PolicyViolation):
        PolicyViolation.__init__(self, refusal.reason, refusal.hint, refusal.sql)


class _Cursor(Cursor):
    def execute(self, sql: str, parameters=None):
        try:
            return super().execute(sql, parameters or None)
        except RefusedQuery:
            raise
        except PolicyViolation as refusal:
            raise RefusedQuery(refusal) from None


class _Connection(Connection):
    def cursor(self) -> _Cursor:
        self._check_open()
        return _Cursor(self)


def _dbapi() -> types.ModuleType:
    """The PEP 249 module SQLAlchemy sees: sqlsdc's globals, errors and this connection."""
    module = types.ModuleType("sqlsdc_dbapi")
    for name in ("apilevel", "threadsafety", "paramstyle", "Error", "Warning", "InterfaceError",
                 "DatabaseError", "OperationalError", "ProgrammingError", "NotSupportedError",
                 "InternalError", "IntegrityError", "DataError", "STRING", "NUMBER", "DATETIME",
                 "BINARY", "ROWID"):  # fmt: skip
        setattr(module, name, getattr(sqlsdc, name))
    module.connect = _Connection
    return module


class SqlsdcDialect(PGDialect):
    """SQLAlchemy dialect ``sqlsdc``: PostgreSQL-compatible SQL over a guarded connection."""

    name = "sqlsdc"
    driver = "sqlsdc"
    default_paramstyle = "qmark"
    supports_statement_cache = True
    supports_sane_rowcount = False
    supports_native_enum = False
    postfetch_lastrowid = False

    @classmethod
    def import_dbapi(cls):
        return _dbapi()

    def create_connect_args(self, url):
        """``sqlsdc:///relative.duckdb?user=analyst`` or ``sqlsdc:////abs/path.duckdb?user=..``."""
        query = dict(url.query)
        user = query.pop("user", None) or url.username
        if not user or not url.database:
            raise sqlsdc.InterfaceError(
                "the URL needs a database path and a user: sqlsdc:///path/to.duckdb?user=analyst"
            )
        kwargs = {"user": user}
        if "timeout" in query:
            kwargs["timeout"] = float(query.pop("timeout"))
        if query:
            raise sqlsdc.InterfaceError(f"unknown URL options: {', '.join(sorted(query))}")
        return [url.database], kwargs

    def initialize(self, connection) -> None:
        default.DefaultDialect.initialize(self, connection)  # PostgreSQL's probes would be refused

    def _get_server_version_info(self, connection):
        return (15, 0)

    def _get_default_schema_name(self, connection) -> str:
        return "public"

    def get_isolation_level(self, dbapi_connection) -> str:
        return "READ COMMITTED"

    def set_isolation_level(self, dbapi_connection, level) -> None:
        """Guarded connections only read; every level reads the same."""

    def do_rollback(self, dbapi_connection) -> None:
        """Nothing to roll back: statements only read, audit entries are committed as they run."""

    def do_commit(self, dbapi_connection) -> None:
        dbapi_connection.commit()

    def do_ping(self, dbapi_connection) -> bool:
        return True

    # --- reflection: the visibility model, never DuckDB's catalog -----------------------

    def _visible(self, connection, schema):
        tables = visible_tables(connection.connection.dbapi_connection)
        schema = schema or "public"
        return [t for t in tables if t.schema == schema]

    @reflection.cache
    def get_schema_names(self, connection, **kw):
        tables = visible_tables(connection.connection.dbapi_connection)
        return sorted({"public", *(t.schema for t in tables)})

    @reflection.cache
    def get_table_names(self, connection, schema=None, **kw):
        return [t.name for t in self._visible(connection, schema) if not t.is_view]

    @reflection.cache
    def get_view_names(self, connection, schema=None, **kw):
        return [t.name for t in self._visible(connection, schema) if t.is_view]

    def get_materialized_view_names(self, connection, schema=None, **kw):
        return []

    def get_temp_table_names(self, connection, **kw):
        return []

    def get_sequence_names(self, connection, schema=None, **kw):
        return []

    def has_table(self, connection, table_name, schema=None, **kw) -> bool:
        return any(t.name == table_name.lower() for t in self._visible(connection, schema))

    def has_sequence(self, connection, sequence_name, schema=None, **kw) -> bool:
        return False

    def _table(self, connection, table_name, schema):
        for table in self._visible(connection, schema):
            if table.name == table_name.lower():
                return table
        from sqlalchemy.exc import NoSuchTableError

        raise NoSuchTableError(table_name)

    @reflection.cache
    def get_columns(self, connection, table_name, schema=None, **kw):
        table = self._table(connection, table_name, schema)
        columns = []
        for column in table.columns:
            name, typmod = pg_type(column.type)
            columns.append({
                "name": column.name,
                "type": self._column_type(name, typmod),
                "nullable": True,
                "default": None,
                "autoincrement": False,
                "comment": column.comment or None,
            })  # fmt: skip
        return columns

    def _column_type(self, name: str, typmod: int):
        from sqlalchemy.dialects import postgresql as pg

        simple = {"bool": pg.BOOLEAN, "int2": pg.SMALLINT, "int4": pg.INTEGER,
                  "int8": pg.BIGINT, "float4": pg.REAL, "float8": pg.DOUBLE_PRECISION,
                  "varchar": pg.VARCHAR, "text": pg.TEXT, "bytea": pg.BYTEA, "date": pg.DATE,
                  "time": pg.TIME, "timestamp": pg.TIMESTAMP, "interval": pg.INTERVAL,
                  "uuid": pg.UUID, "json": pg.JSON}  # fmt: skip
        if name == "timestamptz":
            return pg.TIMESTAMP(timezone=True)
        if name == "numeric":
            if typmod > 4:
                return pg.NUMERIC((typmod - 4) >> 16, (typmod - 4) & 0xFFFF)
            return pg.NUMERIC()
        return simple.get(name, pg.TEXT)()

    def get_pk_constraint(self, connection, table_name, schema=None, **kw):
        self._table(connection, table_name, schema)
        return {"name": None, "constrained_columns": []}

    def get_foreign_keys(self, connection, table_name, schema=None, **kw):
        self._table(connection, table_name, schema)
        return []

    def get_indexes(self, connection, table_name, schema=None, **kw):
        self._table(connection, table_name, schema)
        return []

    def get_unique_constraints(self, connection, table_name, schema=None, **kw):
        return []

    def get_check_constraints(self, connection, table_name, schema=None, **kw):
        return []

    def get_table_comment(self, connection, table_name, schema=None, **kw):
        return {"text": self._table(connection, table_name, schema).comment or None}

    def get_table_options(self, connection, table_name, schema=None, **kw):
        self._table(connection, table_name, schema)
        return {}

    def get_multi_table_options(self, connection, **kw):
        return default.DefaultDialect.get_multi_table_options(self, connection, **kw)

    def get_view_definition(self, connection, view_name, schema=None, **kw):
        return None

    def get_multi_columns(self, connection, **kw):
        return default.DefaultDialect.get_multi_columns(self, connection, **kw)

    def get_multi_pk_constraint(self, connection, **kw):
        return default.DefaultDialect.get_multi_pk_constraint(self, connection, **kw)

    def get_multi_foreign_keys(self, connection, **kw):
        return default.DefaultDialect.get_multi_foreign_keys(self, connection, **kw)

    def get_multi_indexes(self, connection, **kw):
        return default.DefaultDialect.get_multi_indexes(self, connection, **kw)

    def get_multi_unique_constraints(self, connection, **kw):
        return default.DefaultDialect.get_multi_unique_constraints(self, connection, **kw)

    def get_multi_check_constraints(self, connection, **kw):
        return default.DefaultDialect.get_multi_check_constraints(self, connection, **kw)

    def get_multi_table_comment(self, connection, **kw):
        return default.DefaultDialect.get_multi_table_comment(self, connection, **kw)
