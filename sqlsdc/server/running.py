"""Running one statement of a server session, in the thread pool: the session catalog
first (:class:`~sqlsdc.server.catalog.SessionCatalog`), then the user's guarded connection,
with the presentation PostgreSQL clients expect (unqualified ``public.t``, function columns
named as PostgreSQL names them).
"""

from __future__ import annotations

import time
from pathlib import Path

from sqlsdc.errors import Error
from sqlsdc.server.catalog import CatalogAnswer, SessionCatalog
from sqlsdc.server.colnames import postgres_names
from sqlsdc.server.qualified import unqualified


def run(catalog: SessionCatalog, connection, sql: str, params: tuple):
    """In the thread pool: the session catalog first, then the guard (``public.t`` written
    ``t``; unaliased function columns named as PostgreSQL names them). Returns the answer and
    the seconds spent in the guarded connection (what an embedded connection would spend)."""
    answer = catalog_answer(catalog, connection, sql, params or None)
    if answer is not None:
        return named(sql, answer), 0.0
    sql = unqualified(sql, database_name(connection))
    started = time.perf_counter()
    table = connection.execute(sql, params or None).arrow()
    guarded = time.perf_counter() - started
    names = postgres_names(sql, table.column_names)
    if names != table.column_names:
        table = table.rename_columns(names)
    return CatalogAnswer(table, f"SELECT {table.num_rows}"), guarded


def catalog_answer(catalog: SessionCatalog, connection, sql: str, params, described=False):
    """The catalog's answer (None: a statement for the guard); a statement the catalog
    refuses (one mixing ``pg_catalog`` and data tables, ``SET ROLE``, ``LISTEN``...) is audited
    as the guard audits its refusals, under the user's connection: they went unrecorded (red
    team s35b). The guard audits its own; a statement reaches one or the other, so no
    refusal is recorded twice. Describe's refusal ends the client's messages until Sync, so an
    Execute refused again is a second attempt, audited as one. Audited with its parameters
    (:mod:`sqlsdc.guard.audited_parameters`), but not with the NULLs a Describe
    (``described``) plans it with: no value was sent yet."""
    try:
        return catalog.answer(sql, params)
    except Error as refusal:
        connection.audit_refusal(sql, refusal, None if described else params)
        raise


def named(sql: str, answer: CatalogAnswer) -> CatalogAnswer:
    """A catalog answer with its unaliased function columns named as PostgreSQL names them
    (``SELECT version()``: ``version``, not DuckDB's ``"version"()``)."""
    if answer.table is None:
        return answer
    names = postgres_names(sql, answer.table.column_names)
    if names == answer.table.column_names:
        return answer
    return CatalogAnswer(answer.table.rename_columns(names), answer.tag)


def database_name(connection) -> str:
    """The database's name as the catalog shows it (``currentdatabase_name()``)."""
    return Path(connection.path).stem
