"""Guarded queries on Spark: protected by the guard, run by the Spark engine, recorded like any
other release.

The DuckDB path (:mod:`sqlsdc.guard.connection`) audits every query and writes a ledger row per
released cell before it returns a result. A Spark query goes through the same steps with the
same records: the guarded connection protects the SQL (its policy, user and cache), the Spark
engine runs the protected tree (:mod:`sqlsdc.engines.spark`), and the result is returned only
after its ledger rows (:func:`sqlsdc.guard.postprocess.record_release`, the same cell identity
as on DuckDB) and its ``accepted`` audit entry are committed in one transaction of the
connection's catalog. Refusals (an answer past the row cap among them, as on DuckDB) are
audited ``refused``, Spark failures ``failed`` (with Spark's
message, for admins; the caller sees the condition name only).

Spark releases cells of the cell key method, of the threshold rule and of differential privacy.
For DP the exact bounded cells run on Spark, and the guarded connection charges the budget
before they run, draws the noise and records the cells, exactly as for DuckDB; the noisy cells
are then registered on Spark for the rest of the protected tree. The keyed choices of the
bounding (tables with several rows per unit, joins: a unit's groups and rows ranked by
DuckDB's ``hash(record key, keys, measures)``) run on Spark through the engine's UDF that
computes DuckDB's hash bit for bit (:mod:`sqlsdc.engines.duckdb_hash`), so they keep the same
groups and rows, and the same cells get the same noise and ledger rows; so do COUNT(DISTINCT
column)'s lists of distinct values and the bounding report. A DP stage whose SQL is not portable
(a hash of a type Spark's copy holds otherwise, an ENUM say; distinct DOUBLEs) is refused before
anything is charged. Every result (the stages' exact cells, the answer) is given in the types
DuckDB binds for the same SQL (:func:`~sqlsdc.engines.duckdb.result_schema`), exactly: decimal
sums keep every digit, private group keys have DuckDB's types. Suppression patterns are made
and kept fresh by the DuckDB engine, so suppression is refused here (and audited as refused).
Under the policy's cell limits an answer is charged the cells DuckDB's is: its ledger cells
and those it computes without showing them one by one (a HAVING, a LIMIT, a scalar subquery
beside the aggregate), counted on the DuckDB file Spark's copy came from, with the noisy DP
cells registered there (:mod:`sqlsdc.guard.hidden_cells`; such statements were refused on
Spark, a DP scalar subquery's after its charge, s50h).

Example:
    >>> engine = SparkEngine(SparkSession.builder.getOrCreate())  # doctest: +SKIP
    >>> engine.load_duckdb("demo.duckdb", ["persons", "sqlsdc.ptable_entries"])  # doctest: +SKIP
    >>> con = sqlsdc.connect("demo.duckdb", "analyst")  # doctest: +SKIP
    >>> run_protected(con, engine, "SELECT COUNT(*) FROM persons")  # doctest: +SKIP
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import pyarrow as pa

from sqlsdc.catalog import cell_limits, store
from sqlsdc.engines.duckdb import EngineError, register, result_schema, rollback
from sqlsdc.engines.duckdb import run as run_sql
from sqlsdc.engines.spark import as_types
from sqlsdc.engines.spark_translate import (
    check_portable,
    parse_duckdb_text,
    tables_read,
    view_name,
)
from sqlsdc.errors import (
    AnswerTooLarge,
    Error,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    QueryCanceled,
)
from sqlsdc.guard import statement_rate
from sqlsdc.guard.audited_parameters import audited_text, snapshot
from sqlsdc.guard.connection import MAX_ANSWER_BYTES, MAX_ANSWER_ROWS
from sqlsdc.guard.dp_pricing import no_rows
from sqlsdc.guard.engine_failures import engine_failure
from sqlsdc.guard.hidden_cells import hidden_cells
from sqlsdc.guard.postprocess import check_faults, record_release, values_of, without_dictionaries
from sqlsdc.guard.summable import check_summable
from sqlsdc.guard.validate import check_engine_tables

STORED_AS = {"float": ("FLOAT",), "double": ("FLOAT", "DOUBLE")}
"""Spark's floating-point types -> the database's types (as analyst_schema names them) they copy."""

if TYPE_CHECKING:
    from sqlsdc.engines.spark import SparkEngine
    from sqlsdc.guard.connection import Connection
    from sqlsdc.guard.pipeline import ProtectedQuery


def run_protected(connection: Connection, engine: SparkEngine, sql: str, params=None) -> pa.Table:
    """The protected values of ``sql`` asked by ``connection``'s user, computed on Spark,
    audited and recorded in ``connection``'s ledger; the same columns as the DuckDB path's
    cursor gives.

    Raises:
        PolicyViolation: the guard refuses the query (audited ``refused``).
        NotSupportedError: the query needs DuckDB (suppression) or is not portable to Spark
            (audited ``refused``).
        BudgetExhausted: a DP query costs more than the user's remaining budget.
        AnswerTooLarge: the answer has more rows or bytes than a connection returns (audited
            ``refused``, as on DuckDB).
        OperationalError: Spark failed (audited ``failed`` with Spark's message).
    """
    with connection._holding() as con:  # the file stays open (and this thread alone uses it)
        try:
            return _run_protected(connection, con, engine, sql, params)
        finally:
            connection._settle_charged()  # cached, or stopped: others asking them price again


def _version(engine: SparkEngine, query_id: int, table: str) -> str:
    """The DuckDB data version of ``table``'s copy (:meth:`SparkEngine.data_version`), what a
    cell limit names a cell's data by; a table Spark did not copy from DuckDB has none it can
    trust: its cells are this query's own (never free again), as a cell over unknown data."""
    try:
        return engine.data_version(table)
    except NotSupportedError:
        return f"unversioned {query_id}"


def _run_protected(connection: Connection, con, engine: SparkEngine, sql: str, params):
    user, version = connection.user, connection.policy_version
    params = snapshot(params)  # read once: bound and audited
    logged = audited_text(sql, params)  # what the audit log keeps: the text and its values
    query_id = store.next_query_id(con)
    query: ProtectedQuery | None = None
    noisy, paid = None, None

    def audit(decision: str, error: BaseException) -> None:
        fingerprint = query.fingerprint if query is not None else None
        store.record_query(con, query_id, user, version, decision, logged,
                           reason=store.audit_reason(error), fingerprint=fingerprint)  # fmt: skip
        connection._keep_released(noisy, query_id, paid)  # drawn, paid: not computed again

    try:
        statement_rate.check(con, connection.path, user, logged)  # the log's room, as DuckDB's
        query = connection.explain(sql, params)
        _check_spark_can_release(query)
        read = tables_read(query.tree)  # (a DP answer's: its cells; its stages read the data)
        engine.refresh(read | {table for table, _ in query.summed})  # replaced views: read again
        names = {name.split(".")[-1] for name in read}
        _check_spark_types(names, connection.analyst_schema, engine.schemas)
        check_summable(query.summed, engine.summable, engine.run)  # Spark's copy of the data
        check_engine_tables(names, query.tree, connection.policy, query.tables)
        if query.dp_stages:
            check_portable(query.tree)  # the answer over the noisy cells: refused unpaid
            noisy, paid = _release_dp(
                connection, con, engine, query, query_id, logged
            )  # charged from here
        answer = _answer(engine, query.tree, noisy)
        result = as_types(answer, _duckdb_types(con, query.sql, noisy))
        check_faults(result, query)
    except AnswerTooLarge as refusal:  # the row cap, as the DuckDB path audits it (s44q)
        audit("refused", refusal)
        raise
    except OperationalError as failure:  # Spark ran and failed: its own message is for admins
        cause = failure.__cause__ or failure
        audit("failed", cause)
        raise
    except Error as refusal:
        audit("refused", refusal)
        raise
    except Exception as failure:
        audit("failed", failure)
        raise
    relations = noisy.relations if noisy is not None else {}
    for name, cells in relations.items():  # the hidden cells' count reads them, as on DuckDB
        register(con, name, cells)  # (registered outside the transaction: an aborted one
    try:  # refuses to unregister, and that refusal would replace the error audited)
        return _record(connection, con, engine, query, query_id, result, noisy, paid, logged,
                       audit)  # fmt: skip
    finally:
        for name in relations:
            con.unregister(name)


def _record(connection: Connection, con, engine: SparkEngine, query, query_id: int,
            result: pa.Table, noisy, paid, logged: str, audit) -> pa.Table:  # fmt: skip
    """Record the Spark answer ``result`` in one transaction of the catalog: the DP cells it
    drew, its ledger rows, its cells against the policy's cell limits, its audit entry; return
    its values once committed."""
    user, version = connection.user, connection.policy_version
    con.execute("BEGIN TRANSACTION")
    try:
        connection._cache_cells(noisy, paid, query_id)
        record_release(con, result, query, query_id, user)
        hidden = partial(hidden_cells, con, query.tree, connection._context.to_sql,
                         partial(_count, con, connection), result.num_rows)  # fmt: skip
        cell_limits.charge_cells(con, connection.policy, user=user, tables=query.tables,
                                 query_id=query_id, fingerprint=query.fingerprint,
                                 at=store.now(), versions=partial(_version, engine, query_id),
                                 hidden=hidden)  # fmt: skip
        values = values_of(result, query)
        store.record_query(con, query_id, user, version, "accepted", logged,
                           fingerprint=query.fingerprint, rows=values.num_rows)  # fmt: skip
        con.execute("COMMIT")
    except EngineError as failure:  # the catalog write failed (or conflicted): nothing returned
        rollback(con)
        audit("failed", failure)
        stopped = engine_failure(failure, query_id)
        if isinstance(stopped, QueryCanceled):  # the hidden cells' count ran out of time
            raise stopped from None
        raise OperationalError(
            f"could not record query {query_id}; nothing was returned; run it again (the "
            "engine's message is in the audit log)"
        ) from None
    except Error as refusal:  # a cell limit's: nothing returned (and the period ends)
        rollback(con)
        if isinstance(refusal, cell_limits.CellLimitReached):
            cell_limits.end_periods(con, refusal, query_id, store.now())
        audit("refused", refusal)
        raise
    except BaseException:
        rollback(con)
        raise
    return values


def _count(con, connection: Connection, sql: str) -> pa.Table:
    """Run the hidden cells' count ``sql`` on the DuckDB file within what is left of the
    statement's timeout, as the DuckDB path runs it (:meth:`Connection._time_left`): it ran
    unbounded, for every HAVING, LIMIT and outer query (review of s50h). A statement out of
    time is stopped (``QueryCanceled``) before its answer is recorded: nothing released."""
    return run_sql(con, sql, timeout=connection._time_left())


def _duckdb_types(con, sql: str, noisy) -> pa.Schema:
    """The types of DuckDB's answer to the protected ``sql`` (bound over the noisy DP cells,
    not run): Spark's answer is given in them, as the DuckDB cursor gives it (an ENUM as
    text: :func:`_as_given`)."""
    relations = noisy.relations if noisy is not None else {}
    for name, cells in relations.items():
        register(con, name, cells)
    try:
        return _as_given(result_schema(con, sql))
    finally:
        for name in relations:
            con.unregister(name)


def _as_given(schema: pa.Schema) -> pa.Schema:
    """DuckDB's ``schema`` with an ENUM column as its labels' text, as the DuckDB cursor gives
    it (:func:`~sqlsdc.guard.postprocess.values_of`). DuckDB binds an ENUM as a dictionary of
    every label, Spark's copy holds the text: an answer or DP stage grouped by an ENUM failed
    on Spark ("computed as string"), a DP one after its charge (s50h)."""
    return without_dictionaries(schema.empty_table()).schema


def _check_spark_can_release(query: ProtectedQuery) -> None:
    if query.tree is None:
        raise ProgrammingError("the protected query has no tree")
    if query.suppressed:
        raise NotSupportedError(
            f"{', '.join(query.suppressed)} is protected by suppression, whose pattern is made "
            "and kept fresh by the DuckDB engine; run this query through sqlsdc.connect"
        )


def _check_spark_types(tables: set[str], schema: dict, spark: dict) -> None:
    """Refuse when Spark's copy of a table holds floating-point values where the database
    stores an exact number, or 32-bit FLOAT where it stores DOUBLE. The guard checks queries on
    the database's types: a sum over an exact column is not scanned for NaN and infinities
    (:mod:`sqlsdc.guard.summable`), a product with a DOUBLE column is not read as DOUBLE
    (:func:`sqlsdc.planner.linear.linear_form`), and either would show a non-finite value in
    exactly the cells holding it (red team s29)."""
    for table in sorted(tables & set(schema)):
        copied = spark.get(view_name(table), {})
        for column, dtype in schema[table].items():
            held = copied.get(column.lower())
            if held in STORED_AS and dtype not in STORED_AS[held]:
                raise NotSupportedError(
                    f"Spark's copy of {table}.{column} is {held} where the database stores "
                    f"{dtype}; register data with the database's types (load_duckdb copies them)"
                )


def _release_dp(connection: Connection, con, engine: SparkEngine, query, query_id: int, sql: str):
    """Noise the DP cells of ``query`` from exact cells computed on Spark, charged to the
    connection's budget first (as on DuckDB); returns them (registered for the protected tree
    by :func:`_answer`) and the charge, to be cached with the answer's record.

    Every stage's SQL is translated (and checked portable) before anything is charged: a stage
    Spark cannot run is refused, not paid for. Cells are named by the data version of the
    DuckDB table Spark's copy came from, so the same cell has the same noise on both engines."""
    trees = {}  # DuckDB text of each stage SQL -> its tree (what the engine translates)
    for stage in query.dp_stages:
        texts = {None: stage.sql, **dict(stage.histograms)}
        for key, tree in stage.trees.items():
            engine.sql(tree)
            trees[texts[key]] = tree
        if stage.keys:  # their keys' types: private groups' first (dp_release's
            empty = no_rows(stage)  # check_private_keys), any stage's answered from the cache
            engine.sql(empty)  # (dp_reuse._from_cache): translated before the charge too
            trees[connection._context.to_sql(empty)] = empty

    def run(text: str) -> pa.Table:  # stage SQL by its tree; public domains parsed from text
        answer = engine.run_exact(trees.get(text) or parse_duckdb_text(text))
        return as_types(answer, _as_given(result_schema(con, text)))  # exact, as DuckDB's

    return connection._release_dp(query, query_id, sql, run=run, data_version=engine.data_version)


def _answer(engine: SparkEngine, tree, noisy) -> pa.Table:
    """The answer of the protected ``tree`` on Spark, over this query's noisy DP cells.

    The cells are views of the session named by their stage's position
    (``__sqlsdc_dp_cells_0``), the same names in every query: two threads answering on one
    engine registered theirs under one name, and one answer read the other's cells (red team
    s40c: bob was given ana's cells for his own query, paid by him and recorded in the ledger
    as his). Registering the cells and answering over them take the engine's turn together.
    The answer has the DuckDB path's caps (``MAX_ANSWER_ROWS``, ``MAX_ANSWER_BYTES``): a cross
    join of released cells was collected whole into the driver (red team s44k)."""
    relations = noisy.relations if noisy is not None else {}
    caps = {"max_rows": MAX_ANSWER_ROWS, "max_bytes": MAX_ANSWER_BYTES}  # as on DuckDB
    if not relations:
        return engine.run_exact(tree, **caps)
    with engine.answering:
        for relation, cells in relations.items():
            engine.register_cells(relation, cells)
        return engine.run_exact(tree, **caps)
