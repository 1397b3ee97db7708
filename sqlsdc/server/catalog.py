"""Catalog and session statements of a server session, answered without the guard.

The server calls :meth:`SessionCatalog.answer` with every statement first:

- session statements (``SET``, ``SHOW``, ``BEGIN``/``COMMIT``/``ROLLBACK``, ``SAVEPOINT``,
  ``DISCARD``, ``RESET``, ``DEALLOCATE``, ``UNLISTEN``) are answered from a per-session dict
  of settings; a setting is a string kept here and echoed by ``SHOW``, never passed to an
  engine;
- catalog queries (every table they read is in ``pg_catalog`` or ``information_schema``, or
  they read no table and call only catalog functions, as ``SELECT version()``) run in the
  session's shadow catalog (:mod:`sqlsdc.server.shadow`), an in-memory database that holds the
  catalog of what the user may see (:mod:`sqlsdc.server.visible`) and no data;
- anything else returns None: the server sends it to the guard.

Deciding is done on the statement's parse tree (sqlglot), failing closed: a statement that
reads catalog and data tables together, a catalog table the shadow does not offer (``pg_stats``,
``pg_stat_activity`` …), a table function, or a function outside :data:`FUNCTIONS` is refused
with :class:`~sqlsdc.errors.PolicyViolation`. Even a refused check could not reach data: the
shadow database has none and cannot open files (it is hardened like the guard's engine).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.dialects.postgres import Postgres
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from sqlsdc.engines import duckdb as engine
from sqlsdc.errors import AccessDenied, NotSupportedError, PolicyViolation, ProgrammingError
from sqlsdc.guard.parse import too_complex
from sqlsdc.server import shadow
from sqlsdc.server.limits import MAX_SETTINGS, MAX_SETTINGS_CHARACTERS
from sqlsdc.server.pg_dialect import CatalogPostgres
from sqlsdc.server.quoted_literals import quoted_literals
from sqlsdc.server.sqlstate import StatementError
from sqlsdc.server.textcache import text_cache
from sqlsdc.server.visible import visible_tables

CATALOG_TIMEOUT = 10.0  # seconds; catalog queries read a few small tables
MAX_CATALOG_ROWS = 100_000  # rows of one catalog answer; more is refused (server memory)
MAX_CATALOG_BYTES = 16 * 2**20  # bytes of one catalog answer (a catalog has a few hundred KB)
MAX_CATALOG_CHARACTERS = 65_536  # a longer statement is the guard's to judge (and refuse):
# clients' catalog queries are a few KB, and neither parsing nor DuckDB's planning of a long
# one heeds CATALOG_TIMEOUT (100,000 ORs over pg_class held a worker for 430 s)
CATALOG_SCHEMAS = {"pg_catalog": "pgc", "information_schema": "isc"}
INFORMATION_SCHEMA_VIEWS = frozenset({
    "schemata", "tables", "views", "columns", "table_constraints", "key_column_usage",
    "referential_constraints", "constraint_column_usage", "routines", "sequences",
})  # fmt: skip

FUNCTIONS = shadow.MACROS | {
    # plain SQL: operators, conditionals, strings, arrays and aggregates over catalog rows
    "and", "or", "not", "cast", "trycast", "array", "case", "if", "coalesce", "nullif",
    "greatest", "least", "lower", "upper", "length", "concat", "concatws", "substring",
    "trim", "left", "right", "strposition", "splitpart", "initcap",
    "regexplike", "regexpilike", "startswith", "abs", "round", "floor", "ceil", "count", "sum",
    "min", "max", "avg", "arrayagg", "arrayposition", "arraytostring", "arraysize",
    "arraycontains", "stringtoarray", "groupconcat", "logicaland", "logicalor", "unnest",
    "explode", "generate_subscripts", "json_object", "row_number", "rank", "denserank",
    "any", "all", "exists", "in", "tostring", "lag", "lead", "firstvalue", "chr", "ascii",
    "collate", "array_to_string", "explodinggenerateseries", "string_agg", "generate_series",
    "generateseries", "json_build_object", "currentversion", "currentschema", "currentdatabase",
    "currentcatalog", "currentuser", "sessionuser", "rownumber",
}  # fmt: skip
"""Functions a catalog query may call (sqlglot's names of known functions, lowercase, or the
name of an unknown one): the shadow's macros and plain SQL. Everything else is refused, so
DuckDB's table functions, file readers and ``duckdb_*`` functions are never reached. None of
them makes a string much longer than its arguments: ``lpad``/``rpad``/``repeat`` (a length
argument) and ``replace`` (nested, it multiplies) are left out, as the guard leaves them out,
because one call runs to its end without checking the catalog's timeout: ``lpad('x',
2000000000)`` held a worker for 37 s and 2 GB (tests/security/test_redteam_s30.py)."""

DEFAULT_SETTINGS = {
    "server_version": shadow.SERVER_VERSION,
    "server_version_num": "150000",
    "server_encoding": "UTF8",
    "client_encoding": "UTF8",
    "standard_conforming_strings": "on",
    "DateStyle": "ISO, MDY",
    "IntervalStyle": "postgres",
    "TimeZone": "UTC",
    "integer_datetimes": "on",
    "search_path": '"$user", public',
    "transaction_isolation": "read committed",
    "default_transaction_isolation": "read committed",
    "transaction_read_only": "on",
    "default_transaction_read_only": "on",
    "max_identifier_length": "63",
    "max_index_keys": "32",
    "application_name": "",
    "extra_float_digits": "1",
    "is_superuser": "off",
    "lc_collate": "C",
    "lc_ctype": "C",
    "bytea_output": "hex",
    "statement_timeout": "0",
    "jit": "off",  # asyncpg reads it (and sets it off) before it introspects a type
}
_FIXED = {"server_version", "server_version_num", "server_encoding", "is_superuser",
          "integer_datetimes", "max_identifier_length", "max_index_keys", "lc_collate", "lc_ctype",
          "session_authorization", "transaction_read_only"}  # fmt: skip
_IDENTITY = {
    "role": "ROLE",
    "authorization": "SESSION AUTHORIZATION",
}  # SET ROLE x, SET SESSION AUTHORIZATION x: refused, as
# answering SET (and SHOW role: x) would tell a client it acts as x while it still acts as itself
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_COMMENTS = re.compile(r"\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/)*", re.S)
_TRANSACTION_TAGS = {
    "BEGIN": "BEGIN", "START": "BEGIN", "COMMIT": "COMMIT", "END": "COMMIT",
    "ROLLBACK": "ROLLBACK", "ABORT": "ROLLBACK", "SAVEPOINT": "SAVEPOINT",
    "RELEASE": "RELEASE", "UNLISTEN": "UNLISTEN",
}  # fmt: skip


_SESSION_KEYWORDS = {"SET", "SHOW", "RESET", "DISCARD", "DEALLOCATE", "LISTEN", "NOTIFY",
                     *_TRANSACTION_TAGS}  # fmt: skip


BUDGET_SETTING = "sqlsdc.budget"  # SHOW sqlsdc.budget: the session user's budgets
_KINDS = ("epsilon", "rho", "delta")
_PARTS = ("limit", "spent", "remaining")


def _budget_row(status) -> dict[str, str | None]:
    """One budget's row of ``SHOW sqlsdc.budget``: user, table and each kind's limit, spent
    and remaining as exact text (:func:`~sqlsdc.mechanisms.accountant.exact_text`)."""
    from sqlsdc.mechanisms.accountant import exact_text

    row: dict[str, str | None] = {"user": status.key.user, "table": status.key.table}
    for kind in _KINDS:
        for part, amounts in zip(
            _PARTS, (status.limit, status.spent, status.remaining), strict=True
        ):
            value = getattr(amounts, kind)
            row[f"{kind}_{part}"] = None if value is None else exact_text(value)
    return row


def _session_user(node: exp.Expr, user: str) -> exp.Expr:
    """``current_user`` or ``session_user`` as the session's user name; an output of its own
    named as PostgreSQL names it (the literal alone made psql's column ``'alice'``)."""
    literal = exp.Literal.string(user)
    if not (isinstance(node.parent, exp.Select) and node.arg_key == "expressions"):
        return literal
    session = isinstance(node, exp.SessionUser) or (
        isinstance(node, exp.Column) and node.name.lower() == "session_user"
    )
    return exp.alias_(literal, "session_user" if session else "current_user")


def _one_statement(text: str) -> str:
    """The session statement ``text`` without the semicolons and comments after it.

    A session statement followed by another (``BEGIN; SELECT ...``) is refused, as the guard
    refuses two queries: answering the first alone would drop the others without a word.

    Raises:
        PolicyViolation: more than one statement (or one the tokenizer cannot read).
    """
    try:
        tokens = Postgres.Tokenizer().tokenize(text)
    except TokenError:
        tokens = None
    kinds = [t.token_type for t in tokens or ()]
    first = kinds.index(TokenType.SEMICOLON) if TokenType.SEMICOLON in kinds else len(kinds)
    if tokens is None or any(kind is not TokenType.SEMICOLON for kind in kinds[first:]):
        raise PolicyViolation(
            "several statements were sent; exactly one is allowed",
            "send one statement per call",
            text,
        )
    return text[: tokens[first - 1].end + 1] if first else text


@dataclass(frozen=True)
class CatalogAnswer:
    """What the server sends back: rows (None for a command without rows) and the command tag
    of its CommandComplete message (``SET``, ``BEGIN``, ``SHOW``, ``SELECT 3`` …)."""

    table: pa.Table | None
    tag: str


class SessionCatalog:
    """The catalog and session settings of one server session of a guarded connection.

    Example:
        >>> con = sqlsdc.connect("demo.duckdb", user="analyst")  # doctest: +SKIP
        >>> catalog = SessionCatalog(con)  # doctest: +SKIP
        >>> catalog.answer("SHOW server_version").table.to_pylist()  # doctest: +SKIP
        [{'server_version': '15.0'}]
    """

    def __init__(self, connection):
        self._connection = connection
        self._settings = dict(DEFAULT_SETTINGS, session_authorization=connection.user)
        self._shadow = None  # built on the first catalog query, from the policy then in force

    def answer(self, sql: str, params: tuple | None = None) -> CatalogAnswer | None:
        """The answer to a catalog or session statement, or None for any other statement.

        Raises:
            PolicyViolation: a catalog statement that reaches beyond the catalog (see module).
            NotSupportedError: ``LISTEN``/``NOTIFY`` (sessions have no notifications).
        """
        text = _COMMENTS.sub("", sql).strip().rstrip(";").strip()
        if not text:
            return None
        keyword = text.split(None, 1)[0].upper()
        if keyword in _SESSION_KEYWORDS:
            text = _one_statement(text)
        if keyword == "SET":
            return self._set(text)
        if keyword == "SHOW":
            return self._show(text)
        if keyword == "RESET":
            return self._reset(text)
        if keyword in {"DISCARD"}:
            self._settings = dict(DEFAULT_SETTINGS, session_authorization=self._connection.user)
            self._refresh_settings()
            return CatalogAnswer(None, "DISCARD ALL")
        if keyword == "DEALLOCATE":
            return CatalogAnswer(None, "DEALLOCATE ALL" if text.upper().endswith(" ALL")
                                 else "DEALLOCATE")  # fmt: skip
        if keyword in {"LISTEN", "NOTIFY"}:
            raise NotSupportedError(f"{keyword} is not supported: sqlsdc sessions have no "
                                    "notifications")  # fmt: skip
        if keyword in _TRANSACTION_TAGS:
            return CatalogAnswer(None, _TRANSACTION_TAGS[keyword])
        quoted = quoted_literals(text, params)  # asyncpg's copy_from_query with arguments
        if quoted is not None:
            return CatalogAnswer(quoted, "SELECT 1")
        return self._query(text, params)

    # --- session settings --------------------------------------------------------------

    def _set(self, text: str) -> CatalogAnswer:
        rest = re.sub(r"(?i)^SET\s+(SESSION\s+|LOCAL\s+)?", "", text).strip()
        upper = rest.upper()
        if upper.startswith(("TRANSACTION", "SESSION CHARACTERISTICS")):
            return CatalogAnswer(None, "SET")  # sessions are read-only; levels change nothing
        if upper.startswith("TIME ZONE"):
            name, value = "TimeZone", rest[len("TIME ZONE") :]
        elif upper.startswith("NAMES"):
            name, value = "client_encoding", rest[len("NAMES") :]
        else:
            match = re.match(r"([A-Za-z_][A-Za-z0-9_.]*)\s*(?:=|\s+TO\s+|\s+)(.*)\Z", rest,
                             re.I | re.S)  # fmt: skip
            if match is None:
                raise ProgrammingError(f"cannot read the SET statement {text[:80]!r}; write "
                                       "SET name TO value")  # fmt: skip
            name, value = match[1], match[2]
        name = self._known_name(name)
        if name.lower() in _FIXED:
            raise ProgrammingError(f"parameter {name!r} cannot be changed")
        value = value.strip()
        if name.lower() in _IDENTITY and _unquote(value).upper() not in {"NONE", "DEFAULT"}:
            raise AccessDenied(
                f"a session runs as the user who logged in ({self._connection.user}); "
                f"SET {_IDENTITY[name.lower()]} cannot change it: log in as another server user"
            )
        if value.upper() in {"DEFAULT", "LOCAL"} or not value:
            value = DEFAULT_SETTINGS.get(name, "")
        else:
            value = ", ".join(_unquote(p.strip()) for p in _split_values(value))
        self._settings = _within_limits({**self._settings, name: value})
        self._refresh_settings()
        return CatalogAnswer(None, "SET")

    def _show(self, text: str) -> CatalogAnswer:
        rest = text[len("SHOW") :].strip()
        if rest.upper() == "ALL":
            names = sorted(self._settings, key=str.lower)
            table = pa.table({"name": names, "setting": [self._settings[n] for n in names],
                              "description": [""] * len(names)})  # fmt: skip
            return CatalogAnswer(table, f"SELECT {len(names)}")
        if re.fullmatch(r"(?i)TRANSACTION\s+ISOLATION\s+LEVEL", rest):
            rest = "transaction_isolation"
        elif rest.upper() == "TIME ZONE":
            rest = "TimeZone"
        if not _NAME.fullmatch(rest.strip('"')):
            raise ProgrammingError(f"cannot read the SHOW statement {text[:80]!r}")
        name = self._known_name(rest.strip('"'))
        if name.lower() == BUDGET_SETTING:
            return self._budget()
        if name not in self._settings:
            raise ProgrammingError(f"unrecognized configuration parameter {name!r}")
        return CatalogAnswer(pa.table({name.lower(): [self._settings[name]]}), "SHOW")

    def _budget(self) -> CatalogAnswer:
        """``SHOW sqlsdc.budget``: the privacy budgets that apply to the session's user, one
        row each, as ``sqlsdc budget DB --for USER`` lists them (exact amounts as text: 0.3,
        1/3; NULL where a row sets no limit). An analyst on psql or a BI tool had no way to
        see what remains before a query was refused for want of it (new user s39)."""
        rows = [_budget_row(s) for s in self._connection.remaining_budget()]
        columns = ("user", "table", *(f"{k}_{p}" for k in _KINDS for p in _PARTS))
        table = pa.table({c: pa.array([r[c] for r in rows], pa.string()) for c in columns})
        return CatalogAnswer(table, f"SELECT {len(rows)}")

    def _reset(self, text: str) -> CatalogAnswer:
        name = text[len("RESET") :].strip()
        if name.upper() == "ALL":
            self._settings = dict(DEFAULT_SETTINGS, session_authorization=self._connection.user)
        else:
            name = self._known_name(name)
            if name in DEFAULT_SETTINGS:
                self._settings[name] = DEFAULT_SETTINGS[name]
            else:
                self._settings.pop(name, None)
        self._refresh_settings()
        return CatalogAnswer(None, "RESET")

    def _known_name(self, name: str) -> str:
        """PostgreSQL's names are case-insensitive; keep the canonical spelling."""
        for known in self._settings:
            if known.lower() == name.lower():
                return known
        return name.lower()

    def _refresh_settings(self) -> None:
        if self._shadow is not None:
            shadow.set_settings(self._shadow, self._settings)

    # --- catalog queries ----------------------------------------------------------------

    def _query(self, text: str, params) -> CatalogAnswer | None:
        tree = _catalog_tree(text)
        if tree is None:
            return None
        try:
            tree = _rewrite(tree.copy(), params, self._connection.user, text)
        except RecursionError:
            raise too_complex(text) from None
        try:
            rows = _run_capped(self._catalog(), tree.sql("duckdb"), text)
        except engine.EngineError:
            raise ProgrammingError(
                "this catalog query is not supported by sqlsdc's catalog (the engine's message "
                "is withheld); the catalog offers PostgreSQL's usual tables, views and functions"
            ) from None
        return CatalogAnswer(rows, f"SELECT {rows.num_rows}")

    def _catalog(self):
        if self._shadow is None:
            self._shadow = shadow.build(
                visible_tables(self._connection),
                user=self._connection.user,
                database=Path(self._connection.path).stem,
                settings=self._settings,
            )
        return self._shadow

    def close(self) -> None:
        if self._shadow is not None:
            self._shadow.close()
            self._shadow = None


def _catalog_tree(text: str) -> exp.Query | None:
    """The parse tree of a catalog query, or None for a statement that is the guard's.

    Decided on the text alone (never on parameters, the user or the policy), so a data query's
    decision is kept (:func:`_for_the_guard`): a dashboard's query is parsed here once, not at
    every execution. Catalog queries are parsed each time (they are rare, and their trees big).
    """
    return None if _for_the_guard(text) else _parse_catalog_query(text)


@text_cache
def _for_the_guard(text: str) -> bool:
    return _parse_catalog_query(text) is None


def _parse_catalog_query(text: str) -> exp.Query | None:
    """See :func:`_catalog_tree`.

    Raises:
        PolicyViolation: a catalog query that reaches beyond the catalog (see module).
    """
    if len(text) > MAX_CATALOG_CHARACTERS:
        return None  # the guard's: it refuses catalog tables, and long statements by length
    try:
        tree = sqlglot.parse_one(text, read=CatalogPostgres)
    except (ParseError, TokenError, ValueError, RecursionError):
        return None  # not for the catalog to judge: the guard refuses it with its reasons
    if not isinstance(tree, exp.Query):
        return None
    reads_catalog = _classify(tree, text)
    if reads_catalog is None:
        return None  # a data query: the guard's
    unknown = _unknown_functions(tree)
    if unknown:
        if not reads_catalog:
            return None  # e.g. SELECT random(): the guard decides
        raise PolicyViolation(
            f"function {sorted(unknown)[0]!r} is not available in catalog queries",
            "catalog queries may call PostgreSQL's catalog functions and plain SQL ones",
            text,
        )
    return tree


def _run_capped(shadow_db, sql: str, text: str) -> pa.Table:
    """The rows of a catalog query, read as a stream and refused beyond
    :data:`MAX_CATALOG_ROWS` rows or :data:`MAX_CATALOG_BYTES` bytes: a catalog has a few
    hundred rows, and ``generate_series`` or a cross join must not make a session's answer fill
    the server's memory (99,000 rows of 1,000 characters were 99 MB). Interrupted after
    :data:`CATALOG_TIMEOUT` seconds."""
    timer = threading.Timer(CATALOG_TIMEOUT, shadow_db.interrupt)
    timer.daemon = True
    timer.start()
    try:
        reader = shadow_db.sql(sql).to_arrow_reader(1024)
        batches, count, size = [], 0, 0
        for batch in reader:
            count, size = count + batch.num_rows, size + batch.nbytes
            if count > MAX_CATALOG_ROWS or size > MAX_CATALOG_BYTES:
                raise PolicyViolation(
                    f"a catalog query may return at most {MAX_CATALOG_ROWS} rows and "
                    f"{MAX_CATALOG_BYTES // 2**20} MB",
                    "filter the catalog query (WHERE, LIMIT)",
                    text,
                )
            batches.append(batch)
        return pa.Table.from_batches(batches, reader.schema)
    finally:
        timer.cancel()


def _classify(tree: exp.Query, sql: str) -> bool | None:
    """True: reads catalog tables only; False: reads no table; None: reads data tables only.
    Refuses a statement that reads both, and catalog tables the shadow does not have."""
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    catalog, data = [], []
    for table in tree.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            if _function_name(table.this) not in _ROW_FUNCTIONS:
                data.append(table)  # a table function: never answered here
            continue
        schema, name = table.db.lower(), table.name.lower()
        if table.args.get("catalog"):
            data.append(table)
        elif schema in CATALOG_SCHEMAS or (not schema and name in shadow.PG_TABLES):
            catalog.append(table)
        elif not schema and name in ctes:
            continue
        else:
            data.append(table)
    if catalog and data:
        raise PolicyViolation(
            "a statement may read the catalog (pg_catalog, information_schema) or data "
            "tables, not both",
            "send the catalog query and the data query separately",
            sql,
        )
    if data:
        return None
    for table in catalog:
        schema, name = table.db.lower() or "pg_catalog", table.name.lower()
        offered = shadow.PG_TABLES if schema == "pg_catalog" else INFORMATION_SCHEMA_VIEWS
        if name not in offered:
            raise PolicyViolation(
                f"{schema}.{name} is not part of sqlsdc's catalog",
                "statistics, activity and storage views are not shown; the catalog lists the "
                "tables and columns you may query",
                sql,
            )
    return bool(catalog)


_ROW_FUNCTIONS = frozenset(
    {"unnest", "explode", "generate_series", "generateseries", "explodinggenerateseries"}
)
"""Functions that may stand in a catalog query's FROM: they make rows of their arguments."""


def _function_name(node: exp.Expr) -> str:
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    return node.key.lower()


_INFORMATION_SCHEMA_FUNCTIONS = frozenset({("information_schema", "_pg_expandarray")})
"""Functions of PostgreSQL's ``information_schema`` that clients call (pgjdbc's metadata)."""


def _unknown_functions(tree: exp.Expr) -> set[str]:
    found = set()
    for node in tree.walk():
        if isinstance(node, exp.Func) and _function_name(node) not in FUNCTIONS:
            found.add(_function_name(node))
        elif isinstance(node, exp.Dot) and isinstance(node.expression, exp.Func):
            qualified = (node.this.name.lower(), _function_name(node.expression))
            if qualified[0] != "pg_catalog" and qualified not in _INFORMATION_SCHEMA_FUNCTIONS:
                found.add(f"{node.this.name}.{_function_name(node.expression)}")
    return found


def _rewrite(tree: exp.Expr, params, user: str, sql: str) -> exp.Expr:
    """The statement over the shadow's schemas, in DuckDB's SQL (mutates ``tree``, a copy)."""
    values = list(params or ())

    def transform(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.db.lower() in CATALOG_SCHEMAS:
            node.set("db", exp.to_identifier(CATALOG_SCHEMAS[node.db.lower()]))
            return node
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier):
            schema = node.db.lower() or "pg_catalog"
            if schema in CATALOG_SCHEMAS and (node.db or node.name.lower() in shadow.PG_TABLES):
                node.set("db", exp.to_identifier(CATALOG_SCHEMAS[schema]))
                node.set("this", exp.to_identifier(node.name.lower()))
            return node
        if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Func):
            return node.expression  # pg_catalog.f(...) -> f(...): the shadow's macro
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Func):
            node.set("db", None)  # FROM pg_catalog.unnest(...)
            return node
        if isinstance(node, (exp.Parameter, exp.Placeholder)):
            return _parameter(node, values, sql)
        if isinstance(node, (exp.CurrentUser, exp.SessionUser)) or (
            isinstance(node, exp.Column)
            and node.name.lower() in {"current_user", "session_user"}
            and not node.table
        ):
            return _session_user(node, user)
        if isinstance(node, exp.CurrentCatalog):  # pgjdbc's getCatalog: the database's name
            return exp.Anonymous(this="current_database", expressions=[])
        if isinstance(node, exp.Collate):
            return node.this
        if isinstance(node, exp.Operator):
            return _operator(node, sql)
        if isinstance(node, exp.Anonymous) and node.name.lower() == "json_build_object":
            return exp.Anonymous(this="json_object", expressions=node.expressions)
        if isinstance(node, exp.Cast):
            return _cast(node, sql)
        return node

    for node in reversed(list(tree.walk(bfs=False))):  # children before their parents
        replacement = transform(node)
        if replacement is not node:
            if node is tree:
                tree = replacement
            else:
                node.replace(replacement)
    return tree


