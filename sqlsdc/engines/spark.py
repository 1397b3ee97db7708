"""The Spark engine: the protected sqlglot tree runs on PySpark and returns DuckDB's answers.

ARCHITECTURE.md §7: the rewriter emits one engine-neutral tree; DuckDB runs it embedded, Spark
runs it at scale. :mod:`sqlsdc.engines.spark_translate` turns the tree into Spark SQL that
computes DuckDB's values (or refuses it); this module holds the session and the tables: it pins
the session settings that change values, registers the views the SQL reads (DuckDB tables
copied through Parquet, with their DuckDB types and data versions), runs the SQL and types the
answer as DuckDB does.

Integer overflow raises in both engines only under Spark's ANSI mode, so :class:`SparkEngine`
turns it on and refuses to run if it was turned off. The hardened DuckDB reads times in UTC
(``SET GLOBAL TimeZone = 'UTC'``); Spark in its session time zone, so that ``tz >= '2024-01-01'``
over a TIMESTAMP WITH TIME ZONE column counted other rows under one cell identity (red team
s36e) → the engine sets the session time zone to UTC and refuses to run if it was changed;
likewise Parquet dates are read without Julian rebasing (a LEGACY session moved 1582-10-04 to
1582-09-24, its hash, and the groups units kept). Every setting of :data:`SESSION` is pinned so
(decimal products keep DuckDB's digits, ordinals, case, literals, legacy meanings), and a
session that sets any other ``spark.sql.legacy.*`` is refused. Spark's variable substitution
is turned off: on by default, it replaced ``${env:NAME}``, ``${system:name}`` and
``${sparkconf:key}`` anywhere in the SQL text, inside string literals too, so an analyst's
``SELECT '${env:AWS_SECRET_ACCESS_KEY}' AS x, COUNT(*) FROM persons`` was answered with the
server's secret on Spark (the literal itself on DuckDB; red team s49h). A column of a
collated string type (``string collate UTF8_LCASE``) is refused when registered: Spark groups by
the collation.
Floating-point SUM and AVG over rows depend on the order of additions, in Spark as in a
multi-threaded DuckDB: they agree to about 1e-15 relative, not bit for bit (the one difference
``tests/spark_differential.py`` still finds). Counts, integer and decimal sums and averages,
cell keys (``SUM(__rkey) % 4294967296``), thresholds, NULLs and DP's exact cells are exact.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse
from urllib.request import url2pathname

import pyarrow as pa
from sqlglot import exp

from sqlsdc.engines.spark_cap import MARKER, capped
from sqlsdc.engines.spark_portable import HASH_UDF, check_duckdb_tree
from sqlsdc.engines.spark_translate import read_as_duckdb, tables_of, translate, view_name
from sqlsdc.engines.spark_types import DIALECT
from sqlsdc.errors import (
    AnswerTooLarge,
    Error,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
)

if TYPE_CHECKING:
    import duckdb
    from pyspark.sql import DataFrame, SparkSession

INSTALL_HINT = 'install it with: pip install "sqlsdc[spark]"'
ANSI = "spark.sql.ansi.enabled"
TIME_ZONE = "spark.sql.session.timeZone"
REBASE = "spark.sql.parquet.datetimeRebaseModeInRead"
SESSION = {
    ANSI: ("true", "Spark would wrap integer overflow where DuckDB raises"),
    TIME_ZONE: ("UTC", "Spark would read times and compare TIMESTAMP WITH TIME ZONE values "
                       "with text in another time zone than DuckDB's UTC"),
    REBASE: ("CORRECTED", "Spark would shift dates and times before 1582 of the Parquet "
                          "copies, which DuckDB writes in the proleptic Gregorian calendar"),
    "spark.sql.parquet.int96RebaseModeInRead": (
        "CORRECTED", "Spark would shift INT96 times before 1900 of Parquet files"),
    "spark.sql.parquet.inferTimestampNTZ.enabled": (
        "true", "Spark would read DuckDB's TIMESTAMP (without time zone) as an instant"),
    "spark.sql.decimalOperations.allowPrecisionLoss": (
        "false", "Spark would round a product of decimals to fewer digits than DuckDB keeps "
                 "(DECIMAL(20, 5) * DECIMAL(20, 5): 7 digits instead of 10)"),
    "spark.sql.legacy.exponentLiteralAsDecimal.enabled": (
        "false", "Spark would read 5.0e-01 as a DECIMAL, DuckDB reads a DOUBLE"),
    "spark.sql.legacy.literal.pickMinimumPrecision": (
        "true", "Spark would type integer literals in decimal arithmetic otherwise"),
    "spark.sql.caseSensitive": (
        "false", "Spark would tell column names apart by case, which DuckDB does not"),
    "spark.sql.groupByOrdinal": ("true", "GROUP BY 1 would group by the constant 1"),
    "spark.sql.orderByOrdinal": (
        "true", "ORDER BY 1 would sort by the constant 1 (and LIMIT keep other rows)"),
    "spark.sql.groupByAliases": ("true", "GROUP BY would not read the select list's aliases"),
    "spark.sql.ansi.doubleQuotedIdentifiers": ("false", "Spark would parse text otherwise"),
    "spark.sql.ansi.relationPrecedence": (
        "false", "Spark would bind JOIN and comma joins in another order"),
    "spark.sql.legacy.statisticalAggregate": (
        "false", "STDDEV of one value would be NaN on Spark, NULL on DuckDB"),
    "spark.sql.legacy.ctePrecedencePolicy": (
        "CORRECTED", "an inner WITH would not take precedence over an outer one of its name"),
    "spark.sql.legacy.scalarSubqueryCountBugBehavior": (
        "false", "a correlated COUNT subquery over no rows would be NULL instead of 0"),
    "spark.sql.legacy.duplicateBetweenInput": ("false", "BETWEEN would read its input twice"),
    "spark.sql.legacy.integerGroupingId": ("false", "GROUPING_ID would be an INT"),
    "spark.sql.legacy.setopsPrecedence.enabled": (
        "false", "INTERSECT would bind as UNION and EXCEPT, left to right"),
    "spark.sql.legacy.allowNegativeScaleOfDecimal": (
        "false", "decimal literals such as 1E10 would have a negative scale"),
    "spark.sql.legacy.decimal.retainFractionDigitsOnTruncate": (
        "false", "decimals cast to fewer digits would keep other digits"),
    "spark.sql.mapKeyDedupPolicy": ("EXCEPTION", "a map of repeated keys would keep the last"),
    "spark.sql.parser.escapedStringLiterals": (
        "false", "Spark would keep the backslashes the translation doubles for it ('a\\\\b' "
                 "for DuckDB's 'a\\b'), and compare other text (red team s49h)"),
    "spark.sql.variable.substitute": (
        "false", "Spark would replace ${env:NAME}, ${system:name} and ${sparkconf:key} in the "
                 "SQL text, string literals included, by the server's environment, JVM "
                 "properties and settings: an analyst's SELECT '${env:NAME}' read them "
                 "(red team s49h)"),
}  # fmt: skip
"""The session settings every :class:`SparkEngine` sets and checks before it translates or runs
a tree: its value and why another value would compute other cells than DuckDB. Every other
``spark.sql.legacy.*`` setting must keep its default (:data:`LEGACY`)."""
LEGACY = "spark.sql.legacy."
"""The prefix of Spark's settings that bring back older meanings of SQL: one set in the session
to anything but its default refuses the session, as it may change a cell (Spark 4.3 has about
a hundred)."""


# --- results -----------------------------------------------------------------------------------


def normalise_types(table: pa.Table) -> pa.Table:
    """Arrow types on which DuckDB and Spark results agree, so that equal results compare equal.

    Integers → int64 (UBIGINT → float64, as Spark reads it as DECIMAL(20, 0)); decimals and
    floats → float64 (DuckDB's HUGEINT sums arrive as decimal128(38, 0), Spark's as decimals
    too); large strings → string; every column nullable (Spark marks some NOT NULL). Values are
    kept, except decimals beyond 2^53, which become the nearest double on both sides alike.
    """
    fields = []
    for field in table.schema:
        kind = field.type
        if pa.types.is_uint64(kind) or pa.types.is_decimal(kind) or pa.types.is_floating(kind):
            kind = pa.float64()
        elif pa.types.is_integer(kind):
            kind = pa.int64()
        elif pa.types.is_large_string(kind):
            kind = pa.string()
        fields.append(field.with_type(kind).with_nullable(True))
    return table.cast(pa.schema(fields))


def as_types(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Spark's answer ``table`` in the types of ``schema`` (DuckDB's types of the same tree,
    :func:`sqlsdc.engines.duckdb.result_schema`), value for value: integers and decimals are
    cast only where no digit is lost (DuckDB's DECIMAL(38, 2) sum holds Spark's DECIMAL(20, 2)
    sum), text and booleans as they are. A column Spark computed in another kind of number
    (a DOUBLE where DuckDB has a DECIMAL, or the reverse) or whose values do not fit is
    refused: its values could differ in the last digits.

    Raises:
        OperationalError: a column cannot take DuckDB's type exactly.
    """
    if table.num_columns != len(schema):
        raise OperationalError(
            f"Spark returned {table.num_columns} columns, DuckDB types {len(schema)}"
        )
    columns = []
    for column, have, want in zip(table.columns, table.schema, schema, strict=True):
        if have.type != want.type:
            if _kind(have.type) != _kind(want.type):
                raise OperationalError(
                    f"Spark computed {want.name} as {have.type} where DuckDB computes "
                    f"{want.type}: its values could differ; run this query on DuckDB"
                )
            try:
                column = column.cast(want.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise OperationalError(
                    f"Spark's {want.name} does not fit DuckDB's {want.type}; run this query "
                    "on DuckDB"
                ) from None
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema.with_metadata(None))


