"""The guard's view of an opened database: the :class:`GuardContext` every check runs under.

Read once per opening of the file and policy version (:func:`guard_context`): the analyst's
schema (the policy over the stored columns and the released outputs), which tables hold one
row per privacy unit, unique columns, the perturbation tables, and how the engine types a
constant. Constants are evaluated apart from the file and within the statement's time
(:data:`TIME_LEFT`), so a check holds no file and stops at its deadline. Also the statement
timeout a connection runs under (:func:`statement_timeout`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from sqlglot import exp
from sqlglot.errors import ParseError

from sqlsdc.catalog.ptables import load_ptables
from sqlsdc.catalog.setup import unique_columns, unit_index_name
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines import duckdb_schema, duckdb_sql
from sqlsdc.errors import AccessDenied, ProgrammingError
from sqlsdc.guard.check_cache import context_fingerprint
from sqlsdc.guard.engine_failures import timeout_error
from sqlsdc.guard.pipeline import GuardContext
from sqlsdc.guard.resolve import analyst_schema
from sqlsdc.policy import Policy

KEPT_CONSTANT_CHARACTERS = 4096  # longer constants are evaluated each time (guard_context)


TIME_LEFT: ContextVar[Callable[[], float]] = ContextVar("sqlsdc_check_time_left")
"""Seconds the statement being checked (in this thread) has left; raises when none are."""


def statement_timeout(policy: Policy, asked: float | None) -> float:
    """The policy's statement timeout, or a shorter one asked for by the connection."""
    limit = policy.statement_timeout
    if asked is None:
        return limit
    if isinstance(asked, bool) or not isinstance(asked, (int, float)):
        raise ProgrammingError(f"timeout must be a positive number of seconds, got {asked!r}")
    asked = float(asked)  # once: a subclass's comparisons and __float__ may disagree
    if not asked > 0:
        raise ProgrammingError(f"timeout must be a positive number of seconds, got {asked!r}")
    if asked > limit:
        raise AccessDenied(
            f"timeout {asked!r} s is above the policy's statement timeout of {limit:g} s; a "
            "connection may only shorten it (an admin sets `limits: {statement_timeout_seconds: "
            "..}` in the policy)"
        )
    return asked


def guard_context(
    con, policy: Policy, version: int, timeout: float, path: Path, releases=None
) -> GuardContext:
    """The guard's view of the database; ``releases``: the columns of the released outputs
    (:mod:`sqlsdc.guard.releases`).

    Constants are evaluated apart from the file
    (:func:`~sqlsdc.engines.duckdb.evaluate_constant`), so a check holds no file, and within
    the statement's time (:data:`TIME_LEFT`): a check of many constants stops at its
    deadline instead of giving each constant the whole timeout. An evaluation the timeout
    (or a cancel) interrupted says nothing about the constant: the statement is stopped, and
    nothing is cached."""
    tables = duckdb_schema.described(con, [t.name for t in policy.tables.values()])
    stored = {
        table: {column.lower(): dtype for column, dtype, _key in columns}
        for table, columns in tables.items()
    }
    schema = analyst_schema(policy, {**stored, **(releases or {})})
    indexes = {
        r[0]
        for r in con.execute(
            "SELECT index_name FROM duckdb_indexes() WHERE database_name = current_database()"
        ).fetchall()
    }
    unit_per_row = {
        t.name: unit_index_name(t.name, t.privacy_unit) in indexes
        for t in policy.confidential_tables
    }
    constrained = any(key for columns in tables.values() for _c, _t, key in columns)

    def evaluates(sql: str) -> str | None:
        if len(sql) > KEPT_CONSTANT_CHARACTERS:  # 1,024 constants of a megabyte: a gigabyte
            return evaluates_once(sql)
        return kept_evaluates(sql)

    def evaluates_once(sql: str) -> str | None:
        try:
            return engine.evaluate_constant(sql, TIME_LEFT.get(lambda: timeout)())
        except engine.duckdb.InterruptException:
            raise timeout_error("") from None
        except engine.EngineError:
            return None

    kept_evaluates = lru_cache(maxsize=1024)(evaluates_once)

    def constant_type(node: exp.Expr) -> exp.DataType | None:
        if node.find(exp.Subquery, exp.Select, exp.Table, exp.Column):
            # not a constant; its own scope is checked
            return node.type or exp.DataType.build("UNKNOWN")
        name = evaluates(duckdb_sql.to_sql(exp.select(node.copy())))
        return None if name is None else _engine_type(name)

    context = GuardContext(
        policy=policy,
        policy_version=version,
        schema=schema,
        unit_per_row=unit_per_row,
        unique_columns=unique_columns(con, constraints=constrained),
        constant_type=constant_type,
        to_sql=duckdb_sql.to_sql,
        ptables=load_ptables(con, policy),
    )
    fingerprint = context_fingerprint(str(path.resolve()), context, engine.duckdb.__version__)
    return replace(context, fingerprint=fingerprint)


@lru_cache(maxsize=256)
def _engine_data_type(name: str) -> exp.DataType:
    try:
        return exp.DataType.build(name, dialect="duckdb")
    except (ValueError, ParseError):  # a type sqlglot cannot read: no family, no shape
        return exp.DataType.build("UNKNOWN")


def _engine_type(name: str) -> exp.DataType:
    """sqlglot's type for the engine's type name of a constant (a copy: types are nodes)."""
    return _engine_data_type(name).copy()