def _parameter(node: exp.Expr, values: list, sql: str) -> exp.Expr:
    if isinstance(node, exp.Placeholder) and not node.name.isdigit():
        raise ProgrammingError("catalog queries take $1-style parameters")
    number = int(node.name) if node.name.isdigit() else int(node.this.name)
    if not 1 <= number <= len(values):
        raise ProgrammingError(f"parameter ${number} has no value ({len(values)} given)")
    return _literal(values[number - 1])


def _literal(value) -> exp.Expr:
    """A parameter's value as a literal; a list (an array parameter, asyncpg's ``oid[]`` of
    its type introspection) as an array of them."""
    if type(value) in (list, tuple):
        return exp.Array(expressions=[_literal(v) for v in value])
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, (int, float)):
        return exp.Literal.number(value)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return exp.Literal.string(str(value))


def _operator(node: exp.Operator, sql: str) -> exp.Expr:
    symbol = node.args["operator"].split(".")[-1].strip()
    left, right = node.this, node.expression
    forms = {
        "~": lambda: exp.RegexpLike(this=left, expression=right),
        "~*": lambda: exp.RegexpILike(this=left, expression=right),
        "!~": lambda: exp.Not(this=exp.RegexpLike(this=left, expression=right)),
        "!~*": lambda: exp.Not(this=exp.RegexpILike(this=left, expression=right)),
        "=": lambda: exp.EQ(this=left, expression=right),
        "<>": lambda: exp.NEQ(this=left, expression=right),
    }
    if symbol not in forms:
        raise PolicyViolation(f"operator {symbol!r} is not available in catalog queries", "", sql)
    return forms[symbol]()