def _kind(kind: pa.DataType) -> str:
    """The kind of Arrow type whose values :func:`as_types` casts exactly within it."""
    if pa.types.is_integer(kind) or pa.types.is_decimal(kind):
        return "exact number"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "text"
    if pa.types.is_timestamp(kind):
        return f"timestamp {kind.unit} {'instant' if kind.tz else 'local'}"
    return str(kind)


# --- the engine --------------------------------------------------------------------------------


def _require_pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise NotSupportedError(f"the Spark engine needs PySpark; {INSTALL_HINT}") from None


def _schema_of(name: str, frame: DataFrame) -> dict[str, str]:
    """``{column: Spark type}`` of a frame registered as ``name``; a collated string column is
    refused: Spark would compare and group its text by the collation, DuckDB by the bytes."""
    for f in frame.schema:
        if "collate" in f.dataType.simpleString().lower():
            raise NotSupportedError(
                f"{name}.{f.name} is {f.dataType.simpleString()}: Spark would compare and "
                "group its text by that collation, DuckDB by the bytes; register it as "
                "a plain string"
            )
    return {f.name.lower(): f.dataType.simpleString() for f in frame.schema}


def _register_hash(session: SparkSession) -> None:
    """Register :data:`HASH_UDF` on ``session``. Its module is shipped to Spark's Python
    workers by value, so they need numpy and pyarrow (as every Arrow UDF does), not sqlsdc.

    Registered again before every tree that hashes (:meth:`SparkEngine.run_exact`, 20-60 ms):
    a function registered under its name in the session since (a constant, say) kept every
    group of every unit, and the DP cells, under the identity and noise of DuckDB's capped
    ones, differed from them by exactly the rows the caps drop (red team s40c)."""
    from pyspark import cloudpickle
    from pyspark.sql.functions import arrow_udf

    from sqlsdc.engines import duckdb_hash

    cloudpickle.register_pickle_by_value(duckdb_hash)
    session.udf.register(HASH_UDF, arrow_udf(duckdb_hash.hash_struct, "decimal(20,0)"))


def _capped(frame: DataFrame, max_rows: int | None, max_bytes: int | None) -> DataFrame:
    """``frame`` cut to ``max_rows`` + 1 rows, and raising in Spark's Python worker once its
    Arrow batches pass ``max_bytes`` (:func:`~sqlsdc.engines.spark_cap.capped`), so the driver
    never holds more than the caps. After ``limit`` the rows are one partition in the answer's
    order (``coalesce(1)`` without one), so the bytes are counted over the whole answer."""
    if max_rows is not None:
        frame = frame.limit(max_rows + 1)
    if max_bytes is None:
        return frame
    from pyspark import cloudpickle

    from sqlsdc.engines import spark_cap

    cloudpickle.register_pickle_by_value(spark_cap)
    single = frame if max_rows is not None else frame.coalesce(1)
    names = frame.columns  # an answer may repeat a name, which mapInArrow refuses
    single = single.toDF(*(f"_{i}" for i in range(len(names))))
    return single.mapInArrow(capped(max_bytes), single.schema).toDF(*names)


class SparkEngine:
    """Runs protected trees on a SparkSession; results are Arrow tables typed as by
    :func:`normalise_types`, equal to DuckDB's for the same data.

    The engine turns on ANSI mode for the session (``spark.sql.ansi.enabled=true``, Spark 4's
    default): without it Spark wraps integer overflow silently where DuckDB raises, and a
    wrapped cell key would pick the wrong noise. It sets the session time zone to UTC, DuckDB's,
    and reads Parquet dates as written (:data:`SESSION`). It refuses to run if one was changed.

    Example:
        >>> engine = SparkEngine(SparkSession.builder.getOrCreate())  # doctest: +SKIP
        >>> engine.register("persons", "s3://bucket/persons.parquet")  # doctest: +SKIP
        >>> engine.register("sqlsdc.ptable_entries", "s3://bucket/ptable.parquet")  # doctest: +SKIP
        >>> tree = con.explain("SELECT sex, COUNT(*) FROM persons GROUP BY sex")  # doctest: +SKIP
        >>> tree = tree.tree  # doctest: +SKIP
        >>> engine.run(tree)  # doctest: +SKIP

    Guarded queries run on Spark through :func:`sqlsdc.guard.spark.run_protected`, which audits
    them and records their cells in the ledger; :meth:`run` alone records nothing.
    """

    def __init__(self, session: SparkSession):
        _require_pyspark()
        self.session = session
        for setting, (value, _why) in SESSION.items():
            session.conf.set(setting, value)
        self.schemas: dict[str, dict[str, str]] = {}  # view -> {column: Spark type}
        self.data_versions: dict[str, str] = {}  # tables copied by load_duckdb: DuckDB version
        self._copies: dict[str, tuple] = {}  # their views: what load_duckdb left (_copy_state)
        self.duckdb_types: dict[str, dict[str, str]] = {}  # their views: {column: DuckDB type}
        self.summable: dict[tuple[str, str], bool] = {}  # sqlsdc.guard.summable's scans
        self._seen: dict[str, tuple | None] = {}  # view -> its _copy_state for both (refresh)
        self._folders: list[str] = []
        # held while a guarded answer registers its DP cells and runs over them: the cells'
        # view names are the same in every query (sqlsdc.guard.spark._answer)
        self.answering = threading.Lock()
        _register_hash(session)

    def register(self, name: str, source: DataFrame | str | Path) -> None:
        """Make table ``name`` (DuckDB name, e.g. ``persons`` or ``sqlsdc.ptable``) readable by
        protected trees, from a DataFrame of this session or a Parquet path."""
        is_path = isinstance(source, (str, Path))
        frame = self.session.read.parquet(str(source)) if is_path else source
        self._register_frame(name, frame)
        self.data_versions.pop(name.lower(), None)  # not (or no longer) a copy of a DuckDB table
        self._copies.pop(view_name(name), None)
        self.duckdb_types.pop(view_name(name), None)

    def refresh(self, tables: Iterable[str]) -> None:
        """Bring what the engine knows of the views of ``tables`` (DuckDB names) up to what
        they hold now, before a guarded query is checked: a view whose rows may have changed
        since its schema was read and its columns scanned for NaN and infinities
        (:mod:`sqlsdc.guard.summable`) has its schema read and its scans dropped.

        A view's rows are known by its plan's semantic hash and its files' sizes and
        modification times (:meth:`_copy_state`, what a DP data version is checked against;
        the DuckDB side keys its scans by its file's data writers). :meth:`register` was the
        only point where they were dropped, so a view replaced through the session
        (``createOrReplaceTempView``) or a Parquet copy rewritten kept the scan of the rows
        before: a NaN or infinity in the new rows passed, and a sum showed it in exactly the
        cells holding it.
        """
        for table in tables:
            view = view_name(table)
            if view not in self.schemas:
                continue  # not registered: sql() names it
            state = self._copy_state(view)
            if state is not None and view in self._seen and self._seen[view] == state:
                continue
            self.summable = {k: ok for k, ok in self.summable.items() if view_name(k[0]) != view}
            self._seen[view] = state
            if state is not None:  # (else Spark cannot read it: the query fails there)
                self.schemas[view] = _schema_of(table, self.session.table(view))

    def register_cells(self, name: str, cells: pa.Table) -> None:
        """Make a relation of released cells (the noisy DP cells a protected tree reads,
        aggregated values only) readable by protected trees.

        A TIMESTAMP key (no time zone) stays a TIMESTAMP_NTZ, as ``load_duckdb``'s copies
        read it: Spark's own reading of an Arrow table makes it an instant, and the answer's
        key came back ``timestamp[us, tz=UTC]``, which DuckDB's type refused after the charge
        (a DP query grouped by a private TIMESTAMP key paid and answered nothing on Spark;
        red team s49h)."""
        from pyspark.sql.pandas.types import from_arrow_schema

        schema = from_arrow_schema(cells.schema, prefer_timestamp_ntz=True)
        self._register_frame(name, self.session.createDataFrame(cells, schema=schema))

    def _register_frame(self, name: str, frame: DataFrame) -> None:
        view = view_name(name)
        schema = _schema_of(name, frame)
        frame.createOrReplaceTempView(view)
        self.schemas[view] = schema
        self._seen.pop(view, None)  # its scans were of other rows (refresh)

    def data_version(self, table: str) -> str:
        """The DuckDB data version (row count and hash, as the guarded connection computes it)
        of a table copied by :meth:`load_duckdb`: DP cells are named by it, so the same cells
        get the same noise on both engines and changed data gets fresh noise.

        The version is that of the copy :meth:`load_duckdb` made, and Spark reads whatever
        the view of that name holds when the tree runs: a view replaced since (the session's
        ``createOrReplaceTempView``) or a Parquet copy rewritten would release other rows
        under the copy's version, so under the noise of the DuckDB cells, and a Spark answer
        next to a DuckDB one (another analyst's) was the exact difference (red team s40c).
        The view must still be the copy: its plan's semantic hash and its files' sizes and
        modification times as :meth:`load_duckdb` left them.

        Raises:
            NotSupportedError: ``table`` was not copied from DuckDB by :meth:`load_duckdb`,
                or its view or copy changed since.
        """
        try:
            version = self.data_versions[table.lower()]
        except KeyError:
            raise NotSupportedError(
                f"differential privacy on Spark needs {table} copied with load_duckdb(): its "
                "cells are named by the data version of the DuckDB table they come from"
            ) from None
        view = view_name(table)
        state = self._copy_state(view)
        if state is None or state != self._copies.get(view):
            raise NotSupportedError(
                f"Spark's view of {table} is no longer the copy load_duckdb() made (the view "
                "was replaced or its Parquet copy changed): its cells would carry the noise "
                "of the DuckDB table's version over other rows; copy it again with load_duckdb()"
            )
        return version

    def _copy_state(self, view: str) -> tuple | None:
        """What identifies the rows of ``view``: its plan's semantic hash and the size and
        modification time of each file it reads (None when it cannot be read)."""
        from pyspark.errors import PySparkException

        try:
            frame = self.session.table(view)
            plan, files = frame.semanticHash(), sorted(frame.inputFiles())
            stats = [os.stat(Path(url2pathname(urlparse(f).path))) for f in files]
        except (PySparkException, OSError):
            return None
        return plan, tuple((f, s.st_size, s.st_mtime_ns) for f, s in zip(files, stats, strict=True))

    def load_duckdb(self, database: str | Path | duckdb.DuckDBPyConnection, tables: Iterable[str]):
        """Copy DuckDB tables (all columns, hidden ``__rkey`` included; ``sqlsdc.*`` too) into
        Spark through Parquet files in a temporary folder that :meth:`close` removes.

        ``database`` is a path, opened read-only with a plain connection (sqlsdc's hardened
        connections refuse file access), or a connection allowed to write files. HUGEINT columns
        are copied as DECIMAL(38, 0), which Parquet keeps exactly (DuckDB writes HUGEINT as
        DOUBLE).
        """
        import duckdb

        from sqlsdc.engines.duckdb import open_database
        from sqlsdc.engines.duckdb_schema import data_version

        folder = tempfile.mkdtemp(prefix="sqlsdc-spark-")
        self._folders.append(folder)
        own = isinstance(database, (str, Path))
        con = open_database(database, read_only=True) if own else database
        try:
            for name in tables:
                path = Path(folder) / f"{view_name(name)}.parquet"
                relation = con.table(name)
                exact = [
                    duckdb.ColumnExpression(c).cast(duckdb.sqltype("DECIMAL(38, 0)")).alias(c)
                    if str(t) in ("HUGEINT", "UHUGEINT")
                    else duckdb.ColumnExpression(c)
                    for c, t in zip(relation.columns, relation.types, strict=True)
                ]
                try:
                    relation.select(*exact).to_parquet(str(path))
                except duckdb.Error as e:
                    raise Error(
                        f"DuckDB could not write {name} to Parquet ({str(e).splitlines()[0]}); "
                        "pass the database path instead of a hardened sqlsdc connection"
                    ) from None
                self.register(name, path)
                self.duckdb_types[view_name(name)] = {
                    c.lower(): str(t) for c, t in zip(relation.columns, relation.types, strict=True)
                }
                if "." not in name:  # a data table (not sqlsdc.*): as Connection._data_version
                    self.data_versions[name.lower()] = data_version(con, name)
                    self._copies[view_name(name)] = self._copy_state(view_name(name))
        finally:
            if own:
                con.close()

    def _check_session(self) -> None:
        """Refuse a session whose :data:`SESSION` settings were changed since the engine set
        them: its cells would not be DuckDB's. Checked before a tree is translated, so a DP
        stage is refused before anything is charged."""
        for setting, (value, why) in SESSION.items():
            if str(self.session.conf.get(setting)).lower() != value.lower():
                raise NotSupportedError(f"{setting} was changed from {value}: {why}")
        legacy = sorted(k for k in self.session.conf.getAll if k.lower().startswith(LEGACY))
        unpinned = [k for k in legacy if k not in SESSION]
        if unpinned:
            raise NotSupportedError(
                f"the Spark session sets {', '.join(unpinned)}: a legacy meaning of SQL may "
                "compute other cells than DuckDB; unset it (spark.conf.unset) to run here"
            )

    def sql(self, tree: exp.Expr) -> str:
        """The Spark SQL for a protected tree, after every check (runs nothing)."""
        self._check_session()
        duckdb_tree = read_as_duckdb(tree)
        check_duckdb_tree(duckdb_tree)
        missing = sorted(t for t in tables_of(duckdb_tree) if view_name(t) not in self.schemas)
        if missing:
            raise ProgrammingError(
                f"table {', '.join(missing)} is not registered with the Spark engine; "
                "use register() or load_duckdb()"
            )
        return translate(duckdb_tree, self.schemas, self.duckdb_types).sql(dialect=DIALECT)

    def run(self, tree: exp.Expr) -> pa.Table:
        """Run a protected tree; the result has DuckDB's values, typed by normalise_types."""
        return normalise_types(self.run_exact(tree))

    def run_exact(
        self, tree: exp.Expr, max_rows: int | None = None, max_bytes: int | None = None
    ) -> pa.Table:
        """Run a protected tree; the result has DuckDB's values in Spark's Arrow types (exact
        decimals; :func:`as_types` gives them DuckDB's types).

        With ``max_rows`` at most that many rows plus one are collected to the driver (Spark's
        ``limit``), and an answer of more rows (or of more than ``max_bytes`` Arrow bytes) is
        refused, as the DuckDB engine abandons its stream: a cross join of released cells (8e7
        rows from four copies of a 95-cell table) was collected whole into the driver, the
        process a server shares (red team s44k). The bytes are counted before the driver has
        them (:mod:`sqlsdc.engines.spark_cap`): checked after ``toArrow``, 1,001 rows of 64 KiB
        were 64 MiB in the driver before they were refused (s45i).

        Raises:
            AnswerTooLarge: the answer has more rows or bytes than allowed.
            OperationalError: Spark failed (its message withheld, for the audit log).
        """
        from pyspark.errors import PySparkException, PythonException

        sql = self.sql(tree)  # checks the session first
        if HASH_UDF in sql.lower():  # ours, whatever the session registered under its name since
            _register_hash(self.session)
        try:
            answer = _capped(self.session.sql(sql), max_rows, max_bytes).toArrow()
        except PySparkException as e:  # the message may quote confidential values: not shown
            if max_bytes is not None and isinstance(e, PythonException) and MARKER in str(e):
                raise AnswerTooLarge(
                    f"the answer has more than {max_bytes:,} bytes, the most a connection "
                    "returns: aggregate further, filter, or add a LIMIT"
                ) from None
            condition = e.getCondition() or type(e).__name__
            raise OperationalError(
                "the query failed on Spark; the engine's message is withheld",
                detail=f"{condition}: {e}",
            ) from None
        rows, size = answer.num_rows, answer.nbytes
        if rows > (max_rows or rows) or size > (max_bytes or size):
            limit = f"{max_rows:,} rows" if max_rows and rows > max_rows else f"{max_bytes:,} bytes"
            raise AnswerTooLarge(
                f"the answer has more than {limit}, the most a connection returns: "
                "aggregate further, filter, or add a LIMIT"
            )
        return answer

    def close(self) -> None:
        """Drop the views this engine registered and its Parquet copies; the session stays."""
        for view in self.schemas:
            self.session.catalog.dropTempView(view)
        self.schemas.clear()
        self.data_versions.clear()
        self._copies.clear()
        self.duckdb_types.clear()
        self.summable.clear()
        self._seen.clear()
        for folder in self._folders:
            shutil.rmtree(folder, ignore_errors=True)
        self._folders.clear()

    def __enter__(self) -> SparkEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