_TEXT_TYPES = {"text", "name", "varchar", "char", "bpchar", "character varying", "regproc",
               "regprocedure", "regnamespace", "regrole"}  # fmt: skip
_INTEGER_TYPES = {"oid", "int2", "int4", "int8", "smallint", "integer", "bigint", "xid", "int"}


def _cast(node: exp.Cast, sql: str) -> exp.Expr:
    """Casts to PostgreSQL's object-identifier and catalog types, in the shadow's terms."""
    target = node.to.sql("postgres").lower().replace("pg_catalog.", "").strip('"')
    value = node.this
    literal = isinstance(value, exp.Literal) and value.is_string
    if target == "regclass":
        return exp.Anonymous(this="sdc_regclass", expressions=[value]) if literal else \
            exp.cast(value, "BIGINT")  # fmt: skip
    if target == "regtype":
        return exp.Anonymous(this="to_regtype", expressions=[value]) if literal else \
            exp.Anonymous(this="sdc_regtype_name", expressions=[value])  # fmt: skip
    if target in _TEXT_TYPES:
        return exp.cast(value, "VARCHAR")
    if target in _INTEGER_TYPES:
        return exp.cast(value, "BIGINT")
    if target in {"int2vector", "oidvector", "int2[]", "oid[]", "_int2", "_oid"}:
        return exp.cast(value, "BIGINT[]")
    if node.to.this is exp.DataType.Type.USERDEFINED or isinstance(node.to, exp.ObjectIdentifier):
        raise PolicyViolation(f"type {target!r} is not available in catalog queries", "", sql)
    return node


def _within_limits(settings: dict[str, str]) -> dict[str, str]:
    """``settings`` if a session may keep them: at most :data:`MAX_SETTINGS` names and
    :data:`MAX_SETTINGS_CHARACTERS` characters of names and values. The settings live as long
    as the session, in the server every user shares: without a bound one analyst's SETs of new
    names took the server's memory (red team s43f: 250 SETs of 2 MB values, 590 MB)."""
    characters = sum(len(name) + len(value) for name, value in settings.items())
    if len(settings) > MAX_SETTINGS or characters > MAX_SETTINGS_CHARACTERS:
        raise StatementError("53400", f"a session keeps at most {MAX_SETTINGS} settings of "
                             f"{MAX_SETTINGS_CHARACTERS:,} characters in all (names and "
                             "values); this SET would keep more",
                             "RESET the settings you no longer need, or set a shorter "
                             "value")  # fmt: skip
    return settings


def _split_values(value: str) -> list[str]:
    """A SET value list (``a, 'b c'``) split at commas outside quotes."""
    return re.findall(r"""(?:'(?:[^']|'')*'|"[^"]*"|[^,])+""", value) or [value]


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("''", "'")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value
